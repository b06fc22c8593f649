"""Kineto ingest on every corpus variant: exact reconciliation against an independent count,
normalized kinds, clocks, flows/launches, ranks, and lossless args."""

from __future__ import annotations

import gzip
import re
from decimal import Decimal

import orjson
import pytest

from tests.conftest import CORPUS, corpus, sample
from tracekit import db
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import kineto

KINETO_FILES = sorted(p.name for p in CORPUS.glob("*.json*")) if CORPUS.exists() else []


def raw_bytes(path):
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def raw_events(path):
    doc = orjson.loads(raw_bytes(path))
    return doc if isinstance(doc, list) else doc["traceEvents"]


@pytest.mark.parametrize("name", KINETO_FILES)
def test_every_corpus_trace_reconciles_exactly(name, loaded):
    path = corpus(name)
    con = loaded(path)
    read, ingested, skipped, reasons = con.execute(
        "SELECT events_read, events_ingested, events_skipped, skipped_reasons FROM ingest_log"
    ).fetchone()
    expected = raw_events(path)
    assert read == len(expected)
    assert read == ingested + skipped
    assert sum(orjson.loads(reasons).values()) == skipped
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] == ingested
    # every complete event kept its duration, and no duration went negative
    n_complete = sum(1 for e in expected if e.get("ph") == "X")
    assert con.execute("SELECT count(*) FROM events WHERE ph = 'X' AND dur_ns >= 0").fetchone()[0] == n_complete


def test_legacy_capitalised_categories_map_to_kinds(loaded):
    con = loaded(corpus("kineto__resnet50_num_workers_0__worker0.pt.trace.json.gz"))
    kinds = dict(con.execute("SELECT kind, count(*) FROM events GROUP BY 1").fetchall())
    cats = dict(con.execute("SELECT cat, count(*) FROM events WHERE cat IS NOT NULL GROUP BY 1").fetchall())
    assert kinds["cpu_op"] == cats["Operator"]
    assert kinds["kernel"] == cats["Kernel"]
    assert kinds["cuda_runtime"] == cats["Runtime"]
    # legacy GPU tracks are written as tid "stream 7": device/stream still come out numeric
    assert con.execute("SELECT count(*) FROM kernels WHERE stream IS NULL OR device IS NULL").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM launches").fetchone()[0] > 0


def test_async_cpu_to_gpu_flows_pair_and_launches_join(loaded):
    con = loaded(corpus("hta__trace_diff__control.json.gz"))
    flows = con.execute("SELECT count(*), count(end_event_id) FROM flows WHERE cat = 'async_cpu_to_gpu'").fetchone()
    assert flows[0] > 0 and flows[1] > 0
    kernels = con.execute("SELECT count(*) FROM kernels").fetchone()[0]
    launched = con.execute("SELECT count(DISTINCT gpu_event_id) FROM launches WHERE gpu_kind = 'kernel'").fetchone()[0]
    assert launched / kernels > 0.95


def test_ns_resolution_absolute_timestamps_are_exact(loaded):
    path = corpus("hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    con = loaded(path)
    notes = orjson.loads(con.execute("SELECT notes FROM ingest_log").fetchone()[0])
    assert notes["ts_type"] == "DECIMAL(38,3)"
    if not kineto.exact_json_decimals():
        assert "ts_precision" in notes  # the loss is stated, not silent
        pytest.skip("DuckDB < 2.0 cannot read JSON decimals exactly")
    text = raw_bytes(path).decode()
    # the first complete event as written: a 16-digit microsecond value with a 3-digit ns fraction
    m = re.search(r'"ph": "X", "cat": "(\w+)", "name": "([^"]+)".*?"ts": (\d+\.\d{3}), "dur": (\d+\.\d{3})', text, re.S)
    cat, name, ts, dur = m.groups()
    ts_ns = int(Decimal(ts) * 1000)
    row = con.execute("SELECT ts_ns, dur_ns FROM events WHERE name = ? AND ts_ns = ?", [name, ts_ns]).fetchone()
    assert row is not None, "exact ns timestamp lost (read through a double?)"
    assert row[1] == int(Decimal(dur) * 1000)
    assert ts_ns > 2**53  # the case a double cannot hold


def test_base_time_nanoseconds_gives_epoch_ns(loaded):
    path = corpus("hta__triton_example.json.gz")
    con = loaded(path)
    doc = orjson.loads(raw_bytes(path))
    base = doc["baseTimeNanoseconds"]
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    got = con.execute("SELECT min(ts_ns) FROM events WHERE ph = 'X'").fetchone()[0]
    assert abs(got - (base + round(first * 1000))) <= 1
    assert con.execute("SELECT base_time_ns FROM runs").fetchone()[0] == base


def test_rocm_hip_runtime_calls_launch_kernels(loaded):
    con = loaded(corpus("hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"))
    hip = con.execute("SELECT count(*) FROM runtime_calls WHERE name LIKE 'hip%'").fetchone()[0]
    assert hip > 0
    assert con.execute("SELECT count(*) FROM launches WHERE runtime_name LIKE 'hip%'").fetchone()[0] > 0


def test_mtia_categories_are_kept_as_their_own_kinds(loaded):
    con = loaded(corpus("hta__mtia_inference_trace__mtia_inference_rank_0.json.gz"))
    kinds = {k for (k,) in con.execute("SELECT DISTINCT kind FROM events").fetchall()}
    assert {"mtia_runtime", "mtia_ccp_events"} <= kinds
    assert (
        con.execute("SELECT count(*) FROM events WHERE kind = 'mtia_ccp_events' AND device IS NULL").fetchone()[0] == 0
    )


def test_missing_device_properties_and_distributed_info(loaded):
    con = loaded(corpus("hta__trace_filter__sampled_rank-0.json.gz"))
    props, rank, world = con.execute("SELECT device_properties, rank, world_size FROM runs").fetchone()
    assert props is None and rank == 0 and world == 128
    con2 = loaded(corpus("kineto__resnet50_autograd_api_num_workers_4__worker0.pt.trace.json.gz"))
    assert con2.execute("SELECT rank, rank_source FROM runs").fetchone() == (None, None)


def test_args_keys_differing_only_in_case_are_both_kept(loaded):
    path = corpus("hta__df_index_resolver.json.gz")
    con = loaded(path)
    both = con.execute(
        "SELECT count(*) FROM events WHERE json_exists(args, '$.Bytes') AND json_exists(args, '$.\"Total Allocated\"')"
    ).fetchone()[0]
    assert both == raw_bytes(path).count(b'"Bytes"')
    lower = con.execute("SELECT count(*) FROM events WHERE json_exists(args, '$.bytes')").fetchone()[0]
    assert lower == raw_bytes(path).count(b'"bytes"')


def test_several_files_become_several_runs_with_ranks(fresh_db):
    r0, r1 = sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")
    other = corpus("kineto__docs_traces__before_fix_trace.json")
    results = ingest(fresh_db, [r0, r1, other], rank=7)
    assert [r.run_id for r in results] == [1, 2, 3]
    rows = fresh_db.execute("SELECT rank, world_size, rank_source FROM runs ORDER BY run_id").fetchall()
    assert rows == [(0, 2, "distributedInfo"), (1, 2, "distributedInfo"), (7, None, "--rank")]
    per_run = dict(fresh_db.execute("SELECT run_id, count(*) FROM events GROUP BY 1").fetchall())
    assert [per_run[r.run_id] for r in results] == [r.events_ingested for r in results]


def test_rank_from_file_name(fresh_db, tmp_path):
    src = corpus("kineto__docs_traces__before_fix_trace.json")
    dst = tmp_path / "trace_rank-3.json"
    dst.write_bytes(src.read_bytes())
    ingest(fresh_db, [dst])
    assert fresh_db.execute("SELECT rank, rank_source FROM runs").fetchone() == (3, "file name")


def test_nesting_parent_contains_child(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    bad = con.execute(
        """
        SELECT count(*) FROM events c JOIN events p ON p.event_id = c.parent_id
        WHERE NOT (p.ts_ns <= c.ts_ns AND p.end_ns >= c.end_ns AND p.pid = c.pid AND p.tid = c.tid
                   AND p.depth = c.depth - 1)
        """
    ).fetchone()[0]
    assert bad == 0
    # .item() runs a cudaStreamSynchronize under aten::_local_scalar_dense: the tree shows it
    parent = con.execute(
        """
        SELECT DISTINCT p.name FROM runtime_calls r JOIN events p ON p.event_id = r.parent_id
        WHERE r.name = 'cudaStreamSynchronize'
        """
    ).fetchall()
    assert ("aten::_local_scalar_dense",) in parent


def test_threads_and_streams_tables(loaded):
    con = loaded(sample("cpu_two_threads.json.gz"))
    names = [n for (n,) in con.execute("SELECT name FROM threads WHERE name IS NOT NULL").fetchall()]
    assert any("kv_transfer" in n for n in names)
    busy = con.execute("SELECT count(DISTINCT tid) FROM events WHERE kind = 'python_function'").fetchone()[0]
    assert busy >= 2
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    streams = con.execute("SELECT device, stream FROM streams").fetchall()
    kernel_streams = con.execute("SELECT DISTINCT device, stream FROM kernels").fetchall()
    assert set(kernel_streams) <= set(streams)


def test_database_file_round_trip(tmp_path):
    path = tmp_path / "t.duckdb"
    con = db.connect(str(path))
    ingest(con, [sample("gpu_tp2_rank0.json.gz")])
    n = con.execute("SELECT count(*) FROM events").fetchone()[0]
    con.close()
    again = db.connect(str(path), read_only=True)
    assert again.execute("SELECT count(*) FROM events").fetchone()[0] == n
    assert again.execute("SELECT value FROM tracekit_meta WHERE key = 'schema_version'").fetchone()[0]


def test_corpus_is_present_in_ci():
    import os

    if os.environ.get("CI"):
        assert len(KINETO_FILES) >= 19, f"expected the Kineto corpus at {CORPUS}"


@pytest.mark.parametrize("filler", [0, kineto.EXTRA_KEY_SAMPLE])  # a whole small part; a head cut at a boundary
def test_key_sample_sees_what_the_event_by_event_decode_sees(tmp_path, filler):
    """The one-parse sample of the first MiB finds the same extra keys and generic phases as decoding
    event by event, also where a `}, {` sits inside an event (an args list of objects), which is no
    place to cut the array."""
    events = [
        {"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"objs": [{"k": 1}, {"k": 2}]}},
        {"ph": "X", "name": "b", "ts": 2, "dur": 1, "my_key": 3},
        *({"ph": "X", "name": "pad", "ts": 3 + i, "dur": 1, "args": {"x": "y" * 200}} for i in range(filler // 240)),
        {"ph": "b", "name": "async", "ts": 9, "id": 1, "cat": "c", "last_key": True},
    ]
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps(events))
    sampled = kineto._sample_keys(path)
    original = kineto._whole_events
    try:
        kineto._whole_events = lambda head: None  # the event-by-event decode alone
        decoded = kineto._sample_keys(path)
    finally:
        kineto._whole_events = original
    assert sampled == decoded
    assert "my_key" in sampled[0] and ("last_key" in sampled[0]) == sampled[1] == (filler == 0)
