"""Read-only SQL over a trace database for a model: no writes, files, network, extensions or ATTACH,
nothing about the host, and limits that one expression cannot overrun.

Three independent layers, so one mistake does not open the others:
1. Before anything runs, DuckDB's own parser (`duckdb.extract_statements`) must see exactly one
   statement of type SELECT (which covers FROM-first queries, DESCRIBE, SHOW and SUMMARIZE).
2. The statement runs in a fresh in-memory DuckDB instance that attached the database file READ_ONLY and
   then switched off external access (files, network, ATTACH, COPY, INSTALL/LOAD) and locked its
   configuration, so no later SET can switch it back on. Extension autoload/autoinstall and community
   extensions are off from the start; there is no temp directory (nothing spills) and no home.
3. What it calls and names, from DuckDB's own parse tree, is checked (reach.py): DuckDB's settings,
   the attached paths, dynamic SQL (`query`) and globbing are out of reach.
Limits: the query runs in a worker process (query_worker.py) under an address-space limit and is
interrupted at `timeout_s`, the worker killed if it does not stop; DuckDB's memory_limit (which
`max_memory` names too) is the same budget. At most `max_rows` rows and MAX_RESULT_CHARS
characters come back (the result says when more existed), and long cells are cut.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

MAX_CELL_CHARS = 500
MAX_RESULT_CHARS = 1 << 20  # all cells of one result together, after each is cut
MEMORY_MB = 1024
_ALLOWED = ("SELECT",)
_OUT_OF_REACH = "the query tool reads only the trace database: no files, settings, network, extensions or ATTACH"
_SMALLER = "aggregate in SQL, select fewer rows or columns, or avoid building huge strings and lists"


class QueryRefused(Exception):
    """The statement was refused before or while running; `hint` says what to do instead."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


class OutOfMemory(QueryRefused):
    """The query needed more memory than the sandbox has."""


def check_statement(sql: str) -> None:
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryRefused(
            f"SQL does not parse: {_one_line(e)}", "check the syntax; describe_schema lists the tables"
        ) from None
    if len(statements) != 1:
        raise QueryRefused(
            f"expected exactly one statement, got {len(statements)}", "send one SELECT statement per call"
        )
    kind = statements[0].type.name
    if kind not in _ALLOWED:
        raise QueryRefused(
            f"{kind} statements are not allowed: the query tool is read-only",
            "use SELECT (or DESCRIBE / SHOW / SUMMARIZE); tables and views are listed by describe_schema",
        )


def open_sandbox(db_path: str | Path, memory_limit: str = f"{MEMORY_MB}MB", threads: int = 2):
    """A connection whose default catalog is the trace database, read-only, with external access off."""
    import duckdb

    con = duckdb.connect(
        ":memory:",
        config={
            "allow_community_extensions": "false",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "allow_persistent_secrets": "false",
            "memory_limit": memory_limit,
            "threads": str(threads),
            # no spilling: a query gets memory_limit and no disk, and no temp path to show
            "temp_directory": "",
            "max_temp_directory_size": "0B",
            # what DuckDB derives from the home directory (secrets, extensions) names no real one
            "home_directory": "/nonexistent",
        },
    )
    path = str(Path(db_path).resolve()).replace("'", "''")
    con.execute(f"ATTACH '{path}' AS trace (READ_ONLY)")
    con.execute("USE trace")
    con.execute("SET enable_progress_bar = false")  # nobody sees it
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def check_reach(con, sql: str) -> None:
    """QueryRefused when the statement calls or names something a trace query does not need (reach.py)."""
    from tracekit.agent import reach

    try:
        reach.check(con, sql)
    except reach.Unreachable as e:
        if e.name is None:
            raise QueryRefused(
                f"this form of statement cannot be checked: {e}", "write it as a plain SELECT (GROUP BY for PIVOT)"
            ) from None
        raise QueryRefused(str(e), _OUT_OF_REACH) from None


def run_query(
    db_path: str | Path,
    sql: str,
    max_rows: int = 100,
    timeout_s: float = 10.0,
    params: dict | None = None,
    memory_mb: int = MEMORY_MB,
) -> dict:
    """Run one read-only SELECT in a sandbox worker; returns {columns, rows, row_count, truncated,
    elapsed_s}. QueryRefused when it is not allowed, fails, runs past `timeout_s` or needs more
    than `memory_mb` MB."""
    from tracekit.agent.query_worker import KILL_GRACE_S, POOL, WorkerLost

    check_statement(sql)
    job = {"db_path": str(db_path), "sql": sql, "max_rows": max_rows, "timeout_s": timeout_s, "params": params}
    started = time.perf_counter()
    try:
        answer = POOL.run(job, memory_mb, timeout_s + KILL_GRACE_S)
    except WorkerLost as e:
        raise QueryRefused(str(e), _SMALLER) from None
    if "refused" in answer:
        raise QueryRefused(*answer["refused"])
    return answer["result"] | {"elapsed_s": round(time.perf_counter() - started, 3)}


def execute(
    db_path: str, sql: str, max_rows: int, timeout_s: float, params: dict | None, memory_mb: int = MEMORY_MB
) -> dict:
    """One query in this process (the worker's side of run_query): {columns, rows, row_count, truncated}."""
    import duckdb

    check_statement(sql)
    try:
        con = open_sandbox(db_path, memory_limit=f"{memory_mb}MB")
    except duckdb.Error as e:
        raise QueryRefused(f"cannot open the trace database: {_one_line(e)}", "the database may be in use") from None
    timer = threading.Timer(timeout_s, con.interrupt)
    started = time.perf_counter()
    try:
        check_reach(con, sql)
        timer.start()
        cur = con.execute(sql, params or None)
        columns = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchmany(max_rows + 1) if columns else []
        timer.cancel()
        return _capped(columns, rows, max_rows)
    except duckdb.InterruptException:
        raise QueryRefused(
            f"query interrupted after {timeout_s:g} s", "add a WHERE clause or LIMIT, or aggregate first"
        ) from None
    except (duckdb.OutOfMemoryException, MemoryError):
        raise OutOfMemory(f"query needs more than the sandbox's {memory_mb} MB", _SMALLER) from None
    except duckdb.Error as e:
        if time.perf_counter() - started >= timeout_s:
            raise QueryRefused(f"query interrupted after {timeout_s:g} s", "add a WHERE clause or LIMIT") from None
        raise QueryRefused(f"query failed: {_one_line(e)}", _hint(e)) from None
    finally:
        timer.cancel()
        con.close()


def _capped(columns: list[str], rows: list, max_rows: int) -> dict:
    truncated = len(rows) > max_rows
    out, size = [], 0
    for row in rows[:max_rows]:
        cells = [_cell(v) for v in row]
        size += sum(len(c) if isinstance(c, str) else 8 for c in cells)
        if size > MAX_RESULT_CHARS:
            truncated = True
            break
        out.append(cells)
    return {"columns": columns, "rows": out, "row_count": len(out), "truncated": truncated}


def _cell(v):
    if v is None or isinstance(v, (bool, int, float)):
        return v
    text = str(v)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + f"... [{len(text)} chars]"


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:400]


def _hint(e: Exception) -> str:
    text = str(e)
    if "Permission Error" in text or "disabled" in text:
        return _OUT_OF_REACH
    if "Catalog Error" in text:
        return "describe_schema lists the tables, views and columns"
    if "read-only" in text:
        return "the trace database is read-only here"
    return "check the SQL against describe_schema"
