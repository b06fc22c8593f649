"""msprof (CANN) `PROF_*` output folders and the MindSpore Profiler's legacy (MindInsight) folder ->
one run each, in the Kineto kinds (see docs/schema.md, "msprof and MindSpore Profiler folders").

A `PROF_*` folder holds `host/`, one `device_N/` per device (`info.json.N`, `start_info.N`,
`end_info.N`, `.done` markers) and the exported data: either `mindstudio_profiler_output/` (CSV:
op_summary, task_time, op_statistic, api_statistic) or `device_N/timeline/` (Chrome-trace JSON:
msprof_*, task_time_*, hccl_*, step_trace_*). The legacy folder is flat, one device's files named
`*_<device>.{csv,txt,json}`.

Which file is a task's source, so that no task counts twice:

- op_summary rows are the device tasks (they carry op type, shapes and the PMU columns); a task_time
  row is the same task when its (device, stream, task id, start) matches one, and is skipped as such.
- msprof_*.json is the union of the task_time_* and hccl_* files (checked event by event: a file
  event not in it is read from its own file) plus the step trace, the CANN host calls and msprof's
  overlap analysis; step_trace_* holds every iteration, msprof_*.json only those of its slice.
- Legacy: output_timeline_data_N.txt is the op timeline (ms on the device's cycle clock, which
  step_trace_raw's points count in); timeline_display_N.json draws the same ops again, relative to
  the first one.

HCCL: the op-level event of the "Communication Kernel" thread is the communication `kernel`; the
tasks it runs (Notify/Memcpy/Reduce on the HCCL planes, and the same tasks on the Ascend Hardware
streams) are inside it and skipped with that reason. Event/notify record and wait tasks are skipped:
their span is a wait, not work.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

import orjson

from tracekit.errors import InputError
from tracekit.parsers.ascend_files import json_file, metric_name, ns, number, table
from tracekit.parsers.rows import Export

FORMAT = "msprof"
DESCRIPTION = "msprof (CANN) or MindSpore Profiler output folder"

SUMMARY_DIR = "mindstudio_profiler_output"
TORCH_NPU_DIR = "ASCEND_PROFILER_OUTPUT"
CLUSTER_FILES = ("cluster_step_trace_time.csv", "cluster_communication.json", "cluster_analysis.db")
LEGACY_MARKS = (r"output_timeline_data_\d+\.txt", r"framework_raw_\d+\.csv", r"step_trace_raw_\d+_detail_time\.csv")

# device tasks whose span is a wait on another stream or task, or a runtime setting: not work
WAIT_TASKS = {"EVENT_RECORD", "EVENT_WAIT", "EVENT_RESET", "NOTIFY_RECORD", "NOTIFY_WAIT"}
COPY_TASKS = {"MEMCPY_ASYNC"}
# MindSpore graph-mode names its HCCL ops `<scope>/AllReduce-op534`
COLLECTIVE = re.compile(r"(?:^|/)(AllReduce|AllGather|ReduceScatter|Broadcast|AlltoAll|AllToAll|Send|Receive)-op\d+")

WAIT_REASON = "stream synchronisation task (event/notify record or wait): its span is a wait, not work"
HCCL_TASK_REASON = "HCCL task inside a communication op (the op is the kernel: `Communication Kernel` thread)"
CONTROL_REASON = "runtime control task without a kernel (profiling switch, timeout setting): not device work"


def sniff(head: bytes, name: str, **_) -> bool:
    return False  # folders only (claims)


def claims(folder: Path) -> bool:
    """A `PROF_*` folder (a device_N/ with its info.json.N and exported data) or a legacy MindSpore
    profiler folder (its output_timeline_data/framework_raw/step_trace_raw files); never a torch_npu
    folder (ASCEND_PROFILER_OUTPUT/ here or beside it) nor an msprof-analyze cluster folder."""
    try:
        folder = Path(folder)
        if (folder / TORCH_NPU_DIR).exists() or (folder.parent / TORCH_NPU_DIR).exists():
            return False
        names = {p.name for p in folder.iterdir()}
        if any(n in names for n in CLUSTER_FILES):
            return False
        return bool(_devices(folder)) or sum(any(re.fullmatch(m, n) for n in names) for m in LEGACY_MARKS) >= 2
    except OSError:
        return False


def _devices(folder: Path) -> list[tuple[int, Path]]:
    """(device id, device_N folder) of a PROF folder whose device folders hold their info.json.N and
    data (a timeline/ folder, or the folder's mindstudio_profiler_output/)."""
    found = []
    for sub in folder.iterdir():
        m = re.fullmatch(r"device_(\d+)", sub.name)
        if m and sub.is_dir() and (sub / f"info.json.{m[1]}").is_file():
            if (sub / "timeline").is_dir() or (folder / SUMMARY_DIR).is_dir():
                found.append((int(m[1]), sub))
    return sorted(found)


def read(path: Path, **_) -> Export:
    path = Path(path)
    out = Export(source=path, format=FORMAT)
    out.notes["files"] = {"read": [], "not read": {}}
    if _devices(path):
        _read_prof(path, out)
    else:
        _read_legacy(path, out)
    return out


def _not_read(out: Export, folder: Path, file: Path, reason: str) -> None:
    out.read["file"] += 1
    out.skipped[f"file not read: {reason}"] += 1
    out.notes["files"]["not read"][str(file.relative_to(folder))] = reason


def _mark_read(out: Export, folder: Path, file: Path) -> None:
    out.notes["files"]["read"].append(str(file.relative_to(folder)))


def _kernel(name, ts, dur, device, stream, args, cat="kernel", kind="kernel"):
    return (kind, "X", cat, name, ts, dur, device, stream, None, device, stream, None, None, None,
            orjson.dumps(args).decode(), None)  # fmt: skip


def _collective_args(name: str, args: dict) -> dict:
    m = COLLECTIVE.search(name)
    return {"Collective name": m[1].lower(), **args} if m else args


# ---- PROF_* folders -------------------------------------------------------------------------------


def _read_prof(path: Path, out: Export) -> None:
    devices = _devices(path)
    props, clocks = [], {}
    for device, folder in devices:
        info = json_file(folder / f"info.json.{device}")
        _mark_read(out, path, folder / f"info.json.{device}")
        props.append(_device_properties(folder / f"info.json.{device}", info, device))
        clocks[device] = _clock(out, path, folder, device)
        _device_extras(out, path, folder, device)
        if out.rank is None and isinstance(info.get("rank_id"), int) and info["rank_id"] >= 0:
            out.rank, out.rank_source = info["rank_id"], f"device_{device}/info.json.{device} rank_id"
    out.device_properties = props
    host = path / "host" / "info.json"
    if host.is_file():
        out.metadata["host"] = _host_metadata(json_file(host))
        _mark_read(out, path, host)
    for other in sorted(p for p in (path / "host").rglob("*") if p.is_file() and p != host):
        _not_read(out, path, other, "host-side raw data (the exported files are read)")
    out.metadata["profiler"] = "msprof"
    if (path / SUMMARY_DIR).is_dir():
        _read_summary_dir(path, out)
    for device, folder in devices:
        if (folder / "timeline").is_dir():
            _read_timeline(path, folder / "timeline", device, clocks.get(device), out)
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        _not_read(out, path, file, "not part of msprof's export")


def _device_properties(file: Path, info: dict, device: int) -> dict:
    entries = info.get("DeviceInfo")
    if not isinstance(entries, list):
        raise InputError(file, "DeviceInfo", "a DeviceInfo list (msprof info.json)")
    entry = next((d for d in entries if isinstance(d, dict) and d.get("id") == device), entries[0] if entries else {})
    keep = ("ai_core_num", "aiv_num", "aic_frequency", "aiv_frequency", "hwts_frequency", "ai_cpu_core_num",
            "ctrl_cpu_id", "env_type")  # fmt: skip
    props = {"id": device, "vendor": "Huawei Ascend", **{k: entry[k] for k in keep if k in entry}}
    for key in ("platform_version", "drvVersion"):
        if key in info:
            props[key] = info[key]
    return props


def _host_metadata(info: dict) -> dict:
    keep = ("hostname", "OS", "hwtype", "cpuNums", "drvVersion", "platform_version", "pid", "pid_name", "rank_id")
    return {k: info[k] for k in keep if k in info}


def _clock(out: Export, path: Path, folder: Path, device: int) -> dict | None:
    """CLOCK_MONOTONIC_RAW ns and epoch us of the collection's start (start_info.N), and its end."""
    clock = {}
    for which in ("start", "end"):
        file = folder / f"{which}_info.{device}"
        if not file.is_file():
            continue
        data = json_file(file)
        _mark_read(out, path, file)
        key = "collectionTimeBegin" if which == "start" else "collectionTimeEnd"
        mono, epoch = ns(data.get("clockMonotonicRaw"), 1), ns(data.get(key))
        if mono is None or epoch is None:
            raise InputError(file, "clockMonotonicRaw", f"clockMonotonicRaw and {key} numbers")
        clock[which] = (mono, epoch)
    return clock or None


def _device_extras(out: Export, path: Path, folder: Path, device: int) -> None:
    known = {f"info.json.{device}", f"start_info.{device}", f"end_info.{device}"}
    for file in sorted(p for p in folder.iterdir() if p.is_file() and p.name not in known):
        reason = "completion marker (holds its file's size only)" if file.suffix == ".done" else "raw device data"
        _not_read(out, path, file, reason)
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "timeline"):
        for file in sorted(p for p in sub.rglob("*") if p.is_file()):
            _not_read(out, path, file, "raw device data (the exported files are read)")


# ---- mindstudio_profiler_output (CSV) ---------------------------------------------------------------

SUMMARY_KEYS = {
    "op_statistic": ("Device_id", "OP Type", "Core Type"),
    "api_statistic": ("Device_id", "Level", "API Name"),
}


def _read_summary_dir(path: Path, out: Export) -> None:
    folder = path / SUMMARY_DIR
    files = sorted(p for p in folder.iterdir() if p.is_file())
    by_kind = defaultdict(list)
    for file in files:
        m = re.fullmatch(r"(op_summary|task_time|op_statistic|api_statistic)_\d+\.csv", file.name)
        if m:
            by_kind[m[1]].append(file)
        else:
            _not_read(out, path, file, "an msprof export tracekit does not map")
    tasks: dict = defaultdict(list)
    for file in by_kind["op_summary"]:
        _read_op_summary(file, out, tasks)
        _mark_read(out, path, file)
    for file in by_kind["task_time"]:
        _read_task_time(file, out, tasks)
        _mark_read(out, path, file)
    for kind in ("op_statistic", "api_statistic"):
        for file in by_kind[kind]:
            _read_statistic(file, kind, out)
            _mark_read(out, path, file)


OP_SUMMARY = ("Device_id", "Stream ID", "Task ID", "Op Name", "Task Start Time(us)", "Task Duration(us)")


def _read_op_summary(file: Path, out: Export, tasks: dict) -> None:
    for _, row in table(file, OP_SUMMARY):
        out.read["op_summary row"] += 1
        start, dur = ns(row["Task Start Time(us)"]), ns(row["Task Duration(us)"])
        device, stream = number(row["Device_id"]), number(row["Stream ID"])
        if start is None or dur is None or not isinstance(device, int) or not isinstance(stream, int):
            out.skipped["op_summary row: start, duration, device or stream not a number"] += 1
            continue
        args = {k: number(v) for k, v in row.items() if k not in OP_SUMMARY[:2] + OP_SUMMARY[4:]}
        out.rows.append(_kernel(row["Op Name"], start, dur, device, stream, _collective_args(row["Op Name"], args)))
        tasks[(device, stream, number(row["Task ID"]))].append(start)


TASK_TIME = ("Device_id", "kernel_name", "kernel_type", "stream_id", "task_id", "task_time(us)", "task_start(us)")


def _read_task_time(file: Path, out: Export, tasks: dict) -> None:
    for _, row in table(file, TASK_TIME):
        out.read["task_time row"] += 1
        start, dur = ns(row["task_start(us)"]), ns(row["task_time(us)"])
        device, stream, task = number(row["Device_id"]), number(row["stream_id"]), number(row["task_id"])
        if start is not None and any(abs(s - start) <= 1000 for s in tasks.get((device, stream, task), ())):
            out.skipped[
                "task_time row: the same task as an op_summary row (op_summary preferred: op type, shapes, PMU)"
            ] += 1
        elif row["kernel_name"] in ("N/A", ""):
            out.skipped[f"task_time row: {CONTROL_REASON}"] += 1
        elif start is None or dur is None or not isinstance(device, int) or not isinstance(stream, int):
            out.skipped["task_time row: start, duration, device or stream not a number"] += 1
        else:
            args = {"Task Type": row["kernel_type"], "Task ID": task, "source": file.name}
            out.rows.append(_kernel(row["kernel_name"], start, dur, device, stream, args, cat="task_time"))


def _read_statistic(file: Path, kind: str, out: Export) -> None:
    keys = SUMMARY_KEYS[kind]
    for line, row in table(file, keys):
        out.read[f"{kind} row"] += 1
        key = {k: row[k] for k in keys}
        values = [(metric_name(kind, col), number(v)) for col, v in row.items() if col not in keys]
        values = [(m, v) for m, v in values if m is not None and isinstance(v, (int, float))]
        if not values:
            out.skipped[f"{kind} row: no numeric column"] += 1
            continue
        args = orjson.dumps({"source": file.name, "line": line, **key}).decode()
        out.metrics += [(name, value * scale, unit, args) for (name, scale, unit), value in values]


# ---- device_N/timeline (Chrome-trace JSON) ---------------------------------------------------------


def _events(file: Path) -> list:
    data = json_file(file)
    if isinstance(data, dict):
        data = data.get("traceEvents")
    if not isinstance(data, list):
        raise InputError(file, "byte 0", "a JSON array of trace events (msprof timeline)")
    for i, e in enumerate(data):
        if not isinstance(e, dict) or "ph" not in e:
            raise InputError(file, f"event {i}", "a trace event object with `ph`")
    return data


def _key(e: dict) -> tuple:
    return (
        e.get("name"),
        e.get("ph"),
        e.get("ts"),
        e.get("dur"),
        orjson.dumps(e.get("args"), option=orjson.OPT_SORT_KEYS),
    )


def _read_timeline(path: Path, folder: Path, device: int, clock: dict | None, out: Export) -> None:
    files = defaultdict(list)
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        m = re.fullmatch(r"(msprof|task_time|hccl|step_trace)_\d+(?:_\d+)*\.json", file.name)
        if m:
            files[m[1]].append(file)
        else:
            _not_read(out, path, file, "a timeline tracekit does not map")
    union = [(f, _events(f)) for f in files["msprof"]]
    in_union = Counter(_key(e) for _, events in union for e in events if e["ph"] != "M")
    rows_before = len(out.rows)
    sources = list(union)
    for kind in ("task_time", "hccl"):
        for file in files[kind]:
            events = _events(file)
            extra = []
            for e in events:
                out.read[f"{kind}_*.json event"] += 1
                if e["ph"] == "M":
                    out.skipped[f"{kind}_*.json: trace metadata (process/thread names)"] += 1
                elif in_union[_key(e)] > 0:
                    out.skipped[f"{kind}_*.json: also in msprof_*.json (read from there)"] += 1
                else:
                    extra.append(e)
            sources.append((file, extra))
    offset = _epoch_offset(clock, [e for _, events in sources for e in events])
    steps = [(f, _events(f)) for f in files["step_trace"]]
    step_keys = Counter(_key(e) for _, events in steps for e in events if e["ph"] != "M")
    _map_timeline(sources, device, offset, step_keys, out)
    window = out.window() if len(out.rows) > rows_before else None
    for file, events in steps:
        _read_step_trace(file, events, window, offset, out)
    for file, _ in union + steps:
        _mark_read(out, path, file)
    for kind in ("task_time", "hccl"):
        for file in files[kind]:
            _mark_read(out, path, file)
    if offset:
        out.notes["clock"] = (
            "CLOCK_MONOTONIC_RAW us made epoch ns by start_info's clockMonotonicRaw/collectionTimeBegin"
        )


def _epoch_offset(clock: dict | None, events: list) -> int:
    """ns to add to a timeline on CLOCK_MONOTONIC_RAW (us) to make it epoch: from start_info's pair,
    when the timeline lies inside the collection (else the times stay as written)."""
    if not clock or "start" not in clock:
        return 0
    times = [ns(e["ts"]) for e in events if e.get("ph") == "X" and ns(e.get("ts")) is not None]
    if not times:
        return 0
    mono, epoch = clock["start"]
    end_mono = clock.get("end", (max(times) + 1, 0))[0]
    return epoch - mono if mono <= min(times) and max(times) <= end_mono else 0


def _names(events: list) -> tuple[dict, dict]:
    procs, threads = {}, {}
    for e in events:
        if e["ph"] == "M" and isinstance(e.get("args"), dict):
            if e.get("name") == "process_name":
                procs[e.get("pid")] = str(e["args"].get("name"))
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(e["args"].get("name"))
    return procs, threads


def _map_timeline(sources: list, device: int, offset: int, step_keys: Counter, out: Export) -> None:
    for file, events in sources:
        procs, threads = _names(events)
        label = "msprof_*.json" if file.name.startswith("msprof") else file.name
        hccl_tasks = {_task_id(e) for e in events if _hccl_plane(e, procs, threads)}
        planes = sorted((e["ts"], e["args"].get("stream id")) for e in events if _hccl_plane(e, procs, threads))
        for e in events:
            if file.name.startswith("msprof"):
                out.read[f"{label} event"] += 1
            reason = _map_event(e, procs, threads, device, offset, hccl_tasks, planes, step_keys, out)
            if reason:
                out.skipped[f"{label}: {reason}"] += 1


def _task_id(e: dict) -> tuple:
    args = e.get("args") or {}
    stream = args.get("stream id", args.get("Stream Id"))
    task = args.get("task id", args.get("Task Id"))
    return (stream, task, e.get("ts"))


def _hccl_plane(e: dict, procs: dict, threads: dict) -> bool:
    return (e["ph"] == "X" and procs.get(e.get("pid")) == "HCCL"
            and str(threads.get((e.get("pid"), e.get("tid")), "")).startswith("Plane"))  # fmt: skip


def _map_event(e, procs, threads, device, offset, hccl_tasks, planes, step_keys, out) -> str | None:
    """Appends the event's row; or the reason it is skipped."""
    if e["ph"] == "M":
        return "trace metadata (process/thread names): tracks are named by device and stream"
    process = procs.get(e.get("pid"), "")
    thread = threads.get((e.get("pid"), e.get("tid")), "")
    if process == "Overlap Analysis":
        return "msprof's overlap analysis (derived from the device tasks, which are read)"
    if _key(e) in step_keys:
        return "step trace event, also in step_trace_*.json (read from there)"
    if e["ph"] != "X":
        return f"{e['ph']!r} event of {process or 'an unnamed process'} not mapped"
    ts, dur = ns(e.get("ts")), ns(e.get("dur", 0))
    if ts is None or dur is None:
        return "ts or dur not a number"
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    if process == "Ascend Hardware":
        return _hardware_task(e, args, ts + offset, dur, device, hccl_tasks, out)
    if process == "HCCL":
        if thread.startswith("Plane"):
            return HCCL_TASK_REASON
        stream = next((s for t, s in planes if e["ts"] <= t <= e["ts"] + e.get("dur", 0)), None)
        out.rows.append(
            _kernel(e["name"], ts + offset, dur, device, stream, _collective_args(e["name"], args), cat="hccl")
        )
        return None
    if process == "CANN":
        out.rows.append(("cuda_runtime", "X", "cann", e["name"], ts + offset, dur, e.get("pid"), e.get("tid"), None,
                         None, None, None, None, None, orjson.dumps(args).decode(), None))  # fmt: skip
        return None
    return f"event of process {process or e.get('pid')!r} not mapped"


def _hardware_task(e, args, ts, dur, device, hccl_tasks, out) -> str | None:
    task_type = str(args.get("Task Type", ""))
    stream = args.get("Stream Id", e.get("tid"))
    if not isinstance(stream, int):
        return "device task without a stream id"
    if _task_id(e) in hccl_tasks:
        return HCCL_TASK_REASON
    if task_type in WAIT_TASKS:
        return WAIT_REASON
    kind = "gpu_memcpy" if task_type in COPY_TASKS else "kernel"
    out.rows.append(_kernel(e["name"], ts, dur, device, stream, _collective_args(e["name"], args), kind=kind,
                            cat="Ascend Hardware"))  # fmt: skip
    return None


STEP_PARTS = {"FP_BP Time": "fp_bp_time", "Iteration Refresh": "iteration_refresh", "Reduce": "reduce",
              "Iteration Time": "iteration_time"}  # fmt: skip


def _read_step_trace(file: Path, events: list, window, offset: int, out: Export) -> None:
    """Iterations inside the device tasks' window become `ProfilerStep#N`; every iteration's parts
    (iteration time, FP/BP, refresh, all-reduce, data-augmentation bound) become run_metrics."""
    label = "step_trace_*.json"
    for e in events:
        out.read[f"{label} event"] += 1
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        step = args.get("Iteration ID")
        if e["ph"] == "M":
            out.skipped[f"{label}: trace metadata (process/thread names)"] += 1
        elif e["ph"] == "s":
            out.skipped[f"{label}: flow start of a data-augmentation bound (its length is on the flow's end)"] += 1
        elif e["ph"] == "t" and "Data_aug Bound(us)" in args:
            iteration = re.search(r"(\d+)$", str(e.get("name")))
            _step_metric(
                out, "data_aug_bound_ns", ns(args["Data_aug Bound(us)"]), iteration and int(iteration[1]), file
            )
        elif e["ph"] == "X" and e.get("cat") in STEP_PARTS and isinstance(step, int):
            dur, ts = ns(e.get("dur")), ns(e.get("ts"))
            _step_metric(out, f"{STEP_PARTS[e['cat']]}_ns", dur, step, file)
            if e["cat"] == "Iteration Time" and window and ts is not None and dur is not None:
                start = ts + offset
                if start < window[1] and start + dur > window[0]:
                    out.rows.append(("user_annotation", "X", "step_trace", f"ProfilerStep#{step}", start, dur,
                                     None, None, None, None, None, None, None, None, orjson.dumps(args).decode(),
                                     None))  # fmt: skip
        else:
            out.skipped[f"{label}: event not a step part"] += 1


def _step_metric(out: Export, name: str, value, step, file: Path) -> None:
    if value is None:
        out.skipped["step_trace: value not a number"] += 1
        return
    out.metrics.append(
        (f"step_trace.{name}", float(value), "ns", orjson.dumps({"step": step, "source": file.name}).decode())
    )


# ---- legacy MindSpore (MindInsight) profiler folder -------------------------------------------------


def _legacy_files(path: Path) -> tuple[dict, int | None]:
    files, device = {}, None
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        m = re.fullmatch(r"(.+?)_(\d+)((?:_detail_time|_detail|_type)?)\.(csv|txt|json)", file.name)
        if m:
            files[m[1] + m[3]] = file
            device = int(m[2]) if device is None else device
    return files, device


def _read_legacy(path: Path, out: Export) -> None:
    files, device = _legacy_files(path)
    timeline = files.get("output_timeline_data")
    if timeline is None:
        raise InputError(path, "folder", "output_timeline_data_<device>.txt (the MindSpore op timeline)")
    out.metadata["profiler"] = "MindSpore Profiler (legacy MindInsight folder)"
    out.device_properties = [{"id": device, "vendor": "Huawei Ascend"}]
    out.notes["clock"] = "device cycle clock (10 ns per cycle), not epoch: the folder states no epoch"
    framework = _framework_ops(files.get("framework_raw"), out, path)
    ops = _read_op_timeline(timeline, device, framework, out)
    _mark_read(out, path, timeline)
    used = {timeline, files.get("framework_raw")}
    display = files.get("timeline_display")
    if display is not None:
        _read_display(display, ops, out)
        _mark_read(out, path, display)
        used.add(display)
    steps = files.get("step_trace_raw_detail_time")
    if steps is not None:
        _read_legacy_steps(steps, path, out)
        used |= {steps, files.get("min_cycle_counter")}
    for name, prefix in (("aicore_intermediate_type", "aicore_type"), ("aicore_intermediate_detail", "aicore_op")):
        if name in files:
            _read_aicore(files[name], prefix, out)
            _mark_read(out, path, files[name])
            used.add(files[name])
    if "timeline_summary" in files:
        _read_timeline_summary(files["timeline_summary"], out)
        _mark_read(out, path, files["timeline_summary"])
        used.add(files["timeline_summary"])
    reasons = {
        "flops": "FLOPs per op: not mapped", "minddata_pipeline_raw": "data pipeline queues: not mapped",
        "pipeline_profiling": "data pipeline queues: not mapped",
        "output_op_compute_time": "per-op compute time: a summary of the op timeline, which is read",
        "output_op_compute_time_detail": "per-type compute time: a summary of the op timeline, which is read",
        "step_trace_point_info": "the FP/BP op names of the step points: not mapped",
    }  # fmt: skip
    for file in sorted(p for p in path.iterdir() if p.is_file() and p not in used):
        stem = next((k for k, f in files.items() if f == file), file.stem)
        _not_read(out, path, file, reasons.get(stem, "a MindSpore profiler file tracekit does not map"))


def _framework_ops(file: Path | None, out: Export, path: Path) -> dict:
    """full_kernel_name -> op type, block dim, task/stream id and shapes (framework_raw)."""
    if file is None:
        return {}
    ops = {}
    for _, row in table(file, ("task_id", "stream_id", "block_dim", "full_kernel_name", "kernel_type")):
        out.read["framework_raw row"] += 1
        ops[row["full_kernel_name"]] = {
            "type": row["kernel_type"], "block_dim": number(row["block_dim"]), "task_id": number(row["task_id"]),
            "framework stream_id": number(row["stream_id"]), "op_info": row.get("op_info", ""),
        }  # fmt: skip
    _mark_read(out, path, file)
    return ops


def _read_op_timeline(file: Path, device: int | None, framework: dict, out: Export) -> Counter:
    """The ops as kernels, ms on the device clock to ns exactly; returns the count per op name."""
    counts = Counter()
    text = file.read_text(errors="replace").splitlines()
    header = [c.strip() for c in text[0].split(",")] if text else []
    if header[:4] != ["op_name", "stream_id", "start_time(ms)", "duration(ms)"]:
        raise InputError(file, "line 1", "header `op_name, stream_id, start_time(ms), duration(ms)`")
    for number_, line in enumerate(text[1:], start=2):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.rsplit(",", 3)]
        if len(cells) != 4:
            raise InputError(file, f"line {number_}", "4 fields: op_name, stream_id, start_time(ms), duration(ms)")
        out.read["output_timeline_data row"] += 1
        name, stream, start, dur = cells[0], number(cells[1]), ns(cells[2], 10**6), ns(cells[3], 10**6)
        if start is None or dur is None or not isinstance(stream, int):
            out.skipped["output_timeline_data row: stream, start or duration not a number"] += 1
            continue
        args = {"fullname": name, **framework.get(name, {})}
        out.rows.append(_kernel(name, start, dur, device, stream, _collective_args(name, args), cat="op_timeline"))
        counts[name] += 1
    return counts


def _read_display(file: Path, ops: Counter, out: Export) -> None:
    """The same ops drawn again (relative us): skipped, each matched to a timeline row by its name."""
    left = Counter(ops)
    for e in _events(file):
        out.read["timeline_display event"] += 1
        full = (e.get("args") or {}).get("fullname") if isinstance(e.get("args"), dict) else None
        if full is not None and left[full] > 0:
            left[full] -= 1
            out.skipped["timeline_display: the same op as an output_timeline_data row (read from there)"] += 1
        elif str(e.get("name", "")).startswith("stream_") or e.get("pid") == 10000:
            out.skipped["timeline_display: step-trace segment (step_trace_raw is read)"] += 1
        else:
            out.skipped["timeline_display: op not in output_timeline_data"] += 1


STEP_COLUMNS = ("step_num", "start_point", "end_point", "total", "iteration_interval", "fp_and_bp", "tail")


def _read_legacy_steps(file: Path, path: Path, out: Export) -> None:
    """step_trace_raw counts device cycles; the op timeline's first op starts at min_cycle_counter,
    which gives ns per cycle. Steps inside the op window become `ProfilerStep#N`; every step's
    parts become run_metrics."""
    rows = table(file, STEP_COLUMNS)
    per_cycle = _ns_per_cycle(path, out)
    window = out.window()
    for line, row in rows:
        out.read["step_trace_raw row"] += 1
        step = number(row["step_num"])
        if not isinstance(step, int):
            out.skipped["step_trace_raw row: the average row (`-`), not a step"] += 1
            continue
        if per_cycle is None:
            out.skipped["step_trace_raw row: no min_cycle_counter to convert cycles to ns"] += 1
            continue
        values = {c: number(row[c]) for c in STEP_COLUMNS[1:]}
        if not all(isinstance(v, int) for v in values.values()):
            out.skipped["step_trace_raw row: a point not an integer cycle count"] += 1
            continue
        args = orjson.dumps({"step": step, "source": file.name, "line": line}).decode()
        out.metrics += [(f"step_trace.{c}_ns", float(values[c] * per_cycle), "ns", args) for c in STEP_COLUMNS[3:]]
        start, end = values["start_point"] * per_cycle, values["end_point"] * per_cycle
        if window and start < window[1] and end > window[0]:
            out.rows.append(("user_annotation", "X", "step_trace", f"ProfilerStep#{step}", start, end - start,
                             None, None, None, None, None, None, None, None, args, None))  # fmt: skip
    _mark_read(out, path, file)


def _ns_per_cycle(path: Path, out: Export) -> int | None:
    files, _ = _legacy_files(path)
    counter = next(iter(sorted(path.glob("min_cycle_counter_*.txt"))), None)
    window = out.window()
    if counter is None or window is None:
        return None
    cycles = ns(counter.read_text().strip(), 1)
    _mark_read(out, path, counter)
    if not cycles or window[0] % cycles:
        return None
    return window[0] // cycles


def _read_aicore(file: Path, prefix: str, out: Export) -> None:
    key = "kernel_type" if prefix == "aicore_type" else "full_kernel_name"
    for line, row in table(file, (key, "execution_frequency")):
        out.read[f"{file.name.rsplit('_', 1)[0]} row"] += 1
        args = orjson.dumps({"source": file.name, "line": line, key: row[key]}).decode()
        time_col = "total_time" if prefix == "aicore_type" else "execution_time"
        value, count = number(row.get(time_col, "")), number(row["execution_frequency"])
        if not isinstance(value, (int, float)) or not isinstance(count, (int, float)):
            out.skipped[f"{file.name}: time or count not a number"] += 1
            continue
        out.metrics += [(f"{prefix}.{time_col}_ns", value * 1e6, "ns", args), (f"{prefix}.count", count, "count", args)]


def _read_timeline_summary(file: Path, out: Export) -> None:
    data = json_file(file)
    if not isinstance(data, dict):
        raise InputError(file, "byte 0", "a JSON object (timeline summary)")
    out.read["timeline_summary entry"] += len(data)
    for key, value in data.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            unit, scale = ("ns", 1000.0) if key.endswith("time") else ("count", 1.0)
            out.metrics.append((f"timeline_summary.{key}" + ("_ns" if unit == "ns" else ""), value * scale, unit,
                                orjson.dumps({"source": file.name}).decode()))  # fmt: skip
        else:
            out.skipped["timeline_summary entry: not a number"] += 1
