#!/usr/bin/env python3
"""Generate sample_traces/runtime_demo.json.gz + sample_traces/runtime_demo.events.jsonl from a real run.

A small CPU workload (an MLP forward + softmax per step, torch CPU) runs under the PyTorch profiler
(activities=[CPU]); each step is wrapped in record_function("step#N"). At the same time the loop
writes a runtime-event log (JSON Lines) of the same steps, timed with time.time_ns() just before
entering and just after leaving each record_function, as a serving runtime would log them:

  * one complete event per step (`step#N`, ts_ns, dur_ns, pid, tid, thread, attributes batch/tokens);
  * a nested `sample` event inside each step (no Kineto counterpart);
  * instants: `request_arrived` (with a request id and a >64-bit integer attribute, to show
    attributes stay lossless) and `checkpoint`;
  * two warm-up steps logged *before* the profiler starts (names the trace does not have);
  * one deliberately malformed line, one line without ts_ns, and a blank line.

tracekit pairs `step#N` of the log with the Kineto user_annotation `step#N` to measure the clock
offset between the two (see docs/schema.md, "Runtime-event logs").

Produced with: /tmp/torchvenv/bin/python scripts/make_runtime_log.py   (torch 2.13.0+cpu)
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "sample_traces"
STEPS = 8
WARMUP = 2


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    x = torch.randn(16, 256)
    pid, tid = os.getpid(), threading.get_native_id()
    lines: list[str] = []

    def log(name: str, ts_ns: int, dur_ns: int | None = None, **attrs) -> None:
        event = {"ts_ns": ts_ns, "name": name, "pid": pid, "tid": tid, "thread": "serve-loop"}
        if dur_ns is not None:
            event["dur_ns"] = dur_ns
        event.update(attrs)
        lines.append(json.dumps(event))

    def step(i: int) -> None:
        log("request_arrived", time.time_ns(), request_id=f"req-{i}", trace_id=(1 << 70) + i)
        t0 = time.time_ns()
        with record_function(f"step#{i}"):
            with torch.no_grad():
                y = model(x)
                s0 = time.time_ns()
                probs = torch.softmax(y, dim=-1)
                token = int(torch.argmax(probs[0]))
                s1 = time.time_ns()
        t1 = time.time_ns()
        log("sample", s0, s1 - s0, token=token)
        log(f"step#{i}", t0, t1 - t0, batch=x.shape[0], tokens=x.shape[0], ok=True)

    for i in range(WARMUP):
        step(i)
    lines.append('{"ts_ns": 1, "name": "truncated')  # malformed on purpose
    lines.append(json.dumps({"name": "no timestamp", "pid": pid}))
    lines.append("")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(WARMUP, WARMUP + STEPS):
            step(i)
            if i % 3 == 0:
                log("checkpoint", time.time_ns(), step=i, loss=round(0.5 / (i + 1), 6), tags=["a", "b"])
    tmp = Path(tempfile.mkdtemp(prefix="rtev_make_"))
    try:
        raw = tmp / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(OUT / "runtime_demo.json.gz", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
    finally:
        shutil.rmtree(tmp)
    (OUT / "runtime_demo.events.jsonl").write_text("\n".join(lines) + "\n")
    print(
        json.dumps(
            {
                "runtime_demo.json.gz": {
                    "command": "python3 scripts/make_runtime_log.py",
                    "torch_version": torch.__version__,
                    "device": "CPU",
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "activities": ["CPU"],
                    "workload": f"MLP 256-512-256 forward + softmax/argmax, batch 16, {STEPS} profiled steps "
                    "(record_function step#N); runtime_demo.events.jsonl logs the same steps with time.time_ns()",
                }
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
