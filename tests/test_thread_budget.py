"""TRACEKIT_THREADS: the threads one tracekit process may keep busy, which a local cluster splits
among its workers."""

from __future__ import annotations

import os

from tracekit import db
from tracekit.cluster.backends import worker_threads
from tracekit.db.connection import thread_budget
from tracekit.engine import runner


def _duckdb_threads(con) -> int:
    return con.execute("SELECT current_setting('threads')").fetchone()[0]


def test_unset_leaves_duckdb_its_default(monkeypatch):
    monkeypatch.delenv("TRACEKIT_THREADS", raising=False)
    assert thread_budget() is None
    con = db.connect(None)
    assert _duckdb_threads(con) == os.cpu_count()


def test_set_caps_duckdb_and_the_rule_threads(monkeypatch):
    monkeypatch.delenv("TRACEKIT_RULE_THREADS", raising=False)
    monkeypatch.setenv("TRACEKIT_THREADS", "1")
    assert _duckdb_threads(db.connect(None)) == 1
    assert runner.rule_threads(0.0) == 1
    monkeypatch.setenv("TRACEKIT_THREADS", "3")
    assert runner.rule_threads(0.0) == min(3, len(os.sched_getaffinity(0)), runner.MAX_RULE_THREADS)


def test_a_value_that_is_no_number_is_ignored(monkeypatch):
    monkeypatch.setenv("TRACEKIT_THREADS", "many")
    assert thread_budget() is None


def test_local_workers_split_the_budget(monkeypatch):
    monkeypatch.setenv("TRACEKIT_THREADS", "8")
    assert worker_threads(2) == 4
    assert worker_threads(3) == 2
    assert worker_threads(16) == 1  # never none
    monkeypatch.delenv("TRACEKIT_THREADS")
    assert worker_threads(1) == len(os.sched_getaffinity(0))
