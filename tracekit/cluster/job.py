"""`tracekit.analyze_job`: the map/reduce over a job's ranks, from the inputs to one report.

plan -> map 1 (ingest each chunk where it runs) -> reduce 1 (one numbering; every chunk's collective
counts and extremes) -> map 2 (per-rank rules, next to the events) -> reduce 2 (cross-rank rules
over the summaries, one ranking). The findings and notes are those of one database of every input
(`tracekit.open(*inputs).analysis()`), in the same order; what crossed between workers is only the
summaries. An input that cannot be read, or a worker that dies, leaves its ranks out: they are
named in `missing` and in a note, and the job finishes with the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tracekit.cluster import reduce
from tracekit.cluster.backends import DaskBackend, InProcessBackend
from tracekit.cluster.plan import CHUNK_BYTES, auto_plan, plan
from tracekit.cluster.work import Analyzed, Ingested
from tracekit.errors import TracekitError


@dataclass
class JobResult:
    """The job's findings as finding records (ranked as Trace.finding_records ranks them), its
    data-quality notes (dicts), the inputs left out, and how the run went (`cluster`)."""

    records: list[dict]
    notes: list[dict]
    missing: list[dict]  # {"path", "error"} per input not analysed
    cluster: dict
    runs: list[dict] = field(default_factory=list)  # the report's `runs` section
    summary: dict = field(default_factory=dict)  # Trace.summary() of every run analysed

    def report_document(self, max_findings: int | None = 25) -> dict:
        """The analyze report (`tracekit analyze --format json`), plus its `cluster` key."""
        from tracekit.findings.report import report_of_records

        cap = len(self.records) if max_findings is None else max_findings
        doc = report_of_records(self.runs, self.records, self.notes, self.summary, max_findings=cap)
        return {**doc, "cluster": self.cluster}


def analyze_job(
    inputs,
    workers: int | None = None,
    scheduler: str | None = None,
    rules=None,
    params=None,
    chunk_size: int | None = None,
    rank: int | None = None,
    metrics: tuple[str, ...] = (),
    progress=None,
) -> JobResult:
    """Analyse a job's rank traces chunk by chunk (docs/cluster.md).

    `inputs`: trace files, or folders of them (expanded as `tracekit.open` does). Backend: none of
    `workers`/`scheduler` (or workers=0): the tasks in a loop in this process; `workers=N`: a Dask
    LocalCluster of N single-threaded worker processes, started and closed here; `scheduler`: the
    address of an existing Dask scheduler, whose workers must see the input paths. `chunk_size`:
    consecutive inputs per chunk (a worker holds one chunk's database at a time); default: about two
    chunks per worker, at most 32 inputs and 64 MiB of inflated content each, a larger file a chunk
    of its own (`plan.auto_plan`). `rules`, `params`:
    as for Trace.analysis. `progress`: called with a line as chunks are ingested and analysed."""
    from tracekit.api import analysis_key

    analysis_key(rules, params)  # unknown rules and parameters fail before anything runs
    if workers is not None and workers < 0:
        raise TracekitError("workers must be 0 (in this process) or more")
    if workers and scheduler:
        raise TracekitError("pass either workers (a local cluster) or scheduler (an existing one), not both")
    started = time.perf_counter()
    backend = DaskBackend(workers, scheduler, progress=progress) if workers or scheduler else InProcessBackend(progress)
    with backend:
        listed = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        if chunk_size is None:
            chunks, chunk_size = auto_plan(listed, backend.workers)
            chunk_bytes = CHUNK_BYTES
        else:
            chunks, chunk_bytes = plan(listed, chunk_size), None
        ingested = backend.ingest(chunks, rank=rank, metrics=tuple(metrics))
        missing: list[dict] = []
        good: list[Ingested] = []
        for chunk, item in zip(chunks, ingested):
            if isinstance(item, Ingested):
                missing += item.failed
                good.append(item)
            else:
                missing += [{"path": p, "error": f"ingest of its chunk failed: {item}"} for p in chunk.paths]
        numbering = reduce.number(good)
        jobs = [(i, numbering.remaps[i.chunk.index], numbering.event_bases[i.chunk.index]) for i in good]
        summaries = reduce.runs_job_rules(rules)
        outcomes = backend.analyze(jobs, numbering.peers, rules, params, summaries) if jobs else []
        worker_count = backend.workers
        backend_name = backend.name
    analyzed: list[Analyzed] = []
    for (item, _, _), outcome in zip(jobs, outcomes):
        if isinstance(outcome, Analyzed):
            if outcome.tables["runs"].num_rows:
                analyzed.append(outcome)
            continue
        failed = {m["path"] for m in item.failed}
        missing += [{"path": p, "error": f"analysis of its chunk failed: {outcome}"}
                    for p in item.chunk.paths if p not in failed]  # fmt: skip
    if not analyzed:
        first = missing_line(missing[0]) if missing else "the inputs made no runs"
        raise TracekitError(f"nothing could be analysed: {first}")
    map_seconds = time.perf_counter() - started
    reduced = time.perf_counter()
    job_records, job_notes = reduce.job_analysis(analyzed, rules, params)
    records, notes = reduce.merge(analyzed, job_records, job_notes, rules)
    reduce_seconds = time.perf_counter() - reduced
    notes += [{"rule": "cluster", "run_id": None,
               "message": f"not analysed: {missing_line(m)}; the findings are those of the other inputs"}
              for m in missing]  # fmt: skip
    runs = sorted((r for a in analyzed for r in a.report_runs), key=lambda r: r["run_id"])
    summary = {**analyzed[0].summary, "runs": sorted((r for a in analyzed for r in a.summary["runs"]),
                                                     key=lambda r: r["run_id"])}  # fmt: skip
    cluster = {
        "backend": backend_name,
        "workers": worker_count,
        "chunks": len(chunks),
        "chunk_size": chunk_size,
        "chunk_bytes": chunk_bytes,
        "inputs": sum(len(c.paths) for c in chunks),
        "runs": len(runs),
        "peak_rss_mb": _peaks(ingested, outcomes),
        "map_seconds": round(map_seconds, 3),
        "reduce_seconds": round(reduce_seconds, 3),
        "missing": missing,
        "duplicates": [d for i in good for d in i.duplicates] + numbering.duplicates,
    }
    return JobResult(records, notes, missing, cluster, runs, summary)


def missing_line(missing: dict) -> str:
    """An input left out and why, naming the file once (a reader's error names it already)."""
    error = missing["error"]
    return error if missing["path"] in error else f"{missing['path']}: {error}"


def _peaks(*phases) -> dict[str, float]:
    """Peak resident memory per worker (its address, or host:pid in this process) over its tasks."""
    peaks: dict[str, float] = {}
    for results in phases:
        for r in results:
            if isinstance(r, (Ingested, Analyzed)):
                where = r.worker or f"{r.host}:{r.pid}"
                peaks[where] = max(peaks.get(where, 0.0), r.peak_rss_mb)
    return peaks
