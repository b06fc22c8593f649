#!/usr/bin/env python3
"""Generate the real PyTorch profiler (Kineto) sample traces shipped in sample_traces/.

Every trace is produced by torch.profiler.profile(..., record_shapes=True,
with_stack=True) over a small, real workload, exported with
prof.export_chrome_trace() and gzipped. Each run records an entry in
sample_traces/MANIFEST.json (file name -> command, torch version, device name,
UTC date, workload parameters).

Subcommands
-----------
cpu
    Runs here on any machine with a CPU build of torch.
    activities=[CPU]. Two Python threads do real torch work concurrently:
      * the main thread runs a tiny decoder-style model forward loop
        (embedding, matmuls, softmax attention, layernorm, MLP), one
        record_function("step#N") per step, with prof.step() driving a
        schedule (wait=1, warmup=1, active=N);
      * a second thread, threading.Thread(name="kv_transfer") (OS thread name
        also set to "kv_transfer" via prctl), does tensor copy/cat/clone work
        ("kv_transfer#N" annotations) plus some pure-Python work (checksums
        over a list of ints) in between.
    Profiled with experimental_config=_ExperimentalConfig(profile_all_threads=True)
    so aten ops of both threads are recorded (by default only the thread that
    started the profiler gets cpu_op events; python_function events come from
    every thread either way).
    Writes sample_traces/cpu_two_threads.json.gz.
    Produced with: python3 scripts/make_sample_traces.py cpu
    (torch 2.13.0+cpu from a throwaway venv).

gpu --graphs {off,on}
    Runs on one CUDA GPU. LLM-style inference with a small decoder-only
    transformer in plain torch (default 4 layers, hidden 1024, 16 heads,
    vocab 32000, bf16, learned positions, KV cache as preallocated
    [layers, batch, heads, max_seq, head_dim] tensors). One profiled
    generate(): a prefill of batch 4 x 512 prompt tokens (SDPA, causal) then
    32 greedy decode steps. After every decode step the loop does the usual
    stop-token check `(next_tok == eos).all().item()`, a device->host sync
    on every step (what the host-sync rules should find).
      --graphs off: every decode step runs eagerly (one kernel launch per op).
      --graphs on:  the decode step (all layers + lm_head + argmax) is captured
                    once into a torch.cuda.CUDAGraph on static input buffers
                    (token ids, position) and replayed each step; only the
                    input updates and the stop check run outside the graph.
    A full unprofiled generate() runs first as warm-up (and, for --graphs on,
    the capture happens before profiling), so the trace is steady state.
    activities=[CPU, CUDA]; annotations "prefill" and "decode_step".
    Writes sample_traces/gpu_prefill_decode_eager.json.gz or
    sample_traces/gpu_prefill_decode_cudagraph.json.gz.
    Produced with (on one H200 of an nvidia-h200-x2 machine, torch 2.11.0+cu130):
      python3 scripts/make_sample_traces.py gpu --graphs off
      python3 scripts/make_sample_traces.py gpu --graphs on

gpu-tp
    Runs on 2 CUDA GPUs: the same model, tensor parallel over 2 ranks
    (torch.multiprocessing.spawn, one process per GPU, NCCL backend).
    QKV and MLP-up are column-parallel, attention-out and MLP-down are
    row-parallel followed by dist.all_reduce (2 all-reduces per layer),
    heads split across ranks, embedding/lm_head replicated. Prefill of
    batch 4 x 512 plus 8 eager greedy decode steps with the same .item()
    stop check. The profiler records distributedInfo (rank, world_size).
    NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
    NVSHMEM_DISABLE_NVLS=1 are forced in os.environ before anything starts.
    Writes sample_traces/gpu_tp2_rank0.json.gz and gpu_tp2_rank1.json.gz.
    Produced with: python3 scripts/make_sample_traces.py gpu-tp

All subcommands take --out-dir (default: sample_traces/ next to this script's
parent). The manifest lives in the output directory and is extended, never
truncated.
"""

from __future__ import annotations

import os

# Required on the shared multi-GPU machines: never use NVLink multicast.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import datetime as _dt
import gzip
import json
import math
import platform
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "sample_traces"
SCRIPT_REL = "scripts/make_sample_traces.py"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _torch():
    import torch  # imported lazily so `--help` works without torch

    return torch


def export_gz(prof, out_path: Path) -> int:
    """prof.export_chrome_trace() to a temp file, then gzip (mtime=0) to out_path."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        raw = Path(td) / (out_path.name[: -len(".gz")] if out_path.name.endswith(".gz") else out_path.name)
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as fin, open(out_path, "wb") as fraw:
            with gzip.GzipFile(filename=raw.name, mode="wb", fileobj=fraw, mtime=0, compresslevel=9) as fout:
                shutil.copyfileobj(fin, fout)
    size = out_path.stat().st_size
    print(f"wrote {out_path} ({size / 1e6:.2f} MB gzipped)", flush=True)
    return size


def command_string(argv: list[str]) -> str:
    """The command as it should be re-run from the repo root (without --out-dir)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--out-dir":
            skip = True
            continue
        if a.startswith("--out-dir="):
            continue
        out.append(a)
    return " ".join(["python3", SCRIPT_REL, *out])


def update_manifest(out_dir: Path, entries: dict[str, dict]) -> None:
    path = out_dir / "MANIFEST.json"
    data: dict = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            data = {}
    data.update(entries)
    path.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")
    print(f"updated {path}", flush=True)


def base_entry(argv: list[str], device: str, **extra) -> dict:
    torch = _torch()
    entry = {
        "command": command_string(argv),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "device": device,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    entry.update(extra)
    return entry


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def set_os_thread_name(name: str) -> None:
    """Set the OS-level (comm) thread name so profilers that read it see it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:  # pragma: no cover - best effort
        pass


# --------------------------------------------------------------------------
# model (plain torch, decoder-only, preallocated KV cache)
# --------------------------------------------------------------------------


def build_model_classes():
    torch = _torch()
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        """One decoder block. With tp_world > 1 the linears are sharded
        Megatron-style and the row-parallel outputs are all-reduced."""

        def __init__(self, hidden: int, heads: int, tp_world: int = 1):
            super().__init__()
            assert heads % tp_world == 0 and hidden % heads == 0
            self.tp_world = tp_world
            self.local_heads = heads // tp_world
            self.head_dim = hidden // heads
            local = self.local_heads * self.head_dim
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * local, bias=False)  # column-parallel
            self.out = nn.Linear(local, hidden, bias=False)  # row-parallel
            self.ln2 = nn.LayerNorm(hidden)
            self.up = nn.Linear(hidden, 4 * hidden // tp_world, bias=False)  # column-parallel
            self.down = nn.Linear(4 * hidden // tp_world, hidden, bias=False)  # row-parallel

        def _reduce(self, x):
            if self.tp_world > 1:
                import torch.distributed as dist

                dist.all_reduce(x)
            return x

        def _split_heads(self, x):
            b, s, _ = x.shape
            q, k, v = x.view(b, s, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            return q, k, v  # each [b, h, s, d]

        def prefill(self, x, k_cache, v_cache):
            b, s, _ = x.shape
            q, k, v = self._split_heads(self.qkv(self.ln1(x)))
            k_cache[:, :, :s].copy_(k)
            v_cache[:, :, :s].copy_(v)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a.transpose(1, 2).reshape(b, s, -1)
            x = x + self._reduce(self.out(a))
            x = x + self._reduce(self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh")))
            return x

        def decode(self, x, k_cache, v_cache, pos, future_mask):
            # x: [b, 1, hidden]; pos: [1] long tensor on device (graph-safe)
            b = x.shape[0]
            q, k, v = self._split_heads(self.qkv(self.ln1(x)))
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
            scores = torch.matmul(q, k_cache.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
            scores = scores.masked_fill(future_mask, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            a = torch.matmul(probs, v_cache)  # [b, h, 1, d]
            a = a.transpose(1, 2).reshape(b, 1, -1)
            x = x + self._reduce(self.out(a))
            x = x + self._reduce(self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh")))
            return x

    class TinyLM(nn.Module):
        def __init__(self, vocab, hidden, heads, layers, max_seq, batch, dtype, device, tp_world=1):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.pos_embed = nn.Embedding(max_seq, hidden)
            self.blocks = nn.ModuleList([Block(hidden, heads, tp_world) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            self.to(device=device, dtype=dtype)
            local_heads = heads // tp_world
            hd = hidden // heads
            shape = (layers, batch, local_heads, max_seq, hd)
            self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
            self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
            self.register_buffer("seq_idx", torch.arange(max_seq, device=device), persistent=False)

        @torch.no_grad()
        def prefill(self, ids):
            s = ids.shape[1]
            x = self.embed(ids) + self.pos_embed(self.seq_idx[:s])
            for i, blk in enumerate(self.blocks):
                x = blk.prefill(x, self.k_cache[i], self.v_cache[i])
            logits = self.lm_head(self.ln_f(x[:, -1:]))  # last position only
            return logits.argmax(-1)  # [b, 1]

        @torch.no_grad()
        def decode_step(self, ids, pos):
            # ids [b, 1] long, pos [1] long; both device tensors (static under graphs)
            x = self.embed(ids) + self.pos_embed(pos)
            future_mask = self.seq_idx > pos  # [max_seq] bool
            for i, blk in enumerate(self.blocks):
                x = blk.decode(x, self.k_cache[i], self.v_cache[i], pos, future_mask)
            logits = self.lm_head(self.ln_f(x))
            return logits.argmax(-1)  # [b, 1]

    return TinyLM


# --------------------------------------------------------------------------
# cpu
# --------------------------------------------------------------------------


def cmd_cpu(args, argv) -> None:
    torch = _torch()
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.manual_seed(0)
    torch.set_num_threads(args.intra_op_threads)
    vocab, hidden, heads, layers, seq, batch = 2048, 128, 4, 2, 64, 2
    hd = hidden // heads

    def p(*shape):
        return torch.randn(*shape) * 0.02

    W = {
        "embed": p(vocab, hidden),
        "lm_head": p(hidden, vocab),
        "layers": [
            {
                "wqkv": p(hidden, 3 * hidden),
                "wo": p(hidden, hidden),
                "w1": p(hidden, 4 * hidden),
                "w2": p(4 * hidden, hidden),
                "ln1": (torch.ones(hidden), torch.zeros(hidden)),
                "ln2": (torch.ones(hidden), torch.zeros(hidden)),
            }
            for _ in range(layers)
        ],
    }
    causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)

    def forward(ids):
        x = F.embedding(ids, W["embed"])
        for L in W["layers"]:
            h = F.layer_norm(x, (hidden,), *L["ln1"])
            q, k, v = torch.matmul(h, L["wqkv"]).split(hidden, dim=-1)
            q = q.view(batch, seq, heads, hd).transpose(1, 2)
            k = k.view(batch, seq, heads, hd).transpose(1, 2)
            v = v.view(batch, seq, heads, hd).transpose(1, 2)
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(causal, float("-inf"))
            a = torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2).reshape(batch, seq, hidden)
            x = x + torch.matmul(a, L["wo"])
            h = F.layer_norm(x, (hidden,), *L["ln2"])
            x = x + torch.matmul(F.gelu(torch.matmul(h, L["w1"])), L["w2"])
        return torch.matmul(x[:, -1], W["lm_head"]).argmax(-1)

    stop = threading.Event()
    go = threading.Event()
    kv_stats = {"iters": 0}

    def kv_transfer():
        set_os_thread_name("kv_transfer")
        pages = [torch.randn(8, heads, 16, hd) for _ in range(8)]
        go.wait()
        n = 0
        while not stop.is_set():
            with record_function(f"kv_transfer#{n}"):
                staged = [pg.clone() for pg in pages]
                block = torch.cat(staged, dim=2)  # gather pages into one block
                dst = torch.empty_like(block)
                dst.copy_(block)
                pages = list(dst.split(16, dim=2))
                pages = [pg.contiguous() for pg in pages]
                # pure-Python bookkeeping (page table checksum)
                table = list(range(n, n + 4000))
                chk = 0
                for t in table:
                    chk = (chk * 31 + t) % 1_000_003
                kv_stats["chk"] = chk
            n += 1
            time.sleep(0.0005)
        kv_stats["iters"] = n

    t = threading.Thread(target=kv_transfer, name="kv_transfer", daemon=True)
    t.start()  # started before the profiler so the Python tracer sees it

    ids = torch.randint(0, vocab, (batch, seq))
    for _ in range(2):  # warm-up outside the profiler
        forward(ids)

    out_path = Path(args.out_dir) / "cpu_two_threads.json.gz"
    sched = schedule(wait=1, warmup=1, active=args.steps, repeat=1)
    # By default the profiler only records aten ops of the thread that started
    # it; profile_all_threads=True also records the kv_transfer thread's ops.
    from torch._C._profiler import _ExperimentalConfig

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=sched,
        record_shapes=True,
        with_stack=True,
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
    ) as prof:
        go.set()
        for step in range(args.steps + 2):
            with record_function(f"step#{step}"):
                nxt = forward(ids)
                ids = torch.cat([ids[:, 1:], nxt[:, None]], dim=1)
            prof.step()
        stop.set()
        t.join()
    size = export_gz(prof, out_path)
    update_manifest(
        Path(args.out_dir),
        {
            out_path.name: base_entry(
                argv,
                f"CPU: {cpu_name()}",
                activities=["CPU"],
                workload=(
                    f"main thread: {layers}-layer decoder forward (hidden {hidden}, {heads} heads, seq {seq}, "
                    f"batch {batch}, fp32), schedule wait=1 warmup=1 active={args.steps}; "
                    f"thread 'kv_transfer': clone/cat/copy_/split/contiguous + pure-Python checksum loop "
                    f"({kv_stats['iters']} iterations)"
                ),
                intra_op_threads=args.intra_op_threads,
                size_bytes=size,
            )
        },
    )


# --------------------------------------------------------------------------
# gpu (single GPU, eager or CUDA graphs)
# --------------------------------------------------------------------------


def gpu_generate(torch, model, prompt, steps, eos_id, record_function, graph_state=None):
    """Prefill + greedy decode. Returns generated token ids [b, n] on host."""
    b, s = prompt.shape
    dev = prompt.device
    out_tokens = []
    with record_function("prefill"):
        tok = model.prefill(prompt)
    out_tokens.append(tok)
    if graph_state is not None:
        static_ids, static_pos, static_next, graph = graph_state
        static_ids.copy_(tok)
        static_pos.fill_(s)
    else:
        pos = torch.full((1,), s, dtype=torch.long, device=dev)
    for i in range(steps):
        with record_function("decode_step"):
            if graph_state is not None:
                graph.replay()
                tok = static_next.clone()
                static_ids.copy_(static_next)
                static_pos.add_(1)
            else:
                tok = model.decode_step(tok, pos)
                pos = pos + 1
            out_tokens.append(tok)
            # Stop-token check: device->host sync every step.
            if (tok == eos_id).all().item():
                break
    return torch.cat(out_tokens, dim=1).cpu()


def capture_decode_graph(torch, model, batch, device):
    static_ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
    static_pos = torch.zeros((1,), dtype=torch.long, device=device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model.decode_step(static_ids, static_pos)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_next = model.decode_step(static_ids, static_pos)
    torch.cuda.synchronize()
    return static_ids, static_pos, static_next, graph


def cmd_gpu(args, argv) -> None:
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile, record_function

    assert torch.cuda.is_available(), "gpu subcommand needs CUDA"
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    TinyLM = build_model_classes()
    max_seq = args.prompt_len + args.steps + 1
    model = TinyLM(args.vocab, args.hidden, args.heads, args.layers, max_seq, args.batch, torch.bfloat16, device).eval()
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt_len), device=device)
    eos_id = args.vocab - 1  # random weights: effectively never all-EOS, so all steps run

    graph_state = None
    if args.graphs == "on":
        graph_state = capture_decode_graph(torch, model, args.batch, device)

    with torch.no_grad():
        for _ in range(2):  # warm-up: cuBLAS heuristics, allocator, lazy init
            gpu_generate(torch, model, prompt, args.steps, eos_id, record_function, graph_state)
    torch.cuda.synchronize()

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        record_shapes=True,
        with_stack=True,
    ) as prof:
        with torch.no_grad():
            toks = gpu_generate(torch, model, prompt, args.steps, eos_id, record_function, graph_state)
        torch.cuda.synchronize()
    name = "gpu_prefill_decode_cudagraph.json.gz" if args.graphs == "on" else "gpu_prefill_decode_eager.json.gz"
    out_path = Path(args.out_dir) / name
    size = export_gz(prof, out_path)
    update_manifest(
        Path(args.out_dir),
        {
            name: base_entry(
                argv,
                torch.cuda.get_device_name(device),
                activities=["CPU", "CUDA"],
                workload=(
                    f"decoder-only LM, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, "
                    f"vocab {args.vocab}, bf16; prefill batch {args.batch} x {args.prompt_len}; "
                    f"{toks.shape[1] - 1} greedy decode steps, per-step .item() stop check; "
                    f"decode {'captured in one torch.cuda.CUDAGraph and replayed' if args.graphs == 'on' else 'eager'}"
                ),
                size_bytes=size,
            )
        },
    )


# --------------------------------------------------------------------------
# gpu-tp (2 ranks, NCCL)
# --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, world: int, args, port: int, result_q) -> None:
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[k] = v
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch = _torch()
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    try:
        TinyLM = build_model_classes()
        max_seq = args.prompt_len + args.steps + 1
        torch.manual_seed(1234 + rank)  # shards differ per rank
        model = TinyLM(
            args.vocab,
            args.hidden,
            args.heads,
            args.layers,
            max_seq,
            args.batch,
            torch.bfloat16,
            device,
            tp_world=world,
        ).eval()
        # replicated parts must match across ranks
        with torch.no_grad():
            for t in (model.embed.weight, model.pos_embed.weight, model.lm_head.weight):
                dist.broadcast(t, src=0)
        g = torch.Generator(device="cpu").manual_seed(0)
        prompt = torch.randint(0, args.vocab, (args.batch, args.prompt_len), generator=g).to(device)
        eos_id = args.vocab - 1
        with torch.no_grad():
            for _ in range(2):
                gpu_generate(torch, model, prompt, args.steps, eos_id, record_function)
        torch.cuda.synchronize()
        dist.barrier()
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            record_shapes=True,
            with_stack=True,
        ) as prof:
            with torch.no_grad():
                toks = gpu_generate(torch, model, prompt, args.steps, eos_id, record_function)
            torch.cuda.synchronize()
        out_path = Path(args.out_dir) / f"gpu_tp2_rank{rank}.json.gz"
        size = export_gz(prof, out_path)
        result_q.put((rank, out_path.name, size, torch.cuda.get_device_name(device), int(toks.shape[1] - 1)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def cmd_gpu_tp(args, argv) -> None:
    torch = _torch()
    import torch.multiprocessing as mp

    world = args.world_size
    assert torch.cuda.device_count() >= world, f"need {world} GPUs, have {torch.cuda.device_count()}"
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = _free_port()
    wargs = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "func"})
    mp.spawn(_tp_worker, args=(world, wargs, port, q), nprocs=world, join=True)
    results = sorted(q.get() for _ in range(world))
    entries = {}
    for rank, name, size, dev_name, nsteps in results:
        entries[name] = base_entry(
            argv,
            f"{dev_name} (rank {rank} of {world}, cuda:{rank})",
            activities=["CPU", "CUDA"],
            workload=(
                f"tensor-parallel (TP={world}, NCCL) decoder-only LM, {args.layers} layers, hidden {args.hidden}, "
                f"{args.heads} heads, bf16; column-parallel qkv/up, row-parallel out/down + dist.all_reduce; "
                f"prefill batch {args.batch} x {args.prompt_len}; {nsteps} eager greedy decode steps, "
                f"per-step .item() stop check"
            ),
            rank=rank,
            world_size=world,
            size_bytes=size,
        )
    update_manifest(Path(args.out_dir), entries)


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--out-dir", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")

    def model_args(sp, steps):
        sp.add_argument("--layers", type=int, default=4)
        sp.add_argument("--hidden", type=int, default=1024)
        sp.add_argument("--heads", type=int, default=16)
        sp.add_argument("--vocab", type=int, default=32000)
        sp.add_argument("--batch", type=int, default=4)
        sp.add_argument("--prompt-len", type=int, default=512)
        sp.add_argument("--steps", type=int, default=steps, help="decode steps (default: %(default)s)")

    sp = sub.add_parser("cpu", help="CPU profiler, two Python threads")
    common(sp)
    sp.add_argument("--steps", type=int, default=6, help="active profiled steps (default: %(default)s)")
    sp.add_argument("--intra-op-threads", type=int, default=2)
    sp.set_defaults(func=cmd_cpu)

    sp = sub.add_parser("gpu", help="single-GPU prefill + decode, eager or CUDA graphs")
    common(sp)
    sp.add_argument("--graphs", choices=["off", "on"], required=True)
    model_args(sp, 32)
    sp.set_defaults(func=cmd_gpu)

    sp = sub.add_parser("gpu-tp", help="2-GPU tensor-parallel prefill + decode (NCCL)")
    common(sp)
    sp.add_argument("--world-size", type=int, default=2)
    model_args(sp, 8)
    sp.set_defaults(func=cmd_gpu_tp)
    return ap


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    args.func(args, argv)


if __name__ == "__main__":
    main()
