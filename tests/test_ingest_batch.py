"""Small traces of one reader load in batches (one read_json and one INSERT for many files): the
database must hold exactly what loading them one by one gives, and a batch that cannot load
together must fall back to that, failures included."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest import pipeline
from tracekit.parsers import kineto

from .conftest import ROOT, corpus, sample

RANKS = sorted((ROOT / "tests/data/rank_matrix/slow_compute").glob("rank*.json.gz"))
EP_RANKS = sorted((ROOT / "tests/data/ep_matrix/w4/hot_expert").glob("rank*.json.gz"))


def _contents(trace) -> dict:
    """Every table a run's ingest writes, parents named by their content (not by rowid), the ingest
    log without its timings and the batch's own notes."""
    out = {
        "events": trace.sql(
            """SELECT e.* EXCLUDE (parent_id), p.name, p.ts_ns, p.tid,
                      row_number() OVER (PARTITION BY e.run_id ORDER BY e.rowid) AS k
               FROM event_rows e LEFT JOIN event_rows p ON p.rowid = e.parent_id ORDER BY e.run_id, k"""
        ).fetchall(),
        "log": trace.sql(
            "SELECT * EXCLUDE (seconds, notes), "
            'json_merge_patch(notes, \'{"loaded_in_batch_of": null, "loaded_alone_after_batch": null}\') '
            "FROM ingest_log ORDER BY run_id"
        ).fetchall(),
    }
    for table in ("processes", "threads", "streams", "runs"):
        out[table] = trace.sql(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
    return out


def _one_by_one(monkeypatch, *paths, **options):
    with monkeypatch.context() as m:
        m.setattr(pipeline, "BATCH_FILES", 1)
        return tracekit.open(*paths, **options)


def _batch_sizes(trace) -> list:
    return [r[0] for r in trace.sql("SELECT notes->>'$.loaded_in_batch_of' FROM ingest_log ORDER BY run_id").fetchall()]


@pytest.mark.parametrize(
    "paths",
    [
        pytest.param(RANKS, id="gloo-rank-matrix"),
        pytest.param(EP_RANKS, id="expert-parallel"),
        pytest.param([sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")], id="gpu-tp2"),
    ],
)
def test_a_batch_holds_what_one_by_one_holds(monkeypatch, paths):
    batched, alone = tracekit.open(*paths), _one_by_one(monkeypatch, *paths)
    assert _batch_sizes(batched) == [str(len(paths))] * len(paths)
    assert _batch_sizes(alone) == [None] * len(paths)
    a, b = _contents(batched), _contents(alone)
    assert len(a["events"]) > 1000 and any(row[-4] is not None for row in a["events"])  # parents set
    for table in a:
        assert a[table] == b[table], table


def test_corpus_traces_of_every_kind_hold_the_same(monkeypatch):
    """Files a batch takes (relative and absolute clocks, GPU streams, annotations) beside files it
    leaves alone (generic Chrome traces, extra keys), in one call."""
    paths = [
        corpus("hta__trace_filter__sampled_rank-0.json.gz"),
        corpus("hta__trace_filter__sampled_rank-1.json.gz"),
        corpus("hta__with_gpu_user_annotation__step_based_trace_2543932.json.gz"),
        sample("node_trace_events.json.gz"),
        sample("gil_hold.json.gz"),
        sample("cpu_two_threads.json.gz"),
    ]
    batched, alone = tracekit.open(*paths), _one_by_one(monkeypatch, *paths)
    assert any(_batch_sizes(batched)) and not all(_batch_sizes(batched))
    a, b = _contents(batched), _contents(alone)
    for table in a:
        assert a[table] == b[table], table


def test_a_batch_splits_where_the_timestamp_type_changes(tmp_path, monkeypatch):
    """A trace of absolute microseconds with fractions needs DECIMAL timestamps; it never shares a
    batch with traces read as doubles, and each keeps its own ts_type."""

    def write(name, ts: str):  # the text of a timestamp: a Python float would drop the fraction
        path = tmp_path / name
        events = [f'{{"ph": "X", "name": "op{i}", "ts": {ts}{i}, "dur": 5, "pid": 1, "tid": 1}}' for i in range(5)]
        path.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
        return path

    paths = [write("a.json", "100.5"), write("b.json", "200.25"), write("c.json", "1712195495519689.04"),
             write("d.json", "7")]  # fmt: skip
    batched = tracekit.open(*paths)
    types = batched.sql("SELECT notes->>'$.ts_type' FROM ingest_log ORDER BY run_id").fetchall()
    assert [t[0] for t in types] == ["DOUBLE", "DOUBLE", "DECIMAL(38,3)", "DOUBLE"]
    assert _batch_sizes(batched) == ["2", "2", None, None]
    assert _contents(batched) == _contents(_one_by_one(monkeypatch, *paths))
    ts = batched.sql("SELECT ts_ns FROM event_rows WHERE run_id = 3 ORDER BY ts_ns LIMIT 1").fetchall()[0][0]
    assert ts == 1712195495519689040


def test_a_batch_that_lost_fractions_loads_each_file_alone(monkeypatch):
    """When the head of a file misjudges its timestamps (doubles, but fractions of absolute
    microseconds further on), the batch is rolled back and each file loads alone, exactly."""
    monkeypatch.setattr(kineto, "_needs_exact_ts", lambda _part: False)
    batched = tracekit.open(*RANKS[:3])
    assert _batch_sizes(batched) == [None, None, None]
    types = {r[0] for r in batched.sql("SELECT notes->>'$.ts_type' FROM ingest_log").fetchall()}
    assert types == {"DECIMAL(38,3)"}
    why = batched.sql("SELECT DISTINCT notes->>'$.loaded_alone_after_batch' FROM ingest_log").fetchall()
    assert why == [("timestamps that need DECIMAL",)]
    monkeypatch.undo()
    assert _contents(batched) == _contents(tracekit.open(*RANKS[:3]))  # run ids too: the fallback reuses them


def test_a_bad_file_in_a_batch_is_named_and_the_others_go_in(tmp_path):
    bad = tmp_path / "rank9.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "name": "x", "pid": 1, "tid": 1}, {"ph": ]}')
    failed = []
    trace = tracekit.open()
    trace.add(RANKS[0], bad, RANKS[1], on_error=lambda path, e: failed.append((Path(path).name, str(e))))
    assert [name for name, _ in failed] == ["rank9.json"] and "byte 91" in failed[0][1]
    sources = [Path(r[0]).name for r in trace.sql("SELECT source FROM runs ORDER BY run_id").fetchall()]
    assert sources == [RANKS[0].name, RANKS[1].name]
    assert trace.sql("SELECT count(*) FROM ingest_pending").fetchall()[0][0] == 0
    assert _batch_sizes(trace) == ["2", "2"]  # its read failed: the batch held the others
    # without on_error the call ends at the bad file, the files before it kept and said so
    with pytest.raises(TracekitError, match="rank9.json.*ingested and kept"):
        tracekit.open(RANKS[0], RANKS[1], bad, RANKS[2])


def test_a_file_given_twice_and_kept_twice():
    trace = tracekit.open(RANKS[0], RANKS[0], same_content="keep")
    counts = trace.sql("SELECT run_id, count(*) FROM event_rows GROUP BY 1 ORDER BY 1").fetchall()
    assert len(counts) == 2 and counts[0][1] == counts[1][1] > 0


def test_a_batch_is_bounded_by_files_and_bytes(monkeypatch):
    monkeypatch.setattr(pipeline, "BATCH_FILES", 3)
    assert _batch_sizes(tracekit.open(*RANKS)) == ["3"] * 6 + ["2"] * 2
    largest = max(len(gzip.open(path).read()) for path in RANKS[:4])
    monkeypatch.setattr(pipeline, "BATCH_FILES", 128)
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 2 * largest + largest // 2)  # two files, not three
    assert _batch_sizes(tracekit.open(*RANKS[:4])) == ["2"] * 4


@pytest.mark.parametrize("threads, ahead", [("1", False), ("2", True)])
def test_reads_run_ahead_only_beside_a_second_duckdb_thread(monkeypatch, threads, ahead):
    """On one DuckDB thread a load takes the GIL back often, and a read ahead holding it (sampling a
    file's keys) stalls it: the files are then read in turn, on the ingesting thread. Beside a second
    one, a thread reads ahead, and the ingesting thread reads a small file while it would wait; each
    file is read once either way."""
    import threading

    monkeypatch.setenv("TRACEKIT_THREADS", threads)
    where = []
    read = kineto.read

    def recording(path, *args, **kwargs):
        where.append((Path(path).name, threading.current_thread() is threading.main_thread()))
        return read(path, *args, **kwargs)

    monkeypatch.setattr(kineto, "read", recording)
    trace = tracekit.open(*RANKS[:4])
    assert trace.sql("SELECT count(*) FROM runs").fetchall()[0][0] == 4
    assert sorted(name for name, _ in where) == sorted(p.name for p in RANKS[:4])
    on_main = [main for _, main in where]
    assert (not all(on_main)) if ahead else all(on_main)


def test_a_file_with_keys_of_its_own_loads_alone_between_batches(tmp_path, monkeypatch):
    """A key outside the Trace Event Format's (kept in `extra`) takes a load of its own, and is kept
    wherever in the file it is (past the first MiB a file loading alone samples); the files around
    it still load in batches."""
    import orjson

    trace = orjson.loads(gzip.open(RANKS[1]).read())
    trace["traceEvents"][-1]["seq_hint"] = 7  # the last event: past a sample of the file's head
    odd = tmp_path / "rank1_with_key.json.gz"
    odd.write_bytes(gzip.compress(orjson.dumps(trace)))
    paths = [RANKS[0], RANKS[2], odd, RANKS[3], RANKS[4]]
    batched = tracekit.open(*paths)
    assert _batch_sizes(batched) == ["2", "2", None, "2", "2"]
    assert _contents(batched) == _contents(_one_by_one(monkeypatch, *paths))
    kept = batched.sql("SELECT extra->>'seq_hint' FROM event_rows WHERE run_id = 3 AND extra->>'seq_hint' IS NOT NULL")
    assert kept.fetchall() == [("7",)]
    noted = batched.sql("SELECT notes->'extra_event_keys' FROM ingest_log WHERE run_id = 3").fetchall()[0][0]
    assert noted == '["seq_hint"]'


def test_a_failure_of_the_batch_that_is_a_bug_is_noted_on_each_file(monkeypatch):
    """A reader's bug in its batch load costs only time, each file loading alone, and each says so."""

    def broken(con, items):
        raise KeyError("part")

    monkeypatch.setattr(kineto, "load_batch", broken)
    trace = tracekit.open(*RANKS[:3])
    notes = [r[0] for r in trace.sql(
        "SELECT json_extract_string(notes, '$.loaded_alone_after_batch') FROM ingest_log ORDER BY run_id"
    ).fetchall()]  # fmt: skip
    assert len(notes) == 3 and all(n.startswith("KeyError: 'part'") for n in notes), notes
    assert _contents(trace) == _contents(_one_by_one(monkeypatch, *RANKS[:3]))


def test_absurd_times_in_a_batch_are_skipped_as_a_file_alone_skips_them(tmp_path, monkeypatch):
    """A batch flags times beyond any trace (and the sum of ts and dur) inside its one INSERT: the
    same events skipped with the same reasons as a load of the file alone, the others kept."""
    events = [
        '{"ph": "X", "name": "ok", "ts": 10, "dur": 5, "pid": 1, "tid": 1}',
        '{"ph": "X", "name": "far_ts", "ts": 1e300, "dur": 5, "pid": 1, "tid": 1}',
        '{"ph": "X", "name": "far_dur", "ts": 20, "dur": -1e300, "pid": 1, "tid": 1}',
        '{"ph": "X", "name": "far_end", "ts": 3.9e15, "dur": 3.9e15, "pid": 1, "tid": 1}',
        '{"ph": "i", "name": "instant", "ts": 30, "pid": 1, "tid": 1, "s": "t"}',
        '{"ph": "X", "name": "no_ts", "dur": 5, "pid": 1, "tid": 1}',
    ]
    odd, plain = tmp_path / "odd.json", tmp_path / "plain.json"
    odd.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
    plain.write_text('{"traceEvents": [' + events[0] + ", " + events[4] + "]}")
    batched = tracekit.open(plain, odd)
    assert _batch_sizes(batched) == ["2", "2"]
    skipped = batched.sql("SELECT run_id, skipped_reasons FROM ingest_log ORDER BY run_id").fetchall()
    assert "ts not a finite time in range" in str(skipped[1][1]) and "dur not a finite duration" in str(skipped[1][1])
    kept = batched.sql("SELECT name FROM event_rows WHERE run_id = 2 ORDER BY rowid").fetchall()
    assert ("ok",) in kept and ("instant",) in kept and ("far_ts",) not in kept and ("far_end",) not in kept
    assert _contents(batched) == _contents(_one_by_one(monkeypatch, plain, odd))


def test_a_batch_of_many_parts_keeps_file_order_on_many_threads(monkeypatch):
    """The batch's INSERT reads read_json directly: with each file in dozens of parts parsed on four
    threads, event ids (and so every parent) must still follow the files' order, as one by one."""
    from tracekit.parsers import json_slice

    alone = _contents(_one_by_one(monkeypatch, *RANKS[:4]))
    monkeypatch.setattr(json_slice, "PART_TARGET", 64 << 10)
    monkeypatch.setenv("TRACEKIT_THREADS", "4")
    for _ in range(3):
        batched = tracekit.open(*RANKS[:4])
        assert _batch_sizes(batched) == ["4"] * 4
        assert _contents(batched) == alone


def test_a_file_that_breaks_past_its_head_read_ahead_fails_in_its_turn(tmp_path):
    """A small file read on the ingesting thread while the read-ahead thread reads the one before it
    (a gzip that recognition took, broken past its first MiB) fails when its turn comes: named, in
    input order, and the others go in."""
    import orjson

    trace = orjson.loads(gzip.open(RANKS[1]).read())
    trace["traceEvents"] = trace["traceEvents"] * 3  # past the MiB recognition reads
    whole = gzip.compress(orjson.dumps(trace), compresslevel=1)
    broken = tmp_path / "rank9_broken.json.gz"
    broken.write_bytes(whole[: len(whole) - 3000] + bytes(64) + whole[len(whole) - 2936 :])
    failed = []
    trace = tracekit.open()
    # second: read here while the read-ahead thread reads the first (whichever reads it, the same holds)
    trace.add(RANKS[0], broken, RANKS[2], RANKS[3], on_error=lambda path, e: failed.append(Path(path).name))
    assert failed == ["rank9_broken.json.gz"]
    sources = [Path(r[0]).name for r in trace.sql("SELECT source FROM runs ORDER BY run_id").fetchall()]
    assert sources == [RANKS[0].name, RANKS[2].name, RANKS[3].name]
    with pytest.raises(TracekitError, match="rank9_broken"):
        tracekit.open(RANKS[0], broken, RANKS[2], RANKS[3])


def test_batchable_sends_each_odd_file_alone_and_keeps_the_clean_ones_together(tmp_path):
    """The batch's key scan: a file with an element that is not an object, a phase Kineto never
    writes or a key of its own loads alone, told what was found; a clean file stays in the batch."""
    import duckdb

    event = '{"ph": "X", "name": "op", "ts": 10, "dur": 5, "pid": 1, "tid": 1, "args": {"any key": 1}}'
    contents = {
        "clean": [event, event],
        "number": [event, "7"],
        "string": ['"{not an object}"', event],
        "begin": [event, '{"ph": "B", "name": "b", "ts": 11, "pid": 1, "tid": 1}'],
        "own_key": [event, '{"ph": "X", "name": "k", "ts": 12, "dur": 1, "pid": 1, "tid": 1, "seq_hint": 3}'],
    }
    exports = []
    for name, events in contents.items():
        path = tmp_path / f"{name}.json"
        path.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
        exports.append(kineto.read(path))
    try:
        assert all(e.batch is not None for e in exports)
        assert kineto.batchable(duckdb.connect(), exports) == [True, False, False, False, False]
        samples = {name: e.batch.options.get("sample") for name, e in zip(contents, exports)}
        assert samples["clean"] is None
        assert samples["begin"] == ([], True)  # a generic Chrome trace, read with its pairing keys
        assert samples["own_key"] == (["seq_hint"], False)  # the key outside the format, kept in `extra`
        assert samples["number"] == ([], False) and samples["string"] == ([], False)
    finally:
        for e in exports:
            e.batch.staged.cleanup()
