"""N003 variant-divergence: quiet on the project's H200 report (partitioned agrees with
unpartitioned), and reports a partitioned path whose error grows away from its reference."""

from __future__ import annotations

import jsonschema
import pytest

from tests.conftest import SAMPLES, evidence, run_rule
from tracekit import db
from tracekit.engine.registry import get_rule
from tracekit.findings.model import json_schema
from tracekit.ingest.pipeline import ingest
from tracekit.producers.numerics import write_report


def load(path):
    con = db.connect(None)
    ingest(con, [path])
    return con


def findings(con, code="N003", **params):
    found, notes = run_rule(con, code, cache=False, **params)
    assert not [n for n in notes if "failed" in n.message]
    return found


def test_partitioned_path_that_diverges_is_reported(tmp_path):
    path = tmp_path / "variants.csv"
    rows = []
    for n in (256, 1024, 4096):
        rows.append({"variant": "unpartitioned", "seq_len": n, "rms_err": 1e-6})
        rows.append({"variant": "partitioned", "seq_len": n, "rms_err": 1e-6 * n / 4})
    write_report(rows, path)
    con = load(path)
    [div] = findings(con)
    assert div.rule == "N003" and "diverges" in div.title and div.observed.value >= 4
    assert div.locality["launch"]["conditions"]["variant"] == "partitioned"
    assert div.observed.value == pytest.approx(4096 / 4)  # the largest ratio, at the longest sequence
    assert next(iter(evidence(con, div).values())) == pytest.approx(div.observed.value)
    jsonschema.validate(div.as_dict(), json_schema())
    # the same report's growth is N001's question, driven by the variant
    assert any("grows" in f.title and f.extra["drivers"] == {"variant": "partitioned"} for f in findings(con, "N001"))
    # a reference that is not in the report pairs nothing
    assert findings(con, reference_variant="no_such_variant") == []


def test_agreeing_variants_of_the_device_report_are_quiet():
    con = load(SAMPLES / "numerics_tf32.csv")
    assert findings(con) == []
    example = get_rule("N003").example
    [nearest] = findings(con, **example.params)
    assert 1.0 <= nearest.observed.value < 4.0, "within the report's 0.86-1.11x agreement"
    assert next(iter(evidence(con, nearest).values())) == pytest.approx(nearest.observed.value)
