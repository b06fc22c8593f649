"""R002 outlier-ranks on real multi-rank runs: the eight-rank gloo matrix (tests/data/rank_matrix), whose
injected ranks R001 names (R002 then stays at info and says so), its healthy cell (quiet), and the
2-rank samples (too few ranks). The robust statistics are checked against a direct computation over
the view's rows, and the reading of the parts (slow, waiting) on rows made for it."""

from __future__ import annotations

import json
import statistics
from collections import namedtuple

import pytest

from tests.conftest import ROOT, corpus, sample
from tracekit.engine.runner import run_rules
from tracekit.rules import outlier_ranks

MATRIX = ROOT / "tests" / "data" / "rank_matrix"
CELLS = {c["name"]: c for c in json.loads((MATRIX / "cells.json").read_text())["cells"]}


def _params():
    from tracekit.engine.registry import get_rule

    return get_rule("R002").resolve_params()


def _cell(loaded, name):
    return loaded(*[MATRIX / f for f in CELLS[name]["files"]])


def _robust(values: list[float], iteration: float, floor_share: float) -> list[float]:
    median = statistics.median(values)
    mad = max(statistics.median(abs(v - median) for v in values), floor_share * iteration)
    return [0.6745 * (v - median) / mad for v in values]


def test_quiet_on_the_healthy_cell(loaded):
    con = _cell(loaded, "healthy")
    assert run_rules(con, ["R002"])[0] == []
    # and not by a margin of luck: no part of any rank is near the bar
    rows = con.execute("SELECT iteration_ns, computing_ns, communication_ns, free_ns FROM rank_components").fetchall()
    iteration = statistics.median(r[0] for r in rows)
    for j in (1, 2, 3):
        assert max(abs(z) for z in _robust([r[j] for r in rows], iteration, 0.01)) < 2.5


@pytest.mark.parametrize("name", ["late_start", "late_start_2ms", "slow_compute_30pct", "slow_host"])
def test_the_injected_rank_stands_out_and_is_left_to_r001(name, loaded):
    con = _cell(loaded, name)
    cell = CELLS[name]
    (finding,) = run_rules(con, ["R002"])[0]
    assert finding.locality["rank"] == cell["slow_rank"]
    assert finding.extra["reading"] == "slow"
    (straggler,) = run_rules(con, ["R001"])[0]
    assert straggler.locality["rank"] == cell["slow_rank"]
    assert finding.extra["straggler_by_r001"] and finding.severity == "info"
    part = "free" if cell["kind"] == "late_start" else "computing"
    assert part in finding.extra["parts"]
    # the z-score the finding states is the one the view's rows give
    rows = con.execute(f"SELECT rank, iteration_ns, {part}_ns FROM rank_components ORDER BY rank").fetchall()
    iteration = statistics.median(r[1] for r in rows)
    zs = dict(zip((r[0] for r in rows), _robust([r[2] for r in rows], iteration, 0.01)))
    assert finding.extra["parts"][part]["robust_z"] == pytest.approx(zs[cell["slow_rank"]], abs=0.01)
    assert all(abs(z) < 3.5 for rank, z in zs.items() if rank != cell["slow_rank"])


def test_a_slow_rank_no_straggler_finding_covers_is_a_warning(loaded, monkeypatch):
    monkeypatch.setattr(outlier_ranks, "_straggler", lambda con, world_size: None)
    (finding,) = run_rules(_cell(loaded, "late_start"), ["R002"])[0]
    assert finding.severity == "warning" and finding.locality["rank"] == CELLS["late_start"]["slow_rank"]
    assert "R001" not in finding.hypothesis


def test_two_ranks_are_too_few(loaded):
    con = loaded(sample("gloo_rank0.json.gz"), sample("gloo_rank1.json.gz"))
    assert con.execute("SELECT count(*) FROM rank_components").fetchone()[0] == 2
    assert run_rules(con, ["R002"])[0] == []


Row = namedtuple("Row", "run_id rank steps source iteration_ns computing_ns communication_ns free_ns")


def _job(free_of_rank_5: float, communication_of_rank_5: float):
    ranks = [Row(r, r, 4, "cluster", 100.0, 60.0 + r % 3, 30.0 - r % 3, 10.0) for r in range(16)]
    ranks[5] = ranks[5]._replace(free_ns=free_of_rank_5, communication_ns=communication_of_rank_5)
    return ranks


def test_the_statistics_flag_one_rank_of_sixteen():
    params = _params()
    found = outlier_ranks._outliers(_job(30.0, 10.0), 100.0, params)
    assert set(found) == {_job(30.0, 10.0)[5]}
    (parts,) = found.values()
    assert set(parts) == {"free", "communication"}  # identical free times elsewhere: the MAD floor, not a 0
    assert parts["free"][2] == pytest.approx(0.6745 * 20.0 / 1.0)
    assert outlier_ranks._reading(parts) == "slow"


def test_a_small_difference_is_not_an_outlier_however_consistent():
    # 2% of the iteration more free time on one rank: z is large (every other rank is identical) but
    # the difference is under min_share
    assert outlier_ranks._outliers(_job(12.0, 28.0), 100.0, _params()) == {}


def test_more_communication_alone_reads_as_waiting():
    parts = {"communication": (50.0, 30.0, 13.5)}
    assert outlier_ranks._reading(parts) == "waits"
    assert outlier_ranks._reading({"computing": (40.0, 61.0, -14.0)}) == "light"


CLUSTER_DB = "ascend/msinsight__full_db__cluster_analysis.db"
GPT3 = "ascend/msinsight__server_test_data_gpt3"


def test_the_profilers_cluster_summary_names_the_slow_ranks(loaded):
    import sqlite3

    con = loaded(corpus(CLUSTER_DB))
    findings = run_rules(con, ["R002"])[0]
    assert sorted(f.locality["rank"] for f in findings) == [0, 5]
    assert all(f.severity == "warning" and f.extra["reading"] == "slow" for f in findings)
    assert all(f.extra["source"] == "cluster summary" for f in findings)
    # recomputed from the database itself (us -> ns), not from tracekit's view
    source = sqlite3.connect(f"file:{corpus(CLUSTER_DB)}?mode=ro", uri=True)
    rows = source.execute(
        'SELECT CAST("index" AS INTEGER), computing, communication_not_overlapped, free FROM ClusterStepTraceTime '
        "WHERE type = 'rank' ORDER BY 1"
    ).fetchall()
    iteration = statistics.median((c + n + f) * 1000 for _, c, n, f in rows)
    free_z = dict(zip((r[0] for r in rows), _robust([r[3] * 1000 for r in rows], iteration, 0.01)))
    for f in findings:
        assert f.extra["parts"]["free"]["robust_z"] == pytest.approx(free_z[f.locality["rank"]], abs=0.01)
        assert f.extra["parts"]["communication"]["ns"] < f.extra["parts"]["communication"]["median_ns"]


def test_pipeline_stages_that_differ_as_groups_name_no_rank(loaded):
    con = loaded(corpus(GPT3))
    assert con.execute("SELECT count(*) FROM rank_components WHERE source = 'cluster summary'").fetchone()[0] == 16
    assert run_rules(con, ["R002"])[0] == []


def test_the_cluster_path_gives_the_same_findings_from_a_cluster_summary():
    """The profiler's cluster summary travels to the reducer (cluster_step_components), so the map/reduce
    path finds what one database finds, with the same ids."""
    import tracekit

    with tracekit.open(corpus(CLUSTER_DB)) as trace:
        expected = [f.as_dict() for f in trace.analysis(["R002"]).findings]
    job = tracekit.analyze_job([corpus(CLUSTER_DB), corpus(GPT3)], rules=["R002"], chunk_size=1)
    assert job.missing == []
    found = [r for r in job.records if r["rule"] == "R002"]
    assert sorted((r["id"], r["locality"]["rank"]) for r in found) == sorted(
        (f["id"], f["locality"]["rank"]) for f in expected
    )
