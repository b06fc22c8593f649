"""Ascend PyTorch Profiler (torch_npu) text export -> event_rows of one run, in the shape of a Kineto trace.

Inputs: a rank folder holding `ASCEND_PROFILER_OUTPUT/` (torch_npu's `*_ascend_pt`, or a copy such as
`test_rank_N`) read as one input (`claims`), or one of its files alone (`sniff`): `trace_view.json`,
`kernel_details.csv`, `profiler_metadata.json`. A folder whose ASCEND_PROFILER_OUTPUT holds an
`ascend_pytorch_profiler_*.db` is left to the db reader (that export holds everything this one does).

Mapping of trace_view.json (a Chrome-trace array; processes named by `process_name` metadata):

- `Ascend Hardware` X (device tasks) -> `kernel`, pid = device, tid = stream (`Stream Id`, else the
  trace's tid), args as written (`Task Type`, `Model Id`, `Task Id`, ...).
- `CANN` X (`AscendCL@aclnnAdd`, `AscendCL@aclrtSynchronizeStream`, ...) -> `cuda_runtime` named by
  the call (`aclnnAdd`), the layer (`AscendCL`) and the raw name in args; pid = the Python process's
  (CANN events sit on the same OS threads under a pid of their own), so calls nest under their ops.
- `Python` X -> `cpu_op` (`ProfilerStep#N` -> `user_annotation`, `python_function` as itself);
  task-queue `Enqueue`/`Dequeue@...` keep their category as kind.
- `HCCL` X named `hcom_*` -> `kernel` (communication) on the device, group/dtype/count in the args
  the `collectives` view reads; HCCL's task-level events inside those ops are skipped.
- `Overlap Analysis` (computing / communication / free bands the profiler derived) -> skipped, and
  summed per step into run_metrics (`overlap_*`), never kernels or busy time.
- Flows: `HostToDevice` (CANN launch call -> device task) -> the call and the task get the flow id
  as `correlation`, so `launches` pairs them; `async_npu` (`torch_to_npu`: framework op -> device
  task) -> the op and the task get it as `external_id`; every flow event is also kept as `flow`.
- `ph C` -> `counter`, `ph M` -> `metadata`.

Timestamps are epoch microseconds written as decimal strings; they are parsed as decimals, so ns
are exact. kernel_details.csv rows add their PMU and launch columns to the matching kernels (name
+ start), or are the kernels when there is no trace_view.json; step_trace_time.csv and
communication(_matrix).json go to run_metrics. See docs/schema.md, "Ascend text exports".
"""

from __future__ import annotations

import bisect
import csv
import io
import re
from collections import Counter, defaultdict
from decimal import Decimal, InvalidOperation
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.errors import InputError
from tracekit.parsers.rows import Export

FORMAT = "ascend_text"
DESCRIPTION = "Ascend PyTorch Profiler text export (trace_view.json, kernel_details.csv, profiler_metadata.json)"

OUTPUT = "ASCEND_PROFILER_OUTPUT"
TRACE = "trace_view.json"
KERNELS = "kernel_details.csv"
STEPS = "step_trace_time.csv"
COMM = "communication.json"
MATRIX = "communication_matrix.json"
METADATA = "profiler_metadata.json"
DB = re.compile(r"^ascend_pytorch_profiler(_\d+)?\.db$")
INFO = re.compile(r"^profiler_info(_\d+)?\.json$")

SNIFF_BYTES = 1 << 16
STRING_TS = re.compile(rb'"ts"\s*:\s*"-?\d')
ASCEND_PROCESS = re.compile(rb'"name"\s*:\s*"(Ascend Hardware|CANN)"')
# what only torch_npu's merged trace has (msprof's own timeline JSON has the device and CANN
# processes but no framework side, and numeric ts): a Python process, torch_to_npu flows, AscendCL@
TORCH_SIDE = re.compile(rb'"name"\s*:\s*"Python"|"async_npu"|"torch_to_npu"|"AscendCL@|"cat"\s*:\s*"cpu_op"')
KERNEL_HEADER = {"Step Id", "Model ID", "Task ID", "Stream ID", "Type", "Accelerator Core", "Start Time(us)",
                 "Duration(us)", "Wait Time(us)", "Block Dim", "Block Num"}  # fmt: skip
KERNEL_HEADER_MIN = 5
KERNEL_REQUIRED = ("Name", "Start Time(us)", "Duration(us)")
METADATA_KEYS = (b'"distributed_args"', b'"parallel_group_info"')

OVERLAP_REASON = "profiler-derived overlap band (summed per step into run_metrics)"
HCCL_TASK_REASON = "HCCL task inside a communication op (the op is the kernel)"
ROUNDED_REASON = (
    "time rounded to a coarser unit than 1 us (e.g. 1.69512E+15: re-saved by a spreadsheet), no place on a timeline"  # noqa: E501
)
NA = ("", "N/A", "NA", "None")
# kernel_details.csv writes N/A as the stream of an HCCL op; the rules key device lanes by stream, so
# those ops share one lane of their own (no Ascend stream id is negative)
NO_STREAM = -1


# --- recognising inputs ---


def sniff(head: bytes, name: str, **_) -> bool:
    """trace_view.json (Chrome JSON with string ts, or Ascend processes beside a framework side),
    kernel_details.csv (its header) or profiler_metadata.json (its keys)."""
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    sample = head[: 1 << 20]
    if start == b"[" or (start == b"{" and b'"traceEvents"' in sample[:SNIFF_BYTES]):
        return STRING_TS.search(sample) is not None or (
            ASCEND_PROCESS.search(sample) is not None and TORCH_SIDE.search(sample) is not None
        )
    if start == b"{":
        return any(k in sample[:SNIFF_BYTES] for k in METADATA_KEYS) and b'"traceEvents"' not in sample
    return _kernel_header(head) is not None


def _kernel_header(head: bytes) -> list[str] | None:
    """The header when it is kernel_details.csv's: a Name column and most of the task columns (one
    missing is the file's error to report, not another format)."""
    line = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    cells = {c.strip() for c in line.split(",")}
    return sorted(cells) if "Name" in cells and len(cells & KERNEL_HEADER) >= KERNEL_HEADER_MIN else None


def claims(folder: Path) -> bool:
    """A rank folder holding ASCEND_PROFILER_OUTPUT/ with trace_view.json or kernel_details.csv and no
    ascend_pytorch_profiler_*.db (the db export is preferred where present), or that output folder."""
    try:
        folder = Path(folder)
        out = folder if folder.name == OUTPUT else folder / OUTPUT
        if not out.is_dir():
            return False
        names = {p.name for p in out.iterdir()}
        return bool(names & {TRACE, KERNELS}) and not any(DB.match(n) for n in names)
    except OSError:
        return False


# --- times ---


def us_to_ns(value) -> int | None:
    """Microseconds as written (a decimal string, or a JSON number) -> ns; a string exactly, rounded
    half to even below 1 ns. None for what is no time."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, float):
        if value != value or abs(value) > 4e15:
            return None
        if abs(value) < 4e12:
            return round(value * 1000)
        whole = int(value)
        return whole * 1000 + round((value - whole) * 1000)
    text = str(value).strip()
    whole, dot, frac = text.partition(".")
    if dot and frac.isdigit() and (whole.isdigit() or (whole[:1] == "-" and whole[1:].isdigit())):
        ns = int(whole) * 1000 + (-1 if whole[:1] == "-" else 1) * int((frac + "000")[:3])
        if len(frac) > 3 and frac[3:].strip("0"):
            return int((Decimal(text) * 1000).to_integral_value())
        return ns
    if text.isdigit() or (text[:1] == "-" and text[1:].isdigit()):
        return int(text) * 1000
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return int((number * 1000).to_integral_value()) if number.is_finite() else None


def coarse(text: str) -> bool:
    """A time written with less than 1 us resolution (`1.69512E+15`)."""
    try:
        exponent = Decimal(str(text).strip()).as_tuple().exponent
    except InvalidOperation:
        return False
    return isinstance(exponent, int) and exponent > 0


def _dur_ns(value) -> int | None:
    ns = us_to_ns(value)
    return ns if ns is not None and ns >= 0 else None


def _number(text: str):
    """A CSV cell as a number where it is one, else the text; None for N/A."""
    text = text.strip()
    if text in NA:
        return None
    try:
        number = float(text)
    except ValueError:
        return text.strip('"')
    if number != number or number in (float("inf"), float("-inf")):
        return text
    return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number


# --- reading ---


def read(path: Path, **_) -> Export:
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    data = compression.read_bytes(path)
    head = data[: 1 << 20]
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    out = Export(source=path, format=FORMAT, bytes_read=len(data))
    if start == b"{" and b'"traceEvents"' not in head[:SNIFF_BYTES]:
        _metadata_file(path, data, out)
        out.notes["clock"] = "no events: profiler metadata only"
        return out
    if start in (b"[", b"{"):
        trace = _Trace(out, device=0)
        trace.load(path, data, TRACE)
        trace.finish()
        out.notes["device"] = "device 0 assumed: trace_view.json does not record the device id"
        return out
    kernels = _kernel_rows(path, data, KERNELS, out)
    _kernel_timeline(kernels, out, KERNELS)
    return out


def _read_folder(folder: Path) -> Export:
    root = folder.parent if folder.name == OUTPUT else folder
    output = root / OUTPUT
    out = Export(source=folder, format=FORMAT)
    files = sorted(p for p in output.iterdir() if p.is_file())
    names = {p.name: p for p in files}
    _rank(root, output, out)
    kernels = None
    device = 0
    if KERNELS in names:
        kernels = _kernel_rows(names[KERNELS], compression.read_bytes(names[KERNELS]), KERNELS, out)
        device = next((k["device"] for k in kernels if k["device"] is not None), 0)
    if TRACE in names:
        trace = _Trace(out, device)
        trace.load(names[TRACE], compression.read_bytes(names[TRACE]), TRACE)
        if kernels is not None:
            trace.enrich(kernels, KERNELS)
        trace.finish()
    elif kernels is not None:
        _kernel_timeline(kernels, out, KERNELS)
    readers = {STEPS: _step_trace, COMM: _communication, MATRIX: _matrix, "operator_details.csv": _not_read,
               "memory_record.csv": _memory_record, "operator_memory.csv": _not_read, "op_statistic.csv": _not_read}  # fmt: skip
    for file in files:
        if file.name in (TRACE, KERNELS):
            continue
        reader = readers.get(file.name)
        if reader is not None:
            reader(file, out, device)
        elif file.suffix == ".csv":
            _not_read(file, out, device)
        else:
            out.notes.setdefault("files_not_read", []).append(f"{OUTPUT}/{file.name}")
    return out


def _rank(root: Path, output: Path, out: Export) -> None:
    """Rank from profiler_info_N.json (`rank_id`), else profiler_metadata.json (`distributed_args`);
    world size from profiler_metadata.json, else the job's msprof-analyze communication groups."""
    for info in sorted(p for p in root.iterdir() if p.is_file() and INFO.match(p.name)):
        obj = _json_object(info, compression.read_bytes(info))
        out.metadata.setdefault("profiler_info", {})[info.name] = obj
        if isinstance(obj.get("rank_id"), int) and obj["rank_id"] >= 0 and out.rank is None:
            out.rank, out.rank_source = obj["rank_id"], f"{info.name} rank_id"
    for meta in (root / METADATA, output / METADATA):
        if meta.is_file():
            _metadata_file(meta, compression.read_bytes(meta), out)
    if out.world_size is None:
        _world_from_cluster(root, out)


def _metadata_file(path: Path, data: bytes, out: Export) -> None:
    obj = _json_object(path, data)
    out.metadata["profiler_metadata"] = obj
    dist = obj.get("distributed_args") if isinstance(obj.get("distributed_args"), dict) else {}
    if isinstance(dist.get("rank"), int) and out.rank is None:
        out.rank, out.rank_source = dist["rank"], f"{path.name} distributed_args.rank"
    if isinstance(dist.get("world_size"), int) and dist["world_size"] > 0:
        out.world_size = dist["world_size"]
        out.notes["world_size_source"] = f"{path.name} distributed_args.world_size"


def _world_from_cluster(root: Path, out: Export) -> None:
    """msprof-analyze writes cluster_analysis_output/ beside the rank folders; its communication groups
    list every rank of the job, which no file of a rank folder states. Read for the world size only."""
    groups = root.parent / "cluster_analysis_output" / "communication_group.json"
    try:
        obj = orjson.loads(groups.read_bytes()) if groups.is_file() else None
    except (OSError, orjson.JSONDecodeError):
        return
    ranks = {r for lists in (obj or {}).values() if isinstance(lists, list)
             for group in lists if isinstance(group, list) for r in group if isinstance(r, int)}  # fmt: skip
    if ranks and (out.rank is None or out.rank in ranks):
        out.world_size = max(ranks) + 1
        out.notes["world_size_source"] = "../cluster_analysis_output/communication_group.json (largest rank + 1)"


def _json_object(path: Path, data: bytes) -> dict:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise InputError(path, f"byte {e.pos}", f"expected well-formed JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise InputError(path, "byte 0", "expected a JSON object")
    return obj


# --- trace_view.json ---


class _Trace:
    """The rows of one trace_view.json, built in file order; flows pair their ends afterwards."""

    def __init__(self, out: Export, device: int):
        self.out, self.device = out, device
        self.rows: list[list] = []  # ROW_FIELDS order, args a dict until finish()
        self.kernels: dict[tuple, int] = {}  # (name, ts_ns) -> row index
        self.flow_ends: dict[tuple, list] = defaultdict(list)  # (cat, id) -> [(ph, pid, tid, ts_ns)]
        self.bands: list[tuple] = []  # (band name, ts_ns, dur_ns)
        self.label = TRACE
        self.processes: dict = {}
        self.host_pid = None

    def load(self, path: Path, data: bytes, label: str) -> None:
        self.label = label
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise InputError(path, f"byte {e.pos}", f"expected a well-formed trace_view.json ({e.msg})") from None
        events = doc.get("traceEvents") if isinstance(doc, dict) else doc
        if not isinstance(events, list):
            raise InputError(path, "byte 0", 'expected a trace event array (or an object with a "traceEvents" array)')
        self.processes = {e.get("pid"): e.get("args", {}).get("name") for e in events
                          if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name"
                          and isinstance(e.get("args"), dict)}  # fmt: skip
        pythons = [pid for pid, name in self.processes.items() if name == "Python"]
        self.host_pid = pythons[0] if len(pythons) == 1 else None
        read = self.out.read
        for event in events:
            read[f"{label} event"] += 1
            reason = self._event(event)
            if reason:
                self.out.skipped[f"{label}: {reason}"] += 1
        self.out.notes["processes"] = {str(k): v for k, v in self.processes.items()}

    def _event(self, e) -> str | None:
        if not isinstance(e, dict):
            return "not a JSON object"
        ph, pid, tid = e.get("ph"), e.get("pid"), e.get("tid")
        process = self.processes.get(pid)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        name = e.get("name") if isinstance(e.get("name"), str) else None
        if not isinstance(ph, str):
            return "missing ph"
        if process == "Overlap Analysis":
            if ph == "X":
                self.bands.append((name, us_to_ns(e.get("ts")), _dur_ns(e.get("dur"))))
            return OVERLAP_REASON
        if ph == "M":
            if process in ("Ascend Hardware", "HCCL"):
                pid = self.device
            self._row("metadata", "M", None, name, None, None, pid, tid, args)
            return None
        ts = us_to_ns(e.get("ts"))
        if ts is None:
            return "missing ts"
        if ph in ("s", "t", "f"):
            return self._flow(e, ph, pid, tid, ts, args)
        if ph == "C":
            self._row("counter", "C", e.get("cat"), name, ts, None, pid, tid, args)
            return None
        if ph != "X":
            kind = "instant" if ph in ("i", "I") else "async" if ph in ("b", "e", "n") else "other"
            self._row(kind, ph, e.get("cat"), name, ts, None, pid, tid, args)
            return None
        dur = _dur_ns(e.get("dur"))
        if dur is None:
            return "complete event without a duration"
        if process == "Ascend Hardware":
            return self._task(name, ts, dur, tid, args)
        if process == "HCCL":
            if not (name or "").startswith("hcom_"):
                return HCCL_TASK_REASON
            return self._task(name, ts, dur, tid, _hccl_args(args), cat="hccl")
        if process == "CANN":
            layer, _, call = (name or "").rpartition("@")
            args = {**args, "CANN layer": layer, "raw name": name} if layer else args
            host = self.host_pid if self.host_pid is not None else pid
            self._row("cuda_runtime", "X", "cuda_runtime", call or name, ts, dur, host, tid, {**args, "trace pid": pid})
            return None
        cat = e.get("cat")
        kind = "cpu_op" if cat in (None, "cpu_op") else cat.lower() if isinstance(cat, str) else "other"
        if name and name.startswith("ProfilerStep#"):
            kind = "user_annotation"
        self._row(kind, "X", cat, name, ts, dur, pid, tid, args)
        return None

    def _task(self, name, ts, dur, tid, args, cat="kernel") -> None:
        stream = args.get("Stream Id", args.get("stream id", tid))
        stream = stream if isinstance(stream, int) else tid if isinstance(tid, int) else None
        index = len(self.rows)
        self._row("kernel", "X", cat, name, ts, dur, self.device, stream, args, device=self.device, stream=stream)
        self.kernels.setdefault((name, ts), index)

    def _flow(self, e, ph, pid, tid, ts, args) -> None:
        cat = e.get("cat")
        try:
            flow_id = int(e.get("id"))
        except (TypeError, ValueError):
            flow_id = None
        if flow_id is not None and cat in ("HostToDevice", "async_npu"):
            self.flow_ends[(cat, flow_id)].append((ph, pid, tid, ts))
        row = self._row("flow", ph, cat, e.get("name"), ts, None, pid, tid, args)
        row[13] = flow_id
        return None

    def _row(self, kind, ph, cat, name, ts, dur, pid, tid, args, device=None, stream=None) -> list:
        pid = pid if isinstance(pid, int) else None
        tid = tid if isinstance(tid, int) else None
        row = [kind, ph, cat, name, ts, dur, pid, tid, None, device, stream, None, None, None, args, None]
        self.rows.append(row)
        return row

    def enrich(self, kernels: list[dict], label: str) -> None:
        """kernel_details.csv rows add their columns to the device task of the same name and start."""
        matched = 0
        for k in kernels:
            index = self.kernels.get((k["name"], k["ts"])) if k["ts"] is not None else None
            if index is None:
                self.out.skipped[f"{label}: row with no device task of its name and start in {TRACE}"] += 1
                continue
            args = self.rows[index][14]
            args.update({key: v for key, v in k["args"].items() if key not in args})
            matched += 1
        self.out.notes["kernel_details_matched"] = f"{matched} of {len(kernels)} rows matched a device task"

    def finish(self) -> None:
        self._pair()
        self._overlap_metrics()
        for row in self.rows:
            row[14] = orjson.dumps(row[14], option=orjson.OPT_NON_STR_KEYS).decode() if row[14] else None
            self.out.rows.append(tuple(row))
        self.out.notes["clock"] = "epoch ns = ts (epoch us, decimal strings parsed exactly) * 1000"

    def _pair(self) -> None:
        """HostToDevice flows give the CANN call that holds their start and the task at their end the
        flow id as correlation; async_npu flows give the framework op and the task it as external_id."""
        threads: dict[tuple, list] = defaultdict(list)  # (trace pid, tid) -> (ts, row index) of host events
        tasks: dict[tuple, int] = {}  # (stream, ts) -> kernel row index
        for i, r in enumerate(self.rows):
            if r[0] == "kernel":
                tasks.setdefault((r[7], r[4]), i)
            elif r[1] == "X":
                pid = r[14].get("trace pid", r[6]) if r[0] == "cuda_runtime" else r[6]
                threads[(pid, r[7])].append((r[4], i))
        for events in threads.values():
            events.sort()
        paired = Counter()
        for (cat, flow_id), ends in self.flow_ends.items():
            starts = [x for x in ends if x[0] == "s"]
            finishes = [x for x in ends if x[0] == "f"]
            if len(starts) != 1 or len(finishes) != 1:
                continue
            _, pid, tid, ts = starts[0]
            task = tasks.get((finishes[0][2], finishes[0][3]))
            host = self._enclosing(threads.get((pid, tid), []), ts, cat == "HostToDevice")
            if task is None or host is None:
                continue
            column = 11 if cat == "HostToDevice" else 12
            # a call (an op) that launched several tasks gives them all its first flow's id
            if self.rows[host][column] is None:
                self.rows[host][column] = flow_id
            self.rows[task][column] = self.rows[host][column]
            paired[cat] += 1
        self.out.notes["flows_paired"] = {"HostToDevice (call -> task, correlation)": paired["HostToDevice"],
                                          "async_npu (op -> task, external_id)": paired["async_npu"]}  # fmt: skip

    def _enclosing(self, events: list[tuple], ts: int, runtime: bool) -> int | None:
        """The innermost host event of the thread holding `ts` (the latest start at or before it that
        has not ended): a CANN call for a HostToDevice flow, a framework event for async_npu."""
        at = bisect.bisect_right(events, (ts, len(self.rows)))
        for start, i in reversed(events[max(0, at - 64) : at]):
            r = self.rows[i]
            if (r[0] == "cuda_runtime") == runtime and start <= ts <= start + r[5]:
                return i
        return None

    def _overlap_metrics(self) -> None:
        """The profiler's own computing / communication / free bands, summed within each ProfilerStep
        window, for the cross-check against the steps view (step_trace_time.csv is the same sums)."""
        if not self.bands:
            return
        steps = [(r[3], r[4], r[4] + r[5]) for r in self.rows if r[0] == "user_annotation" and r[5]]
        names = {"Computing": "overlap_computing", "Communication(Not Overlapped)": "overlap_comm_not_overlapped",
                 "Communication": "overlap_comm", "Free": "overlap_free"}  # fmt: skip
        for step, start, end in steps:
            sums: Counter = Counter()
            for band, ts, dur in self.bands:
                if band in names and ts is not None and dur is not None:
                    sums[band] += max(0, min(end, ts + dur) - max(start, ts))
            number = step.split("#", 1)[1]
            for band, metric in names.items():
                args = {"step": number, "source": f"{self.label} Overlap Analysis {band!r} events in {step}"}
                self.out.metrics.append((metric, float(sums[band]), "ns", orjson.dumps(args).decode()))


def _hccl_args(args: dict) -> dict:
    """The HCCL op's parameters under the keys the collectives view reads, where the trace has them."""
    out = dict(args)
    for keys, target in ((("group_name", "Group Name", "groupName", "group"), "Process Group Name"),
                         (("data_type", "Data Type", "dtype"), "dtype"),
                         (("count", "Count", "Input Count"), "In msg nelems")):  # fmt: skip
        value = next((args[k] for k in keys if k in args), None)
        if value is not None and target not in out:
            out[target] = value
    return out


# --- kernel_details.csv ---


def _csv(path: Path, data: bytes, label: str, required: tuple = ()) -> tuple[list[str], list[tuple[int, list]]]:
    """Header and (line, cells) of a CSV; InputError for a required column missing or a ragged row."""
    text = data.decode("utf-8-sig", "replace")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [c.strip() for c in next(reader)]
    except StopIteration:
        raise InputError(path, "line 1", f"expected the header of {label}") from None
    except csv.Error as e:
        raise InputError(path, "line 1", f"expected a CSV header ({e})") from None
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(path, "line 1", f"expected a {label} header with columns {', '.join(missing)}")
    rows = []
    try:
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise InputError(path, f"line {reader.line_num}", f"expected {len(header)} columns, got {len(cells)}")
            rows.append((reader.line_num, cells))
    except csv.Error as e:
        raise InputError(path, f"line {reader.line_num}", f"expected well-formed CSV ({e})") from None
    return header, rows


def _kernel_rows(path: Path, data: bytes, label: str, out: Export) -> list[dict]:
    """Every row of kernel_details.csv as {name, ts, dur, stream, device, step, args}; `ts` None for a
    start time with no place on a timeline."""
    header, rows = _csv(path, data, label, KERNEL_REQUIRED)
    col = {name: i for i, name in enumerate(header)}
    kernels = []
    rounded = 0
    for line, cells in rows:
        out.read[f"{label} row"] += 1
        start = cells[col["Start Time(us)"]].strip()
        ts = None if coarse(start) else us_to_ns(start)
        rounded += coarse(start)
        dur = _dur_ns(cells[col["Duration(us)"]].strip())
        if dur is None and not coarse(start):
            raise InputError(path, f"line {line}", "expected a duration in Duration(us)")
        args = {h: v for h, c in zip(header, cells) if h not in ("Start Time(us)", "Duration(us)")
                and (v := _number(c)) is not None}  # fmt: skip
        args["Start Time(us)"] = start
        stream = args.get("Stream ID")
        if stream is None and args.get("Accelerator Core") == "HCCL":
            stream = NO_STREAM
        device = args.get("Device_id", args.get("Device ID"))
        kernels.append({"name": cells[col["Name"]].strip(), "ts": ts, "dur": dur, "line": line,
                        "stream": stream if isinstance(stream, int) else None,
                        "device": device if isinstance(device, int) else None, "step": args.get("Step Id"),
                        "args": args})  # fmt: skip
    if rounded:
        out.notes[f"{label} start times"] = (
            f"{rounded} of {len(kernels)} rounded (e.g. 1.69512E+15): those rows are not on the timeline"  # noqa: E501
        )
    return kernels


def _kernel_timeline(kernels: list[dict], out: Export, label: str) -> None:
    """Without trace_view.json the rows are the device timeline, and each Step Id a ProfilerStep#N
    annotation from its first kernel's start to its last kernel's end."""
    spans: dict = {}
    for k in kernels:
        if k["ts"] is None:
            out.skipped[f"{label}: {ROUNDED_REASON}"] += 1
            continue
        device = k["device"] if k["device"] is not None else 0
        args = orjson.dumps(k["args"]).decode()
        cat = "hccl" if k["args"].get("Accelerator Core") == "HCCL" else "kernel"
        out.rows.append(("kernel", "X", cat, k["name"], k["ts"], k["dur"], device, k["stream"], None, device,
                         k["stream"], None, None, None, args, None))  # fmt: skip
        if isinstance(k["step"], int):
            first, last = spans.get(k["step"], (k["ts"], k["ts"] + k["dur"]))
            spans[k["step"]] = (min(first, k["ts"]), max(last, k["ts"] + k["dur"]))
    for step, (first, last) in sorted(spans.items()):
        args = orjson.dumps({"source": f"{label} Step Id {step}", "window": "first kernel start to last kernel end"})
        out.rows.append(("user_annotation", "X", "user_annotation", f"ProfilerStep#{step}", first, last - first,
                         None, None, f"{label} steps", None, None, None, None, None, args.decode(), None))  # fmt: skip
    out.notes["clock"] = f"epoch ns = {label} Start Time(us) (decimal text parsed exactly) * 1000"
    out.notes["device"] = "device from the Device_id column" if any(k["device"] is not None for k in kernels) else (
        f"device 0 assumed: {label} has no Device_id column")  # fmt: skip
    if spans:
        out.notes["steps"] = f"{len(spans)} ProfilerStep#N annotations made from {label} Step Id (no host timeline)"


# --- the other files of ASCEND_PROFILER_OUTPUT ---

STEP_COLUMNS = {"Computing": "step_computing", "Communication(Not Overlapped)": "step_comm_not_overlapped",
                "Overlapped": "step_overlapped", "Communication": "step_comm", "Free": "step_free",
                "Stage": "step_stage", "Bubble": "step_bubble", "Preparing": "step_preparing",
                "Communication(Not Overlapped and Exclude Receive)": "step_comm_not_overlapped_exclude_receive"}  # fmt: skip


def _step_trace(path: Path, out: Export, _device) -> None:
    """One row per step: its components (us) as run_metrics in ns, args naming the step and the column."""
    header, rows = _csv(path, compression.read_bytes(path), STEPS, ("Step",))
    for line, cells in rows:
        out.read[f"{STEPS} row"] += 1
        row = dict(zip(header, (c.strip() for c in cells)))
        extra = {k: row[k] for k in ("Type", "Index", "Device_id") if k in row}
        for column, metric in STEP_COLUMNS.items():
            ns = us_to_ns(row.get(column, "")) if row.get(column, "") not in NA else None
            if ns is not None:
                args = {"step": row["Step"], "column": column, "source": STEPS, "line": line, **extra}
                out.metrics.append((metric, float(ns), "ns", orjson.dumps(args).decode()))


def _comm_op(name: str) -> dict:
    op, _, group = name.partition("@")
    kind = re.match(r"^hcom_([A-Za-z]+)", op)
    return {"op": op, "group": group or None, "collective": kind.group(1).lower() if kind else None}


def _communication(path: Path, out: Export, _device) -> None:
    """Per op of every step: its time components (ms -> ns) and, per transport that carried data, the
    size, time and bandwidth; the `Total Op Info` sums are skipped (the ops above them are read)."""
    obj = _json_object(path, compression.read_bytes(path))
    times = {"Elapse Time(ms)": "comm_elapse", "Transit Time(ms)": "comm_transit", "Wait Time(ms)": "comm_wait",
             "Synchronization Time(ms)": "comm_synchronization", "Idle Time(ms)": "comm_idle"}  # fmt: skip
    for step, kinds, name, op in _ops(path, obj, COMM, out):
        base = {"step": step, "type": kinds, "source": COMM, **_comm_op(name)}
        info = op.get("Communication Time Info") if isinstance(op.get("Communication Time Info"), dict) else {}
        for key, metric in times.items():
            if isinstance(info.get(key), (int, float)):
                out.metrics.append((metric, float(info[key]) * 1e6, "ns", orjson.dumps(base).decode()))
        if isinstance(info.get("Start Timestamp(us)"), (int, float)):
            base["start_us"] = info["Start Timestamp(us)"]
        bandwidth = op.get("Communication Bandwidth Info")
        for transport, link in bandwidth.items() if isinstance(bandwidth, dict) else ():
            if not isinstance(link, dict) or not link.get("Transit Size(MB)"):
                continue
            args = orjson.dumps({**base, "transport": transport}).decode()
            _link_metrics(link, args, out, "comm")


def _matrix(path: Path, out: Export, _device) -> None:
    """Per op and link (`src-dst` ranks): transport, size, time and bandwidth."""
    obj = _json_object(path, compression.read_bytes(path))
    for step, kinds, name, links in _ops(path, obj, MATRIX, out, unit="link"):
        for link_name, link in links.items():
            src, _, dst = link_name.partition("-")
            args = {"step": step, "type": kinds, "source": MATRIX, **_comm_op(name), "src_rank": _number(src),
                    "dst_rank": _number(dst), "transport": link.get("Transport Type")}  # fmt: skip
            _link_metrics(link, orjson.dumps(args).decode(), out, "comm_link")


def _ops(path: Path, obj: dict, label: str, out: Export, unit: str = "op"):
    """(step, p2p/collective, op name, op object) of a communication file; every op (or link, for the
    matrix) counted as read, the totals as skipped."""
    for step, kinds in obj.items():
        if not isinstance(kinds, dict):
            raise InputError(path, f"key {step!r}", f"expected {label}'s steps to hold p2p/collective objects")
        for kind, ops in kinds.items():
            if not isinstance(ops, dict):
                raise InputError(path, f"{step}.{kind}", "expected an object of communication ops")
            for name, op in ops.items():
                items = len(op) if unit == "link" and isinstance(op, dict) else 1
                out.read[f"{label} {unit}"] += items
                if not isinstance(op, dict):
                    out.skipped[f"{label}: {unit} that is not an object"] += items
                elif name == "Total Op Info":
                    out.skipped[f"{label}: Total Op Info (the sum of the ops read)"] += items
                else:
                    if unit == "link":
                        bad = [k for k, v in op.items() if not isinstance(v, dict)]
                        if bad:
                            out.skipped[f"{label}: link that is not an object"] += len(bad)
                        op = {k: v for k, v in op.items() if isinstance(v, dict)}
                    yield step, kind, name, op


def _link_metrics(link: dict, args: str, out: Export, prefix: str) -> None:
    for key, metric, unit, scale in (("Transit Size(MB)", "transit_size", "B", 1e6),
                                     ("Transit Time(ms)", "transit_time", "ns", 1e6),
                                     ("Bandwidth(GB/s)", "bandwidth", "GB/s", 1.0)):  # fmt: skip
        if isinstance(link.get(key), (int, float)):
            out.metrics.append((f"{prefix}_{metric}", float(link[key]) * scale, unit, args))


def _memory_record(path: Path, out: Export, _device) -> None:
    """Allocator totals over time -> `counter` events per component (`NPU memory PTA`, ...)."""
    label = path.name
    header, rows = _csv(path, compression.read_bytes(path), label, ("Component", "Timestamp(us)"))
    for _, cells in rows:
        out.read[f"{label} row"] += 1
        row = dict(zip(header, (c.strip() for c in cells)))
        stamp = row["Timestamp(us)"]
        ts = None if coarse(stamp) else us_to_ns(stamp)
        if ts is None:
            out.skipped[f"{label}: {ROUNDED_REASON if coarse(stamp) else 'timestamp that is no time'}"] += 1
            continue
        values = {k: v for k in ("Total Allocated(MB)", "Total Reserved(MB)", "Total Active(MB)")
                  if isinstance(v := _number(row.get(k, "")), (int, float))}  # fmt: skip
        name = f"NPU memory {row['Component']}" + (f" {row['Device Type']}" if row.get("Device Type") else "")
        out.rows.append(("counter", "C", "memory", name, ts, None, None, None, label, None, None, None, None, None,
                         orjson.dumps(values).decode(), None))  # fmt: skip


NOT_READ = {
    "operator_details.csv": "per-op host/device durations without timestamps (a summary of the trace's ops)",
    "operator_memory.csv": "per-allocation records of ops (sizes and lifetimes), no rule reads them",
    "op_statistic.csv": "per-op-type totals of the device tasks (derivable from the kernels)",
}


def _not_read(path: Path, out: Export, _device) -> None:
    """A CSV this reader does not map: its rows counted, as not read with the reason."""
    _, rows = _csv(path, compression.read_bytes(path), path.name)
    reason = NOT_READ.get(path.name, "a file of the export this reader does not map")
    out.read[f"{path.name} row"] += len(rows)
    out.skipped[f"{path.name}: not read: {reason}"] += len(rows)
