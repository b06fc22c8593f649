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
