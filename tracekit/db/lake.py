"""A trace lake: the per-run tables as Parquet files, one folder per run, and a small DuckDB catalog.

    DIR/catalog.duckdb                          views over the files, the stdlib, findings
    DIR/<table>/run_id=<N>/part-0.parquet      one file per (per-run table, run), hive-partitioned
    DIR/lake.json                               the next run id and event id to hand out
    DIR/.lock                                   held (flock) by the ingest writing the lake

Each per-run table of the schema (RUN_TABLES) is a VIEW in the catalog over
`read_parquet('<DIR>/<table>/*/*.parquet', hive_partitioning = true, union_by_name = true)`; every
other table (findings, tracekit_meta, ...) is a real table there, and the stdlib's views and macros
sit on top as in any tracekit database. The views name the files by absolute path, so the duckdb CLI
reads a lake from anywhere; a lake that was moved is re-pointed by the next tracekit open (its
`lake_root` in tracekit_meta no longer matches).

Event ids: a DuckDB table's rowid is the event id (`events.event_id`, `event_rows.parent_id`); the
Parquet files of event_rows carry it as a column `event_id`, which the catalog's view shows as
`rowid`. Ids are handed out from `lake.json` in ingest order, so a lake's event ids are those a
database file gets from ingesting the same inputs in the same order.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from tracekit.errors import TracekitError

CATALOG = "catalog.duckdb"
STATE = "lake.json"
LOCK = ".lock"
STAGING = ".staging"
# per-run tables that analysis writes, not ingest: real tables in the catalog
ANALYSIS_TABLES = ("findings", "ingest_pending", "peer_collectives")
_MAGIC = b"DUCK"


def run_tables() -> tuple[str, ...]:
    """The schema's tables whose rows belong to runs and come from ingest: one Parquet folder each."""
    from tracekit.db import stdlib

    return tuple(
        r.name
        for r in stdlib.relations()
        if r.kind == "table" and r.name not in ANALYSIS_TABLES and any(c.name == "run_id" for c in r.columns)
    )


def is_lake(path) -> bool:
    """A folder holding a DuckDB catalog.duckdb (that it is tracekit's is checked on opening it)."""
    catalog = Path(path) / CATALOG
    try:
        with catalog.open("rb") as f:
            return f.read(12)[8:12] == _MAGIC
    except OSError:
        return False


def files_glob(root: Path, table: str) -> str:
    return str(Path(root) / table / "*" / "*.parquet")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _view_sql(root: Path, table: str) -> str:
    from tracekit.db import stdlib

    (relation,) = [r for r in stdlib.relations() if r.name == table and r.kind == "table"]
    columns = ", ".join(f'"{c.name}"' for c in relation.columns)
    if table == "event_rows":
        columns += ", event_id AS rowid"
    source = (f"read_parquet({_quote(files_glob(root, table))}, hive_partitioning = true, union_by_name = true, "
              "hive_types = {'run_id': INTEGER})")  # fmt: skip
    return f"CREATE OR REPLACE VIEW {table} AS SELECT {columns} FROM {source};"


def _digest(root: Path) -> str:
    from tracekit.db.connection import _digest as stdlib_digest

    return f"lake-{stdlib_digest(True)}-{root}"


def ensure_catalog(con, root: Path) -> None:
    """The catalog's views over this lake's files (at `root`) and the stdlib on top, unless the
    catalog holds them already for this stdlib and this root."""
    import duckdb

    from tracekit import __version__
    from tracekit.db import stdlib
    from tracekit.db.schema import SCHEMA_VERSION

    digest = _digest(root)
    try:
        row = con.execute("SELECT value FROM tracekit_meta WHERE key = 'stdlib_digest'").fetchone()
    except duckdb.CatalogException:
        row = None
    if row and row[0] == digest:
        return
    tables = run_tables()
    con.execute("BEGIN")
    for table in tables:  # a catalog made by a plain connect would hold them as tables
        kind = con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main' "
                           "AND database_name = current_database()", [table]).fetchone()  # fmt: skip
        if kind:
            con.execute(f'DROP TABLE "{table}"')
        con.execute(_view_sql(root, table))
    # CREATE TABLE IF NOT EXISTS passes over the views of the same name
    con.execute(stdlib.install_script(False))
    own = tuple(f"COMMENT ON TABLE {t} " for t in tables) + tuple(f"COMMENT ON COLUMN {t}." for t in tables)
    comments = [line for line in stdlib.comments_sql().splitlines() if not line.startswith(own)]
    comments += [f"COMMENT ON VIEW {r.name} IS {_quote(r.comment)};" for r in stdlib.relations()
                 if r.name in tables and r.kind == "table" and r.doc]  # fmt: skip
    con.execute("\n".join(comments))
    con.execute(
        "INSERT OR REPLACE INTO tracekit_meta VALUES ('schema_version', ?), ('tracekit_version', ?), "
        "('stdlib_digest', ?), ('lake_root', ?)",
        [SCHEMA_VERSION, __version__, digest, str(root)],
    )
    con.execute("COMMIT")


def connect(root, read_only: bool = False):
    """The lake's catalog, its views pointing at `root` (re-pointed first when the lake was moved)."""
    import duckdb

    from tracekit.db.connection import STORAGE_COMPATIBILITY

    root = Path(root).resolve()
    path = str(root / CATALOG)
    config = {} if read_only else {"storage_compatibility_version": STORAGE_COMPATIBILITY}
    con = duckdb.connect(path, read_only=read_only, config=config)
    try:
        row = con.execute("SELECT value FROM tracekit_meta WHERE key = 'lake_root'").fetchone()
    except duckdb.CatalogException:
        row = None
    if row is None:
        con.close()
        raise TracekitError(f"{root}: {CATALOG} is not a tracekit lake catalog (no lake_root in tracekit_meta)")
    if read_only and (row[0] != str(root) or _stale(con, root)):
        con.close()  # moved or written by another tracekit: re-pointed once, then opened as asked
        connect(root).close()
        con = duckdb.connect(path, read_only=True)
    elif not read_only:
        ensure_catalog(con, root)
    con.execute("SET asof_loop_join_threshold = 0")  # see tracekit.db.connection.connect
    con.execute("SET parquet_metadata_cache = true")  # views bind every file's footer (union_by_name)
    return con


def _stale(con, root: Path) -> bool:
    row = con.execute("SELECT value FROM tracekit_meta WHERE key = 'stdlib_digest'").fetchone()
    return not row or row[0] != _digest(root)


# ------------------------------------------------------------------------------------ writing


@contextmanager
def locked(root: Path):
    """The lake's write lock (one ingest at a time; others wait)."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def partitions(root: Path, table: str) -> dict[int, Path]:
    """run id -> its folder, for one table."""
    out = {}
    try:
        entries = list(os.scandir(root / table))
    except FileNotFoundError:
        return out
    for e in entries:
        if e.is_dir() and e.name.startswith("run_id="):
            try:
                out[int(e.name[len("run_id="):])] = Path(e.path)
            except ValueError:
                continue
    return out


def tidy(root: Path) -> list[str]:
    """Under the lock: remove what an ingest killed halfway left (its staging folder, and the
    partitions of a run whose `runs` partition, renamed last, never came). Returns one line per run."""
    shutil.rmtree(root / STAGING, ignore_errors=True)
    runs = set(partitions(root, "runs"))
    removed = set()
    for table in run_tables():
        for run_id, folder in partitions(root, table).items():
            if run_id not in runs:
                shutil.rmtree(folder, ignore_errors=True)
                removed.add(run_id)
    return [f"tracekit: {root}: removed the partitions of run {r}, an ingest that did not finish" for r in sorted(removed)]


def read_state(root: Path) -> dict:
    """{next_run_id, next_event_id}: what lake.json says, never below what the partitions hold."""
    try:
        state = json.loads((root / STATE).read_text())
    except (FileNotFoundError, ValueError):
        state = {}
    held = [r for table in run_tables() for r in partitions(root, table)]
    return {
        "next_run_id": max([int(state.get("next_run_id", 1)), *(r + 1 for r in held)]),
        "next_event_id": int(state.get("next_event_id", 0)),
    }


def write_state(root: Path, state: dict) -> None:
    tmp = root / f"{STATE}.tmp"
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, root / STATE)


def _columns(con, table: str) -> list[tuple[str, str]]:
    return con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? AND schema_name = 'main' "
        "AND database_name = current_database() ORDER BY column_index",
        [table],
    ).fetchall()


def stage_runs(con, stage: Path, run_ids: list[int], event_offset: int, compression: str = "zstd") -> None:
    """COPY each run's rows of every per-run table of `con` (a tracekit database) to
    stage/<table>/run_id=<N>/part-0.parquet, each column cast to its table's type (so an empty or
    all-NULL column keeps it); event_rows gets `event_id` = rowid + event_offset, and parent_id moves
    by the same offset."""
    for table in run_tables():
        columns = _columns(con, table)
        select = [
            f'CAST("{c}" + {event_offset} AS {t}) AS "{c}"' if table == "event_rows" and c == "parent_id"
            else f'CAST("{c}" AS {t}) AS "{c}"'
            for c, t in columns
        ]  # fmt: skip
        if table == "event_rows":
            select.append(f"CAST(rowid + {event_offset} AS BIGINT) AS event_id")
        for run_id in run_ids:
            folder = stage / table / f"run_id={run_id}"
            folder.mkdir(parents=True)
            target = _quote(str(folder / "part-0.parquet"))
            con.execute(f"COPY (SELECT {', '.join(select)} FROM \"{table}\" WHERE run_id = {int(run_id)}) "
                        f"TO {target} (FORMAT parquet, COMPRESSION {compression})")  # fmt: skip


def publish(root: Path, stage: Path, run_ids: list[int]) -> None:
    """Rename the staged partitions into place, `runs` last: a run is in the lake once its runs
    partition is (see tidy)."""
    tables = [t for t in run_tables() if t != "runs"] + ["runs"]
    for table in tables:
        (root / table).mkdir(exist_ok=True)
        for run_id in run_ids:
            os.rename(stage / table / f"run_id={run_id}", root / table / f"run_id={run_id}")


def create_catalog(root: Path) -> None:
    """A new catalog for a lake whose first runs are in place (the views bind to their files)."""
    import duckdb

    from tracekit.db.connection import STORAGE_COMPATIBILITY

    tmp = root / f"{CATALOG}.tmp"
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp), config={"storage_compatibility_version": STORAGE_COMPATIBILITY})
    try:
        con.execute("CREATE TABLE IF NOT EXISTS tracekit_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        ensure_catalog(con, root)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, root / CATALOG)
