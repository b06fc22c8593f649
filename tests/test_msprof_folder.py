"""msprof PROF_* folders and the MindSpore Profiler's legacy folder (parsers/msprof_folder.py), on the
corpus inputs in place: every row read or skipped, counts against the source files, ranks, steps."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, corpus
from tracekit import db, parsers
from tracekit.errors import InputError
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import msprof_folder

VLLM = "ascend/vllmascend__PROF_000001_20260823165350017_00625898KGAPBKDQ"
TWO_DEV = "ascend/mindinsight__profiler_PROF_2dev"
LEGACY = "ascend/mindinsight__run_1_normal_run_profiler"


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]


def _one(folder: Path, pattern: str) -> Path:
    [path] = sorted(folder.rglob(pattern))
    return path


def _reconciled(con, result) -> None:
    assert result.events_read == result.events_ingested + result.events_skipped
    events = con.execute("SELECT count(*) FROM events WHERE run_id = ?", [result.run_id]).fetchone()[0]
    metric_rows = con.execute(
        "SELECT count(DISTINCT args->>'line' || (args->>'source')) FROM run_metrics WHERE run_id = ? AND args->>'line' IS NOT NULL",
        [result.run_id],
    ).fetchone()[0]
    assert events <= result.events_ingested and events + metric_rows <= result.events_ingested


def test_claims_prof_and_legacy_folders_only():
    assert msprof_folder.claims(corpus(VLLM)) and msprof_folder.claims(corpus(LEGACY))
    parent = corpus(TWO_DEV)
    assert not msprof_folder.claims(parent)
    assert all(msprof_folder.claims(p) for p in parent.iterdir())
    gpt3 = corpus("ascend/msinsight__server_test_data_gpt3")
    for folder in (gpt3, gpt3 / "cluster_analysis_output", gpt3 / "test_rank_0"):
        assert not msprof_folder.claims(folder)


def test_claims_never_a_torch_npu_folder(tmp_path):
    rank = tmp_path / "rank0_ascend_pt"
    shutil.copytree(corpus(VLLM), rank / "PROF_000001_x")
    (rank / "ASCEND_PROFILER_OUTPUT").mkdir()
    assert not msprof_folder.claims(rank) and not msprof_folder.claims(rank / "PROF_000001_x")


def test_vllm_prof_folder_maps_op_summary_tasks_and_statistics():
    folder = corpus(VLLM)
    con = db.connect(None)
    [result] = ingest(con, [folder])
    assert result.format == "msprof"
    _reconciled(con, result)
    summary = _csv(_one(folder, "op_summary_*.csv"))
    tasks = _csv(_one(folder, "task_time_*.csv"))
    kernels = con.execute("SELECT name, device, stream, dur_ns, args FROM kernels ORDER BY ts_ns").fetchall()
    assert [k[0] for k in kernels] == [r["Op Name"] for r in summary]
    assert [(k[1], k[2]) for k in kernels] == [(int(r["Device_id"]), int(r["Stream ID"])) for r in summary]
    assert [k[3] for k in kernels] == [round(float(r["Task Duration(us)"]) * 1000) for r in summary]
    args = json.loads(kernels[-1][4])
    assert args["OP Type"] == summary[-1]["OP Type"] and args["aic_cube_fops"] == float(summary[-1]["aic_cube_fops"])
    # task_time: its kernel tasks are op_summary's own, its kernel-less tasks are runtime control
    same = sum(r["kernel_name"] != "N/A" for r in tasks)
    reasons = result.skipped_reasons
    assert sum(v for k, v in reasons.items() if "same task as an op_summary row" in k) == same
    assert sum(v for k, v in reasons.items() if "runtime control task" in k) == len(tasks) - same
    apis = _csv(_one(folder, "api_statistic_*.csv"))
    counts = dict(
        con.execute("SELECT args->>'API Name', value FROM run_metrics WHERE name = 'api_statistic.count'").fetchall()
    )
    assert counts == {r["API Name"]: float(r["Count"]) for r in apis}
    ops = _csv(_one(folder, "op_statistic_*.csv"))
    total = con.execute("SELECT sum(value) FROM run_metrics WHERE name = 'op_statistic.total_time_ns'").fetchone()[0]
    assert total == pytest.approx(sum(float(r["Total Time(us)"]) for r in ops) * 1000)
    [(props, start)] = con.execute("SELECT device_properties, start_ns FROM runs").fetchall()
    info = json.loads(_one(folder, "info.json.0").read_text())["DeviceInfo"][0]
    assert json.loads(props)[0]["ai_core_num"] == info["ai_core_num"]
    # epoch microseconds with three decimals, exact to the ns
    first = min(summary, key=lambda r: r["Task Start Time(us)"])["Task Start Time(us)"]
    assert start == int(first.replace(".", ""))


def _timeline_events(device: Path, prefix: str) -> list:
    return json.loads(_one(device, f"timeline/{prefix}_*.json").read_text())


def test_two_device_parent_is_one_job_of_two_ranks():
    parent = corpus(TWO_DEV)
    con = db.connect(None)
    results = ingest(con, [parent])
    assert [r.rank for r in results] == [0, 1]
    assert con.execute("SELECT list(rank_source ORDER BY rank) FROM runs").fetchone()[0] == [
        "device_0/info.json.0 rank_id", "device_1/info.json.1 rank_id"]  # fmt: skip
    for result, prof in zip(results, sorted(parent.iterdir())):
        _reconciled(con, result)
        [device] = [d for d in prof.iterdir() if d.name.startswith("device_")]
        union = _timeline_events(device, "msprof")
        procs = {e["pid"]: e["args"]["name"] for e in union if e["ph"] == "M" and e["name"] == "process_name"}
        threads = {
            (e["pid"], e["tid"]): e["args"]["name"] for e in union if e["ph"] == "M" and e["name"] == "thread_name"
        }
        plane = {(e["args"]["stream id"], e["args"]["task id"], e["ts"]) for e in union
                 if e["ph"] == "X" and procs[e["pid"]] == "HCCL" and threads[(e["pid"], e["tid"])].startswith("Plane")}  # fmt: skip
        hw = [e for e in union if e["ph"] == "X" and procs[e["pid"]] == "Ascend Hardware" and "Task Type" in e["args"]]
        work = [e for e in hw if (e["args"]["Stream Id"], e["args"]["Task Id"], e["ts"]) not in plane
                and e["args"]["Task Type"] not in msprof_folder.WAIT_TASKS]  # fmt: skip
        ops = [e for e in union if e["ph"] == "X" and threads.get((e["pid"], e["tid"])) == "Communication Kernel"]
        run = result.run_id
        got = con.execute(
            "SELECT count(*) FILTER (WHERE NOT is_communication), count(*) FILTER (WHERE is_communication) "
            "FROM kernels WHERE run_id = ?", [run]).fetchone()  # fmt: skip
        assert got == (len(work), len(ops))
        assert con.execute("SELECT list(collective) FROM collectives WHERE run_id = ?", [run]).fetchone()[0] == [
            "allreduce"] * len(ops)  # fmt: skip
        # task_time and hccl hold no event msprof_*.json lacks: all skipped as duplicates
        for prefix in ("task_time", "hccl"):
            events = [e for e in _timeline_events(device, prefix) if e["ph"] != "M"]
            assert sum(
                v for k, v in result.skipped_reasons.items() if k.startswith(prefix) and "also in msprof" in k
            ) == len(events)
        # steps: the iterations inside the device slice, on the epoch clock of start_info
        steps = [e for e in _timeline_events(device, "step_trace") if e.get("cat") == "Iteration Time"]
        start = json.loads(next(p for p in device.glob("start_info.*") if p.suffix != ".done").read_text())
        offset = int(start["collectionTimeBegin"]) * 1000 - int(start["clockMonotonicRaw"])
        [(step, ts)] = con.execute("SELECT DISTINCT annotation, start_ns FROM steps WHERE run_id = ?", [run]).fetchall()
        first = steps[0]
        assert (
            step == f"ProfilerStep#{first['args']['Iteration ID']}"
            and abs(ts - (round(first["ts"] * 1000) + offset)) <= 1
        )
        iteration_ns = con.execute(
            "SELECT list(value ORDER BY (args->>'step')::INT) FROM run_metrics WHERE run_id = ? "
            "AND name = 'step_trace.iteration_time_ns'", [run]).fetchone()[0]  # fmt: skip
        assert iteration_ns == pytest.approx([e["dur"] * 1000 for e in steps], abs=1)


def test_legacy_folder_op_timeline_steps_and_summaries():
    folder = corpus(LEGACY)
    con = db.connect(None)
    [result] = ingest(con, [folder])
    _reconciled(con, result)
    lines = (folder / "output_timeline_data_1.txt").read_text().splitlines()[1:]
    ops = [line.rsplit(",", 3) for line in lines if line.strip()]
    assert con.execute("SELECT count(*), count(DISTINCT stream) FROM kernels").fetchone() == (
        len(ops), len({o[1].strip() for o in ops}))  # fmt: skip
    display = json.loads((folder / "timeline_display_1.json").read_text())
    assert result.skipped_reasons["timeline_display: the same op as an output_timeline_data row (read from there)"] == len(
        [e for e in display if e.get("pid") == 1])  # fmt: skip
    rows = _csv(folder / "step_trace_raw_1_detail_time.csv")
    numbered = [r for r in rows if r["step_num"].isdigit()]
    totals = con.execute("SELECT count(*) FROM run_metrics WHERE name = 'step_trace.total_ns'").fetchone()[0]
    assert totals == len(numbered)
    first_op = min(int(float(o[2]) * 10**5 + 0.5) for o in ops)  # ms -> 10 ns cycles
    cycle0 = int(float((folder / "min_cycle_counter_1.txt").read_text()))
    assert first_op == cycle0
    lo, hi = con.execute("SELECT min(ts_ns), max(end_ns) FROM kernels").fetchone()
    inside = [r for r in numbered if int(r["start_point"]) * 10 < hi and int(r["end_point"]) * 10 > lo]
    names = con.execute("SELECT list(DISTINCT annotation) FROM steps").fetchone()[0]
    assert sorted(names) == sorted(f"ProfilerStep#{r['step_num']}" for r in inside)
    not_read = json.loads(con.execute("SELECT notes FROM ingest_log").fetchone()[0])["files"]["not read"]
    assert "flops_1.txt" in not_read and "pipeline_profiling_1.json" in not_read


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def test_truncated_op_summary_is_one_input_error(tmp_path):
    folder = _copy(corpus(VLLM), tmp_path / "PROF_000001_cut")
    summary = _one(folder, "op_summary_*.csv")
    summary.write_bytes(summary.read_bytes()[:-200])
    with pytest.raises(InputError, match=r"op_summary_\d+\.csv: line \d+: \d+ fields as in the header"):
        msprof_folder.read(folder)


def test_missing_column_is_one_input_error(tmp_path):
    folder = _copy(corpus(VLLM), tmp_path / "PROF_000001_col")
    summary = _one(folder, "op_summary_*.csv")
    summary.write_text(summary.read_text().replace("Task Start Time(us)", "Start"))
    with pytest.raises(InputError, match="column 'Task Start Time\\(us\\)'"):
        msprof_folder.read(folder)


def test_truncated_timeline_is_one_input_error(tmp_path):
    prof = next(corpus(TWO_DEV).iterdir())
    folder = _copy(prof, tmp_path / prof.name)
    timeline = _one(folder, "timeline/msprof_*.json")
    timeline.write_bytes(timeline.read_bytes()[:5000])
    with pytest.raises(InputError, match=r"msprof_0_2_1\.json: byte \d+: JSON"):
        msprof_folder.read(folder)
    assert parsers.claim(folder) is msprof_folder


@pytest.mark.parametrize("name", [VLLM, TWO_DEV, LEGACY])
def test_analyze_cli_names_the_run(name):
    path = corpus(name)
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "tracekit"), "analyze", str(path)], capture_output=True,
                          text=True, timeout=600) if (ROOT / ".venv" / "bin" / "tracekit").exists() else \
        subprocess.run([sys.executable, "-m", "tracekit", "analyze", str(path)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    label = path.name if name != TWO_DEV else next(path.iterdir()).name
    assert label[:30] in done.stdout
