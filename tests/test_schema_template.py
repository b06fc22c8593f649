"""New database files are copies of a cached template: the same catalog as an install, never a stale one."""

from __future__ import annotations

import os

import duckdb
import pytest

from tracekit import db
from tracekit.db import connection, schema_template


def _catalog(path: str) -> dict:
    con = duckdb.connect(path, read_only=True)
    try:
        return {
            "views": con.execute(
                "SELECT view_name, sql, comment FROM duckdb_views() WHERE NOT internal ORDER BY 1"
            ).fetchall(),
            "tables": con.execute("SELECT table_name, sql, comment FROM duckdb_tables() ORDER BY 1").fetchall(),
            "columns": con.execute(
                "SELECT table_name, column_name, comment FROM duckdb_columns() WHERE NOT internal ORDER BY 1, 2"
            ).fetchall(),
            "macros": con.execute(
                "SELECT function_name, comment FROM duckdb_functions() WHERE NOT internal AND function_type = 'macro' ORDER BY 1"
            ).fetchall(),
            "meta": con.execute("SELECT * FROM tracekit_meta ORDER BY key").fetchall(),
            "sequences": con.execute("SELECT sequence_name, start_value FROM duckdb_sequences()").fetchall(),
        }
    finally:
        con.close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(folder))
    return folder


def _installed_without_template(path: str) -> None:
    con = duckdb.connect(path, config={"storage_compatibility_version": connection.STORAGE_COMPATIBILITY})
    db.ensure_schema(con, comments=True)
    con.close()


def test_a_copied_database_holds_what_an_install_writes(tmp_path, cache):
    installed = str(tmp_path / "installed.duckdb")
    _installed_without_template(installed)
    for name in ("first.duckdb", "second.duckdb"):  # the first builds the template, the second only copies it
        db.connect(str(tmp_path / name)).close()
        assert _catalog(str(tmp_path / name)) == _catalog(installed)
    assert len(list(cache.glob("schema-*.duckdb"))) == 1
    documented = [c for c in _catalog(installed)["columns"] if c[2]]
    assert len(documented) > 100  # the comments this copy exists to save are there


def test_a_template_of_another_stdlib_is_not_used(tmp_path, cache, monkeypatch):
    db.connect(str(tmp_path / "a.duckdb")).close()
    (template,) = cache.glob("schema-*.duckdb")
    con = duckdb.connect(str(template))
    con.execute("DROP VIEW ncu_launches")  # as if an older tracekit had written it
    con.close()
    monkeypatch.setattr(connection, "_digest", lambda comments: "another-" + str(comments))
    path = str(tmp_path / "b.duckdb")
    db.connect(path).close()
    assert any(v[0] == "ncu_launches" for v in _catalog(path)["views"])
    assert len(list(cache.glob("schema-*.duckdb"))) == 2


def test_an_unwritable_cache_falls_back_to_installing(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(blocker / "cache"))
    path = str(tmp_path / "t.duckdb")
    con = db.connect(path)
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'steps'").fetchone()[0] == 1
    con.close()
    assert not list(tmp_path.glob("*.tmp"))


def test_an_existing_file_is_never_overwritten(tmp_path, cache):
    path = tmp_path / "t.duckdb"
    assert schema_template.create_from_template(str(tmp_path / "x.duckdb"), "d", _installed_without_template)
    path.write_bytes(b"not yet a database")
    assert not schema_template.create_from_template(str(path), "d", _installed_without_template)
    assert path.read_bytes() == b"not yet a database"


def test_a_failed_build_leaves_no_template(tmp_path, cache):
    def broken(path):
        duckdb.connect(path).close()
        raise OSError("disk full")

    assert not schema_template.create_from_template(str(tmp_path / "t.duckdb"), "d", broken)
    assert not os.path.exists(tmp_path / "t.duckdb")
    assert not list(cache.iterdir())


def test_every_view_bound_in_a_later_session_still_checkpoints(tmp_path, cache):
    """DuckDB fails a checkpoint (FATAL, the session's writes left in the WAL) when a view bound in
    that session has a commented column whose bound name differs from the view's column list: a
    renamed or copied database file then lacks them. Every view is bound in a session of its own."""
    db.connect(str(tmp_path / "first.duckdb")).close()
    (template,) = cache.glob("schema-*.duckdb")
    con = duckdb.connect(str(template), read_only=True)
    views = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
    con.close()
    assert len(views) > 20
    failed = []
    for index, view in enumerate(views):
        path = tmp_path / f"v{index}.duckdb"
        path.write_bytes(template.read_bytes())
        con = duckdb.connect(str(path))
        try:
            con.execute(f"SELECT * FROM {view} LIMIT 0")
            con.execute("CREATE TABLE written AS SELECT 1 AS x")  # something for the checkpoint to write
            con.execute("CHECKPOINT")
        except duckdb.Error as e:
            failed.append((view, str(e).splitlines()[0][:200]))
        finally:
            con.close()
    assert failed == []


def test_an_in_memory_database_is_filled_from_the_template_with_its_comments(cache):
    """COPY FROM DATABASE re-creates each view from its printed SQL, so the view texts differ from the
    files' in layout; every view gives the same rows as an installed one on real traces of each
    kind (two gloo ranks, a CUDA-graph capture, an Nsight Compute report)."""
    from tests.conftest import sample
    from tracekit.ingest.pipeline import ingest

    from_template = db.connect(None)
    assert list(cache.glob("schema-*.duckdb"))
    installed = duckdb.connect()
    installed.execute("SET asof_loop_join_threshold = 0")
    db.ensure_schema(installed, comments=True)

    def catalog(con):
        return (
            con.execute("SELECT view_name, comment FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall(),
            con.execute("SELECT table_name, sql, comment FROM duckdb_tables() ORDER BY 1").fetchall(),
            con.execute(
                "SELECT table_name, column_name, data_type, comment FROM duckdb_columns() ORDER BY 1, 2"
            ).fetchall(),
            con.execute(
                "SELECT function_name, comment FROM duckdb_functions() WHERE NOT internal AND "
                "function_type IN ('macro', 'table_macro') ORDER BY 1"
            ).fetchall(),
            con.execute("SELECT * FROM tracekit_meta ORDER BY key").fetchall(),
        )

    assert catalog(from_template) == catalog(installed)
    # the template is detached again: only DuckDB's default database and the compressed one holding the trace
    assert not from_template.execute("SELECT count(*) FROM duckdb_databases() WHERE NOT internal "
                                     "AND database_name NOT IN ('memory', ?)", [connection.IN_MEMORY]).fetchone()[0]  # fmt: skip
    traces = [sample(n) for n in ("gloo_rank0.json.gz", "gloo_rank1.json.gz", "cudagraph_capture.json.gz",
                                  "ncu_tiles_repeated_heavy.csv")]  # fmt: skip
    for con in (from_template, installed):
        ingest(con, traces)
    views = [v for (v, _) in catalog(installed)[0]]
    for view in views:
        query = f"SELECT * FROM {view} ORDER BY ALL"
        assert from_template.execute(query).fetchall() == installed.execute(query).fetchall(), view
