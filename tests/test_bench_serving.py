"""Serving benchmark results (vLLM benchmark_serving JSON, sglang.bench_serving JSON Lines): every
numeric result lands in run_metrics with its unit, per-request arrays are noted, bad lines counted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import ROOT, sample
from tracekit.ingest.inputs import recognise
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import bench_serving

DATA = Path(__file__).parent / "data" / "serving"
VLLM = DATA / "vllm_benchmark_serving.json"
SGLANG = DATA / "sglang_bench_serving.jsonl"


def test_vllm_result_metrics_with_units(fresh_db):
    obj = json.loads(VLLM.read_text())
    numeric = {k: v for k, v in obj.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ingest(fresh_db, [VLLM])
    fmt, read, skipped, notes = fresh_db.execute(
        "SELECT format, events_read, events_skipped, notes FROM ingest_log"
    ).fetchone()
    assert (fmt, read, skipped) == ("bench_serving", 1, 0)
    got = {r[0]: r[1:] for r in fresh_db.execute("SELECT args->>'key', name, value, unit FROM run_metrics").fetchall()}
    assert set(got) == set(numeric)
    assert all(got[k][1] == float(v) for k, v in numeric.items())
    assert got["p99_ttft_ms"][0::2] == ("ttft_p99", "ms") and got["mean_e2el_ms"][0] == "e2e_latency_mean"
    assert got["request_throughput"][2] == "req/s" and got["output_throughput"][2] == "tok/s"
    assert got["duration"][2] == "s" and got["completed"][2] == "count"
    assert json.loads(notes)["per_request_arrays"]["ttfts"].startswith(str(len(obj["ttfts"])))
    assert fresh_db.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_sglang_jsonl_one_run_per_line_and_bad_lines(tmp_path):
    lines = SGLANG.read_text().splitlines()
    out = bench_serving.read(SGLANG)
    assert out.read["result run"] == len(lines) and not out.skipped
    runs = {json.loads(a)["run"] for *_, a in out.metrics}
    assert runs == set(range(len(lines)))
    assert {n for n, *_ in out.metrics} >= {"e2e_latency_p99", "itl_p95", "request_throughput"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], lines[1][:40], '"text"', '{"request_throughput": "fast"}', ""]))
    out = bench_serving.read(bad)
    assert out.skipped == {"malformed JSON line": 1, "not a JSON object": 1, "object without benchmark metrics": 1}
    assert sum(out.read.values()) == 4


def test_detect_claims_only_benchmark_results(tmp_path):
    # OTLP spans are tried first: recognised as benchmark results, they are not taken for spans
    assert recognise(VLLM) is bench_serving and recognise(SGLANG) is bench_serving
    for other in (sample("cpu_two_threads.json.gz"), sample("runtime_demo.events.jsonl"), DATA / "otlp_requests.jsonl"):
        assert recognise(other) is not bench_serving
    garbage = tmp_path / "g.json"
    garbage.write_bytes(b"\x00\xff" * 100)
    assert recognise(garbage) is not bench_serving


def test_cli_analyze_exits_zero():
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "tracekit"), "analyze", str(SGLANG)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-500:]


def test_nan_and_infinity_as_python_writes_them_are_noted_not_stored(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"request_throughput": 2.0, "completed": 3, "std_ttft_ms": NaN, "request_rate": Infinity}')
    out = bench_serving.read(path)
    assert {n for n, *_ in out.metrics} == {"request_throughput", "completed"}
    assert len(out.notes["non_finite_values_not_stored"]) == 2
