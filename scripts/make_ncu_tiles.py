"""Nsight Compute reports of a decode-style Triton kernel tiled over V, with and without work repeated per tile.

Each program computes one V-tile of o[b, :] = f(q[b, :]) * (q[b, :] @ S[b, :, :]), where f is an FP32
normalization plus gating over K reduced to one scale (rsqrt of the squared norm, then a sigmoid
gate applied `HEAVY` times to control how compute-heavy it is). In the *repeated* variant every V-tile recomputes f
(what the KDA decode kernel does); in the *hoisted* variant a first kernel computes f once per row
and the tiled kernel only reads it. Both run with BV = 32, 64, 128, 256 (so 8/4/2/1 tiles over
V = 256), profiled by ncu with the speed-of-light and instruction metrics tracekit's rule K001 reads.

Run on the GPU machine (needs ncu on PATH):
    python scripts/make_ncu_tiles.py --out-dir OUT          # profiles itself under ncu, writes CSVs
Writes OUT/ncu_tiles_{repeated,hoisted}_{light,heavy}.csv (ncu --csv --page details, long layout).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

METRICS = ",".join(
    [
        "gpu__time_duration.sum",
        "sm__inst_executed.sum",
        "smsp__sass_thread_inst_executed_op_fp32_pred_on.sum",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "launch__grid_size",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    ]
)
BVS = (32, 64, 128, 256)  # >= 64-byte rows of bf16 S, so DRAM traffic does not depend on the tiling


def workload(variant: str, heavy: int) -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def norm_gate(q, HEAVY: tl.constexpr):
        # FP32 normalization and gating over K, reduced to one scale per row: its cost does not
        # depend on the V-tile, so a kernel that computes it per tile repeats it
        qf = q.to(tl.float32)
        g = qf * tl.rsqrt(tl.sum(qf * qf, axis=0) + 1e-6)
        for _ in tl.static_range(HEAVY):
            g = g * tl.sigmoid(g)
        return tl.sum(g, axis=0)

    @triton.jit
    def repeated_kernel(Q, S, Out, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HEAVY: tl.constexpr):
        b = tl.program_id(0)
        t = tl.program_id(1)
        k = tl.arange(0, K)
        v = t * BV + tl.arange(0, BV)
        q = tl.load(Q + b * K + k)
        scale = norm_gate(q, HEAVY)  # recomputed by every V-tile
        s = tl.load(S + b * K * V + k[:, None] * V + v[None, :]).to(tl.float32)
        tl.store(Out + b * V + v, scale * tl.sum(q.to(tl.float32)[:, None] * s, axis=0))

    @triton.jit
    def gate_kernel(Q, G, K: tl.constexpr, HEAVY: tl.constexpr):
        b = tl.program_id(0)
        k = tl.arange(0, K)
        tl.store(G + b, norm_gate(tl.load(Q + b * K + k), HEAVY))

    @triton.jit
    def hoisted_kernel(Q, G, S, Out, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
        b = tl.program_id(0)
        t = tl.program_id(1)
        k = tl.arange(0, K)
        v = t * BV + tl.arange(0, BV)
        q = tl.load(Q + b * K + k)
        scale = tl.load(G + b)  # computed once per row by gate_kernel
        s = tl.load(S + b * K * V + k[:, None] * V + v[None, :]).to(tl.float32)
        tl.store(Out + b * V + v, scale * tl.sum(q.to(tl.float32)[:, None] * s, axis=0))

    B, K, V = 2048, 128, 256
    torch.manual_seed(0)
    q = torch.randn(B, K, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(B, K, V, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(B, V, device="cuda", dtype=torch.float32)
    g = torch.empty(B, device="cuda", dtype=torch.float32)
    ref = None
    for bv in BVS:
        grid = (B, V // bv)
        if variant == "repeated":
            repeated_kernel[grid](q, s, out, K=K, V=V, BV=bv, HEAVY=heavy)
        else:
            gate_kernel[(B,)](q, g, K=K, HEAVY=heavy)
            hoisted_kernel[grid](q, g, s, out, K=K, V=V, BV=bv)
        torch.cuda.synchronize()
        ref = out.clone() if ref is None else ref
        torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)  # every tiling computes the same thing


def profile(out_dir: str) -> None:
    env = dict(os.environ)
    for variant in ("repeated", "hoisted"):
        for label, heavy in (("light", 1), ("heavy", 64)):
            path = os.path.join(out_dir, f"ncu_tiles_{variant}_{label}.csv")
            kernel = "repeated_kernel" if variant == "repeated" else "hoisted_kernel"
            cmd = [
                "ncu", "--csv", "--page", "details", "--clock-control", "none", "--metrics", METRICS,
                "--kernel-name", kernel, sys.executable, os.path.abspath(__file__), "--run", variant, "--heavy", str(heavy),
            ]  # fmt: skip
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            with open(path, "w") as f:
                f.write(res.stdout)
            print(path, "rc", res.returncode, res.stderr[-500:] if res.returncode else "", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="sample_traces")
    ap.add_argument("--run", choices=("repeated", "hoisted"), help="(internal) run one variant, under ncu")
    ap.add_argument("--heavy", type=int, default=1)
    args = ap.parse_args()
    if args.run:
        workload(args.run, args.heavy)
    else:
        os.makedirs(args.out_dir, exist_ok=True)
        profile(args.out_dir)


if __name__ == "__main__":
    main()
