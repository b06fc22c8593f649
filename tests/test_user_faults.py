"""Faults users cause, through the console script: the same trace ingested twice, a good input
followed by a bad one, a failed ingest into a new database file, a query against a file that is not
a database."""

from __future__ import annotations

import json
import shutil

from tests.conftest import sample
from tests.test_cli import assert_one_line_error, run
from tracekit.ingest import digest

TRACE = sample("gil_hold.json.gz")


def _runs(dbf) -> list[dict]:
    out = run("sql", dbf, "SELECT r.run_id, count(e.run_id) AS events FROM runs r LEFT JOIN events e USING (run_id) "
              "GROUP BY 1 ORDER BY 1", "-f", "json", check_rc=0).stdout  # fmt: skip
    return json.loads(out)


def test_the_same_trace_twice_is_one_run_and_a_note(tmp_path):
    dbf = tmp_path / "a.duckdb"
    run("ingest", TRACE, "--db", dbf, check_rc=0)
    first = _runs(dbf)
    copy = tmp_path / "renamed.json.gz"  # same content under another name is the same trace
    shutil.copy(TRACE, copy)
    again = run("ingest", copy, "--db", dbf, check_rc=0)
    assert "same content already in this database as run 1" in again.stderr
    assert "Traceback" not in again.stderr
    assert _runs(dbf) == first
    findings = json.loads(run("analyze", dbf, "-f", "json").stdout)["findings"]
    assert len({f["id"] for f in findings}) == len(findings)  # no finding twice


def test_replace_ingests_it_anew_in_place_of_the_old_run(tmp_path):
    dbf = tmp_path / "a.duckdb"
    run("ingest", TRACE, "--db", dbf, check_rc=0)
    [old] = _runs(dbf)
    proc = run("ingest", TRACE, "--db", dbf, "--replace", check_rc=0)
    assert "note:" not in proc.stderr
    [new] = _runs(dbf)
    assert new["run_id"] != old["run_id"] and new["events"] == old["events"] > 0
    for table in ("ingest_log", "event_rows"):
        held = run("sql", dbf, f"SELECT DISTINCT run_id FROM {table}", "-f", "json", check_rc=0).stdout
        assert [r["run_id"] for r in json.loads(held)] == [new["run_id"]]


def test_the_same_trace_twice_in_one_call_is_ingested_once(tmp_path):
    dbf = tmp_path / "a.duckdb"
    proc = run("ingest", TRACE, TRACE, "--db", dbf, check_rc=0)
    assert "same content given earlier" in proc.stderr
    assert len(_runs(dbf)) == 1


def test_a_bad_input_after_a_good_one_says_what_was_kept(tmp_path):
    dbf = tmp_path / "a.duckdb"
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    proc = run("ingest", TRACE, bad, "--db", dbf)
    assert_one_line_error(proc, str(bad), "kept", f"{TRACE.name} as run 1")
    assert [r["run_id"] for r in _runs(dbf)] == [1]


def test_a_failed_ingest_leaves_no_new_database_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    dbf = tmp_path / "new.duckdb"
    assert_one_line_error(run("ingest", bad, "--db", dbf), str(bad))
    assert not dbf.exists() and not (tmp_path / "new.duckdb.wal").exists()
    # a database that held runs before keeps them
    run("ingest", TRACE, "--db", dbf, check_rc=0)
    assert_one_line_error(run("ingest", bad, "--db", dbf), str(bad))
    assert dbf.exists() and len(_runs(dbf)) == 1


def test_querying_a_file_that_is_not_a_database_says_so(tmp_path):
    image = tmp_path / "image.json"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    assert_one_line_error(run("sql", image, "select 1"), str(image), "not a tracekit database", "tracekit ingest")
    assert_one_line_error(run("sql", TRACE, "select 1"), "not a tracekit database")


def test_digest_is_the_content_not_the_name(tmp_path, monkeypatch):
    a, b, c = tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin"
    a.write_bytes(b"x" * 1000)
    b.write_bytes(b"x" * 1000)
    c.write_bytes(b"x" * 999 + b"y")
    assert digest.content_digest(a) == digest.content_digest(b) != digest.content_digest(c)
    assert digest.content_digest(a).startswith("sha256:")
    # a large file is hashed by its ends and blocks between: a change in a sampled block is seen
    monkeypatch.setattr(digest, "WHOLE_BYTES", 64)
    monkeypatch.setattr(digest, "SAMPLE_BYTES", 16)
    big = bytearray(b"z" * 10_000)
    a.write_bytes(big)
    big[64] = ord("q")  # the first sampled block starts right after the head
    b.write_bytes(big)
    assert digest.content_digest(a).startswith("sampled-sha256:")
    assert digest.content_digest(a) != digest.content_digest(b)
