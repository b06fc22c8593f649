"""C001 exposed-comm on real traces: 2xH200 tensor-parallel ranks, HTA's NCCL traces, and quiet inputs."""

from __future__ import annotations

import re

import jsonschema
import pytest

import tracekit
from tracekit.engine.registry import get_rule
from tracekit.engine.runner import run_rules
from tracekit.engine.toolkit import rows
from tracekit.findings.model import json_schema

from .conftest import corpus, evidence, run_rule, sample

TP = ("gpu_tp2_rank0.json.gz", "gpu_tp2_rank1.json.gz")
NCCL_CORPUS = (
    "hta__nccl_parser_config__nccl_data.json.gz",
    "hta__trace_diff__control.json.gz",
    "hta__negative_queue_length_values_check__rank0.json.gz",
)


def c001(con, **params):
    findings, notes = run_rules(con, ["C001"], params={"C001": params} if params else None)
    return findings, [n for n in notes if n.rule == "C001"]


@pytest.fixture(scope="module")
def tp(loaded):
    return loaded(*(sample(n) for n in TP))


def rank_of(con, run_id):
    return con.execute("SELECT rank FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]


def test_rule_is_registered_with_documented_options():
    rule = get_rule("C001")
    assert rule is get_rule("exposed-comm")
    options = rule.doc.split("## Options", 1)[1]
    assert set(rule.params) <= set(re.findall(r"`([a-z_]+)`", options))


def test_fires_on_tensor_parallel_rank_that_waits(tp):
    findings, _ = c001(tp)
    by_rank = {f.locality["rank"]: f for f in findings}
    assert 0 in by_rank, "rank 0's NCCL all-reduces are not overlapped and fill most of its window"
    f = by_rank[0]
    loc = f.locality
    comm_names = {r[0] for r in tp.execute("SELECT DISTINCT name FROM kernels WHERE is_communication").fetchall()}
    assert loc["kernel"] in comm_names
    streams = {r[0] for r in tp.execute(
        "SELECT DISTINCT stream FROM kernels WHERE run_id = ? AND device = ? AND is_communication",
        [loc["run_id"], loc["device"]]).fetchall()}  # fmt: skip
    assert loc["stream"] in streams
    assert loc["op"].startswith("c10d::")
    assert loc["launch"]["annotation"].startswith("nccl:")
    assert loc["code_path"] and any("all_reduce" in frame for frame in loc["code_path"])
    assert not any(re.search(r"0x[0-9a-f]{6,}", frame) for frame in loc["code_path"]), (
        "per-process addresses leak into the id"
    )
    run = tp.execute("SELECT start_ns, end_ns FROM runs WHERE run_id = ?", [loc["run_id"]]).fetchone()
    assert run[0] <= loc["window_ns"][0] < loc["window_ns"][1] <= run[1]
    assert f.severity in ("warning", "critical") and f.impact_share >= 0.05
    top = f.extra["top_collectives"]
    assert top == sorted(top, key=lambda g: -g["exposed_ns"])
    assert top[0]["collective"] == "allreduce" and top[0]["message_bytes"] == 2 * top[0]["in_nelems"]  # bf16
    assert sum(g["exposed_ns"] for g in top) <= f.observed.value
    assert f.sample_event_ids and set(f.sample_event_ids) <= {
        r[0] for r in tp.execute("SELECT event_id FROM kernels WHERE is_communication").fetchall()
    }


def test_cross_rank_split_blames_the_late_rank(tp):
    findings, _ = c001(tp)
    f = next(f for f in findings if f.locality["rank"] == 0)
    cross = f.extra["cross_rank"]
    assert cross["ranks"] == [0, 1]
    assert 0 <= cross["wait_for_peers_ns"] <= f.observed.value
    # Independent check: pair the n-th all-reduce of each rank; rank 1 starting later means rank 0 waits.
    later = tp.execute(
        """WITH c AS (SELECT r.rank, k.ts_ns, row_number() OVER (PARTITION BY k.run_id ORDER BY k.ts_ns) AS n
                      FROM kernels k JOIN runs r USING (run_id) WHERE k.is_communication)
           SELECT avg(CASE WHEN b.ts_ns > a.ts_ns THEN 1 ELSE 0 END)
           FROM c a JOIN c b ON a.n = b.n AND a.rank = 0 AND b.rank = 1"""
    ).fetchone()[0]
    assert (cross["latest_rank"] == 1) == (later > 0.5)
    if cross["wait_share_of_exposed"] >= 0.5:
        assert "waiting for rank 1" in f.title and "rank 1" in f.next_experiment
    # The late rank itself waits less, so it has less exposed comm than the rank that waits for it.
    r0 = evidence(tp, f)
    run1 = next(r for r in tp.execute("SELECT run_id FROM runs WHERE rank = 1").fetchall())[0]
    dev1 = tp.execute("SELECT any_value(device) FROM kernels WHERE run_id = ? AND is_communication", [run1]).fetchone()[
        0
    ]
    r1 = dict(zip(["exposed_ns"], tp.execute(f.sql, {**f.sql_params, "run_id": run1, "device": dev1}).fetchone()))
    assert r1["exposed_ns"] < r0["exposed_ns"]


def test_single_rank_has_no_cross_rank_split_and_same_id(tp, loaded):
    alone = loaded(sample(TP[0]))
    [f] = c001(alone)[0]
    assert "cross_rank" not in f.extra
    assert any("No other rank" in c for c in f.caveats)
    both = next(g for g in c001(tp)[0] if g.locality["rank"] == 0)
    assert f.id == both.id, "the id depends on where the problem is, not on which other runs are loaded"
    assert f.observed.value == both.observed.value


@pytest.mark.parametrize("names", [TP, *[(n,) for n in NCCL_CORPUS]], ids=lambda n: n[0].split(".")[0])
def test_evidence_sql_reproduces_observed_and_invariants(loaded, names):
    paths = [sample(n) if n.startswith("gpu_") else corpus(n) for n in names]
    con = loaded(*paths)
    findings, _ = c001(con)
    assert findings, "every trace here has NCCL kernels taking >5% of the window"
    schema = json_schema()
    for f in findings:
        ev = evidence(con, f)
        assert ev["exposed_ns"] == f.observed.value == f.impact_ns
        assert ev["comm_ns"] == f.extra["comm_ns"] and ev["overlapped_ns"] == f.extra["overlapped_ns"]
        assert ev["comm_kernels"] == f.extra["comm_kernels"]
        assert 0 <= ev["exposed_ns"] <= ev["comm_ns"]
        assert ev["exposed_ns"] + ev["overlapped_ns"] == ev["comm_ns"]
        assert 0 <= ev["overlap_pct"] <= 100
        assert ev["overlap_pct"] == pytest.approx(100 * (ev["comm_ns"] - ev["exposed_ns"]) / ev["comm_ns"], abs=0.01)
        assert ev["overlap_pct"] == pytest.approx(f.extra["overlap_pct"], abs=0.01)
        assert ev["exposed_share"] == pytest.approx(f.impact_share, abs=1e-4)
        # shares are of the run's steady time (`run_steady`), warm-up steps left out
        assert (
            f.window_ns
            == con.execute("SELECT steady_ns FROM run_steady WHERE run_id = ?", [f.locality["run_id"]]).fetchone()[0]
        )
        jsonschema.validate(f.as_dict(), schema)


def _independent_overlap(con, run_id, device, memcpy_is_compute):
    """Overlapped and total comm time by plain Python interval arithmetic."""
    compute = con.execute(
        """SELECT ts_ns, end_ns FROM gpu_activities g WHERE run_id = ? AND device = ? AND dur_ns > 0
             AND (kind <> 'kernel' AND ? OR kind = 'kernel'
                  AND event_id NOT IN (SELECT event_id FROM kernels WHERE is_communication))
           ORDER BY ts_ns, end_ns""",
        [run_id, device, memcpy_is_compute],
    ).fetchall()
    merged: list[list[int]] = []
    for s, e in compute:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    comm = con.execute(
        "SELECT ts_ns, end_ns FROM kernels WHERE run_id = ? AND device = ? AND is_communication", [run_id, device]
    ).fetchall()
    overlapped = sum(max(0, min(ce, e) - max(cs, s)) for cs, ce in comm for s, e in merged)
    return overlapped, sum(ce - cs for cs, ce in comm)


# nccl_data: comm on its own stream, compute on one; trace_diff: compute on two streams that overlap each other.
@pytest.mark.parametrize(
    "name",
    ["hta__nccl_parser_config__nccl_data.json.gz", "hta__trace_diff__test.json.gz", "hta__trace_diff__control.json.gz"],
    ids=lambda n: n.split(".")[0],
)
def test_overlap_matches_an_independent_interval_computation(loaded, name):
    con = loaded(corpus(name))
    [f] = c001(con)[0]
    [g] = c001(con, memcpy_is_compute=True)[0]
    for finding, with_memcpy in ((f, False), (g, True)):
        assert finding.sql_params["memcpy_is_compute"] is with_memcpy
        overlapped, total = _independent_overlap(
            con, finding.sql_params["run_id"], finding.sql_params["device"], with_memcpy
        )
        assert 0 < overlapped < total, "these traces overlap some but not all comm"
        assert finding.extra["overlapped_ns"] == overlapped
        assert finding.observed.value == total - overlapped == evidence(con, finding)["exposed_ns"]
    # Counting memcpy/memset as compute can only hide more communication.
    assert g.observed.value <= f.observed.value


def test_thresholds_select_devices(tp):
    devices = tp.execute("SELECT count(DISTINCT (run_id, device)) FROM kernels WHERE is_communication").fetchone()[0]
    everything, _ = c001(tp, min_exposed_share=0.0)
    assert len(everything) == devices
    nothing, _ = c001(tp, min_exposed_share=1.01, max_overlap_pct=0.0)
    assert nothing == []
    by_overlap, _ = c001(tp, min_exposed_share=1.01, max_overlap_pct=100.0, min_comm_share=0.0)
    assert len(by_overlap) == devices
    # Severity follows impact: below the share threshold only a large share (>= 20%) is more than info.
    assert all(f.severity == ("critical" if f.impact_share >= 0.20 else "info") for f in by_overlap)
    for f in everything:
        assert (f.impact_share >= 0.20) == (f.severity == "critical")


def test_sendrecv_collectives_are_named_from_their_annotation(loaded):
    """Older traces carry no 'Collective name' in any args: the nccl:<op> annotation around the launch names
    the collective (an all-to-all runs as SendRecv kernels)."""
    con = loaded(corpus("hta__trace_diff__control.json.gz"))
    [f] = c001(con)[0]
    annotated = {r[0] for r in con.execute(
        """SELECT p.name FROM launches l JOIN runtime_calls r ON r.event_id = l.runtime_event_id
           JOIN events p ON p.event_id = r.parent_id WHERE p.name LIKE 'nccl:%'""").fetchall()}  # fmt: skip
    assert f.locality["launch"]["annotation"] in annotated
    assert "SendRecv" in f.locality["kernel"] and f.locality["launch"]["collective"] == "all_to_all"
    assert all("nccl:" + g["collective"] in annotated for g in f.extra["top_collectives"])


def test_unaligned_ranks_are_not_matched(loaded):
    """Two sampled ranks whose n-th collectives do not overlap in time: no wait/transfer split is claimed."""
    con = loaded(
        corpus("hta__trace_filter__sampled_rank-0.json.gz"), corpus("hta__trace_filter__sampled_rank-1.json.gz")
    )
    findings, _ = c001(con)
    assert findings
    assert all("cross_rank" not in f.extra for f in findings)


@pytest.mark.parametrize(
    "path",
    [
        lambda: sample("gpu_prefill_decode_eager.json.gz"),
        lambda: sample("cpu_two_threads.json.gz"),
        lambda: corpus("hta__mtia_inference_trace__mtia_inference_rank_0.json.gz"),
        lambda: corpus("hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),
    ],
    ids=["single-gpu", "cpu-only", "mtia", "world-size-1"],
)
def test_quiet_without_communication(loaded, path):
    con = loaded(path())
    findings, notes = c001(con)
    assert findings == []
    assert not con.execute("SELECT EXISTS (SELECT 1 FROM kernels WHERE is_communication)").fetchone()[0]
    has_kernels = con.execute("SELECT EXISTS (SELECT 1 FROM kernels)").fetchone()[0]
    # Without kernels the framework reports the missing input; with kernels and no peers there is nothing to say.
    assert bool(notes) == (not has_kernels)


def test_exposed_comm_on_a_host_bound_gpu_is_held_at_info(loaded):
    # DDP training whose GPU idles ~76% of each step for host reasons: 5-6% exposed all-reduce is not what
    # holds the step back, so it is not a warning (the idle is G001's finding)
    con = loaded(corpus("hta__nccl_parser_config__nccl_data.json.gz"))
    [f] = run_rule(con, "C001")[0]
    assert f.severity == "info" and f.extra["idle_to_exposed"] > 5
    assert any("bound by what keeps the GPU idle" in c for c in f.caveats)
    # where exposed comm is a large part of the busy step, it stays a warning
    [g] = run_rule(loaded(corpus("hta__df_index_resolver.json.gz")), "C001")[0]
    assert g.severity == "warning" and "idle_to_exposed" not in g.extra


def _collective_spans() -> dict:
    """(run, n) -> (start, end) of 40 allreduce kernels on each of 5 ranks (rank = run - 1), with
    rank n % 7 arriving after the others left."""
    import random

    rng = random.Random(7)
    spans = {}
    for run in range(1, 6):
        for n in range(1, 41):
            start = n * 10_000 + rng.randrange(0, 3_000)
            end = n * 10_000 + 4_000 + rng.randrange(0, 3_000)
            if n % 7 == run:  # a rank that arrives after the others left: no overlap
                start, end = n * 10_000 + 8_000, n * 10_000 + 9_000
            spans[run, n] = (start, end)
    return spans


def _add_calls(con, spans: dict, runs) -> None:
    """The runs' calls of `spans` as other ranks' calls (`peer_collectives`)."""
    for (run, n), (start, end) in sorted(spans.items()):
        if run in runs:
            con.execute(
                "INSERT INTO peer_collectives (run_id, rank, world_size, process_group, seq, collective, event_id,"
                " on_device, device, start_ns, end_ns, dur_ns) VALUES (?, ?, 5, '0', ?, 'allreduce', ?, true, 0,"
                " ?, ?, ?)",
                [run, run - 1, n, run * 1000 + n, start, end, end - start],
            )


def test_each_kernel_is_matched_with_its_latest_peer_as_by_pairing_every_rank():
    """CROSS_RANK_SQL reads each collective's two latest starts and two earliest ends
    (`collective_extremes`) instead of pairing every rank with every other: per kernel, the latest
    peer start, that peer's rank and whether the kernel overlaps its peers are those of the pairwise
    definition, including where the kernel itself is the latest to start or the earliest to end."""
    from tracekit.rules import _collectives

    spans = _collective_spans()
    with tracekit.open() as trace:
        con = trace.connection
        _add_calls(con, spans, range(1, 6))
        runs = list(range(1, 6))
        got = {
            (r.run_id, r.event_id): (r.latest_peer_start_skew_ns, r.latest_peer_rank, r.overlaps_peers)
            for r in rows(con, _collectives.CROSS_RANK_SQL, {"run_ids": runs, "own_run_ids": [2, 4]})
        }
    expected = {}
    for run in (2, 4):
        for n in range(1, 41):
            start, end = spans[run, n]
            peers = [(spans[p, n], p) for p in runs if p != run]
            # ties: the higher run, which is the higher rank
            latest_start, latest_run = max((s, p) for (s, _), p in peers)
            first_end = min(e for (_, e), _ in peers)
            expected[run, run * 1000 + n] = (
                latest_start - start,
                latest_run - 1,
                max(latest_start, start) <= min(first_end, end),
            )
    assert got == expected
    # the cases the two-deep lists are for occur: a kernel that starts last, one that ends first
    assert any(skew < 0 for skew, _, _ in got.values())
    assert any(not overlaps for _, _, overlaps in got.values())


def test_a_worker_combines_the_chunks_extremes_into_the_jobs():
    """A cluster worker is sent each chunk's `collective_extremes` rows over its own ranks
    (`peer_collective_extremes`: chunks x collectives rows, not ranks x collectives) and every run's
    `collective_counts`; the views then give what one database of every rank gives, and a rank given
    twice (a copy in a later chunk, which the cluster run drops) is one entry in the lists."""
    spans = _collective_spans()

    def views(con):
        return (con.execute("SELECT * FROM collective_extremes ORDER BY ALL").fetchall(),
                con.execute("SELECT * FROM collective_counts ORDER BY ALL").fetchall())  # fmt: skip

    with tracekit.open() as whole:
        extremes, counts = views(whole.connection)
        assert extremes == [] and counts == []
        _add_calls(whole.connection, spans, range(1, 6))
        extremes, counts = views(whole.connection)
    assert len(extremes) == 40 and {e[3] for e in extremes} == {5} and len(counts) == 5

    def sent(chunks):
        parts, all_counts = [], []
        for runs in chunks:
            with tracekit.open() as chunk:
                _add_calls(chunk.connection, spans, runs)
                part, part_counts = views(chunk.connection)
                assert len(part) == 40 and {e[3] for e in part} == {len(runs)}
                parts += part
                all_counts += part_counts
        return parts, all_counts

    for chunks in (((1, 2), (3, 4, 5)), ((1,), (2,), (3,), (4,), (5,)), ((1, 2), (3, 4, 5), (2,))):
        parts, part_counts = sent(chunks)
        with tracekit.open() as worker:
            con = worker.connection
            _add_calls(con, spans, chunks[0])  # the worker's own ranks: the views read what it was sent instead
            con.executemany("INSERT INTO peer_collective_extremes VALUES (?, ?, ?, ?, ?, ?)", parts)
            con.executemany("INSERT INTO peer_collective_counts VALUES (?, ?, ?, ?, ?, ?)",
                            list(dict.fromkeys(part_counts)))  # the dropped copy's counts are not sent  # fmt: skip
            got, got_counts = views(con)
        copies = sum(len(c) for c in chunks) - 5
        assert [e[:3] + e[4:] for e in got] == [e[:3] + e[4:] for e in extremes]
        assert {e[3] for e in got} == {5 + copies}  # `ranks` counts the copy: its doc says so
        assert got_counts == counts
