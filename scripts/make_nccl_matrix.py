#!/usr/bin/env python3
"""Multi-GPU rank traces for the cross-rank rules: data-parallel and expert-parallel steps over NCCL.

One process per GPU (torch.distributed, backend nccl; NVLink multicast left off), every rank profiled
with torch.profiler (CPU and CUDA activities, record_shapes, schedule wait=1 warmup=1 active=STEPS).
Two step kinds, one cell changing one rank only:

data parallel   an MLP forward/backward, its gradients all-reduced in two buckets (last layers first,
                as DDP does), SGD, an all_gather of the loss:
  healthy       every rank does the same work
  slow_compute  the slow rank's forward also runs an `extra_compute` matmul sized, by timing it on that
                rank, to a share of its own forward+backward time
  slow_host     the slow rank's DataLoader spends host_ms of pure-Python work per batch
  slow_link     the slow rank copies a large buffer to its neighbour GPU on a side stream while the
                gradients are all-reduced, so its NVLink carries other traffic
expert parallel tokens routed to experts (one per rank) by all_to_all_single with the counts each rank
                sends, the experts' MLP, and the combine back:
  ep_balanced   every expert gets the same share of tokens
  hot_expert    the hot rank's expert gets hot_share of every rank's tokens (the others split the rest)
  hot_expert_mild  the same with a smaller hot_share

    python3 scripts/make_nccl_matrix.py --out-dir tests/data/nccl_matrix     # every cell, one GPU a rank
    python3 scripts/make_nccl_matrix.py --backend gloo --world 4 --cells healthy,slow_compute \\
        --out-dir /tmp/nm        # the same code on CPU: checks the script where no GPUs are lent

Writes <out>/<cell>/rank<N>.json.gz and <out>/cells.json (each cell's slow rank, kind, injected size,
the script's own per-step timings per rank, and how the traces were made), as make_rank_matrix.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from make_rank_matrix import SyntheticBatches, _median_ms, gradient_buckets
from make_sample_traces import cpu_name, export_gz
from multi_gpu_ranks import join_rank, provenance

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "nccl_matrix"
STEPS = 12
WARMUP = 3
EXTRA_OP = "extra_compute"
# (width, depth, batch) of the data-parallel MLP: on an H200 a step computes a few ms, well above
# the all-reduce of its 134 MB of fp32 gradients over NVLink; on CPU (gloo) a small one
SIZES = {"cuda": (2048, 8, 8192), "cpu": (256, 4, 1024)}
EP_TOKENS = {"cuda": 16384, "cpu": 2048}  # tokens per rank per step of the expert-parallel cells

CELLS = [
    dict(name="healthy", kind="healthy", slow_rank=None),
    dict(name="slow_compute", kind="slow_compute", slow_rank=1, extra_compute_share=0.20),
    dict(name="slow_host", kind="slow_host", slow_rank=2, host_ms=5.0),
    dict(name="slow_link", kind="slow_link", slow_rank=0, copy_mb=512, nccl_only=True),
    dict(name="ep_balanced", kind="ep_balanced", slow_rank=None),
    dict(name="hot_expert", kind="hot_expert", slow_rank=1, hot_share=0.55),
    # a milder skew, for the load-imbalance rule's threshold: 1.6x the other experts' tokens at world 4
    dict(name="hot_expert_mild", kind="hot_expert", slow_rank=2, hot_share=0.35),
]


def _dp_model(torch, device, width: int, depth: int):
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP broadcasts them
    layers = []
    for i in range(depth):
        layers.append(torch.nn.Linear(width, width))
        if i < depth - 1:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(device)
    params = list(model.parameters())
    buckets = gradient_buckets(torch, params, device)
    return model, params, buckets


def _ep_counts(world: int, tokens: int, cell: dict) -> list[int]:
    """Tokens each rank sends to each expert (rank): even, or hot_share of them to the hot rank."""
    if cell["kind"] != "hot_expert":
        return [tokens // world] * world
    hot = round(tokens * cell["hot_share"])
    rest = (tokens - hot) // (world - 1)
    counts = [rest] * world
    counts[cell["slow_rank"]] = tokens - rest * (world - 1)
    return counts


def _rank_main(rank: int, world: int, backend: str, cell: dict, port: int, out_dir: str, meta_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    gpu = backend == "nccl"
    # On CPU, each rank gets its own slot of cores, and its main thread moves to the next rank's slot
    # every step (as make_rank_matrix.py does): a virtual machine's cores run at speeds that differ
    # for seconds at a time, and a rank kept on a slow one is a straggler nobody injected (a first
    # gloo run of the healthy cell had one rank 25% slower in every step).
    cores = sorted(os.sched_getaffinity(0))
    per_rank = len(cores) // world
    slots = [cores[i * per_rank : (i + 1) * per_rank] for i in range(world)] if not gpu and per_rank else []
    if slots:  # before the process group starts gloo's threads, so that they stay on this slot
        os.sched_setaffinity(0, slots[rank])
    steps_run = 0

    def rotate() -> None:
        nonlocal steps_run
        if slots:
            os.sched_setaffinity(0, slots[(rank + steps_run) % world])
        steps_run += 1

    device = join_rank(torch, dist, rank, world, backend, port)
    slow = rank == cell["slow_rank"]
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    width, depth, batch = SIZES[device.type]
    timings: dict[str, list] = {"step_ms": [], "collective_ms": []}
    calibration: dict = {}
    ep = cell["kind"] in ("ep_balanced", "hot_expert")

    if ep:
        tokens = EP_TOKENS[device.type]
        send = _ep_counts(world, tokens, cell)
        table = torch.tensor(send, device=device)
        counts = torch.empty_like(table)
        dist.all_to_all_single(counts, table)  # how many tokens each rank sends this one
        recv = counts.tolist()
        torch.manual_seed(rank)
        expert = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                     torch.nn.Linear(4 * width, width)).to(device)  # fmt: skip
        x = torch.randn(tokens, width, device=device)

        def step(record: bool) -> None:
            rotate()
            start = time.perf_counter()
            with record_function("dispatch"):
                routed = torch.empty(sum(recv), width, device=device)
                dist.all_to_all_single(routed, x, output_split_sizes=recv, input_split_sizes=send)
            with record_function("expert"), torch.no_grad():
                out = expert(routed)
            with record_function("combine"):
                back = torch.empty_like(x)
                dist.all_to_all_single(back, out, output_split_sizes=send, input_split_sizes=recv)
            sync()
            if record:
                timings["step_ms"].append((time.perf_counter() - start) * 1e3)

    else:
        model, params, buckets = _dp_model(torch, device, width, depth)
        optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
        host_ms = cell.get("host_ms", 0.0) if slow else 0.0
        loader = iter(torch.utils.data.DataLoader(SyntheticBatches(torch, host_ms, width=width, batch=batch),
                                                  batch_size=None, pin_memory=gpu))  # fmt: skip
        gathered = [torch.zeros(1, device=device) for _ in range(world)]
        extra = None
        side = torch.cuda.Stream() if gpu and slow and cell["kind"] == "slow_link" else None
        if side is not None:
            peer = torch.device("cuda", (rank + 1) % world)
            src = torch.empty(cell["copy_mb"] << 18, device=device)  # float32: 4 bytes each
            dst = torch.empty(cell["copy_mb"] << 18, device=peer)

        def forward_backward(x, y):
            for flat in buckets:
                flat.zero_()
            with record_function("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
                if extra is not None:
                    with record_function(EXTRA_OP):
                        torch.mm(x, extra)
            with record_function("backward"):
                loss.backward()
            return loss

        def step(record: bool) -> None:
            rotate()
            start = time.perf_counter()
            x, y = (t.to(device, non_blocking=True) for t in next(loader))
            loss = forward_backward(x, y)
            if side is not None:  # the competing traffic starts as the gradients go out
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side), record_function("competing_copy"):
                    dst.copy_(src, non_blocking=True)
            sync_start = time.perf_counter()
            with record_function("grad_sync"):
                for flat in buckets:
                    dist.all_reduce(flat)
                    flat.div_(world)
            sync()
            sync_end = time.perf_counter()
            optimizer.step()
            with record_function("metrics_sync"):
                dist.all_gather(gathered, loss.detach().reshape(1))
            sync()
            if record:
                timings["step_ms"].append((time.perf_counter() - start) * 1e3)
                timings["collective_ms"].append((sync_end - sync_start) * 1e3)

        if slow and cell["kind"] == "slow_compute":
            x, y = (t.to(device) for t in next(loader))
            fb_ms = _median_ms(lambda: (forward_backward(x, y), sync()))
            probe = torch.randn(width, width, device=device)
            probe_ms = _median_ms(lambda: (torch.mm(x, probe), sync()))
            columns = max(1, round(width * cell["extra_compute_share"] * fb_ms / probe_ms))
            extra = torch.randn(width, columns, device=device)
            calibration = dict(forward_backward_ms=round(fb_ms, 3), extra_columns=columns)

    for _ in range(WARMUP):
        step(record=False)
    dist.barrier()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    path, sizes = Path(out_dir) / f"rank{rank}.json.gz", []
    with profile(activities=activities, record_shapes=True, schedule=schedule(wait=1, warmup=1, active=STEPS),
                 on_trace_ready=lambda p: sizes.append(export_gz(p, path))) as prof:  # fmt: skip
        for i in range(2 + STEPS):
            step(record=i >= 2)
            prof.step()
    meta = dict(rank=rank, size_bytes=sizes[0], step_ms=[round(t, 3) for t in timings["step_ms"]],
                collective_ms=[round(t, 3) for t in timings["collective_ms"]], **calibration)  # fmt: skip
    (Path(meta_dir) / f"rank{rank}.json").write_text(json.dumps(meta))
    dist.barrier()
    dist.destroy_process_group()


def _entry(cell: dict, world: int, metas: list[dict]) -> dict:
    injected = {k: cell[k] for k in ("extra_compute_share", "host_ms", "copy_mb", "hot_share") if k in cell}
    entry = dict(
        name=cell["name"], kind=cell["kind"], slow_rank=cell["slow_rank"], injected=injected, world_size=world,
        steps=STEPS, files=[f"{cell['name']}/rank{m['rank']}.json.gz" for m in metas],
        wall_clock=dict(
            note="the script's own time.perf_counter() per profiled step (profiler on), median per rank",
            step_ms={m["rank"]: round(statistics.median(m["step_ms"]), 2) for m in metas},
        ),
        size_bytes=sum(m["size_bytes"] for m in metas),
    )  # fmt: skip
    slow = cell["slow_rank"]
    if slow is not None and "extra_columns" in metas[slow]:
        entry["calibration"] = {k: metas[slow][k] for k in ("forward_backward_ms", "extra_columns")}
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--world", type=int, default=None, help="ranks (default: every GPU; 4 with gloo)")
    parser.add_argument("--cells", default=",".join(c["name"] for c in CELLS), help="comma-separated cell names")
    parser.add_argument("--port", type=int, default=29711)
    args = parser.parse_args()

    import torch
    import torch.multiprocessing as mp

    world = args.world or (torch.cuda.device_count() if args.backend == "nccl" else 4)
    if args.backend == "nccl" and not 2 <= world <= torch.cuda.device_count():
        parser.error(f"nccl needs one GPU a rank: {torch.cuda.device_count()} GPUs for {world} ranks")
    chosen = args.cells.split(",")
    unknown = set(chosen) - {c["name"] for c in CELLS}
    if unknown:
        parser.error(f"unknown cells: {', '.join(sorted(unknown))}")
    cells = [c for c in CELLS if c["name"] in chosen and not (c.get("nccl_only") and args.backend != "nccl")]
    entries = []
    for index, cell in enumerate(cells):
        cell = dict(cell, slow_rank=None if cell["slow_rank"] is None else cell["slow_rank"] % world)
        cell_dir = args.out_dir / cell["name"]
        cell_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as meta_dir:
            mp.spawn(_rank_main, args=(world, args.backend, cell, args.port + index, str(cell_dir), meta_dir),
                     nprocs=world, join=True)  # fmt: skip
            metas = [json.loads((Path(meta_dir) / f"rank{r}.json").read_text()) for r in range(world)]
        entries.append(_entry(cell, world, metas))
        print(json.dumps({k: entries[-1][k] for k in ("name", "wall_clock", "size_bytes")}), flush=True)
    document = dict(
        provenance=provenance(
            torch, args.backend, world,
            "python3 scripts/make_nccl_matrix.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k in ("backend", "world", "cells")
                and v is not None),
            cpu_name(),
            **({} if args.backend == "nccl" else {"placement": (
                f"each rank's main thread on its own {os.cpu_count() // world} of {os.cpu_count()} cores, moving "
                "to the next rank's cores every step; torch.set_num_threads(1)")}),
        ),
        dimensions=["kind", "slow_rank", "injected"],
        cells=entries,
    )  # fmt: skip
    (args.out_dir / "cells.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out_dir / 'cells.json'}", flush=True)


if __name__ == "__main__":
    main()
