"""Plain-text logs of SGLang and vLLM servers -> counter rows of their batch statistics.

Every line is read (split on `\\n` only: progress bars redraw with `\\r` inside one line); ANSI colour
codes and a trailing `\\r` (CRLF) are removed first. What becomes a row:

- SGLang `Prefill batch` / `Decode batch` lines (`, ` or `. ` after the word `batch`, any set of
  `key: number` fields, so new fields of later versions are kept) -> one counter (ph `C`) named
  `sglang.prefill_batch` / `sglang.decode_batch`;
- vLLM periodic `Avg prompt throughput: ..., Running: N reqs, ...` lines -> one counter
  `vllm.engine_stats`, on tid = the engine number (`Engine 000:`);
- SGLang request lines: `Receive: obj=...rid='...'` -> an instant `sglang.request_received`;
  `Finish: ... meta_info` -> a complete event `sglang.request` from `request_received_ts` lasting
  `e2e_latency` (token counts and latencies in args), else an instant at the line's time;
  timestamped HTTP access lines -> an instant `http.request`.

Series names are the field names in snake case without `#`, with `_tok_s` for token/s fields and
`_pct` for percentages (`gen_throughput_tok_s`, `queue_req`, `gpu_kv_cache_usage_pct`).
Quantities the server states once (KV cache size in tokens, maximum concurrency) go to
run_metrics. Every other line is skipped with its reason, so lines read = ingested + skipped.

Clock: SGLang writes `[YYYY-MM-DD hh:mm:ss]`, vLLM `LEVEL mm-dd hh:mm:ss` without a year; the year
comes from the first full date in the file (other libraries log them), else 1970 is assumed (noted).
Times are read as UTC and become epoch ns (second resolution; fractions kept when written).
"""

from __future__ import annotations

import calendar
import math
import re
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.parsers.rows import Export

FORMAT = "serving_log"
DESCRIPTION = "SGLang/vLLM server log"
ATTACHABLE = True  # joins a trace's run, shifted onto its clock by comparing the two time windows
SNIFF_BYTES = 1 << 20

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# `[2026-02-09 14:38:13]`, `[2026-02-09 14:38:13.123 DP0 TP0]`: SGLang
SGL_TS = re.compile(r"\[(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(\.\d+)?(?: ([^\]]*))?\]")
# `INFO 11-05 11:26:50 [file.py:12]`: vLLM (the level and the source location frame the date)
# (before 0.7 without the bracket: `INFO 08-01 10:00:00 metrics.py:341] ...`)
VLLM_TS = re.compile(
    r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(\.\d+)? +\[?[\w./-]+:\d+\]"
)
FULL_DATE = re.compile(r"(?:^|\[)(\d{4})-(\d{2})-(\d{2})[ T]\d{2}:\d{2}")
# glog / absl (`I0209 14:38:38.388363 24482 f.cc:80]`, `[W1105 ...`): timestamped, never statistics
GLOG_TS = re.compile(r"^\[?(?:\w+\]:\[)?[IWEF]\d{4} \d{2}:\d{2}:\d{2}")
SGL_BATCH = re.compile(r"\b(Prefill|Decode) batch[.,]? ")
VLLM_STATS = re.compile(r"(?:Engine (\d+): )?(Avg prompt throughput: .*)")
PROC = re.compile(r"^\((\w+)(?: pid=(\d+))?\) ")
FIELD = re.compile(r"^\s*([^:]+?):\s*(-?[\d,]*\.?\d+(?:[eE][-+]?\d+)?|True|False)\s*(%|tokens/s|reqs?)?\s*\.?\s*$")
# uvicorn's access line (`INFO:     127.0.0.1:63574 - "POST /generate HTTP/1.1" 200 OK`), not client requests
HTTP = re.compile(r'INFO:\s+\S+:\d+ - "(GET|POST|PUT|DELETE|HEAD|PATCH|OPTIONS) (\S+) HTTP/[\d.]+" (\d{3})')
RID = re.compile(r"\brid='([^']+)'")
META_NUM = re.compile(
    r"'(prompt_tokens|completion_tokens|cached_tokens|e2e_latency|queue_time|request_received_ts|"
    r"inference_time|prefill_launch_latency)': (-?[\d.]+(?:[eE][-+]?\d+)?)"
)
# Quantities stated once -> run_metrics (name, unit)
STATED = (
    (re.compile(r"GPU KV cache size: ([\d,]+) tokens"), "kv_cache_tokens", "tokens"),
    (re.compile(r"max_total_num_tokens=(\d+)"), "kv_cache_tokens", "tokens"),
    (re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"), "max_concurrency", "x"),
    (re.compile(r"Available KV cache memory: ([\d.]+) GiB"), "kv_cache_memory", "GiB"),
)


def _clean(raw: bytes) -> str:
    return ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\r")


def sniff(head: bytes, name: str, **_) -> bool:
    """A text log with an SGLang/vLLM timestamp prefix or statistics line; never JSON."""
    head = head[:SNIFF_BYTES]
    if b"\x00" in head[:4096] or head.lstrip()[:1] == b"{":
        return False
    lines = [_clean(x) for x in head.split(b"\n")[:2000]]
    for line in lines:
        if _sgl_batch(line) and SGL_TS.search(line) or _vllm_stats(line) and _vllm_ts(line):
            return True
    stamped = sum(1 for line in lines if SGL_TS.match(line) or _vllm_ts(line))
    return stamped >= 3 or bool(lines) and bool(SGL_TS.match(lines[0])) and stamped >= 1


def _slug(key: str, unit: str | None) -> str:
    key = key.strip().lower()
    tok_s = "(token/s)" in key or unit == "tokens/s"
    key = key.replace("(token/s)", "").replace("#", "")
    slug = re.sub(r"[^a-z0-9]+", "_", key).strip("_")
    return slug + ("_tok_s" if tok_s else "") + ("_pct" if unit == "%" else "")


def _fields(text: str) -> dict | None:
    """`a: 1, b c: 2.5%, cuda graph: True` -> {series: number}; None when a field is unreadable."""
    out = {}
    for part in text.split(", "):
        if not part.strip():
            continue
        m = FIELD.match(part)
        if not m:
            return None
        key, value, unit = m.groups()
        number = 1.0 if value == "True" else 0.0 if value == "False" else float(value.replace(",", ""))
        # a count beyond 64 bits stays a float: JSON args hold no wider integer
        whole = number.is_integer() and "." not in value and abs(number) < 2**63
        out[_slug(key, unit)] = int(number) if whole else number
    return out or None


class _Clock:
    def __init__(self, year: int | None):
        self.year, self.assumed = (year, False) if year else (1970, True)
        self.first_year = self.year
        self.last_month = None

    def sglang(self, m) -> int:
        y, mo, d, hh, mi, ss, frac = m.group(1, 2, 3, 4, 5, 6, 7)
        return _epoch_ns(int(y), int(mo), int(d), int(hh), int(mi), int(ss), frac)

    def vllm(self, m) -> int:
        mo, d, hh, mi, ss, frac = m.group(1, 2, 3, 4, 5, 6)
        if self.last_month is not None and int(mo) < self.last_month:
            self.year += 1  # a log running over new year
        self.last_month = int(mo)
        return _epoch_ns(self.year, int(mo), int(d), int(hh), int(mi), int(ss), frac)


def _epoch_ns(y, mo, d, hh, mi, ss, frac) -> int:
    seconds = calendar.timegm((y, mo, d, hh, mi, ss, 0, 0, 0))
    return seconds * 1_000_000_000 + (round(float(frac) * 1e9) if frac else 0)


def _row(kind, ph, name, ts, dur, pid, tid, args, line_no, track=None):
    extra = orjson.dumps({"line": line_no}).decode()
    return (kind, ph, "serving", name, ts, dur, pid, tid, track, None, None, None, None, None,
            orjson.dumps(args).decode(), extra)  # fmt: skip


# Request lines can be hundreds of KB (SGLang logs whole prompts): unanchored searches for patterns
# that start with a word boundary or an optional group cost ~0.1 ms per KB, so a cheap substring test
# or a bounded window decides first.
VLLM_TS_WINDOW = 200  # vLLM puts its level and time at the start, after the process prefix and colour codes


def _vllm_ts(line: str):
    return VLLM_TS.search(line, 0, VLLM_TS_WINDOW)


def _sgl_batch(line: str):
    return SGL_BATCH.search(line) if " batch" in line else None


def _vllm_stats(line: str):
    return VLLM_STATS.search(line) if "Avg prompt throughput: " in line else None


def read(path: Path, **_) -> Export:
    path = Path(path)
    data = compression.read_bytes(path)
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the last line opens no new one
    lines = [_clean(x) for x in raw_lines]
    year = next((int(m.group(1)) for line in lines if (m := FULL_DATE.search(line))), None)
    clock = _Clock(year)
    out = Export(source=path, format=FORMAT, bytes_read=len(data))
    servers, received, in_traceback = set(), {}, False
    for line_no, (raw, line) in enumerate(zip(raw_lines, lines), start=1):
        out.read["log line"] += 1
        reason = None
        if b"\x00" in raw:
            reason = "log line: binary (NUL bytes)"
        elif not line.strip():
            reason = "log line: blank"
        if reason:
            out.skipped[reason] += 1
            continue
        pid = None
        body = line
        if m := PROC.match(body):  # vLLM's `(APIServer pid=18908) ` prefix
            pid = int(m.group(2)) if m.group(2) else None
            body = body[m.end() :]
        sgl, vll = SGL_TS.search(body), _vllm_ts(body)
        ts = clock.sglang(sgl) if sgl else clock.vllm(vll) if vll else None
        if sgl or vll:
            in_traceback = False
            servers.add("sglang" if sgl else "vllm")
        if "Traceback (most recent call last)" in body:
            in_traceback = True
        if m := _sgl_batch(body):
            stage = m.group(1).lower()
            fields = _fields(body[m.end() :].rstrip().rstrip(","))
            if ts is None:
                out.skipped["log line: statistic without a timestamp"] += 1
            elif fields is None:
                out.skipped["log line: statistic with unreadable fields"] += 1
            else:
                tid = _rank(sgl.group(8) if sgl else None)
                out.rows.append(_row("counter", "C", f"sglang.{stage}_batch", ts, None, pid or 0, tid, fields, line_no))
            continue
        if m := _vllm_stats(body):
            fields = _fields(m.group(2).rstrip().rstrip("."))
            if ts is None:
                out.skipped["log line: statistic without a timestamp"] += 1
            elif fields is None:
                out.skipped["log line: statistic with unreadable fields"] += 1
            else:
                tid = int(m.group(1)) if m.group(1) else 0
                out.rows.append(_row("counter", "C", "vllm.engine_stats", ts, None, pid or 0, tid, fields, line_no))
            continue
        if ts is None:
            reason = (
                "log line: traceback" if in_traceback
                else "log line: progress bar" if "\r" in line or "it/s]" in line
                else "log line: HTTP access line without a timestamp (uvicorn)" if HTTP.search(body)
                else "log line: timestamp of another logger (glog/absl), not a statistic" if GLOG_TS.match(body)
                else "log line: no timestamp"
            )  # fmt: skip
            out.skipped[reason] += 1
            continue
        event = _request(body, ts, pid or 0, line_no, received)
        if event:
            out.rows.append(event)
            continue
        stated = next(((m, n, u) for pattern, n, u in STATED if (m := pattern.search(body))), None)
        if stated:
            m, name, unit = stated
            value = float(m.group(1).replace(",", ""))
            out.metrics.append((name, value, unit, orjson.dumps({"line": line_no, "text": m.group(0)}).decode()))
            out.notes.setdefault("metric_lines", []).append(line_no)
            continue
        out.skipped["log line: not a batch/throughput statistic"] += 1
    _notes(out, clock, servers, received)
    return out


def _rank(tags: str | None) -> int:
    """tid of an SGLang line: its DP rank (`[... DP1 TP0]`), else its TP rank, else 0."""
    if not tags:
        return 0
    for key in ("DP", "TP"):
        if m := re.search(rf"\b{key}(\d+)\b", tags):
            return int(m.group(1))
    return 0


def _request(body: str, ts: int, pid: int, line_no: int, received: dict):
    if "Receive: obj=" in body and (m := RID.search(body)):
        received[m.group(1)] = ts
        return _row("instant", "i", "sglang.request_received", ts, None, pid, 0, {"rid": m.group(1)}, line_no,
                    track="serving/requests")  # fmt: skip
    if "Finish: obj=" in body and (m := RID.search(body)):
        received.pop(m.group(1), None)
        texts = dict(META_NUM.findall(body))
        meta = {k: number for k, v in texts.items() if (number := _finite(v)) is not None}
        args = {"rid": m.group(1), **{k: v for k, v in meta.items() if k != "request_received_ts"}}
        start = texts.get("request_received_ts") if "request_received_ts" in meta else None
        if start is not None and meta.get("e2e_latency") is not None:
            # the request's own epoch-second times are finer than the line's whole seconds
            begin = _seconds_text_ns(start)
            # a track per request: concurrent requests must not nest under each other by time
            return _row("user_annotation", "X", "sglang.request", begin, round(meta["e2e_latency"] * 1e9), pid, 0,
                        args, line_no, track=f"serving/request/{m.group(1)}")  # fmt: skip
        return _row("instant", "i", "sglang.request_finished", ts, None, pid, 0, args, line_no,
                    track="serving/requests")  # fmt: skip
    if m := HTTP.search(body):
        args = {"method": m.group(1), "path": m.group(2), "status": int(m.group(3))}
        return _row("instant", "i", "http.request", ts, None, pid, 0, args, line_no, track="serving/http")
    return None


def _finite(text: str) -> float | None:
    """A number as a request's metadata writes it; None for one that is not (1.2.3) or is infinite."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _seconds_text_ns(text: str) -> int:
    """`1770647925.347417` (epoch seconds as written) -> ns, exactly (a double rounds at ~256 ns)."""
    if "e" in text.lower():
        return round(float(text) * 1e9)
    whole, _, frac = text.partition(".")
    return int(whole) * 1_000_000_000 + int((frac + "000000000")[:9])


def _notes(out: Export, clock: _Clock, servers: set, received: dict) -> None:
    clock_note = "epoch ns from the lines' timestamps, read as UTC (the lines state no time zone)"
    if "vllm" in servers:
        clock_note += f"; vLLM lines have no year: {clock.first_year} " + (
            "assumed (no full date in the file; a placeholder)" if clock.assumed else "from a full date in the file"
        )
    kinds: dict = {}
    for r in out.rows:
        kinds[r[3]] = kinds.get(r[3], 0) + 1
    out.notes.update({
        "clock": clock_note,
        "servers": sorted(servers),
        "rows_by_name": kinds,
        "unit": "one log line",
        "requests_without_finish": len(received),
        "ingested": "statistic and request lines become rows; lines stating a quantity once go to run_metrics",
    })  # fmt: skip
    out.metadata = {"servers": sorted(servers)}
