"""One run per rank when one file holds several: a Nsight Systems capture of a multi-GPU job (one
process per GPU, `nsys profile mpirun ...` or `--trace-fork-before-exec`) holds every rank's host
and GPU events. Cross-rank rules compare runs, so each process that drives GPU work becomes a run of
its own, with its rank.

Which rows are a process's: its host rows (`pid`), and the GPU rows whose correlation id it owns
(the reader scopes correlation ids by process when several share them: pid * 2**32 + id). Rows of
processes that launch no GPU work (the MPI launcher, helper processes) stay in the first run.

Its rank: the `MPI Rank N` thread name nsys gives the threads of an MPI process when MPI tracing is
on; else the processes in the order of the lowest device each one launches on (as local ranks map
to devices under torchrun and mpirun's usual binding).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tracekit.db import next_run_id

MPI_RANK = re.compile(r"^MPI Rank (\d+)$")
CORRELATION_SCOPE = 32  # bits: the reader's pid * 2**32 + correlationId


@dataclass(frozen=True)
class RankProcess:
    pid: int
    rank: int
    rank_source: str
    devices: tuple[int, ...]


# (pid, devices it launches on, its MPI rank thread name if any) of every process whose launches
# reach GPU work, through the process-scoped correlation ids.
PROCESSES_SQL = f"""
WITH gpu AS (
    SELECT DISTINCT correlation >> {CORRELATION_SCOPE} AS pid, device
    FROM event_rows
    WHERE run_id = $run_id AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND correlation IS NOT NULL
), named AS (
    SELECT pid, min(args->>'name') AS thread_name FROM event_rows
    WHERE run_id = $run_id AND kind = 'metadata' AND name = 'thread_name'
      AND regexp_matches(args->>'name', '^MPI Rank [0-9]+$')
    GROUP BY pid
)
SELECT g.pid, list(DISTINCT g.device ORDER BY g.device) AS devices, any_value(n.thread_name) AS thread_name
FROM gpu g LEFT JOIN named n USING (pid)
WHERE g.pid IN (SELECT DISTINCT pid FROM event_rows WHERE run_id = $run_id AND kind IN ('cuda_runtime', 'cuda_driver'))
GROUP BY g.pid ORDER BY min(g.device), g.pid
"""


def rank_processes(con, run_id: int) -> list[RankProcess]:
    """The processes of the run that drive GPU work, with their ranks; fewer than two: nothing to split."""
    found = con.execute(PROCESSES_SQL, {"run_id": run_id}).fetchall()
    if len(found) < 2:
        return []
    named = [MPI_RANK.match(name) for _, _, name in found if name]
    if len(named) == len(found) and len({m.group(1) for m in named}) == len(found):
        return [
            RankProcess(pid, int(MPI_RANK.match(name).group(1)), "nsys thread name (MPI Rank N)", tuple(devices))
            for pid, devices, name in found
        ]
    return [
        RankProcess(pid, rank, "process order by lowest device used", tuple(devices))
        for rank, (pid, devices, _) in enumerate(found)
    ]


def split(con, run_id: int, processes: list[RankProcess]) -> list[int]:
    """Move every process but the first into a run of its own; the run ids, in `processes` order
    (the first is `run_id`). Inside the caller's transaction, before anything is derived."""
    ids = [run_id]
    for process in processes[1:]:
        new = next_run_id(con)
        con.execute(
            f"""UPDATE event_rows SET run_id = $new
            WHERE run_id = $run_id AND CASE WHEN kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')
                                            THEN correlation >> {CORRELATION_SCOPE} = $pid ELSE pid = $pid END""",
            {"new": new, "run_id": run_id, "pid": process.pid},
        )
        ids.append(new)
    return ids


def rows_in(con, run_id: int) -> int:
    return con.execute("SELECT count(*) FROM event_rows WHERE run_id = ?", [run_id]).fetchone()[0]
