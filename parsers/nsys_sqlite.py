"""Nsight Systems SQLite export -> event_rows of one run, in the same shape as a Kineto trace.

Read with Python's sqlite3 (DuckDB's sqlite extension is not available offline). Tables and columns
are probed (sqlite_master, PRAGMA table_info), never assumed: the schema changes every release.

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

import re
import sqlite3
from collections import Counter
from pathlib import Path

import orjson

from tracekit.errors import InputError

from .rows import Export, load  # noqa: F401  (load: this reader's rows go in as every reader's do)

FORMAT = "nsys_sqlite"
MAGIC = b"SQLite format 3\x00"

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
VERSION_SUFFIX = re.compile(r"_v\d+$")
TID_MASK = 0x1000000


def is_nsys_path(path: Path) -> bool:
    """A SQLite database file (judged by its 16-byte header); never raises."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == MAGIC
    except OSError:
        return False


def _pid(global_tid):
    return None if global_tid is None else global_tid // TID_MASK % TID_MASK


def _tid(global_tid):
    return None if global_tid is None else global_tid % TID_MASK


def read(path: Path) -> Export:
    """Every row of the event tables, mapped; InputError for a file that is not a readable nsys export."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise InputError(path, "file", f"expected a readable file ({e.strerror})") from None
    if head != MAGIC:
        raise InputError(path, "byte 0", "expected an Nsight Systems SQLite export (SQLite header)")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as e:
        raise InputError(path, "database", f"expected a readable SQLite database ({e})") from None
    try:
        return _read(con, path)
    except sqlite3.Error as e:
        raise InputError(path, "database", f"expected a readable Nsight Systems SQLite export ({e})") from None
    finally:
        con.close()


def _columns(con, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def _select(con, table: str, wanted: list[str]):
    """Rows of `table` as dicts with every wanted column (None when the export lacks it), in rowid order."""
    have = _columns(con, table)
    cols = [c for c in wanted if c in have]
    cur = con.execute(f'SELECT {", ".join(f"{chr(34)}{c}{chr(34)}" for c in cols)} FROM "{table}" ORDER BY rowid')
    for row in cur:
        d = dict.fromkeys(wanted)
        d.update(zip(cols, row))
        yield d


def _read(con, path: Path) -> Export:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in tables) and NVTX not in tables:
        raise InputError(
            path, "tables", "expected an Nsight Systems export: no CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS table"
        )
    out = Export(path)
    strings = dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
    base = 0
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(con, "TARGET_INFO_SESSION_START_TIME"):
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        base = int(row[0]) if row and row[0] is not None else 0
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
            pids |= {_pid(r[0]) for r in con.execute(f'SELECT DISTINCT "{col}" FROM "{t}"') if r[0] is not None}
    multi = len(pids) > 1
    out.notes["processes"] = sorted(pids)
    if multi:
        out.notes["correlation"] = "several processes: correlation = pid * 2**32 + correlationId (raw id in args)"

    def corr(cid, pid):
        if cid is None:
            return None
        return (pid << 32) + cid if multi and pid is not None else cid

    def emit(table, kind, ph, cat, name, ts, dur, pid, tid, device, stream, correlation, args):
        out.rows.append((kind, ph, cat, name, None if ts is None else ts + base, dur, pid, tid, None, device, stream,
                         correlation, None, None, orjson.dumps(args).decode() if args is not None else None,
                         orjson.dumps({"nsys_table": table}).decode()))  # fmt: skip

    def skip(table, reason):
        out.skipped[reason] += 1

    def interval(table, r, what):
        if r["start"] is None:
            skip(table, f"{what} without start")
            return None
        if r["end"] is None:
            skip(table, f"{what} without end")
            return None
        if r["end"] < r["start"]:
            skip(table, f"{what} with end before start")
            return None
        return r["end"] - r["start"]

    if THREAD_NAMES in tables:
        for r in _select(con, THREAD_NAMES, ["nameId", "priority", "globalTid"]):
            out.read[THREAD_NAMES] += 1
            name = strings.get(r["nameId"])
            if name is None or r["globalTid"] is None:
                skip(
                    THREAD_NAMES,
                    "thread name with unknown string id" if name is None else "thread name without globalTid",
                )
                continue
            emit(THREAD_NAMES, "metadata", "M", None, "thread_name", None, None, _pid(r["globalTid"]),
                 _tid(r["globalTid"]), None, None, None, {"name": name, "priority": r["priority"]})  # fmt: skip

    if RUNTIME in tables:
        cols = ["start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue", "callchainId"]
        classes: Counter = Counter()
        for r in _select(con, RUNTIME, cols):
            out.read[RUNTIME] += 1
            dur = interval(RUNTIME, r, "runtime call")
            if dur is None:
                continue
            raw = strings.get(r["nameId"])
            if raw is None:
                skip(RUNTIME, "runtime call with unknown string id")
                continue
            if r["eventClass"] not in (None, 0, 1):
                # e.g. class 67 in pipit's altered saxpy export: a second row per call, same correlation id
                classes[r["eventClass"]] += 1
                skip(RUNTIME, "runtime row of another event class (not CUDA runtime/driver)")
                continue
            kind = "cuda_driver" if r["eventClass"] == 1 else "cuda_runtime"
            pid, tid = _pid(r["globalTid"]), _tid(r["globalTid"])
            args = {"correlation": r["correlationId"], "nsys name": raw, "eventClass": r["eventClass"],
                    "returnValue": r["returnValue"]}  # fmt: skip
            emit(RUNTIME, kind, "X", kind, VERSION_SUFFIX.sub("", raw), r["start"], dur, pid, tid, None, None,
                 corr(r["correlationId"], pid), args)  # fmt: skip
        if classes:
            out.notes["runtime_other_event_classes"] = {str(k): v for k, v in sorted(classes.items())}

    if NVTX in tables:
        cols = ["start", "end", "eventType", "rangeId", "category", "color", "text", "globalTid", "endGlobalTid",
                "textId", "domainId"]  # fmt: skip
        nvtx = list(_select(con, NVTX, cols))
        domains = {r["domainId"]: r["text"] or strings.get(r["textId"]) for r in nvtx
                   if r["eventType"] == NVTX_DOMAIN_CREATE}  # fmt: skip
        for r in nvtx:
            out.read[NVTX] += 1
            etype = r["eventType"]
            if etype not in (NVTX_PUSHPOP, NVTX_STARTEND, NVTX_MARK):
                skip(NVTX, "nvtx event that is not a range or mark (domain/category/thread naming)")
                continue
            text = r["text"] if r["text"] is not None else strings.get(r["textId"])
            if text is None:
                skip(
                    NVTX, "nvtx event with unknown string id" if r["textId"] is not None else "nvtx event without text"
                )
                continue
            args = {"domain": domains.get(r["domainId"]) if r["domainId"] else None, "domainId": r["domainId"],
                    "eventType": "push/pop" if etype == NVTX_PUSHPOP else "start/end" if etype == NVTX_STARTEND else "mark",
                    "category": r["category"], "color": r["color"]}  # fmt: skip
            pid, tid = _pid(r["globalTid"]), _tid(r["globalTid"])
            if etype == NVTX_MARK:
                if r["start"] is None:
                    skip(NVTX, "nvtx mark without start")
                    continue
                emit(NVTX, "user_annotation", "i", "user_annotation", text, r["start"], None, pid, tid, None, None,
                     None, args)  # fmt: skip
                continue
            dur = interval(NVTX, r, "nvtx range")
            if dur is None:
                continue
            if r["endGlobalTid"] is not None and r["endGlobalTid"] != r["globalTid"]:
                args["end tid"] = _tid(r["endGlobalTid"])
            emit(NVTX, "user_annotation", "X", "user_annotation", text, r["start"], dur, pid, tid, None, None, None,
                 args)  # fmt: skip

    gpu_common = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid"]
    if KERNEL in tables:
        cols = gpu_common + ["demangledName", "shortName", "mangledName", "registersPerThread", "gridX", "gridY",
                             "gridZ", "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory",
                             "localMemoryPerThread", "launchType", "graphNodeId", "gridId"]  # fmt: skip
        for r in _select(con, KERNEL, cols):
            out.read[KERNEL] += 1
            dur = interval(KERNEL, r, "kernel")
            if dur is None:
                continue
            name = strings.get(r["demangledName"]) or strings.get(r["shortName"]) or strings.get(r["mangledName"])
            if name is None:
                skip(KERNEL, "kernel with unknown string id")
                continue
            shared = None
            if r["staticSharedMemory"] is not None or r["dynamicSharedMemory"] is not None:
                shared = (r["staticSharedMemory"] or 0) + (r["dynamicSharedMemory"] or 0)
            args = {"device": r["deviceId"], "stream": r["streamId"], "correlation": r["correlationId"],
                    "context": r["contextId"], "registers per thread": r["registersPerThread"],
                    "shared memory": shared, "static shared memory": r["staticSharedMemory"],
                    "dynamic shared memory": r["dynamicSharedMemory"], "grid": [r["gridX"], r["gridY"], r["gridZ"]],
                    "block": [r["blockX"], r["blockY"], r["blockZ"]], "short name": strings.get(r["shortName"]),
                    "process": _pid(r["globalPid"]), "graph node id": r["graphNodeId"]}  # fmt: skip
            emit(KERNEL, "kernel", "X", "kernel", name, r["start"], dur, r["deviceId"], r["streamId"], r["deviceId"],
                 r["streamId"], corr(r["correlationId"], _pid(r["globalPid"])), args)  # fmt: skip

    if MEMCPY in tables:
        cols = gpu_common + ["bytes", "copyKind", "srcKind", "dstKind", "srcDeviceId", "dstDeviceId", "graphNodeId"]
        for r in _select(con, MEMCPY, cols):
            out.read[MEMCPY] += 1
            dur = interval(MEMCPY, r, "memcpy")
            if dur is None:
                continue
            name = f"Memcpy {MEMCPY_KINDS.get(r['copyKind'], 'kind ' + str(r['copyKind']))}"
            if r["srcKind"] is not None and r["dstKind"] is not None:
                name += f" ({MEM_KINDS.get(r['srcKind'], r['srcKind'])} -> {MEM_KINDS.get(r['dstKind'], r['dstKind'])})"
            args = {"device": r["deviceId"], "stream": r["streamId"], "correlation": r["correlationId"],
                    "context": r["contextId"], "bytes": r["bytes"], "copyKind": r["copyKind"], "srcKind": r["srcKind"],
                    "dstKind": r["dstKind"], "srcDeviceId": r["srcDeviceId"], "dstDeviceId": r["dstDeviceId"],
                    "process": _pid(r["globalPid"])}  # fmt: skip
            emit(MEMCPY, "gpu_memcpy", "X", "gpu_memcpy", name, r["start"], dur, r["deviceId"], r["streamId"],
                 r["deviceId"], r["streamId"], corr(r["correlationId"], _pid(r["globalPid"])), args)  # fmt: skip

    if MEMSET in tables:
        for r in _select(con, MEMSET, gpu_common + ["bytes", "value", "memKind"]):
            out.read[MEMSET] += 1
            dur = interval(MEMSET, r, "memset")
            if dur is None:
                continue
            name = "Memset" + (f" ({MEM_KINDS.get(r['memKind'], r['memKind'])})" if r["memKind"] is not None else "")
            args = {"device": r["deviceId"], "stream": r["streamId"], "correlation": r["correlationId"],
                    "context": r["contextId"], "bytes": r["bytes"], "value": r["value"], "memKind": r["memKind"],
                    "process": _pid(r["globalPid"])}  # fmt: skip
            emit(MEMSET, "gpu_memset", "X", "gpu_memset", name, r["start"], dur, r["deviceId"], r["streamId"],
                 r["deviceId"], r["streamId"], corr(r["correlationId"], _pid(r["globalPid"])), args)  # fmt: skip

    if SYNC in tables:
        for r in _select(con, SYNC, gpu_common + ["syncType", "eventId"]):
            out.read[SYNC] += 1
            dur = interval(SYNC, r, "synchronization")
            if dur is None:
                continue
            name = SYNC_TYPES.get(r["syncType"], f"sync type {r['syncType']}")
            args = {"device": r["deviceId"], "stream": r["streamId"], "correlation": r["correlationId"],
                    "context": r["contextId"], "syncType": r["syncType"], "eventId": r["eventId"],
                    "process": _pid(r["globalPid"])}  # fmt: skip
            # a sync's correlation id is the sync API call's, not a launch: kept in args only, so the
            # launches view (runtime call <-> GPU work) is not widened by it
            emit(SYNC, "cuda_sync", "X", "cuda_sync", name, r["start"], dur, r["deviceId"], r["streamId"],
                 r["deviceId"], r["streamId"], None, args)  # fmt: skip

    out.notes["rows_read"] = dict(out.read)
    return out
detect = is_nsys_path  # the row-reader interface (tracekit.ingest.ROW_READERS)
