"""Bad input never crashes: a trace cut anywhere, or with bytes flipped, either ingests or raises
InputError naming the file (the CLI turns that into one line and exit 2)."""

from __future__ import annotations

import gzip
import random
import sys

import pytest

from tests.conftest import ROOT, corpus, sample
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import rows

sys.path.insert(0, str(ROOT / "scripts"))  # the fault campaign's protobuf helpers

SOURCE = "hta__cuda_event_sync_multi_stream__event_sync_trace.json.gz"  # small real trace, object form


def outcome(path):
    con = db.connect(None)
    try:
        ingest(con, [path])
    except InputError as e:
        assert str(path) in str(e)
        return "error"
    read, ingested, skipped = con.execute(
        "SELECT events_read, events_ingested, events_skipped FROM ingest_log"
    ).fetchone()
    assert read == ingested + skipped
    return "ok"


@pytest.mark.parametrize("compressed", [False, True])
def test_truncated_anywhere(tmp_path, compressed):
    raw = gzip.decompress(corpus(SOURCE).read_bytes())
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, len(raw) - 1), 25)) + [1, len(raw) // 2, len(raw) - 3]
    outcomes = []
    for i, cut in enumerate(cuts):
        path = tmp_path / (f"cut{i}.json.gz" if compressed else f"cut{i}.json")
        data = raw[:cut]
        path.write_bytes(gzip.compress(data)[: max(10, len(gzip.compress(data)) - 7)] if compressed else data)
        outcomes.append(outcome(path))
    # a cut inside the document is always detected: the array or the object is never closed
    assert outcomes.count("error") == len(cuts)


def test_flipped_bytes_never_crash(tmp_path):
    raw = bytearray(gzip.decompress(corpus(SOURCE).read_bytes()))
    rng = random.Random(11)
    results = []
    for i in range(25):
        data = bytearray(raw)
        for pos in rng.sample(range(len(data)), 3):
            data[pos] = rng.choice(b'{}[]",:0x \\')
        path = tmp_path / f"flip{i}.json"
        path.write_bytes(bytes(data))
        results.append(outcome(path))
    assert set(results) <= {"ok", "error"}
    assert "error" in results  # most flips break the JSON, and that is reported, not raised raw


_EVENTS = [
    {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 100.0, "dur": 50.0, "pid": 1, "tid": 1},
    {"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 110.0, "dur": 5.0, "pid": 1, "tid": 1,
     "args": {"correlation": 7}},
    {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 120.0, "dur": 20.0, "pid": 0, "tid": 7,
     "args": {"correlation": 7, "device": 0, "stream": 7}},
]  # fmt: skip
# (field, JSON literal written in place of its value) for values no profiler writes
ABSURD = [("ts", lit) for lit in ("1e30", "-1e30", "NaN", "Infinity", "-Infinity", "1e400", "9" * 400)] + [
    ("dur", lit) for lit in ("1e30", "NaN", "Infinity", "-9223372036854775808")
]


def _mutated(tmp_path, field, literal, index, name):
    import json

    events = [dict(e) for e in _EVENTS]
    events[index][field] = "@@"
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"traceEvents": events}).replace('"@@"', literal))
    return path


@pytest.mark.parametrize(("field", "literal"), ABSURD, ids=[f"{f}={v[:10]}" for f, v in ABSURD])
def test_absurd_times_are_skipped_with_a_reason_not_a_crash(tmp_path, field, literal):
    from tracekit.engine.runner import run_rules

    for index in range(len(_EVENTS)):
        path = _mutated(tmp_path, field, literal, index, f"e{index}")
        con = db.connect(None)
        ingest(con, [path])
        read, ingested, skipped, reasons = con.execute(
            "SELECT events_read, events_ingested, events_skipped, skipped_reasons FROM ingest_log"
        ).fetchone()
        assert (read, ingested, skipped) == (3, 2, 1)
        assert "not a finite" in reasons
        run_rules(con)  # the rules run on what is left


@pytest.mark.parametrize("literal", ['["X"]', '{"a": 1}', "7", "null"])
def test_a_phase_that_is_not_a_string_is_skipped(tmp_path, literal):
    con = db.connect(None)
    ingest(con, [_mutated(tmp_path, "ph", literal, 0, "ph")])
    read, ingested, skipped = con.execute(
        "SELECT events_read, events_ingested, events_skipped FROM ingest_log"
    ).fetchone()
    assert (read, ingested, skipped) == (3, 2, 1)


def test_deeply_nested_args_do_not_crash(tmp_path):
    for index, literal in enumerate(("[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000)):
        assert outcome(_mutated(tmp_path, "args", literal, 0, f"deep{index}")) in ("ok", "error")


# ---- regressions of the fault campaign (scripts/fault_campaign.py) over the other formats ----


def _reasons(con) -> dict:
    import json

    rows = con.execute(
        "SELECT events_read, events_ingested, events_skipped, skipped_reasons FROM ingest_log"
    ).fetchall()
    assert all(read == ingested + skipped for read, ingested, skipped, _ in rows)
    return {k: v for *_, reasons in rows for k, v in json.loads(reasons).items()}


def _lines_with(path, tmp_path, name, edit):
    """`path`'s text with `edit(lines)` applied to its list of lines, as tmp_path/name."""
    lines = path.read_text().splitlines()
    edit(lines)
    out = tmp_path / name
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("source", ["pipit__nbody-nvtx__trace.csv", "esmm__metrics.csv"])
def test_a_csv_field_over_the_csv_module_limit_is_an_error_naming_its_line(tmp_path, source):
    def widen(lines):
        lines[3] = lines[3].replace(",", ',"' + "x" * 140_000 + '",', 1)

    path = _lines_with(corpus(source), tmp_path, "wide.csv", widen)
    with pytest.raises(InputError) as e:
        ingest(db.connect(None), [path])
    assert e.value.position == "line 4" and "field larger than field limit" in e.value.expected


def test_nsys_stats_rows_with_an_extra_field_or_counts_no_integer_holds_are_skipped(tmp_path):
    def spoil(lines):
        lines[2] = lines[2] + ",surplus"
        lines[3] = "inf," + lines[3].split(",", 1)[1]
        lines[4] = "NaN," + lines[4].split(",", 1)[1]
        lines[5] = "1e30," + lines[5].split(",", 1)[1]

    con = db.connect(None)
    ingest(con, [_lines_with(corpus("pipit__nbody-nvtx__trace.csv"), tmp_path, "spoilt.csv", spoil)])
    reasons = _reasons(con)
    assert reasons["row with more fields than the header"] == 1
    assert reasons["row without a start and a duration"] == 2  # inf and NaN are no start
    assert reasons[rows.TIME_REASON] == 1  # 1e30 ns: far beyond any capture


def test_python_built_rows_whose_times_or_ids_do_not_fit_are_skipped_with_a_reason():
    from pathlib import Path

    def row(ts, dur, pid=1, name="op"):
        return ("user_annotation", "X", "c", name, ts, dur, pid, 1, None, None, None, None, None, None, None, None)

    export = rows.Export(source=Path("x"), rows=[
        row(100, 10), row(2**64, 10), row(rows.ABSURD_NS, rows.ABSURD_NS), row(100, 10, pid=2**70),
        row(100, float("nan")), row(200, 5, name="a\ud800b"),
    ])  # fmt: skip
    export.read["event"] = len(export.rows)
    con = db.connect(None)
    rows.load(con, export, 1)
    assert dict(export.skipped) == {rows.TIME_REASON: 3, rows.ID_REASON: 1}
    assert con.execute("SELECT name FROM event_rows ORDER BY ts_ns").fetchall() == [("op",), ("a?b",)]


def test_perfetto_packet_timestamps_beyond_64_bits_are_skipped(tmp_path):
    import fault_campaign as fc

    data = corpus("perfetto__nested_tracks.perfetto-trace").read_bytes()
    out = bytearray()
    for index, (_, payload, end) in enumerate(fc._packets(data)):
        body = data[payload:end]
        if index % 2:  # a second timestamp field (the last one read wins): the u64 maximum
            body += b"\x40" + fc._varint(2**64 - 1)
        out += b"\x0a" + fc._varint(len(body)) + body
    path = tmp_path / "far.perfetto-trace"
    path.write_bytes(bytes(out))
    con = db.connect(None)
    ingest(con, [path])
    assert _reasons(con)[rows.TIME_REASON] > 0


def test_perfetto_names_that_are_not_utf8_are_read_as_text(tmp_path):
    import fault_campaign as fc
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    track = trace.packet.add()
    track.track_descriptor.uuid = 7
    track.track_descriptor.name = "track@"
    for ts, kind in ((100, 1), (200, 2)):
        p = trace.packet.add()
        p.timestamp, p.trusted_packet_sequence_id = ts, 1
        p.track_event.type, p.track_event.track_uuid, p.track_event.name = kind, 7, "slice"
    raw = trace.SerializeToString().replace(b"track@", b"trac\xff\xfe")  # same length: framing intact
    path = tmp_path / "names.perfetto-trace"
    path.write_bytes(raw)
    con = db.connect(None)
    ingest(con, [path])
    assert fc  # the harness module is importable from the suite
    assert con.execute("SELECT count(*) FROM event_rows WHERE name = 'slice'").fetchone()[0] == 1


def test_otlp_fields_of_the_wrong_json_type_hold_no_spans(tmp_path):
    import json

    line = json.loads(serving_data("otlp_requests.jsonl").read_text().splitlines()[0])
    spoilt = [
        {"resourceSpans": [{**line["resourceSpans"][0], "scopeSpans": True}]},
        {"resourceSpans": [{**line["resourceSpans"][0], "resource": ["not", "an", "object"]}]},
        {"resourceSpans": [{"resource": {"attributes": 7}, "scopeSpans": [{"spans": {"a": 1}}, 3]}]},
    ]
    path = tmp_path / "spoilt.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [line, *spoilt]) + "\n")
    con = db.connect(None)
    ingest(con, [path])
    _reasons(con)
    spans = sum(len(ss["spans"]) for ss in line["resourceSpans"][0]["scopeSpans"])
    assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == spans + spans  # the resource-less copy


def serving_data(name):
    return ROOT / "tests" / "data" / "serving" / name


@pytest.mark.parametrize(
    ("key", "literal", "kept"),
    [("backend", '"\\ud800"', True), ("duration", "9" * 400, True), ("date", "[" * 5000 + "]" * 5000, False)],
)
def test_bench_serving_values_no_double_or_utf8_holds_do_not_crash(tmp_path, key, literal, kept):
    import json

    doc = json.loads(serving_data("vllm_benchmark_serving.json").read_text())
    doc[key] = "@@"
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc).replace('"@@"', literal))
    con = db.connect(None)
    ingest(con, [path])
    # nesting deeper than Python's decoder goes makes the result unreadable: skipped, not a crash
    assert _reasons(con) == ({} if kept else {"malformed JSON line": 1})
    assert (con.execute("SELECT count(*) FROM run_metrics").fetchone()[0] > 0) == kept


def test_numerics_lengths_beyond_64_bits_and_infinite_errors_are_analysed(tmp_path):
    from tracekit.engine.runner import run_rules

    def spoil(lines):
        lines[1] = lines[1].replace(",256,", ",1e30,", 1)
        fields = lines[8].split(",")
        fields[-3] = "inf"
        lines[8] = ",".join(fields)

    con = db.connect(None)
    ingest(con, [_lines_with(sample("numerics_tf32.csv"), tmp_path, "numerics.csv", spoil)])
    _reasons(con)
    assert con.execute("SELECT count(*) FROM numerics WHERE seq_len IS NULL").fetchone()[0] > 0
    run_rules(con)


def test_ncu_ids_beyond_64_bits_are_no_ids(tmp_path):
    def spoil(lines):
        lines[1] = lines[1].replace('"0","17333"', '"0","1' + "0" * 30 + '"', 1)

    con = db.connect(None)
    ingest(con, [_lines_with(corpus("esmm__metrics.csv"), tmp_path, "ncu.csv", spoil)])
    _reasons(con)
    assert con.execute("SELECT count(*) FROM ncu_metrics WHERE pid IS NULL").fetchone()[0] == 1


def _nsys_copy(tmp_path, *statements):
    import shutil
    import sqlite3

    path = tmp_path / "spoilt.sqlite"
    shutil.copy(corpus("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"), path)
    con = sqlite3.connect(path)
    for statement in statements:
        con.execute(statement)
    con.commit()
    con.close()
    return path


def test_nsys_times_that_overflow_once_shifted_are_skipped(tmp_path):
    path = _nsys_copy(tmp_path, f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = {2**63 - 1} '
                      "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")  # fmt: skip
    con = db.connect(None)
    ingest(con, [path])
    assert _reasons(con)[rows.TIME_REASON] == 1


@pytest.mark.parametrize("rows", ["rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_RUNTIME)", "TRUE"])
def test_nsys_thread_ids_that_are_blobs_do_not_crash(tmp_path, rows):
    """A blob where globalTid goes once ended in a TypeError while the reader counted processes."""
    path = _nsys_copy(tmp_path, f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = X'00ff' WHERE {rows}")
    con = db.connect(None)
    try:
        [result] = ingest(con, [path])
    except InputError as e:  # the rows' reader names the table and what it expected
        assert "CUPTI_ACTIVITY_KIND_RUNTIME" in str(e) and "\n" not in str(e)
        return
    held = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
    assert result.events_read == result.events_ingested + result.events_skipped and held == result.events_ingested


def test_an_nsys_session_start_that_is_no_number_leaves_the_times_relative(tmp_path):
    plain = ingest(db.connect(None), [corpus("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite")])[0]
    path = _nsys_copy(tmp_path, "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = ''")
    con = db.connect(None)
    [result] = ingest(con, [path])
    assert (result.events_ingested, result.skipped_reasons) == (plain.events_ingested, plain.skipped_reasons)
    notes = con.execute("SELECT notes->>'session_start', notes->>'clock' FROM ingest_log").fetchone()
    assert "not an integer" in notes[0] and notes[1].startswith("ns relative")


def test_an_input_error_is_one_line_whatever_its_cause_quotes(tmp_path):
    path = _nsys_copy(tmp_path, "UPDATE StringIds SET value = CAST(X'66ff0a0a6f' AS TEXT) "
                      "WHERE id = (SELECT min(id) FROM StringIds)")  # fmt: skip
    with pytest.raises(InputError) as e:
        ingest(db.connect(None), [path])
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("literal", ["1e400", "1.2.3", "9" * 400])
def test_serving_log_numbers_no_field_holds_do_not_crash(tmp_path, literal):
    import re

    def spoil(lines):
        finish = next(i for i, line in enumerate(lines) if "Finish: obj=" in line and "e2e_latency" in line)
        lines[finish] = re.sub(r"'e2e_latency': [\d.e-]+", f"'e2e_latency': {literal}", lines[finish])
        lines[finish] = re.sub(r"'request_received_ts': [\d.e-]+", f"'request_received_ts': {literal}", lines[finish])
        batch = next(i for i, line in enumerate(lines) if "Prefill batch" in line)
        lines[batch] = re.sub(r"#new-token: \d+", f"#new-token: {literal}", lines[batch])

    head = corpus("sglsetup__sglang.log").read_text().splitlines()[:400]
    source = tmp_path / "head.log"
    source.write_text("\n".join(head) + "\n")
    con = db.connect(None)
    ingest(con, [_lines_with(source, tmp_path, "sglang.log", spoil)])
    _reasons(con)
    assert con.execute("SELECT count(*) FROM event_rows WHERE name LIKE 'sglang.%'").fetchone()[0] > 0
