#!/usr/bin/env python3
"""Real two-rank traces of collectives that are not GPU kernels: gloo, on one host.

Two processes (torch.distributed, backend gloo, world size 2) run the same data-parallel style step
under torch.profiler: a GPU forward/backward of a small MLP, the gradients copied to the host and
all-reduced over gloo in one flat buffer, then an all_to_all of per-rank token counts. Rank 1 does
extra host work before its all-reduce (a straggler), so rank 0 waits inside the collective. Each
rank's trace has `gloo:all_reduce`-style ranges and `record_param_comms` ops but no communication
kernel.

    python3 scripts/make_gloo_traces.py            # -> sample_traces/gloo_rank0.json.gz, gloo_rank1.json.gz
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from make_sample_traces import base_entry, export_gz, update_manifest

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT = REPO_ROOT / "sample_traces"
STEPS = 5
STRAGGLER_HOST_MS = 8.0


def _rank_main(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024)).cuda()
    x = torch.randn(256, 1024, device="cuda")

    def step() -> None:
        with torch.profiler.record_function("forward_backward"):
            model.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
        with torch.profiler.record_function("grad_sync"):
            flat = torch.cat([p.grad.flatten() for p in model.parameters()]).cpu()
            if rank == 1:
                time.sleep(STRAGGLER_HOST_MS / 1e3)  # host work only this rank does: the straggler
            dist.all_reduce(flat)
            counts = torch.tensor([rank + 1] * world, dtype=torch.int64)
            received = torch.empty_like(counts)
            dist.all_to_all_single(received, counts)
        torch.cuda.synchronize()

    for _ in range(2):  # warm-up outside the profiled window
        step()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(STEPS):
            step()
            prof.step()
    name = f"gloo_rank{rank}.json.gz"
    size = export_gz(prof, OUT / name)
    workload = (
        f"rank {rank} of 2 (gloo, one host): MLP 1024x1024 fwd/bwd on GPU, grads .cpu() then gloo all_reduce and "
        f"all_to_all_single, {STEPS} ProfilerSteps after 2 warm-up steps"
        + (f"; this rank sleeps {STRAGGLER_HOST_MS} ms before its all_reduce (straggler)" if rank == 1 else "")
    )
    entry = base_entry(sys.argv, torch.cuda.get_device_name(), activities=["CPU", "CUDA"], size_bytes=size,
                       workload=workload, world_size=world, rank=rank)  # fmt: skip
    dist.barrier()
    if rank == 0:
        time.sleep(0.5)
    update_manifest(OUT, {name: entry})
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(2, 29511), nprocs=2, join=True)


if __name__ == "__main__":
    main()
