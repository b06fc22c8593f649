"""N002 tf32-signature on the project's H200 correctness report: the tf32 rows carry the TF32
rounding band and vanish under tf32x3/ieee; the healthy precisions alone show nothing."""

from __future__ import annotations

import jsonschema
import pytest

from tests.conftest import SAMPLES, evidence, run_rule
from tracekit import db
from tracekit.findings.model import json_schema
from tracekit.ingest.pipeline import ingest

REPORT = SAMPLES / "numerics_tf32.csv"


@pytest.fixture(scope="module")
def report():
    con = db.connect(None)
    ingest(con, [REPORT])
    return con


def n002(con, **params):
    findings, notes = run_rule(con, "N002", cache=False, **params)
    assert not [n for n in notes if "failed" in n.message]
    return findings


def test_tf32_rows_carry_the_signature(report):
    [s] = n002(report)
    assert s.rule == "N002" and s.severity == "warning" and "TF32 signature" in s.title
    assert 1e-4 <= s.observed.value <= 1e-2 and s.observed.value >= 10 * s.expected.value
    assert s.locality["launch"]["conditions"]["precision"] == "tf32"
    assert "allow_tf32 = False" in s.next_experiment and "TRITON_F32_DEFAULT=ieee" in s.next_experiment
    prec = dict(report.execute("SELECT DISTINCT row_index, precision FROM numerics").fetchall())
    assert {prec[i] for i in s.extra["signature_rows"]} == {"tf32"}
    assert min(s.extra["gains"]) >= 100
    assert next(iter(evidence(report, s).values())) == pytest.approx(s.observed.value, rel=1e-12)
    jsonschema.validate(s.as_dict(), json_schema())


def test_floor_and_gain_options_gate_it(report):
    [s] = n002(report)
    # a floor above every relative error leaves the absolute metrics, whose gain is scale-free
    [floored] = n002(report, tf32_low=1.0)
    assert floored.extra["metrics"] == ["max_abs_err"] and set(s.extra["metrics"]) > {"max_abs_err"}
    assert n002(report, tf32_gain=max(s.extra["gains"]) * 10) == []
    assert n002(report, metrics="no_such_metric") == []


def test_without_tf32_rows_nothing_is_reported(tmp_path):
    out = tmp_path / "exact.csv"
    con = db.connect(None)
    con.execute(f"COPY (SELECT * FROM read_csv_auto('{REPORT}') WHERE precision <> 'tf32') TO '{out}' (HEADER)")
    ingest(con, [out])
    assert n002(con) == []
