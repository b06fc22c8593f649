"""The stdlib views that most rules and views build on, computed once per analysis.

DuckDB inlines a view into every query that reads it, so a view read by ten rules (and by the views
those rules read) is evaluated ten times: `launches` sits under `first_launches`, `steps`,
`idle_gaps`, `host_blocking`, `run_phases` and the data-quality checks. While rules run, a table in
an in-memory catalog attached for the analysis holds each view below, and a temporary view of the
same name reads it; DuckDB resolves a name in the temporary schema first, so rules and views read
the table without a change and their evidence SQL still names the view. The catalog is visible to
every connection of the database, so the rules' threads (tracekit.engine.runner) each read it
through temporary views of their own connection (`Shared.cursor`). The tables go when the analysis
ends, so queries after it see the live views.

The set is measured, not guessed (single-thread CPU time of the whole rule run): without the
tables, with them, on hta__df_index_resolver 1.30 -> 0.87 s, hta__negative_queue_length_values_check
1.02 -> 0.65 s, the eager prefill/decode sample 1.16 -> 0.54 s, the 1 GB trace 18.6 -> 12.6 s.
`kernels` and `runtime_calls` are left out: copying their JSON args costs about what it saves, and
on the 1 GB trace 0.35 GB more memory. `idle_gaps`, `host_blocking` and `steps` gave no measurable
gain (one reader each, or filtered by run and thread, which a view pushes into its scan).
`kernel_names` (the name patterns of `kernels.is_communication`, once per distinct name: 49 names for
19,370 kernels on hta__df_index_resolver) turns each `kernels` read that tests the patterns from about
45 ms into about 5 ms there; `step_candidates`, `run_steady` and the shared `step_windows` under
`step_windows_named(NULL)` each save one evaluation of a view that several rules and views read
(10-30 ms a read, much of it planning: on small traces DuckDB spends more time binding and
optimising these views than running them). `collectives` is read by C001 once per device, by
`rank_collectives`, `rank_op_times` and N003: a filter on its run does not reach its scans, so on 64
GPU ranks (the TP=2 sample's ranks copied) each C001 read cost 66 ms against 13 ms from the table,
and analyze of single corpus traces went 4-11% faster with it. The analyze report's summary runs inside the same block.
"""

from __future__ import annotations

import contextlib
import itertools
import threading

# in dependency order: each one reads the tables made before it
SHARED_VIEWS = (
    "kernel_names",
    "launches",
    "first_launches",
    "collectives",
    "gpu_busy_layers",
    "main_device",
    "step_candidates",
    "step_windows",
    "step_phases",
    "run_phases",
    "run_steady",
)

# where the database holds a job (runs of two ranks or more): the per-rank summaries, which the
# cross-rank rules read several times each and a cluster worker sends to its reducer. On 64 ranks
# in one database the rules and summary took 1.23 s reading the views, 0.53 s reading these; the
# findings on the rank and expert-parallel matrices are the same
RANK_VIEWS = ("rank_collectives", "rank_steps", "rank_measured_steps", "rank_op_times", "rank_op_inputs")
# the cheap test for one: no rank summary is computed for a trace of one process
HAS_JOB_SQL = "SELECT count(DISTINCT rank) > 1 FROM runs WHERE rank IS NOT NULL AND world_size > 1"

_catalog_numbers = itertools.count(1)
# the analysis in progress on a connection, so that a nested one reuses its tables
_active: dict[int, Shared] = {}
_active_lock = threading.Lock()


class Shared:
    """The shared tables of one analysis: which views they hold, in which catalog, and how another
    connection of the same database reads them. `catalog` None: the tables are temporary tables of
    `con` (a read-only database can attach no catalog), which no other connection sees."""

    def __init__(self, con, catalog: str | None, views: tuple[str, ...]):
        self.con = con
        self.catalog = catalog
        self.views = views
        # settings a connection makes for itself (`SET asof_loop_join_threshold`, in
        # tracekit.db.connection): a new connection starts from the global values
        self._settings = [
            (name, value)
            for name, value in con.execute(
                "SELECT name, value FROM duckdb_settings() WHERE scope = 'LOCAL' AND value IS NOT NULL"
            ).fetchall()
        ]

    @property
    def shareable(self) -> bool:
        """Whether another connection can read the tables (`cursor`)."""
        return self.catalog is not None or not self.views

    def cursor(self):
        """A new connection to the same database, with this connection's own settings and the shared
        tables under the views' names. Close it before the analysis ends."""
        import duckdb

        if not self.shareable:
            raise RuntimeError("the shared tables are temporary tables of one connection")

        from tracekit.db.connection import cursor

        cur = cursor(self.con)
        for name, value in self._settings:
            with contextlib.suppress(duckdb.Error):  # a setting that cannot be set again
                cur.execute(f"SET {name} = '{str(value).replace(chr(39), chr(39) * 2)}'")
        # the progress bar is the client's to draw: on a cursor, a rule's query over two seconds
        # would print one on analyze's stderr
        cur.execute("SET enable_progress_bar = false")
        for view in self.views:
            cur.execute(_reader(_table(self.catalog, view), view))
        return cur


def _table(catalog: str | None, view: str) -> str:
    """Where the table of `view` is: in the analysis's catalog, else a temporary table of the connection."""
    return f'"{catalog}".main."{view}"' if catalog else f'temp.main."tk_shared_{view}"'


def _reader(table: str, view: str) -> str:
    return f'CREATE OR REPLACE TEMP VIEW "{view}" AS SELECT * FROM {table}'


@contextlib.contextmanager
def computed_once(con, ranks: bool | None = None):
    """Inside the block, each view of SHARED_VIEWS that exists reads a table computed on entry; yields
    the Shared handle (a nested block on the same connection yields the outer one's). `ranks`: whether
    RANK_VIEWS are computed too; None: where the database holds a job (HAS_JOB_SQL)."""
    import duckdb

    with _active_lock:
        outer = _active.get(id(con))
    if outer is not None:
        yield outer
        return
    home = con.execute("SELECT current_database()").fetchone()[0]
    present = {
        r[0]
        for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main'", [home]
        ).fetchall()
    }
    catalog: str | None = f"tk_shared_{next(_catalog_numbers)}"
    try:
        con.execute(f"ATTACH ':memory:' AS {catalog}")
    except duckdb.Error:  # a read-only database attaches nothing: temporary tables, on this connection only
        catalog = None
    made: list[str] = []
    if ranks is None:
        ranks = con.execute(HAS_JOB_SQL).fetchone()[0]
    wanted = SHARED_VIEWS + (RANK_VIEWS if ranks else ())
    try:
        for view in wanted:
            if view not in present:
                continue
            try:
                con.execute(f'CREATE TABLE {_table(catalog, view)} AS SELECT * FROM "{home}".main."{view}"')
            except duckdb.Error:  # e.g. out of memory on a huge trace: the rules read the view instead
                continue
            con.execute(_reader(_table(catalog, view), view))
            made.append(view)
        shared = Shared(con, catalog, tuple(made))
        with _active_lock:
            _active[id(con)] = shared
        yield shared
    finally:
        with _active_lock:
            _active.pop(id(con), None)
        for view in reversed(made):
            con.execute(f'DROP VIEW IF EXISTS temp.main."{view}"')
            if catalog is None:
                con.execute(f"DROP TABLE IF EXISTS {_table(None, view)}")
        if catalog is not None:
            con.execute(f"DETACH {catalog}")
