"""What rules share beyond SQL: named result rows, the runs and their windows, a finding's locality in
one shape, thread names, Python code paths and enclosing ops of an event."""

from __future__ import annotations

import functools
import re
import threading
from collections import namedtuple
from dataclasses import dataclass

from tracekit.findings.model import LOCALITY_KEYS

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")

Ancestor = namedtuple("Ancestor", "event_id kind name")
Op = namedtuple("Op", "event_id name input_dims")


@functools.lru_cache(maxsize=256)
def _row_type(columns: tuple[str, ...]):
    # an unaliased expression (`count(*)`) is not a valid field name and fails here, loudly
    return namedtuple("Row", columns)


def rows(con, sql: str, params=None) -> list:
    """The query's rows as named tuples: `row.busy_ns`, never `row[7]`."""
    cur = con.execute(sql, params) if params is not None else con.execute(sql)
    make = _row_type(tuple(d[0] for d in cur.description))._make
    return [make(r) for r in cur.fetchall()]


def one(con, sql: str, params=None):
    """The query's first row as a named tuple, or None."""
    found = rows(con, sql, params)
    return found[0] if found else None


@dataclass
class RunInfo:
    run_id: int
    label: str
    rank: int | None
    start_ns: int | None
    end_ns: int | None

    @property
    def window_ns(self) -> int:
        return int((self.end_ns or 0) - (self.start_ns or 0))

    def locality(self) -> dict:
        return {"run_id": self.run_id, "run_label": self.label, "rank": self.rank}


def contains_any(column: str, patterns: str) -> str:
    """SQL: whether `column` contains any of `patterns` (an SQL text or parameter holding
    comma-separated, case-insensitive substrings, as the rules' skip options are written)."""
    return (
        f"len(list_filter(string_split(lower({patterns}), ','), lambda p: trim(p) <> '' "
        f"AND contains(lower({column}), trim(p)))) > 0"
    )


def locality(run: RunInfo, **where) -> dict:
    """A finding's locality: the run's keys, then `where` in the schema's key order. A key passed as
    None stays (as "not known"); a window becomes a pair of ints and an empty code path None, so two
    rules describing one place produce the same dict and the same finding id."""
    unknown = set(where) - set(LOCALITY_KEYS)
    if unknown:
        raise ValueError(f"unknown locality keys: {sorted(unknown)}")
    if where.get("window_ns") is not None:
        where["window_ns"] = [int(t) for t in where["window_ns"]]
    if "code_path" in where:
        where["code_path"] = list(where["code_path"] or []) or None
    return {**run.locality(), **{k: where[k] for k in LOCALITY_KEYS if k in where}}


class _Once:
    """Values computed once per analysis, whichever of its threads asks first; the others wait for it."""

    def __init__(self):
        self._values: dict = {}
        self._lock = threading.Lock()
        self._key_locks: dict = {}

    def get(self, key, compute):
        with self._lock:
            if key in self._values:
                return self._values[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self._values:  # a failed computation is not kept: the next asker tries again
                value = compute()
                with self._lock:
                    self._values[key] = value
            return self._values[key]


class Context:
    """What a rule may ask beyond SQL: the runs, their windows, and shared lookups."""

    def __init__(self, con, _of: Context | None = None):
        self.con = con
        if _of is not None:
            self.runs, self._once = _of.runs, _of._once
            return
        self.runs = [
            RunInfo(*r) for r in rows(con, "SELECT run_id, label, rank, start_ns, end_ns FROM runs ORDER BY run_id")
        ]
        self._once = _Once()

    def on(self, con) -> Context:
        """The same analysis read through another connection of the database (a rule thread's own):
        what `once` computed is shared, the SQL runs on `con`."""
        return Context(con, _of=self)

    def once(self, key, compute):
        """`compute()` (which may query `self.con`) the first time any Context of this analysis asks
        for `key`, its value after that: what several rules, or one rule's runs, measure alike."""
        return self._once.get(key, compute)

    def run(self, run_id: int) -> RunInfo:
        return next(r for r in self.runs if r.run_id == run_id)

    @property
    def _workloads(self) -> tuple[dict, type]:
        return self.once("workload_context", self._workload_rows)

    def _workload_rows(self) -> tuple[dict, type]:
        import duckdb

        # one statement: planning the view costs about as much as a LIMIT 0 probe for its columns would
        try:
            cur = self.con.execute("SELECT * FROM workload_context")
            columns, found = tuple(d[0] for d in cur.description), cur.fetchall()
        except duckdb.Error:  # e.g. out of memory: advice then falls back to what fits any workload
            columns = tuple(
                r[0]
                for r in self.con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
                    "AND schema_name = 'main' "
                    "AND table_name = 'workload_context' ORDER BY column_index"
                ).fetchall()
            )
            found = []
        row_type = _row_type(columns)
        return {r[0]: row_type._make(r) for r in found}, row_type

    def workload(self, run_id: int):
        """The run's `workload_context` row (every column None for a run the view has no row for):
        what the advice of a finding is chosen for."""
        found, row_type = self._workloads
        return found.get(run_id) or row_type._make([run_id] + [None] * (len(row_type._fields) - 1))

    def on_npu(self, run_id: int) -> bool:
        """Whether the run profiled an Ascend NPU (`workload_context.accelerator`)."""
        return getattr(self.workload(run_id), "accelerator", None) == "npu"

    def device_word(self, run_id: int) -> str:
        """What the run's accelerator is called in a finding's text: `NPU` on Ascend, else `GPU`."""
        return "NPU" if self.on_npu(run_id) else "GPU"

    @property
    def _flagged_checks(self) -> tuple[list, str | None]:
        from tracekit.engine.quality import flagged_checks

        return self.once("data_quality", lambda: flagged_checks(self.con))

    def data_quality(self, run_id: int | None = None) -> list:
        """The flagged `data_quality` checks of a run (of every run when run_id is None)."""
        return [c for c in self._flagged_checks[0] if run_id is None or c.run_id == run_id]

    @property
    def data_quality_error(self) -> str | None:
        """Why the data-quality checks could not be computed, else None."""
        return self._flagged_checks[1]

    def thread_name(self, run_id: int, pid: int, tid: int) -> str | None:
        """The thread's name, from the run's `threads` rows read once per analysis."""
        names = self.once(
            ("thread names", run_id),
            lambda: {
                (p, t): name
                for p, t, name in self.con.execute(
                    "SELECT pid, tid, name FROM threads WHERE run_id = ?", [run_id]
                ).fetchall()
            },
        )
        return names.get((pid, tid))

    def thread(self, run_id: int, pid: int | None, tid: int | None) -> dict:
        """The thread keys of a locality: pid, tid and the thread's name when both ids are known."""
        name = self.thread_name(run_id, pid, tid) if pid is not None and tid is not None else None
        return {"pid": pid, "tid": tid, "thread_name": name}

    def pids_of(self, event_ids) -> dict[int, int | None]:
        """The process of each event (None skipped), by rowid."""
        return dict(self._rows_by_id(sorted({int(e) for e in event_ids if e is not None}), "pid"))

    def graph_launches(self, run_id: int) -> int:
        """CUDA graph replays in the run: their kernels share one launch call, which changes what
        per-launch numbers mean."""
        return self.once(
            ("graph_launches", run_id),
            lambda: self.con.execute(
                "SELECT count(*) FROM runtime_calls WHERE run_id = ? AND name ILIKE '%GraphLaunch%'", [run_id]
            ).fetchone()[0],
        )

    def code_path(self, event_id: int | None, limit: int = 6) -> list[str]:
        """Python frames around an event, innermost first: the frames on its thread that contain it."""
        return self.code_paths([event_id], limit).get(event_id, []) if event_id is not None else []

    def code_paths(self, event_ids, limit: int = 6) -> dict[int, list[str]]:
        """`code_path` of each event (None skipped), in two queries a run rather than two an event:
        a rule that names the code of its top items asks for them together."""
        wanted = sorted({int(e) for e in event_ids if e is not None})
        if not wanted:
            return {}
        out: dict[int, list[str]] = {e: [] for e in wanted}
        # the events' threads and spans first, by rowid: the frames are then read from each run's rows
        # alone (a join of `events` with `python_functions` scanned every run's frames, per call)
        by_run: dict[int, list[tuple]] = {}
        for event_id, run_id, pid, tid, ts_ns, end_ns in self._rows_by_id(
            wanted, "run_id, pid, tid, ts_ns, ts_ns + coalesce(dur_ns, 0)"
        ):
            if pid is not None and tid is not None:
                by_run.setdefault(run_id, []).append((event_id, pid, tid, ts_ns, end_ns))
        for run_id, targets in by_run.items():
            if len(wanted) == 1:  # one event: a plain ordered read, cheaper to plan than the join below
                _, pid, tid, ts_ns, end_ns = targets[0]
                found = self.con.execute(
                    """
                    SELECT rowid, name FROM event_rows
                    WHERE run_id = ? AND kind = 'python_function' AND pid = ? AND tid = ? AND ts_ns <= ?
                      AND ts_ns + coalesce(dur_ns, 0) >= ?
                    ORDER BY CASE WHEN ph = 'X' THEN coalesce(depth, 0) END DESC, ts_ns DESC, rowid DESC LIMIT ?
                    """,
                    [run_id, pid, tid, ts_ns, end_ns, limit],
                ).fetchall()
                found = [(wanted[0], name) for _, name in found]
            else:
                found = self._frames_of(run_id, targets, limit)
            for event_id, name in found:
                # builtin frames name a live object ("... object at 0x7f..."): drop the address so
                # locality, and with it the finding id, is the same in every run
                out[event_id].append(_ADDRESS.sub("", name))
        return out

    def _frames_of(self, run_id: int, targets: list[tuple], limit: int) -> list[tuple]:
        """(event id, frame name) of the frames around each target of one run, innermost first."""
        values = ", ".join(f"({int(e)}, {int(p)}, {int(t)}, {int(s)}, {int(n)})" for e, p, t, s, n in targets)
        # frames cut at the trace's end can share a depth: of those, the later start is the inner one
        inner_first = "CASE WHEN f.ph = 'X' THEN coalesce(f.depth, 0) END DESC, f.ts_ns DESC, f.rowid DESC"
        return self.con.execute(
            f"""
            WITH target(event_id, pid, tid, ts_ns, end_ns) AS (VALUES {values})
            SELECT t.event_id, f.name FROM target t JOIN event_rows f ON f.pid = t.pid AND f.tid = t.tid
            WHERE f.run_id = ? AND f.kind = 'python_function'
              AND f.ts_ns <= t.ts_ns AND f.ts_ns + coalesce(f.dur_ns, 0) >= t.end_ns
            QUALIFY row_number() OVER (PARTITION BY t.event_id ORDER BY {inner_first}) <= ?
            ORDER BY t.event_id, {inner_first}
            """,
            [run_id, limit],
        ).fetchall()

    def ancestors_of(self, event_ids, limit: int = 64) -> dict[int, list[Ancestor]]:
        """Each event's ancestors, nearest first (at most `limit`), by rowid lookups one level at a
        time for every event together (a recursive CTE would join the whole table once per level)."""
        wanted = sorted({int(e) for e in event_ids})
        chains: dict[int, list[Ancestor]] = {e: [] for e in wanted}
        nodes: dict[int, tuple] = {}  # rowid -> (kind, name, parent_id), shared by the chains that meet
        current = {e: None for e in wanted}
        for event_id, parent_id in self._rows_by_id(wanted, "parent_id"):
            current[event_id] = parent_id
        while True:
            climbing = {e: c for e, c in current.items() if c is not None and len(chains[e]) < limit}
            if not climbing:
                return chains
            missing = sorted({c for c in climbing.values() if c not in nodes})
            for rowid, kind, name, parent_id in self._rows_by_id(missing, "kind, name, parent_id"):
                nodes[rowid] = (kind, name, parent_id)
            for e, c in climbing.items():
                if c not in nodes:  # a parent the table does not hold: the chain ends there
                    current[e] = None
                    continue
                kind, name, parent_id = nodes[c]
                chains[e].append(Ancestor(c, kind, name))
                current[e] = parent_id

    def _rows_by_id(self, rowids: list[int], columns: str) -> list[tuple]:
        """(rowid, *columns) of these rows of event_rows."""
        if not rowids:
            return []
        if len(rowids) == 1:  # an equality on rowid is a point read; IN a list, a scan with a filter
            return self.con.execute(f"SELECT rowid, {columns} FROM event_rows WHERE rowid = ?", rowids).fetchall()
        return self.con.execute(
            f"SELECT rowid, {columns} FROM event_rows WHERE rowid IN (SELECT unnest(?::BIGINT[]))", [rowids]
        ).fetchall()

    def enclosing_ops(self, event_ids, outermost: bool = False) -> dict[int, Op | None]:
        """The nearest (or outermost) cpu_op above each event (None skipped), with its input dims, their
        lookups made together. ProfilerStep#N, a cpu_op in old traces, is a step, not an op."""
        chosen: dict[int, Ancestor | None] = {}
        for event_id, chain in self.ancestors_of(e for e in event_ids if e is not None).items():
            ops = [a for a in chain if a.kind == "cpu_op" and not a.name.startswith("ProfilerStep#")]
            chosen[event_id] = (ops[-1] if outermost else ops[0]) if ops else None
        dims = dict(
            self._rows_by_id(
                sorted({a.event_id for a in chosen.values() if a is not None}),
                "CAST(coalesce(args->'Input Dims', args->'Input dims') AS VARCHAR)",
            )
        )
        return {e: None if a is None else Op(a.event_id, a.name, dims.get(a.event_id)) for e, a in chosen.items()}


def user_frame(code_path: list[str]) -> str:
    """The innermost nn.Module and user frame of a code path (innermost first), e.g.
    `nn.Module: Linear_3 in model.py(241): decode`; torch internals and builtins are skipped."""
    module = next((f for f in code_path if f.startswith("nn.Module")), None)
    user = next((f for f in code_path if not f.startswith(("torch/", "<built-in", "nn.Module", "<"))), None)
    parts = [p for p in (module, user) if p]
    return " in ".join(parts) if parts else (code_path[0] if code_path else "")
