"""Kineto traces of a custom op that rebuilds the same rotary cache several times per call, and its fix.

A realistic decode-loop bug: `mylib::rope_cache` (a torch.library custom op, so it shows as a
cpu_op) recomputes the cos/sin tables for the same positions `--repeats` times inside one call
(e.g. once per attention head group) instead of once. Every repeat launches identical kernels
(same name, grid, block) on unchanged inputs. The healthy variant builds the tables once.

Run on the GPU machine:
    python scripts/make_repeated_launch_trace.py --out-dir OUT
Writes OUT/repeated_rope_cache.json.gz (repeats=4) and OUT/single_rope_cache.json.gz (repeats=1).
"""

import argparse
import gzip
import os
import shutil
import tempfile


def run(out_path: str, repeats: int, steps: int = 8) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    @torch.library.custom_op(f"mylib::rope_cache_r{repeats}", mutates_args=())
    def rope_cache(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        out = None
        for _ in range(repeats):  # the bug: the same table, rebuilt per head group
            freqs = torch.outer(positions.float(), inv_freq)
            out = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        return out

    dev = "cuda"
    dim, heads_dim = 4096, 128
    inv_freq = 1.0 / (10000 ** (torch.arange(0, heads_dim, 2, device=dev).float() / heads_dim))
    x = torch.randn(64, dim, device=dev, dtype=torch.bfloat16)
    w = torch.randn(dim, dim, device=dev, dtype=torch.bfloat16)
    positions = torch.arange(0, 2048, device=dev)
    for _ in range(3):  # warm-up, outside the profile
        torch.ops.mylib.__getattr__(f"rope_cache_r{repeats}")(positions, inv_freq)
        x @ w
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True) as prof:
        for step in range(steps):
            with record_function(f"decode_step#{step}"):
                cache = torch.ops.mylib.__getattr__(f"rope_cache_r{repeats}")(positions + step, inv_freq)
                y = (x @ w).float() * cache[: x.shape[0], :1]
            torch.cuda.synchronize()
    del y
    tmp = tempfile.mkdtemp()
    try:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(out_path, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
    finally:
        shutil.rmtree(tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="sample_traces")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    run(os.path.join(args.out_dir, "repeated_rope_cache.json.gz"), repeats=4)
    run(os.path.join(args.out_dir, "single_rope_cache.json.gz"), repeats=1)
    print("ok")


if __name__ == "__main__":
    main()
