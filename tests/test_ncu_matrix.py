"""K001 on the Nsight Compute matrix of real H200 runs (tests/data/ncu_matrix, scripts/make_ncu_matrix.py):
a decode kernel tiled over V that repeats the q/k norms and gates per tile, the same kernel with one program
per head, and a pre-normalised pair, at two batch*heads and two gating costs, as `--page raw` and
`--page details`. Both pages ingest whole; every tiled launch is reported with the form it is compared with,
the counters that show the repetition and its roofline; the per-head and pre-normalised launches never are."""

from __future__ import annotations

import csv
import functools
import json

import jsonschema
import pytest

from tests.conftest import ROOT, evidence, run_rule
from tracekit import db
from tracekit.findings.model import json_schema
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import ncu_csv

MATRIX = ROOT / "tests" / "data" / "ncu_matrix"
CELLS = json.loads((MATRIX / "cells.json").read_text())["cells"]
REPORTS = sorted({c["report"] for c in CELLS})
PAGES = ("raw", "details")


def load(path):
    con = db.connect(None)
    ingest(con, [path])
    return con


@functools.cache
def matrix_report(path):
    """A matrix page's database, ingested once for every test that only reads it."""
    return load(path)


@pytest.fixture(scope="module", params=[(r, p) for r in REPORTS for p in PAGES], ids=lambda rp: ".".join(rp))
def report(request):
    name, page = request.param
    path = MATRIX / f"{name}.{page}.csv"
    return name, page, path, matrix_report(path)


def test_every_row_of_both_pages_is_ingested(report):
    _, page, path, con = report
    lines = list(csv.reader(path.read_text().splitlines()))
    header, body = lines[0], lines[1:]
    table = ncu_csv.parse(path)
    assert not table.skipped
    if page == "raw":  # a units row, then one row per launch and a column per metric
        metric_columns = [c for c in header if c not in ncu_csv.LAUNCH_COLUMNS]
        assert len(table.rows) == (len(body) - 1) * len(metric_columns)
    else:  # metric rows end early when their rule columns are empty: still complete rows
        assert any(len(r) < len(header) for r in body)
        assert len(table.rows) == len(body)
    read, ingested, skipped = con.execute(
        "SELECT events_read, events_ingested, events_skipped FROM ingest_log"
    ).fetchone()
    assert read == ingested == len(table.rows) and skipped == 0


def test_both_pages_give_the_same_launches():
    for name in REPORTS:
        raw, details = (
            matrix_report(MATRIX / f"{name}.{page}.csv")
            .execute(
                "SELECT launch_id, kernel, grid_size, block_size, registers, inst_executed, dram_bytes, duration_ns "
                "FROM ncu_launches ORDER BY launch_id"
            )
            .fetchall()
            for page in PAGES
        )
        assert len(raw) == len(details) == len([c for c in CELLS if c["report"] == name])
        for a, b in zip(raw, details):
            assert a[:6] == b[:6]  # identity, configuration and counts are exact on both pages
            assert b[6] == pytest.approx(a[6], rel=1e-3) and b[7] == pytest.approx(a[7], rel=1e-3)


def test_the_same_kernel_name_is_several_configurations(report):
    name, _, _, con = report
    configs = con.execute(
        "SELECT count(DISTINCT (grid_size, block_size, registers)) FROM ncu_launches "
        "WHERE kernel = 'fused_recurrent_decode'"
    ).fetchone()[0]
    variants = {c["variant"] for c in CELLS if c["report"] == name and c["kernel"] == "fused_recurrent_decode"}
    # per-head differs in grid, block and registers; the pre-normalised update shares the tiled launch's
    assert configs == len(variants) - 1


def test_every_cell_gets_its_verdict(report):
    name, _, _, con = report
    cells = {c["launch_index"]: c for c in CELLS if c["report"] == name}
    found, notes = run_rule(con, "K001", cache=False)
    assert not [n for n in notes if "failed" in n.message]
    flagged = {lid for f in found for lid in f.locality["launch"]["ncu_launch_ids"]}
    assert flagged == {i for i, c in cells.items() if c["repeats_per_tile"]}
    launches = {r[0]: r for r in con.execute("SELECT launch_id, duration_ns FROM ncu_launches").fetchall()}
    for f in found:
        jsonschema.validate(f.as_dict(), json_schema())
        assert next(iter(evidence(con, f).values())) == pytest.approx(f.observed.value, rel=1e-12)
        r = f.extra["roofline"]
        assert r["ai"] < r["ridge"] and r["bound"] in ("memory", "latency")  # a decode kernel: below the ridge
        for cell in f.extra["launches"]:
            baseline = cells[cell["baseline_launch_ids"][-1]]
            assert (
                baseline["variant"] in ("per_head", "prenorm") and baseline["gate"] == cells[cell["launch_id"]]["gate"]
            )
            assert 0.1 <= cell["repeated_share"] < 0.9
            counters = cell["counters"]
            # the repetition is FP32 arithmetic first: FADD/FMUL grow more than the instruction mix
            assert max(counters["FADD"], counters["FMUL"]) > counters["warp instructions"] > 0
            assert "global loads" in counters
        rep = max(f.extra["launches"], key=lambda c: c["repeated_share"])
        saved = launches[rep["launch_id"]][1] - rep["same_tiling_duration_ns"]
        assert f.extra["pays"] == (saved >= 0.05 * rep["duration_ns"])
        if f.extra["pays"]:
            assert f.severity == "warning" and f.impact_ns == int(saved)
        else:
            assert f.severity == "info" and f.impact_ns == 0 and "not expected to pay" in f.hypothesis


def test_no_finding_with_only_the_forms_without_repetition(tmp_path):
    """The per-head and pre-normalised launches alone (the tiled rows dropped from the raw page): quiet."""
    for name in REPORTS:
        lines = (MATRIX / f"{name}.raw.csv").read_text().splitlines()
        tiled = {c["launch_index"] for c in CELLS if c["report"] == name and c["variant"] == "tiled"}
        kept = lines[:2] + [line for i, line in enumerate(lines[2:]) if i not in tiled]
        path = tmp_path / f"{name}.raw.csv"
        path.write_text("\n".join(kept) + "\n")
        assert run_rule(load(path), "K001", cache=False)[0] == []
