"""Mutated Chrome JSON traces through the console script: how many end in a traceback or a hang.

    python scripts/json_fault_campaign.py .venv/bin/tracekit /tmp/campaign

Each mutation writes one literal no profiler writes (1e30, NaN, Infinity, INT64 min, 400-digit
numbers, a phase that is a list or an object, a lone surrogate, args nested 5000 deep, ...) into one
field of one event of a small Kineto-shaped trace, for every event, and runs `tracekit ingest` and
`tracekit analyze` on it. Every outcome must be exit 0 (the event skipped with a reason) or exit 2
(one line); the script prints the counts and each traceback or hang.
"""

import collections
import json
import os
import subprocess
import sys

TK = sys.argv[1]
out = sys.argv[2]
os.makedirs(out, exist_ok=True)
base = {
    "traceEvents": [
        {
            "ph": "X",
            "name": "aten::mm",
            "cat": "cpu_op",
            "ts": 100.0,
            "dur": 50.0,
            "pid": 1,
            "tid": 1,
            "args": {"External id": 1},
        },
        {
            "ph": "X",
            "name": "cudaLaunchKernel",
            "cat": "cuda_runtime",
            "ts": 110.0,
            "dur": 5.0,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": 7},
        },
        {
            "ph": "X",
            "name": "gemm",
            "cat": "kernel",
            "ts": 120.0,
            "dur": 20.0,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": 7, "device": 0, "stream": 7},
        },
        {"ph": "B", "name": "step", "ts": 90.0, "pid": 1, "tid": 1},
        {"ph": "E", "name": "step", "ts": 200.0, "pid": 1, "tid": 1},
    ]
}


def variants():
    for field in ("ts", "dur"):
        for lit in (
            "1e30",
            "NaN",
            "Infinity",
            "-Infinity",
            "-9223372036854775808",
            "9" * 400,
            "1e400",
            "-1e30",
            '"12"',
            "null",
            "[]",
            "{}",
        ):
            yield f"{field}={lit[:12]}", field, lit
    for lit in ('["X"]', '{"a": 1}', "7", "null", '"Z"'):
        yield f"ph={lit}", "ph", lit
    yield "pid=huge", "pid", "9" * 40
    yield "tid=float", "tid", "1.5"
    yield "name=surrogate", "name", '"\\ud800x"'
    yield "args=deep", "args", "[" * 5000 + "]" * 5000
    yield "args=deepobj", "args", '{"a":' * 3000 + "1" + "}" * 3000
    yield "ts=bigint", "ts", "123456789012345678901234567890"


counts = collections.Counter()
bad = []
for label, field, lit in variants():
    for i in range(len(base["traceEvents"])):
        ev = dict(base["traceEvents"][i])
        ev[field] = "@@"
        evs = list(base["traceEvents"])
        evs[i] = ev
        text = json.dumps({"traceEvents": evs}).replace('"@@"', lit)
        path = os.path.join(out, f"m_{len(bad)}_{counts.total()}.json")
        open(path, "w").write(text)
        for verb in (["ingest", path, "--db", path + ".duckdb"], ["analyze", path, "-f", "json"]):
            try:
                p = subprocess.run([TK, *verb], capture_output=True, text=True, timeout=60)
                tb = "Traceback" in p.stderr
                key = "traceback" if tb else f"exit {p.returncode}"
            except subprocess.TimeoutExpired:
                key = "hang"
            counts[(verb[0], key)] += 1
            if key in ("traceback", "hang") or (key == "exit 1" and verb[0] == "ingest"):
                bad.append(
                    (verb[0], label, i, key, (p.stderr.strip().splitlines() or [""])[-1][:160] if key != "hang" else "")
                )
            if os.path.exists(path + ".duckdb"):
                os.remove(path + ".duckdb")
for k, v in sorted(counts.items()):
    print(k, v)
for b in bad[:40]:
    print(b)
print("bad", len(bad))
