"""A variation matrix of Nsight Compute reports for work repeated per tile (rule K001).

One decode step of a gated delta-rule recurrence, FLA fused-recurrent style, per (batch, head):
q and k are L2-normalised in fp32, the state S (K x V, fp32) decays by exp(g), takes the delta-rule
update with beta, and o = q^T S. Three ways to run it, all one Triton kernel name
(`fused_recurrent_decode`) except the pre-normaliser:

  tiled     grid (V / BV tiles, batch*heads), BV = 16, one warp: every V-tile reloads q and k and
            recomputes their norms and the gate (the repetition);
  per_head  grid (1, batch*heads), BV = V, four warps: each head's norms and gate once;
  prenorm   `prenorm_qk` computes the normalised q, k and the gate once per head, then the same
            tiled kernel reads them (PRENORM=True).

Each at two decode batch sizes (batch*heads = 512 and 8192) and with light or heavy gating
(`GATE_WORK` sigmoid passes over the K vector: the repeated part's cost), profiled under
`ncu --clock-control none` with the speed-of-light, compute, memory, instruction and launch sections
plus per-opcode instruction counts. One report per batch size, exported as the raw and the details
page:

    python scripts/make_ncu_matrix.py tests/data/ncu_matrix     # on the GPU machine, ncu on PATH

cells.json lists every launch in report order (variant, batch*heads, gating, grid) and what K001
must say about it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

K = V = 128
BV_TILED = 16
HEADS = 32
BATCHES = {512: 16, 8192: 256}  # batch*heads -> batch
GATES = {"light": 1, "heavy": 24}
SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "InstructionStats", "LaunchStats",
            "Occupancy"]  # fmt: skip
METRICS = ",".join([
    "gpu__time_duration.sum", "sm__inst_executed.sum", "smsp__inst_executed.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum", "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", "smsp__sass_thread_inst_executed_op_fp32_pred_on.sum",
    "smsp__sass_inst_executed_op_global_ld.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size", "launch__block_size",
    "launch__registers_per_thread",
])  # fmt: skip


def launches() -> list[dict]:
    out = []
    for gate in GATES:
        for variant in ("tiled", "per_head", "prenorm"):
            if variant == "prenorm":
                out.append({"variant": variant, "kernel": "prenorm_qk", "gate": gate, "part": "prenorm"})
            out.append({"variant": variant, "kernel": "fused_recurrent_decode", "gate": gate, "part": "update",
                        "bv": V if variant == "per_head" else BV_TILED})  # fmt: skip
    return out


def workload(heads_total: int) -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def gate_of(g_raw, kf, GATE_WORK: tl.constexpr):
        # the gate: a scalar decay from g and a K-wide sigmoid pass, GATE_WORK times (its cost per call)
        gk = kf
        for _ in tl.static_range(GATE_WORK):
            gk = gk * tl.sigmoid(gk)
        return tl.exp(g_raw + 1e-3 * tl.sum(gk, axis=0))

    @triton.jit
    def prenorm_qk(Q, Kx, G, QN, KN, DECAY, K: tl.constexpr, GATE_WORK: tl.constexpr):
        i = tl.program_id(0)
        k = tl.arange(0, K)
        qf = tl.load(Q + i * K + k).to(tl.float32)
        kf = tl.load(Kx + i * K + k).to(tl.float32)
        qn = qf * tl.rsqrt(tl.sum(qf * qf, axis=0) + 1e-6)
        kn = kf * tl.rsqrt(tl.sum(kf * kf, axis=0) + 1e-6)
        tl.store(QN + i * K + k, qn)
        tl.store(KN + i * K + k, kn)
        tl.store(DECAY + i, gate_of(tl.load(G + i), kn, GATE_WORK))

    @triton.jit
    def fused_recurrent_decode(Q, Kx, Vx, G, BETA, S, O, QN, KN, DECAY, K: tl.constexpr, V: tl.constexpr,  # noqa: E741
                               BV: tl.constexpr, GATE_WORK: tl.constexpr, PRENORM: tl.constexpr):  # fmt: skip
        t = tl.program_id(0)
        i = tl.program_id(1)
        k = tl.arange(0, K)
        v = t * BV + tl.arange(0, BV)
        if PRENORM:
            qn = tl.load(QN + i * K + k)
            kn = tl.load(KN + i * K + k)
            decay = tl.load(DECAY + i)
        else:  # every V-tile normalises q and k and computes the gate again
            qf = tl.load(Q + i * K + k).to(tl.float32)
            kf = tl.load(Kx + i * K + k).to(tl.float32)
            qn = qf * tl.rsqrt(tl.sum(qf * qf, axis=0) + 1e-6)
            kn = kf * tl.rsqrt(tl.sum(kf * kf, axis=0) + 1e-6)
            decay = gate_of(tl.load(G + i), kn, GATE_WORK)
        s = tl.load(S + i * K * V + k[:, None] * V + v[None, :]) * decay
        vv = tl.load(Vx + i * V + v).to(tl.float32)
        beta = tl.load(BETA + i)
        delta = beta * (vv - tl.sum(kn[:, None] * s, axis=0))
        s = s + kn[:, None] * delta[None, :]
        tl.store(S + i * K * V + k[:, None] * V + v[None, :], s)
        tl.store(O + i * V + v, tl.sum(qn[:, None] * s, axis=0))

    n = heads_total
    torch.manual_seed(0)
    q, kx = (torch.randn(n, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    vx = torch.randn(n, V, device="cuda", dtype=torch.bfloat16)
    g = -torch.rand(n, device="cuda")
    beta = torch.rand(n, device="cuda")
    s0 = torch.randn(n, K, V, device="cuda") * 0.1
    qn, kn = (torch.empty(n, K, device="cuda") for _ in range(2))
    decay = torch.empty(n, device="cuda")
    results = {}
    for cell in launches():
        work = GATES[cell["gate"]]
        if cell["part"] == "prenorm":
            prenorm_qk[(n,)](q, kx, g, qn, kn, decay, K=K, GATE_WORK=work, num_warps=1)
            continue
        s = s0.clone()
        out = torch.empty(n, V, device="cuda")
        bv = cell["bv"]
        fused_recurrent_decode[(V // bv, n)](q, kx, vx, g, beta, s, out, qn, kn, decay, K=K, V=V, BV=bv,
                                             GATE_WORK=work, PRENORM=cell["variant"] == "prenorm",
                                             num_warps=4 if bv == V else 1)  # fmt: skip
        torch.cuda.synchronize()
        results.setdefault(cell["gate"], []).append(out)
    for outs in results.values():  # every variant computes the same step
        for other in outs[1:]:
            torch.testing.assert_close(other, outs[0], rtol=2e-3, atol=2e-3)


def profile(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    cells = []
    for heads_total in BATCHES:
        rep = os.path.join(out_dir, f"decode_{heads_total}.ncu-rep")
        cmd = [
            "ncu",
            "--clock-control",
            "none",
            "--metrics",
            METRICS,
            "-f",
            "-o",
            rep[: -len(".ncu-rep")],
            "--kernel-name",
            "regex:^(fused_recurrent_decode|prenorm_qk)$",
        ]
        for section in SECTIONS:
            cmd += ["--section", section]
        cmd += [sys.executable, os.path.abspath(__file__), "--run", str(heads_total)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        print(" ".join(cmd[:4]), "rc", res.returncode, res.stdout[-800:], res.stderr[-800:], flush=True)
        for page in ("raw", "details"):
            csv_path = os.path.join(out_dir, f"decode_{heads_total}.{page}.csv")
            exported = subprocess.run(["ncu", "--import", rep, "--csv", "--page", page], capture_output=True, text=True)
            with open(csv_path, "w") as f:
                f.write(exported.stdout)
            print(csv_path, "rc", exported.returncode, len(exported.stdout), flush=True)
        os.remove(rep)
        for index, cell in enumerate(launches()):
            repeated = cell["variant"] == "tiled"
            cells.append({**cell, "report": f"decode_{heads_total}", "launch_index": index, "heads_total": heads_total,
                          "grid": [1 if cell.get("bv") == V else V // BV_TILED, heads_total] if cell["part"] == "update"
                          else [heads_total, 1],
                          "repeats_per_tile": repeated,
                          "expected": "repeated work per tile" if repeated else "no repetition"})  # fmt: skip
    doc = {
        "command": "python scripts/make_ncu_matrix.py tests/data/ncu_matrix",
        "rules": ["K001"],
        "dimensions": ["variant", "report", "gate", "part"],
        "K": K,
        "V": V,
        "cells": cells,
    }
    with open(os.path.join(out_dir, "cells.json"), "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="tests/data/ncu_matrix")
    ap.add_argument("--run", type=int, help="(internal) run the launches for this batch*heads, under ncu")
    args = ap.parse_args()
    if args.run:
        workload(args.run)
    else:
        profile(args.out_dir)


if __name__ == "__main__":
    main()
