"""Open a tracekit database (a DuckDB file, or memory) with the public schema in place."""

from __future__ import annotations

import functools
import os
import tempfile

from tracekit import __version__, tempfiles
from tracekit.db import pending, schema_template, stdlib
from tracekit.db.schema import SCHEMA_VERSION

# The oldest DuckDB whose storage format new database files are written in. A file in a newer
# format cannot be opened by older readers at all ("version number 69, but we can only read versions
# between 64 and 68"): the duckdb CLI that PyPI serves (duckdb-cli 1.5.x) and duckdb 1.x in a
# notebook (tracekit itself needs DuckDB 2: see pyproject). Files keep the format they were created in.
STORAGE_COMPATIBILITY = "v1.4.0"


# the name of the database that holds a trace in memory (tracekit.open without a file)
IN_MEMORY = "tracekit"


def cursor(con):
    """A new connection to `con`'s database, reading and writing the same catalog as `con` (DuckDB's
    own cursor starts in the default database, which an in-memory trace does not use). Only the new
    cursor is queried: `con` may hold a pending result that a query on it would end."""
    cur = con.cursor()
    # fetchall: a result left unfinished keeps DuckDB from giving the cursor a relation (`cur.sql`)
    ((attached,),) = cur.execute(
        "SELECT count(*) FROM duckdb_databases() WHERE database_name = ? AND path IS NULL", [IN_MEMORY]
    ).fetchall()
    if attached:
        cur.execute(f"USE {IN_MEMORY}")
    return cur


def connect(path: str | None = None, read_only: bool = False):
    import duckdb  # imported here so that `tracekit --help` stays fast

    if path is not None and os.path.isdir(path):  # a trace lake: its catalog (tracekit.db.lake)
        from tracekit.db import lake

        return lake.connect(path, read_only=read_only)
    config = {} if read_only else {"storage_compatibility_version": STORAGE_COMPATIBILITY}
    if path is not None and not read_only and not os.path.exists(path):
        schema_template.create_from_template(path, _digest(True), _build_template)
    con = duckdb.connect(path or ":memory:", read_only=read_only, config=config)
    # DuckDB runs an ASOF join as a nested loop when it expects few rows on the left; the stdlib's
    # windows (steps, steady pieces) are estimated at one row whatever their number, and a nested
    # loop of 95 step windows against 420k busy blocks took 2.5x the sort-based join on a 1 GB trace
    con.execute("SET asof_loop_join_threshold = 0")
    threads = thread_budget()
    if threads:  # several tracekit processes share the cores (a local cluster's workers)
        con.execute(f"SET threads = {threads}")
    if path is None:
        # an in-memory database spills to disk past its memory limit; keep that out of the cwd
        con.execute("SET temp_directory = ?", [os.path.join(tempfile.gettempdir(), tempfiles.prefix() + "duckdb")])
        # DuckDB compresses an in-memory database only where it is attached with COMPRESS (the
        # default one is not): the 1 GB trace's tables take 0.3 GB instead of 0.83 GB, so they stay
        # under the memory limit instead of spilling, and the rules read them 1.5x faster. A cursor
        # starts in the default database: `cursor` below moves it here
        con.execute(f"ATTACH ':memory:' AS {IN_MEMORY} (COMPRESS)")
        con.execute(f"USE {IN_MEMORY}")
    if read_only and path is not None:
        pending.report_leftovers(con)
    if path is None and not read_only:
        schema_template.copy_into(con, _digest(True), _build_template)
    if not read_only:
        # without the template, an in-memory database goes without the comments: they would cost
        # more than the rest of the schema (one catalog change per column) in a database that lives
        # as long as this process, for readers that rarely look at them
        ensure_schema(con, comments=path is not None)
        if path is not None:
            pending.remove_leftovers(con, run_tables(con))
    return con


def thread_budget() -> int | None:
    """TRACEKIT_THREADS: the threads this process may keep busy (DuckDB's `threads`, and at most as
    many rule threads), or None for DuckDB's default of one per core. A local cluster gives each of
    its N workers cores // N: on 2 cores, two workers of two DuckDB threads each took 25 s on 256
    ranks, of one each (rules on one thread too) about 20 s."""
    wanted = os.environ.get("TRACEKIT_THREADS", "").strip()
    try:
        return max(1, int(wanted)) if wanted else None
    except ValueError:
        return None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _build_template(path: str) -> None:
    import duckdb

    con = duckdb.connect(path, config={"storage_compatibility_version": STORAGE_COMPATIBILITY})
    try:
        ensure_schema(con, comments=True)
    finally:
        con.close()


def bound_memory(con, input_bytes: int) -> None:
    """Cap DuckDB's memory near the size of the raw JSON being analysed (at least 1 GiB, at most
    DuckDB's own default of 80% of the machine's memory: a gzip trailer may claim any size), so a
    large trace costs about its own size in RAM and the rest spills to disk. TRACEKIT_MEMORY_LIMIT
    (e.g. "8GB") overrides."""
    ceiling = _physical_memory() * 8 // 10 or input_bytes
    limit = os.environ.get("TRACEKIT_MEMORY_LIMIT") or f"{max(1 << 30, min(input_bytes, ceiling)) >> 20}MiB"
    con.execute("SET memory_limit = ?", [limit])


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return 0


def ensure_schema(con, comments: bool = True) -> None:
    """Install the stdlib (tables, views, macros and, with `comments`, their COMMENT ON docs) unless
    this database already holds this version of it: reopening an up-to-date database costs one
    lookup, not the whole DDL."""
    digest = _digest(comments)
    if _installed_digest(con) in (digest, _digest(True)):
        return
    con.execute("BEGIN")
    con.execute(stdlib.install_script(comments))
    con.execute(
        "INSERT OR REPLACE INTO tracekit_meta VALUES ('schema_version', ?), ('tracekit_version', ?), ('stdlib_digest', ?)",
        [SCHEMA_VERSION, __version__, digest],
    )
    pending.ensure_sequence(con)
    con.execute("COMMIT")


def _digest(comments: bool) -> str:
    # the tracekit and schema versions are part of it, so that a newer tracekit, or a schema version
    # bumped without a change to the SQL files' text, records itself in tracekit_meta (and a cached
    # schema template made before the bump is not used)
    return f"{stdlib.digest()}-{__version__}-{SCHEMA_VERSION}" + ("" if comments else "-uncommented")


def _installed_digest(con) -> str | None:
    import duckdb

    try:
        row = con.execute("SELECT value FROM tracekit_meta WHERE key = 'stdlib_digest'").fetchone()
    except duckdb.CatalogException:
        return None
    return row[0] if row else None


def table_columns(con) -> dict[str, list[str]]:
    """Each table of the database's main schema (not the temporary ones) with its columns in order."""
    return {t: _columns(con, t) for t in _table_names(con)}


def _columns(con, table: str) -> list[str]:
    return [d[0] for d in con.execute(f'SELECT * FROM main."{table}" LIMIT 0').description]


def _table_names(con) -> list[str]:
    # each table's own columns, not duckdb_columns(): that one binds every view of the stdlib too
    # (0.2 s per call)
    tables = [
        name
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND NOT temporary ORDER BY table_name"
        ).fetchall()
    ]
    # a lake's per-run tables are views over its Parquet files (tracekit.db.lake)
    tables += [
        name
        for (name,) in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND schema_name = 'main' "
            "AND NOT temporary AND list_contains(?, view_name) ORDER BY view_name",
            [list(lake_tables())],
        ).fetchall()
    ]
    return tables


def lake_tables() -> tuple[str, ...]:
    from tracekit.db import lake

    return lake.run_tables()


def run_tables(con) -> list[str]:
    """The database's tables with a run_id column (every table that holds rows of a run).

    Whether a stdlib table has one is known from its definition; only other tables are described
    (one query each: describing all 13 cost 50 ms on every ingest, which asks for this twice)."""
    known = _stdlib_run_tables()
    names = _table_names(con)
    return [n for n in names if (known[n] if n in known else "run_id" in _columns(con, n))]


@functools.cache
def _stdlib_run_tables() -> dict[str, bool]:
    return {r.name: any(c.name == "run_id" for c in r.columns) for r in stdlib.relations() if r.kind == "table"}


def next_run_id(con) -> int:
    """A run id no run has used or will use (see tracekit.db.pending)."""
    return pending.take_run_ids(con)[0]


def current_memory_hint(con) -> int:
    """Raw bytes already ingested into this database (for the memory cap of a further ingest)."""
    return con.execute("SELECT coalesce(sum(bytes_read), 0) FROM ingest_log").fetchone()[0]


def insert_rows(con, table: str, run_id: int, fields: tuple[str, ...], rows: list[list]) -> None:
    """Append rows (values in `fields` order) to a run's table; for the tables reports fill."""
    if not rows:
        return
    cols = ", ".join(("run_id",) + tuple(fields))
    import pyarrow as pa

    # one columnar insert: executemany costs about 0.1 ms a row (1.5 s for a 15k-row Nsight Compute page)
    try:
        batch = pa.table(
            {"run_id": pa.array([run_id] * len(rows), pa.int32())}
            | {name: pa.array([row[i] for row in rows]) for i, name in enumerate(fields)}
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a column mixing types: let DuckDB cast each value
        marks = ", ".join("?" * (len(fields) + 1))
        con.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", [[run_id, *row] for row in rows])
        return
    con.register("_tracekit_insert_batch", batch)
    try:
        con.execute(f"INSERT INTO {table} ({cols}) SELECT * FROM _tracekit_insert_batch")
    finally:
        con.unregister("_tracekit_insert_batch")
