"""The trace database: its public schema (tables and the stdlib of views) and how to open one."""

from tracekit.db.connection import (
    bound_memory,
    connect,
    current_memory_hint,
    ensure_schema,
    insert_rows,
    next_run_id,
    run_tables,
)

__all__ = [
    "bound_memory",
    "connect",
    "current_memory_hint",
    "ensure_schema",
    "insert_rows",
    "next_run_id",
    "run_tables",
]
