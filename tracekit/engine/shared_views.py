"""The stdlib views that most rules and views build on, computed once per analysis.

DuckDB inlines a view into every query that reads it, so a view read by ten rules (and by the views
those rules read) is evaluated ten times: `launches` sits under `first_launches`, `steps`,
`idle_gaps`, `host_blocking`, `run_phases` and the data-quality checks. While rules run, a
temporary table of the same name holds each view below; DuckDB resolves a name in the temporary
schema first, so rules and views read the table without a change and their evidence SQL still names
the view. The tables go when the analysis ends, so queries after it see the live views.

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
optimising these views than running them). The analyze report's summary runs inside the same block.
"""

from __future__ import annotations

import contextlib

# in dependency order: each one reads the tables made before it
SHARED_VIEWS = (
    "kernel_names",
    "launches",
    "first_launches",
    "gpu_busy_layers",
    "main_device",
    "step_candidates",
    "step_windows",
    "step_phases",
    "run_phases",
    "run_steady",
)


@contextlib.contextmanager
def computed_once(con):
    """Inside the block, each view of SHARED_VIEWS that exists reads a table computed on entry."""
    import duckdb

    catalog = con.execute("SELECT current_database()").fetchone()[0]
    present = {
        r[0]
        for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main'", [catalog]
        ).fetchall()
    }
    shadowed = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    made = []
    try:
        for view in SHARED_VIEWS:
            if view not in present or view in shadowed:  # a nested analysis reuses the outer one's tables
                continue
            try:
                con.execute(f'CREATE TEMP TABLE "{view}" AS SELECT * FROM "{catalog}".main."{view}"')
            except duckdb.Error:  # e.g. out of memory on a huge trace: the rules read the view instead
                continue
            made.append(view)
        yield
    finally:
        for view in reversed(made):
            con.execute(f'DROP TABLE IF EXISTS temp.main."{view}"')
