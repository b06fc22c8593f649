"""The stdlib views on small hand-made runs (each drawn as a timeline, as Perfetto's diff tests do) and
their invariants on real traces: steps tile their run, breakdowns add up, gaps are charged once."""

from __future__ import annotations

import json

import pytest

from tests.conftest import corpus, run_rule, sample, union_within
from tracekit import db

EAGER = sample("gpu_prefill_decode_eager.json.gz")
TP2 = (sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz"))
RESNET = "kineto__resnet50_num_workers_0__worker0.pt.trace.json.gz"
NSYS = "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
NCCL = "hta__nccl_parser_config__nccl_data.json.gz"
SAMPLED = "hta__trace_filter__sampled_rank-1.json.gz"

HOST, GPU = (1, 1), (0, 7)  # (pid, tid) of the main thread; (device, stream)


def make_run(events: list[dict], start: int = 0, end: int | None = None):
    """A database holding one run of the given events (dicts of event_rows columns; defaults: a complete
    event on the main thread). GPU kinds go on device 0 stream 7 unless told otherwise."""
    con = db.connect(None)
    end = end if end is not None else max(e["ts"] + e.get("dur", 0) for e in events)
    con.execute("INSERT INTO runs (run_id, source, format, label, start_ns, end_ns) VALUES (1, 'hand', 'kineto', 'hand', ?, ?)",
                [start, end])  # fmt: skip
    rows = []
    for e in events:
        gpu = e.get("kind") in ("kernel", "gpu_memcpy", "gpu_memset")
        device, stream = (e.get("device", GPU[0]), e.get("stream", GPU[1])) if gpu else (None, None)
        pid, tid = (device, stream) if gpu else (e.get("pid", HOST[0]), e.get("tid", HOST[1]))
        rows.append([1, e.get("kind", "cpu_op"), e.get("ph", "X"), e.get("kind", "cpu_op"), e["name"], e["ts"],
                     e.get("dur"), pid, tid, device, stream, e.get("corr"), e.get("ext"),
                     json.dumps(e["args"]) if "args" in e else None, e.get("depth", 0)])  # fmt: skip
    con.executemany(
        "INSERT INTO event_rows (run_id, kind, ph, cat, name, ts_ns, dur_ns, pid, tid, device, stream, correlation, "
        "external_id, args, depth) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    return con


def rows(con, sql: str, params=None) -> list[dict]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def step(name, ts, dur, kind="user_annotation", **kw):
    return {"kind": kind, "name": name, "ts": ts, "dur": dur, **kw}


def kernel(name, ts, dur, **kw):
    return {"kind": "kernel", "name": name, "ts": ts, "dur": dur, **kw}


# ---------------------------------------------------------------------------------- busy time, unions


def test_gpu_busy_between_clips_merged_blocks_to_windows():
    #        0    5    10   15   20   25
    # k1     [---------)                   stream 7
    # k2          [-------)                stream 8: merges with k1 into [0, 12)
    # k3                     [----)        [15, 20)
    # w                [-------------)     [8, 22): busy 4 + 5 = 9
    con = make_run([kernel("k1", 0, 10), kernel("k2", 5, 7, stream=8), kernel("k3", 15, 5)])
    assert rows(con, "SELECT start_ns, end_ns, activities FROM gpu_busy ORDER BY 1") == [
        {"start_ns": 0, "end_ns": 12, "activities": 2}, {"start_ns": 15, "end_ns": 20, "activities": 1}]  # fmt: skip
    con.execute("CREATE TEMP TABLE w AS SELECT * FROM (VALUES (1, 0, 8, 22, 'a'), (1, 0, 0, 100, 'b'), "
                "(1, 0, 12, 15, 'c'), (1, 3, 0, 100, 'd')) t(run_id, device, start_ns, end_ns, label)")  # fmt: skip
    got = {r["label"]: r["busy_ns"] for r in rows(con, "SELECT * FROM gpu_busy_between('w', 'all')")}
    assert got == {"a": 9, "b": 17, "c": 0, "d": 0}
    # in_run keeps the blocks of one run: windows of that run read the same, another run's read nothing
    one_run = {r["label"]: r["busy_ns"] for r in rows(con, "SELECT * FROM gpu_busy_between('w', 'all', in_run := 1)")}
    assert one_run == got
    assert {r["busy_ns"] for r in rows(con, "SELECT * FROM gpu_busy_between('w', 'all', in_run := 2)")} == {0}


def test_busy_layers_split_compute_communication_and_copies():
    con = make_run([kernel("gemm", 0, 10), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 5, 10, stream=8),
                    {"kind": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 12, "dur": 10, "stream": 9}])  # fmt: skip
    got = {r["layer"]: (r["start_ns"], r["end_ns"]) for r in rows(con, "SELECT * FROM gpu_busy_layers")}
    assert got == {"all": (0, 22), "kernel": (0, 15), "compute": (0, 10), "communication": (5, 15)}


def test_main_device_is_the_busiest_then_the_lowest():
    con = make_run([kernel("a", 0, 10, device=0), kernel("b", 0, 30, device=1), kernel("c", 40, 5, device=2)])
    assert rows(con, "SELECT device, busy_ns, devices FROM main_device") == [{"device": 1, "busy_ns": 30, "devices": 3}]
    tie = make_run([kernel("a", 0, 10, device=3), kernel("b", 0, 10, device=2)])
    assert tie.execute("SELECT device FROM main_device").fetchone()[0] == 2
    host_only = make_run([step("x", 0, 10)])
    assert host_only.execute("SELECT device, busy_ns FROM main_device").fetchone() == (None, 0)


# -------------------------------------------------------------------------------------------- steps


def test_step_breakdown_adds_up_on_a_hand_made_step():
    #          0    10   20   30   40   50   60   70        100       200
    # step     [ProfilerStep#1 ......................)[ProfilerStep#2 .....)
    # host      [aten::mm--)            [op)                                  depth 1 (launch at 8, depth 2)
    # compute        [gemm----------)                                         [10, 40)
    # comm                      [nccl---------)                               [30, 60): 10 under compute
    # copy                                 [memcpy--)                         [55, 70): 5 under comm
    con = make_run([
        step("ProfilerStep#1", 0, 100), step("ProfilerStep#2", 100, 100),
        {"name": "aten::mm", "ts": 5, "dur": 15, "depth": 1},
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 8, "dur": 1, "depth": 2},
        {"name": "aten::add", "ts": 50, "dur": 5, "depth": 1},
        kernel("gemm", 10, 30), kernel("ncclDevKernel_AllReduce", 30, 30, stream=8),
        {"kind": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 55, "dur": 15, "stream": 9},
    ], end=200)  # fmt: skip
    first, second = rows(con, "SELECT * FROM steps ORDER BY step_index")
    assert (first["name"], first["annotation"], first["source"]) == ("ProfilerStep", "ProfilerStep#1", "ProfilerStep#N")
    assert {k: first[k] for k in ("busy_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "memcpy_ns", "idle_ns",
                                  "host_ns")} == {"busy_ns": 60, "compute_ns": 30, "comm_ns": 30,
                                                  "comm_exposed_ns": 20, "memcpy_ns": 10, "idle_ns": 40,
                                                  "host_ns": 20}  # fmt: skip
    assert (second["busy_ns"], second["idle_ns"], second["host_ns"]) == (0, 100, 0)
    assert first["device"] == 0 and (first["pid"], first["tid"]) == HOST


def test_step_rule_falls_back_to_the_most_frequent_top_level_annotation_then_the_run():
    # thread 1: decode x3 (one nested decode inside the second), prefill x1; thread 2: decode x2, overlapping
    con = make_run([
        step("prefill", 0, 10), step("decode", 10, 10), step("decode", 20, 10), step("decode", 22, 3, depth=1),
        step("decode", 30, 10), step("decode", 12, 10, tid=2), step("decode", 25, 10, tid=2),
    ], end=50)  # fmt: skip
    got = rows(con, "SELECT step_index, name, start_ns, end_ns, tid, source FROM steps ORDER BY step_index")
    assert [(s["start_ns"], s["end_ns"]) for s in got] == [(10, 20), (20, 30), (30, 40)]
    assert {(s["name"], s["tid"], s["source"]) for s in got} == {
        ("decode", 1, "most frequent top-level user annotation")
    }
    cands = {r["name"]: r for r in rows(con, "SELECT * FROM step_candidates")}
    assert cands["decode"]["choice"] == 1 and cands["decode"]["occurrences"] == 5 and cands["prefill"]["choice"] is None
    named = rows(con, "SELECT name, start_ns, end_ns, source FROM steps_named('prefill')")
    assert named == [{"name": "prefill", "start_ns": 0, "end_ns": 10, "source": "named"}]
    assert rows(con, "SELECT * FROM steps_named('nope')") == []
    whole = make_run([step("once", 5, 10), {"name": "aten::mm", "ts": 20, "dur": 30}], start=0, end=60)
    assert rows(whole, "SELECT step_index, name, source, start_ns, end_ns, host_ns FROM steps") == [
        {"step_index": 0, "name": None, "source": "whole run", "start_ns": 0, "end_ns": 60, "host_ns": 40}]  # fmt: skip


def test_step_phases_and_their_reasons():
    #  steps:   [s0 500------------------)[s1 100)[s2 100)[s3 100)[s4 100)
    #  s0: long first step (5x the median); s2 holds a capture; s3 is mostly profiler overhead
    con = make_run([
        step("step", 0, 500), step("step", 500, 100), step("step", 600, 100), step("step", 700, 100),
        step("step", 800, 100),
        {"kind": "cuda_runtime", "name": "cudaStreamBeginCapture", "ts": 610, "dur": 1, "depth": 1},
        {"kind": "overhead", "name": "Activity Buffer Request", "ts": 710, "dur": 30, "tid": 9},
    ])  # fmt: skip
    got = rows(con, "SELECT step_index, phase, phase_reason FROM steps ORDER BY step_index")
    assert [s["phase"] for s in got] == ["warm-up", "steady", "capture", "profiler", "steady"]
    assert "5.00x the median of the later steps" in got[0]["phase_reason"]
    assert "cudaStreamBeginCapture" in got[2]["phase_reason"] and "30%" in got[3]["phase_reason"]
    # lazy initialisation only in the first step marks it, although it is not long
    lazy = make_run([step("step", 0, 100), step("step", 100, 100), step("step", 200, 100),
                     {"kind": "cuda_runtime", "name": "cudaStreamCreateWithPriority", "ts": 5, "dur": 2, "depth": 1},
                     {"kind": "cuda_runtime", "name": "cudaEventCreateWithFlags", "ts": 205, "dur": 2, "depth": 1}])  # fmt: skip
    first = rows(lazy, "SELECT phase, phase_reason FROM steps WHERE step_index = 0")[0]
    assert first["phase"] == "steady"  # the later step creates as many: nothing cold about the first
    lazy.execute("DELETE FROM event_rows WHERE name = 'cudaEventCreateWithFlags'")
    first = rows(lazy, "SELECT phase, phase_reason FROM steps WHERE step_index = 0")[0]
    assert first["phase"] == "warm-up" and "cudaStreamCreateWithPriority (1 calls" in first["phase_reason"]
    # a single step is never warm-up: there is nothing steady to compare with
    assert make_run([step("step", 0, 100), step("other", 200, 5), step("other", 300, 5)]).execute(
        "SELECT DISTINCT phase FROM steps"
    ).fetchall() == [("steady",)]


# ---------------------------------------------------------------------------------------- idle gaps


def test_idle_gaps_and_their_causes():
    #  0    10   15 18 20   30 32   40            10000
    #  [k1--)     [k2-----)  [k3--)                [k4)       GPU
    #     launch k2 [15, 18): returns after the gap began at 10 -> host
    #  launch k3 [1, 2), k4 [3, 4): queued long before; 2 ns gap -> kernel_wait, 9960 ns -> other
    con = make_run([
        step("step", 0, 20000),
        kernel("k1", 0, 10, corr=1), kernel("k2", 20, 10, corr=2), kernel("k3", 32, 8, corr=3),
        kernel("k4", 10000, 10, corr=4),
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 1, "corr": 1, "depth": 1},
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 15, "dur": 3, "corr": 2, "depth": 1},
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 1, "corr": 3, "depth": 1},
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3, "dur": 1, "corr": 4, "depth": 1},
    ])  # fmt: skip
    got = rows(con, "SELECT start_ns, end_ns, cause, next_name, launch_end_ns, launch_tid, step_index FROM idle_gaps "
                    "ORDER BY start_ns")  # fmt: skip
    assert [(g["start_ns"], g["end_ns"], g["cause"], g["next_name"], g["launch_end_ns"]) for g in got] == [
        (10, 20, "host", "k2", 18), (30, 32, "kernel_wait", "k3", 2), (40, 10000, "other", "k4", 4)]  # fmt: skip
    assert {(g["launch_tid"], g["step_index"]) for g in got} == {(HOST[1], 0)}


def test_host_blocking_charges_each_gap_once():
    #  0         100                   300      400       420 430     500      600
    #  [GPU busy--)                     [busy----)                     [busy----)
    #       A [50 ---- 110)   waited at the drain, returns second       -> 0
    #        B [60 -- 105)    waited at the drain, returns first        -> 300 - 105 = 195
    #                 C [150-160)       did not wait: the gap is B's   -> 0
    #                                    E [310-320) returns while busy -> 0, no gap
    #                                          G [380 ---- 410)  waited at the drain -> 500 - 410 = 90
    #                                               D [420-430)  started with the GPU idle: blocked nothing -> 0
    def sync(name, ts, dur, tid):
        return {"kind": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "tid": tid, "depth": 0}

    con = make_run([
        kernel("k", 0, 100), kernel("k", 300, 100, corr=1), kernel("k", 500, 100, corr=2),
        sync("cudaStreamSynchronize", 50, 60, 1), sync("cudaDeviceSynchronize", 60, 45, 2),
        sync("cudaEventSynchronize", 150, 10, 1), {**sync("cudaLaunchKernel", 250, 1, 1), "corr": 1},
        sync("cudaStreamSynchronize", 310, 10, 1),
        sync("cudaStreamSynchronize", 380, 30, 2), sync("cudaStreamSynchronize", 420, 10, 1),
        {**sync("cudaLaunchKernel", 430, 1, 1), "corr": 2},
    ])  # fmt: skip
    got = {r["ts_ns"]: r for r in rows(con, "SELECT * FROM host_blocking")}
    assert sorted(got) == [50, 60, 150, 310, 380, 420]  # the launch is not a blocking call
    assert {ts: r["charged_idle_ns"] for ts, r in got.items()} == {50: 0, 60: 195, 150: 0, 310: 0, 380: 90, 420: 0}
    assert (got[310]["gap_start_ns"], got[420]["gap_start_ns"], got[420]["gap_end_ns"]) == (None, 400, 500)
    assert {r["blocking"] for r in got.values()} == {"sync"} and got[60]["site"] == "(top level)"
    idle = con.execute("SELECT sum(dur_ns) FROM idle_gaps").fetchone()[0]
    assert sum(r["charged_idle_ns"] for r in got.values()) <= idle == 300


def test_host_blocking_charges_an_op_once_and_not_for_reading_data():
    #  GPU: k1 [0-50)   HtoD pageable [150 ------ 342)   k2 [430-480)   DtoH 1 MiB [480 --- 590)   k3 [660-700)
    #       4-byte DtoH [720-722)  k4 [790-800)
    #  host, all inside "## region ##" [90-800):
    #    aten::copy_ [100-400): cudaMemcpyAsync [110-340) (pageable HtoD), then cudaStreamSynchronize [340-345),
    #      which waits for the copy's tail: the gap [342-430) goes to the copy, 430 - 345 = 85; the copy stalls
    #      40 (device idle 110-150), the sync 3 (342-345)
    #    aten::copy_ [460-610): cudaMemcpyAsync [470-600) (1 MiB DtoH): waited for [590-660) but read data: 0;
    #      stalls 10 (590-600)
    #    aten::_local_scalar_dense [700-760): cudaMemcpyAsync [705-750) (4 bytes DtoH): a check, 790 - 750 = 40;
    #      stalls 43 (all but the copy's 2)
    def call(name, ts, dur, corr=None, depth=2):
        return {"kind": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "corr": corr, "depth": depth}

    def copy(name, ts, dur, corr, nbytes):
        return {"kind": "gpu_memcpy", "name": name, "ts": ts, "dur": dur, "corr": corr, "args": {"bytes": nbytes}}

    con = make_run([
        step("## region ##", 90, 710, depth=0),
        step("aten::copy_", 100, 300, kind="cpu_op", depth=1),
        call("cudaMemcpyAsync", 110, 230, corr=1), copy("Memcpy HtoD (Pageable -> Device)", 150, 192, 1, 1 << 20),
        call("cudaStreamSynchronize", 340, 5),
        kernel("k1", 0, 50), kernel("k2", 430, 50, corr=2), call("cudaLaunchKernel", 420, 5, corr=2, depth=1),
        step("aten::copy_", 460, 150, kind="cpu_op", depth=1),
        call("cudaMemcpyAsync", 470, 130, corr=3), copy("Memcpy DtoH (Device -> Pageable)", 480, 110, 3, 1 << 20),
        kernel("k3", 660, 40, corr=4), call("cudaLaunchKernel", 650, 5, corr=4, depth=1),
        step("aten::_local_scalar_dense", 700, 60, kind="cpu_op", depth=1),
        call("cudaMemcpyAsync", 705, 45, corr=5), copy("Memcpy DtoH (Device -> Pageable)", 720, 2, 5, 4),
        kernel("k4", 790, 10, corr=6), call("cudaLaunchKernel", 780, 5, corr=6, depth=1),
    ], end=800)  # fmt: skip
    # the call tree is built at ingest: nest each runtime call under the op around it, as ingest would
    con.execute(
        "UPDATE event_rows r SET parent_id = (SELECT o.rowid FROM event_rows o WHERE o.kind = 'cpu_op' "
        "AND o.ts_ns <= r.ts_ns AND o.ts_ns + o.dur_ns >= r.ts_ns + r.dur_ns) WHERE r.kind = 'cuda_runtime'"
    )
    got = {r["ts_ns"]: r for r in rows(con, "SELECT * FROM host_blocking ORDER BY ts_ns")}
    assert sorted(got) == [110, 340, 470, 705]
    assert {ts: r["charged_idle_ns"] for ts, r in got.items()} == {110: 85, 340: 0, 470: 0, 705: 40}
    assert {ts: r["stalled_ns"] for ts, r in got.items()} == {110: 40, 340: 3, 470: 10, 705: 43}
    assert {r["region"] for r in got.values()} == {"## region ##"} and all(r["critical_thread"] for r in got.values())


def test_host_blocking_classifies_copies():
    con = make_run([
        {"kind": "cuda_runtime", "name": "cudaMemcpy", "ts": 0, "dur": 5, "corr": 1},
        {"kind": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 1, "dur": 2, "corr": 1, "args": {"bytes": 64}},
        {"kind": "cuda_runtime", "name": "cudaMemcpy", "ts": 10, "dur": 5, "corr": 2},
        {"kind": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "ts": 11, "dur": 2, "corr": 2, "args": {"bytes": 64}},
        {"kind": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 20, "dur": 5, "corr": 3},
        {"kind": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "ts": 21, "dur": 2, "corr": 3, "args": {"bytes": 8}},
        {"kind": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 30, "dur": 5, "corr": 4},
        {"kind": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 31, "dur": 2, "corr": 4, "args": {"bytes": 8}},
    ])  # fmt: skip
    got = rows(con, "SELECT ts_ns, blocking, copy_name, bytes FROM host_blocking ORDER BY ts_ns")
    assert [(r["ts_ns"], r["blocking"], r["bytes"]) for r in got] == [
        (10, "sync memcpy", 64),
        (20, "pageable async memcpy", 8),
    ]


# -------------------------------------------------------------------------------------- collectives


def test_collectives_pair_kernels_with_their_ops():
    args = {"Collective name": "allreduce", "Process Group Name": "0", "dtype": "BFloat16", "In msg nelems": 1024,
            "Out msg nelems": 1024, "Group size": 2, "Process Group Ranks": "[0, 1]"}  # fmt: skip
    con = make_run([
        {"name": "record_param_comms", "ts": 0, "dur": 10, "ext": 5, "args": args},
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 30, ext=5, stream=8),
        {"name": "record_param_comms", "ts": 60, "dur": 1, "ext": 9, "args": {"Collective name": "wait"}},
        kernel("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 70, 5, stream=8),
        kernel("gemm", 0, 5),
    ])  # fmt: skip
    con.execute("UPDATE runs SET rank = 0, world_size = 2")
    got = rows(con, "SELECT * FROM collectives ORDER BY coalesce(gpu_ts_ns, op_ts_ns)")
    assert [(c["collective"], c["process_group"], c["seq"]) for c in got] == [
        ("allreduce", "0", 1),
        ("wait", "", 1),
        ("broadcast", "", 2),
    ]
    ar = got[0]
    assert (ar["bytes"], ar["group_size"], ar["rank"], ar["gpu_dur_ns"], ar["op_ts_ns"]) == (2048, 2, 0, 30, 0)
    assert got[1]["kernel_event_id"] is None and got[2]["op_event_id"] is None


def test_collectives_pair_old_kernels_through_the_launch_call():
    # older Kineto: the kernel's External id is its correlation id, the op carries no args; the op is the
    # record_param_comms around the launch call, the collective the nccl: annotation around it
    #  0  [record_param_comms (a barrier, no kernel)-)
    #  20       [record_param_comms ----------------------------)
    #  25          [nccl:all_to_all ---------------------)
    #  30             [cudaLaunchKernel -)   kernel SendRecv at 50
    con = make_run([
        {"name": "record_param_comms", "ts": 0, "dur": 10, "ext": 4},
        {"name": "record_param_comms", "ts": 20, "dur": 40, "ext": 5, "depth": 0},
        {"kind": "user_annotation", "name": "nccl:all_to_all", "ts": 25, "dur": 30, "ext": 6, "depth": 1},
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 30, "dur": 5, "corr": 77, "ext": 77, "depth": 2},
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 50, 20, corr=77, ext=77, stream=21),
    ])  # fmt: skip
    ids = dict(con.execute("SELECT ts_ns, rowid FROM event_rows").fetchall())
    con.execute("UPDATE event_rows SET parent_id = ? WHERE ts_ns = 25", [ids[20]])
    con.execute("UPDATE event_rows SET parent_id = ? WHERE ts_ns = 30", [ids[25]])
    got = rows(con, "SELECT * FROM collectives ORDER BY seq")
    assert [(c["kernel_event_id"], c["op_event_id"], c["collective"]) for c in got] == [
        (None, ids[0], None), (ids[50], ids[20], "all_to_all")]  # fmt: skip
    assert (got[1]["annotation"], got[1]["launch_event_id"], got[1]["op_ts_ns"]) == ("nccl:all_to_all", ids[30], 20)


def test_dtype_bytes():
    got = (
        db.connect(None)
        .execute(
            "SELECT dtype_bytes('BFloat16'), dtype_bytes('c10::Half'), dtype_bytes('Float'), dtype_bytes('float8_e4m3fn'), "
            "dtype_bytes('Long'), dtype_bytes('no such type')"
        )
        .fetchone()
    )
    assert got == (2, 2, 4, 1, 8, None)


@pytest.mark.parametrize(
    "name, comm",
    [
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(...)", True),
        ("void c10d::symmetric_memory::(anonymous namespace)::multimem_all_reduce_kernel<...>", True),
        ("void (anonymous namespace)::two_shot_all_reduce_kernel<float, 8>(...)", True),
        ("void tensorrt_llm::kernels::oneShotAllReduceKernel<...>(...)", True),
        ("void deep_ep::intranode::dispatch<8, 768, 8192>(...)", True),
        ("void deep_ep::internode_ll::combine<...>(...)", True),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_32x6_tn", False),
        ("void at::native::reduce_kernel<512, 1, ...>", False),
        ("dispatch_kernel", False),
    ],
)
def test_is_communication(name, comm):
    con = make_run([kernel(name, 0, 5)])
    assert con.execute("SELECT is_communication FROM kernels").fetchone()[0] is comm


# ------------------------------------------------------------------------------------------ real traces


def _check_steps_tile(con):
    by_run: dict[int, list] = {}
    for s in rows(con, "SELECT * FROM steps ORDER BY run_id, step_index"):
        by_run.setdefault(s["run_id"], []).append(s)
    windows = dict((r, (a, b)) for r, a, b in con.execute("SELECT run_id, start_ns, end_ns FROM runs").fetchall())
    assert by_run
    for run_id, steps in by_run.items():
        lo, hi = windows[run_id]
        assert [s["step_index"] for s in steps] == list(range(len(steps)))
        assert all(lo <= s["start_ns"] < s["end_ns"] <= hi for s in steps)
        assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(steps, steps[1:]))
        for s in steps:
            assert s["dur_ns"] == s["end_ns"] - s["start_ns"] and 0 <= s["host_ns"] <= s["dur_ns"]
            assert s["phase"] in ("steady", "warm-up", "capture", "profiler") and s["phase_reason"]
            if s["device"] is not None:
                assert s["compute_ns"] + s["comm_exposed_ns"] + s["memcpy_ns"] == s["busy_ns"]
                assert s["busy_ns"] + s["idle_ns"] == s["dur_ns"] and s["idle_ns"] >= 0
                assert 0 <= s["comm_exposed_ns"] <= s["comm_ns"]
    return by_run


def test_steps_on_the_eager_sample_match_an_independent_union(loaded):
    con = loaded(EAGER)
    steps = _check_steps_tile(con)[1]
    device = con.execute("SELECT device FROM main_device").fetchone()[0]
    acts = con.execute("SELECT ts_ns, end_ns, kind FROM gpu_activities WHERE device = ?", [device]).fetchall()
    kernels = [(a, b) for a, b, k in acts if k == "kernel"]
    for s in steps[::7]:
        lo, hi = s["start_ns"], s["end_ns"]
        assert s["busy_ns"] == union_within([(a, b) for a, b, _ in acts], lo, hi)
        assert s["compute_ns"] == union_within(kernels, lo, hi)  # no communication in this run
    assert {s["name"] for s in steps} == {"decode_step"} and len(steps) == 32


def test_profiler_steps_of_a_corpus_trace(loaded):
    con = loaded(corpus(RESNET))
    steps = _check_steps_tile(con)[1]
    annotations = [r[0] for r in con.execute(
        "SELECT DISTINCT name FROM events WHERE name LIKE 'ProfilerStep#%' ORDER BY min(ts_ns) OVER (PARTITION BY name)"
    ).fetchall()]  # fmt: skip
    assert len(steps) == len(annotations) > 1
    assert sorted(s["annotation"] for s in steps) == sorted(annotations)
    assert all(s["busy_ns"] > 0 for s in steps)


def test_nsys_export_steps_and_gaps(loaded):
    con = loaded(corpus(NSYS))
    _check_steps_tile(con)
    # per device: busy blocks and the gaps between them cover first start to last end exactly
    for run_id, device, span, busy, gaps in con.execute(
        "SELECT b.run_id, b.device, max(b.end_ns) - min(b.start_ns), sum(b.dur_ns), "
        "(SELECT sum(dur_ns) FROM idle_gaps g WHERE g.run_id = b.run_id AND g.device = b.device) "
        "FROM gpu_busy b GROUP BY ALL"
    ).fetchall():
        assert busy + (gaps or 0) == span, (run_id, device)


def test_idle_gaps_agree_with_gpu_idle_on_a_one_stream_device(loaded):
    con = loaded(EAGER)
    assert con.execute("SELECT count(DISTINCT stream) FROM gpu_activities").fetchone()[0] == 1
    (finding,), _ = run_rule(con, "G001")
    got = dict(con.execute("SELECT cause, sum(dur_ns) FROM idle_gaps GROUP BY 1").fetchall())
    assert {c: got.get(c, 0) for c in ("host", "kernel_wait", "other")} == {
        c: finding.extra["idle_by_cause_ns"][c] for c in ("host", "kernel_wait", "other")}  # fmt: skip
    assert con.execute("SELECT count(*) FROM idle_gaps").fetchone()[0] == finding.extra["gaps"]


@pytest.mark.parametrize("name", [EAGER, corpus(SAMPLED)], ids=["eager", "sampled"])
def test_host_blocking_never_charges_a_gap_twice(loaded, name):
    con = loaded(name)
    charged, calls, gaps = con.execute(
        "SELECT sum(charged_idle_ns), count(*) FILTER (WHERE charged_idle_ns > 0), "
        "count(DISTINCT gap_start_ns) FILTER (WHERE charged_idle_ns > 0) FROM host_blocking"
    ).fetchone()
    idle = con.execute(
        "SELECT sum(g.dur_ns) FROM idle_gaps g JOIN main_device m ON m.run_id = g.run_id AND m.device = g.device"
    ).fetchone()[0]
    assert 0 < charged <= idle and calls <= gaps
    # a charge goes to the longest blocking call of its op invocation, never to a shorter one beside it
    shorter = con.execute(
        "SELECT count(*) FROM host_blocking h WHERE h.charged_idle_ns > 0 AND EXISTS (SELECT 1 FROM host_blocking o "
        "WHERE o.parent_id = h.parent_id AND o.event_id <> h.event_id AND o.dur_ns > h.dur_ns)"
    ).fetchone()[0]
    assert shorter == 0


def test_host_blocking_charges_nothing_to_syncs_that_did_not_wait(loaded):
    # DDP's forward: 24 cudaEventSynchronize of a few us each, all started with the device already idle; 16
    # return inside 2 gaps: charging each from its return would count those gaps 8 times over
    con = loaded(corpus(NCCL))
    charged, naive, waited = con.execute(
        "SELECT sum(charged_idle_ns), sum(gap_end_ns - end_ns) FILTER (WHERE gap_start_ns IS NOT NULL), "
        "count(*) FILTER (WHERE ts_ns <= gap_start_ns) FROM host_blocking WHERE call = 'cudaEventSynchronize'"
    ).fetchone()
    assert charged == waited == 0 < naive


def test_host_blocking_matches_host_sync_where_each_gap_has_one_call(loaded):
    con = loaded(EAGER)
    findings, _ = run_rule(con, "H001")
    item = next(f for f in findings if f.locality.get("op") == "aten::_local_scalar_dense")
    got = con.execute(
        "SELECT sum(charged_idle_ns) FROM host_blocking WHERE call = 'cudaStreamSynchronize' AND site = 'aten::_local_scalar_dense'"
    ).fetchone()[0]
    assert got == item.impact_ns


def test_collectives_of_two_ranks_line_up(loaded):
    con = loaded(*TP2)
    per_rank = rows(con, "SELECT rank, collective, count(*) AS n, max(seq) AS last, count(op_event_id) AS with_op "
                         "FROM collectives GROUP BY ALL ORDER BY rank")  # fmt: skip
    assert [r["rank"] for r in per_rank] == [0, 1]
    a, b = per_rank
    assert a["collective"] == b["collective"] == "allreduce" and a["n"] == b["n"] == a["last"] == a["with_op"]
    kernels = con.execute("SELECT count(*) FROM kernels WHERE is_communication AND run_id = 1").fetchone()[0]
    assert a["n"] == kernels
    # the n-th collective of the group moves the same bf16 message on both ranks
    pairs = con.execute(
        "SELECT a.bytes, b.bytes, a.in_nelems, a.dtype FROM collectives a JOIN collectives b "
        "ON a.process_group = b.process_group AND a.seq = b.seq AND a.rank = 0 AND b.rank = 1"
    ).fetchall()
    assert len(pairs) == a["n"] and all(x == y == 2 * n and d == "BFloat16" for x, y, n, d in pairs)
