"""Where the map tasks run: in a loop in this process, or on Dask workers.

Both run the same functions of tracekit.cluster.work and report a task that failed as an error
string instead of raising, so one bad rank never ends the job. Dask is imported only by
`DaskBackend`: the in-process path, and `tracekit --help`, never load it.

On Dask, phase 2 of a chunk runs on the worker that ran its phase 1 (its database is a file in
that worker's temporary folder): `workers=[address], allow_other_workers=False`. A worker that dies
takes its chunks' databases with it; its tasks end in an error (the scheduler's KilledWorker, or
this module's check that the pinned worker is gone) and the chunk's ranks are reported missing.
"""

from __future__ import annotations

from tracekit.cluster import work
from tracekit.errors import crash_line, one_line


def _report(progress, phase: str, done: int, total: int) -> None:
    if progress is not None:
        progress(f"{phase}: {done}/{total} chunks")


class InProcessBackend:
    """The tasks called in turn in this process: the map/reduce path without a cluster."""

    name = "in-process"

    def __init__(self, progress=None):
        self.workers = 1
        self.progress = progress  # called with a line as each chunk of a phase is done

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def ingest(self, chunks, **options) -> list:
        out = []
        for chunk in chunks:
            try:
                out.append(work.ingest_chunk(chunk, **options))
            except Exception as e:
                out.append(crash_line(e))
            _report(self.progress, "ingested", len(out), len(chunks))
        return out

    def analyze(self, jobs, peers, rules, params, summaries=True) -> list:
        out = []
        for ingested, remap, base in jobs:
            try:
                out.append(work.analyze_chunk(ingested, peers, remap, base, rules, params, summaries))
            except Exception as e:
                out.append(crash_line(e))
            _report(self.progress, "analysed", len(out), len(jobs))
        return out


def worker_threads(workers: int) -> int:
    """Each local worker's share of the cores this process may use (of TRACEKIT_THREADS if set,
    which the workers then split)."""
    from tracekit.db.connection import thread_budget, usable_cpus

    return max(1, (thread_budget() or usable_cpus()) // max(1, workers))


def _on_worker(fn, *args, **kwargs):
    """Run a task and note the Dask worker it ran on (its phase 2 must run there too)."""
    from distributed import get_worker

    result = fn(*args, **kwargs)
    result.worker = get_worker().address
    return result


class DaskBackend:
    """The tasks on a Dask cluster: a LocalCluster of `workers` processes that this backend starts
    and closes, or the existing cluster whose scheduler is at `scheduler`."""

    name = "dask"

    def __init__(self, workers: int | None = None, scheduler: str | None = None, poll_seconds: float = 2.0,
                 progress=None):  # fmt: skip
        from tracekit.errors import TracekitError, require_extra

        require_extra("distributed", "cluster", "analyze --workers/--scheduler")
        import distributed

        self.poll_seconds = poll_seconds
        self.progress = progress
        self.cluster = None
        try:
            if scheduler:
                self.client = distributed.Client(scheduler, timeout="15s")
                self.name = f"dask scheduler {scheduler}"
            else:
                import dask

                # each worker runs one chunk at a time on its share of this machine's cores: DuckDB's
                # default of a thread per core in every worker only makes them contend. Dask's nanny
                # sets MALLOC_TRIM_THRESHOLD_ for its workers, which turns off glibc's adaptive mmap
                # threshold: a chunk's ingest then ran 10-30% slower, at the same peak memory (two
                # 32-rank chunks side by side: 0.97-1.18 s a chunk with it, 0.87-1.07 s without, 214-218
                # MB). A nanny also sets it in the process that starts it, so a later cluster of the
                # same process inherits it: that one is the caller's to clear.
                with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
                    self.cluster = distributed.LocalCluster(
                        n_workers=int(workers),
                        threads_per_worker=1,
                        processes=True,
                        dashboard_address=None,
                        env={"TRACEKIT_THREADS": str(worker_threads(int(workers)))},
                    )
                self.client = distributed.Client(self.cluster)
                self.name = "dask LocalCluster"
        except Exception as e:  # OSError, TimeoutError, a nanny that failed to start: one line, not a traceback
            if self.cluster is not None:
                self.cluster.close()
            where = (
                f"reach the Dask scheduler {scheduler}"
                if scheduler
                else f"start a local Dask cluster of {workers} workers"
            )
            raise TracekitError(f"cannot {where}: {one_line(e)}") from None
        self.workers = len(self.client.scheduler_info().get("workers", {}))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        return False

    def ingest(self, chunks, **options) -> list:
        futures = [self.client.submit(_on_worker, work.ingest_chunk, chunk, pure=False, **options) for chunk in chunks]
        return self._gather(futures, [None] * len(futures), "ingested")

    def analyze(self, jobs, peers, rules, params, summaries=True) -> list:
        shared = self._share(peers) if peers is not None else None
        futures, pinned = [], []
        for ingested, remap, base in jobs:
            futures.append(self.client.submit(
                _on_worker, work.analyze_chunk, ingested, shared, remap, base, rules, params, summaries, pure=False,
                workers=[ingested.worker], allow_other_workers=False,
            ))  # fmt: skip
            pinned.append(ingested.worker)
        return self._gather(futures, pinned, "analysed")

    def _share(self, peers):
        """The chunks' collective counts and extremes, sent to every worker once; when a worker has just died (the
        scheduler still lists it, so the broadcast to it fails), again after a moment, and at last
        with each task instead, so one lost worker does not end the job."""
        import time

        for attempt in range(3):
            try:
                return self.client.scatter(peers, broadcast=True)
            except OSError:  # distributed's CommClosedError and StreamClosedError are OSErrors
                time.sleep(self.poll_seconds * (attempt + 1))
        return peers

    def _gather(self, futures, pinned, phase: str) -> list:
        """Each task's result, or its error; a task pinned to a worker that left is given up."""
        from distributed import wait

        out: list = [None] * len(futures)
        waiting = dict(enumerate(futures))
        while waiting:
            try:
                done = set(wait(list(waiting.values()), timeout=self.poll_seconds, return_when="FIRST_COMPLETED")[0])
            except TimeoutError:  # none finished yet: look whether their workers are still there
                done = set()
            alive = set(self.client.scheduler_info().get("workers", {}))
            for i, future in list(waiting.items()):
                if future in done:
                    try:
                        out[i] = future.result()
                    except Exception as e:
                        out[i] = one_line(e)
                    del waiting[i]
                elif pinned[i] is not None and pinned[i] not in alive:
                    future.cancel()
                    out[i] = f"worker {pinned[i]} is gone (died or left), and the chunk's database with it"
                    del waiting[i]
            if done:
                _report(self.progress, phase, len(futures) - len(waiting), len(futures))
        return out
