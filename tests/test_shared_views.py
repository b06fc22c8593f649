"""The stdlib views computed once per analysis: same findings as reading the views, the same on one
thread as on several, and nothing left behind."""

from __future__ import annotations

import pytest

import tracekit
from tests.conftest import sample
from tracekit.engine import runner, shared_views
from tracekit.engine.runner import run_rules


def _temp_views(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}


def _shared_catalogs(con) -> set[str]:
    return {
        r[0]
        for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()
        if r[0].startswith("tk_shared_")
    }


def _records(findings) -> list[tuple]:
    return sorted((f.rule, f.severity, f.title, repr(f.locality)) for f in findings)


@pytest.mark.parametrize("name", ["gpu_prefill_decode_eager.json.gz", "gpu_tp2_rank0.json.gz"])
def test_findings_are_the_same_as_reading_the_views(name, monkeypatch):
    with tracekit.open(sample(name)) as trace:
        con = trace._db.con
        shared, _ = run_rules(con)
        monkeypatch.setattr(shared_views, "SHARED_VIEWS", ())
        direct, _ = run_rules(con)
    assert shared, "the sample gives findings"
    assert _records(shared) == _records(direct)


@pytest.mark.parametrize("name", ["gpu_prefill_decode_eager.json.gz", "gpu_tp2_rank0.json.gz"])
def test_rules_on_threads_give_what_one_thread_gives_in_the_same_order(name, monkeypatch):
    with tracekit.open(sample(name)) as trace:
        con = trace._db.con
        monkeypatch.setenv("TRACEKIT_RULE_THREADS", "4")
        threaded, threaded_notes = run_rules(con)
        monkeypatch.setenv("TRACEKIT_RULE_THREADS", "1")
        serial, serial_notes = run_rules(con)
    assert threaded, "the sample gives findings"
    assert [(f.id, f.rule, f.severity, f.title, f.impact_ns) for f in threaded] == [
        (f.id, f.rule, f.severity, f.title, f.impact_ns) for f in serial
    ]
    assert [(n.rule, n.message) for n in threaded_notes] == [(n.rule, n.message) for n in serial_notes]


def test_a_rule_that_raises_on_a_thread_raises_in_the_caller_and_leaves_nothing(monkeypatch):
    monkeypatch.setenv("TRACEKIT_RULE_THREADS", "3")
    real = runner._run_one

    def failing(con, rule, *args):
        if rule.code == "G001":
            raise RuntimeError("a rule failed")
        return real(con, rule, *args)

    monkeypatch.setattr(runner, "_run_one", failing)
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        before = _temp_views(con)
        with pytest.raises(RuntimeError, match="a rule failed"):
            run_rules(con)
        assert _temp_views(con) == before
        assert not _shared_catalogs(con)


def test_thread_count_follows_the_setting(monkeypatch):
    monkeypatch.setenv("TRACEKIT_RULE_THREADS", "2")
    assert runner.rule_threads() == 2
    assert runner.rule_threads(shared_seconds=60.0) == 2  # the setting wins over the trace's size
    monkeypatch.setenv("TRACEKIT_RULE_THREADS", "not a number")
    assert 1 <= runner.rule_threads() <= runner.MAX_RULE_THREADS


def test_a_large_trace_runs_its_rules_on_one_thread(monkeypatch):
    # where the shared views alone took a second, each rule's query fills the cores by itself
    monkeypatch.delenv("TRACEKIT_RULE_THREADS", raising=False)
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert runner.rule_threads(shared_seconds=0.2) == 2
    assert runner.rule_threads(shared_seconds=runner.THREADED_UNTIL_S) == 1


def test_tables_shadow_the_views_inside_and_go_afterwards():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        before = _temp_views(con)
        live = con.execute("SELECT count(*) FROM launches").fetchone()[0]
        with shared_views.computed_once(con) as shared:
            assert set(shared_views.SHARED_VIEWS) <= _temp_views(con)
            assert set(shared.views) == set(shared_views.SHARED_VIEWS)
            # the name answers from the table, with the view's rows
            assert con.execute("SELECT count(*) FROM launches").fetchone()[0] == live
            assert con.execute(f"SELECT count(*) FROM {shared.catalog}.main.launches").fetchone()[0] == live
            # another connection of the database reads the same tables through its own views
            cur = shared.cursor()
            try:
                assert set(shared_views.SHARED_VIEWS) <= _temp_views(cur)
                assert cur.execute("SELECT count(*) FROM launches").fetchone()[0] == live
            finally:
                cur.close()
        assert _temp_views(con) == before
        assert not _shared_catalogs(con)
        assert con.execute("SELECT count(*) FROM launches").fetchone()[0] == live


def test_a_cursor_keeps_the_connections_own_settings():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        con.execute("SET asof_loop_join_threshold = 7")
        with shared_views.computed_once(con) as shared:
            cur = shared.cursor()
            try:
                got = cur.execute("SELECT current_setting('asof_loop_join_threshold')").fetchone()[0]
            finally:
                cur.close()
        assert int(got) == 7


def test_a_nested_analysis_keeps_the_outer_tables():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        with shared_views.computed_once(con) as outer:
            with shared_views.computed_once(con) as inner:
                assert inner is outer
            assert set(shared_views.SHARED_VIEWS) <= _temp_views(con)
            assert _shared_catalogs(con) == {outer.catalog}
        assert not set(shared_views.SHARED_VIEWS) & _temp_views(con)
        assert not _shared_catalogs(con)


def test_tables_go_when_a_rule_raises():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        with pytest.raises(RuntimeError), shared_views.computed_once(con):
            raise RuntimeError("a rule failed")
        assert not set(shared_views.SHARED_VIEWS) & _temp_views(con)
        assert not _shared_catalogs(con)


def test_a_cursor_draws_no_progress_bar():
    # a rule's long query on a cursor must not print DuckDB's bar on the analyze command's stderr
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        with shared_views.computed_once(trace._db.con) as shared:
            cur = shared.cursor()
            try:
                drawn = cur.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0]
            finally:
                cur.close()
    assert drawn is False or str(drawn).lower() == "false"


RANK_SETS = {
    "gloo": [sample("gloo_rank0.json.gz"), sample("gloo_rank1.json.gz")],
    "ep_hot_expert": [sample(f"ep_hot_expert_rank{r}.json.gz") for r in range(4)],
}


@pytest.mark.parametrize("name", sorted(RANK_SETS))
def test_a_job_shares_its_rank_summaries_and_finds_the_same(name, monkeypatch):
    """Where the database holds ranks of a job, the per-rank summaries the cross-rank rules read over
    and over are tables too, with the rows the views give and the same findings."""
    with tracekit.open(*RANK_SETS[name]) as trace:
        con = trace._db.con
        direct = {v: sorted(con.execute(f"SELECT * FROM {v}").fetchall()) for v in shared_views.RANK_VIEWS}
        assert direct["rank_steps"] and direct["rank_op_times"]
        with shared_views.computed_once(con) as shared:
            assert set(shared_views.RANK_VIEWS) <= set(shared.views)
            for view, expected in direct.items():
                assert sorted(con.execute(f"SELECT * FROM {view}").fetchall()) == expected, view
        found, _ = run_rules(con)
        monkeypatch.setattr(shared_views, "RANK_VIEWS", ())
        plain, _ = run_rules(con)
    assert any(f.rule.startswith("R") for f in found)
    assert _records(found) == _records(plain)


def test_one_process_computes_no_rank_summary():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        with shared_views.computed_once(trace._db.con) as shared:
            assert not set(shared_views.RANK_VIEWS) & set(shared.views)


def test_a_rule_that_crashes_is_a_note_and_the_others_still_report(monkeypatch):
    """A rule's own bug on some input (a Python exception, not DuckDB's) costs that rule only: the
    report says it failed, where, and that it is a bug, and every other rule's findings stay."""
    from tracekit.engine.registry import get_rule

    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        expected, _ = run_rules(con)
        victim = get_rule("G001")

        def broken(con, params, ctx):
            yield from ()
            raise TypeError("missing 1 required positional argument: 'window_ns'")

        monkeypatch.setattr(victim, "check", broken)
        found, notes = run_rules(con)
    assert _records(found) == _records([f for f in expected if f.rule != "G001"])
    (note,) = [n for n in notes if n.rule == "G001"]
    assert "failed (a tracekit bug" in note.message and "TypeError" in note.message
    assert "test_shared_views.py:" in note.message


def test_the_rank_summaries_of_one_rank_are_computed_when_asked():
    """A cluster worker's chunk of one rank is no job by itself (HAS_JOB_SQL), yet its summaries go
    to the reducer: computed once, rank_steps and the others read rank_collectives' table, with the
    rows the views give."""
    with tracekit.open(sample("gpu_tp2_rank0.json.gz")) as trace:
        con = trace._db.con
        live = {v: con.execute(f"SELECT * FROM {v} ORDER BY ALL").fetchall() for v in shared_views.RANK_VIEWS}
        assert live["rank_collectives"] and live["rank_steps"]  # a rank of a real two-rank run
        with shared_views.computed_once(con) as shared:
            assert not set(shared_views.RANK_VIEWS) & set(shared.views)
        with shared_views.computed_once(con, ranks=True) as shared:
            assert set(shared_views.RANK_VIEWS) <= set(shared.views)
            for view, rows in live.items():
                assert con.execute(f"SELECT * FROM {view} ORDER BY ALL").fetchall() == rows, view
