#!/usr/bin/env python3
"""A with_stack trace of an HF-style decoder's generation loop: most of its events are Python frames.

The public traces that take readers longest per byte are torch.profiler traces recorded with
`with_stack=True` (HF and vLLM/SGLang inference): more than half of their events are
`python_function` frames. This records one for real on one CUDA GPU: a GPT-2-shaped decoder written
the way transformers writes it (nn.Module classes for attention, MLP and block, a KV cache passed
through `forward`, a generate loop sampling greedily from the logits), eager, batch 4, a 128-token
prompt and 32 generated tokens, profiled with record_shapes and with_stack (schedule: 1 wait, 1
warm-up and 2 active generate calls).

    python3 scripts/make_with_stack_trace.py [--out sample_traces] [--layers 12]

-> sample_traces/with_stack_decode.json.gz with its MANIFEST.json entry.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from make_sample_traces import base_entry, export_gz, update_manifest

REPO_ROOT = Path(__file__).resolve().parent.parent
NAME = "with_stack_decode.json.gz"


def build(torch, layers: int, width: int, heads: int, vocab: int):
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)

        def split_heads(self, x):
            b, t, _ = x.shape
            return x.view(b, t, heads, width // heads).transpose(1, 2)

        def forward(self, x, past=None):
            q, k, v = self.qkv(x).split(width, dim=-1)
            q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=past is None)
            y = y.transpose(1, 2).reshape(x.shape)
            return self.proj(y), (k, v)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)

        def forward(self, x):
            return self.out(nn.functional.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn, self.mlp = Attention(), MLP()

        def forward(self, x, past=None):
            a, present = self.attn(self.ln1(x), past)
            x = x + a
            return x + self.mlp(self.ln2(x)), present

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(2048, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, ids, past=None, start=0):
            pos = torch.arange(start, start + ids.shape[1], device=ids.device)
            x = self.wte(ids) + self.wpe(pos)
            presents = []
            for i, block in enumerate(self.blocks):
                x, present = block(x, past[i] if past is not None else None)
                presents.append(present)
            return self.head(self.ln_f(x)), presents

    return Decoder()


def generate(torch, model, prompt, new_tokens: int):
    with torch.profiler.record_function("generate"):
        logits, past = model(prompt)
        ids = logits[:, -1].argmax(-1, keepdim=True)
        out = [ids]
        for step in range(new_tokens - 1):
            with torch.profiler.record_function("decode_step"):
                logits, past = model(ids, past, start=prompt.shape[1] + step)
                ids = logits[:, -1].argmax(-1, keepdim=True)
                out.append(ids)
        return torch.cat(out, dim=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "sample_traces")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    device = "cuda"
    model = build(torch, args.layers, 768, 12, 50257).to(device).eval()
    prompt = torch.randint(0, 50257, (4, 128), device=device)
    with torch.inference_mode():
        generate(torch, model, prompt, 4)  # compile-free warm-up: cuBLAS handles, lazy modules
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True,
                     schedule=schedule(wait=1, warmup=1, active=2)) as prof:  # fmt: skip
            for _ in range(4):
                generate(torch, model, prompt, args.new_tokens)
                torch.cuda.synchronize()
                prof.step()
    out = args.out / NAME
    size = export_gz(prof, out)
    params = sum(p.numel() for p in model.parameters())
    entry = base_entry(
        sys.argv, torch.cuda.get_device_name(), activities=["CPU", "CUDA"], size_bytes=size,
        workload=(f"GPT-2-shaped decoder ({args.layers} layers, width 768, {math.ceil(params / 1e6)}M parameters) "
                  f"written as transformers writes it, eager greedy generation of {args.new_tokens} tokens from a "
                  "4x128 prompt with a KV cache; record_shapes and with_stack; schedule(wait=1, warmup=1, active=2)"),
    )  # fmt: skip
    entry["command"] = "python3 scripts/make_with_stack_trace.py"
    update_manifest(args.out, {NAME: entry})


if __name__ == "__main__":
    main()
