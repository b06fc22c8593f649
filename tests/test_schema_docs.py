"""The schema is an API: every public table, view and column carries its documentation in the
database (COMMENT ON, from the stdlib's SQL files), and docs/schema.md is generated from the same files."""

import importlib.util
from pathlib import Path

import pytest

from tracekit import db
from tracekit.db import stdlib
from tracekit.db.schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_schema_docs", ROOT / "scripts" / "gen_schema_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    con = db.connect(str(tmp_path_factory.mktemp("schema") / "t.duckdb"))
    yield con
    con.close()


def test_every_public_column_has_a_comment_in_the_database(on_disk):
    public = stdlib.public("table") + stdlib.public("view")
    rows = on_disk.execute(
        "SELECT table_name, column_name, comment FROM duckdb_columns() WHERE NOT internal AND list_contains(?, table_name)",
        [list(public)],
    ).fetchall()
    assert {t for t, _, _ in rows} == set(public)
    assert [f"{t}.{c}" for t, c, comment in rows if not (comment or "").strip()] == []


def test_every_relation_and_macro_has_a_comment(on_disk):
    commented = dict(
        on_disk.execute(
            "SELECT table_name, comment FROM duckdb_tables() WHERE NOT internal UNION ALL "
            "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal UNION ALL "
            "SELECT function_name, comment FROM duckdb_functions() WHERE function_type IN ('macro', 'table_macro') "
            "AND NOT internal"
        ).fetchall()
    )
    names = [r.name for r in stdlib.relations()]
    assert [n for n in names if not (commented.get(n) or "").strip()] == []


def test_declared_columns_are_the_view_columns(on_disk):
    """A column added to a view's SELECT but not to its documented column list would carry no doc."""
    for r in stdlib.relations():
        if r.kind in ("table", "view"):
            got = [c[0] for c in on_disk.execute(f"DESCRIBE {r.name}").fetchall()]
            assert got == [c.name for c in r.columns], r.name


def test_a_column_without_its_comment_line_fails_the_check():
    """The check reads each column's own comment, so deleting one column's text is caught (a search of
    the whole document for the name would still find it elsewhere)."""
    f = next(f for f in stdlib.files() if any(r.name == "gpu_busy" for r in f.relations))
    start = f.sql.index("CREATE OR REPLACE VIEW gpu_busy(")
    view = f.sql[start:]
    broken = f.sql[:start] + view.replace(
        "    -- how many activities the block merges\n    activities,", "    activities,", 1
    )
    assert broken != f.sql
    gpu_busy = next(r for r in stdlib.parse(f.name, broken).relations if r.name == "gpu_busy")
    assert [c.name for c in gpu_busy.columns if not c.doc] == ["activities"]


def test_public_lists_come_from_the_files():
    assert "steps" in stdlib.public("view") and "gpu_busy" in stdlib.public("view")
    assert "runs" in stdlib.public("table") and "event_rows" not in stdlib.public("table")
    assert "gpu_busy_between" in stdlib.public("table macro")


def test_docs_schema_md_is_generated():
    gen = _generator()
    assert gen.OUT.read_text() == gen.render(), "docs/schema.md is stale: run `make docs`"


def test_schema_version_is_recorded():
    con = db.connect(None)
    version = con.execute("SELECT value FROM tracekit_meta WHERE key = 'schema_version'").fetchone()[0]
    assert version == SCHEMA_VERSION
    assert f"version {version}" in (ROOT / "docs" / "schema.md").read_text()
    assert f"### {version}" in (ROOT / "docs" / "schema_notes" / "10_changelog.md").read_text()


def test_reopening_an_up_to_date_database_runs_no_ddl(tmp_path):
    path = str(tmp_path / "t.duckdb")
    db.connect(path).close()
    con = db.connect(path)
    # a view dropped behind tracekit's back stays dropped: connect() trusted the stored digest
    con.execute("DROP VIEW ncu_launches")
    con.close()
    con = db.connect(path)
    assert not con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'ncu_launches'").fetchone()[0]
    con.execute("UPDATE tracekit_meta SET value = 'old' WHERE key = 'stdlib_digest'")
    con.close()
    con = db.connect(path)  # an older stdlib is replaced
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'ncu_launches'").fetchone()[0] == 1


def test_describe_schema_shows_the_comments():
    from tracekit.agent.session import Session
    from tracekit.agent.tools import TOOLS, call

    with Session() as s:
        call(s, "ingest", {"paths": [str(ROOT / "sample_traces" / "gpu_prefill_decode_eager.json.gz")]})
        every, is_error = call(s, "describe_schema", {})
        assert not is_error
        names = {r["name"] for r in every["relations"]}
        assert set(stdlib.public("table")) | set(stdlib.public("view")) <= names
        assert all(r.get("comment") for r in every["relations"])
        one, is_error = call(s, "describe_schema", {"relation": "steps"})
        assert not is_error and [r["name"] for r in one["relations"]] == ["steps"]
        steps = next(r for r in stdlib.relations() if r.name == "steps")
        assert {c["name"]: c["comment"] for c in one["relations"][0]["columns"]} == {
            c.name: c.doc for c in steps.columns
        }
        missing, is_error = call(s, "describe_schema", {"relation": "nope"})
        assert is_error and "nope" in missing["error"]
    assert "relation" in TOOLS["describe_schema"].parameters["properties"]


def test_run_tables_from_the_definitions_equal_the_described_ones():
    """run_tables reads whether a stdlib table has run_id from its definition; a table of another
    origin (the reducer's summaries, one made by hand) is described."""
    from tracekit.db.connection import run_tables, table_columns

    con = db.connect(None)
    con.execute("CREATE TABLE made_by_hand (run_id INTEGER, x INTEGER)")
    con.execute("CREATE TABLE without_runs (x INTEGER)")
    described = [t for t, columns in table_columns(con).items() if "run_id" in columns]
    assert run_tables(con) == described
    assert "made_by_hand" in described and "without_runs" not in described and "event_rows" in described
