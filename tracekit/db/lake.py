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
ANALYSIS_TABLES = ("findings", "ingest_pending", "peer_collectives", "peer_collective_counts")
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


def holds_only_lake_entries(root: Path) -> bool:
    """An empty folder, or one holding what a lake's first ingest makes before its catalog."""
    own = {*run_tables(), CATALOG, f"{CATALOG}.new", STATE, f"{STATE}.tmp", LOCK, STAGING}
    return all(entry.name in own for entry in os.scandir(root))


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
    # unbound where DuckDB can, as the stdlib's views: binding reads the footer of every file
    deferred = " WITH (DEFER_BINDING)" if stdlib._defer_binding_supported() else ""
    return f"CREATE OR REPLACE VIEW {table}{deferred} AS SELECT {columns} FROM {source};"


def _meta(con, key: str):
    import duckdb

    try:
        row = con.execute("SELECT value FROM tracekit_meta WHERE key = ?", [key]).fetchone()
    except duckdb.CatalogException:
        return None
    return row[0] if row else None


def _stdlib_digest() -> str:
    from tracekit.db.connection import _digest

    return _digest(True)


def install_stdlib(con) -> None:
    """The stdlib (tables, views, macros and their comments), the per-run tables still tables:
    `point_views` turns them into views over the files. The slow part of a new catalog (about a
    second, most of it comments), which needs no file of the lake yet."""
    from tracekit import __version__
    from tracekit.db import stdlib
    from tracekit.db.schema import SCHEMA_VERSION

    tables = run_tables()
    con.execute("BEGIN")
    # CREATE TABLE IF NOT EXISTS passes over a per-run table that is a view already
    con.execute(stdlib.install_script(False))
    own = tuple(f"COMMENT ON TABLE {t} " for t in tables) + tuple(f"COMMENT ON COLUMN {t}." for t in tables)
    con.execute("\n".join(line for line in stdlib.comments_sql().splitlines() if not line.startswith(own)))
    con.execute(
        "INSERT OR REPLACE INTO tracekit_meta VALUES ('schema_version', ?), ('tracekit_version', ?), ('stdlib_digest', ?)",
        [SCHEMA_VERSION, __version__, _stdlib_digest()],
    )
    con.execute("COMMIT")


def point_views(con, root: Path) -> None:
    """Each per-run table a view over the files under `root` (absolute paths: the duckdb CLI opens
    the catalog from anywhere); `lake_root` in tracekit_meta says where they point."""
    from tracekit.db import stdlib

    con.execute("BEGIN")
    for table in run_tables():
        if con.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main' "
                       "AND database_name = current_database()", [table]).fetchone():  # fmt: skip
            con.execute(f'DROP TABLE "{table}"')
        con.execute(_view_sql(root, table))
    con.execute("\n".join(f"COMMENT ON VIEW {r.name} IS {_quote(r.comment)};" for r in stdlib.relations()
                          if r.name in run_tables() and r.kind == "table" and r.doc))  # fmt: skip
    con.execute("INSERT OR REPLACE INTO tracekit_meta VALUES ('lake_root', ?)", [str(root)])
    con.execute("COMMIT")


def up_to_date(con, root: Path) -> bool:
    return _meta(con, "stdlib_digest") == _stdlib_digest() and _meta(con, "lake_root") == str(root)


def ensure_catalog(con, root: Path) -> None:
    """The stdlib of this tracekit in the catalog, and the views pointing at the files under `root`
    (re-pointed when the lake was moved)."""
    if _meta(con, "stdlib_digest") != _stdlib_digest():
        install_stdlib(con)
        point_views(con, root)  # the stdlib may have changed the columns of a per-run table
    elif _meta(con, "lake_root") != str(root):
        point_views(con, root)


def connect(root, read_only: bool = False):
    """The lake's catalog, its views pointing at `root` (re-pointed first when the lake was moved)."""
    import duckdb

    from tracekit.db.connection import STORAGE_COMPATIBILITY

    root = Path(root).resolve()
    path = str(root / CATALOG)
    config = {} if read_only else {"storage_compatibility_version": STORAGE_COMPATIBILITY}
    con = duckdb.connect(path, read_only=read_only, config=config)
    if _meta(con, "lake_root") is None:
        con.close()
        raise TracekitError(f"{root}: {CATALOG} is not a tracekit lake catalog (no lake_root in tracekit_meta)")
    if read_only and not up_to_date(con, root):
        con.close()  # moved or written by another tracekit: re-pointed once, then opened as asked
        connect(root).close()
        con = duckdb.connect(path, read_only=True)
    elif not read_only:
        ensure_catalog(con, root)
    con.execute("SET asof_loop_join_threshold = 0")  # see tracekit.db.connection.connect
    con.execute("SET parquet_metadata_cache = true")  # views bind every file's footer (union_by_name)
    return con


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
                out[int(e.name[len("run_id=") :])] = Path(e.path)
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
    return [
        f"tracekit: {root}: removed the partitions of run {r}, an ingest that did not finish" for r in sorted(removed)
    ]


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


def publish(root: Path, stage: Path, run_ids: list[int], before_runs=None) -> None:
    """Rename the staged partitions into place, `runs` last (`before_runs` is called just before
    those): a run is in the lake once its runs partition is (see tidy)."""
    tables = [t for t in run_tables() if t != "runs"] + ["runs"]
    for table in tables:
        if table == "runs" and before_runs is not None:
            before_runs()
        (root / table).mkdir(exist_ok=True)
        for run_id in run_ids:
            os.rename(stage / table / f"run_id={run_id}", root / table / f"run_id={run_id}")


def build_catalog(root: Path) -> Path:
    """A new catalog for the lake at `root`, beside it (catalog.duckdb.new), its per-run tables
    still empty tables: `install_catalog` points them at the files once the first runs are in."""
    import duckdb

    from tracekit.db.connection import STORAGE_COMPATIBILITY

    tmp = root / f"{CATALOG}.new"
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp), config={"storage_compatibility_version": STORAGE_COMPATIBILITY})
    try:
        install_stdlib(con)
    finally:
        con.close()
    return tmp


def install_catalog(tmp: Path, root: Path) -> None:
    """Point the views of a catalog from build_catalog at the lake's files and put it in place."""
    import duckdb

    con = duckdb.connect(str(tmp))
    try:
        point_views(con, root)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, root / CATALOG)
