"""The rows of a set of runs, in SQL: what an ingest of several files at once filters every table by."""

from __future__ import annotations

# the range lets DuckDB skip the row groups of other runs by their min/max; the list says which runs of it
OF_RUNS = "run_id BETWEEN $first AND $last AND list_contains($run_ids, run_id)"


def of_runs(run_ids) -> dict:
    """The named parameters OF_RUNS reads, for these run ids (an int: that one run)."""
    run_ids = [run_ids] if isinstance(run_ids, int) else list(run_ids)
    return {"run_ids": run_ids, "first": min(run_ids), "last": max(run_ids)}
