"""A variation matrix of real correctness reports for the numerics rules (N001 drift, N002 TF32).

The project's Triton chunked linear-attention recurrence (scripts/make_numerics_report.py: every
product a `tl.dot` with input_precision tf32 / tf32x3 / ieee, partitioned runs carrying the state
across parts as a context-parallel path does) and a plain torch fp32 recurrence with TF32 off, all
against an fp64 reference, for several input distributions and lengths 1k-64k. The reports are
written the way real correctness reports are: condition columns mixed with per-row measurements
(the reference's magnitude, non-finite counts, time, the difference against the unpartitioned run),
the length named T, seqlen, num_tokens or context_len, and several error metrics for the outputs
and for the final state.

    python scripts/make_numerics_matrix.py tests/data/numerics_matrix/

writes
  fla_style.csv          T, dist, precision, cp + o_/ht_ rel Frobenius, max abs, mean abs, ...
  seqlen_style.jsonl     seqlen, input_precision, partitions (normal inputs) + *_out / *_state metrics
  healthy_num_tokens.csv num_tokens, precision in {tf32x3, ieee, torch_fp32}: no TF32 rows
  context_len_tf32.csv   context_len, precision in {tf32, ieee}, uniform inputs, outputs only
and cells.json: which findings each report must give.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_numerics_report import CHUNK, K, V, make_inputs, reference  # noqa: E402

LENGTHS = [1024, 4096, 16384, 65536]
DISTS = ["normal", "uniform", "heavy"]
TRITON_PRECISIONS = ["tf32", "tf32x3", "ieee"]


def shaped_inputs(n_chunks: int, dist: str, dev: str):
    """make_inputs' recurrence (a slow gate), with q/k/v drawn from another distribution."""
    import torch

    A, q, k, v = make_inputs(n_chunks, dev, seed=1)
    if dist == "normal":
        return A, q, k, v
    g = torch.Generator(device="cpu").manual_seed(2)
    if dist == "uniform":
        draw = lambda shape: (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * 3**0.5  # noqa: E731
    else:  # heavy-tailed: Student t with 3 degrees of freedom, scaled to unit variance
        torch.manual_seed(3)
        t3 = torch.distributions.StudentT(3.0)
        draw = lambda shape: t3.sample(shape).double() / 3**0.5  # noqa: E731
    q, k = (draw(x.shape) / K**0.5 for x in (q, k))
    v = 0.1 * draw(v.shape)
    return A, q.float().double().to(dev), k.float().double().to(dev), v.float().double().to(dev)


def kernels():
    import triton
    import triton.language as tl
    from make_numerics_report import triton_kernels

    summarize, merge, _ = triton_kernels()

    @triton.jit
    def recur_state(A, Q, KK, VV, S0, O, S_OUT, per, KD: tl.constexpr, VD: tl.constexpr, C: tl.constexpr,  # noqa: E741
                    PREC: tl.constexpr):  # fmt: skip
        p = tl.program_id(0)
        o_k = tl.arange(0, KD)
        o_v = tl.arange(0, VD)
        o_c = tl.arange(0, C)
        s = tl.load(S0 + p * KD * VD + o_k[:, None] * VD + o_v[None, :])
        for i in range(per):
            t = p * per + i
            a = tl.load(A + t * KD * KD + o_k[:, None] * KD + o_k[None, :])
            kt = tl.load(KK + t * C * KD + o_k[:, None] + o_c[None, :] * KD)
            vt = tl.load(VV + t * C * VD + o_c[:, None] * VD + o_v[None, :])
            qt = tl.load(Q + t * C * KD + o_c[:, None] * KD + o_k[None, :])
            s = tl.dot(a, s, input_precision=PREC) + tl.dot(kt, vt, input_precision=PREC)
            o = tl.dot(qt, s, input_precision=PREC)
            tl.store(O + t * C * VD + o_c[:, None] * VD + o_v[None, :], o)
        tl.store(S_OUT + p * KD * VD + o_k[:, None] * VD + o_v[None, :], s)

    return summarize, merge, recur_state


def run_triton(ks, A, q, k, v, prec: str, parts: int):
    import torch

    summarize, merge, recur_state = ks
    n = A.shape[0]
    per = n // parts
    A32, q32, k32, v32 = (x.float().contiguous() for x in (A, q, k, v))
    s0 = torch.zeros(parts, K, V, device=A.device, dtype=torch.float32)
    if parts > 1:
        m = torch.empty(parts, K, K, device=A.device, dtype=torch.float32)
        h = torch.empty(parts, K, V, device=A.device, dtype=torch.float32)
        summarize[(parts,)](A32, k32, v32, m, h, per, KD=K, VD=V, C=CHUNK, PREC=prec)
        merge[(1,)](m, h, s0, parts, KD=K, VD=V, PREC=prec)
    out = torch.empty(n, CHUNK, V, device=A.device, dtype=torch.float32)
    s_out = torch.empty(parts, K, V, device=A.device, dtype=torch.float32)
    recur_state[(parts,)](A32, q32, k32, v32, s0, out, s_out, per, KD=K, VD=V, C=CHUNK, PREC=prec)
    torch.cuda.synchronize()
    return out, s_out[-1]


def run_torch_fp32(A, q, k, v):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    A32, q32, k32, v32 = (x.float() for x in (A, q, k, v))
    S = torch.zeros(K, V, dtype=torch.float32, device=A.device)
    out = torch.empty(A.shape[0], CHUNK, V, dtype=torch.float32, device=A.device)
    for t in range(A.shape[0]):
        S = A32[t] @ S + k32[t].T @ v32[t]
        out[t] = q32[t] @ S
    return out, S


def final_state(A, k, v):
    import torch

    S = torch.zeros(K, V, dtype=torch.float64, device=A.device)
    for t in range(A.shape[0]):
        S = A[t] @ S + k[t].T @ v[t]
    return S


def metrics(ref, got) -> dict:
    import torch

    r, g = ref.double(), got.double()
    diff = (g - r).abs()
    return {
        "rel_fro": float(torch.linalg.vector_norm(g - r) / torch.linalg.vector_norm(r)),
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "nonfinite": int((~torch.isfinite(g)).sum()),
    }


def measure(ks, dev: str):
    """Every (dist, length, precision, partitions) cell: output and state metrics against fp64."""
    rows = []
    for dist in DISTS:
        A, q, k, v = shaped_inputs(max(LENGTHS) // CHUNK, dist, dev)
        for length in LENGTHS:
            n = length // CHUNK
            ref_o = reference(A[:n], q[:n], k[:n], v[:n])
            ref_s = final_state(A[:n], k[:n], v[:n])
            runs = [(p, parts) for p in TRITON_PRECISIONS for parts in (1, 4)] + [("torch_fp32", 1)]
            unpartitioned = {}
            for prec, parts in runs:
                t0 = time.perf_counter()
                if prec == "torch_fp32":
                    out, state = run_torch_fp32(A[:n], q[:n], k[:n], v[:n])
                else:
                    out, state = run_triton(ks, A[:n], q[:n], k[:n], v[:n], prec, parts)
                ms = (time.perf_counter() - t0) * 1e3
                if parts == 1:
                    unpartitioned[prec] = out
                vs = metrics(unpartitioned[prec], out)["rel_fro"] if parts > 1 else 0.0
                rows.append({"dist": dist, "length": length, "precision": prec, "parts": parts, "ms": round(ms, 3),
                             "ref_absmax": float(ref_o.abs().max()), "out": metrics(ref_o, out),
                             "state": metrics(ref_s, state), "diff_vs_unpartitioned": vs})  # fmt: skip
                print(dist, length, prec, parts, rows[-1]["out"]["rel_fro"], rows[-1]["state"]["rel_fro"], flush=True)
    return rows


def write_csv(path: Path, records: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)


def main(argv: list[str]) -> int:
    import torch

    out = Path(argv[0] if argv else "tests/data/numerics_matrix")
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(kernels(), "cuda")
    device = torch.cuda.get_device_name()
    write_csv(out / "fla_style.csv", [
        {"T": r["length"], "dist": r["dist"], "precision": r["precision"], "cp": r["parts"],
         "ref_o_absmax": r["ref_absmax"], "o_rel_fro": r["out"]["rel_fro"], "o_max_abs": r["out"]["max_abs"],
         "o_mean_abs": r["out"]["mean_abs"], "ht_rel_fro": r["state"]["rel_fro"], "ht_max_abs": r["state"]["max_abs"],
         "nonfinite": r["out"]["nonfinite"], "diff_vs_cp1": r["diff_vs_unpartitioned"], "ms": r["ms"]}
        for r in rows
    ])  # fmt: skip
    with (out / "seqlen_style.jsonl").open("w") as f:
        for r in rows:
            if r["dist"] == "normal" and r["precision"] != "torch_fp32":
                f.write(json.dumps({"seqlen": r["length"], "input_precision": r["precision"],
                                    "partitions": r["parts"], "device": device,
                                    "rel_fro_out": r["out"]["rel_fro"], "max_abs_out": r["out"]["max_abs"],
                                    "mean_abs_out": r["out"]["mean_abs"], "rel_fro_state": r["state"]["rel_fro"],
                                    "max_abs_state": r["state"]["max_abs"], "wall_ms": r["ms"]}) + "\n")  # fmt: skip
    write_csv(out / "healthy_num_tokens.csv", [
        {"num_tokens": r["length"], "precision": r["precision"], "inputs": r["dist"], "partitions": r["parts"],
         "rel_err": r["out"]["rel_fro"], "abs_err_max": r["out"]["max_abs"], "ref_scale": r["ref_absmax"]}
        for r in rows if r["precision"] in ("tf32x3", "ieee", "torch_fp32")
    ])  # fmt: skip
    write_csv(out / "context_len_tf32.csv", [
        {"context_len": r["length"], "precision": r["precision"], "max_abs_error": r["out"]["max_abs"],
         "mean_abs_error": r["out"]["mean_abs"], "relative_error": r["out"]["rel_fro"]}
        for r in rows if r["dist"] == "uniform" and r["parts"] == 1 and r["precision"] in ("tf32", "ieee")
    ])  # fmt: skip
    cells = {
        "command": "python scripts/make_numerics_matrix.py tests/data/numerics_matrix",
        "rules": ["N001", "N002", "N003"],
        "device": device, "torch_version": torch.__version__,
        "reports": {
            "fla_style.csv": {"tf32_signature": True, "conditions": ["T", "dist", "precision", "cp"]},
            "seqlen_style.jsonl": {"tf32_signature": True, "conditions": ["seqlen", "input_precision", "partitions"]},
            "healthy_num_tokens.csv": {"tf32_signature": False,
                                       "conditions": ["num_tokens", "precision", "inputs", "partitions"]},
            "context_len_tf32.csv": {"tf32_signature": True, "conditions": ["context_len", "precision"]},
        },
    }  # fmt: skip
    (out / "cells.json").write_text(json.dumps(cells, indent=1) + "\n")
    print(f"wrote {len(rows)} measurements to {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
