"""The shared stdlib views computed once per analysis: same findings as reading the views, and nothing
left behind."""

from __future__ import annotations

import pytest

import tracekit
from tests.conftest import sample
from tracekit.engine import shared_views
from tracekit.engine.runner import run_rules


def _temp_tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}


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


def test_tables_shadow_the_views_inside_and_go_afterwards():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        before = _temp_tables(con)
        live = con.execute("SELECT count(*) FROM launches").fetchone()[0]
        with shared_views.computed_once(con):
            inside = _temp_tables(con)
            assert set(shared_views.SHARED_VIEWS) <= inside
            # the table answers the view's name, with the view's rows
            assert con.execute("SELECT count(*) FROM launches").fetchone()[0] == live
            assert con.execute("SELECT count(*) FROM temp.main.launches").fetchone()[0] == live
        assert _temp_tables(con) == before
        assert con.execute("SELECT count(*) FROM launches").fetchone()[0] == live


def test_a_nested_analysis_keeps_the_outer_tables():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        with shared_views.computed_once(con):
            with shared_views.computed_once(con):
                pass
            assert set(shared_views.SHARED_VIEWS) <= _temp_tables(con)
        assert not set(shared_views.SHARED_VIEWS) & _temp_tables(con)


def test_tables_go_when_a_rule_raises():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        with pytest.raises(RuntimeError), shared_views.computed_once(con):
            raise RuntimeError("a rule failed")
        assert not set(shared_views.SHARED_VIEWS) & _temp_tables(con)
