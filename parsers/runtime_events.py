"""Runtime-event logs (JSON Lines) -> event_rows of kind `runtime_event`.

One JSON object per line: `ts_ns` (integer epoch ns), `name` (string), optional `dur_ns` (integer
>= 0; absent or null for an instant), `pid`, `tid` (integers), `thread` (string); every other key is
kept, as written, in `args` (the event's attributes). Blank lines are ignored. A line that is not
valid JSON, not an object, or lacks/mistypes a required key is skipped and counted per reason;
nothing in a log is fatal except an unreadable file (missing, broken compression).

Lines are parsed one by one with orjson (every line is checked, so skips are counted exactly); orjson
turns integers beyond 64 bits into floats, so a line with such a number (a run of 20 digits, or 19
after a minus) is decoded again with the standard library's json, which keeps them exact.

Alignment: a log attached to a Kineto run is put on the trace's clock. Kineto `ts_ns` is already
epoch ns when the trace has `baseTimeNanoseconds`, but the two clocks still differ (Kineto derives
epoch time from its own steady clock, the log from whatever the writer used). Events the two sides
share - a complete runtime event and a Kineto `user_annotation` with the same name (paired k-th to
k-th occurrence, names whose counts differ are left out) - measure the offset; its median is
applied to every event of the log (see `align`) and the statistics go to `ingest_log.notes`.
A log with no trace to join is a run of its own (`runs.format = 'runtime_events'`).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.parsers.rows import Export

FORMAT = "runtime_events"
DESCRIPTION = "runtime-event JSONL"
ATTACHABLE = True
KIND = "runtime_event"
SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
KNOWN_KEYS = ("ts_ns", "dur_ns", "name", "thread", "pid", "tid")
SNIFF_BYTES = 1 << 16
INT64 = (-(1 << 63), (1 << 63) - 1)


def _reject_constant(value: str):
    raise ValueError(f"non-standard JSON constant {value}")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
BEYOND_INT64 = re.compile(rb"-\d{19}|\d{20}")


def _decode(raw: bytes):
    if BEYOND_INT64.search(raw):
        return _DECODER.decode(raw.decode("utf-8").strip())
    return orjson.loads(raw)


def _dumps(value) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sniff(head: bytes, name: str, **_) -> bool:
    """A .jsonl/.ndjson(.gz) name, or a first non-blank line that is a JSON object with ts_ns."""
    if name.lower().endswith(SUFFIXES):
        return True
    for line in head[:SNIFF_BYTES].splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return False  # a trace object spread over lines, or a line cut off by the sample
        return isinstance(obj, dict) and "ts_ns" in obj
    return False


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and INT64[0] <= v <= INT64[1]


def _check(obj) -> str | None:
    """The skip reason of one decoded line, or None when it is a valid event."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if "ts_ns" not in obj or obj["ts_ns"] is None:
        return "missing ts_ns"
    if "name" not in obj or obj["name"] is None:
        return "missing name"
    if not _is_int(obj["ts_ns"]):
        return "ts_ns not an integer"
    if not isinstance(obj["name"], str):
        return "name not a string"
    dur = obj.get("dur_ns")
    if dur is not None:
        if not _is_int(dur):
            return "dur_ns not an integer"
        if dur < 0:
            return "negative dur_ns"
    for key in ("pid", "tid"):
        if obj.get(key) is not None and not _is_int(obj[key]):
            return f"{key} not an integer"
    if obj.get("thread") is not None and not isinstance(obj["thread"], str):
        return "thread not a string"
    return None


def _row(obj: dict, lineno: int) -> tuple:
    attrs = {k: v for k, v in obj.items() if k not in KNOWN_KEYS}
    dur, tid, thread = obj.get("dur_ns"), obj.get("tid"), obj.get("thread")
    track = f"runtime_events/{thread}" if tid is None and thread is not None else "runtime_events"
    extra = {"line": lineno} if thread is None else {"line": lineno, "thread": thread}
    return (KIND, "i" if dur is None else "X", None, obj["name"], obj["ts_ns"], dur, obj.get("pid"), tid, track,
            None, None, None, None, None, _dumps(attrs) if attrs else None, _dumps(extra))  # fmt: skip


def read(path: Path, **_) -> Export:
    """Every line read and checked, in line order. Raises InputError only for an unreadable file."""
    path = Path(path)
    data = compression.read_bytes(path)
    out = Export(source=path, format=FORMAT, bytes_read=len(data), metadata=None)
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the newline that ends the last line
    blank = 0
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            blank += 1
            continue
        out.read["line"] += 1
        try:
            obj = _decode(raw[3:] if lineno == 1 and raw.startswith(b"\xef\xbb\xbf") else raw)
        except ValueError:  # orjson.JSONDecodeError and UnicodeDecodeError are ValueErrors
            out.skipped["malformed JSON"] += 1
            continue
        reason = _check(obj)
        if reason:
            out.skipped[reason] += 1
            continue
        out.rows.append(_row(obj, lineno))
    out.notes = _notes(out, blank)
    return out


def _notes(out: Export, blank: int) -> dict:
    notes: dict = {"clock": "epoch ns as written in ts_ns"}
    if blank:
        notes["blank_lines"] = blank
    lines = sum(out.read.values())
    if lines == 0:
        notes["empty"] = "no events: the log has no non-blank lines"
    elif not out.rows:
        notes["no_valid_lines"] = f"all {lines} lines were skipped (see skipped_reasons)"
    return notes


def align(con, run_id: int, log: Export, trace: Export) -> dict:
    """The log's clock offset against the trace run's user annotations (the median over the pairs,
    `applied_offset_ns`; 0 when nothing is shared), with its statistics, for ingest_log.notes."""
    if trace.base_time_ns is None:
        log.notes["clock"] = (
            "epoch ns as written; the trace has no baseTimeNanoseconds, so only an applied offset aligns them"
        )
    complete = [(r[3], r[4], r[5]) for r in log.rows if r[5] is not None]
    names = {name for name, _, _ in complete}
    ref: dict[str, list] = {}
    if names:
        for name, ts, dur in con.execute(
            "SELECT name, ts_ns, dur_ns FROM event_rows WHERE run_id = ? AND kind = 'user_annotation' "
            "AND ph = 'X' AND dur_ns IS NOT NULL ORDER BY ts_ns",
            [run_id],
        ).fetchall():
            if name in names:
                ref.setdefault(name, []).append((ts, dur))
    mine: dict[str, list] = {}
    for name, ts, dur in complete:
        if name in ref:
            mine.setdefault(name, []).append((ts, dur))
    starts, ends, paired_names, mismatched = [], [], 0, 0
    for name, theirs in ref.items():
        ours = sorted(mine.get(name, []))
        if len(ours) != len(theirs):
            mismatched += 1
            continue
        paired_names += 1
        for (ts_t, dur_t), (ts_l, dur_l) in zip(theirs, ours):
            starts.append(ts_t - ts_l)
            ends.append((ts_t + dur_t) - (ts_l + dur_l))
    note: dict = {
        "reference": "Kineto user_annotation events with the same name as a complete runtime event, "
        "k-th occurrence to k-th occurrence",
        "pairs": len(starts),
        "names": paired_names,
        "names_with_different_counts": mismatched,
    }
    if not starts:
        note["applied_offset_ns"] = 0
        note["note"] = "no shared events: the log keeps its own clock (epoch ns as written)"
        return note
    median = int(round(statistics.median(starts)))
    note.update(
        {
            "median_offset_ns": median,
            "min_offset_ns": min(starts),
            "max_offset_ns": max(starts),
            "max_abs_offset_ns": max(abs(o) for o in starts),
            "median_end_offset_ns": int(round(statistics.median(ends))),
            "residual_max_abs_ns": max(abs(o - median) for o in starts),
            "applied_offset_ns": median,
        }
    )
    return note


def derive(con, run_id: int) -> None:
    """Thread names a log gives (`thread` with a known tid) name the run's threads: fill a thread
    without a name, add one the trace does not have."""
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _rt_threads AS
        SELECT pid, tid, arg_min(extra->>'thread', rowid) AS name FROM event_rows
        WHERE run_id = ? AND kind = 'runtime_event' AND tid IS NOT NULL AND extra->>'thread' IS NOT NULL
        GROUP BY pid, tid
        """,
        [run_id],
    )
    con.execute(
        """
        UPDATE threads SET name = r.name FROM _rt_threads r
        WHERE threads.run_id = ? AND threads.name IS NULL AND threads.pid IS NOT DISTINCT FROM r.pid AND threads.tid = r.tid
        """,
        [run_id],
    )
    con.execute(
        """
        INSERT INTO threads SELECT ?, r.pid, r.tid, r.name, NULL FROM _rt_threads r
        WHERE NOT EXISTS (SELECT 1 FROM threads t WHERE t.run_id = ? AND t.pid IS NOT DISTINCT FROM r.pid AND t.tid = r.tid)
        """,
        [run_id, run_id],
    )
    con.execute("DROP TABLE _rt_threads")
