"""R005 load-imbalance on real multi-rank runs: the expert-parallel matrix (tests/data/ep_matrix, four
and eight gloo ranks made on the device machine's CPU cores), whose hot expert's rank is reported with
its op and shapes, and whose balanced and data-parallel cells are quiet; the eight-rank gloo rank
matrix (stragglers of other kinds: quiet); the cluster path gives the same finding and id."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.conftest import ROOT
from tracekit.engine.runner import run_rules

EP = ROOT / "tests" / "data" / "ep_matrix"
RANKS = ROOT / "tests" / "data" / "rank_matrix"


def _cells(folder):
    return {c["name"]: c for c in json.loads((folder / "cells.json").read_text())["cells"]}


def _files(folder, name):
    return [folder / f for f in _cells(folder)[name]["files"]]


@pytest.mark.parametrize("world", ["w4", "w8"])
@pytest.mark.parametrize("cell", ["hot_expert", "hot_expert_mild"])
def test_the_hot_experts_rank_is_reported_with_its_op_and_shapes(loaded, world, cell):
    folder = EP / world
    con = loaded(*_files(folder, cell))
    findings, _ = run_rules(con, ["R005"])
    hot = _cells(folder)[cell]["slow_rank"]
    assert [f.locality["rank"] for f in findings] == [hot]
    (f,) = findings
    # the expert's first Linear, not the addmm it calls (both grow alike) nor a collective
    assert f.locality["op"] == "aten::linear"
    assert f.severity == "critical"
    # the ratio is the rank's input elements over the median rank's, recomputed from the evidence query
    rows = con.execute(f.sql, f.sql_params).fetchall()
    elements = {r[0]: r[5] for r in rows}
    assert len(elements) == int(world[1:])
    ratio = elements[hot] / statistics.median(elements.values())
    assert ratio >= 1.25
    assert f.extra["work_ratio"] == pytest.approx(ratio, rel=0.01)
    assert f.observed.value == int(elements[hot])
    # the shapes in the title are the hot rank's and a typical rank's, and differ in their token count
    hot_dims = next(r[6] for r in rows if r[0] == hot)
    assert hot_dims in f.title and f.locality["input_shapes"] == hot_dims
    assert "router" in f.next_experiment  # expert parallel: the routing, not the node


@pytest.mark.parametrize("world", ["w4", "w8"])
@pytest.mark.parametrize("cell", ["ep_balanced", "healthy"])
def test_quiet_where_every_rank_gets_the_same_shapes(loaded, world, cell):
    # the slower-core run of w4 too: more time on one rank, the same shapes
    if world == "w4" and cell == "healthy":
        assert run_rules(loaded(*_files(EP / world, "slower_core")), ["R005"])[0] == []
    con = loaded(*_files(EP / world, cell))
    assert run_rules(con, ["R005"])[0] == []


@pytest.mark.parametrize("cell", sorted(_cells(RANKS)))
def test_quiet_on_stragglers_of_other_kinds(loaded, cell):
    # extra compute in an op only one rank runs, data loading, late starts: more time, the same shapes
    con = loaded(*_files(RANKS, cell))
    assert run_rules(con, ["R005"])[0] == []


def test_a_smaller_excess_than_min_share_is_not_reported(loaded):
    con = loaded(*_files(EP / "w4", "hot_expert_mild"))
    (f,) = run_rules(con, ["R005"])[0]
    share = f.extra["extra_ns_per_iteration"] / f.extra["iteration_ns"]
    assert run_rules(con, ["R005"], {"R005": {"min_share": share * 1.01}})[0] == []
    assert run_rules(con, ["R005"], {"R005": {"min_work_ratio": f.extra["work_ratio"] * 1.01}})[0] == []


def test_the_cluster_path_gives_the_same_finding():
    # the per-rank input summary travels to the reducer: without it the reducer has nothing to compare
    import tracekit

    files = _files(EP / "w4", "hot_expert")
    with tracekit.open(*files) as trace:
        expected = [f.as_dict() for f in trace.analysis(["R005"]).findings]
    job = tracekit.analyze_job(files, rules=["R005"], chunk_size=1)
    assert job.missing == []
    found = [r for r in job.records if r["rule"] == "R005"]
    assert len(expected) == 1
    assert [(r["id"], r["title"]) for r in found] == [(f["id"], f["title"]) for f in expected]


@pytest.mark.parametrize("world", ["w4", "w8"])
@pytest.mark.parametrize("cell", ["hot_expert", "hot_expert_mild"])
def test_the_straggler_finding_says_the_rank_is_given_more(loaded, world, cell):
    """R001 names the hot rank the others wait for; with R005's answer at hand it says the rank gets
    more input (the same op and ratio as R005) and asks for rebalancing, not for a shape comparison."""
    con = loaded(*_files(EP / world, cell))
    findings, _ = run_rules(con, ["R001", "R005"])
    straggler = next(f for f in findings if f.rule == "R001")
    imbalance = next(f for f in findings if f.rule == "R005")
    assert straggler.locality["rank"] == imbalance.locality["rank"] == _cells(EP / world)[cell]["slow_rank"]
    skew = straggler.extra["input_skew"]
    assert skew["op"] == imbalance.locality["op"]
    assert skew["work_ratio"] == imbalance.extra["work_ratio"]
    assert "given more work" in straggler.next_experiment and "Compare `" not in straggler.next_experiment


@pytest.mark.parametrize("cell", ["slow_compute", "slow_host", "late_start"])
def test_a_straggler_given_the_same_input_keeps_the_comparison(loaded, cell):
    con = loaded(*_files(RANKS, cell))
    (straggler,) = run_rules(con, ["R001"])[0]
    assert straggler.extra["input_skew"] is None
    assert "given more" not in straggler.hypothesis
