"""Perfetto protobuf traces land in the same tables as Kineto traces: every packet is ingested or counted
as skipped, slices pair and nest, counters, flows and thread/process names come through, and broken or
foreign files are refused or left to their own reader."""

from __future__ import annotations

import gzip
import random
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.conftest import ROOT, corpus, sample
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest.inputs import recognise
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import perfetto_proto

NESTED = "perfetto__nested_tracks.perfetto-trace"  # track descriptors, nested tracks, flows
PFTX = "pftx__example.pftrace"  # Perfetto SDK counter track events, clock snapshots, service packets
CHROMIUM = "chromium_startup.pftrace.gz"  # real Chromium startup trace (scripts/make_chromium_traces.sh)
TRACEKIT = ROOT / ".venv" / "bin" / "tracekit"


def path_of(name: str) -> Path:
    return sample(name) if name == CHROMIUM else corpus(name)


def packets(path: Path) -> list[tuple[int, object]]:
    """(offset, TracePacket) of every packet, by a plain loop independent of the reader."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    out, pos = [], 0
    while pos < len(data):
        assert data[pos] == 0x0A
        start, length, shift = pos + 1, 0, 0
        while True:
            b = data[start]
            start += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        out.append((pos, pb.TracePacket.FromString(data[start : start + length])))
        pos = start + length
    return out


def census(path: Path) -> dict:
    """Packet types, TrackEvent types (legacy phases apart), flow ids and descriptor names, counted directly."""
    types, events, names = Counter(), Counter(), {}
    terminating = 0
    for _, p in packets(path):
        kind = p.WhichOneof("data") or "state only"
        types[kind] += 1
        if kind == "track_event":
            e = p.track_event
            events[chr(e.legacy_event.phase) if e.type == 0 else e.type] += 1
            terminating += len(e.terminating_flow_ids)
        if kind == "track_descriptor" and p.track_descriptor.HasField("thread"):
            t = p.track_descriptor.thread
            if t.thread_name:
                names[(t.pid, t.tid)] = t.thread_name
    return {"types": types, "events": events, "thread_names": names, "terminating": terminating}


def log_row(con) -> tuple[int, int, int, dict, dict]:
    read, ingested, skipped, reasons, notes = con.execute(
        "SELECT events_read, events_ingested, events_skipped, skipped_reasons, notes FROM ingest_log"
    ).fetchone()
    return read, ingested, skipped, orjson.loads(reasons), orjson.loads(notes)


def count(con, sql: str, params=()) -> int:
    return con.execute(sql, params).fetchone()[0]


@pytest.mark.parametrize("name", [NESTED, PFTX, CHROMIUM])
def test_detected_and_reconciled_with_an_independent_count(loaded, name):
    path = path_of(name)
    assert recognise(path) is perfetto_proto
    con = loaded(path)
    c = census(path)
    read, ingested, skipped, reasons, notes = log_row(con)
    assert read == sum(c["types"].values()) == ingested + skipped
    assert skipped == sum(reasons.values())
    assert notes["packets_by_type"] == dict(c["types"])
    assert "unresolved_interned_ids" not in notes  # interning and incremental state resolved every id
    assert count(con, "SELECT format FROM runs") == "perfetto_proto"
    for kind, n in c["types"].items():
        if kind not in perfetto_proto._Reader(path).handlers:
            assert reasons[f"packet type {kind} (not decoded)"] == n
    ev = c["events"]
    begins = ev[perfetto_proto.SLICE_BEGIN] + ev["B"]
    ends = ev[perfetto_proto.SLICE_END] + ev["E"]
    slices = count(con, "SELECT count(*) FROM events WHERE kind = 'user_annotation'")
    # every BEGIN/END packet is one half of a slice row or a skip with its reason
    unmatched = reasons.get("slice end without begin on its track", 0) + reasons.get("slice begin never ended", 0)
    assert 2 * (slices - ev["X"]) + unmatched == begins + ends
    instants = ev[perfetto_proto.INSTANT] + sum(ev[p] for p in "IiRn")
    assert count(con, "SELECT count(*) FROM events WHERE kind = 'instant'") == instants
    assert count(con, "SELECT count(*) FROM events WHERE kind = 'counter'") == ev[perfetto_proto.COUNTER]
    assert (
        count(con, "SELECT count(*) FROM events WHERE kind = 'user_annotation' AND (dur_ns IS NULL OR dur_ns < 0)") == 0
    )


def test_nested_tracks_pair_every_slice_and_flow(loaded):
    path = corpus(NESTED)
    con = loaded(path)
    c = census(path)
    _, _, skipped, _, _ = log_row(con)
    assert skipped == 0
    assert count(con, "SELECT count(*) FROM events WHERE kind = 'user_annotation'") == c["events"][1] == c["events"][2]
    # every terminating flow id closes an arrow from the event that opened it
    assert count(con, "SELECT count(*) FROM flows WHERE end_event_id IS NOT NULL") == c["terminating"] > 0
    assert count(con, "SELECT count(*) FROM flows WHERE end_ts_ns < start_ts_ns") == 0
    # child tracks keep their own timeline, named by their path in the track tree
    deep = con.execute(
        "SELECT track FROM events WHERE kind = 'user_annotation' AND track LIKE 'L1%/L2%/L3%' LIMIT 1"
    ).fetchone()
    assert deep is not None
    named = count(con, "SELECT count(*) FROM threads WHERE name IS NOT NULL AND tid < 0")
    assert named == count(con, "SELECT count(DISTINCT (pid, tid)) FROM events WHERE kind = 'user_annotation'")


def test_counters_carry_the_written_values(loaded):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    path = corpus(PFTX)
    con = loaded(path)
    written = [
        p.track_event.double_counter_value
        for _, p in packets(path)
        if p.WhichOneof("data") == "track_event" and p.track_event.type == pb.TrackEvent.TYPE_COUNTER
    ]
    got = [r[0] for r in con.execute("SELECT value FROM counters ORDER BY event_id").fetchall()]
    assert got == written and len(got) > 1000
    assert {r[0] for r in con.execute("SELECT DISTINCT name FROM counters").fetchall()} == {"track1"}
    # the counter track hangs under a process: its pid, a synthetic tid
    pid, tid = con.execute("SELECT DISTINCT pid, tid FROM counters").fetchone()
    assert pid > 0 and tid < 0
    notes = log_row(con)[4]
    assert notes["clock_snapshots"]["count"] == census(path)["types"]["clock_snapshot"] > 0


def test_chromium_slices_nest_on_their_threads(loaded):
    con = loaded(sample(CHROMIUM))
    assert count(con, "SELECT count(*) FROM events WHERE kind = 'user_annotation' AND depth > 0") > 1000
    # a parent contains its child, on the same track
    assert (
        count(
            con,
            "SELECT count(*) FROM events c JOIN events p ON p.event_id = c.parent_id "
            "WHERE p.ts_ns > c.ts_ns OR p.end_ns < c.end_ns OR p.pid <> c.pid OR p.tid <> c.tid "
            "OR p.track IS DISTINCT FROM c.track",
        )
        == 0
    )
    # brute force: a slice strictly inside another slice of its track has a parent
    orphans = count(
        con,
        "SELECT count(*) FROM events c WHERE c.kind = 'user_annotation' AND c.parent_id IS NULL AND EXISTS ("
        "SELECT 1 FROM events p WHERE p.kind = 'user_annotation' AND p.run_id = c.run_id AND p.pid = c.pid "
        "AND p.tid = c.tid AND p.track IS NOT DISTINCT FROM c.track AND p.ts_ns <= c.ts_ns AND p.end_ns >= c.end_ns "
        "AND p.dur_ns > c.dur_ns)",
    )
    assert orphans == 0
    # slices of one track never overlap partly: the BEGIN/END pairing and the clocks agree
    partial = count(
        con,
        "SELECT count(*) FROM events a JOIN events b ON a.run_id = b.run_id AND a.pid = b.pid AND a.tid = b.tid "
        "AND a.track IS NOT DISTINCT FROM b.track AND a.ts_ns < b.ts_ns AND b.ts_ns < a.end_ns AND b.end_ns > a.end_ns "
        "WHERE a.kind = 'user_annotation' AND b.kind = 'user_annotation'",
    )
    assert partial == 0


def test_chromium_names_flows_and_counters(loaded):
    path = sample(CHROMIUM)
    con = loaded(path)
    c = census(path)
    threads = {(pid, tid): name for pid, tid, name in con.execute("SELECT pid, tid, name FROM threads").fetchall()}
    assert c["thread_names"] and all(threads.get(k) == v for k, v in c["thread_names"].items())
    assert count(con, "SELECT count(*) FROM processes WHERE name IS NOT NULL") >= 3  # browser, renderer, GPU, ...
    arrows = count(con, "SELECT count(*) FROM flows WHERE end_event_id IS NOT NULL")
    assert arrows > 1000
    assert count(con, "SELECT count(*) FROM flows WHERE end_ts_ns < start_ts_ns") == 0
    # arrows cross threads (a task posted on one thread, run on another)
    assert count(con, "SELECT count(*) FROM flows WHERE end_tid <> start_tid") > 0
    assert count(con, "SELECT count(*) FROM counters WHERE value IS NOT NULL") == c["events"][perfetto_proto.COUNTER]
    notes = log_row(con)[4]
    # Chrome's incremental microsecond clock (sequence clock 64) resolved onto a builtin clock
    assert any(k.startswith("64 -> ") for k in notes["timestamp_clocks"])
    start, end = con.execute("SELECT start_ns, end_ns FROM runs").fetchone()
    assert 0 < end - start < 60 * 10**9  # a 2 s startup trace: deltas were summed, not taken as absolute
    args = con.execute(
        "SELECT count(*) FROM events WHERE kind = 'user_annotation' AND args->>'posted_from' IS NOT NULL"
    ).fetchone()[0]
    assert args > 0


@pytest.mark.parametrize("name", [NESTED, PFTX, CHROMIUM])
def test_cli_analyze_exits_0(name):
    proc = subprocess.run([str(TRACEKIT), "analyze", str(path_of(name))], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def test_gzipped_copy_reads_the_same(tmp_path, loaded):
    plain = corpus(NESTED)
    gz = tmp_path / "nested.pftrace.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert recognise(gz) is perfetto_proto
    a, b = perfetto_proto.read(plain), perfetto_proto.read(gz)
    assert a.read == b.read and a.skipped == b.skipped and a.rows == b.rows


def test_compressed_packets_are_unpacked(tmp_path):
    """The service's packet compression: a deflated Trace inside one compressed_packets packet."""
    import zlib

    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    plain = corpus(NESTED)
    container = pb.TracePacket(compressed_packets=zlib.compress(plain.read_bytes()))
    path = tmp_path / "compressed.pftrace"
    path.write_bytes(pb.Trace(packet=[container]).SerializeToString())
    assert recognise(path) is perfetto_proto
    a, b = perfetto_proto.read(plain), perfetto_proto.read(path)
    assert b.read == a.read + Counter({"compressed_packets": 1}) and b.skipped == a.skipped and b.rows == a.rows


def test_foreign_files_are_not_claimed(tmp_path):
    json_trace = tmp_path / "kineto.pftrace"
    json_trace.write_bytes(gzip.decompress(sample("cpu_two_threads.json.gz").read_bytes()))
    newline_json = tmp_path / "newline.pftrace"
    newline_json.write_bytes(b'\n{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}\n')
    sqlite = tmp_path / "x.pftrace"
    sqlite.write_bytes(b"SQLite format 3\x00" + bytes(100))
    empty = tmp_path / "empty.pftrace"
    empty.write_bytes(b"")
    for p in (json_trace, newline_json, sqlite, empty, tmp_path / "missing.pftrace"):
        assert recognise(p) is not perfetto_proto, p
    # the JSON trace under a Perfetto name is still read as what it is
    con = db.connect(None)
    (result,) = ingest(con, [json_trace])
    assert result.format == "kineto" and result.events_ingested > 0


def boundaries(path: Path) -> list[int]:
    return [offset for offset, _ in packets(path)]


def test_truncated_file_names_the_packet_offset(tmp_path):
    src = corpus(NESTED)
    data = src.read_bytes()
    starts = boundaries(src)
    rng = random.Random(7)
    cuts = [c for c in rng.sample(range(1, len(data)), 12) if c not in starts][:6]
    for cut in cuts:
        path = tmp_path / f"cut{cut}.perfetto-trace"
        path.write_bytes(data[:cut])
        broken = max(s for s in starts if s < cut)  # the packet the cut falls into
        with pytest.raises(InputError) as err:
            perfetto_proto.read(path)
        assert err.value.position == f"byte {broken}" and str(path) in str(err.value)
        con = db.connect(None)
        with pytest.raises(InputError):
            ingest(con, [path])
        assert count(con, "SELECT count(*) FROM runs") == 0


def test_truncated_file_cli_exit_2_one_line(tmp_path):
    src = corpus(NESTED)
    data = src.read_bytes()
    starts = boundaries(src)
    cut = len(data) // 2 + 3
    assert cut not in starts
    path = tmp_path / "half.perfetto-trace"
    path.write_bytes(data[:cut])
    proc = subprocess.run([str(TRACEKIT), "analyze", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    broken = max(s for s in starts if s < cut)
    assert len(lines) == 1 and str(path) in lines[0] and f"byte {broken}" in lines[0]


def test_truncated_gzip_and_corrupt_packet(tmp_path):
    src = corpus(NESTED)
    data = src.read_bytes()
    gz = gzip.compress(data)
    cut_gz = tmp_path / "cut.pftrace.gz"
    cut_gz.write_bytes(gz[: len(gz) * 2 // 3])
    with pytest.raises(InputError) as err:
        perfetto_proto.read(cut_gz)
    # the packet the cut falls into, in the decompressed stream
    assert err.value.position.removeprefix("decompressed byte ").isdigit()
    assert int(err.value.position.split()[-1]) in set(boundaries(src)) and "truncated" in err.value.expected
    # a packet whose bytes are not a TracePacket: a wire type 7 tag inside it
    starts = boundaries(src)
    third = starts[2]
    corrupt = bytearray(data)
    corrupt[third + 2] = 0x0F
    path = tmp_path / "corrupt.perfetto-trace"
    path.write_bytes(bytes(corrupt))
    with pytest.raises(InputError) as err:
        perfetto_proto.read(path)
    assert err.value.position == f"byte {third}"


def test_incremental_state_clock_and_unmatched_slices(tmp_path):
    """A hand-made sequence: interning, defaults, an incremental us clock, a lost packet, a re-clear."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    te = pb.TrackEvent
    first = pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=1)
    first.interned_data.event_names.add(iid=1, name="work")
    first.interned_data.event_categories.add(iid=1, name="cat")
    first.interned_data.debug_annotation_names.add(iid=1, name="n")
    first.trace_packet_defaults.timestamp_clock_id = 64
    first.trace_packet_defaults.track_event_defaults.track_uuid = 10
    first.clock_snapshot.clocks.add(clock_id=3, timestamp=1_000_000)
    first.clock_snapshot.clocks.add(clock_id=64, timestamp=1000, is_incremental=True, unit_multiplier_ns=1000)
    desc = pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=2)
    desc.track_descriptor.uuid = 10
    desc.track_descriptor.thread.pid, desc.track_descriptor.thread.tid = 5, 6
    desc.track_descriptor.thread.thread_name = "worker"

    def event(ts, typ, **kw):
        p = pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=2, timestamp=ts, **kw)
        p.track_event.type = typ
        return p

    begin = event(5, te.TYPE_SLICE_BEGIN)  # 1_005_000 ns
    begin.track_event.name_iid, begin.track_event.category_iids[:] = 1, [1]
    begin.track_event.debug_annotations.add(name_iid=1, int_value=3)
    end = event(10, te.TYPE_SLICE_END)  # 1_015_000 ns
    stray_end = event(1, te.TYPE_SLICE_END)
    lost = event(1, te.TYPE_SLICE_BEGIN, previous_packet_dropped=1)
    lost.track_event.name_iid = 1
    cleared = event(100, te.TYPE_SLICE_BEGIN)
    cleared.sequence_flags = 3
    cleared.interned_data.event_names.add(iid=1, name="other")
    cleared.trace_packet_defaults.CopyFrom(first.trace_packet_defaults)  # a clear drops the defaults too
    cleared.track_event.name_iid = 1
    tick = event(2_000_000, te.TYPE_INSTANT, timestamp_clock_id=3)
    tick.track_event.name = "tick"
    path = tmp_path / "seq.pftrace"
    trace = pb.Trace(packet=[first, desc, begin, end, stray_end, lost, cleared, tick])
    path.write_bytes(trace.SerializeToString())
    assert recognise(path) is perfetto_proto
    con = db.connect(None)
    (result,) = ingest(con, [path])
    assert result.events_read == 8 == result.events_ingested + result.events_skipped
    assert result.skipped_reasons == {
        "slice end without begin on its track": 1,
        "packet needing incremental state the sequence lost or never set": 1,
        "slice begin never ended": 1,
    }
    rows = con.execute("SELECT kind, name, cat, ts_ns, dur_ns, pid, tid, args FROM events WHERE kind <> 'metadata' "
                       "ORDER BY ts_ns").fetchall()  # fmt: skip
    assert rows == [
        ("user_annotation", "work", "cat", 1_005_000, 10_000, 5, 6, '{"n":3}'),
        ("instant", "tick", None, 2_000_000, None, 5, 6, None),
    ]
    assert count(con, "SELECT name FROM threads WHERE pid = 5 AND tid = 6") == "worker"


def _event_rows(path: Path) -> list:
    con = db.connect(None)
    ingest(con, [path])
    return con.execute("SELECT * EXCLUDE (run_id) FROM event_rows ORDER BY rowid").fetchall()


@pytest.mark.parametrize("name", ["pftx__example.pftrace", "chromium_startup.pftrace.gz"])
def test_counter_fast_path_changes_nothing(name, monkeypatch):
    """Plain counter packets are decoded from their bytes once their shape is known: the rows must be
    those of the full protobuf decode, on SDK counters and on Chromium's mixed packets."""
    path = corpus(name) if name.startswith("pftx") else sample(name)
    fast = _event_rows(path)
    monkeypatch.setattr(perfetto_proto, "MAX_SHAPE_MISSES", 0)  # never try the shortcut
    assert _event_rows(path) == fast and len(fast) > 1000


def test_counter_beyond_64_bits_is_kept_as_a_double(tmp_path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    desc = pb.TracePacket(trusted_packet_sequence_id=1)
    desc.track_descriptor.uuid = 7
    desc.track_descriptor.name = "bytes"
    desc.track_descriptor.counter.unit_multiplier = 1 << 40
    value = pb.TracePacket(trusted_packet_sequence_id=1, timestamp=10)
    value.track_event.type = pb.TrackEvent.TYPE_COUNTER
    value.track_event.track_uuid = 7
    value.track_event.counter_value = 1 << 40  # times the multiplier: 2**80
    path = tmp_path / "big.pftrace"
    path.write_bytes(pb.Trace(packet=[desc, value]).SerializeToString())
    con = db.connect(None)
    (result,) = ingest(con, [path])
    assert result.events_skipped == 0
    assert con.execute("SELECT value FROM counters").fetchone()[0] == float(1 << 80)
