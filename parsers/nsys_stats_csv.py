"""`nsys stats --format csv` trace reports -> the same event rows as an Nsight Systems export.

Supported reports (the ones with one row per event): `nvtx_pushpop_trace` / `nvtx_startend_trace`
(NVTX ranges: `Start (ns)`, `End (ns)`, `Name`, `PID`, `TID`, nesting columns) become
user_annotation events on their thread; `cuda_gpu_trace` (`Start (ns)`, `Duration (ns)`, `CorrId`,
grid/block columns, `Device`, `Strm`, `Name`) becomes kernels and memcpys/memsets. Summary reports
(`*_sum`) have no events and are refused with a line naming what is supported. Times are ns from
the start of the capture, as nsys writes them.
"""

from __future__ import annotations

import csv
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.errors import InputError
from tracekit.parsers.csv_records import records
from tracekit.parsers.rows import Export

FORMAT = "nsys_stats_csv"
DESCRIPTION = "nsys stats CSV trace report"


def _header(head: bytes) -> str:
    text = head[:4096].decode("utf-8", "ignore")
    return next((line for line in text.splitlines() if line.strip()), "")


def sniff(head: bytes, name: str, **_) -> bool:
    """A CSV whose first line is an nsys stats header (`Start (ns),...`)."""
    return _header(head).lstrip('"').startswith("Start (ns)")


def _int(value: str):
    value = (value or "").strip().replace(",", "")
    try:
        return int(float(value)) if value else None
    except (ValueError, OverflowError):  # text, NaN or infinite: no count
        return None


def read(path: Path, **_) -> Export:
    path = Path(path)
    data = compression.read_bytes(path)
    rows = records(path, data.decode("utf-8", "replace"), as_dicts=True)
    header = set(rows[0]) if rows else set(next(csv.reader([_header(data)]), []))
    out = Export(source=path, format=FORMAT, bytes_read=len(data))
    if {"Start (ns)", "End (ns)", "Name", "PID", "TID"} <= header:
        report = "nvtx_trace"
    elif {"Start (ns)", "Duration (ns)", "Name"} <= header and ("CorrId" in header or "GrdX" in header):
        report = "cuda_gpu_trace"
    else:
        raise InputError(
            path, "line 1", "expected an nsys stats trace report (nvtx_pushpop_trace, nvtx_startend_trace or "
            "cuda_gpu_trace, exported with --format csv); summary reports hold no events",
        )  # fmt: skip
    out.notes = {"report": report, "clock": "ns from the start of the capture, as nsys stats writes them"}
    known = {"Start (ns)", "End (ns)", "Duration (ns)", "Name", "PID", "TID", "CorrId", "Device", "Strm"}
    for line_no, r in enumerate(rows, start=2):
        out.read[report] += 1
        if None in r:  # DictReader's key for the fields beyond the header's
            out.skipped["row with more fields than the header"] += 1
            continue
        start = _int(r.get("Start (ns)"))
        end = _int(r.get("End (ns)"))
        dur = _int(r.get("Duration (ns)")) if r.get("Duration (ns)") not in (None, "") else (
            end - start if start is not None and end is not None else None
        )  # fmt: skip
        if start is None or dur is None or dur < 0:
            out.skipped["row without a start and a duration"] += 1
            continue
        args = {k: v for k, v in r.items() if k not in known and v not in (None, "")}
        extra = orjson.dumps({"nsys_report": report, "line": line_no}).decode()
        if report == "nvtx_trace":
            pid, tid = _int(r.get("PID")), _int(r.get("TID"))
            out.rows.append(("user_annotation", "X", "nvtx", r.get("Name"), start, dur, pid, tid, None, None, None,
                             None, None, None, orjson.dumps(args).decode(), extra))  # fmt: skip
            continue
        name = r.get("Name") or ""
        kind = "gpu_memcpy" if "[CUDA memcpy" in name else "gpu_memset" if "[CUDA memset" in name else "kernel"
        device, stream = _int(r.get("Device", "").split()[-1] if r.get("Device") else None), _int(r.get("Strm"))
        grid = [_int(r.get(k)) for k in ("GrdX", "GrdY", "GrdZ")]
        block = [_int(r.get(k)) for k in ("BlkX", "BlkY", "BlkZ")]
        if kind == "kernel" and all(v is not None for v in grid + block):
            args.update({"grid": grid, "block": block})
        out.rows.append((kind, "X", kind, name, start, dur, device, stream, None, device, stream,
                         _int(r.get("CorrId")), None, None, orjson.dumps(args).decode(), extra))  # fmt: skip
    out.notes["rows_read"] = dict(out.read)
    return out
