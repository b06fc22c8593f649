"""Runtime-event logs (JSON Lines): skip counting, lossless attributes, joining a trace's run, alignment."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, sample
from tracekit import db
from tracekit.engine.runner import run_rules
from tracekit.ingest.inputs import recognise
from tracekit.ingest.pipeline import ingest, plan
from tracekit.parsers import runtime_events

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
DEMO_TRACE = sample("runtime_demo.json.gz")
DEMO_LOG = sample("runtime_demo.events.jsonl")


def write_lines(path: Path, lines: list) -> Path:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def log_row(con, source: Path) -> dict:
    cur = con.execute("SELECT * FROM ingest_log WHERE source = ?", [str(source)])
    row = dict(zip([d[0] for d in cur.description], cur.fetchone()))
    row["skipped_reasons"] = json.loads(row["skipped_reasons"])
    row["notes"] = json.loads(row["notes"])
    return row


BAD_LINES = {
    "malformed JSON": ['{"ts_ns": 5, "name": "cut', "not json at all", '{"ts_ns": NaN, "name": "x"}'],
    "not a JSON object": ["[1, 2]", "17", '"a string"'],
    "missing ts_ns": [{"name": "a"}, {"name": "a", "ts_ns": None}],
    "missing name": [{"ts_ns": 10}],
    "ts_ns not an integer": [{"ts_ns": 1.5, "name": "a"}, {"ts_ns": "10", "name": "a"}, {"ts_ns": True, "name": "a"}],
    "name not a string": [{"ts_ns": 10, "name": 3}],
    "dur_ns not an integer": [{"ts_ns": 10, "name": "a", "dur_ns": "5"}],
    "negative dur_ns": [{"ts_ns": 10, "name": "a", "dur_ns": -1}],
    "pid not an integer": [{"ts_ns": 10, "name": "a", "pid": "p"}],
    "tid not an integer": [{"ts_ns": 10, "name": "a", "tid": 1.5}],
    "thread not a string": [{"ts_ns": 10, "name": "a", "thread": 7}],
}


def test_bad_lines_are_counted_per_reason_and_never_fatal(tmp_path, fresh_db):
    good = [
        {"ts_ns": 100, "name": "span", "dur_ns": 50},
        {"ts_ns": 120, "name": "instant"},
        {"ts_ns": 130, "name": "null dur is an instant", "dur_ns": None},
    ]
    lines = list(good)
    for bad in BAD_LINES.values():
        lines += bad
    lines += ["", "   "]  # blank lines are not events
    path = write_lines(tmp_path / "events.jsonl", lines)
    (result,) = ingest(fresh_db, [path])
    expected = {reason: len(bad) for reason, bad in BAD_LINES.items()}
    assert result.skipped_reasons == expected
    assert result.events_ingested == len(good)
    assert result.events_read == result.events_ingested + result.events_skipped == len(lines) - 2
    row = log_row(fresh_db, path)
    assert row["format"] == "runtime_events"
    assert row["skipped_reasons"] == expected
    assert row["events_read"] == row["events_ingested"] + row["events_skipped"]
    assert row["notes"]["blank_lines"] == 2
    phs = fresh_db.execute("SELECT name, ph, dur_ns FROM events ORDER BY event_id").fetchall()
    assert phs == [("span", "X", 50), ("instant", "i", None), ("null dur is an instant", "i", None)]


def test_attributes_are_lossless(tmp_path, fresh_db):
    event = {
        "ts_ns": 1_700_000_000_123_456_789,
        "dur_ns": 1_000,
        "name": "prefill",
        "pid": 7,
        "tid": 8,
        "thread": "engine",
        "request_id": "req-ü-1",
        "huge": 123456789012345678901234567890,  # beyond 64 bits: orjson would make it a float
        "negative": -(1 << 70),
        "ratio": 0.1,
        "nested": {"shape": [4, 512], "flags": {"a": True, "b": None}},
        "TS_NS": "a key that only looks like ts_ns",
    }
    path = write_lines(tmp_path / "attrs.jsonl", [event])
    ingest(fresh_db, [path])
    row = fresh_db.execute(
        "SELECT name, ts_ns, dur_ns, end_ns, pid, tid, thread, CAST(attributes AS VARCHAR), line FROM runtime_events"
    ).fetchone()
    assert row[:7] == ("prefill", event["ts_ns"], 1_000, event["ts_ns"] + 1_000, 7, 8, "engine")
    attrs = {k: v for k, v in event.items() if k not in ("ts_ns", "dur_ns", "name", "pid", "tid", "thread")}
    assert json.loads(row[7]) == attrs
    assert row[8] == 1
    # attribute values are queryable as JSON
    assert fresh_db.execute("SELECT attributes->>'$.nested.shape[1]' FROM runtime_events").fetchone()[0] == "512"
    # a thread given with its tid names that thread
    assert fresh_db.execute("SELECT pid, tid, name FROM threads").fetchall() == [(7, 8, "engine")]


def test_log_alone_is_a_run_of_its_own(tmp_path, fresh_db):
    path = write_lines(
        tmp_path / "server_rank3.jsonl.gz",
        [
            {"ts_ns": 1_000, "name": "step", "dur_ns": 500, "tid": 1},
            {"ts_ns": 1_100, "name": "inner", "dur_ns": 100, "tid": 1},
        ],
    )
    (result,) = ingest(fresh_db, [path])
    assert result.format == "runtime_events" and result.rank == 3
    run = fresh_db.execute("SELECT format, label, rank, rank_source, start_ns, end_ns FROM runs").fetchone()
    assert run == ("runtime_events", "server_rank3", 3, "file name", 1_000, 1_500)
    # complete runtime events nest among themselves
    nest = fresh_db.execute("SELECT name, parent_id, depth FROM runtime_events ORDER BY ts_ns").fetchall()
    assert nest[0] == ("step", None, 0) and nest[1][0] == "inner" and nest[1][2] == 1


def test_format_is_sniffed_from_the_first_line(tmp_path, fresh_db):
    path = write_lines(tmp_path / "runtime.log.gz", ["", {"ts_ns": 5, "name": "a"}])
    assert recognise(path) is runtime_events
    (result,) = ingest(fresh_db, [path])
    assert (result.format, result.events_ingested) == ("runtime_events", 1)
    # a JSON object without ts_ns is not a runtime log, nor is a Kineto trace
    assert recognise(write_lines(tmp_path / "other.json", [{"name": "a"}])) is not runtime_events
    assert recognise(DEMO_TRACE) is not runtime_events


def test_no_corpus_or_sample_file_is_taken_for_a_runtime_log():
    files = [p for p in Path(CORPUS).glob("*") if p.is_file()] + list(DEMO_TRACE.parent.glob("*.json.gz"))
    if len(files) < 5:
        pytest.skip("corpus not available")
    assert [p.name for p in files if recognise(p) is runtime_events] == []


def test_all_bad_or_empty_logs_are_ingested_with_a_note(tmp_path, fresh_db):
    bad = write_lines(tmp_path / "bad.jsonl", ["{oops", "[]", '{"name": "x"}'])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r_bad, r_empty = ingest(fresh_db, [bad, empty])
    assert (r_bad.events_read, r_bad.events_ingested, r_bad.events_skipped) == (3, 0, 3)
    assert r_bad.skipped_reasons == {"malformed JSON": 1, "not a JSON object": 1, "missing ts_ns": 1}
    assert "no_valid_lines" in log_row(fresh_db, bad)["notes"]
    assert (r_empty.events_read, r_empty.events_ingested) == (0, 0)
    assert "empty" in log_row(fresh_db, empty)["notes"]
    assert fresh_db.execute("SELECT count(*) FROM runs WHERE start_ns IS NULL").fetchone()[0] == 2


def test_plan_attaches_logs_to_the_right_trace(tmp_path):
    t1, t2 = tmp_path / "a.json.gz", tmp_path / "b.json.gz"  # missing files: never taken for logs
    l1, l2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert plan([t1, l1, t2, l2]) == [(0, [1]), (2, [3])]
    assert plan([l1, t1]) == [(1, [0])]
    assert plan([l1, t1, l2]) == [(1, [0, 2])]
    assert plan([l1, t1, t2]) == [(0, []), (1, []), (2, [])]  # two traces: the log is a run of its own
    assert plan([l1, l2]) == [(0, []), (1, [])]


def test_demo_log_joins_the_trace_and_is_aligned(fresh_db):
    """The real sample: step#N logged with time.time_ns() around record_function("step#N")."""
    trace_result, log_result = ingest(fresh_db, [DEMO_TRACE, DEMO_LOG])
    assert trace_result.run_id == log_result.run_id == 1
    assert fresh_db.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    assert log_result.skipped_reasons == {"malformed JSON": 1, "missing ts_ns": 1}
    assert log_result.events_read == log_result.events_ingested + log_result.events_skipped
    al = log_row(fresh_db, DEMO_LOG)["notes"]["alignment"]
    assert (al["pairs"], al["names"], al["names_with_different_counts"]) == (8, 8, 0)
    # the log's clock and Kineto's agree to well under a millisecond, and the median is applied
    assert abs(al["median_offset_ns"]) < 1_000_000 and al["max_abs_offset_ns"] < 1_000_000
    assert al["applied_offset_ns"] == al["median_offset_ns"]
    assert al["residual_max_abs_ns"] == max(
        abs(al["min_offset_ns"] - al["median_offset_ns"]), abs(al["max_offset_ns"] - al["median_offset_ns"])
    )
    after = fresh_db.execute(
        """SELECT a.ts_ns - r.ts_ns FROM runtime_events r
           JOIN events a ON a.run_id = r.run_id AND a.kind = 'user_annotation' AND a.name = r.name"""
    ).fetchall()
    assert len(after) == 8 and abs(statistics.median(d for (d,) in after)) <= 1
    # warm-up steps logged before the profiler started lie before the trace's window, which stays the profiler's
    alone = db.connect(None)
    ingest(alone, [DEMO_TRACE])
    window = "SELECT start_ns, end_ns FROM runs"
    assert fresh_db.execute(window).fetchall() == alone.execute(window).fetchall()
    start = fresh_db.execute("SELECT start_ns FROM runs").fetchone()[0]
    assert fresh_db.execute("SELECT count(*) FROM runtime_events WHERE end_ns < ?", [start]).fetchone()[0] >= 2
    # the trace's own call trees are untouched by the log's events
    tree = "SELECT event_id, parent_id, depth FROM events WHERE kind <> 'runtime_event' ORDER BY event_id"
    assert fresh_db.execute(tree).fetchall() == alone.execute(tree).fetchall()


def test_alignment_recovers_a_known_offset_and_rules_keep_their_findings(tmp_path, fresh_db):
    """A log made from the eager H200 trace's own annotations, shifted by a known offset."""
    trace = sample("gpu_prefill_decode_eager.json.gz")
    alone = db.connect(None)
    ingest(alone, [trace])
    rows = alone.execute(
        "SELECT name, ts_ns, dur_ns, pid, tid FROM events WHERE kind = 'user_annotation' ORDER BY event_id"
    ).fetchall()
    assert len(rows) > 10
    shift = -1_234_567
    lines = [
        {"ts_ns": ts - shift + (i % 3) * 100, "dur_ns": dur, "name": name, "pid": pid, "tid": tid, "i": i}
        for i, (name, ts, dur, pid, tid) in enumerate(rows)
    ]
    lines.append({"ts_ns": rows[0][1] - shift, "name": "only in the log", "dur_ns": 5})
    log = write_lines(tmp_path / "eager.events.jsonl", lines)
    ingest(fresh_db, [log, trace])  # a log before the only trace of the call joins it
    al = log_row(fresh_db, log)["notes"]["alignment"]
    assert al["pairs"] == len(rows)
    assert al["median_offset_ns"] == shift - 100  # jitter 0/100/200 ns: median 100
    assert al["residual_max_abs_ns"] == 100
    assert fresh_db.execute("SELECT count(*) FROM runs").fetchone()[0] == 1

    def key(findings):
        return sorted(
            (f.rule, f.severity, f.title, f.impact_ns, f.window_ns, tuple(f.sample_event_ids)) for f in findings
        )

    with_log, _ = run_rules(fresh_db, None, None)
    without, _ = run_rules(alone, None, None)
    assert with_log and key(with_log) == key(without)


def test_no_alignment_when_nothing_is_shared(tmp_path, fresh_db):
    log = write_lines(tmp_path / "x.jsonl", [{"ts_ns": 42, "name": "nothing like it in the trace", "dur_ns": 1}])
    ingest(fresh_db, [DEMO_TRACE, log])
    al = log_row(fresh_db, log)["notes"]["alignment"]
    assert (al["pairs"], al["applied_offset_ns"]) == (0, 0)
    assert fresh_db.execute("SELECT ts_ns FROM runtime_events").fetchone()[0] == 42


def test_unreadable_log_is_an_input_error(tmp_path, fresh_db):
    from tracekit.errors import InputError

    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"ts_ns": 1, "name": "a"}\n' * 100)[:40])
    with pytest.raises(InputError):
        ingest(fresh_db, [DEMO_TRACE, broken])
    # the failing log stopped its run before anything of it was committed
    assert fresh_db.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    assert fresh_db.execute("SELECT count(*) FROM event_rows").fetchone()[0] == 0


def run_cli(*args):
    return subprocess.run([TRACEKIT, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_cli_analyze_trace_and_log_is_one_run():
    proc = run_cli("analyze", DEMO_TRACE, DEMO_LOG, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {r["run_id"] for r in doc["runs"]} == {1}


def test_cli_analyze_trace_and_log_lists_the_run_once():
    doc = json.loads(run_cli("analyze", DEMO_TRACE, DEMO_LOG, "-f", "json").stdout)
    assert len(doc["runs"]) == 1


def test_cli_ingest_log_alone(tmp_path):
    dbf = tmp_path / "rt.duckdb"
    proc = run_cli("ingest", DEMO_LOG, "--db", dbf, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["events_read"] == row["events_ingested"] + row["events_skipped"] and row["events_skipped"] == 2
    out = run_cli(
        "sql", dbf, "SELECT format, count(*) AS n FROM runs JOIN runtime_events USING (run_id) GROUP BY 1", "-f", "json"
    )
    assert json.loads(out.stdout) == [{"format": "runtime_events", "n": row["events_ingested"]}]
    missing = run_cli("ingest", tmp_path / "nope.jsonl", "--db", dbf)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "nope.jsonl" in missing.stderr
