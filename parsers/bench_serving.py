"""Results JSON of `sglang.bench_serving` and vLLM `benchmark_serving` -> run_metrics rows, no events.

A file is one JSON object (vLLM `--save-result`), an array of them, or JSON Lines with one object per
run (SGLang `--output-file` appends a line per run). Each run is one item read. Its numeric
top-level values become `run_metrics` rows: `mean_ttft_ms` -> `ttft_mean` (ms), `p99_itl_ms` ->
`itl_p99`, `mean_e2el_ms` / `mean_e2e_latency_ms` -> `e2e_latency_mean`; every other number keeps
its key (`request_throughput` req/s, `output_throughput` tok/s, `duration` s, `completed` count).
`args` holds the benchmark's own key, the run's index and its backend/model when stated. Text values
(backend, model, date) go to `runs.metadata.runs`; per-request arrays (`ttfts`, `itls`, `input_lens`,
`generated_texts`, ...) are not stored and are counted in `ingest_log.notes.per_request_arrays`.
A line that is not JSON, not an object, or holds no benchmark metric is skipped with that reason.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.errors import InputError
from tracekit.parsers.rows import Export

FORMAT = "bench_serving"
DESCRIPTION = "serving benchmark JSON"
SNIFF_BYTES = 1 << 16
# Keys both benchmarks write in every result; two of them make a file a benchmark result.
CORE_KEYS = ("request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
             "mean_itl_ms", "total_output_tokens", "completed")  # fmt: skip
LATENCY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el|e2e_latency)_ms$")
UNITS = (
    (re.compile(r"^request_(throughput|goodput)$|^request_rate$"), "req/s"),
    (re.compile(r"throughput"), "tok/s"),
    (re.compile(r"^duration$"), "s"),
    (re.compile(r"_ms$"), "ms"),
    (re.compile(r"^(completed|num_prompts|max_concurrency|total_\w+|concurrency|failed)$"), "count"),
)


def sniff(head: bytes, name: str, **_) -> bool:
    """JSON whose first object holds at least two keys every serving benchmark result has."""
    head = head[:SNIFF_BYTES]
    start = head.lstrip()[:1]
    if start not in (b"{", b"[") or b'"traceEvents"' in head or b'"resourceSpans"' in head:
        return False
    first = next((line for line in head.splitlines() if line.strip()), b"")
    try:
        obj = orjson.loads(first)
        if isinstance(obj, list):
            obj = obj[0] if obj else {}
        if isinstance(obj, dict):
            return "ts_ns" not in obj and sum(k in obj for k in CORE_KEYS) >= 2
    except orjson.JSONDecodeError:
        pass  # one object spread over lines, or a line longer than the sample: look for the keys
    return b'"ts_ns"' not in first and sum(f'"{k}"'.encode() in head for k in CORE_KEYS) >= 2


def _metric_name(key: str) -> str:
    m = LATENCY.match(key)
    if not m:
        return key
    stat, what = m.groups()
    what = "e2e_latency" if what in ("e2el", "e2e_latency") else what
    return f"{what}_{stat}"


def _unit(key: str) -> str:
    return next((unit for pattern, unit in UNITS if pattern.search(key)), "")


def _loads(data: bytes):
    """JSON, or None; Python's json.dump writes NaN/Infinity (a std over no requests), which orjson refuses."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        # Python's decoder passes lone surrogates (an escaped one, or one encoded in the bytes) through
        return _valid_text(json.loads(data))
    except (ValueError, RecursionError):
        return None


def _finite(number) -> bool:
    """Whether a JSON number is one a double holds (an integer of 400 digits is not)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _valid_text(value):
    """`value` with every string made valid UTF-8 (a lone surrogate becomes '?')."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode()
    if isinstance(value, dict):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_text(v) for v in value]
    return value


def _runs(path: Path, data: bytes, out: Export) -> list:
    """(line number, object) of every run; bad lines counted in out.skipped."""
    whole = _loads(data)
    if isinstance(whole, dict):
        out.read["result run"] += 1
        return [(1, whole)]
    if isinstance(whole, list):
        runs = []
        for obj in whole:
            out.read["result run"] += 1
            if isinstance(obj, dict):
                runs.append((1, obj))
            else:
                out.skipped["not a JSON object"] += 1
        return runs
    runs = []
    for line_no, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        out.read["result run"] += 1
        obj = _loads(line)
        if obj is None:
            out.skipped["malformed JSON line"] += 1
            continue
        if not isinstance(obj, dict):
            out.skipped["not a JSON object"] += 1
            continue
        runs.append((line_no, obj))
    return runs


def read(path: Path, **_) -> Export:
    path = Path(path)
    data = compression.read_bytes(path)
    if not data.strip():
        raise InputError(path, "byte 0", "a serving benchmark result (JSON object or JSON Lines), got an empty file")
    out = Export(source=path, format=FORMAT, bytes_read=len(data))
    arrays: dict = {}
    non_finite: list = []
    described = []
    for index, (line_no, obj) in enumerate(_runs(path, data, out)):
        numbers = {k: v for k, v in obj.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not any(k in obj for k in CORE_KEYS) or not numbers:
            out.skipped["object without benchmark metrics"] += 1
            continue
        texts = {k: v for k, v in obj.items() if isinstance(v, str) and len(v) <= 256}
        context = {k: texts[k] for k in ("backend", "model_id", "tokenizer_id", "dataset_name", "date") if k in texts}
        for key in [k for k, v in numbers.items() if not _finite(v)]:
            non_finite.append(f"run {index}: {key} = {numbers.pop(key)}")
        for key, value in numbers.items():
            args = {"key": key, "run": index, "line": line_no, **context}
            out.metrics.append((_metric_name(key), float(value), _unit(key), orjson.dumps(args).decode()))
        for key, value in obj.items():
            if isinstance(value, list):
                arrays[key] = arrays.get(key, 0) + len(value)
        described.append({"run": index, "line": line_no, **texts})
    out.notes = {
        "unit": "one benchmark run (a JSON object)",
        "metrics": len(out.metrics),
        "per_request_arrays": {k: f"{n} values not stored" for k, n in arrays.items()},
        "non_finite_values_not_stored": non_finite,
        "clock": "no events: a benchmark result states run-level quantities only",
    }
    out.metadata = {"runs": described}
    return out
