"""A trace with tracekit's findings on it: the original Chrome-trace JSON plus a "tracekit findings" track.

The original file is copied byte for byte (decompressed as it streams, never loaded as Python objects)
except that new events go in before the `]` that closes `traceEvents`: metadata naming the process
and its threads "tracekit findings", and one complete (X) slice per finding window, its args holding
the finding. Slices that overlap go on separate threads of that process (lanes), since a trace viewer
nests the slices of one thread and overlapping ones would be cut. Times go back onto the file's own
clock: tracekit stores `ts_ns = baseTimeNanoseconds + ts * 1000`, so `ts = (ts_ns - base) / 1000`,
written as an exact decimal (never through a float). An input that is not Chrome JSON (an Nsight
Systems export, ...) becomes a fresh Chrome JSON written from the database, then annotated the same way.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.errors import InputError
from tracekit.parsers import json_array
from tracekit.parsers.json_array import WS, find_array_start, first_char, split_tail

TRACK_NAME = "tracekit findings"
CATEGORY = "tracekit"
CHUNK = 4 << 20


def ns_to_us_text(ns: int) -> str:
    """Exact decimal microseconds for an integer of nanoseconds: 1234567 -> '1234.567'."""
    ns = int(ns)
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(ns), 1000)
    return f"{sign}{q}" if r == 0 else f"{sign}{q}.{r:03d}"


def finding_events(findings: list[dict], base_ns: int, pid: int) -> tuple[list[bytes], int]:
    """(Chrome-trace events as JSON bytes, number of lanes) for the findings that carry a window."""
    windowed = []
    for f in findings:
        w = f.get("locality", {}).get("window_ns")
        if isinstance(w, (list, tuple)) and len(w) == 2 and w[0] is not None and w[1] is not None:
            windowed.append((int(w[0]), int(w[1]), f))
    windowed.sort(key=lambda x: (x[0], -x[1]))
    lane_ends: list[int] = []
    slices = []
    for lo, hi, f in windowed:
        lane = next((i for i, end in enumerate(lane_ends) if end <= lo), None)
        if lane is None:
            lane_ends.append(hi)
            lane = len(lane_ends) - 1
        else:
            lane_ends[lane] = hi
        slices.append((lo, hi, lane, f))
    events = [
        orjson.dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": TRACK_NAME}}),
        orjson.dumps({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}}),
    ]
    for i in range(len(lane_ends)):
        name = TRACK_NAME if i == 0 else f"{TRACK_NAME} ({i + 1})"
        events.append(
            orjson.dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": i + 1, "args": {"name": name}})
        )
    for lo, hi, lane, f in slices:
        args = {
            "id": f.get("id"),
            "rule": f.get("rule"),
            "severity": f.get("severity"),
            "title": f.get("title"),
            "next_experiment": f.get("next_experiment"),
            "evidence_sql": (f.get("evidence") or {}).get("sql"),
            "finding": f,
        }
        head = {
            "ph": "X",
            "cat": CATEGORY,
            "name": f"[{f.get('severity')}] {f.get('title')}",
            "pid": pid,
            "tid": lane + 1,
        }
        # ts and dur are written as decimal text: a float would round absolute microseconds with a ns fraction
        body = orjson.dumps(head, default=str)[:-1]
        body += b',"ts":' + ns_to_us_text(lo - base_ns).encode() + b',"dur":' + ns_to_us_text(hi - lo).encode()
        body += b',"args":' + orjson.dumps(args, default=str) + b"}"
        events.append(body)
    return events, len(lane_ends)


# --------------------------------------------------------------------------------------------- streaming


def _open_out(tmp: Path, out: Path):
    return gzip.open(tmp, "wb", compresslevel=6) if out.name.endswith(".gz") else open(tmp, "wb")


def copy_with_events(src: Path, out: Path, events: list[bytes]) -> None:
    """Stream src to out, inserting events before the `]` that closes the traceEvents array."""
    tmp = out.with_name(out.name + ".partial")
    head = b""
    array_start = None  # source offset of the array's '['
    written = 0  # source bytes already written
    pending = b""  # source bytes from `written` on, held back until we know they are not the tail
    total = 0
    object_form = None
    try:
        with _open_out(tmp, out) as w:
            for data in compression.chunks(src, CHUNK):
                total += len(data)
                if array_start is None:
                    head += data
                    if object_form is None:
                        kind = first_char(head[:CHUNK])
                        if not kind:
                            continue
                        if kind not in (b"{", b"["):
                            raise InputError(src, "byte 0", "expected a JSON object or array (a Chrome trace)")
                        object_form = kind == b"{"
                    found = find_array_start(head, src) if object_form else head.index(b"[")
                    if found is None:
                        continue
                    array_start = found
                    data, pending = b"", head
                pending += data
                # keep the last TAIL_KEEP bytes after the '[' unwritten: the closing ']' is among them
                keep_from = max(array_start + 1, total - json_array.TAIL_KEEP)
                if keep_from > written:
                    cut = keep_from - written
                    w.write(pending[:cut])
                    pending, written = pending[cut:], keep_from
            if array_start is None:
                what = 'a "traceEvents" array in the trace object' if object_form else "a JSON object or array"
                raise InputError(src, f"byte {total}", f"expected {what}")
            tail = pending
            if object_form:
                close, _ = split_tail(tail, src, written)
                rest = tail[close:]
            else:
                # the JSON Array Format may end without ']' or with a trailing ',' (a trace cut at the end of
                # a write): insert after the last event and close the array
                close = len(tail.rstrip(WS).removesuffix(b"]").rstrip(WS).removesuffix(b",").rstrip(WS))
                if close and not tail[:close].endswith(b"}"):
                    raise InputError(src, f"byte {total}", "expected an event, ',' or ']' at the end of the array")
                rest = b"\n]\n"
            before = tail[:close]
            empty = written == array_start + 1 and not before.strip(WS)
            w.write(before)
            if events:
                w.write((b"\n" if empty else b",\n") + b",\n".join(events) + b"\n")
            w.write(rest)
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_from_database(con, run_id: int, out: Path, events: list[bytes]) -> int:
    """A fresh Chrome JSON of one run's events (times as stored: ns / 1000), plus `events`."""
    cur = con.execute(
        "SELECT ph, cat, name, ts_ns, dur_ns, coalesce(pid::VARCHAR, split_part(track, '/', 1)), "
        "coalesce(tid::VARCHAR, split_part(track, '/', 2)), args, flow_id FROM events WHERE run_id = ? "
        "AND kind <> 'runtime_event' ORDER BY event_id",
        [run_id],
    )
    tmp = out.with_name(out.name + ".partial")
    n = 0
    try:
        with _open_out(tmp, out) as w:
            w.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')
            first = True
            while rows := cur.fetchmany(50_000):
                for ph, cat, name, ts, dur, pid, tid, args, flow in rows:
                    e = {"ph": ph, "cat": cat, "name": name, "pid": _num(pid), "tid": _num(tid)}
                    if flow is not None:
                        e["id"] = flow
                    if args is not None:
                        e["args"] = orjson.loads(args)
                    body = orjson.dumps(e, default=str)[:-1]
                    if ts is not None:
                        body += b',"ts":' + ns_to_us_text(ts).encode()
                    if dur is not None:
                        body += b',"dur":' + ns_to_us_text(dur).encode()
                    w.write((b"" if first else b",\n") + body + b"}")
                    first = False
                    n += 1
            if events:
                w.write((b"" if first else b",\n") + b",\n".join(events))
            w.write(b"\n]}\n")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


def _num(x):
    try:
        return int(x)
    except (TypeError, ValueError):
        return x


def free_pid(con, run_id: int) -> int:
    """A process id no event of the run uses (numeric pids only: string pids cannot collide)."""
    row = con.execute("SELECT max(pid) FROM events WHERE run_id = ?", [run_id]).fetchone()
    return int(row[0] or 0) + 1


def annotate(con, run: dict, findings: list[dict], out: Path) -> dict:
    """Write the annotated trace of one ingested run; returns what was written."""
    out = Path(out)
    src = Path(run["source"])
    findings = [f for f in findings if f.get("locality", {}).get("run_id") in (None, run["run_id"])]
    pid = free_pid(con, run["run_id"])
    chrome = run["format"] in ("kineto", "chrome_json")  # runs.format values (docs/schema.md)
    base = int(run.get("base_time_ns") or 0) if chrome else 0
    events, lanes = finding_events(findings, base, pid)
    slices = len(events) - 2 - lanes
    if chrome:
        copy_with_events(src, out, events)
        copied = None
    else:
        copied = write_from_database(con, run["run_id"], out, events)
    return {
        "output": str(out),
        "source": str(src),
        "source_format": run["format"],
        "mode": "original events streamed" if chrome else "events written from the database",
        "events_written_from_database": copied,
        "findings": len(findings),
        "slices": slices,
        "lanes": lanes,
        "pid": pid,
    }
