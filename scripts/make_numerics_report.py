"""Make sample_traces/numerics_tf32.csv on a GPU: a Triton chunked linear-attention recurrence
(gated delta-rule style chunk transition) compared with an fp64 torch reference.

Per chunk t of C tokens (K = V = 64):  S_t = A_t S_{t-1} + k_t^T v_t,  o_t = q_t S_t,
with A_t = diag(decay_t) (I - beta_t u_t u_t^T), decay close to 1 (a slow gate), every product
a `tl.dot` with input_precision in {tf32, tf32x3, ieee}. Partitioned (context-parallel) runs
split the sequence into P parts: each part summarizes (M_p = prod A_t, H_p = state from zero),
a merge scan carries the state across parts (M_p S + H_p, also with tl.dot), then each part
recomputes its outputs from its carried initial state. Conditions: precision, variant,
seq_len, partitions; errors: see tracekit.numerics.compare (outputs o vs the fp64 reference).

Usage (GPU): python scripts/make_numerics_report.py OUT.csv [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracekit.producers.numerics import compare, write_report  # noqa: E402

K = V = 64
CHUNK = 64
SEQ_LENS = [256, 1024, 4096, 16384]
PRECISIONS = ["tf32", "tf32x3", "ieee"]
PARTITIONS = [1, 4]
DECAY = 0.003


def make_inputs(n_chunks, dev, seed=0, decay=DECAY):
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    f64 = torch.float64
    u = torch.randn(n_chunks, K, 1, generator=g, dtype=f64)
    u = u / u.norm(dim=1, keepdim=True)
    beta = torch.rand(n_chunks, 1, 1, generator=g, dtype=f64) * 0.5
    d = 1.0 - decay * torch.rand(n_chunks, K, 1, generator=g, dtype=f64)
    eye = torch.eye(K, dtype=f64).expand(n_chunks, K, K)
    A = d * (eye - beta * (u @ u.transpose(1, 2)))
    q = torch.randn(n_chunks, CHUNK, K, generator=g, dtype=f64) / K**0.5
    k = torch.randn(n_chunks, CHUNK, K, generator=g, dtype=f64) / K**0.5
    v = 0.1 * torch.randn(n_chunks, CHUNK, V, generator=g, dtype=f64)
    # fp32 inputs; the fp64 reference uses the same (fp32-rounded) values
    A, q, k, v = (x.float().double() for x in (A, q, k, v))
    return A.to(dev), q.to(dev), k.to(dev), v.to(dev)


def reference(A, q, k, v):
    import torch

    S = torch.zeros(K, V, dtype=torch.float64, device=A.device)
    out = torch.empty(A.shape[0], CHUNK, V, dtype=torch.float64, device=A.device)
    for t in range(A.shape[0]):
        S = A[t] @ S + k[t].T @ v[t]
        out[t] = q[t] @ S
    return out


def triton_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def summarize(
        A, KK, VV, M_OUT, H_OUT, per, KD: tl.constexpr, VD: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr
    ):
        p = tl.program_id(0)
        o_k = tl.arange(0, KD)
        o_v = tl.arange(0, VD)
        o_c = tl.arange(0, C)
        m = tl.where(o_k[:, None] == o_k[None, :], 1.0, 0.0).to(tl.float32)
        h = tl.zeros([KD, VD], dtype=tl.float32)
        for i in range(per):
            t = p * per + i
            a = tl.load(A + t * KD * KD + o_k[:, None] * KD + o_k[None, :])
            kt = tl.load(KK + t * C * KD + o_k[:, None] + o_c[None, :] * KD)  # [KD, C] = k^T
            vt = tl.load(VV + t * C * VD + o_c[:, None] * VD + o_v[None, :])
            h = tl.dot(a, h, input_precision=PREC) + tl.dot(kt, vt, input_precision=PREC)
            m = tl.dot(a, m, input_precision=PREC)
        tl.store(M_OUT + p * KD * KD + o_k[:, None] * KD + o_k[None, :], m)
        tl.store(H_OUT + p * KD * VD + o_k[:, None] * VD + o_v[None, :], h)

    @triton.jit
    def merge(M, H, S0_OUT, P, KD: tl.constexpr, VD: tl.constexpr, PREC: tl.constexpr):
        o_k = tl.arange(0, KD)
        o_v = tl.arange(0, VD)
        s = tl.zeros([KD, VD], dtype=tl.float32)
        for p in range(P):
            tl.store(S0_OUT + p * KD * VD + o_k[:, None] * VD + o_v[None, :], s)
            m = tl.load(M + p * KD * KD + o_k[:, None] * KD + o_k[None, :])
            h = tl.load(H + p * KD * VD + o_k[:, None] * VD + o_v[None, :])
            s = tl.dot(m, s, input_precision=PREC) + h

    @triton.jit
    def recur(A, Q, KK, VV, S0, O, per, KD: tl.constexpr, VD: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr):  # noqa: E741
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

    return summarize, merge, recur


def run_triton(kernels, A, q, k, v, prec, parts):
    import torch

    summarize, merge, recur = kernels
    n = A.shape[0]
    per = n // parts
    A32, q32, k32, v32 = (x.float().contiguous() for x in (A, q, k, v))
    dev = A.device
    s0 = torch.zeros(parts, K, V, device=dev, dtype=torch.float32)
    if parts > 1:
        m = torch.empty(parts, K, K, device=dev, dtype=torch.float32)
        h = torch.empty(parts, K, V, device=dev, dtype=torch.float32)
        summarize[(parts,)](A32, k32, v32, m, h, per, KD=K, VD=V, C=CHUNK, PREC=prec)
        merge[(1,)](m, h, s0, parts, KD=K, VD=V, PREC=prec)
    out = torch.empty(n, CHUNK, V, device=dev, dtype=torch.float32)
    recur[(parts,)](A32, q32, k32, v32, s0, out, per, KD=K, VD=V, C=CHUNK, PREC=prec)
    torch.cuda.synchronize()
    return out


def main(argv: list[str]) -> int:
    import torch

    out_path = Path(argv[0]) if argv else Path("sample_traces/numerics_tf32.csv")
    seq_lens = SEQ_LENS[:2] if "--quick" in argv else SEQ_LENS
    kernels = triton_kernels()
    dev = "cuda"
    rows: list[dict] = []
    n_max = max(seq_lens) // CHUNK
    A, q, k, v = make_inputs(n_max, dev)
    for seq_len in seq_lens:
        n = seq_len // CHUNK
        ref = reference(A[:n], q[:n], k[:n], v[:n])
        for parts in PARTITIONS:
            for prec in PRECISIONS:
                t0 = time.perf_counter()
                out = run_triton(kernels, A[:n], q[:n], k[:n], v[:n], prec, parts)
                ms = (time.perf_counter() - t0) * 1e3
                row = compare(
                    ref,
                    out,
                    rows=rows,
                    precision=prec,
                    variant="partitioned" if parts > 1 else "unpartitioned",
                    seq_len=seq_len,
                    partitions=parts,
                    dtype="fp32",
                    device=torch.cuda.get_device_name(),
                )
                print(row, f"{ms:.1f} ms", flush=True)
    write_report(rows, out_path)
    print(f"wrote {len(rows)} rows to {out_path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
