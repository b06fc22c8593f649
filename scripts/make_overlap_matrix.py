"""A variation matrix of real traces where overlapping work pays at some sizes and loses at others
(rule C001's own evidence and `tracekit diff --baseline-step/--candidate-step`).

One trace per (kind, size) on one CUDA GPU. Each holds annotated steps of the same layers run two
ways, alternating: `serial_step` (the layer's matmuls, then its transfer, one after the other on one
stream) and `overlap_step` (the same work cut into CHUNKS pieces, each piece's transfer on a side
stream overlapping the next piece's matmul, joined by events):

  copy     the transfer is a host-to-device copy from pinned memory (as an offload/prefetch path);
  compute  the transfer is a second stream's matmul (as a communication kernel stand-in).

Sizes scale the matmuls and the transfer together; at small sizes the extra launches and event
waits of the chunked schedule cost more than the overlap saves, at large sizes overlap wins.
The measured mean step time of each schedule (CUDA events, outside the profiler) goes into
cells.json with which schedule won.

    python scripts/make_overlap_matrix.py tests/data/overlap_matrix
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SIZES = {"small": 256, "medium": 2048, "large": 6144}  # matmul edge
LAYERS = 4
CHUNKS = 4
STEPS = 4  # of each schedule, alternating


def run(kind: str, size_name: str, out_dir: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_sample_traces import export_gz

    n = SIZES[size_name]
    torch.manual_seed(0)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    numel = n * n * 4  # the transfer moves about as long as the layer's matmuls run
    host = torch.randn(numel, pin_memory=True)
    dev_buf = torch.empty(numel, device="cuda")
    other = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def transfer(piece: int, pieces: int) -> None:
        if kind == "copy":
            step = numel // pieces
            dev_buf[piece * step : (piece + 1) * step].copy_(host[piece * step : (piece + 1) * step], non_blocking=True)
        else:
            rows = n // pieces
            torch.mm(other[piece * rows : (piece + 1) * rows], w)

    def serial() -> None:
        h = x
        for _ in range(LAYERS):
            h = torch.mm(h, w)
            h = torch.mm(h, w)
            transfer(0, 1)

    def overlapped() -> None:
        h = x
        rows = n // CHUNKS
        for _ in range(LAYERS):
            parts = []
            for c in range(CHUNKS):
                piece = torch.mm(torch.mm(h[c * rows : (c + 1) * rows], w), w)
                parts.append(piece)
                ready = torch.cuda.Event()
                ready.record()
                with torch.cuda.stream(side):
                    side.wait_event(ready)
                    transfer(c, CHUNKS)
            h = torch.cat(parts)
            torch.cuda.current_stream().wait_stream(side)

    def timed(fn, reps: int = 10) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps

    serial_ms, overlap_ms = timed(serial), timed(overlapped)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(STEPS):
            with record_function("serial_step"):
                serial()
                torch.cuda.synchronize()
            with record_function("overlap_step"):
                overlapped()
                torch.cuda.synchronize()
    name = f"overlap_{kind}_{size_name}.json.gz"
    size = export_gz(prof, Path(out_dir) / name)
    return {"file": name, "kind": kind, "size": size_name, "matmul_edge": n, "layers": LAYERS, "chunks": CHUNKS,
            "steps_each": STEPS, "serial_ms": round(serial_ms, 4), "overlap_ms": round(overlap_ms, 4),
            "overlap_pays": overlap_ms < serial_ms, "size_bytes": size, "device": torch.cuda.get_device_name(),
            "torch_version": torch.__version__}  # fmt: skip


def main(argv: list[str]) -> int:
    out_dir = argv[0] if argv else "tests/data/overlap_matrix"
    os.makedirs(out_dir, exist_ok=True)
    cells = [run(kind, size, out_dir) for kind in ("copy", "compute") for size in SIZES]
    for c in cells:
        print(c["file"], c["serial_ms"], c["overlap_ms"], "pays" if c["overlap_pays"] else "loses", flush=True)
    doc = {
        "command": "python scripts/make_overlap_matrix.py tests/data/overlap_matrix",
        "rules": ["C001", "G004"],
        "dimensions": ["kind", "size"],
        "cells": cells,
    }
    with open(os.path.join(out_dir, "cells.json"), "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
