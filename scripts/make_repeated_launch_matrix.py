#!/usr/bin/env python3
"""A variation matrix of real runs for repeated launches inside one op call (rule K002).

Each cell profiles 8 decode steps on one CUDA GPU (record_shapes, with_stack). A torch.library
custom op builds rotary cos/sin tables for 2048 positions with aten ops (`positions.float()`,
`torch.outer`, `cos`, `sin`, `cat`), each launching one kernel per use, then a bf16 matmul runs:

  eager_rebuilt_r2       the same table built twice per call (the smallest repeat);
  eager_rebuilt_r4_noshapes  four times per call, profiled without record_shapes;
  eager_group_offsets    one table per head group at positions + g * 2048 (a scalar offset);
  eager_group_select     one table per head group from positions[g] (a select index);
  eager_group_chunks     one table per chunk of torch.chunk(positions, 4) (slice offsets);
  compiled_layers_r4     a torch.compile'd 4-layer model; each layer calls the op, which builds its
                         table 4x per call, then a Linear + ReLU fused by Inductor (which merges
                         the layers' equal calls of the functional op into one per step);
  compiled_layers_r1     the same model building the table once per call: the Triton and GEMM
                         kernels repeat once per layer, never inside one op call.

    python3 scripts/make_repeated_launch_matrix.py --out-dir tests/data/launch_matrix

cells.json there lists each cell and the verdict K002 must give: the op reported with its copies per
call where the same table is rebuilt, nothing where the copies read different positions or where
only layers repeat. The 1x/4x eager pair is sample_traces/{single,repeated}_rope_cache.json.gz
(scripts/make_repeated_launch_trace.py).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from make_sample_traces import export_gz

POSITIONS, HALF_DIM, GROUPS, STEPS, LAYERS, HIDDEN = 2048, 64, 4, 8, 4, 128


def _table(torch, positions, inv_freq):
    freqs = torch.outer(positions.float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _bodies(torch):
    """Custom-op bodies by cell: (positions [2048], inv_freq [64]) -> a [2048, 128] table."""

    def rebuilt(repeats):
        def body(positions, inv_freq):
            out = None
            for _ in range(repeats):  # the bug: the same table, rebuilt per head group
                out = _table(torch, positions, inv_freq)
            return out

        return body

    def offsets(positions, inv_freq):
        tables = [_table(torch, positions + g * POSITIONS, inv_freq) for g in range(GROUPS)]
        return torch.stack(tables).mean(0)

    def select(positions, inv_freq):
        starts = torch.arange(GROUPS, device=positions.device)[:, None] * POSITIONS
        grouped = positions[None, :] + starts
        return torch.stack([_table(torch, grouped[g], inv_freq) for g in range(GROUPS)]).mean(0)

    def chunks(positions, inv_freq):
        wide = torch.arange(0, GROUPS * POSITIONS, device=positions.device) + positions[0]
        return torch.stack([_table(torch, c, inv_freq) for c in torch.chunk(wide, GROUPS)]).mean(0)

    return {"r1": rebuilt(1), "r2": rebuilt(2), "r4": rebuilt(4), "offsets": offsets, "select": select,
            "chunks": chunks}  # fmt: skip


def _register(torch, name, body):
    schema = "(Tensor positions, Tensor inv_freq) -> Tensor"
    op = torch.library.custom_op(f"mylib::{name}", mutates_args=(), schema=schema)(body)

    @op.register_fake
    def _(positions, inv_freq):
        return positions.new_empty((positions.shape[0], 2 * inv_freq.shape[0]), dtype=torch.float32)

    return getattr(torch.ops.mylib, name)


def run_cell(torch, out_path: Path, op, compiled: bool, record_shapes: bool = True) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    dev = "cuda"
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 2 * HALF_DIM, 2, device=dev).float() / (2 * HALF_DIM)))
    positions = torch.arange(0, POSITIONS, device=dev)
    if compiled:
        layers = [torch.nn.Linear(HIDDEN, HIDDEN, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]

        def model(x, positions):
            for layer in layers:
                cache = op(positions, inv_freq)
                x = torch.relu(layer(x)) + cache[: x.shape[0]].to(x.dtype)
            return x

        step_fn = torch.compile(model)
        x = torch.randn(64, HIDDEN, device=dev, dtype=torch.bfloat16)
    else:
        w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        x = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)

        def step_fn(x, positions):
            cache = op(positions, inv_freq)
            return (x @ w).float() * cache[: x.shape[0], :1]

    for step in range(3):  # warm-up (and compilation), outside the profile
        step_fn(x, positions + step)
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities, record_shapes=record_shapes, with_stack=True) as prof:
        for step in range(STEPS):
            with record_function(f"decode_step#{step}"):
                step_fn(x, positions + step)
            torch.cuda.synchronize()
    export_gz(prof, out_path)


CELLS = [
    # (file stem, body, compiled, record_shapes, copies per call K002 reports, or 0 for quiet)
    ("eager_rebuilt_r2", "r2", False, True, 2),
    ("eager_rebuilt_r4_noshapes", "r4", False, False, 4),
    ("eager_group_offsets", "offsets", False, True, 0),
    ("eager_group_select", "select", False, True, 0),
    ("eager_group_chunks", "chunks", False, True, 0),
    ("compiled_layers_r4", "r4", True, True, 4),
    ("compiled_layers_r1", "r1", True, True, 0),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="tests/data/launch_matrix")
    args = ap.parse_args()
    import torch

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bodies = _bodies(torch)
    ops = {}
    cells = []
    for stem, body, compiled, record_shapes, copies in CELLS:
        name = f"rope_{body}"
        if name not in ops:
            ops[name] = _register(torch, name, bodies[body])
        run_cell(torch, out / f"{stem}.json.gz", ops[name], compiled, record_shapes)
        cells.append({
            "file": f"{stem}.json.gz", "op": f"mylib::{name}", "body": body, "compiled": compiled,
            "record_shapes": record_shapes, "layers": LAYERS if compiled else 1,
            "expected": "found" if copies else "quiet", "copies_per_call": copies or None,
        })  # fmt: skip
    meta = {
        "command": f"python3 scripts/make_repeated_launch_matrix.py --out-dir {args.out_dir}",
        "rules": ["K002"],
        "dimensions": ["body", "compiled", "record_shapes"],
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "python_version": platform.python_version(),
        "steps": STEPS,
        "positions": POSITIONS,
        "cells": cells,
    }
    (out / "cells.json").write_text(json.dumps(meta, indent=1) + "\n")
    print("ok")


if __name__ == "__main__":
    main()
