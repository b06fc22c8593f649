"""A real `tracekit ingest` killed with SIGKILL at each step of its two commits, and at random moments:
the next ingest into the same database must hold exactly its own events, nothing of the killed one
(rows, ingest_pending rows, staged temporary files) may survive, and no run id is handed out twice."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tracekit import db as dbmod
from tracekit.ingest import ingest
from tracekit.ingest.kill_points import POINTS

from .conftest import corpus, sample
from .test_nsys_ranks import SAXPY, _second_process

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
KILLED = corpus("hta__negative_queue_length_values_check__rank0.json.gz")  # 1.4 MB gz, 190k events
LATER = sample("gloo_rank0.json.gz")


def _events_of_a_clean_ingest(path: Path) -> list[int]:
    con = dbmod.connect()
    results = ingest(con, [path])
    return [con.execute("SELECT count(*) FROM event_rows WHERE run_id = ?", [r.run_id]).fetchone()[0] for r in results]


@pytest.fixture(scope="module")
def clean_counts():
    return {p: _events_of_a_clean_ingest(p) for p in (KILLED, LATER)}


def _ingest(db: Path, trace: Path, tmp: Path, kill_at: str | None = None, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("TRACEKIT_KILL_AT", None)
    if kill_at:
        env["TRACEKIT_KILL_AT"] = kill_at
    return subprocess.run([TRACEKIT, "ingest", "-q", *flags, str(trace), "--db", str(db)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def _staged(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("tracekit-"))


def _check_exact(db: Path, clean_counts: dict) -> dict[int, str]:
    """Every run holds exactly the events a clean ingest of its file gives, and its ingest_log says
    so; no table holds rows of a run id that `runs` lacks; nothing is pending. Returns run -> source."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = dict(con.execute("SELECT run_id, source FROM runs ORDER BY run_id").fetchall())
        for table in dbmod.run_tables(con):
            stray = con.execute(
                f'SELECT DISTINCT run_id FROM "{table}" WHERE run_id NOT IN (SELECT run_id FROM runs)'
            ).fetchall()
            assert not stray, f"{table} holds rows of runs {stray} that do not exist"
        assert con.execute("SELECT count(*) FROM ingest_pending").fetchone()[0] == 0
        by_source: dict[str, list[int]] = {}
        for run_id, source in runs.items():
            held = con.execute("SELECT count(*) FROM event_rows WHERE run_id = ?", [run_id]).fetchone()[0]
            logged = con.execute(
                "SELECT sum(events_ingested) FROM ingest_log WHERE run_id = ? AND source = ?", [run_id, source]
            ).fetchone()[0]
            assert held == logged, f"run {run_id} ({source}) holds {held} events, its ingest_log says {logged}"
            by_source.setdefault(source, []).append(held)
        for source, counts in by_source.items():
            assert sorted(counts) == sorted(clean_counts[Path(source)]), source
        return runs
    finally:
        con.close()


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_each_step_leaves_nothing_the_next_ingest_sees(tmp_path, point, clean_counts):
    db, tmp = tmp_path / "t.duckdb", tmp_path / "tmp"
    tmp.mkdir()
    killed = _ingest(db, KILLED, tmp, kill_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    later = _ingest(db, LATER, tmp)
    assert later.returncode == 0, later.stderr
    runs = _check_exact(db, clean_counts)
    survived = point == "committed"  # killed after its commit: the run is whole and stays
    assert sorted(runs.values()) == sorted([str(LATER)] + ([str(KILLED)] if survived else []))
    if point in ("rows_committed", "derived"):
        assert "which did not finish" in later.stderr and "run 1" in later.stderr, later.stderr
    if point != "read":  # a run id was taken (and committed) before the kill: never handed out again
        assert max(runs) == 2
    assert _staged(tmp) == [], "temporary files of the killed ingest are still there"


@pytest.mark.parametrize("point", ["derived", "committed"])
def test_a_killed_replace_leaves_the_old_run_or_the_new_never_both(tmp_path, point, clean_counts):
    """`--replace` deletes the run it replaces in the commit that completes the new one: killed before
    that commit the old run stays, killed after it only the new one is there."""
    db, tmp = tmp_path / "t.duckdb", tmp_path / "tmp"
    tmp.mkdir()
    assert _ingest(db, KILLED, tmp).returncode == 0
    assert _ingest(db, KILLED, tmp, point, "--replace").returncode == -signal.SIGKILL
    assert _ingest(db, LATER, tmp).returncode == 0
    runs = _check_exact(db, clean_counts)  # one run of each file, each exact
    assert sorted(runs.values()) == sorted([str(KILLED), str(LATER)])
    assert (min(r for r, s in runs.items() if s == str(KILLED)) == 1) == (point == "derived")


def test_a_killed_split_ingest_leaves_no_rank(tmp_path, clean_counts):
    """A Nsight Systems export of two MPI ranks (the real saxpy export with its process copied as a
    second rank, see test_nsys_ranks) becomes one run per rank in the second commit: a kill there
    leaves none of them."""
    db, tmp, split = tmp_path / "t.duckdb", tmp_path / "tmp", tmp_path / "saxpy_two_ranks.sqlite"
    tmp.mkdir()
    shutil.copy(corpus(SAXPY), split)
    _second_process(split)
    counts = clean_counts | {split: _events_of_a_clean_ingest(split)}
    assert len(counts[split]) == 2
    assert _ingest(db, split, tmp, kill_at="derived").returncode == -signal.SIGKILL
    assert _ingest(db, split, tmp).returncode == 0
    assert len(_check_exact(db, counts)) == 2


def test_kills_at_random_moments(tmp_path, clean_counts):
    """SIGKILL from outside at seeded random moments of a real ingest, then an ingest of another file:
    whatever the moment, each run is exact and nothing else is left."""
    db, tmp = tmp_path / "t.duckdb", tmp_path / "tmp"
    tmp.mkdir()
    started = time.perf_counter()
    assert _ingest(tmp_path / "probe.duckdb", KILLED, tmp).returncode == 0
    whole = time.perf_counter() - started
    rng = random.Random(13)
    env = {k: v for k, v in os.environ.items() if k != "TRACEKIT_KILL_AT"} | {"TMPDIR": str(tmp)}
    for _ in range(4):
        proc = subprocess.Popen([TRACEKIT, "ingest", "-q", "--replace", str(KILLED), "--db", str(db)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(rng.uniform(0.2, 1.0) * whole)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        later = _ingest(db, LATER, tmp)
        assert later.returncode == 0, later.stderr
        _check_exact(db, clean_counts)
        assert _staged(tmp) == []
        # the later file is a duplicate from the second round on: it is skipped, not ingested twice
        con = duckdb.connect(str(db), read_only=True)
        assert con.execute("SELECT count(*) FROM runs WHERE source = ?", [str(LATER)]).fetchone()[0] == 1
        con.close()


def test_a_failed_ingest_does_not_poison_the_database(tmp_path, clean_counts):
    """A trace whose kernel end overflows INT64 once left rows that broke every later ingest."""
    bad = tmp_path / "overflow.json"
    end = 2**63 // 1000  # in microseconds: ts + dur passes INT64 nanoseconds
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": end, "dur": end},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
    ]
    bad.write_text(json.dumps({"traceEvents": events}))
    db = tmp_path / "t.duckdb"
    first = subprocess.run([TRACEKIT, "ingest", "-q", str(bad), "--db", str(db)], capture_output=True, text=True)
    assert first.returncode in (0, 2) and "Traceback" not in first.stderr, first.stderr
    later = _ingest(db, LATER, tmp_path)
    assert later.returncode == 0, later.stderr
    runs = _check_exact(db, clean_counts | {bad: _events_of_a_clean_ingest(bad) if first.returncode == 0 else []})
    assert str(LATER) in runs.values()


def test_a_read_only_open_says_what_a_killed_ingest_left(tmp_path):
    """`tracekit sql` opens read-only and cannot remove the rows: it says they are there."""
    db, tmp = tmp_path / "t.duckdb", tmp_path / "tmp"
    tmp.mkdir()
    assert _ingest(db, LATER, tmp, kill_at="rows_committed").returncode == -signal.SIGKILL
    query = subprocess.run([TRACEKIT, "sql", str(db), "SELECT count(*) AS runs FROM runs"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert query.returncode == 0, query.stderr
    assert "run 1 is an ingest of" in query.stderr and "did not finish" in query.stderr
    assert _ingest(db, LATER, tmp).returncode == 0
    again = subprocess.run([TRACEKIT, "sql", str(db), "SELECT 1"], capture_output=True, text=True, timeout=120)
    assert "did not finish" not in again.stderr
