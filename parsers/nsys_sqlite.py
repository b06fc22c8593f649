"""Nsight Systems SQLite export -> event_rows of one run, in the same shape as a Kineto trace.

Read with Python's sqlite3 (DuckDB's sqlite extension is not available offline). Tables and columns
are probed (sqlite_master, PRAGMA table_info), never assumed: the schema changes every release.
`read` probes the file and returns an Export whose `loader` streams each event table in batches of
the needed columns into Arrow and maps them in DuckDB SQL (`INSERT INTO event_rows SELECT ...`), so
memory follows the batch size, not the file, and no row becomes a Python object beyond its fetch.
String ids become text in Arrow (a hash lookup per batch on the read-ahead thread), so each INSERT is a
plain projection of one batch and keeps the file's row order without a join or a sort.

Mapping (see docs/schema.md, "Nsight Systems exports"):

- CUPTI_ACTIVITY_KIND_KERNEL -> `kernel`, MEMCPY -> `gpu_memcpy`, MEMSET -> `gpu_memset`,
  SYNCHRONIZATION -> `cuda_sync`: pid/tid = device/stream, as Kineto writes GPU tracks.
- CUPTI_ACTIVITY_KIND_RUNTIME -> `cuda_runtime` (eventClass 1: `cuda_driver`), pid/tid decoded from
  globalTid, name from StringIds without the `_v7000` suffix.
- NVTX_EVENTS push/pop and start/end ranges -> `user_annotation` (ph X), marks -> `user_annotation`
  (ph i), with the domain name in args.
- ThreadNames -> `thread_name` metadata events (ph M), which fill_entities turns into thread names.

Times are ns relative to the session start, made epoch ns by TARGET_INFO_SESSION_START_TIME.utcEpochNs
when the export has it. Correlation ids are per process: with several processes in one export the
stored correlation is `pid * 2**32 + correlationId` (the raw id stays in args), so the launches view
still pairs each call with its own process's GPU work.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import orjson

from tracekit.errors import InputError
from tracekit.parsers import sqlite_files
from tracekit.parsers.rows import ABSURD_NS, TIME_REASON, Export, load  # noqa: F401  (load: this reader's rows go in as every reader's do)

FORMAT = "nsys_sqlite"
DESCRIPTION = "Nsight Systems SQLite export"

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
THREAD_NAMES = "ThreadNames"

# The tables whose rows become events (every row is ingested or counted as skipped).
EVENT_TABLES = (THREAD_NAMES, RUNTIME, NVTX, KERNEL, MEMCPY, MEMSET, SYNC)

MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP", 11: "Unified HtoD", 12: "Unified DtoH", 13: "Unified DtoD"}  # fmt: skip
MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static", 7: "Unknown"}  # fmt: skip
SYNC_TYPES = {0: "Unknown", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}

NVTX_PUSHPOP, NVTX_STARTEND, NVTX_MARK, NVTX_DOMAIN_CREATE = 59, 60, 34, 75
VERSION_SUFFIX = "_v[0-9]+$"  # an RE2 pattern (Arrow's regex engine, as DuckDB's)
TID_MASK = 0x1000000
OTHER_CLASS = "runtime row of another event class (not CUDA runtime/driver)"
BATCH_ROWS = 250_000  # rows fetched, converted and inserted at a time: the reader's memory bound
# a multi-GPU job captured in one file holds one process per rank: ingest makes each a run of its own
RANKS_BY_PROCESS = True


def sniff(head: bytes, name: str, **_) -> bool:
    """A SQLite database file (judged by its 16-byte header)."""
    return head[:16] == sqlite_files.MAGIC


def _pid(global_tid):
    return None if global_tid is None else global_tid // TID_MASK % TID_MASK


def read(path: Path, batch_rows: int = BATCH_ROWS, tmpdir: str | None = None, **_) -> Export:
    """The export's run-level facts now and its event tables when the Export's loader runs (every row
    ingested or counted as skipped); InputError for a file that is not a readable nsys export. SQLite
    reads a database in place, so a compressed export is read from a decompressed copy in `tmpdir`."""
    path = Path(path)
    database, compressed = sqlite_files.openable(path, tmpdir)
    try:
        export = _open(path, database, batch_rows)
    except BaseException:
        if compressed:
            database.unlink(missing_ok=True)
        raise
    if compressed:
        export.cleanup = lambda: database.unlink(missing_ok=True)
    return export


def _open(path: Path, database: Path, batch_rows: int) -> Export:
    con = sqlite_files.open_export(path, database, "an Nsight Systems SQLite export")
    try:
        return _read(con, path, database, batch_rows)
    except sqlite3.Error as e:
        raise InputError(path, "database", f"expected a readable Nsight Systems SQLite export ({e})") from None
    finally:
        con.close()


def _columns(con, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def _select(con, table: str, wanted: list[str], where: str = ""):
    """Rows of `table` as dicts with every wanted column (None when the export lacks it), in rowid order."""
    have = _columns(con, table)
    cols = [c for c in wanted if c in have]
    if not cols:
        return
    cur = con.execute(
        f'SELECT {", ".join(f"{chr(34)}{c}{chr(34)}" for c in cols)} FROM "{table}" {where} ORDER BY rowid'
    )
    for row in cur:
        d = dict.fromkeys(wanted)
        d.update(zip(cols, row))
        yield d


def _read(con, path: Path, database: Path, batch_rows: int) -> Export:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in tables) and NVTX not in tables:
        raise InputError(
            path, "tables", "expected an Nsight Systems export: no CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS table"
        )
    out = Export(path, format=FORMAT)
    base = 0
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(con, "TARGET_INFO_SESSION_START_TIME"):
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        try:
            base = int(row[0]) if row and row[0] is not None else 0
        except (TypeError, ValueError):  # a session start that is no number: the times stay relative
            base = 0
            out.notes["session_start"] = f"utcEpochNs is not an integer ({str(row[0])[:40]!r}): times left relative"
    out.notes["clock"] = (
        "epoch ns = TARGET_INFO_SESSION_START_TIME.utcEpochNs + nsys ns"
        if base
        else "ns relative to the session start (no TARGET_INFO_SESSION_START_TIME)"
    )
    for meta_table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if meta_table in tables:
            out.metadata["export"] = {str(k): v for k, v in con.execute(f'SELECT name, value FROM "{meta_table}"')}
    if "TARGET_INFO_GPU" in tables:
        cur = con.execute("SELECT * FROM TARGET_INFO_GPU ORDER BY rowid")
        names = [d[0] for d in cur.description]
        out.device_properties = [
            {k: (v if not isinstance(v, bytes) else v.hex()) for k, v in zip(names, r)} for r in cur
        ] or None
    present = [t for t in EVENT_TABLES if t in tables]
    out.notes["tables"] = present
    out.read.update(dict.fromkeys(present, 0))

    # several processes share correlation id values: scope them by pid
    pids = set()
    for t, col in ((RUNTIME, "globalTid"), (KERNEL, "globalPid"), (MEMCPY, "globalPid"), (MEMSET, "globalPid")):
        if t in tables and col in _columns(con, t):
            # a value that is no integer (text, a blob) is the rows' problem, reported where they are read
            pids |= {_pid(r[0]) for r in con.execute(f'SELECT DISTINCT "{col}" FROM "{t}"') if type(r[0]) is int}
    multi = len(pids) > 1
    out.notes["processes"] = sorted(pids)
    if multi:
        out.notes["correlation"] = "several processes: correlation = pid * 2**32 + correlationId (raw id in args)"

    def loader(duck, run_id: int, offset: int = 0) -> None:
        src = sqlite_files.connect(database)
        try:
            _load(src, duck, out, database, present, "StringIds" in tables, run_id, base + offset, multi, batch_rows)
        except sqlite3.Error as e:
            raise InputError(path, "database", f"expected a readable Nsight Systems SQLite export ({e})") from None
        finally:
            src.close()

    out.loader = loader
    return out


# --- the mapping, as DuckDB SQL over one Arrow batch `b` of a table (columns as in the export) ---


def _pid_sql(col: str) -> str:
    return f'((b."{col}" >> 24) & {TID_MASK - 1})'  # = globalTid // 2**24 % 2**24, also for negative ids


def _tid_sql(col: str) -> str:
    return f'(b."{col}" & {TID_MASK - 1})'


def _lookup_sql(mapping: dict, expr: str, default: str) -> str:
    whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in mapping.items())
    return f"(CASE {expr} {whens} ELSE {default} END)"


def _interval_sql(what: str) -> str:
    return (
        f"WHEN b.start IS NULL THEN '{what} without start' WHEN b.\"end\" IS NULL THEN '{what} without end' "
        f"WHEN b.\"end\" < b.start THEN '{what} with end before start'"
    )


def _json_sql(pairs: list[tuple[str, str]]) -> str:
    return "json_object(" + ", ".join(f"'{k}', {v}" for k, v in pairs) + ")"


def _str_sql(expr: str) -> str:
    """str() of a Python int or None, as the f-strings of the row-by-row reader wrote them."""
    return f"coalesce(CAST({expr} AS VARCHAR), 'None')"


GPU_COLUMNS = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid"]


def _gpu_args(extra: list[tuple[str, str]]) -> str:
    return _json_sql(
        [("device", "b.deviceId"), ("stream", "b.streamId"), ("correlation", "b.correlationId"),
         ("context", "b.contextId"), *extra, ("process", _pid_sql("globalPid"))]
    )  # fmt: skip


def _spec(table: str, multi: bool) -> dict:
    """Columns to fetch, string lookups (batch column -> id column), skip reason, a detail counted with skips, and
    the event_rows expressions (ROW_FIELDS order, ts without the shift) of one event table."""

    def corr(pid_sql: str) -> str:
        if not multi:
            return "b.correlationId"
        return f"(CASE WHEN b.correlationId IS NULL OR {pid_sql} IS NULL THEN b.correlationId ELSE ({pid_sql} << 32) + b.correlationId END)"  # noqa: E501

    dur = 'b."end" - b.start'
    gpu = {"ph": "'X'", "ts": "b.start", "dur": dur, "pid": "b.deviceId", "tid": "b.streamId", "device": "b.deviceId",
           "stream": "b.streamId"}  # fmt: skip
    if table == THREAD_NAMES:
        return {
            "cols": ["nameId", "priority", "globalTid"],
            "lookups": {"_s": "nameId"},
            "reason": "CASE WHEN b._s IS NULL THEN 'thread name with unknown string id' "
            "WHEN b.globalTid IS NULL THEN 'thread name without globalTid' END",
            "row": {"kind": "'metadata'", "ph": "'M'", "name": "'thread_name'", "pid": _pid_sql("globalTid"),
                    "tid": _tid_sql("globalTid"), "args": _json_sql([("name", "b._s"), ("priority", "b.priority")])},
        }  # fmt: skip
    if table == RUNTIME:
        kind = "(CASE WHEN b.eventClass = 1 THEN 'cuda_driver' ELSE 'cuda_runtime' END)"
        return {
            "cols": ["start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue"],
            "lookups": {"_s": "nameId", "_sv": "nameId"},
            "reason": f"CASE {_interval_sql('runtime call')} WHEN b._s IS NULL THEN 'runtime call with unknown "
            f"string id' WHEN b.eventClass NOT IN (0, 1) THEN '{OTHER_CLASS}' END",
            # e.g. class 67 in pipit's altered saxpy export: a second row per call, same correlation id
            "detail": "b.eventClass",
            "row": {"kind": kind, "ph": "'X'", "cat": kind, "name": "b._sv",
                    "ts": "b.start", "dur": dur, "pid": _pid_sql("globalTid"), "tid": _tid_sql("globalTid"),
                    "correlation": corr(_pid_sql("globalTid")),
                    "args": _json_sql([("correlation", "b.correlationId"), ("nsys name", "b._s"),
                                       ("eventClass", "b.eventClass"), ("returnValue", "b.returnValue")])},
        }  # fmt: skip
    if table == NVTX:
        text = "coalesce(b.text, b._s)"
        etype = (f"(CASE b.eventType WHEN {NVTX_PUSHPOP} THEN 'push/pop' WHEN {NVTX_STARTEND} THEN 'start/end' "
                 "ELSE 'mark' END)")  # fmt: skip
        pairs = [("domain", "(CASE WHEN b.domainId <> 0 THEN b._d END)"), ("domainId", "b.domainId"),
                 ("eventType", etype), ("category", "b.category"), ("color", "b.color")]  # fmt: skip
        end_tid = (
            f"b.eventType <> {NVTX_MARK} AND b.endGlobalTid IS NOT NULL AND b.endGlobalTid IS DISTINCT FROM b.globalTid"  # noqa: E501
        )
        args = f"(CASE WHEN {end_tid} THEN {_json_sql(pairs + [('end tid', _tid_sql('endGlobalTid'))])} ELSE {_json_sql(pairs)} END)"  # noqa: E501
        return {
            "cols": ["start", "end", "eventType", "category", "color", "text", "globalTid", "endGlobalTid", "textId",
                     "domainId"],
            "lookups": {"_s": "textId", "_d": "domainId"},
            "reason": f"CASE WHEN b.eventType IS NULL OR b.eventType NOT IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}, {NVTX_MARK}) "
            "THEN 'nvtx event that is not a range or mark (domain/category/thread naming)' "
            f"WHEN {text} IS NULL THEN (CASE WHEN b.textId IS NOT NULL THEN 'nvtx event with unknown string id' "
            "ELSE 'nvtx event without text' END) "
            f"WHEN b.eventType = {NVTX_MARK} THEN (CASE WHEN b.start IS NULL THEN 'nvtx mark without start' END) "
            f"{_interval_sql('nvtx range')} END",
            "row": {"kind": "'user_annotation'", "ph": f"(CASE WHEN b.eventType = {NVTX_MARK} THEN 'i' ELSE 'X' END)",
                    "cat": "'user_annotation'", "name": text, "ts": "b.start",
                    "dur": f"(CASE WHEN b.eventType = {NVTX_MARK} THEN NULL ELSE {dur} END)",
                    "pid": _pid_sql("globalTid"), "tid": _tid_sql("globalTid"), "args": args},
        }  # fmt: skip
    if table == KERNEL:
        shared = ("(CASE WHEN b.staticSharedMemory IS NOT NULL OR b.dynamicSharedMemory IS NOT NULL THEN "
                  "coalesce(b.staticSharedMemory, 0) + coalesce(b.dynamicSharedMemory, 0) END)")  # fmt: skip
        # the row-by-row reader took the first name that was not empty (Python's `or`)
        name = "coalesce(nullif(b._sd, ''), nullif(b._ss, ''), b._sm)"
        args = _gpu_args(
            [
                ("registers per thread", "b.registersPerThread"),
                ("shared memory", shared),
                ("static shared memory", "b.staticSharedMemory"),
                ("dynamic shared memory", "b.dynamicSharedMemory"),
                ("grid", "json_array(b.gridX, b.gridY, b.gridZ)"),
                ("block", "json_array(b.blockX, b.blockY, b.blockZ)"),
                ("short name", "b._ss"),
            ]
        )
        args = args[:-1] + ", 'graph node id', b.graphNodeId)"
        return {
            "cols": GPU_COLUMNS + ["demangledName", "shortName", "mangledName", "registersPerThread", "gridX", "gridY",
                                   "gridZ", "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory",
                                   "graphNodeId"],
            "lookups": {"_sd": "demangledName", "_ss": "shortName", "_sm": "mangledName"},
            "reason": f"CASE {_interval_sql('kernel')} WHEN {name} IS NULL THEN 'kernel with unknown string id' END",
            "row": {"kind": "'kernel'", "cat": "'kernel'", "name": name, "correlation": corr(_pid_sql("globalPid")),
                    "args": args, **gpu},
        }  # fmt: skip
    if table == MEMCPY:
        mem = ", ".join(
            f"{_lookup_sql(MEM_KINDS, f'b.{c}', f'CAST(b.{c} AS VARCHAR)')}" for c in ("srcKind", "dstKind")
        )
        src_dst = f"(CASE WHEN b.srcKind IS NOT NULL AND b.dstKind IS NOT NULL THEN ' (' || concat_ws(' -> ', {mem}) || ')' ELSE '' END)"  # noqa: E501
        name = f"'Memcpy ' || {_lookup_sql(MEMCPY_KINDS, 'b.copyKind', chr(39) + 'kind ' + chr(39) + ' || ' + _str_sql('b.copyKind'))} || {src_dst}"  # noqa: E501
        args = _gpu_args(
            [(c, f"b.{c}") for c in ("bytes", "copyKind", "srcKind", "dstKind", "srcDeviceId", "dstDeviceId")]
        )
        return {
            "cols": GPU_COLUMNS + ["bytes", "copyKind", "srcKind", "dstKind", "srcDeviceId", "dstDeviceId"],
            "reason": f"CASE {_interval_sql('memcpy')} END",
            "row": {"kind": "'gpu_memcpy'", "cat": "'gpu_memcpy'", "name": name,
                    "correlation": corr(_pid_sql("globalPid")), "args": args, **gpu},
        }  # fmt: skip
    if table == MEMSET:
        kind = _lookup_sql(MEM_KINDS, "b.memKind", "CAST(b.memKind AS VARCHAR)")
        return {
            "cols": GPU_COLUMNS + ["bytes", "value", "memKind"],
            "reason": f"CASE {_interval_sql('memset')} END",
            "row": {"kind": "'gpu_memset'", "cat": "'gpu_memset'",
                    "name": f"'Memset' || (CASE WHEN b.memKind IS NOT NULL THEN ' (' || {kind} || ')' ELSE '' END)",
                    "correlation": corr(_pid_sql("globalPid")),
                    "args": _gpu_args([(c, f"b.{c}") for c in ("bytes", "value", "memKind")]), **gpu},
        }  # fmt: skip
    assert table == SYNC
    return {
        "cols": GPU_COLUMNS + ["syncType", "eventId"],
        "reason": f"CASE {_interval_sql('synchronization')} END",
        # a sync's correlation id is the sync API call's, not a launch: kept in args only, so the
        # launches view (runtime call <-> GPU work) is not widened by it
        "row": {"kind": "'cuda_sync'", "cat": "'cuda_sync'",
                "name": _lookup_sql(SYNC_TYPES, "b.syncType", f"'sync type ' || {_str_sql('b.syncType')}"),
                "args": _gpu_args([("syncType", "b.syncType"), ("eventId", "b.eventId")]), **gpu},
    }  # fmt: skip


def _statements(table: str, spec: dict, run_id: int, shift: int) -> tuple[str, str]:
    """The INSERT of a batch's mapped rows and the count of its skipped rows by reason (and detail)."""
    # no join, no ORDER BY: a projection of the one Arrow batch keeps DuckDB's order-preserving insert
    source = "FROM _nsys_batch b"
    row = spec["row"]
    ts = row.get("ts")
    values = {**row, "ts": f"{ts} + {int(shift)}" if ts else None}
    reason = spec["reason"]
    if ts:  # times a BIGINT cannot hold once shifted (or their difference) are skipped, not an overflow
        ends = [f'b."{c}"::HUGEINT + {int(shift)}' for c in ("start", "end") if c in spec["cols"]]
        span = f'abs(b."end"::HUGEINT - b.start) > {ABSURD_NS} OR ' if "end" in spec["cols"] else ""
        reason = (f"CASE WHEN {span}" + " OR ".join(f"abs({e}) > {ABSURD_NS}" for e in ends)
                  + f" THEN '{TIME_REASON}' ELSE ({reason}) END")  # fmt: skip
    fields = ("kind", "ph", "cat", "name", "ts", "dur", "pid", "tid", "track", "device", "stream", "correlation")
    exprs = ", ".join(values.get(f) or "NULL" for f in fields)
    extra = orjson.dumps({"nsys_table": table}).decode()
    insert = (
        f"INSERT INTO event_rows SELECT {int(run_id)}::INTEGER, {exprs}, NULL, NULL, {row['args']}, "
        f"'{extra}'::JSON, NULL, NULL {source} WHERE ({reason}) IS NULL"
    )
    counts = (
        f"SELECT reason, detail, count(*) FROM (SELECT {reason} AS reason, {spec.get('detail', 'NULL')} "
        f"AS detail {source}) WHERE reason IS NOT NULL GROUP BY ALL"
    )
    return insert, counts


def _batches(src, path: Path, table: str, wanted: list[str], have: set[str], batch_rows: int):
    """(rows, Arrow table of the wanted columns) per batch of `table`, in rowid order.

    SQLite formats each batch as one CSV text (printf per row, group_concat) that Arrow parses: no
    Python object per row or value. Integers are written bare, text SQL-quoted ('it''s', NULL bare), so
    an empty text stays apart from NULL; a column the export lacks is all NULL."""
    import pyarrow as pa
    from pyarrow import csv

    types = {c: pa.string() if c == "text" else pa.int64() for c in wanted}
    values = ", ".join(
        "NULL" if c not in have else f'"{c}"' if types[c] == pa.int64() else f'CAST("{c}" AS TEXT)' for c in wanted
    )
    fmt = ",".join("%s" if types[c] == pa.int64() else "%Q" for c in wanted)
    query = (
        f"SELECT max(r), count(*), group_concat(line, char(10)) FROM (SELECT rowid AS r, printf('{fmt}', "
        f'{values}) AS line FROM "{table}" WHERE rowid > ? ORDER BY rowid LIMIT ?)'
    )
    parse = csv.ParseOptions(quote_char="'", double_quote=True, newlines_in_values="text" in wanted)
    convert = csv.ConvertOptions(
        column_types=types, null_values=["", "NULL"], strings_can_be_null=True, quoted_strings_can_be_null=False
    )
    names = csv.ReadOptions(column_names=list(types))
    last = -(1 << 63)
    src.text_factory = bytes  # the CSV goes to Arrow as the bytes SQLite made (Arrow checks the UTF-8)
    try:
        while True:
            top, n, text = src.execute(query, [last, batch_rows]).fetchone()
            if not n:
                return
            try:
                batch = csv.read_csv(pa.BufferReader(text), read_options=names, parse_options=parse,
                                     convert_options=convert)  # fmt: skip
            except (pa.ArrowException, ValueError) as e:
                raise InputError(path, f"table {table} after rowid {last}", f"expected integer columns and UTF-8 text"
                                 f" ({str(e).splitlines()[0]})") from None  # fmt: skip
            del text
            if batch.num_rows != n:
                raise InputError(
                    path, f"table {table} after rowid {last}", f"expected {n} rows, parsed {batch.num_rows}"
                )
            last = top
            yield n, batch
    finally:
        src.text_factory = str


def _with_lookups(batch, lookups: dict, tables: dict):
    """The batch with one text column per lookup (column name -> id column), the value of that id in its
    table (`tables[name]`: Arrow id and value arrays), NULL for an unknown or NULL id: an Arrow hash
    lookup instead of a join in DuckDB, which would make the batch's insert lose the row order. The
    column is dictionary-encoded over the table's values, so no text is copied per row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, col in lookups.items():
        ids, values = tables[name]
        found = pc.index_in(batch[col], value_set=ids, skip_nulls=True)
        texts = [pa.DictionaryArray.from_arrays(chunk, values) for chunk in found.chunks]
        batch = batch.append_column(name, pa.chunked_array(texts, pa.dictionary(pa.int32(), pa.string())))
    return batch


def _read_ahead(database: Path, path: Path, wanted: dict, batch_rows: int, tables: dict):
    """(table, rows, Arrow batch with its lookups) of every table in turn, fetched, parsed and looked up
    on a thread of its own while the caller inserts the previous batch (SQLite, Arrow and DuckDB all
    release the GIL); at most three batches are alive at once."""
    import queue
    import threading

    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            src = sqlite_files.connect(database)
            try:
                for table, (cols, have, lookups) in wanted.items():
                    for n, batch in _batches(src, path, table, cols, have, batch_rows):
                        if not put((table, n, _with_lookups(batch, lookups, tables))):
                            return
            finally:
                src.close()
            put(None)
        except BaseException as e:  # raised again on the caller's thread
            put(e)

    thread = threading.Thread(target=produce, name="nsys-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _load(src, duck, out: Export, database: Path, present: list[str], has_strings: bool, run_id: int, shift: int, multi: bool,
          batch_rows: int) -> None:  # fmt: skip
    import duckdb
    import pyarrow as pa
    import pyarrow.compute as pc

    strings = dict(src.execute("SELECT id, value FROM StringIds")) if has_strings else {}
    domains = {}
    if NVTX in present and "eventType" in _columns(src, NVTX):
        for r in _select(src, NVTX, ["domainId", "text", "textId"], f"WHERE eventType = {NVTX_DOMAIN_CREATE}"):
            domains[r["domainId"]] = r["text"] or strings.get(r["textId"])
    try:
        ids, values = pa.array(list(strings), pa.int64()), pa.array(list(strings.values()), pa.string())
        domain_names = (pa.array(list(domains), pa.int64()), pa.array(list(domains.values()), pa.string()))
    except (pa.ArrowException, TypeError, OverflowError) as e:
        raise InputError(out.source, "StringIds", f"expected integer ids and text values ({e})") from None
    specs = {table: _spec(table, multi) for table in present}
    wanted = {table: (spec["cols"], _columns(src, table), spec.get("lookups", {})) for table, spec in specs.items()}
    # runtime names without the version suffix: the regex runs once per string, not once per call
    unversioned = pc.replace_substring_regex(values, pattern=VERSION_SUFFIX, replacement="", max_replacements=1)
    tables = {"_s": (ids, values), "_sd": (ids, values), "_ss": (ids, values), "_sm": (ids, values),
              "_sv": (ids, unversioned), "_d": domain_names}  # fmt: skip
    statements = {table: _statements(table, spec, run_id, shift) for table, spec in specs.items()}
    classes: dict = {}
    # one DuckDB thread: the read-ahead thread keeps the other core busy, and a second DuckDB thread
    # only fought it for that core (64 MB export: 4.8 -> 4.2 s CPU); the caller's setting comes back after
    threads = duck.execute("SELECT current_setting('threads')").fetchone()[0]
    duck.execute("SET threads = 1")
    try:
        for table, n, _nsys_batch in _read_ahead(database, out.source, wanted, batch_rows, tables):  # noqa: B007
            insert, counts = statements[table]
            try:
                duck.execute(insert)
            except duckdb.Error as e:  # a value the checks let through that the event columns cannot hold
                raise InputError(out.source, f"table {table}", f"values the event columns hold ({e})") from None
            for reason, detail, k in duck.execute(counts).fetchall():
                out.skipped[reason] += k
                if reason == OTHER_CLASS:
                    classes[detail] = classes.get(detail, 0) + k
            out.read[table] += n
    finally:
        # after a failed insert the transaction is aborted until ingest rolls it back: SET waits for that
        with contextlib.suppress(duckdb.TransactionException):
            duck.execute(f"SET threads = {int(threads)}")
    if classes:
        out.notes["runtime_other_event_classes"] = {str(k): v for k, v in sorted(classes.items())}
    out.notes["rows_read"] = dict(out.read)
