"""benchmarks/make_rank_set.py: an N-rank set made from the real rank-matrix traces stays a valid job."""

import gzip
import json
import sys
from pathlib import Path

import pytest

import tracekit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import make_rank_set  # noqa: E402

N = 4


@pytest.fixture(scope="module")
def rank_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("set") / "ranks"
    desc = make_rank_set.build(
        N, out=str(out), cell="healthy", straggler="slow_compute", slow_rank=1, steps=2, seed=7, jobs=1, quiet=True
    )
    files = [out / f"rank{k}.json.gz" for k in range(N)]
    traces = [json.load(gzip.open(f)) for f in files]
    return desc, files, traces


def _source(name):
    cell, rank = name.split("/")
    path = make_rank_set.MATRIX + f"/{cell}/{rank}.json.gz"
    return make_rank_set.cut_steps(json.load(gzip.open(path)), 2)


def test_relabelled_ranks_and_pids(rank_set):
    desc, _, traces = rank_set
    assert [t["distributedInfo"]["rank"] for t in traces] == list(range(N))
    assert {t["distributedInfo"]["world_size"] for t in traces} == {N}
    assert all(t["distributedInfo"]["pg_config"][0]["ranks"] == list(range(N)) for t in traces)
    # the OS pids of the complete events (the profiler's "Spans" track is named, not a pid)
    pids = [{e["pid"] for e in t["traceEvents"] if e.get("ph") == "X" and isinstance(e["pid"], int)} for t in traces]
    assert all(len(p) == 1 for p in pids)
    assert len(set().union(*pids)) == N
    assert [p.pop() for p in pids] == desc["pids"]


def test_straggler_from_the_slow_source_rank(rank_set):
    desc, _, traces = rank_set
    assert desc["slow_rank"] == 1 and desc["sources"][1] == "slow_compute/rank5"
    assert desc["injected"]["kind"] == "slow_compute"
    extra = [any(e.get("name") == "extra_compute" for e in t["traceEvents"]) for t in traces]
    assert extra == [k == 1 for k in range(N)]


def test_offsets_applied(rank_set):
    desc, _, traces = rank_set
    for k, t in enumerate(traces):
        src = _source(desc["sources"][k])
        first = next(e for e in src["traceEvents"] if e.get("ph") == "X")
        copy = next(e for e in t["traceEvents"] if e.get("ph") == "X")
        assert copy["name"] == first["name"]
        assert copy["ts"] - first["ts"] == pytest.approx(desc["offsets_us"][k], abs=1e-3)
    assert len(set(desc["offsets_us"])) == N


def test_steps_cut(rank_set):
    _, _, traces = rank_set
    for t in traces:
        assert sum(e.get("name", "").startswith("ProfilerStep#") for e in t["traceEvents"]) == 2


def test_ingests_and_collectives_match(rank_set):
    _, files, _ = rank_set
    tr = tracekit.open(*map(str, files))
    assert tr.sql("SELECT rank, world_size FROM runs ORDER BY rank").fetchall() == [(k, N) for k in range(N)]
    rows = tr.sql(
        "SELECT rank, list((process_group, seq, collective) ORDER BY seq) FROM collectives GROUP BY rank ORDER BY rank"
    ).fetchall()
    assert [r for r, _ in rows] == list(range(N))
    lists = [lst for _, lst in rows]
    assert len(lists[0]) == 6  # 3 collectives a step, 2 steps
    assert all(lst == lists[0] for lst in lists)
