"""tracekit.summary.top_costs on real traces: totals agree with direct SQL, order is stable, output is bounded."""

from __future__ import annotations

import json

import pytest

from tracekit.findings.time_summary import top_costs

from .conftest import corpus, sample


@pytest.fixture(scope="module")
def mixed(loaded):
    """A GPU rank, a CPU-only trace and a multi-stream training trace in one database."""
    return loaded(
        sample("gpu_tp2_rank0.json.gz"),
        sample("cpu_two_threads.json.gz"),
        corpus("hta__trace_diff__control.json.gz"),
    )


def _union(intervals):
    total, cur = 0, None
    for s, e in sorted(intervals):
        if cur and s <= cur[1]:
            cur[1] = max(cur[1], e)
        else:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, e]
    return total + (cur[1] - cur[0] if cur else 0)


def test_json_serializable_and_deterministic(mixed):
    a = top_costs(mixed, limit=5)
    b = top_costs(mixed, limit=5)
    assert json.dumps(a, sort_keys=False) == json.dumps(b, sort_keys=False)
    assert json.loads(json.dumps(a)) == a
    run_ids = [r["run_id"] for r in a["runs"]]
    assert run_ids == sorted(run_ids) == [r[0] for r in mixed.execute("SELECT run_id FROM runs ORDER BY 1").fetchall()]


@pytest.mark.parametrize("limit", [1, 3, 10])
def test_every_list_is_bounded_and_ordered(mixed, limit):
    s = top_costs(mixed, limit=limit)
    for run in s["runs"]:
        assert len(run["gpu"]["devices"]) <= limit
        sections = (("top_kernels", "kernels", "total_ns"), ("top_cpu_ops", "cpu_ops", "self_ns"),
                    ("streams", "streams", "busy_ns"), ("threads", "threads", "cpu_ns"))  # fmt: skip
        for section, counted, key in sections:
            items = run[section]
            assert len(items) <= limit
            assert len(items) == min(limit, run["distinct"][counted])
            assert key in s["columns"][section]
            values = [i[key] for i in items]
            assert values == sorted(values, reverse=True)


def test_kernel_totals_equal_direct_sums(mixed):
    s = top_costs(mixed, limit=10)
    for run in s["runs"]:
        direct = {
            name: (n, total, mx)
            for name, n, total, mx in mixed.execute(
                "SELECT name, count(*), sum(dur_ns), max(dur_ns) FROM kernels WHERE run_id = ? GROUP BY name",
                [run["run_id"]],
            ).fetchall()
        }
        assert run["distinct"]["kernels"] == len(direct)
        for k in run["top_kernels"]:
            assert (k["count"], k["total_ns"], k["max_ns"]) == direct[k["name"]]
            assert k["mean_ns"] == pytest.approx(k["total_ns"] / k["count"], abs=1)
        if direct:
            best = max(direct.items(), key=lambda kv: (kv[1][1], [-ord(c) for c in kv[0]]))
            assert run["top_kernels"][0]["total_ns"] == best[1][1]
            comm = mixed.execute(
                "SELECT DISTINCT name FROM kernels WHERE run_id = ? AND is_communication", [run["run_id"]]
            ).fetchall()
            assert {k["name"] for k in run["top_kernels"] if k["is_communication"]} <= {c[0] for c in comm}


def test_gpu_busy_is_the_union_of_activities(mixed):
    s = top_costs(mixed, limit=10)
    for run in s["runs"]:
        for d in run["gpu"]["devices"]:
            acts = mixed.execute(
                "SELECT ts_ns, end_ns FROM gpu_activities WHERE run_id = ? AND device = ? AND dur_ns > 0",
                [run["run_id"], d["device"]],
            ).fetchall()
            assert d["busy_ns"] == _union(acts)
            assert d["busy_ns"] <= sum(e - s_ for s_, e in acts)
            assert d["busy_ns"] <= run["window_duration_ns"]
            assert 0 < d["busy_share"] <= 1
        streams = run["streams"]
        for st in streams:
            direct = mixed.execute(
                "SELECT sum(dur_ns) FROM gpu_activities WHERE run_id = ? AND device = ? AND stream = ?",
                [run["run_id"], st["device"], st["stream"]],
            ).fetchone()[0]
            assert st["busy_ns"] == direct
            assert st["kernel_ns"] <= st["busy_ns"]


def test_cpu_ops_self_time_and_grouping(mixed):
    s = top_costs(mixed, limit=10)
    for run in s["runs"]:
        for op in run["top_cpu_ops"]:
            assert 0 <= op["self_ns"] <= op["total_ns"]
            n, total = mixed.execute(
                "SELECT count(*), sum(dur_ns) FROM cpu_ops WHERE run_id = ? AND name = ? AND coalesce(input_dims, '') = ?",
                [run["run_id"], op["name"], op["input_dims"] or ""],
            ).fetchone()
            assert (op["count"], op["total_ns"]) == (n, total)


def test_threads_are_named_and_within_the_window(mixed):
    s = top_costs(mixed, limit=10)
    cpu = next(r for r in s["runs"] if r["label"] == "cpu_two_threads")
    names = {t["name"] for t in cpu["threads"]}
    assert any(n and "kv_transfer" in n for n in names)
    assert cpu["gpu"]["devices"] == [] and cpu["top_kernels"] == [] and cpu["streams"] == []
    for run in s["runs"]:
        for t in run["threads"]:
            assert 0 < t["cpu_ns"] <= run["window_duration_ns"]
            known = mixed.execute(
                "SELECT name FROM threads WHERE run_id = ? AND pid = ? AND tid = ?", [run["run_id"], t["pid"], t["tid"]]
            ).fetchone()
            assert t["name"] == (known[0] if known else None)
