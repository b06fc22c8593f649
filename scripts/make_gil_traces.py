#!/usr/bin/env python3
"""Generate the GIL starvation sample traces: sample_traces/gil_hold.json.gz and gil_release.json.gz.

A small C++ extension (torch.utils.cpp_extension.load_inline) stands in for a native
communication op such as DeepEP's `intranode_dispatch`: it waits on the CPU for `wait_us`
microseconds (a spin on steady_clock, like a host-side poll for a flag), either holding the GIL
(`dispatch_hold`, a plain pybind11 function) or releasing it around the wait
(`dispatch_release`, `py::gil_scoped_release`).

Workload (the same in both modes, only the extension function differs):
  * main thread ("prefill"): `--iters` iterations of [Python/torch "forward" work (~1.5 ms:
    a few small matmuls, plus a pure-Python loop), then the native wait inside
    record_function("deepep_like::intranode_dispatch")]; on CUDA the matmuls run on the GPU;
  * thread "kv_transfer" (threading.Thread name and OS thread name): repeated units of Python work,
    each inside record_function("kv_transfer_chunk"): build a page-descriptor list, a small
    torch op (which releases the GIL, as I/O calls do), a checksum; then time.sleep(0.0003).

Profiled with torch.profiler.profile(activities=[CPU] (+CUDA when available), with_stack=True,
record_shapes=True, experimental_config=_ExperimentalConfig(profile_all_threads=True)).
Each mode runs in its own process (Kineto names a process's threads once, so a second profiled run
in one process would leave its new kv_transfer thread unnamed). Each file gets an entry in
sample_traces/MANIFEST.json.

Produced with: python3 scripts/make_gil_traces.py   (on one H200: torch with CUDA)
Options: --iters N (default 120), --wait-us (default 3000), --out-dir DIR, --modes hold,release.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

# same helpers as the other sample-trace script (scripts/ is on sys.path when run as a script)
from make_sample_traces import cpu_name, export_gz, set_os_thread_name

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "sample_traces"
WINDOW_OP = "deepep_like::intranode_dispatch"

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <chrono>
#include <thread>

static int64_t spin_wait(int64_t wait_us) {
    // host-side poll for a completion flag, as a dispatch kernel's CPU side does
    auto start = std::chrono::steady_clock::now();
    auto until = start + std::chrono::microseconds(wait_us);
    int64_t polls = 0;
    while (std::chrono::steady_clock::now() < until) {
        ++polls;
        std::this_thread::yield();
    }
    return polls;
}

int64_t dispatch_hold(int64_t wait_us) {
    // the GIL stays held for the whole wait (a bare pybind11 binding)
    return spin_wait(wait_us);
}

int64_t dispatch_release(int64_t wait_us) {
    py::gil_scoped_release no_gil;  // the fix: other Python threads run during the wait
    return spin_wait(wait_us);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("dispatch_hold", &dispatch_hold, "wait holding the GIL");
    m.def("dispatch_release", &dispatch_release, "wait with the GIL released");
}
"""


def build_extension(build_dir: str):
    from torch.utils.cpp_extension import load_inline

    os.makedirs(build_dir, exist_ok=True)
    return load_inline(
        name="gil_dispatch_ext",
        cpp_sources=[CPP_SOURCE],
        extra_cflags=["-O2"],
        build_directory=build_dir,
        verbose=False,
    )


def run_mode(torch, ext, mode: str, args) -> dict:
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, record_function

    dispatch = ext.dispatch_hold if mode == "hold" else ext.dispatch_release
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    w = torch.randn(256, 256, device=dev)
    x = torch.randn(64, 256, device=dev)

    def forward_work():
        h = x
        for _ in range(4):
            h = torch.relu(h @ w)
        acc = 0
        for i in range(12000):  # Python-side bookkeeping (scheduler, sampling metadata)
            acc += i * i
        return h, acc

    stop = threading.Event()
    go = threading.Event()
    stats = {"chunks": 0, "chunk_ms": []}
    page = torch.randn(4096)

    def build_descriptors(n):
        return [(i * 4096, 4096, i & 7) for i in range(n)]

    def checksum(desc):
        c = 0
        for off, ln, _ in desc:
            c = (c * 31 + off + ln) % 1_000_003
        return c

    def kv_transfer():
        set_os_thread_name("kv_transfer")
        go.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            with record_function("kv_transfer_chunk"):
                desc = build_descriptors(150)
                staged = page.clone()  # a torch op: releases the GIL while it runs
                stats["chk"] = checksum(desc) + int(staged.numel())
            stats["chunk_ms"].append((time.perf_counter() - t0) * 1e3)
            stats["chunks"] += 1
            time.sleep(0.0003)

    th = threading.Thread(target=kv_transfer, name="kv_transfer", daemon=True)
    th.start()
    for _ in range(3):  # warm-up outside the profiler
        forward_work()
        dispatch(args.wait_us)
    if cuda:
        torch.cuda.synchronize()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t_start = time.perf_counter()
    with profile(
        activities=activities,
        record_shapes=True,
        with_stack=True,
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
    ) as prof:
        go.set()
        with record_function("prefill"):
            for _ in range(args.iters):
                forward_work()
                with record_function(WINDOW_OP):
                    dispatch(args.wait_us)
        if cuda:
            torch.cuda.synchronize()
        stop.set()
        th.join()
    wall = time.perf_counter() - t_start
    out_path = Path(args.out_dir) / f"gil_{mode}.json.gz"
    size = export_gz(prof, out_path)
    ms = sorted(stats["chunk_ms"])
    summary = {
        "chunks": stats["chunks"],
        "chunk_ms_p50": round(ms[len(ms) // 2], 3) if ms else None,
        "chunk_ms_p95": round(ms[int(len(ms) * 0.95)], 3) if ms else None,
        "wall_s": round(wall, 3),
        "size_bytes": size,
    }
    print(mode, json.dumps(summary), flush=True)
    return {
        "command": "python3 scripts/make_gil_traces.py",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if cuda else f"CPU: {cpu_name()}",
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "activities": ["CPU", "CUDA"] if cuda else ["CPU"],
        "workload": (
            f"main thread: {args.iters} x [forward: 4 matmul+relu 64x256x256 on {dev} + 12000-step Python loop; "
            f"then {WINDOW_OP}: C++ spin-wait of {args.wait_us} us "
            f"{'holding the GIL' if mode == 'hold' else 'with py::gil_scoped_release'}], inside 'prefill'; "
            f"thread 'kv_transfer': kv_transfer_chunk units (150 descriptors, a 4096-float clone, checksum) "
            f"+ time.sleep(0.0003), {stats['chunks']} chunks, chunk p50 {summary['chunk_ms_p50']} ms, "
            f"p95 {summary['chunk_ms_p95']} ms"
        ),
        "size_bytes": size,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=120)
    ap.add_argument("--wait-us", type=int, default=3000)
    ap.add_argument("--modes", default="hold,release")
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--build-dir", default=os.path.join(tempfile.gettempdir(), "gil_ext_build"))
    args = ap.parse_args(argv)

    modes = args.modes.split(",")
    if len(modes) > 1:
        # one process per mode: Kineto names threads once per process, so a second profiled run in the
        # same process would leave its new kv_transfer thread unnamed
        import subprocess
        import sys

        for mode in modes:
            cmd = [
                sys.executable,
                __file__,
                "--modes",
                mode,
                "--iters",
                str(args.iters),
                "--wait-us",
                str(args.wait_us),
            ]
            subprocess.run(cmd + ["--out-dir", args.out_dir, "--build-dir", args.build_dir], check=True)
        return

    import torch

    ext = build_extension(args.build_dir)
    entries = {f"gil_{modes[0]}.json.gz": run_mode(torch, ext, modes[0], args)}
    manifest = Path(args.out_dir) / "MANIFEST.json"
    data = json.loads(manifest.read_text()) if manifest.exists() else {}
    data.update(entries)
    manifest.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")
    print(f"updated {manifest}", flush=True)


if __name__ == "__main__":
    main()
