"""Mutated inputs of every format tracekit reads, through ingest and analyze: no traceback, no hang.

    python scripts/fault_campaign.py                      # 40 cases per format, seed 1
    python scripts/fault_campaign.py --cases 200 --seed 7 --workers 2 --cli 5 --keep /tmp/campaign

Seeds are small real files (../shared/corpus, sample_traces, tests/data) or the head of a big one cut
where a record ends. Each case applies one mutation of one class (absurd numbers: 1e30, NaN,
Infinity, INT64 min/max, integers beyond 64 and 128 bits, 400-digit literals; a phase that is a list
or an object; deep nesting; lone surrogates and invalid UTF-8; CSV rows with an extra or a missing
field, a field over 128 KB, a bad quote; text in integer columns, a corrupt sqlite_master, epoch
values that overflow and missing tables or columns in Nsight Systems exports; corrupt gzip members;
protobuf varint garbage; truncation; byte flips) and goes through `tracekit.open` and the analysis,
in a worker process with a time limit. An outcome is one of

- ok: ingested, and every ingest_log row holds events read = ingested + skipped;
- error: a TracekitError of one line that names the file (the CLI's exit 2);
- bad error: a TracekitError that does not name the file or spans lines;
- traceback: any other exception (the CLI's exit 1 with a traceback);
- hang: over the time limit.

`--cli N` also runs N cases per format through the console script (`tracekit ingest`, `tracekit
analyze`), where exit 0 or 2 with one line on stderr is right. The figures per format: cases,
outcomes, and the workers' peak RSS (one fresh worker per format).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import multiprocessing
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACEKIT_CORPUS", ROOT.parent / "shared" / "corpus"))
SAMPLES = ROOT / "sample_traces"
DATA = ROOT / "tests" / "data"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# numbers no profiler writes, as JSON literals (Python's decoder takes NaN and Infinity, as most do)
JSON_NUMBERS = ["1e30", "-1e30", "NaN", "Infinity", "-Infinity", str(INT64_MIN), str(INT64_MAX), str(2**64),
                str(2**128 + 1), "9" * 400, "1e400", "-1", "0", "1.5", "-0.0"]  # fmt: skip
JSON_OTHER = ['"inf"', '"12"', '"abc"', "null", "true", "[]", "{}", '["X"]', '{"a": 1}']
JSON_STRINGS = ['"\\ud800x"', '"\\udfff"', '"a\\u0000b"', '"' + "x" * 200_000 + '"', '""']
DEEP = ["[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000]
TEXT_NUMBERS = ["1e30", "-1e30", "nan", "NaN", "inf", "Infinity", "-inf", str(INT64_MIN), str(INT64_MAX), str(2**64),
                str(2**128 + 1), "9" * 400, "-1", "0", "1.5", "abc", "", "0x1f", "1,5"]  # fmt: skip
# words of the log lines the serving-log reader turns into events and counters
STATISTIC_WORDS = (b"batch", b"throughput", b"Finish:", b"Receive:", b"HTTP/", b"Engine")
INVALID_UTF8 = [b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\x80abc"]  # the third: a surrogate encoded as UTF-8


@dataclass
class Seed:
    format: str  # the reader the seed is for, and the label of its figures
    path: Path
    kind: str  # json, jsonl, csv, text, sqlite, proto, parquet: which mutations apply
    gzip: bool = False  # the mutated content is written gzip-compressed, and gzip mutations apply too
    head: int | None = None  # bytes of a big seed to keep, cut where a record ends
    trace: Path | None = None  # a trace the mutated log is given with (it joins that run)


def seeds() -> list[Seed]:
    corpus = [
        Seed("kineto", CORPUS / "hta__cuda_event_sync_multi_stream__event_sync_trace.json.gz", "json"),
        Seed("kineto", CORPUS / "kineto__docs_traces__before_fix_trace.json", "json"),
        Seed("kineto", CORPUS / "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz", "json"),
        Seed("kineto", SAMPLES / "node_trace_events.json.gz", "json"),
        Seed("kineto_gz", CORPUS / "hta__triton_example.json.gz", "json", gzip=True),
        Seed("kineto_gz", CORPUS / "hta__cuda_event_sync_multi_stream__event_sync_trace.json.gz", "json", gzip=True),
        Seed("nsys_sqlite", CORPUS / "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite", "sqlite"),
        Seed("nsys_sqlite", CORPUS / "pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite", "sqlite"),
        Seed("nsys_stats_csv", CORPUS / "pipit__nbody-nvtx__trace.csv", "csv"),
        Seed("perfetto_proto", CORPUS / "perfetto__nested_tracks.perfetto-trace", "proto"),
        Seed("perfetto_proto", CORPUS / "pftx__example.pftrace", "proto", head=60_000),
        Seed("perfetto_proto", SAMPLES / "chromium_startup.pftrace.gz", "proto", head=150_000),
        Seed("ncu_csv", CORPUS / "esmm__metrics.csv", "csv"),
        Seed("ncu_csv", SAMPLES / "ncu_tiles_hoisted_heavy.csv", "csv"),
        Seed("ncu_csv", DATA / "ncu_matrix" / "decode_512.details.csv", "csv", head=40_000),
        Seed("numerics_report", SAMPLES / "numerics_tf32.csv", "csv"),
        Seed("numerics_report", DATA / "numerics_matrix" / "fla_style.csv", "csv"),
        Seed("numerics_report", DATA / "numerics_matrix" / "seqlen_style.jsonl", "jsonl"),
        Seed("numerics_report", SAMPLES / "numerics_tf32.csv", "parquet"),
        Seed("runtime_events", SAMPLES / "runtime_demo.events.jsonl", "jsonl"),
        Seed("runtime_events", SAMPLES / "runtime_demo.events.jsonl", "jsonl", trace=SAMPLES / "runtime_demo.json.gz"),
        Seed("serving_log", CORPUS / "energyllm__vllm_server.log", "text"),
        Seed("serving_log", CORPUS / "sglsetup__sglang.log", "text", head=120_000),
        Seed("otlp_json", DATA / "serving" / "otlp_requests.jsonl", "jsonl"),
        Seed("bench_serving", DATA / "serving" / "sglang_bench_serving.jsonl", "jsonl"),
        Seed("bench_serving", DATA / "serving" / "vllm_benchmark_serving.json", "json"),
    ]
    return [s for s in corpus if s.path.exists() and (s.trace is None or s.trace.exists())]


def content(seed: Seed, workdir: Path) -> bytes:
    """The seed's bytes, decompressed, cut to its head where a record ends; a Parquet seed is made
    from its CSV."""
    if seed.kind == "parquet":
        import duckdb

        out = workdir / "seed.parquet"
        duckdb.sql(f"COPY (SELECT * FROM read_csv_auto('{seed.path}')) TO '{out}' (FORMAT parquet)")
        return out.read_bytes()
    raw = seed.path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if seed.head and len(raw) > seed.head:
        raw = _proto_head(raw, seed.head) if seed.kind == "proto" else raw[: raw.rfind(b"\n", 0, seed.head) + 1]
    return raw


# ---- mutations: each takes (rng, data) and returns the mutated bytes and a label ----


def _replace_node(rng, doc, pick, literal: str) -> str:
    """`doc` dumped with one node that `pick` chooses (from (path, value) pairs) written as `literal`."""
    nodes = list(_nodes(doc))
    chosen = pick(nodes) if nodes else None
    if chosen is None:
        return json.dumps(doc)
    marker = "@@MUTATION@@"
    _set(doc, chosen, marker)
    return json.dumps(doc).replace(json.dumps(marker), literal, 1)


def _nodes(doc, path=()):
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _nodes(v, (*path, i))


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _choose(rng, kinds, key=None):
    def pick(nodes):
        found = [p for p, v in nodes if p and isinstance(v, kinds) and not isinstance(v, bool)
                 and (key is None or p[-1] == key)]  # fmt: skip
        return rng.choice(found) if found else None

    return pick


def _json_doc_mutations():
    number = (int, float)
    return {
        "number": lambda rng, doc: _replace_node(rng, doc, _choose(rng, number), rng.choice(JSON_NUMBERS)),
        "number->other": lambda rng, doc: _replace_node(rng, doc, _choose(rng, number), rng.choice(JSON_OTHER)),
        "ts": lambda rng, doc: _replace_node(rng, doc, _choose(rng, number, rng.choice(["ts", "ts_ns", "dur", "dur_ns"])),
                                             rng.choice(JSON_NUMBERS + JSON_OTHER)),  # fmt: skip
        "ph": lambda rng, doc: _replace_node(rng, doc, _choose(rng, str, "ph"), rng.choice(JSON_OTHER + ['"Z"', "7"])),
        "string": lambda rng, doc: _replace_node(rng, doc, _choose(rng, str), rng.choice(JSON_STRINGS + JSON_NUMBERS[:4])),
        "container": lambda rng, doc: _replace_node(rng, doc, _choose(rng, (dict, list)), rng.choice(DEEP + JSON_OTHER)),
        "end-overflow": _end_overflow,
        "b/e-nan": _begin_end_nan,
    }  # fmt: skip


def _events(doc):
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return events if isinstance(events, list) else None


def _end_overflow(rng, doc):
    """An event whose ts and dur fit INT64 each, but not their sum (nor in ns)."""
    events = _events(doc)
    timed = [e for e in events or [] if isinstance(e, dict) and "ts" in e]
    if not timed:
        return _replace_node(rng, doc, _choose(rng, (int, float)), str(INT64_MAX))
    event = rng.choice(timed)
    event["ts"], event["dur"] = rng.choice(
        [(INT64_MAX // 1000, INT64_MAX // 1000), (INT64_MAX - 5, 10), (9.2e15, 9.2e15)]
    )
    event.setdefault("ph", "X")
    return json.dumps(doc)


def _begin_end_nan(rng, doc):
    """A B/E pair of which one or both times are NaN (or infinite)."""
    events = _events(doc)
    if events is None:
        return json.dumps(doc)
    ts = rng.choice(["NaN", "Infinity", "-Infinity", "1e30"])
    begin = {"ph": "B", "name": "@@", "pid": 1, "tid": 1, "ts": "@B@"}
    end = {"ph": "E", "name": "@@", "pid": 1, "tid": 1, "ts": "@E@"}
    events.insert(rng.randrange(len(events) + 1), begin)
    events.insert(rng.randrange(len(events) + 1), end)
    text = json.dumps(doc)
    first, second = (ts, rng.choice([ts, "100"])) if rng.random() < 0.5 else (rng.choice(["100", ts]), ts)
    return text.replace('"@B@"', first, 1).replace('"@E@"', second, 1)


def _json_mutation(rng, data: bytes, jsonl: bool):
    name, mutate = rng.choice(sorted(_json_doc_mutations().items()))
    if not jsonl:
        return mutate(rng, json.loads(data)).encode("utf-8", "surrogatepass"), f"json:{name}"
    lines = data.splitlines(keepends=True)
    index = rng.choice([i for i, line in enumerate(lines) if line.strip()] or [0])
    mutated = mutate(rng, json.loads(lines[index])).encode("utf-8", "surrogatepass")
    lines[index] = mutated + b"\n"
    return b"".join(lines), f"jsonl:{name}"


def _text_number(rng, data: bytes):
    """A number in the text, wherever it stands, replaced by one no producer writes."""
    found = list(re.finditer(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", data))
    if not found:
        return data, "text:number(none)"
    m = rng.choice(found)
    return data[: m.start()] + rng.choice(TEXT_NUMBERS).encode() + data[m.end() :], "text:number"


def _field_number(rng, data: bytes):
    """A number written as a field's value (`#new-token: 7`, `'e2e_latency': 0.5`, `ts=12`), the ones a
    log reader parses, replaced by one no producer writes."""
    found = list(re.finditer(rb"(?<=[:=] )-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<=[:=])-?\d+(?:\.\d+)?", data))
    line = lambda m: data[data.rfind(b"\n", 0, m.start()) + 1 : data.find(b"\n", m.end())]  # noqa: E731
    statistics = [m for m in found if any(word in line(m) for word in STATISTIC_WORDS)]
    if not found:
        return _text_number(rng, data)
    m = rng.choice(statistics or found)
    literal = rng.choice(TEXT_NUMBERS + ["1e400", "1.2.3", "9" * 25])
    return data[: m.start()] + literal.encode() + data[m.end() :], "text:field-number"


def _invalid_utf8(rng, data: bytes):
    found = list(re.finditer(rb"[A-Za-z_]{3,}", data))
    pos = rng.choice(found).start() + 1 if found else rng.randrange(len(data) + 1)
    return data[:pos] + rng.choice(INVALID_UTF8) + data[pos:], "text:invalid-utf8"


def _long_line(rng, data: bytes):
    lines = data.splitlines(keepends=True) or [b""]
    i = rng.randrange(len(lines))
    lines[i] = lines[i].rstrip(b"\r\n") + b"x" * 200_000 + b"\n"
    return b"".join(lines), "text:long-line"


def _truncate(rng, data: bytes):
    return data[: rng.randrange(1, max(2, len(data)))], "truncate"


def _flip(rng, data: bytes):
    data = bytearray(data)
    for _ in range(rng.choice([1, 3, 10])):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data), "byte-flips"


def _csv_mutation(rng, data: bytes):
    text = data.decode("utf-8", "surrogateescape")
    quoted = text.lstrip().startswith('"')
    rows = list(csv.reader(io.StringIO(text)))
    body = [i for i, r in enumerate(rows) if r][1:] or [0]
    i = rng.choice(body)
    row = rows[i] if rows else []
    kind = rng.choice(["extra-field", "missing-field", "huge-field", "number", "bad-quote", "blank-cells",
                       "duplicate-header", "invalid-utf8"])  # fmt: skip
    if kind == "bad-quote":
        lines = text.splitlines(keepends=True)
        j = rng.randrange(len(lines)) if lines else 0
        if lines:
            k = rng.randrange(len(lines[j]) + 1)
            lines[j] = lines[j][:k] + '"' + lines[j][k:]
        return "".join(lines).encode("utf-8", "surrogateescape"), "csv:bad-quote"
    if kind == "invalid-utf8":
        mutated, _ = _invalid_utf8(rng, data)
        return mutated, "csv:invalid-utf8"
    if kind == "extra-field":
        row.insert(rng.randrange(len(row) + 1), rng.choice(["x", "1", ""]))
    elif kind == "missing-field" and row:
        del row[rng.randrange(len(row))]
    elif kind == "huge-field" and row:
        row[rng.randrange(len(row))] = "7" * 140_000 if rng.random() < 0.5 else "x" * 140_000
    elif kind == "number" and row:
        numeric = [k for k, v in enumerate(row) if re.fullmatch(r"-?[\d.,]+(e[-+]?\d+)?", v.strip())] or list(
            range(len(row))
        )
        row[rng.choice(numeric)] = rng.choice(TEXT_NUMBERS)
    elif kind == "blank-cells":
        rows[i] = [""] * len(row)
    elif kind == "duplicate-header" and rows:
        rows.insert(i, list(rows[0]))
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL if quoted else csv.QUOTE_MINIMAL, lineterminator="\n").writerows(rows)
    return out.getvalue().encode("utf-8", "surrogateescape"), f"csv:{kind}"


# ---- protobuf: the Trace message is `repeated TracePacket packet = 1` ----


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            return value, pos


def _packets(data: bytes) -> list[tuple[int, int, int]]:
    """(start of the tag, start of the payload, end) of each top-level packet."""
    out, pos = [], 0
    while pos < len(data) and data[pos] == 0x0A:
        length, payload = _read_varint(data, pos + 1)
        out.append((pos, payload, payload + length))
        pos = payload + length
    return out


def _proto_head(data: bytes, size: int) -> bytes:
    ends = [end for _, _, end in _packets(data) if end <= size]
    return data[: ends[-1]] if ends else data[:size]


def _proto_mutation(rng, data: bytes):
    packets = _packets(data)
    if not packets:
        return _flip(rng, data)
    tag, payload, end = rng.choice(packets)
    body = data[payload:end]
    kind = rng.choice(["varint-garbage", "huge-length", "timestamp", "inner-flips", "inner-truncate", "packet-cut"])
    if kind == "huge-length":  # the packet claims more bytes than the file holds
        return data[:tag] + b"\x0a" + _varint(rng.choice([2**31, 2**62, len(data) * 3])) + data[
            payload:
        ], "proto:huge-length"
    if kind == "packet-cut":
        return data[: rng.randrange(payload, end + 1)], "proto:packet-cut"
    if kind == "varint-garbage":  # eleven continuation bytes: longer than any varint
        k = rng.randrange(len(body) + 1)
        body = body[:k] + b"\xff" * rng.choice([10, 11, 20]) + rng.choice([b"\x01", b""]) + body[k:]
    elif kind == "timestamp":  # TracePacket.timestamp (field 8, varint) set to the u64 limits
        value = rng.choice([2**64 - 1, 2**63, INT64_MAX, 2**63 - 2])
        body = (
            b"\x40"
            + _varint(value)
            + (body[1 + len(_varint(_read_varint(body, 1)[0])) :] if body[:1] == b"\x40" else body)
        )
    elif kind == "inner-flips":
        body, _ = _flip(rng, body)
    elif kind == "inner-truncate":
        body = body[: rng.randrange(len(body) + 1)]
    return data[:tag] + b"\x0a" + _varint(len(body)) + body + data[end:], f"proto:{kind}"


# ---- Nsight Systems SQLite exports ----


def _sqlite_mutation(rng, data: bytes, workdir: Path):
    path = workdir / f"m{rng.randrange(1 << 30)}.sqlite"
    path.write_bytes(data)
    kind = rng.choice(["text-in-int", "real-in-int", "int-extreme", "null", "blob", "epoch-overflow",
                       "end-before-start", "drop-table", "drop-column", "rename-column", "corrupt-master",
                       "empty-strings", "byte-flips", "truncate"])  # fmt: skip
    if kind in ("byte-flips", "truncate"):
        mutated, _ = (_flip if kind == "byte-flips" else _truncate)(rng, data)
        path.unlink()
        return mutated, f"sqlite:{kind}"
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        used = [t for t in tables if t.startswith(("CUPTI", "NVTX", "StringIds", "TARGET_INFO", "ThreadNames",
                                                   "OSRT", "CUDA", "ProcessStreams", "META"))] or tables  # fmt: skip
        full = [t for t in used if con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]] or used
        table = rng.choice(full)
        info = con.execute(f'PRAGMA table_info("{table}")').fetchall()
        columns = [(r[1], r[2].upper()) for r in info if not r[5]]  # a key column refuses other types
        columns = columns or [(r[1], r[2].upper()) for r in info]
        ints = [c for c, t in columns if "INT" in t] or [c for c, _ in columns]
        column = rng.choice(ints)
        row = f'rowid = (SELECT rowid FROM "{table}" ORDER BY random() LIMIT 1)'
        value = {
            "text-in-int": rng.choice(["abc", "", "12abc", "1e30", "NaN"]),
            "real-in-int": rng.choice([1e30, -1e30, 1.5, float("inf"), 9.3e18]),
            "int-extreme": rng.choice([INT64_MAX, INT64_MIN, INT64_MAX - 1]),
            "null": None,
            "blob": b"\x00\xff",
        }
        if kind in value:
            con.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE {row}', [value[kind]])
        elif kind == "epoch-overflow":
            for t in [t for t in tables if "TIME" in t.upper() or t.startswith("TARGET_INFO")] or [table]:
                for c, _ in con.execute(f'PRAGMA table_info("{t}")').fetchall():
                    if any(w in c.lower() for w in ("epoch", "time", "start", "ns")):
                        con.execute(f'UPDATE "{t}" SET "{c}" = ?', [rng.choice([INT64_MAX, INT64_MIN, 2**62])])
        elif kind == "end-before-start":
            cols = {c for c, _ in columns}
            if {"start", "end"} <= cols:
                con.execute(
                    f'UPDATE "{table}" SET "end" = "start" - ? WHERE {row}', [rng.choice([1, 10**12, INT64_MAX])]
                )
            else:
                con.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE {row}', [INT64_MAX])
        elif kind == "drop-table":
            con.execute(f'DROP TABLE "{table}"')
        elif kind in ("drop-column", "rename-column"):
            try:
                verb = (
                    f'DROP COLUMN "{column}"' if kind == "drop-column" else f'RENAME COLUMN "{column}" TO "{column}_x"'
                )
                con.execute(f'ALTER TABLE "{table}" {verb}')
            except sqlite3.Error:  # a column in an index or a key cannot be dropped: rename the table instead
                con.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_gone"')
        elif kind == "corrupt-master":
            con.execute("PRAGMA writable_schema = ON")
            con.execute(
                "UPDATE sqlite_master SET sql = ? WHERE name = ?",
                [rng.choice(["garbage", "CREATE TABLE x(", ""]), table],
            )
        elif kind == "empty-strings":
            for t in [t for t in tables if t.startswith("StringIds")] or [table]:
                con.execute(f'DELETE FROM "{t}"')
        con.commit()
        label = f"sqlite:{kind}:{table}.{column}" if kind in value or kind.endswith("column") else f"sqlite:{kind}"
        con.close()
        return path.read_bytes(), label
    finally:
        con.close()
        path.unlink()


# ---- gzip: the content as two members, then broken where a reader meets it mid-stream ----


def _gzip_mutation(rng, data: bytes):
    half = len(data) // 2
    first, second = gzip.compress(data[:half], mtime=0), gzip.compress(data[half:], mtime=0)
    stream = first + second
    kind = rng.choice(["member-flips", "cut-mid-member", "bad-crc", "bad-size", "trailing-garbage",
                       "second-header", "zero-fill"])  # fmt: skip
    mid = len(first) + rng.randrange(10, max(11, len(second) - 8))  # inside the second member's deflate data
    if kind == "member-flips":
        stream = stream[:mid] + bytes(rng.randrange(256) for _ in range(4)) + stream[mid + 4 :]
    elif kind == "cut-mid-member":
        stream = stream[: rng.choice([mid, rng.randrange(10, len(first))])]
    elif kind == "bad-crc":
        stream = stream[: len(first) - 8] + b"\0\0\0\0" + stream[len(first) - 4 :]
    elif kind == "bad-size":
        stream = stream[:-4] + b"\xff\xff\xff\x7f"
    elif kind == "trailing-garbage":
        stream += rng.choice([b"\0" * 100, b"garbage", b"\x1f\x8b\x08\x00junk"])
    elif kind == "second-header":
        stream = first + b"\x1f\x8b\x09" + second[3:]
    elif kind == "zero-fill":
        stream = stream[:mid] + b"\0" * 512 + stream[mid + 512 :]
    return stream, f"gzip:{kind}"


def mutate(rng, seed: Seed, data: bytes, workdir: Path) -> tuple[bytes, str]:
    """One mutation of the seed's content, of a class picked for its kind, and its label."""
    generic = [_truncate, _flip]
    if seed.kind in ("json", "jsonl"):
        classes = (
            [lambda r, d: _json_mutation(r, d, seed.kind == "jsonl")] * 6 + [_text_number, _invalid_utf8] + generic
        )
    elif seed.kind == "csv":
        classes = [_csv_mutation] * 5 + [_text_number, _long_line] + generic
    elif seed.kind == "text":
        classes = [_field_number] * 4 + [_text_number, _invalid_utf8, _long_line] + generic
    elif seed.kind == "proto":
        classes = [_proto_mutation] * 4 + generic
    elif seed.kind == "sqlite":
        classes = [lambda r, d: _sqlite_mutation(r, d, workdir)]
    else:
        classes = generic
    try:
        mutated, label = rng.choice(classes)(rng, data)
    except (sqlite3.Error, ValueError, IndexError, RecursionError):  # a mutation the content does not allow
        mutated, label = _flip(rng, data)
    if seed.gzip:
        if rng.random() < 0.5:
            return _gzip_mutation(rng, mutated if rng.random() < 0.3 else data)
        return gzip.compress(mutated, mtime=0), f"gz({label})"
    return mutated, label


# ---- running a case ----


@dataclass
class Case:
    format: str
    label: str
    path: Path
    trace: Path | None = None

    @property
    def inputs(self) -> list[str]:
        return [str(p) for p in (self.trace, self.path) if p is not None]


@dataclass
class Outcome:
    case: Case
    kind: str  # ok, error, bad error, traceback, hang
    detail: str = ""
    rss_kb: int = 0


# where each format's ingested items land, for the formats where one item is one row (Chrome B/E
# pairs become one event, so a Kineto run holds at most what it ingested)
HELD = {"nsys_sqlite": "events", "nsys_stats_csv": "events", "otlp_json": "events", "runtime_events": "events",
        "ncu_csv": "ncu_metrics", "numerics_report": "numerics", "kineto": "events"}  # fmt: skip


def _unreconciled(trace) -> str:
    """What breaks events read = ingested + skipped, or ingested = the rows the run holds; '' if nothing."""
    rows = trace.sql("SELECT source, format, events_read, events_ingested, events_skipped FROM ingest_log").fetchall()
    for source, fmt, read, ingested, skipped in rows:
        if read != ingested + skipped or min(read, ingested, skipped) < 0:
            return f"{source}: read {read}, ingested {ingested}, skipped {skipped}"
    runs = trace.sql("SELECT run_id, any_value(r.format), sum(events_ingested) FROM ingest_log "
                     "JOIN runs r USING (run_id) GROUP BY run_id").fetchall()  # fmt: skip
    for run_id, fmt, ingested in runs:
        if fmt not in HELD:
            continue
        held = trace.sql(f"SELECT count(*) FROM {HELD[fmt]} WHERE run_id = {run_id}").fetchall()[0][0]
        if held > ingested or (held != ingested and fmt != "kineto"):
            return f"run {run_id} ({fmt}): ingested {ingested}, holds {held} rows in {HELD[fmt]}"
    return ""


def run_case(inputs: list[str], name: str) -> tuple[str, str]:
    """(outcome, detail) of ingesting and analysing `inputs` in this process; `name` is the mutated file's."""
    import tracekit
    from tracekit.errors import TracekitError
    from tracekit.render.report import render

    try:
        with tracekit.open(*inputs) as trace:
            broken = _unreconciled(trace)
            if broken:
                return "traceback", f"reconciliation: {broken}"
            trace.analysis()
            render(trace.report_document(), "json", io.StringIO())
            trace.feedback(budget_tokens=800)
        return "ok", ""
    except TracekitError as e:
        message = str(e)
        if "\n" in message or name not in message:
            return "bad error", message[:300]
        return "error", message[:200]
    except Exception as e:  # the outcome a user sees as a traceback
        frames = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames)
                      if "/tracekit/" in f.filename or "/parsers/" in f.filename), "?")  # fmt: skip
        return "traceback", f"{type(e).__name__} at {where}: {' '.join(str(e).split())[:200]}"


def _worker(conn) -> None:
    import resource

    while True:
        job = conn.recv()
        if job is None:
            return
        kind, detail = run_case(*job)
        conn.send((kind, detail, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


class Workers:
    """Worker processes that run cases, each killed and replaced when a case overruns its limit."""

    def __init__(self, count: int, limit: float) -> None:
        self.limit = limit
        self.context = multiprocessing.get_context("spawn")
        self.idle = [self._start() for _ in range(count)]

    def _start(self):
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_worker, args=(child,), daemon=True)
        process.start()
        return process, parent

    def run(self, cases: list[Case]) -> list[Outcome]:
        todo, busy, done = list(cases), {}, []
        while todo or busy:
            while todo and self.idle:
                worker, case = self.idle.pop(), todo.pop(0)
                worker[1].send((case.inputs, case.path.name))
                busy[worker[1]] = (worker, case, time.monotonic())
            ready = wait(list(busy), timeout=0.5)
            for conn in ready:
                worker, case, _ = busy.pop(conn)
                try:
                    kind, detail, rss = conn.recv()
                except EOFError:  # the worker died: a crash in native code
                    kind, detail, rss = "traceback", "worker died", 0
                    worker = self._replace(worker)
                done.append(Outcome(case, kind, detail, rss))
                self.idle.append(worker)
            now = time.monotonic()
            for conn, (worker, case, started) in list(busy.items()):
                if now - started > self.limit:
                    busy.pop(conn)
                    done.append(Outcome(case, "hang", f"over {self.limit:.0f} s"))
                    self.idle.append(self._replace(worker))
        return done

    def _replace(self, worker):
        worker[0].kill()
        worker[0].join()
        return self._start()

    def close(self) -> None:
        for process, conn in self.idle:
            conn.send(None)
            process.join(5)


def cli_outcome(case: Case, tracekit_bin: str, workdir: Path, limit: float) -> Outcome:
    """The case through the console script: exit 0, or exit 2 with one line, for ingest and analyze."""
    for verb in (["ingest", *case.inputs, "--db", str(workdir / f"{case.path.name}.duckdb")],
                 ["analyze", *case.inputs, "-f", "json"]):  # fmt: skip
        try:
            p = subprocess.run([tracekit_bin, "-q", *verb], capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return Outcome(case, "hang", f"tracekit {verb[0]} over {limit:.0f} s")
        lines = p.stderr.strip().splitlines()
        if "Traceback" in p.stderr or p.returncode not in (0, 2):
            return Outcome(case, "traceback", f"tracekit {verb[0]}: exit {p.returncode}: {(lines or [''])[-1][:200]}")
        if p.returncode == 2 and (len(lines) != 1 or case.path.name not in lines[0]):
            return Outcome(case, "bad error", f"tracekit {verb[0]}: {p.stderr.strip()[:300]}")
    return Outcome(case, "ok" if p.returncode == 0 else "error")


@dataclass
class Figures:
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    peak_rss_kb: int = 0
    seconds: float = 0.0
    cli: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    results: list = field(default_factory=list)  # every in-process Outcome


def campaign(
    cases_per_format: int,
    seed: int,
    workdir: Path,
    workers: int = 2,
    limit: float = 60.0,
    cli_per_format: int = 0,
    tracekit_bin: str | None = None,
    formats=None,
) -> dict[str, Figures]:
    """Run the campaign; returns the figures per format (their `failures`: the tracebacks, bad
    errors and hangs, with the files that caused them, kept in `workdir`)."""
    rng = random.Random(seed)
    by_format: dict[str, list[Seed]] = {}
    for s in seeds():
        if formats is None or s.format in formats:
            by_format.setdefault(s.format, []).append(s)
    figures: dict[str, Figures] = {}
    for fmt, fmt_seeds in by_format.items():
        contents = [content(s, workdir) for s in fmt_seeds]
        cases = []
        for i in range(cases_per_format):
            k = i % len(fmt_seeds)
            s = fmt_seeds[k]
            data, label = mutate(rng, s, contents[k], workdir)
            suffix = (
                ".parquet" if s.kind == "parquet" else "".join(s.path.suffixes[-2:] if s.gzip else s.path.suffixes[-1:])
            )
            if s.gzip and not suffix.endswith(".gz"):
                suffix += ".gz"
            if not s.gzip and suffix == ".gz":
                suffix = "".join(s.path.suffixes[-2:-1])
            path = workdir / f"{fmt}_{i:04d}{suffix}"
            path.write_bytes(data)
            cases.append(Case(fmt, label, path, s.trace))
        started = time.monotonic()
        pool = Workers(workers, limit)
        try:
            outcomes = pool.run(cases)
        finally:
            pool.close()
        fig = Figures(cases=len(cases), seconds=time.monotonic() - started, results=outcomes)
        for o in outcomes:
            fig.outcomes[o.kind] += 1
            fig.peak_rss_kb = max(fig.peak_rss_kb, o.rss_kb)
            if o.kind in ("traceback", "bad error", "hang"):
                fig.failures.append(o)
        if tracekit_bin and cli_per_format:
            for case in rng.sample(cases, min(cli_per_format, len(cases))):
                o = cli_outcome(case, tracekit_bin, workdir, limit)
                fig.cli[o.kind] += 1
                if o.kind in ("traceback", "bad error", "hang"):
                    fig.failures.append(o)
        figures[fmt] = fig
    return figures


def report(figures: dict[str, Figures], out=sys.stdout) -> None:
    kinds = ["ok", "error", "bad error", "traceback", "hang"]
    out.write(
        f"{'format':<16} {'cases':>5} " + " ".join(f"{k:>9}" for k in kinds) + "  peak RSS   time   cli (ok/err/bad)\n"
    )
    total = Counter()
    for fmt, f in figures.items():
        total.update(f.outcomes)
        total["cases"] += f.cases
        cli = (
            f"{f.cli['ok']}/{f.cli['error']}/{f.cli['bad error'] + f.cli['traceback'] + f.cli['hang']}"
            if f.cli
            else "-"
        )
        out.write(f"{fmt:<16} {f.cases:>5} " + " ".join(f"{f.outcomes[k]:>9}" for k in kinds)
                  + f"  {f.peak_rss_kb / 1024:6.0f} MB {f.seconds:5.0f} s  {cli}\n")  # fmt: skip
    out.write(f"{'all':<16} {total['cases']:>5} " + " ".join(f"{total[k]:>9}" for k in kinds) + "\n")
    for f in figures.values():
        for o in f.failures:
            out.write(f"{o.kind}: {o.case.path} [{o.case.label}] {o.detail}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=40, help="cases per format")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a case may take")
    parser.add_argument("--cli", type=int, default=3, help="cases per format also run through the console script")
    parser.add_argument("--format", action="append", help="only this format (repeatable)")
    parser.add_argument("--keep", type=Path, help="folder for the mutated files (default: a temporary one)")
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="tracekit-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    tracekit_bin = shutil.which("tracekit") or str(Path(sys.executable).with_name("tracekit"))
    try:
        figures = campaign(
            args.cases, args.seed, workdir, args.workers, args.limit, args.cli, tracekit_bin, args.format
        )
        report(figures)
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(1 if any(f.failures for f in figures.values()) else 0)


if __name__ == "__main__":
    main()
