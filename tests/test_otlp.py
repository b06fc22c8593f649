"""OTLP/JSON spans (collector file exporter form, fixture written by the OpenTelemetry SDK, see
tests/data/serving/make_otlp_fixture.py): every span lands or is skipped with a reason, the spans of
one trace nest, and the reader claims no other format."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, sample
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest.inputs import recognise
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import otlp_json

FIXTURE = Path(__file__).parent / "data" / "serving" / "otlp_requests.jsonl"


def _spans(path: Path) -> list:
    # independent of the reader: walk the JSON with the standard library
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                out += ss["spans"]
    return out


def test_spans_reconcile_and_nest_per_trace(fresh_db):
    spans = _spans(FIXTURE)
    ingest(fresh_db, [FIXTURE])
    fmt, read, ingested, skipped = fresh_db.execute(
        "SELECT format, events_read, events_ingested, events_skipped FROM ingest_log"
    ).fetchone()
    assert (fmt, read, ingested, skipped) == ("otlp_json", len(spans), len(spans), 0)
    # time containment per trace track reproduces every parentSpanId the SDK wrote
    bad = fresh_db.execute(
        """
        SELECT count(*) FROM events c LEFT JOIN events p ON p.event_id = c.parent_id
        WHERE c.kind = 'span' AND coalesce(p.args->>'span_id', '') <> coalesce(c.args->>'parent_span_id', '')
        """
    ).fetchone()[0]
    assert bad == 0
    by_id = {s["spanId"]: s for s in spans}
    rows = fresh_db.execute("SELECT args->>'span_id', ts_ns, dur_ns, pid FROM events WHERE kind = 'span'").fetchall()
    for span_id, ts, dur, pid in rows:
        s = by_id[span_id]
        assert ts == int(s["startTimeUnixNano"]) and ts + dur == int(s["endTimeUnixNano"])
    pids = dict(fresh_db.execute("SELECT args->>'service.name', any_value(pid) FROM events GROUP BY 1").fetchall())
    assert pids["llm-server"] == 24440 and pids["router"] not in (None, 24440)  # stated pid, else a synthetic one
    attrs = fresh_db.execute(
        "SELECT args FROM events WHERE name = 'POST /v1/chat/completions' ORDER BY ts_ns LIMIT 1"
    ).fetchone()[0]
    attrs = json.loads(attrs)
    assert attrs["gen_ai.usage.input_tokens"] == 7 and attrs["llm.stop"] == ["</s>", "\n\n"]
    assert attrs["span_kind"] == "SERVER" and attrs["llm.stream"] is True


def test_malformed_lines_and_spans_are_counted(tmp_path):
    good = FIXTURE.read_text().splitlines()[0]
    obj = json.loads(good)
    spans = obj["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0] = {**spans[0], "endTimeUnixNano": "1"}  # end before start
    spans[1] = {k: v for k, v in spans[1].items() if k != "startTimeUnixNano"}
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([json.dumps(obj), good[: len(good) // 2], "[1, 2]", '{"resourceSpans": "x"}', ""]))
    out = otlp_json.read(path)
    assert out.skipped["span with end before start"] == 1
    assert out.skipped["span without start or end time"] == 1
    assert out.skipped["malformed JSON line"] == 1 and out.skipped["line without resourceSpans"] == 2
    assert sum(out.read.values()) == len(out.rows) + sum(out.skipped.values())


def test_detect_claims_only_otlp(tmp_path):
    assert recognise(FIXTURE) is otlp_json
    for other in (sample("cpu_two_threads.json.gz"), sample("runtime_demo.events.jsonl")):
        assert recognise(other) is not otlp_json
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert recognise(empty) is not otlp_json and recognise(tmp_path / "missing.jsonl") is not otlp_json


def test_empty_file_is_an_input_error_not_a_traceback(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("")
    with pytest.raises(InputError):
        ingest(db.connect(None), [path])


def test_cli_analyze_exits_zero():
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "tracekit"), "analyze", str(FIXTURE)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-500:]


def test_pretty_printed_request_with_numeric_times_and_upper_case_ids(tmp_path):
    # the shape of opentelemetry-proto's examples/trace.json: one indented object, times as numbers
    request = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "lib", "version": "1.0.0"},
                        "spans": [
                            {
                                "traceId": "0AF7651916CD43DD8448EB211C80319C",
                                "spanId": "B7AD6B7169203331",
                                "name": "outer",
                                "startTimeUnixNano": 1000,
                                "endTimeUnixNano": 9000,
                                "kind": 2,
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "12345678901234567"}},
                                    {"key": "raw", "value": {"bytesValue": "AAE="}},
                                    {"key": "m", "value": {"kvlistValue": {"values": [
                                        {"key": "x", "value": {"doubleValue": 0.5}}]}}},
                                ],
                            },
                            {
                                "traceId": "0AF7651916CD43DD8448EB211C80319C",
                                "spanId": "00F067AA0BA902B7",
                                "parentSpanId": "B7AD6B7169203331",
                                "name": "inner",
                                "startTimeUnixNano": 2000,
                                "endTimeUnixNano": 3000,
                            },
                        ],
                    }
                ],
            }
        ]
    }  # fmt: skip
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(request, indent=2))
    assert recognise(path) is otlp_json
    con = db.connect(None)
    ingest(con, [path])
    rows = con.execute("SELECT name, depth, args FROM events ORDER BY ts_ns").fetchall()
    assert [(n, d) for n, d, _ in rows] == [("outer", 0), ("inner", 1)]
    outer = json.loads(rows[0][2])
    assert outer["n"] == 12345678901234567 and outer["m"] == {"x": 0.5} and outer["raw"] == "AAE="
    assert outer["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
