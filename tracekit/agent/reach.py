"""What a statement may reach: DuckDB's own parse tree, checked against what a trace query needs.

External access off keeps files and the network out, but DuckDB's introspection still shows the
host: `duckdb_settings()` and `current_setting()` the paths it was given, `duckdb_databases()`
the database file, `query()` runs SQL that no check saw. So every function a statement calls
and every relation it names is looked up: of DuckDB's table functions only ALLOWED_TABLE_FUNCTIONS
(generators, and the catalog that describe_schema reads), no DENIED_FUNCTIONS, and none of
DuckDB's built-in views that are made of what is refused (`pragma_database_list`, `pg_settings`).
The trace database's own tables, views and macros are not DuckDB's: they stay reachable.
"""

from __future__ import annotations

import json
import re
import threading

ALLOWED_TABLE_FUNCTIONS = frozenset(
    {
        "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree",
        "summary", "histogram", "histogram_values", "pg_timezone_names", "icu_calendar_names",
        "duckdb_tables", "duckdb_views", "duckdb_columns", "duckdb_functions", "duckdb_types",
        "duckdb_schemas", "duckdb_constraints", "duckdb_indexes", "duckdb_keywords", "duckdb_sequences",
        "duckdb_dependencies", "pragma_table_info",
    }
)  # fmt: skip
DENIED_FUNCTIONS = frozenset({"current_setting", "enable_profile", "disable_profile"})

_denied: frozenset[str] | None = None
_lock = threading.Lock()


class Unreachable(Exception):
    """The statement names something out of reach (`name`), or cannot be checked (`name` None)."""

    def __init__(self, message: str, name: str | None = None):
        super().__init__(message)
        self.name = name


def check(con, sql: str) -> None:
    """Unreachable unless everything `sql` calls or names is within reach (`con`: a sandbox)."""
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        raise Unreachable(" ".join(str(tree.get("error_message", "")).split())[:200])
    denied = _denied_names(con)
    for name in sorted(_names(tree)):
        if name in denied:
            raise Unreachable(f"{name} is not available in the query tool", name)


def _names(tree) -> set[str]:
    """Every function called and every table or view named, lower case."""
    names, stack = set(), [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("function_name"), str):
                names.add(item["function_name"].lower())
            if item.get("type") == "BASE_TABLE" and isinstance(item.get("table_name"), str):
                names.add(item["table_name"].lower())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return names


def _denied_names(con) -> frozenset[str]:
    global _denied
    with _lock:
        if _denied is None:  # the same in every sandbox of one DuckDB version: asked once
            _denied = _ask_denied(con)
        return _denied


def _ask_denied(con) -> frozenset[str]:
    tables = con.execute(
        "SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
        "WHERE database_name = 'system' AND function_type IN ('table', 'table_macro')"
    ).fetchall()
    denied = {name for (name,) in tables if name not in ALLOWED_TABLE_FUNCTIONS} | DENIED_FUNCTIONS
    views = con.execute("SELECT lower(view_name), lower(sql) FROM duckdb_views() WHERE internal").fetchall()
    # a view made of anything denied is denied, and so on up (views over views)
    grew = True
    while grew:
        grew = False
        for name, sql in views:
            if name not in denied and any(re.search(rf"\b{re.escape(d)}\b", sql) for d in denied):
                denied.add(name)
                grew = True
    return frozenset(denied)
