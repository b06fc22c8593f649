"""The map/reduce over ranks (tracekit.cluster, docs/cluster.md) gives what one database of every
rank gives: the same finding records and notes in the same order, in this process and on a real
Dask LocalCluster, on real rank traces; a rank that cannot be read is left out and named; the
reducer holds the summaries only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tests.conftest import ROOT, sample
from tracekit.engine import registry
from tracekit.engine.registry import DataQuality, Rule

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
SLOW_COMPUTE = sorted((ROOT / "tests" / "data" / "rank_matrix" / "slow_compute").glob("rank*.json.gz"))
TP2 = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]
GLOO = [sample("gloo_rank0.json.gz"), sample("gloo_rank1.json.gz")]

# What the cross-rank views say, per rank: a job rule that reads them (below) writes it in a note,
# so the note is the same only when the reducer's tables hold what one database's views compute.
SUMMARY_SQL = """
SELECT json_group_object(rank, struct_pack(steps, wait_ns, lag_ns, ops, op_ns, calls, arrivals)) AS doc FROM (
    SELECT r.rank,
           (SELECT count(*) FROM rank_steps s WHERE s.run_id = r.run_id) AS steps,
           (SELECT sum(wait_ns) FROM rank_step_waits w WHERE w.run_id = r.run_id) AS wait_ns,
           (SELECT sum(arrival_lag_ns) FROM rank_step_waits w WHERE w.run_id = r.run_id) AS lag_ns,
           (SELECT count(*) FROM rank_op_times o WHERE o.run_id = r.run_id) AS ops,
           (SELECT sum(total_ns) FROM rank_op_times o WHERE o.run_id = r.run_id) AS op_ns,
           (SELECT count(*) || ':' || sum(event_id) FROM rank_collectives c WHERE c.run_id = r.run_id) AS calls,
           (SELECT count(*) FROM collective_arrivals a WHERE a.run_id = r.run_id) AS arrivals
    FROM runs r ORDER BY r.rank
)
"""


def _job_rule(con, params, ctx):
    doc = con.execute(SUMMARY_SQL).fetchone()[0]
    yield DataQuality("Z901", f"ranks: {doc}")


def _fake(code: str, name: str, requires: tuple[str, ...]) -> Rule:
    return Rule(code=code, name=name, title=name, category="distributed", requires=requires, params={},
                check=_job_rule, scope="job")  # fmt: skip


@pytest.fixture
def job_rules(monkeypatch):
    """A job-scope rule beside the real ones (whichever exist): Z901 reads the summaries and their views."""
    rules = registry._registry()
    # a job of rank traces holds no profiler cluster summary: every other job input has rows
    inputs = tuple(t for t in registry.JOB_INPUTS if t != "cluster_step_components")
    monkeypatch.setitem(rules, "Z901", _fake("Z901", "summary-echo", inputs))
    return rules


@pytest.fixture(scope="module")
def scheduler():
    """One real LocalCluster of two worker processes for the module's Dask runs (starting one costs
    seconds on two cores); `workers=2`, which starts its own, runs through the CLI test."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        yield c.scheduler_address


def single(paths, rules=None):
    with tracekit.open(*paths) as trace:
        a = trace.analysis(rules)
        return [f.as_dict() for f in a.findings], [n.as_dict() for n in a.notes]


def test_slow_compute_same_findings_and_notes_in_process_and_on_dask(job_rules, scheduler):
    records, notes = single(SLOW_COMPUTE)
    echo = [n for n in notes if n["rule"] == "Z901"]
    assert len(echo) == 1 and '"7":{"steps":' in echo[0]["message"]  # the job rule saw all eight ranks
    in_process = tracekit.analyze_job(SLOW_COMPUTE, chunk_size=3)  # chunks of 3, 3 and 2 ranks
    assert (in_process.records, in_process.notes) == (records, notes)
    assert in_process.cluster["chunks"] == 3 and in_process.missing == []
    on_dask = tracekit.analyze_job(SLOW_COMPUTE, chunk_size=4, scheduler=scheduler)  # one chunk per worker
    assert (on_dask.records, on_dask.notes) == (records, notes)
    assert on_dask.cluster["workers"] == 2 and len(on_dask.cluster["peak_rss_mb"]) == 2
    assert all(mb > 50 for mb in on_dask.cluster["peak_rss_mb"].values())
    assert on_dask.cluster["reduce_seconds"] > 0


def test_tp2_pair_one_rank_per_chunk_matches_through_the_chunks_extremes(scheduler):
    from tracekit.render.report import REPORT_FORMATS

    records, notes = single(TP2)
    with tracekit.open(*TP2) as trace:
        report = trace.report_document()
    c001 = [r for r in records if r["rule"] == "C001"]
    assert c001 and "cross_rank" in c001[0]["evidence"]["details"]  # the split needs the other rank
    assert any(r["locality"]["rank"] == 1 for r in records)  # rank 1's event ids are past rank 0's
    for options in ({}, {"scheduler": scheduler}):
        job = tracekit.analyze_job(TP2, chunk_size=1, **options)
        assert job.records == records
        assert job.notes == notes
    document = job.report_document()
    assert document.pop("cluster")["chunks"] == 2
    assert document == report  # runs, summary and counts too: every --format prints the same
    for fmt in REPORT_FORMATS:
        assert _rendered(document, fmt) == _rendered(report, fmt)


def _rendered(report: dict, fmt: str) -> str:
    import io

    from tracekit.render.report import render

    out = io.StringIO()
    render(report, fmt, out)
    return out.getvalue()


def test_a_worker_without_peers_would_not_split_c001():
    """The check above means something: one rank alone has no cross-rank split."""
    alone, _ = single(TP2[:1])
    assert all("cross_rank" not in r["evidence"].get("details", {}) for r in alone if r["rule"] == "C001")


def test_a_truncated_rank_is_left_out_and_named(tmp_path):
    good = SLOW_COMPUTE[:4]
    files = []
    for p in good:
        files.append(tmp_path / p.name)
        files[-1].write_bytes(p.read_bytes())
    files[1].write_bytes(good[1].read_bytes()[:20_000])  # rank1: cut short
    job = tracekit.analyze_job([tmp_path], chunk_size=2)  # a folder, expanded as tracekit.open does
    assert [m["path"] for m in job.missing] == [str(files[1])]
    assert "truncated" in job.missing[0]["error"]
    said = [n for n in job.notes if n["rule"] == "cluster"]
    assert len(said) == 1 and str(files[1]) in said[0]["message"]
    # the others are analysed as one database of them alone would: ids renumbered past the gap
    records, notes = single([files[0], *files[2:]])
    assert job.records == records
    assert [n for n in job.notes if n["rule"] != "cluster"] == notes
    assert [r["rank"] for r in job.runs] == [0, 2, 3] and [r["run_id"] for r in job.runs] == [1, 2, 3]


def test_the_cli_reports_a_missing_rank_and_exits_2(tmp_path, scheduler):
    # on an existing cluster (--scheduler), the module's: the CLI path for a cluster it did not start
    bad = tmp_path / "rank1.json.gz"
    bad.write_bytes(b"\x1f\x8b garbage")
    proc = subprocess.run([TRACEKIT, "analyze", GLOO[0], bad, "--scheduler", scheduler, "--format", "json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["cluster"]["backend"].startswith("dask")
    assert [line for line in proc.stderr.splitlines() if str(bad) in line]
    doc = json.loads(proc.stdout)
    assert [m["path"] for m in doc["cluster"]["missing"]] == [str(bad)]
    assert [r["rank"] for r in doc["runs"]] == [0]
    nothing = subprocess.run([TRACEKIT, "analyze", bad, "--workers", "0"], capture_output=True, text=True, timeout=300)
    assert nothing.returncode == 2 and nothing.stdout == ""
    assert len(nothing.stderr.strip().splitlines()) == 1 and "nothing could be analysed" in nothing.stderr


def test_the_reducer_holds_only_summaries(job_rules, monkeypatch):
    """A job rule that asks for more than the summaries (Z902: `kernels`) finds it absent there."""
    monkeypatch.setitem(job_rules, "Z902", _fake("Z902", "needs-events", ("rank_steps", "kernels")))
    from tracekit.cluster import reduce, work
    from tracekit.cluster.plan import plan

    chunks = plan(GLOO, chunk_size=1)
    ingested = [work.ingest_chunk(c) for c in chunks]
    numbering = reduce.number(ingested)
    analyzed = [work.analyze_chunk(i, numbering.peers, numbering.remaps[i.chunk.index],
                                   numbering.event_bases[i.chunk.index]) for i in ingested]  # fmt: skip
    assert not any(Path(i.db_path).exists() for i in ingested)  # the chunk databases are gone
    trace = reduce.job_database(analyzed)
    try:
        tables = {
            r[0]: r[1] for r in trace.sql("SELECT table_name, table_type FROM information_schema.tables").fetchall()
        }
        assert "event_rows" not in tables and "ingest_log" not in tables
        assert {tables[t] for t in ("runs", "rank_collectives", "rank_steps", "rank_op_times")} == {"BASE TABLE"}
        assert trace.sql("SELECT count(*) FROM collective_arrivals").fetchall()[0][0] > 0  # the views read the tables
        analysis = trace.analysis(scope="job")
        said = {n.rule: n.message for n in analysis.notes}
        assert said["Z902"] == "needs-events not run: needs kernels (absent)"
        assert said["Z901"].startswith("ranks: {")
        assert all(f.rule in ("Z901", "Z902") or registry.get_rule(f.rule).scope == "job" for f in analysis.findings)
    finally:
        trace.close()


def test_the_cli_on_a_local_cluster_prints_the_same_report():
    common = ["analyze", *map(str, GLOO), "--format", "json"]
    plain = subprocess.run([TRACEKIT, *common], capture_output=True, text=True, timeout=300)
    mapped = subprocess.run([TRACEKIT, *common, "--workers", "2", "--chunk-size", "1"], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert plain.returncode == 0 and mapped.returncode == 0, mapped.stderr
    expected, got = json.loads(plain.stdout), json.loads(mapped.stdout)
    cluster = got.pop("cluster")
    assert got == expected
    assert cluster["backend"] == "dask LocalCluster" and cluster["workers"] == 2 and cluster["chunks"] == 2
    assert "Traceback" not in mapped.stderr


def test_help_and_the_in_process_path_do_not_import_dask():
    code = (
        "import sys, tracekit.cli.app\n"
        "assert not {'dask', 'distributed'} & set(sys.modules), 'cli'\n"
        "import tracekit\n"
        f"job = tracekit.analyze_job([{str(GLOO[1])!r}])\n"
        "assert job.cluster['backend'] == 'in-process' and job.records\n"
        "assert not {'dask', 'distributed'} & set(sys.modules), 'in-process'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_worker_that_dies_between_the_phases_leaves_its_chunks_out(scheduler):
    """Phase 2 runs where the chunk's database is; once that worker is gone, its chunks are given up
    (not waited for forever) and the other chunks are analysed."""
    import contextlib
    import os

    from tracekit.cluster import backends, reduce
    from tracekit.cluster.plan import plan
    from tracekit.cluster.work import Analyzed, Ingested

    with backends.DaskBackend(scheduler=scheduler) as backend:
        ingested = backend.ingest(plan(GLOO, chunk_size=1))
        assert all(isinstance(i, Ingested) and i.worker for i in ingested)
        victim = ingested[-1].worker
        with contextlib.suppress(Exception):  # the worker's connection drops as it exits
            backend.client.run(os._exit, 1, workers=[victim])
        n = reduce.number(ingested)
        jobs = [(i, n.remaps[i.chunk.index], n.event_bases[i.chunk.index]) for i in ingested]
        outcomes = backend.analyze(jobs, n.peers, None, None)
    for item, outcome in zip(ingested, outcomes):
        if item.worker == victim:
            assert isinstance(outcome, str) and victim in outcome and "gone" in outcome
        else:
            assert isinstance(outcome, Analyzed) and outcome.records


def test_a_file_of_two_ranks_shifts_the_next_chunks_run_ids(tmp_path):
    """An Nsight Systems export of two processes makes two runs: the chunk after it started its ids
    one too low, and the reducer's renumbering gives every run the id one database gives it."""
    import shutil

    from tests.conftest import corpus
    from tests.test_nsys_ranks import SAXPY, _second_process

    two = tmp_path / "saxpy_two_ranks.sqlite"
    shutil.copy(corpus(SAXPY), two)
    _second_process(two)
    paths = [two, corpus(SAXPY)]
    records, notes = single(paths)
    job = tracekit.analyze_job(paths, chunk_size=1)
    assert [r["run_id"] for r in job.runs] == [1, 2, 3]
    assert [Path(r["source"]).name for r in job.runs] == [two.name, two.name, SAXPY]
    assert job.records and any(r["locality"].get("run_id") == 3 for r in job.records)
    assert (job.records, job.notes) == (records, notes)


def test_a_trace_given_twice_is_analysed_once_as_one_database_does(tmp_path):
    """gloo rank1 given again at the start of a later chunk: dropped there, and the run and event
    ids of rank 0 after it in that chunk close the gap."""
    copy = tmp_path / "again.json.gz"
    copy.write_bytes(GLOO[1].read_bytes())
    paths = [GLOO[1], sample("cpu_two_threads.json.gz"), copy, GLOO[0]]
    records, notes = single(paths)
    job = tracekit.analyze_job(paths, chunk_size=2)  # [rank1, cpu], [again, rank0]
    assert [r["source"] for r in job.runs] == [str(p) for p in paths if p != copy]
    assert len(job.cluster["duplicates"]) == 1 and str(copy) in job.cluster["duplicates"][0]
    assert any(r["locality"].get("run_id") == 3 for r in job.records)  # rank 0, after the gap
    assert (job.records, job.notes) == (records, notes)


def _worker_duckdb_threads():
    from tracekit import db

    return db.connect(None).execute("SELECT current_setting('threads')").fetchone()[0]


def test_local_workers_split_the_cores_for_duckdb_and_the_rules(monkeypatch):
    """Each local worker runs one chunk at a time on its share of the cores: two workers of a
    4-thread budget get two DuckDB threads each, not one per core each."""
    import os

    from tracekit.cluster import backends

    monkeypatch.setenv("TRACEKIT_THREADS", "4")
    # a nanny started earlier in this process sets it here too (Dask does so before it spawns)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with backends.DaskBackend(workers=2) as backend:
        assert set(backend.client.run(_worker_duckdb_threads).values()) == {2}
        # glibc's adaptive malloc is left alone (Dask's nanny would set a trim threshold: a slower ingest)
        assert set(backend.client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values()) == {None}


def test_the_default_plan_bounds_a_chunk_by_its_inflated_content(tmp_path, monkeypatch):
    """Without a chunk size a chunk holds at most CHUNK_BYTES of inflated trace (a gzip counts its
    content, not its file) and a larger file is a chunk alone, so a worker's memory follows the
    largest rank file, not how many ranks a chunk of the default count would hold."""
    from tracekit import compression
    from tracekit.cluster import plan as planning

    inflated = [compression.inflated_size(p) for p in SLOW_COMPUTE]
    assert all(i > 4 * p.stat().st_size for i, p in zip(inflated, SLOW_COMPUTE))
    large = tmp_path / "large.json"
    large.write_text(json.dumps({"traceEvents": []}) + " " * (3 * max(inflated)))
    inputs = [*SLOW_COMPUTE[:3], large, *SLOW_COMPUTE[3:]]
    monkeypatch.setattr(planning, "CHUNK_BYTES", 2 * max(inflated) + 1)  # two ranks, never three
    chunks, count = planning.auto_plan(inputs, workers=1)
    assert count == 5  # about two chunks per worker by count alone
    r = [str(p) for p in SLOW_COMPUTE]
    assert [c.paths for c in chunks] == [(r[0], r[1]), (r[2],), (str(large),), (r[3], r[4]), (r[5], r[6]), (r[7],)]
    assert [c.first for c in chunks] == [0, 2, 3, 4, 6, 8] and [c.index for c in chunks] == list(range(6))
    monkeypatch.setattr(planning, "CHUNK_BYTES", 1 << 40)  # then the count bounds them
    assert [len(c.paths) for c in planning.auto_plan(inputs, workers=4)[0]] == [2, 2, 2, 2, 1]
    # a chunk size given is a count, whatever the content
    assert [len(c.paths) for c in planning.plan(inputs, chunk_size=4)] == [4, 4, 1]
