#!/usr/bin/env python3
"""A variation matrix of real runs for the GIL-in-a-native-wait case (rule H002 thread-starvation).

Each cell is one process on one CUDA GPU that runs a prefill-style layer loop on its main thread.
Per layer: a few small matmuls on the GPU and some Python bookkeeping, then one or two native ops
standing in for DeepEP's intranode `dispatch` and `combine` (a C++ extension built with
load_inline). While a native op waits, the GPU runs the "dispatch kernel" (torch.cuda._sleep for
the window's length) and the CPU side waits for it, either

  flag   spinning on a clock, with no CUDA call (as DeepEP polls a host-mapped counter), or
  event  polling cudaEventQuery on an event recorded after that kernel (many runtime events),

holding the GIL (a bare pybind11 binding) or releasing it (py::gil_scoped_release). A second
Python thread, `kv_transfer`, runs a transfer loop like a Mooncake/NIXL sender:

  transfer  build page descriptors in Python, a non_blocking copy from pinned memory on a side
            stream, event.synchronize(), a short sleep;
  python    Python work only (descriptors and checksums) with a short sleep;
  none      no second thread (prefill only).

Cells (name = gil_<gil>_<poll>_<window>us_<ops>op_<other>): held/released x windows 100, 300,
1000, 5000 us (flag, 2 ops, transfer); held/released x 100, 1000 us with event polling; held/released
with a python-only thread; held/released with one op per layer; no thread with flag and event
polling. The 300 us transfer cells also write a runtime-event JSONL log of the transfer loop
(`kv_transfer_chunk` events, timed with time.time_ns()).

    python3 scripts/make_gil_matrix.py            # every cell, one process each -> tests/data/gil_matrix/

cells.json there lists each cell's dimensions and the verdict the rule must give: a warning naming
kv_transfer, the native op(s) and the GIL when a thread exists and the GIL is held; nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from make_sample_traces import export_gz, set_os_thread_name

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT = REPO_ROOT / "tests" / "data" / "gil_matrix"
LAYERS = 40  # per cell; 100 us windows run LAYERS_SHORT so their windows add up to enough time, 5 ms ones LAYERS_LONG
LAYERS_SHORT, LAYERS_LONG = 100, 16
DISPATCH, COMBINE = "deepep_like::intranode_dispatch", "deepep_like::intranode_combine"

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <cuda_runtime_api.h>
#include <chrono>
#include <thread>

static int64_t spin(int64_t wait_us) {
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(wait_us);
    int64_t polls = 0;
    while (std::chrono::steady_clock::now() < until) { ++polls; std::this_thread::yield(); }
    return polls;
}

static void spin_for(int64_t us) {  // between polls: a runtime call every ~10 us, as a poll loop makes them
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    while (std::chrono::steady_clock::now() < until) {}
}

static int64_t poll_event(int64_t handle) {
    auto event = reinterpret_cast<cudaEvent_t>(handle);
    int64_t polls = 0;
    while (cudaEventQuery(event) == cudaErrorNotReady) { ++polls; spin_for(10); }
    return polls;
}

int64_t wait_flag_hold(int64_t wait_us) { return spin(wait_us); }
int64_t wait_flag_release(int64_t wait_us) { py::gil_scoped_release no_gil; return spin(wait_us); }
int64_t wait_event_hold(int64_t handle) { return poll_event(handle); }
int64_t wait_event_release(int64_t handle) { py::gil_scoped_release no_gil; return poll_event(handle); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("wait_flag_hold", &wait_flag_hold);
    m.def("wait_flag_release", &wait_flag_release);
    m.def("wait_event_hold", &wait_event_hold);
    m.def("wait_event_release", &wait_event_release);
}
"""

CELLS = (
    [dict(gil=g, poll="flag", window_us=w, ops=2, other="transfer") for g in ("held", "released")
     for w in (100, 300, 1000, 5000)]
    + [dict(gil=g, poll="event", window_us=w, ops=2, other="transfer") for g in ("held", "released") for w in (100, 1000)]
    + [dict(gil=g, poll="flag", window_us=300, ops=2, other="python") for g in ("held", "released")]
    + [dict(gil=g, poll="flag", window_us=300, ops=1, other="transfer") for g in ("held", "released")]
    + [dict(gil="held", poll=p, window_us=300, ops=2, other="none") for p in ("flag", "event")]
)  # fmt: skip


def cell_name(c: dict) -> str:
    return f"gil_{c['gil']}_{c['poll']}_{c['window_us']}us_{c['ops']}op_{c['other']}"


def expected(c: dict) -> str:
    return "starved" if c["gil"] == "held" and c["other"] != "none" else "quiet"


def _extension(build_dir: str):
    from torch.utils.cpp_extension import load_inline

    os.makedirs(build_dir, exist_ok=True)
    return load_inline(name="gil_matrix_ext", cpp_sources=[CPP_SOURCE], extra_cflags=["-O2"], with_cuda=True,
                       build_directory=build_dir, verbose=False)  # fmt: skip


def _sleep_cycles_per_us(torch) -> float:
    """torch.cuda._sleep spins for a number of GPU clock cycles: measure how many make a microsecond."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1e3)


def run_cell(c: dict, build_dir: str) -> dict:
    import torch
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, record_function

    ext = _extension(build_dir)
    held = c["gil"] == "held"
    wait_flag = ext.wait_flag_hold if held else ext.wait_flag_release
    wait_event = ext.wait_event_hold if held else ext.wait_event_release
    cycles_per_us = _sleep_cycles_per_us(torch)
    w = torch.randn(512, 512, device="cuda")
    x = torch.randn(128, 512, device="cuda")

    def native(op_name: str) -> None:
        with record_function(op_name):
            torch.cuda._sleep(int(c["window_us"] * cycles_per_us))  # the dispatch kernel the CPU waits for
            if c["poll"] == "flag":
                wait_flag(c["window_us"])
            else:
                done = torch.cuda.Event()
                done.record()
                wait_event(done.cuda_event)

    def layer(i: int) -> None:
        h = x
        for _ in range(3):
            h = torch.relu(h @ w)
        meta = 0
        for j in range(1500):  # scheduler/sampling bookkeeping in Python (a loop: no frames per item)
            meta += j * j
        native(DISPATCH)
        h = h @ w + meta % 7
        if c["ops"] == 2:
            native(COMBINE)

    layers = LAYERS_SHORT if c["window_us"] <= 100 else LAYERS_LONG if c["window_us"] >= 5000 else LAYERS
    stop, go = threading.Event(), threading.Event()
    log: list[dict] = []
    chunks = []
    side = torch.cuda.Stream()
    src = torch.randn(1 << 16, pin_memory=True)
    dst = torch.empty(1 << 16, device="cuda")

    def transfer_loop() -> None:
        set_os_thread_name("kv_transfer")
        go.wait()
        tid = threading.get_native_id()
        while not stop.is_set():
            t0, wall0 = time.perf_counter(), time.time_ns()
            with record_function("kv_transfer_chunk"):
                desc = [(k * 4096, 4096, k & 7) for k in range(120)]
                if c["other"] == "transfer":
                    with torch.cuda.stream(side):
                        dst.copy_(src, non_blocking=True)
                        ev = torch.cuda.Event()
                        ev.record(side)
                    ev.synchronize()
                acc = 0
                for off, ln, _ in desc:
                    acc = (acc * 31 + off + ln) % 1_000_003
            wall1 = time.time_ns()
            chunks.append((time.perf_counter() - t0) * 1e3)
            log.append({"ts_ns": wall0, "dur_ns": wall1 - wall0, "name": "kv_transfer_chunk", "pid": os.getpid(),
                        "tid": tid, "thread": "kv_transfer", "pages": len(desc)})  # fmt: skip
            time.sleep(0.0002)

    thread = None
    if c["other"] != "none":
        thread = threading.Thread(target=transfer_loop, name="kv_transfer", daemon=True)
        thread.start()
    for i in range(3):  # warm-up outside the profiled window (kernels loaded, extension called once)
        layer(i)
    torch.cuda.synchronize()
    go.set()
    time.sleep(0.01)
    log.clear()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True,
                 experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:  # fmt: skip
        with record_function("prefill"):
            for i in range(layers):
                layer(i)
        torch.cuda.synchronize()
        stop.set()
        if thread:
            thread.join()
    name = cell_name(c)
    OUT.mkdir(parents=True, exist_ok=True)
    size = export_gz(prof, OUT / f"{name}.json.gz")
    files = [f"{name}.json.gz"]
    if c["other"] == "transfer" and c["window_us"] == 300 and c["poll"] == "flag" and c["ops"] == 2:
        (OUT / f"{name}.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
        files.append(f"{name}.events.jsonl")
    chunks.sort()
    return {**c, "name": name, "files": files, "layers": layers, "expected": expected(c), "size_bytes": size,
            "transfer_chunks": len(chunks), "chunk_ms_p50": round(chunks[len(chunks) // 2], 3) if chunks else None,
            "torch_version": torch.__version__, "device": torch.cuda.get_device_name(),
            "python_version": platform.python_version()}  # fmt: skip


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", help="run one cell (by name) in this process")
    ap.add_argument("--build-dir", default=os.path.join(tempfile.gettempdir(), "gil_matrix_build"))
    args = ap.parse_args(argv)
    if args.cell:
        (cell,) = [c for c in CELLS if cell_name(c) == args.cell]
        print(json.dumps(run_cell(cell, args.build_dir)), flush=True)
        return
    results = []
    for c in CELLS:  # one process per cell: Kineto names a process's threads once
        done = subprocess.run([sys.executable, __file__, "--cell", cell_name(c), "--build-dir", args.build_dir],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"cell {cell_name(c)} failed")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(cell_name(c), results[-1]["size_bytes"], results[-1]["transfer_chunks"], flush=True)
    doc = {
        "command": "python3 scripts/make_gil_matrix.py",
        "rules": ["H002"],
        "dimensions": ["gil", "poll", "window_us", "ops", "other"],
        "cells": results,
    }
    (OUT / "cells.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
