"""Named points of an ingest where the kill test (tests/test_kill_ingest.py) stops the process dead.

TRACEKIT_KILL_AT=<point> makes the process send itself SIGKILL when it reaches that point, so the
test can check what a real kill leaves at each step of the two commits (see transaction.py) without
racing a timer. Unset, a point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "read",  # the file is read (and staged in a temporary file), nothing written yet
    "rows",  # the rows are inserted, their transaction not committed
    "rows_committed",  # the rows are committed, nothing derived from them yet
    "derived",  # the runs and ingest_log rows are written, their transaction not committed
    "committed",  # everything is committed, the temporary files not yet removed
)

# a lake ingest's (tracekit.ingest.lake): every run staged as Parquet, nothing renamed into the lake
# yet; and every table's partitions renamed in but `runs`
LAKE_POINTS = ("lake_staged", "lake_renamed")


def reached(point: str) -> None:
    if os.environ.get("TRACEKIT_KILL_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
