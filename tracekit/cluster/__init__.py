"""Map/reduce over the ranks of a job, in this process or on a Dask cluster (docs/cluster.md).

A job of thousands of ranks does not fit one database. The inputs are split into chunks of a few
consecutive rank files (`plan`); each chunk is ingested into a database of its own on a worker
and only its per-rank summaries travel (`work`); every chunk's collective counts and extremes come
back to it (small tables, for matching its collectives against the job's), its per-rank rules run
where its events are, and a reducer database of the
summaries alone runs the cross-rank rules (`reduce`). `backends` runs the tasks in a loop here or
on Dask workers; `job` puts it together as `tracekit.analyze_job`.
"""

from tracekit.cluster.job import JobResult, analyze_job

__all__ = ["JobResult", "analyze_job"]
