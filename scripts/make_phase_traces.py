#!/usr/bin/env python3
"""Real traces of the conditions that made findings false or missing on other people's workloads.

Each subcommand runs a small real workload on one CUDA GPU under torch.profiler (record_shapes,
with_stack) and writes a gzipped Kineto trace into sample_traces/ with a MANIFEST.json entry:

cold       A fresh process profiles a small conv-net training loop from its very first iteration
           (schedule active from step 0): CUDA context creation, lazy module loading, cuDNN/cuBLAS
           handle creation and cudnn.benchmark searches all fall in ProfilerStep#0.
           -> cold_first_iteration.json.gz; its healthy twin, the same loop profiled with
           schedule(wait=1, warmup=2, active=4) after those steps -> warm_steady_steps.json.gz.
capture    A decode-style MLP stack captured into a torch.cuda.CUDAGraph inside the profiled
           window (cudaStreamBeginCapture..EndCapture, kernels that do not run), then replayed.
           -> cudagraph_capture.json.gz
transfer   Weight streaming: each step copies every layer's weights host->device before using them
           (pageable: plain CPU tensors; pinned: pin_memory() and non_blocking), tiny kernels.
           -> transfer_bound_pageable.json.gz, transfer_bound_pinned.json.gz
pageable   A training-style step whose `## sparse_data_dist ##` region copies several tensors
           device->host into pageable memory (`.cpu()`, blocking the main thread) while a side
           stream does a short, non-waiting synchronize.
           -> pageable_dtoh_region.json.gz
volatile   Two runs of one workload whose annotations carry per-run ids (`nccl:all_reduce, op_id =
           N`, `seq = N`, a hex address), each holding the same blocking `.item()` sync.
           -> volatile_ids_run1.json.gz, volatile_ids_run2.json.gz

    python3 scripts/make_phase_traces.py all      # every subcommand, in separate processes

`cold` must be the first CUDA work of its process, so `all` runs each subcommand in its own process.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

# same helpers as the other sample-trace scripts (scripts/ is on sys.path when run as a script)
from make_sample_traces import base_entry, export_gz, update_manifest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "sample_traces"
SUBCOMMANDS = ("cold", "warm", "capture", "transfer", "pageable", "volatile")


def _entry(torch, argv: list[str], size: int, workload: str) -> dict:
    entry = base_entry(
        argv, torch.cuda.get_device_name(), activities=["CPU", "CUDA"], size_bytes=size, workload=workload
    )
    entry["command"] = "python3 scripts/make_phase_traces.py " + argv[1]  # base_entry names its own script
    return entry


def _profile(torch, schedule=None, on_trace_ready=None):
    from torch.profiler import ProfilerActivity, profile

    return profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        record_shapes=True,
        with_stack=True,
        schedule=schedule,
        on_trace_ready=on_trace_ready,
    )


def _convnet(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    ).cuda()  # fmt: skip


def _train_steps(torch, prof, steps: int, batch: int = 64):
    torch.backends.cudnn.benchmark = True
    model = _convnet(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 64, 64)
    y = torch.randint(0, 10, (batch,))
    for _ in range(steps):
        xb, yb = x.cuda(non_blocking=False), y.cuda()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # the logging sync every training loop has
        prof.step()


def cold(torch, out: Path, argv) -> dict:
    steps = 6
    name = "cold_first_iteration.json.gz"
    sizes = []
    # active from step 0, one cycle: without repeat=1 the schedule starts a second cycle after the
    # sixth step and the export at exit holds only that; the trace is written when the cycle ends
    schedule = torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1)
    with _profile(torch, schedule, on_trace_ready=lambda p: sizes.append(export_gz(p, out / name))) as prof:
        _train_steps(torch, prof, steps)
    return {name: _entry(torch, argv, sizes[0],
                         f"fresh process, conv-net SGD training, batch 64x3x64x64, cudnn.benchmark, "
                         f"{steps} ProfilerSteps recorded from the first (schedule active from step 0)")}  # fmt: skip


def warm(torch, out: Path, argv) -> dict:
    with _profile(torch, torch.profiler.schedule(wait=1, warmup=2, active=4)) as prof:
        _train_steps(torch, prof, 7)
    name = "warm_steady_steps.json.gz"
    size = export_gz(prof, out / name)
    return {name: _entry(torch, argv, size,
                             workload="the cold_first_iteration loop, profiled with schedule(wait=1, warmup=2, "
                                      "active=4): steady state only")}  # fmt: skip


def capture(torch, out: Path, argv) -> dict:
    layers = [torch.nn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    static_in = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)

    def body(x):
        for layer in layers:
            x = torch.nn.functional.gelu(layer(x))
        return x

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            body(static_in)  # warm-up before capture, as torch.cuda.graphs asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with _profile(torch) as prof:
        with torch.profiler.record_function("capture_cudagraphs"):
            with torch.cuda.graph(graph):
                static_out = body(static_in)
        for _ in range(16):
            with torch.profiler.record_function("decode_step"):
                static_in.copy_(torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16))
                graph.replay()
                static_out.sum().item()
    name = "cudagraph_capture.json.gz"
    size = export_gz(prof, out / name)
    return {name: _entry(torch, argv, size,
                             workload="8 x Linear(1024) + gelu in bf16, batch 8: capture into a CUDAGraph inside "
                                      "the window ('capture_cudagraphs'), then 16 'decode_step' replays with a "
                                      ".item() each")}  # fmt: skip


def transfer(torch, out: Path, argv) -> dict:
    entries = {}
    for pinned in (False, True):
        weights = [torch.randn(4096, 4096) for _ in range(12)]  # 64 MiB each, fp32, on the host
        if pinned:
            weights = [w.pin_memory() for w in weights]
        x = torch.randn(4, 4096, device="cuda")
        with _profile(torch) as prof:
            for _ in range(4):
                with torch.profiler.record_function("offloaded_forward"):
                    h = x
                    for w in weights:
                        h = torch.relu(h @ w.to("cuda", non_blocking=pinned).T)
                    h.sum().item()
        name = f"transfer_bound_{'pinned' if pinned else 'pageable'}.json.gz"
        size = export_gz(prof, out / name)
        entries[name] = _entry(
            torch, argv, size,
            workload=f"weight streaming: 4 forwards, each copying 12 fp32 4096x4096 weights (768 MiB) host->device "
                     f"({'pinned, non_blocking' if pinned else 'pageable'}) before a batch-4 matmul + relu",
        )  # fmt: skip
    return entries


def pageable(torch, out: Path, argv) -> dict:
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]).cuda()
    opt = torch.optim.Adam(model.parameters())
    side = torch.cuda.Stream()
    feats = [torch.randn(2048, 2048, device="cuda") for _ in range(6)]  # 16 MiB each
    with _profile(torch, torch.profiler.schedule(wait=1, warmup=1, active=5)) as prof:
        for _ in range(7):
            with torch.profiler.record_function("## sparse_data_dist ##"):
                host_copies = [f.cpu() for f in feats]  # pageable device->host, blocks the main thread
                with torch.cuda.stream(side):
                    torch.ones(16, device="cuda").add_(1)
                side.synchronize()  # short: nothing is queued on the side stream
            with torch.profiler.record_function("## forward_backward ##"):
                loss = model(feats[0]).square().mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            del host_copies
            prof.step()
    name = "pageable_dtoh_region.json.gz"
    size = export_gz(prof, out / name)
    return {name: _entry(torch, argv, size,
                             workload="per step: '## sparse_data_dist ##' copies 6 x 16 MiB device->host to pageable "
                                      "memory (.cpu()) plus a side-stream synchronize with nothing queued; then "
                                      "'## forward_backward ##' of 6 x Linear(2048) with Adam; 5 active steps")}  # fmt: skip


def volatile(torch, out: Path, argv) -> dict:
    entries = {}
    x = torch.randn(2048, 2048, device="cuda")
    for run in (1, 2):
        op_id = random.Random(run).randrange(10_000, 1_000_000)
        with _profile(torch) as prof:
            for step in range(6):
                with torch.profiler.record_function(
                    f"nccl:all_reduce, op_id = {op_id + step}, seq = {op_id * 3 + step}"
                ):
                    y = x @ x
                with torch.profiler.record_function(f"<lambda> object at 0x{id(y) + step * 4096:x}"):
                    y.sum().item()  # the same blocking sync in both runs
        name = f"volatile_ids_run{run}.json.gz"
        size = export_gz(prof, out / name)
        entries[name] = _entry(
            torch, argv, size,
            workload=f"6 x (2048^2 matmul inside 'nccl:all_reduce, op_id = N, seq = M', then .item() inside "
                     f"'<lambda> object at 0x...'); op ids start at {op_id} in this run",
        )  # fmt: skip
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=(*SUBCOMMANDS, "all"))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.what == "all":
        for what in SUBCOMMANDS:  # one process each: `cold` needs a process with no CUDA work before it
            started = time.perf_counter()
            subprocess.run([sys.executable, __file__, what, "--out-dir", str(args.out_dir)], check=True)
            print(f"{what}: {time.perf_counter() - started:.1f} s", flush=True)
        return
    import torch

    argv = [os.path.basename(__file__), args.what]
    entries = globals()[args.what](torch, args.out_dir, argv)
    update_manifest(args.out_dir, entries)


if __name__ == "__main__":
    main()
