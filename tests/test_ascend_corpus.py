"""Every Ascend output in ../shared/corpus/ascend (torch_npu db and text exports, msprof and MindSpore
Profiler folders, msprof-analyze cluster outputs) ingests as a user would pass it: each run with
events read = ingested + skipped, and no file of a folder entry left unread by the folder expansion
(a reader claims it or reads it, and says in its own counts what it did not use)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CORPUS
from tracekit import db
from tracekit.ingest.pipeline import ingest

ASCEND = CORPUS / "ascend"
ENTRIES = sorted(p.name for p in ASCEND.iterdir() if p.name != "PROVENANCE.md") if ASCEND.is_dir() else []
FORMATS = {"ascend_db", "ascend_text", "msprof", "msprof_cluster"}


@pytest.mark.parametrize("name", ENTRIES)
def test_every_ascend_entry_ingests_whole(name):
    con = db.connect(None)
    results = ingest(con, [ASCEND / name])
    assert results and {r.format for r in results} <= FORMATS
    for r in results:
        assert r.events_read == r.events_ingested + r.events_skipped
        assert r.events_skipped == sum(r.skipped_reasons.values())
    left = [json.loads(n).get("input", {}).get("skipped_in_folder") for (n,) in
            con.execute("SELECT notes FROM ingest_log").fetchall()]  # fmt: skip
    assert not any(left), left


def test_the_rank_folders_of_each_export_type_form_one_job():
    for name, world in (("msinsight__pytorch_db_level1", 8), ("msinsight__server_test_data_gpt3", 16)):
        con = db.connect(None)
        ingest(con, [ASCEND / name])
        ranks = con.execute(
            "SELECT list(rank ORDER BY rank), list(DISTINCT world_size) FROM runs WHERE rank IS NOT NULL"
        ).fetchone()
        assert ranks == ([0, 1], [world]), name
