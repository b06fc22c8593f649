"""PyTorch profiler (Kineto) and other Chrome-trace JSON -> event_rows of one run.

The events array is parsed by DuckDB in parallel (see json_slice for why it is cut into parts first)
into a plain table, and every public column is derived from it in one SQL statement.

Timestamps: `ts` is microseconds, often with a ns fraction. A double holds it exactly while
|ts| < ~4e12 us (relative to baseTimeNanoseconds, as Kineto writes since 2023) and for integral
absolute values; absolute epoch microseconds *with* a fraction (1712195495519689.047) need
DECIMAL(38,3), whose 128-bit arithmetic costs ~2 s per GB. So the type is chosen per file from a
sample of its text, and a double-typed load that turns out to have lost fractions is redone.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson

from tracekit.db.run_set import OF_RUNS, of_runs
from tracekit.db.schema import CATEGORY_KINDS, DEVICE_KINDS
from tracekit.errors import InputError
from tracekit.parsers import chrome_pairs, json_slice
from tracekit.parsers.json_array import first_char
from tracekit.parsers.json_slice import Staged
from tracekit.parsers.rows import Export, Reload, Unbatched

FORMAT = "kineto"
DESCRIPTION = "Chrome/Kineto trace JSON (object or array)"
CHROME_FORMAT = "chrome_json"  # a Chrome trace from another producer: phases or keys Kineto never writes
TAKES_LOGS = True
READ_AHEAD = True  # staging is file copies and zlib, which release the GIL

OBJECT_KEY = re.compile(rb'"traceEvents"\s*:')
EVENT_KEY = re.compile(rb'^\[\s*\{.*?"ph"\s*:', re.DOTALL)
EVENT_SNIFF = 1 << 16


def sniff(head: bytes, name: str, **_) -> bool:
    """A trace object whose `traceEvents` key is in the head, or an array whose first event has a phase."""
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if start[:1] == b"{":
        return OBJECT_KEY.search(start) is not None
    return start[:1] == b"[" and EVENT_KEY.match(start[:EVENT_SNIFF]) is not None


def fallback(head: bytes) -> bool:
    """Any other JSON, and nothing at all (a missing or empty file): read as a trace, whose errors say
    what it lacks (a `traceEvents` array, a closing bracket...)."""
    return first_char(head) in (b"{", b"[", b"")


def read(path: Path, tmpdir: str | None = None, **_) -> Export:
    """The trace staged into array parts (json_slice) with its metadata; the events are parsed by
    DuckDB when the Export is loaded."""
    staged = json_slice.stage(Path(path), tmpdir)
    meta = staged.metadata
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    export = Export(
        source=staged.source,
        format=FORMAT,
        bytes_read=staged.bytes_read,
        device_properties=meta.get("deviceProperties"),
        metadata={k: v for k, v in meta.items() if k != "deviceProperties"},
        base_time_ns=_base_time_ns(meta) or None,
        world_size=dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
        cleanup=staged.cleanup,
    )
    if isinstance(dist.get("rank"), int):
        export.rank, export.rank_source = dist["rank"], "distributedInfo"
    exact = _needs_exact_ts(staged.parts[0])
    options: dict = {"exact": exact}
    if staged.bytes_read <= BATCH_FILE_BYTES:  # its keys are looked at with its batch's (batchable)
        export.batch, export.batch_key = _BatchItem(staged, options), "exact" if exact else "double"

    def loader(con, run_id: int, offset: int = 0) -> None:
        try:
            counts = load(con, staged, run_id, **options)
        except _ReadAgain as again:
            options.update(again.options)
            raise Reload from None
        if offset:
            con.execute("UPDATE event_rows SET ts_ns = ts_ns + ? WHERE run_id = ?", [offset, run_id])
        export.format = counts["format"]
        export.read = Counter({"trace event": counts["events_read"]})
        export.skipped = Counter(counts["skipped_reasons"])
        export.notes = counts["notes"]

    export.loader = loader
    return export


# Every key the Trace Event Format and Kineto define for an event. Keys outside this set are found
# by sampling (see _sample_keys) and kept in event_rows.extra.
EVENT_COLUMNS = {
    "ph": "VARCHAR",
    "cat": "VARCHAR",
    "name": "VARCHAR",
    "pid": "VARCHAR",
    "tid": "VARCHAR",
    "ts": "DOUBLE",
    "dur": "DOUBLE",
    "id": "VARCHAR",
    "bp": "VARCHAR",
    "s": "VARCHAR",
    "args": "JSON",
}

FLOW_CATEGORIES = ("ac2g", "async_cpu_to_gpu", "async", "fwdbwd")


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _kind_expr() -> str:
    cases = " ".join(f"WHEN {_sql_str(cat)} THEN {_sql_str(kind)}" for cat, kind in CATEGORY_KINDS.items())
    flows = ", ".join(_sql_str(c) for c in FLOW_CATEGORIES)
    return f"""CASE
        WHEN ph = 'M' THEN 'metadata'
        WHEN ph = 'C' THEN 'counter'
        WHEN ph IN ('s', 't', 'f') OR lower(cat) IN ({flows}) THEN 'flow'
        WHEN ph IN ('b', 'e', 'n') THEN 'async'
        WHEN ph IN ('i', 'I') AND name = '[memory]' THEN 'memory'
        WHEN cat IS NULL THEN CASE WHEN ph IN ('i', 'I') THEN 'instant' ELSE 'other' END
        ELSE CASE lower(cat) {cases} ELSE regexp_replace(lower(cat), '[^a-z0-9]+', '_', 'g') END
    END"""


def _skip_reason_expr() -> str:
    return """CASE
        WHEN _absurd IS NOT NULL THEN _absurd
        WHEN ph IS NULL AND ts IS NULL AND name IS NULL AND cat IS NULL AND args IS NULL AND pid IS NULL
            THEN 'not a JSON object'
        WHEN ph IS NULL THEN 'missing ph'
        WHEN ts IS NULL AND ph <> 'M' THEN 'missing ts'
        WHEN ph = 'X' AND dur IS NULL THEN 'complete event without dur'
        WHEN ph = 'X' AND dur < 0 THEN 'negative dur'
    END"""


EXTRA_KEY_SAMPLE = 1 << 20  # bytes of the first part whose events are checked for unknown keys


def _sample_keys(array_path: Path) -> tuple[list[str], bool]:
    """Top-level event keys outside the known set, from the events in the first MiB of the array
    (a DuckDB schema sniff costs ~0.25 s even on small files), and whether those events look like a
    generic Chrome trace (a phase or key Kineto never writes)."""
    with open(array_path, "rb") as f:
        head = f.read(EXTRA_KEY_SAMPLE)
    events = _whole_events(head)
    if events is not None:
        return _key_summary(events)
    text = head.decode("utf-8", "ignore")
    decoder = json.JSONDecoder()
    pos = text.find("[") + 1
    events: list = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        try:
            event, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):  # cut off, malformed or nested too deep: the real read says
            break
        events.append(event)
    return _key_summary(events)


_EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def _whole_events(head: bytes) -> list | None:
    """The events of an array's head up to its last `}, {` boundary, in one orjson parse (about ten
    times faster than decoding them one by one); None where that cut is not valid JSON (a boundary
    inside an args list of objects, a head without one), and the caller decodes event by event."""
    start = head.find(b"[")
    if start < 0:
        return None
    if len(head) < EXTRA_KEY_SAMPLE:  # the whole part: every event, the last one included
        try:
            events = orjson.loads(head[start:])
            return events if isinstance(events, list) else None
        except orjson.JSONDecodeError:
            pass
    cuts = list(_EVENT_BOUNDARY.finditer(head, start + 1))
    if not cuts:
        return None
    try:
        events = orjson.loads(head[start : cuts[-1].start() + 1] + b"]")
    except orjson.JSONDecodeError:
        return None
    return events if isinstance(events, list) else None


def _key_summary(events: list) -> tuple[list[str], bool]:
    objects = [event for event in events if type(event) is dict]
    keys: set[str] = set().union(*objects)  # one C-level pass: a third of the per-event loop's time
    phases = {
        phase if isinstance(phase, str) or phase is None else repr(phase)  # a list is no phase (nor hashable)
        for phase in (event.get("ph") for event in objects)
    }
    generic = bool(keys & set(chrome_pairs.GENERIC_COLUMNS)) or bool(phases - {None, *chrome_pairs.KINETO_PHASES})
    return sorted(k for k in keys - set(EVENT_COLUMNS)), generic


# DuckDB sizes its read buffers from maximum_object_size, so the default stays small and a file with
# a larger event is read again with a larger one.
DEFAULT_MAX_OBJECT = 16 << 20
MAX_OBJECT_LIMIT = 1 << 30


class _ReadAgain(Exception):
    """The file must be read again, inside a fresh transaction, with these load options."""

    def __init__(self, **options):
        super().__init__(options)
        self.options = options


def load(
    con,
    staged: Staged,
    run_id: int,
    ignore_errors: bool = False,
    exact: bool | None = None,
    max_object_bytes: int = DEFAULT_MAX_OBJECT,
    generic_keys: bool | None = None,
    sample: tuple[list[str], bool] | None = None,
) -> dict:
    """Insert one staged trace as run `run_id`; returns counts for the ingest log.

    Malformed JSON is fatal (with its position). Raises _ReadAgain when a second read is needed: for
    well-formed elements that are not objects (a number, a string), which ignore_errors turns into
    empty rows counted as skipped; for an event larger than DuckDB's read buffer (a huge stack or
    args); for a double-typed read that lost timestamp fractions; and for a generic Chrome trace whose
    first MiB did not show it, so its pairing keys (id2, bind_id...) were not read (they are read only
    when needed: every column costs Kineto files parse time). A failed statement aborts the caller's
    transaction, hence the retry there, not here.
    """
    if exact is None:
        exact = _needs_exact_ts(staged.parts[0])
    options = {
        "ignore_errors": ignore_errors,
        "exact": exact,
        "max_object_bytes": max_object_bytes,
        "generic_keys": generic_keys,
    }
    try:
        counts = _load(con, staged, run_id, sample=sample, **options)
    except _GenericKeysNeeded:
        raise _ReadAgain(**{**options, "generic_keys": True}) from None
    except InputError as e:
        text = str(e).lower()
        if "transform error" in text and not ignore_errors:
            raise _ReadAgain(**{**options, "ignore_errors": True}) from None
        if "maximum_object_size" in text and max_object_bytes < MAX_OBJECT_LIMIT:
            raise _ReadAgain(**{**options, "max_object_bytes": min(max_object_bytes * 16, MAX_OBJECT_LIMIT)}) from None
        raise
    if not exact and _lost_fractions(con, [run_id], [_base_time_ns(staged.metadata)]):
        raise _ReadAgain(**{**options, "exact": True})
    counts["notes"].update(_ts_notes(exact))
    return counts


def _ts_notes(exact: bool) -> dict:
    notes = {"ts_type": "DECIMAL(38,3)" if exact else "DOUBLE"}
    if exact and not exact_json_decimals():
        notes["ts_precision"] = (
            "about 0.25 us: this DuckDB (< 2.0) reads JSON numbers through a double, so absolute "
            "microsecond timestamps lose their nanosecond fraction; DuckDB >= 2.0 (Python >= 3.11) keeps it"
        )
    return notes


def exact_json_decimals() -> bool:
    """DuckDB 2.0 parses a JSON number straight into DECIMAL; 1.x goes through a double first."""
    import duckdb

    return int(duckdb.__version__.split(".")[0]) >= 2


DOUBLE_EXACT_US = 4e12  # below this, ts * 1000 with 3 decimals stays under 2**53
# a ts of at least DOUBLE_EXACT_US (4 followed by 12 digits, or 14 digits and more) with a fraction
# that is not all zeros: one search, which stops at the first
EXACT_TS = re.compile(rb'"ts"\s*:\s*-?0*(?:[4-9]\d{12}|[1-9]\d{13,})\.\d*[1-9]')


def _needs_exact_ts(array_path: Path) -> bool:
    with open(array_path, "rb") as f:
        head = f.read(1 << 20)
    return EXACT_TS.search(head) is not None


def _lost_fractions(con, run_ids: list[int], bases_ns: list[int]) -> bool:
    """A large ts read as a double whose ns part is not whole microseconds, in any of these runs (each
    with its base time): the text had a fraction."""
    return con.execute(
        f"SELECT EXISTS (SELECT 1 FROM event_rows WHERE {OF_RUNS} "
        f"AND abs(ts_ns - {list(bases_ns)}[list_position($run_ids, run_id)]) >= {int(DOUBLE_EXACT_US * 1000)} "
        "AND ts_ns % 1000 <> 0)",
        of_runs(run_ids),
    ).fetchone()[0]


def _take_skipped(con, run_ids: list[int]) -> dict[int, Counter]:
    """The rows of these runs the insert marked `_skip:<reason>`, counted by run and reason, then deleted."""
    skip = f"{OF_RUNS} AND kind LIKE '\\_skip:%' ESCAPE '\\'"
    skipped: dict[int, Counter] = {run_id: Counter() for run_id in run_ids}
    for run_id, reason, count in con.execute(
        f"SELECT run_id, substr(kind, 7), count(*) FROM event_rows WHERE {skip} GROUP BY ALL ORDER BY ALL",
        of_runs(run_ids),
    ).fetchall():
        skipped[run_id][reason] = count
    if any(skipped.values()):
        con.execute(f"DELETE FROM event_rows WHERE {skip}", of_runs(run_ids))
    return skipped


def _columns_sql(columns: dict) -> str:
    """read_json's `columns` argument: a struct literal of name -> type."""
    return "{" + ", ".join(f"{_sql_str(k)}: {_sql_str(v)}" for k, v in columns.items()) + "}"


def _ts_ns_expr(exact: bool) -> str:
    if exact:
        return "CAST(ts * 1000 AS BIGINT)"
    # integral absolute microseconds are exact in a double, but ts * 1000 would not be: split first
    return (
        f"CASE WHEN abs(ts) < {DOUBLE_EXACT_US:.0f} THEN CAST(round(ts * 1000) AS BIGINT) "
        "ELSE CAST(trunc(ts) AS BIGINT) * 1000 + CAST(round((ts - trunc(ts)) * 1000) AS BIGINT) END"
    )


RAW_TABLE = "_tracekit_raw_events"

# |ts|, |dur| and |ts + dur| beyond this many microseconds (127 years) are no times of a trace: in
# nanoseconds with a base time added they would overflow a BIGINT. Such events (and NaN, Infinity)
# are skipped with a reason instead of failing the whole file.
ABSURD_US = 4e15


def _absurd_sql() -> str:
    """Why an event's times are no times of a trace (NULL when they are): NaN, Infinity, or beyond
    ABSURD_US. A NULL ts or dur alone is not absurd."""
    finite = "(isfinite(CAST({0} AS DOUBLE)) AND abs({0}) <= {1})".format
    return (
        f"CASE WHEN NOT {finite('ts', ABSURD_US)} OR NOT {finite('dur', ABSURD_US)} OR NOT {finite('ts + dur', ABSURD_US)} "
        f"THEN CASE WHEN NOT {finite('ts', ABSURD_US)} THEN 'ts not a finite time in range' "
        "ELSE 'dur not a finite duration in range' END END"
    )


def _json_source(columns_sql: str, ignore_errors: bool, max_object_bytes: int, by_part: bool) -> str:
    """The events of the files `$parts` as read_json gives them, their times cleared where absurd
    (`_absurd` says why) and, `by_part`, each row's part (1-based) in `_part`: _insert_sql's source,
    or the raw table's. Inserting from it keeps the files' order: read_json's scan is ordered, and
    nothing between it and the insert joins (see _insert_sql)."""
    part = ", list_position($parts, filename) AS _part" if by_part else ""
    ignore = "true" if ignore_errors else "false"
    return (
        "(SELECT * REPLACE (CASE WHEN _absurd IS NULL THEN ts END AS ts, CASE WHEN _absurd IS NULL THEN dur END AS dur) "
        f"FROM (SELECT *{part}, {_absurd_sql()} AS _absurd "
        f"FROM read_json($parts, format='array', columns={columns_sql}, ignore_errors={ignore}, "
        f"maximum_object_size={max_object_bytes}{', filename=true' if by_part else ''})))"
    )


def _holds_generic(con, run_ids: list[int]) -> bool:
    """Whether these runs' inserted events hold a phase Kineto never writes (a generic Chrome trace)."""
    return chrome_pairs.needs_generic(con, f"(SELECT ph FROM event_rows WHERE {OF_RUNS})", False, of_runs(run_ids))


PID_N = "TRY_CAST(pid AS BIGINT)"
TID_N = "coalesce(TRY_CAST(tid AS BIGINT), TRY_CAST(regexp_extract(tid, '^stream\\s*(\\d+)$', 1) AS BIGINT))"
TRACK = "CASE WHEN pid_n IS NULL OR tid_n IS NULL OR TRY_CAST(tid AS BIGINT) IS NULL THEN pid || '/' || tid END"


class _GenericKeysNeeded(Exception):
    pass


def _load(
    con,
    staged: Staged,
    run_id: int,
    ignore_errors: bool,
    exact: bool,
    max_object_bytes: int,
    generic_keys: bool | None,
    sample: tuple[list[str], bool] | None = None,
) -> dict:
    extra, looks_generic = sample if sample is not None else _sample_keys(staged.parts[0])
    if generic_keys is None:
        generic_keys = looks_generic
    columns = dict(EVENT_COLUMNS) | (chrome_pairs.GENERIC_COLUMNS if generic_keys else {})
    if exact:
        columns["ts"] = "DECIMAL(38,3)"
    for key in extra:
        columns[key] = "JSON"
    columns_sql = _columns_sql(columns)
    extra_sql = "json_object(" + ", ".join(f'{_sql_str(k)}, "{k}"' for k in extra) + ")" if extra else "NULL::JSON"
    base_ns = _base_time_ns(staged.metadata)
    before = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
    source = _json_source(columns_sql, ignore_errors, max_object_bytes, by_part=False)
    # A Kineto trace (as its first MiB says) goes from read_json straight into event_rows, so its
    # events are not held twice; a phase Kineto never writes further on means a generic Chrome trace
    # after all, read again with its pairing keys (the caller rolls this insert back). A generic one
    # takes a raw table first: chrome_pairs pairs begins and ends in it before the insert.
    statement = (
        _insert_sql(str(run_id), str(base_ns), exact, False, extra_sql, source=source)
        if not generic_keys
        else f"CREATE OR REPLACE TEMP TABLE {RAW_TABLE} AS SELECT * FROM {source}"
    )
    try:
        con.execute(statement, {"parts": [str(p) for p in staged.parts]})
    except Exception as e:  # duckdb.Error subclasses; message carries the byte position
        raise _input_error(staged, e) from None
    if not generic_keys:
        if _holds_generic(con, [run_id]):
            raise _GenericKeysNeeded
        generic, notes = False, {}
    else:
        generic = chrome_pairs.needs_generic(con, RAW_TABLE, generic_keys)
        notes = chrome_pairs.prepare(con, RAW_TABLE) if generic else {}
        con.execute(_insert_sql(str(run_id), str(base_ns), exact, generic, extra_sql))
    after = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
    if generic:
        notes.update(_fold_generic(con, run_id, exact, base_ns))  # reads the raw table's flow v2 events
    if generic_keys:
        con.execute(f"DROP TABLE {RAW_TABLE}")
    skipped = dict(_take_skipped(con, [run_id])[run_id])
    read = after - before
    if extra:
        notes["extra_event_keys"] = extra
    notes["clock"] = _clock_note(staged.metadata)
    return {
        "events_read": read, "events_skipped": sum(skipped.values()), "skipped_reasons": skipped, "notes": notes,
        "format": CHROME_FORMAT if generic else FORMAT,
    }  # fmt: skip


# A file joins a batch (load_batch) up to this size: above it, a statement's fixed cost is small
# beside its rows, and a batch of such files would hold much more memory than one of them.
BATCH_FILE_BYTES = 8 << 20


@dataclass
class _BatchItem:
    """What load_batch and batchable take of a file read with `export.batch` set: its staged parts,
    and the options of its own loader (batchable gives it the keys it found, for a load alone)."""

    staged: Staged
    options: dict


def batchable(con, exports: list[Export]) -> list[bool]:
    """Which of these files (read with `export.batch` set) may load in one batch: those whose events
    are objects with no key outside EVENT_COLUMNS and no phase Kineto never writes. The others need
    a load of their own, and their loader is given what was found: every key outside the set (kept
    in `extra`; where a file loads alone from the start, only its first MiB is looked at), and
    whether a phase or key says it is a generic Chrome trace. One parallel scan of every event of
    the files in DuckDB: about 1 ms a 0.9 MB rank, where _sample_keys costs 7 ms and holds the GIL.
    Unbatched when the scan fails (a malformed file or a huge event): each file then loads alone.
    Each function of an object parses its text again, so the scan asks for as few as it can:
    json_keys gives a non-object no keys, and an element is an object where its text starts with
    '{' (read_json_objects hands out each element's own text): 88 ms against 99-113 ms on 64 ranks."""
    items: list[_BatchItem] = [export.batch for export in exports]
    parts = [str(p) for item in items for p in item.staged.parts]
    owner = [k for k, item in enumerate(items) for _ in item.staged.parts]
    try:
        odd = con.execute(
            f"""SELECT list_position($parts, filename) AS part,
                       list_distinct(flatten(list(list_filter(
                           json_keys(json), lambda k: NOT list_contains($known, k))))) AS keys,
                       bool_or((json ->> 'ph') NOT IN ({chrome_pairs.KINETO_PHASES_SQL})) AS odd_phase,
                       bool_or(NOT starts_with(json, '{{')) AS not_object
                FROM read_json_objects($parts, format='array', filename=true,
                                       maximum_object_size={DEFAULT_MAX_OBJECT})
                GROUP BY part HAVING len(keys) > 0 OR odd_phase OR not_object""",
            {"parts": parts, "known": list(EVENT_COLUMNS)},
        ).fetchall()
    except Exception as e:  # duckdb.Error: a malformed file or a huge event; each file's own load says which
        raise Unbatched(str(e)) from None
    found: dict[int, tuple[set, bool]] = {}
    for part, keys, odd_phase, _ in odd:
        keys_so_far, generic = found.get(owner[part - 1], (set(), False))
        keys = set(keys or ())
        generic = generic or bool(odd_phase) or bool(keys & set(chrome_pairs.GENERIC_COLUMNS))
        found[owner[part - 1]] = (keys_so_far | keys, generic)
    for k, (keys, generic) in found.items():
        if generic:  # a generic trace's pairing keys are columns of their own, not extra keys
            keys -= set(chrome_pairs.GENERIC_COLUMNS)
        items[k].options["sample"] = (sorted(keys), generic)
    return [k not in found for k in range(len(exports))]


def load_batch(con, items: list[tuple[Export, int]]) -> None:
    """Insert several staged traces (each read with `export.batch` set), each as its run, with one
    read_json over all their parts and one INSERT: the statements of a file's load cost 20-30 ms
    whatever its size, most of the ingest of a 1 MB rank trace. Fills each export's counts and
    notes as its loader would. Raises Unbatched where a file needs what only a load of its own does
    (a second read: non-object elements, a larger event, lost timestamp fractions, a generic Chrome
    trace; or a malformed file, whose error that load reports with its position)."""
    staged: list[Staged] = [export.batch.staged for export, _ in items]
    exact = items[0][0].batch_key == "exact"  # the same for every file of a batch (ingest groups by key)
    parts = [str(p) for s in staged for p in s.parts]
    if len(set(parts)) < len(parts):  # a file given twice (same_content="keep"): parts must name their file
        raise Unbatched("a file twice in one batch")
    part_runs = [run_id for (_, run_id), s in zip(items, staged) for _ in s.parts]
    part_bases = [_base_time_ns(s.metadata) for s in staged for _ in s.parts]
    columns_sql = _columns_sql(dict(EVENT_COLUMNS) | ({"ts": "DECIMAL(38,3)"} if exact else {}))
    # straight from read_json into event_rows, with no raw table between them: materialising 57 MB of
    # events (64 ranks) and reading them back cost more than the insert's own work
    source = _json_source(columns_sql, False, DEFAULT_MAX_OBJECT, by_part=True)
    # list literals indexed by part: a lookup without a join, which would reorder the insert (see _insert_sql)
    insert = _insert_sql(f"{part_runs}[_part]", f"{part_bases}[_part]", exact, False, "NULL::JSON", source=source)
    try:
        con.execute(insert, {"parts": parts})
    except Exception as e:  # duckdb.Error subclasses: the file's own load says which file and where
        raise Unbatched(str(e)) from None
    run_ids = [run_id for _, run_id in items]
    if _holds_generic(con, run_ids):
        raise Unbatched("a generic Chrome trace")
    by_run = dict(
        con.execute(
            f"SELECT run_id, count(*) FROM event_rows WHERE {OF_RUNS} GROUP BY run_id", of_runs(run_ids)
        ).fetchall()
    )
    if not exact and _lost_fractions(con, run_ids, [_base_time_ns(s.metadata) for s in staged]):
        raise Unbatched("timestamps that need DECIMAL")  # a double lost a fraction: each file alone, exactly
    skipped = _take_skipped(con, run_ids)
    for (export, run_id), s in zip(items, staged):
        export.format = FORMAT
        export.read = Counter({"trace event": by_run.get(run_id, 0)})
        export.skipped = skipped[run_id]
        export.notes = {"clock": _clock_note(s.metadata), **_ts_notes(exact), "loaded_in_batch_of": len(items)}


def _insert_sql(
    run_sql: str, base_sql: str, exact: bool, generic: bool, extra_sql: str, source: str = RAW_TABLE
) -> str:
    """The INSERT of event_rows from `source` (the raw table, or read_json's events: _json_source):
    `run_sql` and `base_sql` are the SQL of each row's run id and base time (constants for one file,
    a lookup by part for a batch of files)."""
    # a CASE, not `kind0 IN (...)`: DuckDB plans an IN list of this size as a mark join, and a join
    # turns the order-preserving batch insert into a plain parallel insert that appends row groups in
    # whatever order the threads finish (event_id would then differ between two ingests of one file)
    on_device = "CASE kind0 " + " ".join(f"WHEN {_sql_str(k)} THEN true" for k in DEVICE_KINDS) + " ELSE false END"
    kind_sql, skip_sql, track_sql, flow_sql = (
        _kind_expr(),
        _skip_reason_expr(),
        TRACK,
        "CASE WHEN kind0 = 'flow' THEN id END",
    )
    tid_sql = "tid_n"
    if generic:  # the overrides chrome_pairs set win; Kineto files never get here, so their SQL is unchanged
        kind_sql, skip_sql = f"coalesce(_kind, {kind_sql})", f"coalesce(_skip, {skip_sql})"
        track_sql, flow_sql = f"coalesce(_track, {track_sql})", f"coalesce(_flow_id, {flow_sql})"
        tid_sql = "CASE WHEN _kind = 'async' THEN NULL ELSE tid_n END"
        extra_sql = (
            f"CASE WHEN _flag IS NULL THEN {extra_sql} "
            f"ELSE json_merge_patch(coalesce({extra_sql}, '{{}}'::JSON), _flag) END"
        )
    return f"""
    INSERT INTO event_rows
    WITH raw AS (
        SELECT *, {kind_sql} AS kind0, {skip_sql} AS skip_reason,
               {PID_N} AS pid_n,
               {TID_N} AS tid_n,
               json_extract_string(args, ['$.device', '$.stream', '$.correlation', '$."External id"', '$."external id"']) AS a
        FROM {source}
    )
    SELECT {run_sql},
           CASE WHEN skip_reason IS NULL THEN kind0 ELSE '_skip:' || skip_reason END,
           ph, cat, name,
           {_ts_ns_expr(exact)} + {base_sql},
           CAST(round(dur * 1000) AS BIGINT),
           pid_n, {tid_sql},
           {track_sql},
           CASE WHEN {on_device} THEN coalesce(TRY_CAST(a[1] AS INTEGER), TRY_CAST(pid_n AS INTEGER)) END,
           CASE WHEN {on_device} THEN coalesce(TRY_CAST(a[2] AS BIGINT), tid_n) END,
           CASE WHEN kind0 = 'flow' AND lower(cat) IN ('ac2g', 'async_cpu_to_gpu', 'async') THEN TRY_CAST(id AS BIGINT)
                ELSE TRY_CAST(a[3] AS BIGINT) END,
           TRY_CAST(coalesce(a[4], a[5]) AS BIGINT),
           {flow_sql},
           args,
           {extra_sql},
           NULL, NULL
    FROM raw
    """


def _clock_note(metadata: dict) -> str:
    if "baseTimeNanoseconds" in metadata:
        return "epoch ns = baseTimeNanoseconds + ts * 1000"
    return "ns = ts * 1000 (no baseTimeNanoseconds)"


def _fold_generic(con, run_id: int, exact: bool, base_ns: int) -> dict:
    """Drop the end events folded into their begins (read and ingested, but not rows of their own),
    then append the flow v2 rows; both counted for the ingest log."""
    folded = dict(
        con.execute(
            "SELECT ph, count(*) FROM event_rows WHERE run_id = ? AND kind = ? GROUP BY 1",
            [run_id, chrome_pairs.PAIRED],
        ).fetchall()
    )
    if folded:
        con.execute("DELETE FROM event_rows WHERE run_id = ? AND kind = ?", [run_id, chrome_pairs.PAIRED])
    before = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
    ts_ns = f"{_ts_ns_expr(exact)} + {base_ns}"
    track = TRACK.replace("pid_n", PID_N).replace("tid_n", f"({TID_N})")
    con.execute(chrome_pairs.flow_v2_sql(RAW_TABLE, run_id, ts_ns, PID_N, TID_N, track))
    flows = con.execute("SELECT count(*) FROM event_rows").fetchone()[0] - before
    return {"end_events_folded_into_begins": folded, "flow_v2_rows_added": flows}


def _base_time_ns(meta: dict) -> int:
    base = meta.get("baseTimeNanoseconds")
    try:
        return int(base) if base is not None else 0
    except (TypeError, ValueError):
        return 0


def _input_error(staged: Staged, err: Exception) -> InputError:
    text = str(err)
    msg = re.sub(r"^[A-Za-z ]*Error:\s*", "", text.splitlines()[0] if text else type(err).__name__)
    part = re.search(r'in file "([^"]+)"', text)
    offset = staged.locate(part.group(1)) if part else None
    if offset is not None and "malformed json" in text.lower():
        exact = _syntax_error(staged, part.group(1))
        if exact:
            return exact
    for p in staged.parts:
        msg = msg.replace(str(p), "input")
    where = f"events from byte {offset}" if offset is not None else "traceEvents"
    return InputError(staged.source, where, f"expected well-formed trace events ({msg.strip()})")


def _syntax_error(staged: Staged, part_name: str) -> InputError | None:
    """The exact byte of a JSON syntax error, found by re-reading the failing part (error path only)."""
    index = next(i for i, p in enumerate(staged.parts) if p.name in part_name)
    data = staged.parts[index].read_bytes()
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as e:
        where = staged.part_offsets[index] + e.pos
        unit = "byte (decompressed)" if staged.compressed else "byte"
        return InputError(staged.source, f"{unit} {where}", f"expected well-formed JSON ({e.msg})")
    return None
