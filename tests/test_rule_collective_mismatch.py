"""R003 collective-mismatch on real multi-rank runs: quiet on every cell of the eight-rank gloo
matrix, the 2-rank samples and HTA's sampled ranks (whose all-to-all and all-reduce trade places);
it finds a rank that skips a collective or runs another one, made from the healthy cell's own rank
trace with one gloo collective removed or renamed."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import ROOT, corpus, sample
from tracekit.engine.runner import run_rules

MATRIX = ROOT / "tests" / "data" / "rank_matrix"
CELLS = {c["name"]: c for c in json.loads((MATRIX / "cells.json").read_text())["cells"]}
HEALTHY = [MATRIX / f for f in CELLS["healthy"]["files"]]


def _r003(con):
    return run_rules(con, ["R003"])[0]


@pytest.mark.parametrize("cell", sorted(CELLS), ids=sorted(CELLS))
def test_quiet_on_every_cell(cell, loaded):
    assert _r003(loaded(*[MATRIX / f for f in CELLS[cell]["files"]])) == []


@pytest.mark.parametrize(
    "pair",
    [("gloo_rank0.json.gz", "gloo_rank1.json.gz"), ("gpu_tp2_rank0.json.gz", "gpu_tp2_rank1.json.gz")],
    ids=["gloo", "tp2"],
)
def test_quiet_on_the_two_rank_samples(pair, loaded):
    assert _r003(loaded(*[sample(p) for p in pair])) == []


def test_swapped_neighbours_are_not_a_divergence(loaded):
    con = loaded(
        corpus("hta__trace_filter__sampled_rank-0.json.gz"), corpus("hta__trace_filter__sampled_rank-1.json.gz")
    )
    names = dict(
        con.execute("SELECT rank, list(collective ORDER BY seq) FROM rank_collectives GROUP BY rank").fetchall()
    )
    assert names[0] != names[1]  # the two ranks' orders do differ, at two neighbouring positions
    assert _r003(con) == []


def _edited_rank3(tmp_path, edit) -> list:
    """The healthy cell with rank 3's trace edited: `edit(events)` changes the list in place."""
    doc = json.loads(gzip.open(HEALTHY[3]).read())
    edit(doc["traceEvents"])
    out = tmp_path / "rank3.json.gz"
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return [*HEALTHY[:3], out, *HEALTHY[4:]]


def _fifth_all_gather(events) -> int:
    gathers = sorted((e["ts"], i) for i, e in enumerate(events) if e.get("name") == "gloo:all_gather")
    return gathers[4][1]


def test_a_rank_that_skips_a_collective(tmp_path):
    import tracekit

    files = _edited_rank3(tmp_path, lambda ev: ev.pop(_fifth_all_gather(ev)))
    with tracekit.open(*files) as t:
        (finding,) = _r003(t.connection)
        per_rank = t.sql(finding.sql, **finding.sql_params).fetchall()
    assert finding.locality["rank"] == 3 and finding.severity == "warning"
    x = finding.extra
    assert (x["ran"], x["others_ran"], x["position"]) == ("all_reduce", "all_gather", 15)
    assert x["collectives"]["3"] == x["collectives"]["0"] - 1
    assert x["diverging_ranks"] == [3]
    # the evidence SQL lists the sequences the finding compared
    by_rank = {r[1]: r[3] for r in per_rank}
    assert by_rank[3][14] == "all_reduce" and by_rank[0][14] == "all_gather"


def test_a_rank_that_runs_another_collective(tmp_path):
    import tracekit

    def rename(events):
        events[_fifth_all_gather(events)]["name"] = "gloo:broadcast"

    with tracekit.open(*_edited_rank3(tmp_path, rename)) as t:
        (finding,) = _r003(t.connection)
    assert finding.locality["rank"] == 3
    assert (finding.extra["ran"], finding.extra["others_ran"]) == ("broadcast", "all_gather")
    assert finding.extra["collectives"]["3"] == finding.extra["collectives"]["0"]


def test_a_window_that_starts_one_collective_later_is_not_a_divergence(tmp_path):
    import tracekit

    def drop_first(events):
        first = min((e["ts"], i) for i, e in enumerate(events) if str(e.get("name", "")).startswith("gloo:"))
        events.pop(first[1])

    with tracekit.open(*_edited_rank3(tmp_path, drop_first)) as t:
        assert _r003(t.connection) == []
