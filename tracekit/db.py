"""Open a tracekit database (a DuckDB file, or memory) with the public schema in place."""

from __future__ import annotations

from . import __version__
from .schema import SCHEMA_VERSION, TABLES_DDL, VIEWS_DDL


def connect(path: str | None = None, read_only: bool = False):
    import duckdb  # imported here so that `tracekit --help` stays fast

    con = duckdb.connect(path or ":memory:", read_only=read_only)
    if not read_only:
        ensure_schema(con)
    return con


def ensure_schema(con) -> None:
    con.execute(TABLES_DDL)
    con.execute(VIEWS_DDL)
    con.execute(
        "INSERT OR REPLACE INTO tracekit_meta VALUES ('schema_version', ?), ('tracekit_version', ?)",
        [SCHEMA_VERSION, __version__],
    )


def next_run_id(con) -> int:
    return con.execute("SELECT coalesce(max(run_id), 0) + 1 FROM runs").fetchone()[0]


def has_rows(con, relation: str, where: str = "TRUE") -> bool:
    return con.execute(f"SELECT EXISTS (SELECT 1 FROM {relation} WHERE {where})").fetchone()[0]
