#!/usr/bin/env python3
"""Two-rank tensor-parallel traces where overlapping the all-reduce with compute pays at some sizes and
loses at others: rule C001's evidence and `tracekit diff --baseline-step/--candidate-step` on real NCCL.

Each rank holds half of a Megatron-style MLP (column-parallel up-projection, row-parallel
down-projection, whose partial outputs are summed by an all-reduce). Every profiled trace holds
annotated steps of the same layers run two ways, alternating:

  serial_step   per layer: the MLP on the whole batch, then the all-reduce of its output
  overlap_step  per layer: the batch cut into CHUNKS pieces; the all-reduce of piece i is issued
                (async_op) before piece i + 1 is computed, and all are waited for at the layer's end

Sizes scale the hidden width and the tokens together. At small sizes the extra launches and
collective calls of the chunked schedule cost more than the overlap saves; at large sizes the
overlap wins. Each schedule's mean step time, measured outside the profiler (CUDA events on GPUs,
perf_counter on CPU), goes into cells.json with the schedule that won.

    python3 scripts/make_tp_overlap_matrix.py --out-dir tests/data/tp_overlap_matrix   # 2 GPUs, NCCL
    python3 scripts/make_tp_overlap_matrix.py --backend gloo --out-dir /tmp/tpo        # the same on CPU

Writes <out>/<size>/rank<N>.json.gz and <out>/cells.json. NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from make_sample_traces import cpu_name, export_gz
from multi_gpu_ranks import join_rank, provenance

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "tp_overlap_matrix"
WORLD = 2
LAYERS = 4
CHUNKS = 4
STEPS = 3  # profiled steps of each schedule, alternating
TIMED = 10  # unprofiled steps of each schedule for the mean step time
# (hidden width, tokens) per size: on an H200 the small MLP is launch-bound and its all-reduce tiny,
# the large one computes for milliseconds against an all-reduce of tens of MB; on CPU (gloo) smaller
SIZES = {
    "cuda": {"small": (512, 256), "medium": (4096, 4096), "large": (8192, 16384)},
    "cpu": {"small": (64, 64), "medium": (256, 1024), "large": (512, 4096)},
}


def _rank_main(rank: int, backend: str, size: str, port: int, out_dir: str, meta_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    gpu = backend == "nccl"
    device = join_rank(torch, dist, rank, WORLD, backend, port)
    width, tokens = SIZES[device.type][size]
    dtype = torch.bfloat16 if gpu else torch.float32
    torch.manual_seed(rank)
    shard = 4 * width // WORLD  # this rank's columns of the up-projection, rows of the down-projection
    ups = [torch.randn(width, shard, device=device, dtype=dtype) / width**0.5 for _ in range(LAYERS)]
    downs = [torch.randn(shard, width, device=device, dtype=dtype) / shard**0.5 for _ in range(LAYERS)]
    x = torch.randn(tokens, width, device=device, dtype=dtype)

    def mlp(h, layer):
        return torch.nn.functional.gelu(h @ ups[layer]) @ downs[layer]

    def serial_step():
        h = x
        for layer in range(LAYERS):
            out = mlp(h, layer)
            dist.all_reduce(out)
            h = out
        return h

    def overlap_step():
        h = x
        for layer in range(LAYERS):
            pieces, works = [], []
            for chunk in h.chunk(CHUNKS):
                out = mlp(chunk, layer)  # computed while the previous piece's all-reduce is in flight
                works.append(dist.all_reduce(out, async_op=True))
                pieces.append(out)
            for work in works:
                work.wait()
            h = torch.cat(pieces)
        return h

    schedules = {"serial_step": serial_step, "overlap_step": overlap_step}

    def timed_mean_ms(fn) -> float:
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(TIMED):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / TIMED
        dist.barrier()
        started = time.perf_counter()
        for _ in range(TIMED):
            fn()
        return (time.perf_counter() - started) * 1e3 / TIMED

    for fn in schedules.values():  # warm-up: NCCL communicators, cuBLAS handles, allocator
        fn()
    means = {name: round(timed_mean_ms(fn), 4) for name, fn in schedules.items()}
    dist.barrier()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    path = Path(out_dir) / f"rank{rank}.json.gz"
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(STEPS):
            for name, fn in schedules.items():
                with record_function(name):
                    fn()
                if gpu:
                    torch.cuda.synchronize()
    size_bytes = export_gz(prof, path)
    (Path(meta_dir) / f"rank{rank}.json").write_text(json.dumps(dict(rank=rank, size_bytes=size_bytes, **means)))
    dist.barrier()
    dist.destroy_process_group()


def _entry(size: str, device_type: str, metas: list[dict]) -> dict:
    width, tokens = SIZES[device_type][size]
    # a step ends when its slowest rank's all-reduces do: the schedule's time is the slower rank's
    mean = {name: max(m[name] for m in metas) for name in ("serial_step", "overlap_step")}
    return dict(
        name=size, width=width, tokens=tokens, layers=LAYERS, chunks=CHUNKS, world_size=WORLD,
        files=[f"{size}/rank{m['rank']}.json.gz" for m in metas],
        mean_step_ms=mean,
        per_rank_mean_step_ms={m["rank"]: {k: m[k] for k in mean} for m in metas},
        overlap_wins=mean["overlap_step"] < mean["serial_step"],
        overlap_change=round(mean["overlap_step"] / mean["serial_step"] - 1, 4),
        size_bytes=sum(m["size_bytes"] for m in metas),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--sizes", default="small,medium,large", help="comma-separated sizes")
    parser.add_argument("--port", type=int, default=29751)
    args = parser.parse_args()

    import torch
    import torch.multiprocessing as mp

    gpu = args.backend == "nccl"
    if gpu and torch.cuda.device_count() < WORLD:
        parser.error(f"nccl needs one GPU a rank: {torch.cuda.device_count()} GPUs for {WORLD} ranks")
    device_type = "cuda" if gpu else "cpu"
    sizes = args.sizes.split(",")
    unknown = set(sizes) - set(SIZES[device_type])
    if unknown:
        parser.error(f"unknown sizes: {', '.join(sorted(unknown))}")
    entries = []
    for index, size in enumerate(sizes):
        size_dir = args.out_dir / size
        size_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as meta_dir:
            mp.spawn(_rank_main, args=(args.backend, size, args.port + index, str(size_dir), meta_dir),
                     nprocs=WORLD, join=True)  # fmt: skip
            metas = [json.loads((Path(meta_dir) / f"rank{r}.json").read_text()) for r in range(WORLD)]
        entries.append(_entry(size, device_type, metas))
        print(json.dumps({k: entries[-1][k] for k in ("name", "mean_step_ms", "overlap_wins")}), flush=True)
    document = dict(
        provenance=provenance(
            torch, args.backend, WORLD,
            f"python3 scripts/make_tp_overlap_matrix.py --backend {args.backend} --sizes {args.sizes}",
            cpu_name(),
            timing=f"mean of {TIMED} unprofiled steps per schedule after one warm-up; the slower rank's",
        ),
        dimensions=["size"],
        cells=entries,
        median_overlap_change=statistics.median(e["overlap_change"] for e in entries),
    )  # fmt: skip
    (args.out_dir / "cells.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out_dir / 'cells.json'}", flush=True)


if __name__ == "__main__":
    main()
