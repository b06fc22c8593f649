"""What the cross-rank rules share: the jobs a database (or a cluster run's reducer) holds."""

from __future__ import annotations

# A job is the ranked runs of one world size; it takes two distinct ranks to compare any.
JOBS_SQL = (
    "SELECT world_size FROM runs WHERE rank IS NOT NULL AND world_size > 1 "
    "GROUP BY world_size HAVING count(DISTINCT rank) > 1 ORDER BY world_size"
)


def world_sizes(con) -> list[int]:
    """The world size of each job with at least two ranks loaded, smallest first."""
    return [w for (w,) in con.execute(JOBS_SQL).fetchall()]
