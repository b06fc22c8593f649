"""Generic Chrome trace JSON (Chromium, Node.js, hand-written): both containers, B/E and async
pairing, flows v1/v2, scoped instants, counters with ids, and what is skipped, checked against
small inputs with known answers and against real traces re-counted here with plain Python."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest

from tests.conftest import corpus, sample
from tracekit import db
from tracekit.ingest.pipeline import ingest

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
CHROMIUM = "chromium_startup.json.gz"
NODE = "node_trace_events.json.gz"


def ingest_text(tmp_path, text: str, name: str = "t.json"):
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    con = db.connect(None)
    ingest(con, [path])
    return con


def ingest_events(tmp_path, events: list, name: str = "t.json"):
    return ingest_text(tmp_path, json.dumps(events), name)


def rows(con, sql: str):
    return con.execute(sql).fetchall()


def log(con) -> dict:
    read, ingested, skipped, reasons, notes = con.execute(
        "SELECT events_read, events_ingested, events_skipped, skipped_reasons, notes FROM ingest_log"
    ).fetchone()
    assert read == ingested + skipped
    return {"read": read, "skipped": skipped, "reasons": orjson.loads(reasons), "notes": orjson.loads(notes)}


# --- containers --------------------------------------------------------------------------------

EVENTS = [
    {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 4},
    {"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 2},
    {"ph": "E", "pid": 1, "tid": 1, "ts": 3},
]
BODY = ",\n".join(json.dumps(e) for e in EVENTS)


@pytest.mark.parametrize(
    "text",
    [
        "[" + BODY + "]",
        "[" + BODY + ",\n]",  # trailing comma
        "[" + BODY,  # no closing bracket: the spec lets a writer stop at an event boundary
        "[" + BODY + ",\n",
        '{"displayTimeUnit": "ns", "traceEvents": [' + BODY + "]}",  # displayTimeUnit: display only
    ],
    ids=["closed", "trailing-comma", "unterminated", "unterminated-comma", "object"],
)
@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_array_and_object_containers_give_the_same_events(tmp_path, text, name):
    con = ingest_text(tmp_path, text, name)
    assert rows(con, "SELECT name, ts_ns, dur_ns, depth FROM events ORDER BY event_id") == [
        ("a", 1000, 4000, 0),
        ("b", 2000, 1000, 1),
    ]
    assert log(con)["read"] == 3


def test_large_unterminated_array_is_cut_into_parts(tmp_path, monkeypatch):
    from tracekit.parsers import json_slice

    monkeypatch.setattr(json_slice, "PART_TARGET", 4096)
    events = [{"ph": ph, "name": "s", "pid": 1, "tid": 1, "ts": i} for i in range(2000) for ph in ("B", "E")]
    path = tmp_path / "big.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    staged = json_slice.stage(path)
    try:
        assert len(staged.parts) > 3
    finally:
        staged.cleanup()
    con = db.connect(None)
    ingest(con, [path])
    assert rows(con, "SELECT count(*), min(dur_ns), max(dur_ns) FROM events") == [(2000, 0, 0)]
    assert log(con)["read"] == 4000


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_empty_and_tiny_arrays(tmp_path, name):
    for text in ("[]", "[", "[\n"):
        assert log(ingest_text(tmp_path, text, name))["read"] == 0
    # a document shorter than the 64 bytes the gzip reader first waits for
    con = ingest_text(tmp_path, '[{"ph":"X","ts":1,"dur":2}', name)
    assert rows(con, "SELECT ts_ns, dur_ns FROM events") == [(1000, 2000)]


# --- B/E ------------------------------------------------------------------------------------------


def test_nested_duration_events_pair_as_a_stack(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "args": {"a": 1, "x": "begin"}},
        {"ph": "B", "name": "inner", "pid": 1, "tid": 1, "ts": 1, "cat": "c"},
        {"ph": "B", "name": "other thread", "pid": 1, "tid": 2, "ts": 1.5},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 2, "args": {"x": "end"}},  # closes inner, not outer
        {"ph": "E", "pid": 1, "tid": 2, "ts": 2.5},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 5, "args": {"x": "end", "y": 2}},
        {"ph": "B", "name": "second root", "pid": 1, "tid": 1, "ts": 6},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 9},
    ])  # fmt: skip
    got = rows(con, "SELECT name, kind, ph, ts_ns, dur_ns, depth, args, extra->>'ph' FROM events ORDER BY event_id")
    assert got == [
        # E's args merge into the slice; on a duplicate key the E's value wins (the spec)
        ("outer", "other", "X", 0, 5000, 0, '{"a":1,"x":"end","y":2}', "B/E"),
        ("inner", "c", "X", 1000, 1000, 1, '{"x":"end"}', "B/E"),
        ("other thread", "other", "X", 1500, 1000, 0, None, "B/E"),
        ("second root", "other", "X", 6000, 3000, 0, None, "B/E"),
    ]
    parent = rows(con, "SELECT p.name FROM events c JOIN events p ON c.parent_id = p.event_id WHERE c.name = 'inner'")
    assert parent == [("outer",)]
    entry = log(con)
    assert entry["read"] == 8 and entry["skipped"] == 0
    assert entry["notes"]["end_events_folded_into_begins"] == {"E": 4}


def test_b_e_get_the_kinds_x_events_get(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "B", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 3},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 4, "dur": 1},
        {"ph": "B", "name": "l", "cat": "Kernel", "pid": 0, "tid": 7, "ts": 0},
        {"ph": "E", "pid": 0, "tid": 7, "ts": 2},
    ])  # fmt: skip
    assert rows(con, "SELECT kind, count(*) FROM events GROUP BY 1 ORDER BY 1") == [("cpu_op", 2), ("kernel", 1)]
    assert rows(con, "SELECT count(*) FROM cpu_ops WHERE dur_ns > 0") == [(2,)]


def test_unmatched_end_is_skipped_and_open_begin_runs_to_the_trace_end(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "E", "pid": 1, "tid": 1, "ts": 0},  # before any begin
        {"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 2},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 3},  # one end too many
        {"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 4},  # the depth is back to 0: pairs normally
        {"ph": "E", "pid": 1, "tid": 1, "ts": 5},
        {"ph": "B", "name": "open", "pid": 1, "tid": 2, "ts": 6},
        {"ph": "X", "name": "last", "pid": 1, "tid": 3, "ts": 7, "dur": 3},
    ])  # fmt: skip
    got = rows(con, "SELECT name, ts_ns, dur_ns, extra->>'unterminated' FROM events ORDER BY event_id")
    assert got == [
        ("a", 1000, 1000, None),
        ("b", 4000, 1000, None),
        ("open", 6000, 4000, "true"),
        ("last", 7000, 3000, None),
    ]
    entry = log(con)
    assert entry["reasons"] == {"duration end (ph E) without a matching begin": 2}
    assert entry["notes"]["duration_pairs"] == {"pairs": 2, "unterminated": 1, "unmatched_ends": 2}


def test_missing_pid_and_tid_still_pair(tmp_path):
    con = ingest_events(
        tmp_path, [{"ph": "B", "name": "a", "ts": 1}, {"ph": "E", "ts": 4}, {"ph": "i", "name": "m", "ts": 2}]
    )
    assert rows(con, "SELECT name, dur_ns, pid, tid FROM events ORDER BY event_id") == [
        ("a", 3000, None, None),
        ("m", None, None, None),
    ]


def test_out_of_order_file_pairs_by_timestamp(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "E", "pid": 1, "tid": 1, "ts": 8},
        {"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 2},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 5},
        {"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 6},
    ])  # fmt: skip
    assert rows(con, "SELECT name, dur_ns FROM events ORDER BY event_id") == [("a", 3000), ("b", 2000)]


# --- async --------------------------------------------------------------------------------------


def test_async_spans_pair_by_id_and_name_on_their_own_tracks(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "b", "cat": "net", "name": "request", "id2": {"local": "0x1"}, "pid": 1, "tid": 1, "ts": 0, "args": {"u": 1}},
        {"ph": "b", "cat": "net", "name": "request", "id2": {"local": "0x1"}, "pid": 2, "tid": 9, "ts": 1},
        {"ph": "b", "cat": "net", "name": "dns", "id2": {"local": "0x1"}, "pid": 1, "tid": 1, "ts": 2},
        {"ph": "n", "cat": "net", "name": "retry", "id2": {"local": "0x1"}, "pid": 1, "tid": 3, "ts": 3},
        {"ph": "e", "cat": "net", "name": "dns", "id2": {"local": "0x1"}, "pid": 1, "tid": 3, "ts": 4},
        {"ph": "e", "cat": "net", "name": "request", "id2": {"local": "0x1"}, "pid": 2, "tid": 9, "ts": 5},
        {"ph": "e", "cat": "net", "name": "request", "id2": {"local": "0x1"}, "pid": 1, "tid": 2, "ts": 6, "args": {"s": 200}},
        {"ph": "e", "cat": "net", "name": "request", "id2": {"global": "0x1"}, "pid": 1, "tid": 1, "ts": 7},
        {"ph": "b", "cat": "gc", "name": "sweep", "id": 5, "pid": 1, "tid": 1, "ts": 8},
        {"ph": "e", "cat": "gc", "name": "sweep", "id": 5, "pid": 3, "tid": 1, "ts": 9},  # plain id: global
        {"ph": "X", "name": "work", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
    ])  # fmt: skip
    got = rows(
        con,
        "SELECT name, ph, ts_ns, dur_ns, pid, tid, track, depth, args, extra->>'tid' FROM events WHERE kind = 'async' ORDER BY event_id",
    )
    assert got == [
        ("request", "X", 0, 6000, 1, None, "async/net/1:0x1", 0, '{"u":1,"s":200}', "1"),
        ("request", "X", 1000, 4000, 2, None, "async/net/2:0x1", 0, None, "9"),
        ("dns", "X", 2000, 2000, 1, None, "async/net/1:0x1", 1, None, "1"),
        ("retry", "n", 3000, None, 1, None, "async/net/1:0x1", None, None, "3"),
        ("sweep", "X", 8000, 1000, 1, None, "async/gc/5", 0, None, "1"),
    ]
    # async spans do not nest into, or under, the thread's slices
    assert rows(con, "SELECT depth FROM events WHERE name = 'work'") == [(0,)]
    entry = log(con)
    assert entry["reasons"] == {"async end (ph e) without a matching begin": 1}  # the id2.global one
    assert entry["read"] == 11


def test_legacy_async_start_finish_and_steps(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "S", "cat": "x", "name": "load", "id": "7", "pid": 1, "tid": 1, "ts": 0},
        {"ph": "T", "cat": "x", "name": "load", "id": "7", "pid": 1, "tid": 1, "ts": 1, "args": {"step": "parse"}},
        {"ph": "F", "cat": "x", "name": "load", "id": "7", "pid": 1, "tid": 1, "ts": 4},
    ])  # fmt: skip
    got = rows(con, "SELECT kind, ph, ts_ns, dur_ns, track FROM events ORDER BY event_id")
    assert got == [("async", "X", 0, 4000, "async/x/7"), ("async", "T", 1000, None, "async/x/7")]


# --- flows ----------------------------------------------------------------------------------------


def test_flow_v2_bind_id_links_slices_in_the_flows_view(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "X", "cat": "ipc", "name": "send", "pid": 1, "tid": 1, "ts": 0, "dur": 2, "bind_id": "0xab", "flow_out": True},
        {"ph": "B", "cat": "task", "name": "relay", "pid": 2, "tid": 5, "ts": 3, "bind_id": "0xab", "flow_in": True, "flow_out": True},
        {"ph": "E", "pid": 2, "tid": 5, "ts": 4},
        {"ph": "X", "cat": "task", "name": "receive", "pid": 3, "tid": 7, "ts": 6, "dur": 1, "bind_id": "0xab", "flow_in": True},
        {"ph": "X", "cat": "task", "name": "unbound", "pid": 3, "tid": 7, "ts": 8, "dur": 1, "bind_id": "0xcd"},
    ])  # fmt: skip
    flows = rows(con, "SELECT cat, flow_id, start_pid, start_tid, start_ts_ns, end_pid, end_tid, end_ts_ns FROM flows")
    assert flows == [("flow_v2", "0xab", 1, 1, 0, 3, 7, 6000)]
    steps = rows(
        con, "SELECT ph, name, pid, tid, ts_ns, extra->>'bound_slice_ph' FROM events WHERE kind = 'flow' ORDER BY ph"
    )
    assert steps == [("f", "receive", 3, 7, 6000, "X"), ("s", "send", 1, 1, 0, "X"), ("t", "relay", 2, 5, 3000, "B/E")]
    entry = log(con)
    assert entry["read"] == 5 and entry["notes"]["flow_v2_rows_added"] == 3
    # the flow rows are derived: slices + flow rows = events read - ends folded into their begins
    assert rows(con, "SELECT count(*) FROM events")[0][0] == 5 - 1 + 3


def test_flow_v1_with_id2_gets_a_flow_id(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "s", "cat": "f", "name": "post", "id2": {"local": "0x3"}, "pid": 4, "tid": 1, "ts": 0},
        {"ph": "f", "cat": "f", "name": "post", "id2": {"local": "0x3"}, "pid": 4, "tid": 2, "ts": 2, "bp": "e"},
    ])  # fmt: skip
    assert rows(con, "SELECT flow_id, start_tid, end_tid FROM flows") == [("4:0x3", 1, 2)]


# --- other phases ---------------------------------------------------------------------------------


def test_counters_instants_samples_and_what_is_skipped(tmp_path):
    con = ingest_events(tmp_path, [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "renderer"}},
        {"ph": "M", "name": "process_labels", "pid": 1, "args": {"labels": "tab 1"}},
        {"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 3}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "compositor"}},
        {"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": 2, "args": {"sort_index": 1}},
        {"ph": "C", "name": "heap", "id": "v8", "pid": 1, "tid": 2, "ts": 1, "args": {"used": 10}},
        {"ph": "C", "name": "heap", "pid": 1, "tid": 2, "ts": 1, "args": {"used": 20}},
        {"ph": "i", "name": "g", "s": "g", "pid": 1, "tid": 2, "ts": 2},
        {"ph": "I", "name": "p", "s": "p", "pid": 1, "tid": 2, "ts": 2},
        {"ph": "i", "name": "t", "pid": 1, "tid": 2, "ts": 2},
        {"ph": "R", "name": "navigationStart", "cat": "blink.user_timing", "pid": 1, "tid": 2, "ts": 2},
        {"ph": "P", "name": "sample", "pid": 1, "tid": 2, "ts": 3, "sf": 4},
        {"ph": "N", "name": "obj", "id": "0x1", "pid": 1, "tid": 2, "ts": 1},
        {"ph": "O", "name": "obj", "id": "0x1", "pid": 1, "tid": 2, "ts": 2, "args": {"snapshot": {}}},
        {"ph": "D", "name": "obj", "id": "0x1", "pid": 1, "tid": 2, "ts": 3},
        {"ph": "c", "name": "clock_sync", "pid": 1, "tid": 2, "ts": 3, "args": {"sync_id": "x"}},
        {"ph": "v", "name": "periodic_interval", "pid": 1, "tid": 2, "ts": 3, "id": "1", "args": {"dumps": {}}},
        {"ph": "V", "name": "global", "pid": 1, "tid": 2, "ts": 3, "id": "1"},
        {"ph": "(", "name": "ctx", "pid": 1, "tid": 2, "ts": 3, "id": "1"},
        {"ph": ")", "name": "ctx", "pid": 1, "tid": 2, "ts": 4, "id": "1"},
        {"ph": "Q", "name": "?", "pid": 1, "tid": 2, "ts": 4},
        {"ph": "n", "name": "no id", "pid": 1, "tid": 2, "ts": 4},
    ])  # fmt: skip
    assert rows(con, "SELECT name, series, value FROM counters ORDER BY name") == [
        ("heap", "used", 20.0),
        ("heap[v8]", "used", 10.0),
    ]
    assert rows(con, "SELECT name, track FROM events WHERE ph IN ('i', 'I') ORDER BY name") == [
        ("g", "global"),
        ("p", "1/process"),
        ("t", None),
    ]
    assert rows(con, "SELECT kind FROM events WHERE ph IN ('P', 'R') ORDER BY ph") == [
        ("sample",),
        ("blink_user_timing",),
    ]
    assert rows(con, "SELECT pid, name, labels, sort_index FROM processes") == [(1, "renderer", "tab 1", 3)]
    assert rows(con, "SELECT pid, tid, name, sort_index FROM threads") == [(1, 2, "compositor", 1)]
    entry = log(con)
    assert entry["reasons"] == {
        "object created (ph N) not ingested": 1,
        "object snapshot (ph O) not ingested": 1,
        "object destroyed (ph D) not ingested": 1,
        "clock sync (ph c) not ingested": 1,
        "memory dump (ph v) not ingested": 1,
        "memory dump (ph V) not ingested": 1,
        "context enter (ph () not ingested": 1,
        "context leave (ph )) not ingested": 1,
        "unknown ph Q": 1,
        "async event (ph n) without id": 1,
    }
    assert entry["read"] == 22


# --- real traces, re-counted independently ------------------------------------------------------


def raw_events(path: Path) -> list:
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def async_id(e):
    if "id" in e:
        return ("id", str(e["id"]))
    id2 = e.get("id2") or {}
    return ("global", id2["global"]) if "global" in id2 else ("local", e.get("pid"), id2.get("local"))


def stack_pairs(events, begin, end, key):
    """(begin, end or None) pairs and unmatched ends, with an explicit stack per key, in (ts, file) order."""
    stacks, pairs, unmatched = defaultdict(list), [], 0
    chosen = sorted((e["ts"], i, e) for i, e in enumerate(events) if e.get("ph") in (begin, end) and "ts" in e)
    for _, _, e in chosen:
        stack = stacks[key(e)]
        if e["ph"] == begin:
            stack.append(e)
        elif stack:
            pairs.append((stack.pop(), e))
        else:
            unmatched += 1
    opened = [(b, None) for stack in stacks.values() for b in stack]
    return pairs + opened, unmatched


def reconcile(con, events):
    phases = Counter(e.get("ph") for e in events)
    be, be_orphans = stack_pairs(events, "B", "E", lambda e: (e.get("pid"), e.get("tid")))
    async_key = lambda e: (e.get("cat"), e.get("scope"), async_id(e), e.get("name"))  # noqa: E731
    ae, ae_orphans = stack_pairs(events, "b", "e", async_key)
    trace_end = max(e["ts"] + (e.get("dur") or 0) for e in events if e.get("ph") != "M")

    def expected(pairs):
        return Counter(
            (b.get("name"), round(b["ts"] * 1000), round(((e or {}).get("ts", trace_end) - b["ts"]) * 1000), e is None)
            for b, e in pairs
        )

    def actual(flag):
        got = rows(
            con,
            f"SELECT name, ts_ns, dur_ns, extra->>'unterminated' IS NOT NULL FROM events WHERE extra->>'ph' IN {flag}",
        )
        return Counter(got)

    assert actual("('B/E', 'B')") == expected(be)
    assert actual("('b/e', 'b')") == expected(ae)
    entry = log(con)
    assert entry["read"] == len(events)
    ends_folded = sum(1 for _, e in be if e) + sum(1 for _, e in ae if e)
    assert entry["skipped"] == be_orphans + ae_orphans
    assert rows(con, "SELECT count(*) FROM events WHERE kind <> 'flow' OR cat <> 'flow_v2'")[0][0] == (
        entry["read"] - entry["skipped"] - ends_folded
    )
    assert rows(con, "SELECT count(*) FROM events WHERE kind = 'async'")[0][0] == len(ae) + phases["n"]
    # every complete, begin and async-begin event became one slice with a duration
    slices = phases["X"] + len(be) + len(ae)
    assert rows(con, "SELECT count(*) FROM events WHERE ph = 'X' AND dur_ns >= 0")[0][0] == slices
    return phases, be, ae


def test_real_chromium_trace_reconciles_with_an_independent_pass(loaded):
    path = sample(CHROMIUM)
    events = raw_events(path)
    con = loaded(path)
    phases, be, ae = reconcile(con, events)
    # what makes this trace a real test of the generic reader (Chromium writes open slices as B)
    assert phases["B"] and phases["b"] and phases["e"] and phases["n"] and phases["s"] and phases["R"]
    assert any(e is None for _, e in be) and any(e for _, e in ae)
    starts = [e for e in events if e.get("ph") == "s"]
    ends = Counter((e.get("cat"), str(e.get("id"))) for e in events if e.get("ph") == "f")
    linked = sum(ends[(e.get("cat"), str(e.get("id")))] for e in starts)
    assert rows(con, "SELECT count(end_event_id) FROM flows")[0][0] == linked > 0
    threads = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert threads <= set(rows(con, "SELECT pid, tid FROM threads WHERE name IS NOT NULL"))
    assert rows(con, "SELECT format FROM runs") == rows(con, "SELECT format FROM ingest_log") == [("chrome_json",)]


def test_real_node_trace_reconciles_with_an_independent_pass(loaded):
    path = sample(NODE)
    events = raw_events(path)
    con = loaded(path)
    phases, be, ae = reconcile(con, events)
    assert phases["E"] and all(e for _, e in be)  # Node closes every B it writes
    # a B/E slice nests like an X one: every child lies inside its parent
    bad = rows(
        con,
        "SELECT count(*) FROM events c JOIN events p ON c.parent_id = p.event_id "
        "WHERE c.ts_ns < p.ts_ns OR c.end_ns > p.end_ns",
    )
    assert bad == [(0,)]


def test_generic_events_after_the_sampled_head_are_read_with_their_keys(tmp_path, monkeypatch):
    from tracekit.parsers import kineto

    monkeypatch.setattr(kineto, "EXTRA_KEY_SAMPLE", 300)  # the head holds only Kineto-like X events
    head = [{"ph": "X", "name": f"x{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(20)]
    con = ingest_events(tmp_path, head + [
        {"ph": "b", "cat": "c", "name": "a", "id2": {"local": "0x1"}, "pid": 1, "tid": 1, "ts": 30},
        {"ph": "e", "cat": "c", "name": "a", "id2": {"local": "0x1"}, "pid": 1, "tid": 1, "ts": 32},
    ])  # fmt: skip
    assert rows(con, "SELECT track, dur_ns FROM events WHERE kind = 'async'") == [("async/c/1:0x1", 2000)]
    assert log(con)["skipped"] == 0


def test_kineto_traces_do_not_take_the_generic_path(loaded):
    con = loaded(corpus("hta__trace_diff__test.json.gz"))
    assert "chrome_json" not in log(con)["notes"]
    assert rows(con, "SELECT format FROM runs") == [("kineto",)]


# --- CLI --------------------------------------------------------------------------------------------


def run(*args):
    return subprocess.run([TRACEKIT, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_cli_analyze_chromium_trace_exits_0():
    proc = run("analyze", sample(CHROMIUM))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "text, fragments",
    [
        # the position is where the text ends, inside the cut event
        ('[{"ph": "B", "ts": 1, "pid": 1, "tid": 1},\n{"ph": "E", "ts": ', ["byte 60", "expected a complete event"]),
        ('[{"ph": "B", "ts": 1,, "pid": 1}]', ["byte 21", "expected well-formed JSON"]),
        (
            '{"traceEvents": [{"ph": "B", "ts": 1, "pid": 1, "tid": 1}',
            ["byte 57", "expected ']' closing the traceEvents array"],
        ),
        ('[{"ph": "B", "ts": 1, "args": {"a": [1, 2]}', ["byte", "expected"]),
    ],
    ids=["cut-in-event", "syntax", "object-unterminated", "cut-after-nested-value"],
)
def test_truncated_or_malformed_generic_files_are_one_line_errors(tmp_path, text, fragments):
    path = tmp_path / "bad.json"
    path.write_text(text)
    proc = run("analyze", path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(path) in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
