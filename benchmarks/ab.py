"""Same-load A/B of `tracekit analyze` between two checkouts, each with its own venv.

    python benchmarks/ab.py --a CHECKOUT_A --b CHECKOUT_B [--files PATH ...] [--repeat 7] [--cores 2]
        [--env NAME=VALUE ...]

A regression of a few percent is within the drift of a machine over minutes, so the two versions
are timed alternately on the same file (A, B, A, B, ...), each run a fresh process pinned to the same
cores, and the medians compared: drift falls on both sides alike. Each checkout's `.venv/bin/tracekit`
runs once first, untimed, so both read compiled bytecode. `--env` sets a variable for B only (e.g.
TRACEKIT_RULE_THREADS=1 to compare B's own modes). Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.normpath(os.path.join(ROOT, "..", "shared", "corpus"))
FILES = [
    os.path.join(CORPUS, "hta__df_index_resolver.json.gz"),
    os.path.join(CORPUS, "hta__negative_queue_length_values_check__rank0.json.gz"),
    os.path.join(ROOT, "sample_traces", "gpu_prefill_decode_eager.json.gz"),
]


def timed(tracekit: str, path: str, cores: str, env: dict) -> float:
    command = [tracekit, "analyze", path, "--format", "json", "-q", "-o", os.devnull]
    if cores:
        command = ["taskset", "-c", cores, *command]
    started = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: findings at or above --fail-on
        sys.exit(f"{tracekit} failed on {path} (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="checkout A (the baseline), with .venv/bin/tracekit")
    ap.add_argument("--b", default=ROOT, help="checkout B (default: this one)")
    ap.add_argument("--files", nargs="+", default=FILES)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--cores", default="0,1", help="taskset core list ('' for none)")
    ap.add_argument("--env", nargs="*", default=[], help="NAME=VALUE set for B's runs only")
    args = ap.parse_args(argv)
    sides = {}
    for side, checkout in (("A", args.a), ("B", args.b)):
        tracekit = os.path.join(os.path.abspath(checkout), ".venv", "bin", "tracekit")
        if not os.access(tracekit, os.X_OK):
            sys.exit(f"{tracekit}: not found (make the checkout's venv first)")
        sides[side] = tracekit
    b_env = dict(item.split("=", 1) for item in args.env)
    print(f"A = {args.a}\nB = {args.b} {' '.join(args.env)}\nmedian of {args.repeat}, cores {args.cores or 'any'}")
    print("| input | A | B | change |\n|---|---:|---:|---:|")
    for path in args.files:
        for side in "AB":  # untimed: bytecode and page cache warm for both
            timed(sides[side], path, args.cores, b_env if side == "B" else {})
        walls: dict[str, list[float]] = {"A": [], "B": []}
        for _ in range(args.repeat):
            for side in "AB":
                walls[side].append(timed(sides[side], path, args.cores, b_env if side == "B" else {}))
        a, b = statistics.median(walls["A"]), statistics.median(walls["B"])
        name = os.path.basename(path).removesuffix(".gz").removesuffix(".json")
        print(f"| {name} | {a:.2f} s | {b:.2f} s | {100 * (b - a) / a:+.1f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
