"""Read-only SQL over a trace database for a model: no writes, files, network, extensions or ATTACH.

Two independent layers, so one mistake does not open the other:
1. Before anything runs, DuckDB's own parser (`duckdb.extract_statements`) must see exactly one
   statement of type SELECT (which covers FROM-first queries, DESCRIBE, SHOW and SUMMARIZE).
2. The statement runs in a fresh in-memory DuckDB instance that attached the database file READ_ONLY and
   then switched off external access (files, network, ATTACH, COPY, INSTALL/LOAD) and locked its
   configuration, so no later SET can switch it back on. Extension autoload/autoinstall and community
   extensions are off from the start.
Limits: at most `max_rows` rows come back (the result says when more existed), long strings are cut,
and a query running past `timeout_s` is interrupted from a timer thread.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

MAX_CELL_CHARS = 500
_ALLOWED = ("SELECT",)


class QueryRefused(Exception):
    """The statement was refused before or while running; `hint` says what to do instead."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


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


def open_sandbox(db_path: str | Path, memory_limit: str = "1GB", threads: int = 2):
    """A connection whose default catalog is the trace database, read-only, with external access off."""
    import duckdb

    con = duckdb.connect(
        ":memory:",
        config={
            "allow_community_extensions": "false",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "memory_limit": memory_limit,
            "threads": str(threads),
            # spills go to a private temp dir, not to the caller's working directory
            "temp_directory": os.path.join(tempfile.gettempdir(), f"tracekit-sandbox-{os.getpid()}"),
        },
    )
    path = str(Path(db_path).resolve()).replace("'", "''")
    con.execute(f"ATTACH '{path}' AS trace (READ_ONLY)")
    con.execute("USE trace")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def run_query(
    db_path: str | Path, sql: str, max_rows: int = 100, timeout_s: float = 10.0, params: dict | None = None
) -> dict:
    """Run one read-only SELECT; returns {columns, rows, row_count, truncated, elapsed_s}."""
    import time

    import duckdb

    check_statement(sql)
    con = open_sandbox(db_path)
    timer = threading.Timer(timeout_s, con.interrupt)
    started = time.perf_counter()
    timer.start()
    try:
        cur = con.execute(sql, params or None)
        columns = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchmany(max_rows + 1) if columns else []
    except duckdb.InterruptException:
        raise QueryRefused(
            f"query interrupted after {timeout_s:g} s", "add a WHERE clause or LIMIT, or aggregate first"
        ) from None
    except duckdb.Error as e:
        if time.perf_counter() - started >= timeout_s:
            raise QueryRefused(f"query interrupted after {timeout_s:g} s", "add a WHERE clause or LIMIT") from None
        raise QueryRefused(f"query failed: {_one_line(e)}", _hint(e)) from None
    finally:
        timer.cancel()
        con.close()
    truncated = len(rows) > max_rows
    rows = [[_cell(v) for v in r] for r in rows[:max_rows]]
    return {
        "columns": columns,
        "rows": rows,
        "row_count": len(rows),
        "truncated": truncated,
        "elapsed_s": round(time.perf_counter() - started, 3),
    }


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
        return "the query tool reads only the trace database: no files, network, extensions or ATTACH"
    if "Catalog Error" in text:
        return "describe_schema lists the tables, views and columns"
    if "read-only" in text:
        return "the trace database is read-only here"
    return "check the SQL against describe_schema"
