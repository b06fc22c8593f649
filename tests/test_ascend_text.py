"""The Ascend text export (torch_npu trace_view.json, kernel_details.csv, ASCEND_PROFILER_OUTPUT folders)
read on the corpus files in place: every item read is ingested or skipped with a reason, the mapping
matches counts computed here from the JSON/CSV, launches pair, times keep their ns, ranks and world
size come from the files that state them.

Step cross-check: no corpus sample holds both a device timeline and step_trace_time.csv. The gpt3
rank folders have step_trace_time.csv, but their kernel_details.csv is a truncated excerpt whose
start times were rounded to 1.69512E+15 us (a spreadsheet re-save), so they have no timeline at all;
the lone trace_view.json has no step_trace_time.csv. The cross-check code (`step_cross_check`) is
therefore tested on what exists: the trace's own `Overlap Analysis` bands (the computing / free time
the profiler derives, from which it writes step_trace_time.csv) summed per step against the `steps`
view, and on the gpt3 ranks, where it must find nothing to compare rather than compare a non-timeline.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import tracekit
from tests.conftest import corpus
from tracekit import db, parsers
from tracekit.errors import InputError
from tracekit.ingest import inputs
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import ascend_text

TRACE = "ascend/msanalyze__timeline_advice__trace_view.json"
KD_OLD = "ascend/msanalyze__advisor_backend_compute_advice__kernel_details.csv"
KD_NEW = "ascend/msanalyze__compute_advice_data__kernel_details.csv"
GPT3 = "ascend/msinsight__server_test_data_gpt3"
METADATA = "ascend/msinsight__metadata__profiler_metadata.json"
TRACEKIT = str(Path(sys.executable).with_name("tracekit"))


def _events(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def _processes(events: list[dict]) -> dict:
    return {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}


def _ns(text: str) -> int:
    whole, _, frac = text.strip().partition(".")
    return int(whole) * 1000 + int((frac + "000")[:3])


def _csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]


def _ingested(*paths):
    con = db.connect(None)
    return con, ingest(con, list(paths))


@pytest.fixture(scope="module")
def trace():
    path = corpus(TRACE)
    con, [result] = _ingested(path)
    return con, result, _events(path)


def test_trace_view_reconciles_and_skips_only_the_overlap_bands(trace):
    con, result, events = trace
    names = _processes(events)
    bands = sum(names.get(e.get("pid")) == "Overlap Analysis" for e in events)
    assert result.format == "ascend_text"
    assert result.events_read == len(events) == result.events_ingested + result.events_skipped
    assert result.skipped_reasons == {f"trace_view.json: {ascend_text.OVERLAP_REASON}": bands}
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] == result.events_ingested


def test_trace_view_mapping_counts(trace):
    con, _, events = trace
    names = _processes(events)
    complete = [e for e in events if e.get("ph") == "X"]
    by_process = Counter(names.get(e["pid"]) for e in complete)
    python = [e for e in complete if names.get(e["pid"]) == "Python"]
    steps = sum(e["name"].startswith("ProfilerStep#") for e in python)
    ops = sum(e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#") for e in python)
    count = lambda sql: con.execute(sql).fetchone()[0]  # noqa: E731
    assert count("SELECT count(*) FROM kernels") == by_process["Ascend Hardware"] == 276
    assert count("SELECT count(*) FROM runtime_calls") == by_process["CANN"]
    assert count("SELECT count(*) FROM cpu_ops") == ops
    assert count("SELECT count(*) FROM events WHERE kind = 'user_annotation' AND name LIKE 'ProfilerStep#%'") == steps
    assert count("SELECT count(*) FROM kernels WHERE is_communication") == by_process["HCCL"] == 0
    assert count("SELECT count(*) FROM events WHERE kind = 'flow'") == sum(e.get("ph") in "sft" for e in events)
    # CANN calls are named by the call; the AscendCL@ form stays in args
    cann = Counter(e["name"].split("@", 1)[1] for e in complete if names.get(e["pid"]) == "CANN")
    got = dict(con.execute("SELECT name, count(*) FROM runtime_calls GROUP BY 1").fetchall())
    assert got == dict(cann)
    assert count("SELECT count(*) FROM runtime_calls WHERE args->>'raw name' LIKE 'AscendCL@%'") == sum(cann.values())
    # device tasks: pid = device, tid = stream, with the task's own args
    assert con.execute("SELECT DISTINCT device, stream, pid, tid FROM events WHERE kind = 'kernel'").fetchall() == [
        (0, 3, 0, 3)
    ]
    assert count("SELECT count(*) FROM kernels WHERE args->>'Task Type' IS NOT NULL") == 276


def test_runtime_calls_nest_under_their_ops(trace):
    con, _, _ = trace
    # CANN calls share the Python process's threads, so the op that blocks holds its sync or copy
    parents = con.execute(
        "SELECT r.name, p.kind, p.name FROM runtime_calls r LEFT JOIN events p ON p.event_id = r.parent_id "
        "WHERE r.name IN ('aclrtSynchronizeStream', 'aclrtMemcpy') ORDER BY r.ts_ns"
    ).fetchall()
    assert parents and all(kind == "cpu_op" and name.startswith("aten::") for _, kind, name in parents)
    assert ("aclrtMemcpy", "cpu_op", "aten::_local_scalar_dense") in parents  # the .item() of the step


def test_launches_pair_every_task_a_host_to_device_flow_reaches(trace):
    con, _, events = trace
    names = _processes(events)
    tasks = {(e["tid"], e["ts"]) for e in events if e.get("ph") == "X" and names.get(e["pid"]) == "Ascend Hardware"}
    ends = {(e["tid"], e["ts"]) for e in events if e.get("cat") == "HostToDevice" and e.get("ph") == "f"}
    reached = len(tasks & ends)  # 274 of 276: the two AI_CPU tasks have no launch flow in the trace
    paired, calls = con.execute(
        "SELECT count(DISTINCT gpu_event_id), count(DISTINCT runtime_event_id) FROM launches"
    ).fetchone()
    assert paired == reached and paired / len(tasks) >= 274 / 276
    assert calls <= paired
    # every paired call is an aclnn/aclop launch, never a sync
    kinds = {n for (n,) in con.execute("SELECT DISTINCT runtime_name FROM launches").fetchall()}
    assert kinds and all(n.startswith(("aclnn", "aclop")) for n in kinds)
    # async_npu: the framework op and its task share an external id
    linked = con.execute(
        "SELECT count(*) FROM kernels k JOIN cpu_ops o ON o.run_id = k.run_id AND o.external_id = k.external_id"
    ).fetchone()[0]
    assert linked == sum(e.get("cat") == "async_npu" and e.get("ph") == "f" for e in events)


def test_string_timestamps_keep_their_nanoseconds(trace):
    con, _, events = trace
    assert ascend_text.us_to_ns("1704196290183453.123") == 1704196290183453123
    assert ascend_text.us_to_ns("1736413971558972.912\t") == 1736413971558972912
    assert ascend_text.us_to_ns("-12.5") == -12500
    names = _processes(events)
    want = sorted(_ns(e["ts"]) for e in events if e.get("ph") == "X" and names.get(e["pid"]) == "Ascend Hardware")
    got = [ts for (ts,) in con.execute("SELECT ts_ns FROM kernels ORDER BY ts_ns").fetchall()]
    assert got == want and any(ts % 1000 for ts in got)


@pytest.mark.parametrize(("name", "pmu"), [(KD_OLD, ("aic_mac_fp16_ratio", "aiv_vec_fp16_ratio")),
                                           (KD_NEW, ("aic_mac_ratio", "cube_utilization(%)"))])  # fmt: skip
def test_both_kernel_details_layouts_read_with_their_pmu_columns(name, pmu):
    path = corpus(name)
    rows = _csv_rows(path)
    con, [result] = _ingested(path)
    assert result.events_read == len(rows) == result.events_ingested and result.events_skipped == 0
    got = con.execute("SELECT name, ts_ns, dur_ns, stream, args FROM kernels ORDER BY ts_ns, name").fetchall()
    assert len(got) == len(rows)
    hccl = sum(r["Accelerator Core"] == "HCCL" for r in rows)
    assert con.execute("SELECT count(*) FROM kernels WHERE is_communication").fetchone()[0] == hccl
    by_key = {(r["Name"], _ns(r["Start Time(us)"])): r for r in rows}
    for kname, ts, dur, stream, args in got:
        row = by_key[(kname, ts)]
        args = json.loads(args)
        assert dur == _ns(row["Duration(us)"])
        for column in pmu:
            if row[column] not in ("N/A", ""):
                assert args[column] == pytest.approx(float(row[column]))
        assert stream == (int(row["Stream ID"]) if row["Stream ID"] != "N/A" else ascend_text.NO_STREAM)
    # one Step Id: one ProfilerStep annotation over its kernels
    steps = {r["Step Id"] for r in rows}
    windows = con.execute("SELECT annotation, start_ns, end_ns FROM step_windows").fetchall()
    assert [w[0] for w in windows] == [f"ProfilerStep#{s}" for s in sorted(steps)]
    assert windows[0][1] == min(ts for _, ts, *_ in got)


def test_gpt3_parent_is_one_job_of_two_ranks_beside_the_cluster_output():
    parent = corpus(GPT3)
    found = inputs.expand([parent])
    assert [i.path.name for i in found] == ["cluster_analysis_output", "test_rank_0", "test_rank_1"]
    assert [i.reader.FORMAT for i in found] == ["msprof_cluster", "ascend_text", "ascend_text"]
    cluster = parent / "cluster_analysis_output"
    assert not ascend_text.claims(cluster)  # the cluster reader's folder, not a rank's
    for file in cluster.iterdir():
        assert not ascend_text.sniff(file.read_bytes()[: parsers.HEAD_BYTES], file.name), file.name
    con, results = _ingested(parent)
    runs = con.execute(
        "SELECT rank, world_size, rank_source FROM runs WHERE format = 'ascend_text' ORDER BY rank"
    ).fetchall()
    assert runs == [(0, 16, "profiler_info_0.json rank_id"), (1, 16, "profiler_info_1.json rank_id")]
    ranked = [r for r in results if r.format == "ascend_text"]
    for result, rank in zip(ranked, (0, 1)):
        assert result.events_read == result.events_ingested + result.events_skipped
        assert result.events_read == _gpt3_items(parent / f"test_rank_{rank}" / "ASCEND_PROFILER_OUTPUT")


def _gpt3_items(output: Path) -> int:
    """Every item of the rank's files, counted here: CSV data rows, communication ops, matrix links."""
    rows = sum(len(_csv_rows(p)) for p in output.glob("*.csv"))
    comm = json.loads((output / "communication.json").read_text())
    ops = sum(len(ops) for kinds in comm.values() for ops in kinds.values())
    matrix = json.loads((output / "communication_matrix.json").read_text())
    links = sum(len(link) for kinds in matrix.values() for ops in kinds.values() for link in ops.values())
    return rows + ops + links


def test_gpt3_metrics_hold_the_step_and_communication_tables():
    path = corpus(GPT3) / "test_rank_0"
    con, [result] = _ingested(path)
    output = path / "ASCEND_PROFILER_OUTPUT"
    [step] = _csv_rows(output / "step_trace_time.csv")
    got = dict(
        con.execute(
            "SELECT args->>'column', value FROM run_metrics WHERE args->>'source' = 'step_trace_time.csv'"
        ).fetchall()
    )
    for column in ("Computing", "Communication(Not Overlapped)", "Free", "Stage"):
        assert got[column] == pytest.approx(float(step[column]) * 1000, abs=1)
    comm = json.loads((output / "communication.json").read_text())
    ops = [
        (name, op)
        for kinds in comm.values()
        for o in kinds.values()
        for name, op in o.items()
        if name != "Total Op Info"
    ]
    elapse = con.execute("SELECT count(*), sum(value) FROM run_metrics WHERE name = 'comm_elapse'").fetchone()
    assert elapse[0] == len(ops)
    assert elapse[1] == pytest.approx(sum(op["Communication Time Info"]["Elapse Time(ms)"] for _, op in ops) * 1e6)
    rdma = con.execute(
        "SELECT value FROM run_metrics WHERE name = 'comm_bandwidth' AND args->>'transport' = 'RDMA' "
        "AND args->>'op' = 'hcom_send__822_0'"
    ).fetchone()[0]
    send = dict(ops)["hcom_send__822_0@13337953553061386822"]
    assert rdma == send["Communication Bandwidth Info"]["RDMA"]["Bandwidth(GB/s)"]
    # the kernel rows are counted, not placed: their start times have no microseconds left
    kernels = _csv_rows(output / "kernel_details.csv")
    assert result.skipped_reasons[f"kernel_details.csv: {ascend_text.ROUNDED_REASON}"] == len(kernels)
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 0


def test_profiler_metadata_alone_is_a_run_of_metadata():
    path = corpus(METADATA)
    con, [result] = _ingested(path)
    meta = json.loads(path.read_text())
    assert result.events_read == 0 and con.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    rank, world, stored = con.execute("SELECT rank, world_size, metadata FROM runs").fetchone()
    assert (rank, world) == (meta["distributed_args"]["rank"], meta["distributed_args"]["world_size"])
    assert json.loads(stored)["profiler_metadata"]["parallel_group_info"] == meta["parallel_group_info"]


def test_sniffs_take_only_their_files():
    head = lambda p: Path(p).read_bytes()[: parsers.HEAD_BYTES]  # noqa: E731
    for name in (TRACE, KD_OLD, KD_NEW, METADATA):
        assert parsers.recognise(head(corpus(name)), Path(name).name) is ascend_text
    # msprof's own timeline JSON (no framework side, numeric ts) stays with the Chrome reader
    msprof = next(corpus("ascend/mindinsight__profiler_PROF_2dev").rglob("msprof_*.json"))
    assert not ascend_text.sniff(head(msprof), msprof.name)
    assert not ascend_text.sniff(
        head(corpus(GPT3) / "cluster_analysis_output" / "cluster_step_trace_time.csv"), "x.csv"
    )
    db_rank = corpus("ascend/msinsight__pytorch_db_level1") / "rank0_ascend_pt"
    assert not ascend_text.claims(db_rank)  # a db export is the db reader's


def test_hccl_process_ops_are_communication_kernels_and_their_tasks_skipped(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "HCCL"}},
        {"ph": "M", "name": "process_name", "pid": 800, "tid": 0, "args": {"name": "Ascend Hardware"}},
        {"ph": "X", "name": "hcom_allReduce__123_0_1", "pid": 9, "tid": 2, "ts": "1000.5", "dur": 20.0,
         "args": {"group_name": "tp", "data_type": "FP16", "count": 4096}},
        {"ph": "X", "name": "Notify_Wait", "pid": 9, "tid": 3, "ts": "1001.0", "dur": 2.0, "args": {}},
        {"ph": "X", "name": "MatMul", "pid": 800, "tid": 5, "ts": "1030.25", "dur": 4.0, "args": {"Stream Id": 5}},
    ]  # fmt: skip
    path = tmp_path / "trace_view.json"
    path.write_text(json.dumps(events))
    con, [result] = _ingested(path)
    assert result.skipped_reasons == {f"trace_view.json: {ascend_text.HCCL_TASK_REASON}": 1}
    [(coll, group, dtype, ts)] = con.execute(
        "SELECT collective, process_group, dtype, gpu_ts_ns FROM collectives"
    ).fetchall()
    assert (coll, group, dtype, ts) == ("allreduce", "tp", "FP16", 1000500)
    assert con.execute("SELECT count(*) FROM kernels WHERE NOT is_communication").fetchone()[0] == 1


def test_kernel_details_enrich_the_trace_kernels_they_match(tmp_path):
    trace_events = _events(corpus(TRACE))
    names = _processes(trace_events)
    tasks = [e for e in trace_events if e.get("ph") == "X" and names.get(e["pid"]) == "Ascend Hardware"]
    rank = tmp_path / "rank3_ascend_pt"
    output = rank / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    (output / "trace_view.json").write_text(json.dumps(trace_events))
    lines = ["Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us),Block Num,aiv_vec_ratio"]
    lines += [f'1,{t["name"]},X,AI_VECTOR_CORE,"{t["ts"]}\t",{t["dur"]},8,0.25' for t in tasks[:10]]
    lines.append('1,NoSuchTask,X,AI_CORE,"1.5",1.0,1,0.1')
    (output / "kernel_details.csv").write_text("\n".join(lines) + "\n")
    con, [result] = _ingested(rank)
    assert result.events_read == len(trace_events) + 11 == result.events_ingested + result.events_skipped
    assert (
        result.skipped_reasons["kernel_details.csv: row with no device task of its name and start in trace_view.json"]
        == 1
    )
    got = con.execute(
        "SELECT count(*) FROM kernels WHERE args->>'Block Num' = '8' AND args->>'aiv_vec_ratio' = '0.25'"
    ).fetchone()[0]
    assert got == 10 and con.execute("SELECT rank FROM runs").fetchone()[0] == 3


@pytest.mark.parametrize("what", ["truncated trace", "missing column"])
def test_bad_input_is_one_input_error(tmp_path, what):
    if what == "truncated trace":
        path = tmp_path / "trace_view.json"
        path.write_bytes(corpus(TRACE).read_bytes()[:200_000])
        expected = "well-formed trace_view.json"
    else:
        rows = list(csv.reader(corpus(KD_NEW).open(newline="")))
        drop = rows[0].index("Duration(us)")
        path = tmp_path / "kernel_details.csv"
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([r[:drop] + r[drop + 1 :] for r in rows])
        expected = "Duration(us)"
    with pytest.raises(InputError) as raised:
        ingest(db.connect(None), [path])
    message = str(raised.value)
    assert str(path) in message and expected in message and "\n" not in message


# --- the step cross-check ---

COMPONENTS = {"computing": ("compute_ns", "step_computing", "overlap_computing"),
              "communication (not overlapped)": ("comm_exposed_ns", "step_comm_not_overlapped",
                                                 "overlap_comm_not_overlapped"),
              "free": ("free_ns", "step_free", "overlap_free")}  # fmt: skip


def step_cross_check(con) -> list[tuple]:
    """(run, step, component, tracekit ns, Ascend ns, Ascend source) for every step the steps view and
    the profiler's step tables both have. tracekit's free time is the step's idle between its first
    and last device activity: step_trace_time.csv's Stage is Computing + Communication(Not Overlapped)
    + Free, the device's span, without the host time before the first task and after the last."""
    rows = con.execute(
        """
        WITH span AS (
            SELECT s.run_id, s.step_index, s.annotation, s.compute_ns, s.comm_exposed_ns, s.busy_ns,
                   least(max(g.end_ns), s.end_ns) - greatest(min(g.ts_ns), s.start_ns) AS device_span_ns
            FROM steps s JOIN gpu_activities g ON g.run_id = s.run_id AND g.device = s.device
             AND g.end_ns > s.start_ns AND g.ts_ns < s.end_ns
            GROUP BY s.run_id, s.step_index, s.annotation, s.compute_ns, s.comm_exposed_ns, s.busy_ns, s.start_ns,
                     s.end_ns
        )
        SELECT sp.run_id, sp.annotation, m.name, m.value, m.args->>'source',
               sp.compute_ns, sp.comm_exposed_ns, sp.device_span_ns - sp.busy_ns AS free_ns
        FROM span sp JOIN run_metrics m ON m.run_id = sp.run_id
         AND 'ProfilerStep#' || (m.args->>'step') = sp.annotation
        """
    ).fetchall()
    out = []
    for run, step, metric, value, source, compute, comm, free in rows:
        ours = {"compute_ns": compute, "comm_exposed_ns": comm, "free_ns": free}
        for component, (column, *metrics) in COMPONENTS.items():
            if metric in metrics:
                out.append((run, step, component, ours[column], value, source))
    return out


def test_step_cross_check_on_the_overlap_bands(trace):
    con, _, events = trace
    checks = step_cross_check(con)
    assert {c[2] for c in checks} == set(COMPONENTS)
    names = _processes(events)
    bands = Counter()
    for e in events:
        if names.get(e.get("pid")) == "Overlap Analysis" and e.get("ph") == "X":
            bands[e["name"]] += round(e["dur"] * 1000)
    for _, step, component, ours, ascend, source in checks:
        assert "Overlap Analysis" in source and step == "ProfilerStep#1"
        if component == "computing":
            assert ascend == pytest.approx(bands["Computing"], abs=1000)  # the step holds every band
        assert ours == pytest.approx(ascend, rel=0.05, abs=1000), (component, ours, ascend)


def test_step_cross_check_finds_nothing_to_compare_without_a_timeline():
    con, _ = _ingested(corpus(GPT3))
    stated = con.execute("SELECT count(*) FROM run_metrics WHERE name = 'step_computing'").fetchone()[0]
    assert stated == 2  # both ranks state their step ...
    assert step_cross_check(con) == []  # ... and neither has device activity to set against it


@pytest.mark.parametrize("name", [TRACE, KD_OLD, KD_NEW, METADATA, GPT3])
def test_analyze_cli_reads_the_corpus_inputs(name):
    path = corpus(name)
    proc = subprocess.run([TRACEKIT, "analyze", str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    label = "test_rank_0" if name == GPT3 else path.name.split(".")[0][:30]
    assert label in proc.stdout


def test_open_names_the_ranks_of_the_job():
    with tracekit.open(corpus(GPT3)) as job:
        ranks = job.sql("SELECT list(rank ORDER BY rank) FROM runs WHERE rank IS NOT NULL").fetchall()[0][0]
        cluster = job.sql("SELECT world_size FROM runs WHERE format = 'msprof_cluster'").fetchall()
    assert ranks == [0, 1] and cluster == [(16,)]  # the two rank folders and the job's cluster summary
