"""Serving logs (SGLang, vLLM): every line is ingested or skipped with a reason, the batch statistics
land as counters, and the reader claims no other format."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, corpus, sample
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest.inputs import recognise
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import runtime_events, serving_log

SGLANG = "sglsetup__sglang.log"
VLLM = "energyllm__vllm_server.log"


def _line_count(path: Path) -> int:
    # independent of the reader: newline bytes, plus a last line without one
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


@pytest.mark.parametrize("name", [SGLANG, VLLM])
def test_corpus_log_reconciles_line_for_line(loaded, name):
    path = corpus(name)
    con = loaded(path)
    fmt, read, ingested, skipped, reasons = con.execute(
        "SELECT format, events_read, events_ingested, events_skipped, skipped_reasons FROM ingest_log"
    ).fetchone()
    assert fmt == "serving_log"
    assert read == _line_count(path) == ingested + skipped
    assert sum(json.loads(reasons).values()) == skipped
    rows = con.execute("SELECT count(*) FROM events").fetchone()[0]
    metric_lines = len(con.execute("SELECT DISTINCT args->>'line' FROM run_metrics").fetchall())
    assert rows + metric_lines == ingested


def test_sglang_batch_lines_become_counters_with_their_values(loaded):
    path = corpus(SGLANG)
    con = loaded(path)
    text = path.read_text(errors="replace")
    # an independent pass: the numbers straight from the text
    decode = [float(x) for x in re.findall(r"Decode batch.*?gen throughput \(token/s\): ([\d.]+)", text)]
    queues = [int(x) for x in re.findall(r"Decode batch.*?#queue-req: (\d+)", text)]
    prefill_tokens = [int(x) for x in re.findall(r"Prefill batch.*?#new-token: (\d+)", text)]
    got = con.execute(
        "SELECT value FROM counters WHERE name = 'sglang.decode_batch' AND series = 'gen_throughput_tok_s' "
        "ORDER BY event_id"
    ).fetchall()
    assert [v for (v,) in got] == decode and decode
    got_q = con.execute(
        "SELECT value FROM counters WHERE name = 'sglang.decode_batch' AND series = 'queue_req' ORDER BY event_id"
    ).fetchall()
    assert [int(v) for (v,) in got_q] == queues
    got_p = con.execute(
        "SELECT value FROM counters WHERE name = 'sglang.prefill_batch' AND series = 'new_token' ORDER BY event_id"
    ).fetchall()
    assert [int(v) for (v,) in got_p] == prefill_tokens
    usage = con.execute("SELECT min(value), max(value) FROM counters WHERE series = 'token_usage'").fetchone()
    assert 0 <= usage[0] <= usage[1] <= 1
    # timestamps: the first decode line's time, read as UTC
    first = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] Decode batch", text).group(1)
    ts = con.execute("SELECT min(ts_ns) FROM counters WHERE name = 'sglang.decode_batch'").fetchone()[0]
    import datetime as dt

    expected = dt.datetime.fromisoformat(first).replace(tzinfo=dt.UTC).timestamp()
    assert ts == int(expected) * 1_000_000_000


def test_sglang_requests_span_receive_to_finish(loaded):
    con = loaded(corpus(SGLANG))
    text = corpus(SGLANG).read_text(errors="replace")
    finished = len(re.findall(r"\] Finish: obj=", text))
    rows = con.execute(
        "SELECT count(*), min(dur_ns), bool_and(args->>'rid' IS NOT NULL) FROM events WHERE name = 'sglang.request'"
    ).fetchone()
    assert rows[0] == finished and rows[1] > 0 and rows[2]


def test_vllm_engine_stats_year_and_series(loaded):
    path = corpus(VLLM)
    con = loaded(path)
    text = re.sub(r"\x1b\[[0-9;]*m", "", path.read_text(errors="replace"))
    gen = [float(x) for x in re.findall(r"Avg generation throughput: ([\d.]+) tokens/s", text)]
    running = [int(x) for x in re.findall(r"Running: (\d+) reqs", text)]
    got = con.execute(
        "SELECT series, list(value ORDER BY event_id) FROM counters WHERE name = 'vllm.engine_stats' GROUP BY 1"
    ).fetchall()
    by_series = dict(got)
    assert by_series["avg_generation_throughput_tok_s"] == gen
    assert by_series["running"] == running
    assert {"waiting", "gpu_kv_cache_usage_pct", "prefix_cache_hit_rate_pct"} <= set(by_series)
    year = re.search(r"^(\d{4})-\d\d-\d\d ", text, re.M).group(1)
    import datetime as dt

    ts = con.execute("SELECT min(ts_ns) FROM counters").fetchone()[0]
    assert str(dt.datetime.fromtimestamp(ts / 1e9, dt.UTC).year) == year
    notes = con.execute("SELECT notes->>'clock' FROM ingest_log").fetchone()[0]
    assert "UTC" in notes and year in notes
    stated = dict(con.execute("SELECT name, value FROM run_metrics").fetchall())
    assert stated["kv_cache_tokens"] == float(re.search(r"KV cache size: ([\d,]+)", text).group(1).replace(",", ""))


def test_no_year_is_assumed_and_said(tmp_path):
    path = tmp_path / "v.log"
    path.write_text(
        "INFO 12-31 23:59:59 [loggers.py:127] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
        "throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit "
        "rate: 0.0%\r\n"
        "INFO 01-01 00:00:09 [loggers.py:127] Engine 001: Avg prompt throughput: 1.0 tokens/s, Avg generation "
        "throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 3 reqs, GPU KV cache usage: 1.0%, Prefix cache hit "
        "rate: 0.0%\r\n"
    )
    out = serving_log.read(path)
    assert "assumed" in out.notes["clock"]
    (t0, tid0), (t1, tid1) = [(r[4], r[7]) for r in out.rows]
    assert t1 - t0 == 10 * 10**9 and (tid0, tid1) == (0, 1)  # the year rolls over, CRLF is stripped


def test_tracebacks_garbage_and_odd_lines_are_counted_by_reason(tmp_path):
    path = tmp_path / "s.log"
    lines = [
        "[2026-02-09 14:45:24] Decode batch, #running-req: 1, #token: 5, token usage: 0.5, gen throughput (token/s): "
        "10.0, #queue-req: 0, ",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: boom",
        "[2026-02-09 14:45:25] Decode batch, #running-req: one, #queue-req: 0",
        "Decode batch, #running-req: 1, #queue-req: 0",
        "\x1b[1;36m[2026-02-09 14:45:26] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: "
        "0.00, #running-req: 0, #queue-req: 2\x1b[0m",
        "",
        "\x00\x01\x02 binary",
    ]
    path.write_bytes("\n".join(lines).encode() + b"\n")
    out = serving_log.read(path)
    assert sum(out.read.values()) == len(lines)
    assert out.skipped["log line: traceback"] == 3
    assert out.skipped["log line: statistic with unreadable fields"] == 1
    assert out.skipped["log line: statistic without a timestamp"] == 1
    assert out.skipped["log line: blank"] == 1 and out.skipped["log line: binary (NUL bytes)"] == 1
    assert [r[3] for r in out.rows] == ["sglang.decode_batch", "sglang.prefill_batch"]
    assert '"queue_req":2' in out.rows[1][14]
    assert sum(out.skipped.values()) + len(out.rows) == len(lines)


def test_gzipped_log_reads_like_plain(tmp_path):
    path = tmp_path / "s.log.gz"
    path.write_bytes(gzip.compress(corpus(SGLANG).read_bytes()))
    assert recognise(path) is serving_log
    assert len(serving_log.read(path).rows) == len(serving_log.read(corpus(SGLANG)).rows)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert recognise(cut) is serving_log  # recognised from what the truncated member holds ...
    with pytest.raises(InputError, match="cut.log.gz"):  # ... and refused in one line
        ingest(db.connect(None), [cut])


def test_detect_claims_only_server_logs(tmp_path):
    assert recognise(corpus(SGLANG)) is serving_log and recognise(corpus(VLLM)) is serving_log
    for other in (sample("cpu_two_threads.json.gz"), sample("runtime_demo.events.jsonl"), sample("numerics_tf32.csv")):
        assert recognise(other) is not serving_log
    assert runtime_events not in (recognise(corpus(SGLANG)), recognise(corpus(VLLM)))
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.log"
    garbage.write_bytes(bytes(range(256)) * 4)
    assert recognise(empty) is not serving_log and recognise(garbage) is not serving_log
    assert recognise(tmp_path / "missing.log") is not serving_log


def test_unrecognised_text_is_one_line_input_error(tmp_path):
    path = tmp_path / "garbage.log"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError):
        ingest(db.connect(None), [path])


def test_cli_analyze_exits_zero_on_both_logs():
    for name in (SGLANG, VLLM):
        done = subprocess.run([str(ROOT / ".venv" / "bin" / "tracekit"), "analyze", str(corpus(name))],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-500:]
        assert "Traceback" not in done.stderr


def test_older_formats_of_both_servers(tmp_path):
    # vLLM before 0.7 (no bracket around the source location, `Pending`), SGLang with a TP tag and `batch.`
    path = tmp_path / "old.log"
    path.write_text(
        "INFO 2024-08-01 is not a date line\n"
        "INFO 08-01 10:00:00 metrics.py:341] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
        "40.5 tokens/s, Running: 3 reqs, Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: 9.5%, CPU KV cache "
        "usage: 0.0%.\n"
        "[2024-08-01 10:00:01 TP1] Decode batch. #running-req: 2, #token: 300, token usage: 0.01, gen throughput "
        "(token/s): 55.5, #queue-req: 0\n"
    )
    assert recognise(path) is serving_log
    out = serving_log.read(path)
    (vllm, sgl) = out.rows
    assert json.loads(vllm[14])["pending"] == 2 and json.loads(vllm[14])["cpu_kv_cache_usage_pct"] == 0.0
    assert sgl[7] == 1 and json.loads(sgl[14])["gen_throughput_tok_s"] == 55.5
    assert out.skipped["log line: no timestamp"] == 1


def test_concurrent_requests_do_not_nest(loaded):
    con = loaded(corpus(SGLANG))
    depths = con.execute("SELECT list(DISTINCT depth) FROM events WHERE name = 'sglang.request'").fetchone()[0]
    overlapping = con.execute(
        "SELECT count(*) FROM events a JOIN events b ON a.name = b.name AND a.event_id < b.event_id "
        "AND a.ts_ns < b.end_ns AND b.ts_ns < a.end_ns WHERE a.name = 'sglang.request'"
    ).fetchone()[0]
    assert depths == [0] and overlapping >= 1  # the log's two long requests overlap in time
