#!/usr/bin/env python3
"""Real multi-rank traces for the cross-rank rules: data-parallel training over gloo, one host, CPU only.

Each cell is one run of WORLD processes (torch.distributed, backend gloo, one rank a process, two
cores each, one intra-op thread) that train the same MLP data-parallel, every rank profiled with
torch.profiler (CPU activities, record_shapes, schedule wait=1 warmup=1 active=STEPS, so each trace
holds STEPS `ProfilerStep#N` steps, after WARMUP unprofiled steps). A step, on every rank:

  batch        next() of a torch DataLoader (its `enumerate(DataLoader)#...__next__` annotation)
  forward      `forward` annotation: the MLP and an MSE loss
  backward     `backward` annotation: loss.backward()
  grad_sync    the gradients all-reduced over gloo in two flat buckets, last layers first, as DDP does
  optimizer    SGD with momentum (`Optimizer.step#SGD.step`)
  metrics_sync an all_gather of each rank's loss

Each rank's main thread moves to another rank's pair of cores every step, so that in every WORLD
consecutive steps each rank computes once on every pair: the cores of the virtual machine this ran
on differ in speed by up to a third, for seconds at a time.

Since each collective blocks until every rank has joined it, the other ranks wait inside the
all-reduce for a rank that arrives late; that rank itself waits least. The cells differ in one
rank only:

  healthy             every rank does the same work
  slow_compute*       the slow rank's forward also runs an `extra_compute` matmul (no gradient) sized,
                      by timing it on that rank before profiling, to the given share of its own
                      forward+backward time
  slow_host           the slow rank's DataLoader spends host_ms of pure-Python work per batch
  late_start*         the slow rank sleeps delay_ms at the start of every step, outside any op

    python3 scripts/make_rank_matrix.py                      # every cell -> tests/data/rank_matrix/
    python3 scripts/make_rank_matrix.py --cells healthy --out-dir /tmp/rm

Writes <out>/<cell>/rank<N>.json.gz and <out>/cells.json (each cell's slow rank, kind and injected
size, the dimensions, the script's own wall-clock timings per rank, and where and how the traces were
made).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

# before torch loads in any rank: one OpenMP thread a process, so that 8 ranks fit 16 cores
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from make_sample_traces import cpu_name, export_gz

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "rank_matrix"
WORLD = 8
CORES_PER_RANK = 2
STEPS = 16  # two rounds of the core rotation (see train_step)
WARMUP = 3
WIDTH, DEPTH, BATCH = 256, 4, 1024  # compute well above the gloo all-reduce of 1 MB of gradients
EXTRA_OP = "extra_compute"

CELLS = [
    dict(name="healthy", kind="healthy", slow_rank=None),
    dict(name="slow_compute", kind="slow_compute", slow_rank=5, extra_compute_share=0.20),
    dict(name="slow_compute_10pct", kind="slow_compute", slow_rank=6, extra_compute_share=0.10),
    dict(name="slow_compute_30pct", kind="slow_compute", slow_rank=1, extra_compute_share=0.30),
    dict(name="slow_host", kind="slow_host", slow_rank=2, host_ms=5.0),
    dict(name="late_start", kind="late_start", slow_rank=3, delay_ms=5.0),
    dict(name="late_start_2ms", kind="late_start", slow_rank=4, delay_ms=2.0),
]


def _busy_python(ms: float) -> int:
    """Host-side Python work for `ms` of wall time (a decoder loop of a data pipeline stands for it)."""
    deadline = time.perf_counter() + ms / 1e3
    work = 0
    while time.perf_counter() < deadline:
        work += sum(i * i for i in range(200))
    return work


class SyntheticBatches:
    """A map-style dataset of whole batches (DataLoader batch_size=None), a few distinct ones reused."""

    def __init__(self, torch, host_ms: float, distinct: int = 4, length: int = 10**6, width=WIDTH, batch=BATCH):
        gen = torch.Generator().manual_seed(1234)
        self.batches = [
            (torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen))
            for _ in range(distinct)
        ]
        self.host_ms, self.length = host_ms, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.host_ms:
            _busy_python(self.host_ms)
        return self.batches[index % len(self.batches)]


def _median_ms(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def gradient_buckets(torch, params, device=None) -> list:
    """Two flat buckets of about equal size, the last layers' gradients first (they are ready first),
    each parameter's gradient a view into its bucket, as DDP's gradient_as_bucket_view makes them:
    backward accumulates into the bucket, which is all-reduced in place."""
    ordered = params[::-1]
    half, acc, split = sum(p.numel() for p in params) / 2, 0, len(ordered)
    for i, p in enumerate(ordered):
        acc += p.numel()
        if acc >= half:
            split = i + 1
            break
    buckets = []
    for bucket in (ordered[:split], ordered[split:]):
        flat = torch.zeros(sum(p.numel() for p in bucket), device=device)
        offset = 0
        for p in bucket:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        buckets.append(flat)
    return buckets


def _rank_main(rank: int, cell: dict, port: int, out_dir: str, meta_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    cores = sorted(os.sched_getaffinity(0))
    slots = [cores[i * CORES_PER_RANK : (i + 1) * CORES_PER_RANK] for i in range(WORLD)]
    pinned = len(cores) >= WORLD * CORES_PER_RANK
    if pinned:  # the ranks do not steal each other's cores; gloo's threads, started later, stay here
        os.sched_setaffinity(0, slots[rank])
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)

    slow = rank == cell["slow_rank"]
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP broadcasts them
    layers = []
    for i in range(DEPTH):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if i < DEPTH - 1:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    params = list(model.parameters())
    buckets = gradient_buckets(torch, params)
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    host_ms = cell.get("host_ms", 0.0) if slow else 0.0
    loader = iter(torch.utils.data.DataLoader(SyntheticBatches(torch, host_ms), batch_size=None))
    delay_s = cell.get("delay_ms", 0.0) / 1e3 if slow else 0.0
    extra = None
    gathered = [torch.zeros(1) for _ in range(WORLD)]
    timings = {"step_ms": [], "grad_sync_ms": []}

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

    steps_run = 0

    def train_step(record: bool) -> None:
        nonlocal steps_run
        if pinned:
            # The cores of a virtual machine run at speeds that differ by up to a third for seconds
            # at a time (their host's other work): a rank kept on one slow core would be a straggler
            # nobody injected. The main thread moves to the next rank's cores every step, so over
            # any WORLD consecutive steps each rank computes once on every core pair.
            os.sched_setaffinity(0, slots[(rank + steps_run) % WORLD])
        steps_run += 1
        start = time.perf_counter()
        if delay_s:
            time.sleep(delay_s)  # no op around it: the rank simply starts its step late
        x, y = next(loader)
        loss = forward_backward(x, y)
        sync_start = time.perf_counter()
        with record_function("grad_sync"):
            for flat in buckets:
                dist.all_reduce(flat)
                flat.div_(WORLD)
        sync_end = time.perf_counter()
        optimizer.step()
        with record_function("metrics_sync"):
            dist.all_gather(gathered, loss.detach().reshape(1))
        if record:
            timings["step_ms"].append((time.perf_counter() - start) * 1e3)
            timings["grad_sync_ms"].append((sync_end - sync_start) * 1e3)

    for _ in range(WARMUP):
        train_step(record=False)
    calibration = {}
    if slow and cell["kind"] == "slow_compute":
        # size the extra matmul on this rank's own clock: share x its forward+backward time, timed
        # under the profiler, whose cost per op weighs on the many small ops and not on one matmul
        x, y = next(loader)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            fb_ms = _median_ms(lambda: forward_backward(x, y))
            probe = torch.randn(WIDTH, WIDTH)
            probe_ms = _median_ms(lambda: torch.mm(x, probe))
            columns = max(1, round(WIDTH * cell["extra_compute_share"] * fb_ms / probe_ms))
            extra = torch.randn(WIDTH, columns)
            extra_ms = _median_ms(lambda: torch.mm(x, extra))
        calibration = dict(forward_backward_ms=round(fb_ms, 3), extra_columns=columns, extra_ms=round(extra_ms, 3))
    dist.barrier()

    path = Path(out_dir) / f"rank{rank}.json.gz"
    sizes = []
    active = dict(wait=1, warmup=1, active=STEPS, repeat=1)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(**active),
        on_trace_ready=lambda p: sizes.append(export_gz(p, path)),
    ) as prof:
        for i in range(active["wait"] + active["warmup"] + STEPS):
            train_step(record=i >= active["wait"] + active["warmup"])
            prof.step()
    meta = dict(
        rank=rank,
        size_bytes=sizes[0],
        step_ms=[round(t, 3) for t in timings["step_ms"]],
        grad_sync_ms=[round(t, 3) for t in timings["grad_sync_ms"]],
        cores=sorted(os.sched_getaffinity(0)),
        **calibration,
    )
    (Path(meta_dir) / f"rank{rank}.json").write_text(json.dumps(meta))
    dist.barrier()
    dist.destroy_process_group()


def _cell_entry(cell: dict, metas: list[dict]) -> dict:
    injected = {k: cell[k] for k in ("extra_compute_share", "host_ms", "delay_ms") if k in cell}
    slow = cell["slow_rank"]
    entry = dict(
        name=cell["name"],
        kind=cell["kind"],
        slow_rank=slow,
        injected=injected,
        world_size=WORLD,
        steps=STEPS,
        files=[f"{cell['name']}/rank{m['rank']}.json.gz" for m in metas],
        wall_clock=dict(
            note="the script's own time.perf_counter() per profiled step (profiler on), median per rank",
            step_ms={m["rank"]: round(statistics.median(m["step_ms"]), 2) for m in metas},
            grad_sync_ms={m["rank"]: round(statistics.median(m["grad_sync_ms"]), 2) for m in metas},
        ),
        size_bytes=sum(m["size_bytes"] for m in metas),
    )
    calibration = {k: metas[slow][k] for k in ("forward_backward_ms", "extra_columns", "extra_ms")
                   if slow is not None and k in metas[slow]}  # fmt: skip
    if calibration:
        entry["calibration"] = calibration
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cells", default=",".join(c["name"] for c in CELLS), help="comma-separated cell names")
    parser.add_argument("--port", type=int, default=29611)
    args = parser.parse_args()
    chosen, every = args.cells.split(","), [c["name"] for c in CELLS]
    unknown = set(chosen) - set(every)
    if unknown:
        parser.error(f"unknown cells: {', '.join(sorted(unknown))}")

    import torch
    import torch.multiprocessing as mp

    entries = []
    for index, cell in enumerate(c for c in CELLS if c["name"] in chosen):
        cell_dir = args.out_dir / cell["name"]
        cell_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as meta_dir:
            mp.spawn(_rank_main, args=(cell, args.port + index, str(cell_dir), meta_dir), nprocs=WORLD, join=True)
            metas = [json.loads((Path(meta_dir) / f"rank{r}.json").read_text()) for r in range(WORLD)]
        entry = _cell_entry(cell, metas)
        entries.append(entry)
        print(json.dumps({k: entry[k] for k in ("name", "wall_clock", "size_bytes", "calibration") if k in entry}),
              flush=True)  # fmt: skip

    cells_path = args.out_dir / "cells.json"
    document = dict(
        provenance=dict(
            command=" ".join(
                ["python3", "scripts/make_rank_matrix.py"] + ([f"--cells {args.cells}"] if chosen != every else [])
            ),
            torch_version=torch.__version__,
            python_version=platform.python_version(),
            device=f"CPU only: {cpu_name()}, {os.cpu_count()} cores; {WORLD} ranks of {CORES_PER_RANK} cores "
            "(the main thread moves to the next rank's cores each step), "
            f"torch.set_num_threads(1), OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}",
            backend="gloo over loopback TCP, one host",
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        ),
        workload=dict(
            model=f"MLP of {DEPTH} Linear({WIDTH}, {WIDTH}) with ReLU, MSE loss, SGD momentum 0.9",
            batch=BATCH,
            gradient_buckets=2,
            collectives_per_step=["all_reduce (bucket 0)", "all_reduce (bucket 1)", "all_gather (loss)"],
            profiler=f"CPU activities, record_shapes, schedule(wait=1, warmup=1, active={STEPS}, repeat=1)",
            warmup_steps_unprofiled=WARMUP,
            extra_op=EXTRA_OP,
        ),
        dimensions=["kind", "slow_rank", "injected"],
        cells=entries,
    )
    cells_path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {cells_path}", flush=True)


if __name__ == "__main__":
    main()
