"""docs/schema.md documents every public table, view and column: the schema is an API."""

from pathlib import Path

from tracekit import db
from tracekit.db.schema import PUBLIC_TABLES, PUBLIC_VIEWS

DOC = (Path(__file__).resolve().parent.parent / "docs" / "schema.md").read_text()


def test_every_public_relation_and_column_is_documented():
    con = db.connect(None)
    missing = []
    for rel in PUBLIC_TABLES + PUBLIC_VIEWS:
        if f"`{rel}`" not in DOC:
            missing.append(rel)
        cols = [r[0] for r in con.execute(f"DESCRIBE {rel}").fetchall()]
        missing += [f"{rel}.{c}" for c in cols if c not in DOC]
    assert missing == []


def test_schema_version_is_recorded():
    con = db.connect(None)
    version = con.execute("SELECT value FROM tracekit_meta WHERE key = 'schema_version'").fetchone()[0]
    assert f"version {version}" in DOC
