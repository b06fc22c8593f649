"""Bad input never crashes: a trace cut anywhere, or with bytes flipped, either ingests or raises
InputError naming the file (the CLI turns that into one line and exit 2)."""

from __future__ import annotations

import gzip
import random

import pytest

from tests.conftest import corpus
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest.pipeline import ingest

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
