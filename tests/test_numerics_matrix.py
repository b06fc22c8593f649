"""The numerics rules on the variation matrix of real H200 correctness reports (tests/data/numerics_matrix,
scripts/make_numerics_matrix.py): four layouts (length named T, seqlen, num_tokens, context_len; CSV and
JSON Lines; measurements mixed with conditions; several error metrics for outputs and state). Every
report gets the verdict cells.json gives it, and the report without TF32 rows stays quiet."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import ROOT, evidence, run_rule
from tracekit import db
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import numerics_report

MATRIX = ROOT / "tests" / "data" / "numerics_matrix"
CELLS = json.loads((MATRIX / "cells.json").read_text())["reports"]
# the length column make_numerics_matrix.py writes in each layout
SIZE = {"fla_style.csv": "T", "seqlen_style.jsonl": "seqlen", "healthy_num_tokens.csv": "num_tokens",
        "context_len_tf32.csv": "context_len"}  # fmt: skip


def records(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    with path.open() as f:
        return [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def load(path: Path):
    con = db.connect(None)
    ingest(con, [path])
    return con


def findings(con, code: str, **params):
    found, notes = run_rule(con, code, cache=False, **params)
    assert not [n for n in notes if "failed" in n.message]
    return found


@pytest.fixture(scope="module", params=sorted(CELLS))
def report(request):
    name = request.param
    return name, MATRIX / name, load(MATRIX / name)


def test_conditions_measurements_and_size_come_from_the_data(report):
    name, path, con = report
    table = numerics_report.parse(path)
    assert set(table.conditions) == set(CELLS[name]["conditions"])
    assert table.typed["seq_len"] == SIZE[name]
    rows = records(path)
    assert table.checks == len(rows) and not table.skipped
    assert con.execute("SELECT count(*) FROM numerics").fetchone()[0] == len(rows) * len(table.metrics)
    # every metric column is read, output and state alike, and nothing else is
    assert all(numerics_report._names_an_error(m) for m in table.metrics)
    assert not {"ms", "wall_ms", "nonfinite", "diff_vs_cp1", "ref_o_absmax", "ref_scale"} & set(table.metrics)
    tensors = dict(con.execute("SELECT DISTINCT metric, tensor FROM numerics").fetchall())
    for metric, tensor in tensors.items():
        if "state" in metric or metric.startswith("ht_"):
            assert tensor == "state", metric
        elif metric.endswith("_out") or metric.startswith("o_"):
            assert tensor == "output", metric


def test_tf32_signature_where_the_report_has_tf32_rows(report):
    name, path, con = report
    found = findings(con, "N002")
    assert bool(found) == CELLS[name]["tf32_signature"]
    if not found:
        return
    [s] = found
    assert s.severity == "warning" and f"at {SIZE[name]} " in s.title and s.extra["size_column"] == SIZE[name]
    precision = dict(con.execute("SELECT DISTINCT row_index, precision FROM numerics").fetchall())
    assert {precision[i] for i in s.extra["signature_rows"]} == {"tf32"}
    assert min(s.extra["gains"]) >= 100
    assert "tf32x3" in s.next_experiment and "allow_tf32 = False" in s.next_experiment
    assert next(iter(evidence(con, s).values())) == pytest.approx(s.observed.value, rel=1e-12)


def tf32_growing_metrics(path: Path, size: str) -> set[str]:
    """Metrics whose tf32 error at the largest size is >= 4x that at the smallest, in some combination."""
    rows = [r for r in records(path) if r.get("precision", r.get("input_precision")) == "tf32"]
    table = numerics_report.parse(path)
    others = [c for c in table.conditions if c != size]
    out = set()
    for metric in table.metrics:
        by_combo = defaultdict(dict)
        for r in rows:
            by_combo[tuple(r[c] for c in others)][r[size]] = r[metric]
        if any(v[max(v)] >= 4 * v[min(v)] for v in by_combo.values() if len(v) >= 3):
            out.add(metric)
    return out


def test_growth_on_the_metrics_that_grow(report):
    name, path, con = report
    found = findings(con, "N001")
    assert len(found) == 1
    [g] = found
    if not CELLS[name]["tf32_signature"]:  # the healthy twin: fp32-level errors, nothing to report
        assert g.severity == "info" and "not significant" in g.title
        assert g.observed.value < g.expected.value
        return
    assert g.severity == "warning" and f"grows with {SIZE[name]}" in g.title
    assert g.extra["drivers"]["precision"] == "tf32"
    assert set(g.extra["growing_metrics"]) >= tf32_growing_metrics(path, SIZE[name])
    assert "tf32x3" in g.next_experiment
    agreement = g.extra["partition_agreement"]
    if "partitions" in numerics_report.parse(path).typed:
        assert 0.5 < agreement["ratio_min"] <= agreement["ratio_max"] < 2 and agreement["pairs"] > 0
        assert f"{agreement['ratio_min']:.2f}-{agreement['ratio_max']:.2f}x" in g.hypothesis
    else:
        assert agreement is None
    assert next(iter(evidence(con, g).values())) == pytest.approx(g.observed.value, rel=1e-12)


def test_partitioned_runs_do_not_diverge(report):
    _, _, con = report
    assert findings(con, "N003") == []


def test_healthy_twin_is_quiet_at_every_severity_above_info():
    con = load(MATRIX / "healthy_num_tokens.csv")
    for code in ("N001", "N002", "N003"):
        assert not [f for f in findings(con, code) if f.severity != "info"], code
    # its absolute errors are judged against the reference's magnitude the report measured
    scaled = con.execute("SELECT count(*) FROM numerics WHERE reference_scale IS NULL").fetchone()[0]
    assert scaled == 0


def test_flat_relative_error_with_growing_absolute_error(tmp_path):
    """TF32 often keeps the relative error flat near 1e-3 while the absolute error grows: the growth
    finding names the absolute metrics only, and the TF32 signature does not need growth."""
    source = MATRIX / "context_len_tf32.csv"
    rows = records(source)
    first = min(r["context_len"] for r in rows)
    flat = {r["precision"]: r["relative_error"] for r in rows if r["context_len"] == first}
    out = tmp_path / "flat_relative.csv"
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for i, r in enumerate(rows):
            noise = 1.1 if i % 4 < 2 else 0.9  # +-10%, no trend
            writer.writerow({**r, "relative_error": flat[r["precision"]] * noise})
    con = load(out)
    [g] = findings(con, "N001")
    assert g.severity == "warning"
    assert g.extra["growing_metrics"] == ["max_abs_error", "mean_abs_error"]
    assert "relative_error" in g.extra["steady_metrics"]
    [s] = findings(con, "N002")
    assert "relative_error" in s.extra["metrics"]
