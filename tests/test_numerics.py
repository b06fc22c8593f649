"""Numerics reports: every format parses to the same long-form table, and N001 finds the growth of
the TF32 error with sequence length in the device report, stays quiet (or says "not significant")
on the tf32x3/ieee rows, and its evidence SQL recomputes what it reports (the TF32 signature and
variant divergence are N002's and N003's: tests/test_rule_tf32_signature.py, test_rule_variant_divergence.py)."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import SAMPLES, evidence, run_rule
from tracekit import db
from tracekit.findings.model import json_schema
from tracekit.ingest.inputs import recognise
from tracekit.ingest.pipeline import ingest, plan
from tracekit.parsers import numerics_report
from tracekit.producers.numerics import compare, write_report

REPORT = SAMPLES / "numerics_tf32.csv"
TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
TABLE_SQL = "SELECT * EXCLUDE (run_id) FROM numerics ORDER BY row_index, metric"


def load(*paths):
    con = db.connect(None)
    ingest(con, list(paths))
    return con


def subset(tmp_path: Path, where: str, name: str) -> Path:
    """The device report filtered by a condition, written as a new CSV report."""
    out = tmp_path / name
    con = db.connect(None)
    con.execute(f"COPY (SELECT * FROM read_csv_auto('{REPORT}') WHERE {where}) TO '{out}' (HEADER)")
    return out


@pytest.fixture(scope="module")
def report_db():
    return load(REPORT)


def findings_of(con, **params):
    findings, notes = run_rule(con, "N001", cache=False, **params)
    assert not [n for n in notes if "failed" in n.message]
    return findings


def test_every_format_gives_the_same_table(tmp_path):
    con = db.connect(None)
    src = f"read_csv_auto('{REPORT}')"
    paths = {
        "csv": tmp_path / "r.csv",
        "json": tmp_path / "r.json",
        "jsonl": tmp_path / "r.jsonl",
        "parquet": tmp_path / "r.parquet",
    }
    con.execute(f"COPY (SELECT * FROM {src}) TO '{paths['csv']}' (HEADER)")
    con.execute(f"COPY (SELECT * FROM {src}) TO '{paths['json']}' (FORMAT json, ARRAY true)")
    con.execute(f"COPY (SELECT * FROM {src}) TO '{paths['jsonl']}' (FORMAT json)")
    con.execute(f"COPY (SELECT * FROM {src}) TO '{paths['parquet']}' (FORMAT parquet)")
    tables = {}
    for fmt, path in paths.items():
        assert recognise(path) is numerics_report, fmt
        assert plan([path]) == [(0, [])]  # a run of its own, never a runtime-event log
        tables[fmt] = load(path).execute(TABLE_SQL).fetchall()
    assert tables["csv"], "no rows"
    for fmt in ("json", "jsonl", "parquet"):
        assert tables[fmt] == tables["csv"], fmt
    checks = sum(1 for _ in csv.DictReader(REPORT.open()))
    metrics = [c for c in next(csv.reader(REPORT.open())) if "err" in c]
    assert len(tables["csv"]) == checks * len(metrics)


def test_long_form_keeps_conditions_and_typed_copies(report_db):
    rows = report_db.execute(
        "SELECT conditions, precision, variant, seq_len, partitions, dtype, metric, value FROM numerics"
    ).fetchall()
    with REPORT.open() as f:
        source = list(csv.DictReader(f))
    for conditions, precision, variant, seq_len, partitions, dtype, metric, value in rows:
        cond = json.loads(conditions)
        assert cond["precision"] == precision and cond["variant"] == variant
        assert cond["seq_len"] == seq_len and cond["partitions"] == partitions and cond["dtype"] == dtype
        assert "err" not in "".join(cond)  # error columns are metrics, not conditions
        match = [
            r
            for r in source
            if r["precision"] == precision and r["variant"] == variant and int(r["seq_len"]) == seq_len
        ]
        assert len(match) == 1 and float(match[0][metric]) == value


def test_metric_option_and_bad_reports(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("precision,n,diff,max_err\ntf32,1,0.5,x\ntf32,2,0.25,0.1\n")
    table = numerics_report.parse(path, metrics=("diff",))
    assert table.metrics == ["diff"] and len(table.rows) == 2
    table = numerics_report.parse(path)
    assert table.metrics == ["max_err"] and len(table.rows) == 1 and table.skipped
    assert [r["seq_len"] for r in table.rows] == [2]  # `n` is a size
    none = tmp_path / "none.csv"
    none.write_text("a,b\n1,2\n")
    assert recognise(none) is not numerics_report
    trace = tmp_path / "trace.json"  # a Kineto trace in array form is not a report
    trace.write_text(json.dumps([{"ph": "X", "name": "max_err_kernel", "ts": 1, "dur": 2, "err": 0}]))
    assert recognise(trace) is not numerics_report
    arr = tmp_path / "r.json"
    arr.write_text(json.dumps([{"precision": "ieee", "seq_len": 1, "rms_err": 1e-7}]))
    assert recognise(arr) is numerics_report


def test_growth_with_length_on_the_device_report(report_db):
    findings = findings_of(report_db)
    growth = [f for f in findings if "grows with seq_len" in f.title]
    assert len(growth) == 1 and len(findings) == 1
    g = growth[0]
    assert g.severity == "warning"
    assert g.locality["launch"]["conditions"]["precision"] == "tf32"
    assert g.extra["drivers"] == {"precision": "tf32"}
    assert g.observed.value > g.expected.value  # above the tolerance
    assert g.extra["growth"] >= 4 and g.extra["exponent"] > 0.3
    assert "tf32x3" in g.next_experiment and "TRITON_F32_DEFAULT=ieee" in g.next_experiment
    # the failing rows are the tf32 rows of the report, and only those
    prec = dict(report_db.execute("SELECT DISTINCT row_index, precision FROM numerics").fetchall())
    assert {prec[i] for i in g.extra["failing_rows"]} == {"tf32"}


def test_evidence_sql_recomputes_observed_and_schema_validates(report_db):
    schema = json_schema()
    for f in findings_of(report_db):
        row = evidence(report_db, f)
        assert next(iter(row.values())) == pytest.approx(f.observed.value, rel=1e-12)
        jsonschema.validate(f.as_dict(), schema)


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_healthy_precisions_are_quiet_or_not_significant(tmp_path, precision):
    con = load(subset(tmp_path, f"precision = '{precision}'", f"numerics_{precision}.csv"))
    findings = findings_of(con)
    assert all(f.severity == "info" for f in findings)
    assert all("not significant" in f.title for f in findings)
    for f in findings:
        assert f.observed.value < f.expected.value  # below the tolerance, numbers given
        assert next(iter(evidence(con, f).values())) == pytest.approx(f.observed.value, rel=1e-12)


def test_acceptance_holds_after_the_fix(tmp_path):
    """The fix (tf32x3 instead of tf32) passes the growth finding's acceptance on the new report."""
    before = load(REPORT)
    g = next(f for f in findings_of(before) if "grows" in f.title)
    after = load(subset(tmp_path, "precision = 'tf32x3'", "after.csv"))
    params = dict(g.sql_params, precision="tf32x3")
    cur = after.execute(g.sql, params)
    row = dict(zip([d[0] for d in cur.description], cur.fetchone()))
    assert row["err_max_size"] < g.expected.value  # below the tolerance the finding named
    assert not [f for f in findings_of(after) if f.severity != "info"]


def test_compare_on_lists_and_numpy(tmp_path):
    ref = [[1.0, -2.0], [4.0, 0.0]]
    out = [[1.0, -2.5], [4.0, 1e-7]]
    rows = []
    row = compare(ref, out, rows=rows, precision="tf32", seq_len=4, eps=1e-6)
    assert rows == [row] and row["precision"] == "tf32" and row["seq_len"] == 4
    assert row["max_abs_err"] == pytest.approx(0.5)
    assert row["max_rel_err"] == pytest.approx(max(0.5 / 2.0, 1e-7 / 1e-6))
    assert row["mean_rel_err"] == pytest.approx((0.25 + 0.1) / 4)
    assert row["rms_err_ratio"] == pytest.approx(math.sqrt((0.25 + 1e-14) / 4) / math.sqrt(21 / 4))
    for suffix in (".csv", ".jsonl"):
        path = write_report(rows * 3, tmp_path / f"r{suffix}")
        assert recognise(path) is numerics_report
        assert len(numerics_report.parse(path).rows) == 3 * 4
    np = pytest.importorskip("numpy")
    assert compare(np.array(ref), np.array(out), eps=1e-6) == {k: v for k, v in row.items() if "err" in k}


def test_cli_analyze_returns_the_finding():
    proc = subprocess.run([TRACEKIT, "analyze", str(REPORT), "-f", "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    numerics = {f["rule"]: f for f in doc["findings"] if f["rule"].startswith("N")}
    assert set(numerics) == {"N001", "N002"} and {f["severity"] for f in numerics.values()} == {"warning"}
    assert "grows with seq_len" in numerics["N001"]["title"] and "TF32 signature" in numerics["N002"]["title"]
    assert doc["runs"] and not [n for n in doc["data_quality"] if n["rule"] in numerics]


def test_metric_option_names_error_columns_without_err(tmp_path):
    import json as _json
    import subprocess
    import sys
    from pathlib import Path as _Path

    report = tmp_path / "checks.csv"
    report.write_text("precision,seq_len,deviation\ntf32,256,0.001\ntf32,1024,0.004\ntf32,4096,0.016\n")
    exe = str(_Path(sys.executable).with_name("tracekit"))
    plain = subprocess.run([exe, "ingest", report, "--db", tmp_path / "a.duckdb"], capture_output=True, text=True)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr  # no `err` column: not a report
    named = subprocess.run(
        [exe, "ingest", report, "--db", tmp_path / "b.duckdb", "--metric", "deviation", "-f", "json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    (row,) = _json.loads(named.stdout)
    assert row["events_ingested"] == 3 and row["events_read"] == 3
