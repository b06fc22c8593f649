"""Nsight Compute CSV: both layouts parse to one metric per row with exact values, and K001 finds
work repeated per tile where instructions grow with tiles at flat DRAM traffic, and says whether
removing it pays."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from tests.conftest import CORPUS, evidence, run_rule
from tracekit import db
from tracekit.findings.model import json_schema
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import ncu_csv

KDA = CORPUS.parent / "reference" / "experiments" / "results" / "ncu_kda.csv"  # H200, BV = 16..128
ESMM = CORPUS / "esmm__metrics.csv"  # SGEMM ladder, one launch per kernel


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path


def test_long_layout_values_are_exact(tmp_path):
    table = ncu_csv.parse(need(ESMM))
    assert table.layout == "long"
    text_rows = [line for line in need(ESMM).read_text().splitlines()[1:] if line.strip()]
    assert table.lines_read == len(text_rows) == len(table.rows)
    dram = next(r for r in table.rows if r["metric"] == "dram__bytes.sum")
    assert dram["value"] == float(dram["value_text"].replace(",", ""))
    assert {r["launch_id"] for r in table.rows} == {str(i) for i in range(9)}


def test_profiler_chatter_is_not_data():
    table = ncu_csv.parse(need(KDA))  # starts with ==WARNING== / ==PROF== lines
    assert table.rows and not table.skipped
    assert {r["kernel"] for r in table.rows} == {"fused_recurrent_kda_fwd_kernel"}


def test_wide_layout_with_units_row(tmp_path):
    path = tmp_path / "raw.csv"
    path.write_text(
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","gpu__time_duration.sum","sm__inst_executed.sum","dram__bytes.sum"\n'
        '"","","","","","","","","","","","nsecond","inst","byte"\n'
        '"0","7","python","h","k(int)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","1,024","2,000","4,096"\n'
        '"1","7","python","h","k(int)","1","7","(128, 1, 1)","(128, 1, 1)","0","9.0","1,100","4,000","4,096"\n'
    )
    table = ncu_csv.parse(path)
    assert table.layout == "wide" and len(table.rows) == 6
    inst = [r for r in table.rows if r["metric"] == "sm__inst_executed.sum"]
    assert [(r["unit"], r["value"]) for r in inst] == [("inst", 2000.0), ("inst", 4000.0)]


def test_ingest_reconciles_and_fills_ncu_launches(fresh_db):
    ingest(fresh_db, [need(KDA), need(ESMM)])
    logs = fresh_db.execute(
        "SELECT format, events_read, events_ingested, events_skipped FROM ingest_log ORDER BY run_id"
    ).fetchall()
    assert [f for f, *_ in logs] == ["ncu_csv", "ncu_csv"]
    assert all(read == ok + skipped for _, read, ok, skipped in logs)
    rows = fresh_db.execute("SELECT count(*) FROM ncu_metrics").fetchone()[0]
    assert rows == sum(ok for _, _, ok, _ in logs)
    launches = fresh_db.execute("SELECT run_id, count(*) FROM ncu_launches GROUP BY 1 ORDER BY 1").fetchall()
    assert launches == [(1, 4), (2, 9)]


def test_repeated_tile_work_found_and_not_sold_as_a_speedup(loaded):
    con = loaded(need(KDA))
    found, notes = run_rule(con, "K001")
    (f,) = found
    assert f.locality["kernel"] == "fused_recurrent_kda_fwd_kernel"
    row = evidence(con, f)
    assert row["repeated_share"] == f.observed.value
    assert row["inst_max_grid"] > 1.5 * row["inst_min_grid"]
    assert abs(row["dram_max_grid"] - row["dram_min_grid"]) < 0.1 * row["dram_min_grid"]
    # latency-bound on the H200: the finding says fusing is not expected to pay, and claims no saving
    assert row["bound"] != "compute" and f.severity == "info" and f.impact_ns == 0
    assert "not expected" in f.hypothesis
    jsonschema.validate(f.as_dict(), json_schema())


def test_quiet_without_a_tiling_sweep(loaded):
    found, _ = run_rule(loaded(need(ESMM)), "K001")
    assert found == []


def test_needs_ncu_data(loaded):
    from tests.conftest import sample

    found, notes = run_rule(loaded(sample("gpu_tp2_rank0.json.gz")), "K001")
    assert found == [] and notes and "ncu_launches" in notes[0].message


def test_not_an_ncu_csv_is_an_input_error(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(Exception) as e:
        ingest(db.connect(None), [path])
    assert str(path) in str(e.value)


def test_project_kernel_heavy_gate_is_compute_bound_and_worth_fixing(loaded):
    from tests.conftest import sample

    con = loaded(sample("ncu_tiles_repeated_heavy.csv"))
    (f,) = run_rule(con, "K001")[0]
    row = evidence(con, f)
    assert f.severity == "warning" and f.impact_ns > 0
    assert row["bound"] in ("compute", "high throughput") and row["sm_pct"] > row["mem_pct"]
    durations = [d for (d,) in con.execute("SELECT duration_ns FROM ncu_launches ORDER BY grid_size").fetchall()]
    assert f.impact_ns == durations[-1] - min(durations)


def test_project_kernel_light_gate_is_reported_as_not_paying(loaded):
    from tests.conftest import sample

    (f,) = run_rule(loaded(sample("ncu_tiles_repeated_light.csv")), "K001")[0]
    assert f.severity == "info" and f.impact_ns == 0 and "not expected" in f.hypothesis


@pytest.mark.parametrize("name", ["ncu_tiles_hoisted_light.csv", "ncu_tiles_hoisted_heavy.csv"])
def test_quiet_when_the_work_is_hoisted_out_of_the_tile_loop(loaded, name):
    from tests.conftest import sample

    con = loaded(sample(name))
    assert run_rule(con, "K001")[0] == []
    # the rule is quiet for the right reason: tiling overhead alone stays below the growth threshold
    lo, hi = con.execute(
        "SELECT arg_min(inst_executed, grid_size), arg_max(inst_executed, grid_size) FROM ncu_launches"
    ).fetchone()
    assert 1.0 < hi / lo < 2.5
