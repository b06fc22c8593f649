"""Runtime-event logs (JSON Lines) -> event_rows of kind `runtime_event`.

One JSON object per line: `ts_ns` (integer epoch ns), `name` (string), optional `dur_ns` (integer
>= 0; absent or null for an instant), `pid`, `tid` (integers), `thread` (string); every other key is
kept, as written, in `args` (the event's attributes). Blank lines are ignored. A line that is not
valid JSON, not an object, or lacks/mistypes a required key is skipped and counted per reason;
nothing in a log is fatal except an unreadable file (missing, broken gzip).

Lines are parsed one by one with orjson (every line is checked, so skips are counted exactly); orjson
turns integers beyond 64 bits into floats, so a line with such a number (a run of 20 digits, or 19
after a minus) is decoded again with the standard library's json, which keeps them exact.

Alignment: a log attached to a Kineto run is put on the trace's clock. Kineto `ts_ns` is already
epoch ns when the trace has `baseTimeNanoseconds`, but the two clocks still differ (Kineto derives
epoch time from its own steady clock, the log from whatever the writer used). Events the two sides
share - a complete runtime event and a Kineto `user_annotation` with the same name (paired k-th to
k-th occurrence, names whose counts differ are left out) - measure the offset; its median is
applied to every event of the log (see `align`) and the statistics go to `ingest_log.notes`.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import statistics
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tracekit.errors import InputError

FORMAT = "runtime_events"
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


def _read_head(path: Path, size: int = SNIFF_BYTES) -> bytes:
    with open(path, "rb") as f:
        head = f.read(size)
    if head[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(31).decompress(head, size)
        except zlib.error:
            return b""
    return head


def is_runtime_log(path: Path) -> bool:
    """A .jsonl/.ndjson(.gz) file, or a file whose first non-blank line is a JSON object with ts_ns."""
    name = path.name.lower()
    if name.endswith(SUFFIXES):
        return True
    try:
        head = _read_head(path)
    except OSError:
        return False  # a missing file is reported by the trace reader, with its name
    for line in head.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            return False  # a trace object spread over lines, or a line cut off by the sample
        return isinstance(obj, dict) and "ts_ns" in obj
    return False


@dataclass
class RuntimeLog:
    """A parsed log: valid events (dicts ready for event_rows) and the per-reason skip counts."""

    source: Path
    events: list = field(default_factory=list)
    lines_read: int = 0  # non-blank lines
    blank_lines: int = 0
    skipped: dict = field(default_factory=dict)
    bytes_read: int = 0
    compressed: bool = False
    parse_seconds: float = 0.0

    @property
    def events_skipped(self) -> int:
        return sum(self.skipped.values())


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


def parse(path: Path) -> RuntimeLog:
    """Read and check every line of a log (plain or gzip). Raises InputError only for an unreadable file."""
    started = time.perf_counter()
    path = Path(path)
    if not path.exists():
        raise InputError(path, "open", "file not found")
    if path.is_dir():
        raise InputError(path, "open", "expected a runtime-event log (JSON Lines), got a directory")
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    try:
        if compressed:
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(path, "gzip stream", f"valid gzip data ({e})") from None
    log = RuntimeLog(path, bytes_read=len(data), compressed=compressed)
    skipped = log.skipped
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the newline that ends the last line
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            log.blank_lines += 1
            continue
        log.lines_read += 1
        try:
            obj = _decode(raw[3:] if lineno == 1 and raw.startswith(b"\xef\xbb\xbf") else raw)
        except ValueError:  # orjson.JSONDecodeError and UnicodeDecodeError are ValueErrors
            skipped["malformed JSON"] = skipped.get("malformed JSON", 0) + 1
            continue
        reason = _check(obj)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        attrs = {k: v for k, v in obj.items() if k not in KNOWN_KEYS}
        log.events.append(
            {
                "line": lineno,
                "name": obj["name"],
                "ts_ns": obj["ts_ns"],
                "dur_ns": obj.get("dur_ns"),
                "pid": obj.get("pid"),
                "tid": obj.get("tid"),
                "thread": obj.get("thread"),
                "args": _dumps(attrs) if attrs else None,
            }
        )
    log.parse_seconds = time.perf_counter() - started
    return log


def align(con, run_id: int, log: RuntimeLog, apply: bool = True) -> dict:
    """Measure the log's clock offset against the Kineto run's user annotations; shift the log by the
    median offset when `apply` and any pair exists. Returns the note for ingest_log."""
    names = {e["name"] for e in log.events if e["dur_ns"] is not None}
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
    for e in log.events:
        if e["dur_ns"] is not None and e["name"] in ref:
            mine.setdefault(e["name"], []).append((e["ts_ns"], e["dur_ns"]))
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
            "applied_offset_ns": median if apply else 0,
        }
    )
    if apply and median:
        for e in log.events:
            e["ts_ns"] += median
    return note


def insert(con, log: RuntimeLog, run_id: int, tmpdir: str | None = None) -> None:
    """Append the log's events to event_rows as run `run_id`, in line order."""
    if not log.events:
        return
    fd, name = tempfile.mkstemp(prefix="tracekit-rt-", suffix=".jsonl", dir=tmpdir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for e in log.events:
                f.write(orjson.dumps(e).decode())  # args is already text
                f.write("\n")
        con.execute(
            f"""
            INSERT INTO event_rows
            SELECT ?, '{KIND}', CASE WHEN dur_ns IS NULL THEN 'i' ELSE 'X' END, NULL, name, ts_ns, dur_ns,
                   pid, tid,
                   CASE WHEN tid IS NULL AND thread IS NOT NULL THEN 'runtime_events/' || thread ELSE 'runtime_events' END,
                   NULL, NULL, NULL, NULL, NULL,
                   CAST(args AS JSON),
                   CASE WHEN thread IS NULL THEN json_object('line', line) ELSE json_object('line', line, 'thread', thread) END,
                   NULL, NULL
            FROM read_json(?, format = 'newline_delimited', columns = {{
                'line': 'BIGINT', 'name': 'VARCHAR', 'ts_ns': 'BIGINT', 'dur_ns': 'BIGINT', 'pid': 'BIGINT',
                'tid': 'BIGINT', 'thread': 'VARCHAR', 'args': 'VARCHAR'}})
            """,
            [run_id, name],
        )
    finally:
        os.unlink(name)


def add_threads(con, run_id: int) -> None:
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


def stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".ndjson", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def notes(log: RuntimeLog) -> dict:
    out: dict = {"clock": "epoch ns as written in ts_ns"}
    if log.blank_lines:
        out["blank_lines"] = log.blank_lines
    if log.lines_read == 0:
        out["empty"] = "no events: the log has no non-blank lines"
    elif not log.events:
        out["no_valid_lines"] = f"all {log.lines_read} lines were skipped (see skipped_reasons)"
    return out
