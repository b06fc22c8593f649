#!/usr/bin/env python3
"""A variation matrix of real traces of blocking host-device copies and their healthy twins (rule
H001 host-sync names the copy, its memory and the fix).

One trace per cell on one CUDA GPU, each STEPS profiled steps (after WARMUP unprofiled ones) of the
same loop: MATMULS matmuls queued on the stream, the cell's copy, about a millisecond of host work
(`prepare_batch`, as a loader's) and GPU work that uses the copy. A blocking copy makes the host do
that work after the GPU drained; without one it overlaps the queued matmuls. Cells:

  upload   `x_host.to("cuda")` of the next input:
           pageable         a plain CPU tensor: the driver stages it and `aten::copy_` syncs after it;
           pinned_blocking  `pin_memory()` but no `non_blocking`: the copy is async, its sync is not;
           pinned           `pin_memory()` and `non_blocking=True`: nothing blocks (healthy twin).
  read     the step's result back to the host:
           pageable         `.cpu()`: a copy into pageable memory that returns only once done;
           pinned           `buf.copy_(y, non_blocking=True)` into a preallocated pinned buffer and an
                            event, synchronised one step later where the value is used (healthy twin).

at two sizes (SIZES: 16 KiB, where the wait is for the queued matmuls and a read is a check, and
64 MiB, where the staging itself takes milliseconds and a read is data). The mean step time of each cell, measured outside the
profiler over MEASURED steps (host clock after a device synchronize), goes into cells.json.

    python scripts/make_pageable_copy_trace.py --out-dir tests/data/pageable_matrix

Without a CUDA device the same loops run on the CPU (no pinning, CPU activity only) so the script
can be checked anywhere; cells.json then says `"device": "cpu"` and the traces show no copies.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SIZES = {"small": 16 << 10, "large": 64 << 20}  # bytes moved per step
CELLS = {"upload": ("pageable", "pinned_blocking", "pinned"), "read": ("pageable", "pinned")}
EDGE = 2048  # the queued matmuls' edge: a few hundred microseconds of GPU work per step on an H200
MATMULS = 6
WARMUP, STEPS, MEASURED = 2, 5, 20
PREPARE = 30_000  # iterations of host work per step: about a millisecond of Python


class Loop:
    """One cell's step: queued matmuls, the cell's copy, then work that uses what was copied."""

    def __init__(self, torch, direction: str, memory: str, nbytes: int, device: str):
        self.torch, self.direction, self.memory, self.device = torch, direction, memory, device
        cuda = device == "cuda"
        numel = nbytes // 4
        self.w = torch.randn(EDGE, EDGE, device=device)
        self.host = torch.randn(numel)
        self.out = torch.randn(numel, device=device)
        if cuda and memory != "pageable":
            self.host = self.host.pin_memory()
        self.buf = torch.empty(numel, pin_memory=cuda and memory == "pinned")
        self.done = None  # the previous step's read, waited for one step late
        self.seen = 0.0

    def step(self) -> None:
        torch = self.torch
        with torch.profiler.record_function("train_step"):
            h = self.w
            for _ in range(MATMULS):
                h = torch.relu(h @ self.w) * (1.0 / EDGE)
            if self.direction == "upload":
                x = self.host.to(self.device, non_blocking=self.memory == "pinned")
                self._prepare()
                self.out.add_(x).mul_(0.5)
            else:
                self.out.mul_(0.5).add_(h[0, 0])
                self._read()
                self._prepare()
            self.w.add_(h, alpha=1e-6)

    def _prepare(self) -> None:
        # a plain loop, no calls: the profiler's Python tracing records a frame per call, not per iteration
        with self.torch.profiler.record_function("prepare_batch"):
            total = 0
            for i in range(PREPARE):
                total += i * i
            self.seen += total * 1e-12

    def _read(self) -> None:
        if self.memory == "pageable":
            self.seen = float(self.out.cpu()[0])  # `.cpu()` waits for the copy; the index is host work
            return
        if self.done is not None:
            self.done.synchronize()  # the previous step's copy: long finished, returns at once
            self.seen = float(self.buf[0])
        self.buf.copy_(self.out, non_blocking=True)
        if self.device == "cuda":
            self.done = self.torch.cuda.Event()
            self.done.record()

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()


def mean_step_ms(loop: Loop) -> float:
    loop.sync()
    started = time.perf_counter()
    for _ in range(MEASURED):
        loop.step()
    loop.sync()
    return (time.perf_counter() - started) * 1e3 / MEASURED


def run_cell(torch, direction: str, memory: str, size: str, out_dir: Path, device: str) -> dict:
    from make_sample_traces import export_gz
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    loop = Loop(torch, direction, memory, SIZES[size], device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(
        activities=activities,
        record_shapes=True,
        with_stack=True,
        schedule=schedule(wait=0, warmup=WARMUP, active=STEPS, repeat=1),
    ) as prof:
        for _ in range(WARMUP + STEPS):
            loop.step()
            prof.step()
        loop.sync()
    name = f"{direction}_{memory}_{size}.json.gz"
    size_bytes = export_gz(prof, out_dir / name)
    return {
        "file": name,
        "direction": direction,
        "memory": memory,
        "size": size,
        "bytes_per_step": SIZES[size],
        "steps": STEPS,
        "mean_step_ms": round(mean_step_ms(loop), 4),
        "size_bytes": size_bytes,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch_version": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("make_pageable_copy_trace.py: needs torch (pip install torch)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # make_sample_traces beside this file
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("no CUDA device: running the loops on the CPU (no copies, no pinning)", file=sys.stderr)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    cells = [
        run_cell(torch, direction, memory, size, args.out_dir, device)
        for direction, memories in CELLS.items()
        for memory in memories
        for size in SIZES
    ]
    (args.out_dir / "cells.json").write_text(
        json.dumps(
            {
                "command": f"python scripts/make_pageable_copy_trace.py --out-dir {args.out_dir}",
                "rules": ["H001"],
                "dimensions": ["direction", "memory", "size"],
                "cells": cells,
            },
            indent=1,
        )
        + "\n"
    )
    for c in cells:
        print(f"{c['file']}: {c['mean_step_ms']} ms/step, {c['size_bytes'] / 1e3:.0f} KB", flush=True)


if __name__ == "__main__":
    main()
