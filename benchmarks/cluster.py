"""Cluster scale: tracekit on rank sets of 8 to 4096 ranks, HolisticTraceAnalysis beside it.

    python benchmarks/cluster.py [--sizes 8 64 256 512] [--hta-sizes 8 64 512] [--hta-timeout 600]

For each size N the rank set is built if missing (make_rank_set.py: real rank-matrix traces, cell
slow_compute, `--steps 8` so ~0.9 MB of JSON a rank, the slow rank injected at N // 3), then each of
these runs as one fresh process pinned to `--cores` CPUs, timed spawn to exit, peak RSS from os.wait4
(run.py's `measure`):

- `tracekit analyze <set>/rank*.json.gz --format json` (in-process), and with `--workers 1` and
  `--workers 2` when `tracekit analyze --help` lists `--workers` (else "n/a: flag not available");
- `tracekit analyze <largest rank file> --format json`: the one-rank reference for the memory a worker
  may take;
- what a process holds before any trace, once: a ready Dask worker (tracekit's LocalCluster, the
  modules a chunk task imports, an empty database) and a ready plain process, so the worker memory
  can be compared with a one-rank analyze's above those floors too;
- HTA 0.5 `TraceAnalysis(trace_dir=<set>)` for the `--hta-sizes` (it finds each file's rank from
  distributedInfo and parses the ranks in a process pool), checked to hold N ranks.

From each tracekit report: whether a finding of a cross-rank rule (code R...) names the injected rank
in `locality.rank`, and whether it names the cause; the per-worker peak RSS and the reduce time when
the report has them (`cluster.workers[].peak_rss_mb`, `cluster.reduce_seconds`). Prints a markdown
section and writes it as "## Cluster scale" into RESULTS.md (the section replaced if present, else
appended at the end of the file, where `make bench` keeps it).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import make_rank_set
import run

HEADING = "## Cluster scale"
run.ROOT_TRACEKIT = run.TRACEKIT
DEFAULT_SIZES = [8, 64, 256, 512]
DEFAULT_HTA_SIZES = [8, 64, 512]
TARGET_256_S = 15.0  # 256 ranks, --workers 2
TARGET_HTA_SPEEDUP = 5.0  # HTA / tracekit, 64 ranks
TARGET_WORKER_RSS = 1.5  # worker peak RSS / one-rank analyze of the largest rank file
TARGET_REDUCE_S = 10.0  # reduce step at 4096 ranks
MAX_FINDINGS = 200  # so that a cross-rank finding is never cut from the report at 4096 ranks

HTA_DIR_CODE = (
    "import sys\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "t = TraceAnalysis(trace_dir=sys.argv[1])\n"
    "n = len(t.t.traces)\n"
    "assert n == int(sys.argv[2]), f'HTA parsed {n} ranks of {sys.argv[2]}'\n"
)

# tracekit's load alone, like HTA's: every rank of the folder into one in-memory database, through
# the Python API, in a fresh process (import included, as HTA's is)
TRACEKIT_LOAD_CODE = (
    "import sys\n"
    "import tracekit\n"
    "t = tracekit.open(sys.argv[1])\n"
    "n = t.sql('SELECT count(DISTINCT rank) FROM runs').fetchall()[0][0]\n"
    "assert n == int(sys.argv[2]), f'tracekit loaded {n} ranks of {sys.argv[2]}'\n"
)

# The memory a process holds before any trace: what a worker's peak and a one-rank analyze's peak
# both start from. A worker ready to work (tracekit's own LocalCluster settings, the modules a chunk
# task imports, an empty database with the schema), read by client.run; and a plain process with
# tracekit's CLI modules, DuckDB and an empty database. Printed as MB.
READY_WORKER_CODE = (
    "import resource\n"
    "from tracekit.cluster.backends import DaskBackend\n"
    "def ready():\n"
    "    import tracekit, tracekit.cluster.work, tracekit.cli.analyze\n"
    "    tracekit.open().sql('SELECT count(*) FROM runs').fetchall()\n"
    "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
    "with DaskBackend(workers=1) as backend:\n"
    "    print(max(backend.client.run(ready).values()))\n"
)
READY_PROCESS_CODE = (
    "import tracekit, tracekit.cluster.work, tracekit.cli.analyze\n"
    "tracekit.open().sql('SELECT count(*) FROM runs').fetchall()\n"
)

# words a finding must use to name the injected cause, by the cell's kind
CAUSE_WORDS = {
    "slow_compute": ("extra_compute", "compute"),
    "slow_host": ("dataloader", "host", "data load"),
    "late_start": ("late", "start", "arriv"),
}

# tracekit variants: (key, header, extra arguments)
VARIANTS = [
    ("inproc", "in-process", []),
    ("w1", "--workers 1", ["--workers", "1"]),
    ("w2", "--workers 2", ["--workers", "2"]),
]


def ready_floors(args) -> tuple[float | None, float | None]:
    """(MB of a ready worker, MB of a ready process): READY_WORKER_CODE and READY_PROCESS_CODE, each
    in a fresh process pinned to `--cores` CPUs; None where one failed."""
    python = os.path.join(os.path.dirname(run.TRACEKIT), "python")
    cpus = sorted(os.sched_getaffinity(0))[: args.cores]
    done = subprocess.run(
        [python, "-c", READY_WORKER_CODE], capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )  # fmt: skip
    try:
        worker = float(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        worker = None
    process = run.measure([python, "-c", READY_PROCESS_CODE], args.cores, 300).rss
    return worker, (process / 1e6 if process else None)


def analyze_flags() -> set[str]:
    r = subprocess.run([run.TRACEKIT, "analyze", "--help"], capture_output=True, text=True)
    return {f for f in ("--workers", "--scheduler") if f in r.stdout}


def cross_rank_rules() -> list[str]:
    r = subprocess.run([run.TRACEKIT, "rules", "--format", "json"], capture_output=True, text=True)
    try:
        rules = json.loads(r.stdout)
    except ValueError:
        return []
    return sorted(x["code"] for x in rules if str(x.get("code", "")).startswith("R"))


def straggler_verdict(report: dict | None, desc: dict, r_rules: list[str]) -> tuple[bool | None, str]:
    """(found with rank and cause, text) from a tracekit JSON report."""
    if report is None:
        return None, "n/a"
    if not r_rules:
        return None, "no cross-rank rule yet"
    if not desc.get("injected"):
        return None, "no straggler injected"
    k = desc["slow_rank"]
    words = CAUSE_WORDS.get(desc["injected"]["kind"], ())
    findings = [f for f in report.get("findings", []) if str(f.get("rule", "")).startswith("R")]
    named = [f for f in findings if (f.get("locality") or {}).get("rank") == k]
    if not named:
        ranks = sorted({(f.get("locality") or {}).get("rank") for f in findings}, key=str)
        return False, f"not found (R findings: {len(findings)}, ranks {ranks[:6]})"
    for f in named:
        text = json.dumps(
            [f.get("title"), f.get("hypothesis"), f.get("locality"), f.get("evidence", {}).get("details")]
        ).lower()
        hit = next((w for w in words if w in text), None)
        if hit:
            return True, f"found: {f['rule']} rank {k}, cause ({hit})"
    f = named[0]
    return False, f"rank {k} found ({f['rule']}: {str(f.get('title'))[:60]}), cause not named"


def cluster_stats(report: dict | None) -> tuple[float | None, float | None]:
    """(max worker peak RSS MB, reduce seconds) from the report's `cluster` key, when it has one."""
    c = (report or {}).get("cluster")
    if not isinstance(c, dict):
        return None, None
    per_worker = c.get("peak_rss_mb")  # {worker address: MB}
    rss = [x for x in (per_worker.values() if isinstance(per_worker, dict) else []) if isinstance(x, (int, float))]
    red = c.get("reduce_seconds")
    return (max(rss) if rss else None), (red if isinstance(red, (int, float)) else None)


def run_tracekit(files, extra, args):
    """Measure one analyze; return (Result, report dict or None)."""
    fd, out = tempfile.mkstemp(prefix="tracekit-cluster-", suffix=".json")
    os.close(fd)
    try:
        cmd = [run.TRACEKIT, "analyze", *files, "--format", "json", "--max-findings", str(MAX_FINDINGS), "-o", out]
        res = run.measure(cmd + extra, args.cores, args.timeout)
        report = None
        if res.error is None:
            try:
                with open(out) as f:
                    report = json.load(f)
            except ValueError as e:
                res = run.Result(error=f"report not JSON: {e}")
        return res, report
    finally:
        os.remove(out)


def run_size(n, args, flags, r_rules):
    print(f"{n} ranks: building the set ...", file=sys.stderr, flush=True)
    desc = make_rank_set.build(n, cell=args.cell, steps=args.steps, seed=args.seed, jobs=args.cores, quiet=True)
    folder = desc["folder"]
    files = [os.path.join(folder, f) for f in desc["files"]]
    row = {"n": n, "desc": desc, "res": {}, "verdict": {}, "cluster": {}}
    for key, _, extra in VARIANTS:
        if extra and "--workers" not in flags:
            row["res"][key] = run.Result(error="n/a: flag not available")
            continue
        print(f"{n} ranks: tracekit {' '.join(extra) or 'in-process'} ...", file=sys.stderr, flush=True)
        res, report = run_tracekit(files, extra, args)
        row["res"][key] = res
        row["verdict"][key] = straggler_verdict(report, desc, r_rules)
        row["cluster"][key] = cluster_stats(report)
    print(f"{n} ranks: tracekit.open (load only) ...", file=sys.stderr, flush=True)
    python = os.path.join(os.path.dirname(run.TRACEKIT), "python")
    row["res"]["load"] = run.measure([python, "-c", TRACEKIT_LOAD_CODE, folder, str(n)], args.cores, args.timeout)
    largest = max(files, key=lambda p: desc["raw_json_bytes"][desc["files"].index(os.path.basename(p))])
    row["res"]["one"], _ = run_tracekit([largest], [], args)
    if n in args.hta_sizes:
        if args.hta_error:
            row["res"]["hta"] = run.Result(error=args.hta_error)
        else:
            print(f"{n} ranks: HTA ...", file=sys.stderr, flush=True)
            row["res"]["hta"] = run.measure(
                [run.HTA_PY, "-c", HTA_DIR_CODE, folder, str(n)], args.cores, args.hta_timeout
            )
    else:
        row["res"]["hta"] = run.Result(error="not run (--hta-sizes)")
    return row


def run_large(args):
    """Memory on large ranks: N copies of one real trace, each bigger than a chunk's content cap, so
    the default plan gives each its own chunk; beside it, chunks of the count alone (what the plan
    gave before the cap) and a one-rank analyze of the same file."""
    from tracekit.cluster.plan import auto_chunk_size

    n = args.large_ranks
    print(f"large ranks: building {n} copies of {os.path.basename(args.large_source)} ...", file=sys.stderr, flush=True)
    desc = make_rank_set.build_copies(args.large_source, n, os.path.join(make_rank_set.CACHE, f"large-{n}"),
                                      seed=args.seed, jobs=args.cores)  # fmt: skip
    files = [os.path.join(desc["folder"], f) for f in desc["files"]]
    count = auto_chunk_size(n, 2)
    row = {"desc": desc, "count": count, "res": {}, "cluster": {}}
    for key, fs, extra in [
        ("one", files[:1], []),
        ("default", files, ["--workers", "2"]),
        ("count", files, ["--workers", "2", "--chunk-size", str(count)]),
    ]:
        print(f"large ranks: tracekit {' '.join(extra) or 'one rank'} ...", file=sys.stderr, flush=True)
        res, rep = run_tracekit(fs, extra, args)
        row["res"][key] = res
        c = (rep or {}).get("cluster") or {}
        row["cluster"][key] = (cluster_stats(rep)[0], c.get("chunks"))
    return row


def run_gpu(args):
    """GPU ranks: copies of the TP=2 sample's two real NCCL ranks (kernels, launches, Python frames,
    communication kernels that match across ranks), where the CPU rank sets have no GPU work for the
    per-run GPU rules to scale on. Equal clocks, so C001 matches every rank's kernels."""
    n = args.gpu_ranks
    sources = [os.path.join(run.ROOT, "sample_traces", f"gpu_tp2_rank{r}.json.gz") for r in (0, 1)]
    print(f"GPU ranks: building {n} copies of the TP=2 sample ...", file=sys.stderr, flush=True)
    desc = make_rank_set.build_copies(sources, n, os.path.join(make_rank_set.CACHE, f"gpu-{n}"), seed=args.seed,
                                      max_offset_ms=0.0, jobs=args.cores)  # fmt: skip
    files = [os.path.join(desc["folder"], f) for f in desc["files"]]
    row = {"desc": desc, "res": {}, "cluster": {}}
    for key, fs, extra in [("one", files[:1], []), ("inproc", files, []), ("w2", files, ["--workers", "2"])]:
        print(f"GPU ranks: tracekit {' '.join(extra) or ('one rank' if key == 'one' else 'in-process')} ...",
              file=sys.stderr, flush=True)  # fmt: skip
        res, rep = run_tracekit(fs, extra, args)
        row["res"][key] = res
        row["cluster"][key] = cluster_stats(rep)[0]
    if args.hta_sizes and not args.hta_error:
        print("GPU ranks: HTA ...", file=sys.stderr, flush=True)
        row["res"]["hta"] = run.measure([run.HTA_PY, "-c", HTA_DIR_CODE, desc["folder"], str(n)], args.cores,
                                        args.hta_timeout)  # fmt: skip
    else:
        row["res"]["hta"] = run.Result(error=args.hta_error or "not run (--hta-sizes)")
    return row


def gpu_section(gpu, args) -> list[str]:
    d, res = gpu["desc"], gpu["res"]
    best = min((r.wall for k, r in res.items() if k in ("inproc", "w2") and r.wall), default=None)
    ratio = f"{res['hta'].wall / best:.1f}x" if res["hta"].wall and best else "n/a"
    w2 = gpu["cluster"].get("w2")
    return [
        "",
        "### GPU ranks",
        "",
        f"{d['world_size']} ranks, copies of the TP=2 sample's two real NCCL ranks (`sample_traces/gpu_tp2_rank*.json.gz`, "
        f"{d['largest_raw_json_bytes'] / 1e6:.1f} MB of JSON each) re-labelled by `make_rank_set.build_copies` with equal "
        "clocks: kernels, launches, Python frames and communication kernels that match across ranks, which the CPU "
        "rank sets above do not have. HTA / tracekit is against the faster tracekit run.",
        "",
        "| one-rank analyze | tracekit in-process | tracekit --workers 2 | max worker peak RSS MB | HTA load | HTA / tracekit |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {fmt(res['one'], 'wall', args.timeout)} s | {fmt(res['inproc'], 'wall', args.timeout)} s | "
        f"{fmt(res['w2'], 'wall', args.timeout)} s | {f'{w2:.0f}' if w2 else 'n/a'} | "
        f"{fmt(res['hta'], 'wall', args.hta_timeout)} s | {ratio} |",
    ]


def large_section(large, args) -> list[str]:
    d, res = large["desc"], large["res"]
    one = res["one"].rss
    out = [
        "",
        "### Memory on large ranks",
        "",
        f"{d['world_size']} ranks, each a copy of `{os.path.basename(d['sources'][0])}` (a real single-GPU trace) "
        f"re-labelled as `make_rank_set.build_copies` does, {d['largest_raw_json_bytes'] / 1e6:.0f} MB of JSON "
        "each: larger than a chunk's cap of inflated trace (`plan.CHUNK_BYTES`), so the default plan gives "
        f"each rank a chunk of its own. `--chunk-size {large['count']}` is what the count alone gave for "
        f"{d['world_size']} ranks on 2 workers. The one-rank analyze is of the first copy.",
        "",
        "| run | wall s | chunks | max worker peak RSS MB | / one-rank analyze |",
        "|---|---:|---:|---:|---:|",
        f"| one-rank analyze | {fmt(res['one'], 'wall', args.timeout)} | | {fmt(res['one'], 'rss', 0)} | |",
    ]
    for key, label in (
        ("default", "`--workers 2` (default plan)"),
        ("count", f"`--workers 2 --chunk-size {large['count']}`"),
    ):
        wrss, chunks = large["cluster"][key]
        ratio = f"{wrss * 1e6 / one:.2f}x" if wrss and one else "n/a"
        out.append(f"| {label} | {fmt(res[key], 'wall', args.timeout)} | {chunks if chunks is not None else 'n/a'} | "
                   f"{f'{wrss:.0f}' if wrss else 'n/a'} | {ratio} |")  # fmt: skip
    return out


def fmt(r: run.Result, what: str, timeout: int) -> str:
    if r.error is None:
        return f"{r.wall:.2f}" if what == "wall" else f"{r.rss / 1e6:.0f}"
    if r.error.startswith("killed") and what == "wall":
        return f"> {timeout} s"
    return r.error.replace("|", "\\|")[:80]


def best_tracekit(row):
    """(header, wall) of the fastest tracekit variant that ran."""
    ran = [(h, row["res"][k].wall) for k, h, _ in VARIANTS if row["res"][k].wall is not None]
    return min(ran, key=lambda x: x[1]) if ran else (None, None)


def load_ratio(res) -> str:
    load, hta = res.get("load"), res.get("hta")
    return f"{hta.wall / load.wall:.1f}x" if load and hta and load.wall and hta.wall else "n/a"


def verdict(ok):
    return "n/a" if ok is None else ("**met**" if ok else "**NOT met**")


def report(rows, info, args, flags, r_rules, large=None, gpu=None):
    heads = [h for _, h, _ in VARIANTS]
    out = [
        HEADING,
        "",
        "`benchmarks/cluster.py` (`make bench-cluster`). One run; each cell is one fresh process pinned to "
        f"{args.cores} cores, wall time from spawn to exit, peak RSS from os.wait4: the largest single process "
        "among it and the children it reaped (HTA's parser pool, tracekit's workers), not their sum; after one untimed warm-up of each tool on the smallest set. "
        "MB = 10^6 bytes. Rank sets from `make_rank_set.py`: copies of the real eight-rank gloo CPU runs of "
        f"`tests/data/rank_matrix` (cell `{args.cell}`, first {args.steps} steps of each rank, seed "
        f"{args.seed}), relabelled to N ranks with distinct pids and clocks shifted by up to +-50 ms, the "
        "cell's slow rank injected at N // 3 and the other ranks cycled. tracekit: "
        f"`tracekit analyze <set>/rank*.json.gz --format json --max-findings {MAX_FINDINGS}`; HTA 0.5: "
        "`TraceAnalysis(trace_dir=<set>)`, checked to hold N ranks. Load only, like for like with HTA's: "
        "`tracekit.open(<set>)` in a fresh Python process, checked to hold N ranks (the analysis, "
        "which HTA's load does not do, left out).",
        "",
        "| machine | |",
        "|---|---|",
    ]
    out += [f"| {k} | {v} |" for k, v in info]
    out += [
        f"| tracekit analyze flags | {', '.join(sorted(flags)) or 'no --workers / --scheduler (in-process only)'} |",
        f"| cross-rank rules | {', '.join(r_rules) or 'none'} |",
        "",
        "### Wall time (s)",
        "",
        "| ranks | JSON MB (largest rank) | set build s | tracekit "
        + " | tracekit ".join(heads)
        + " | HTA load | HTA / fastest tracekit | tracekit.open (load only) | HTA load / tracekit load |",
        "|---:|---:|---:|" + "---:|" * (len(heads) + 4),
    ]
    for row in rows:
        d, res = row["desc"], row["res"]
        name, best = best_tracekit(row)
        ratio = f"{res['hta'].wall / best:.1f}x ({name})" if res["hta"].wall and best else "n/a"
        if res["hta"].error and res["hta"].error.startswith("killed") and best:
            ratio = f"> {args.hta_timeout / best:.1f}x ({name})"
        out.append(
            f"| {row['n']} | {d['total_raw_json_bytes'] / 1e6:.0f} ({d['largest_raw_json_bytes'] / 1e6:.2f}) | "
            f"{d['build_seconds']:.1f} | "
            + " | ".join(fmt(res[k], "wall", args.timeout) for k, _, _ in VARIANTS)
            + f" | {fmt(res['hta'], 'wall', args.hta_timeout)} | {ratio} | {fmt(res['load'], 'wall', args.timeout)}"
            + f" | {load_ratio(res)} |"
        )
    out += [
        "",
        "### Peak RSS (MB)",
        "",
        "| ranks | tracekit "
        + " | tracekit ".join(heads)
        + " | HTA load | one-rank analyze (largest file) | max worker peak RSS | reduce s |",
        "|---:|" + "---:|" * (len(heads) + 4),
    ]
    for row in rows:
        res = row["res"]
        wrss = [row["cluster"][k][0] for k in ("w1", "w2") if k in row["cluster"] and row["cluster"][k][0] is not None]
        red = [row["cluster"][k][1] for k in ("w1", "w2") if k in row["cluster"] and row["cluster"][k][1] is not None]
        out.append(
            f"| {row['n']} | "
            + " | ".join(fmt(res[k], "rss", 0) for k, _, _ in VARIANTS)
            + f" | {fmt(res['hta'], 'rss', 0)} | {fmt(res['one'], 'rss', 0)} | "
            + (f"{max(wrss):.0f}" if wrss else "n/a")
            + " | "
            + (f"{max(red):.2f}" if red else "n/a")
            + " |"
        )
    out += ["", "### Injected straggler", "", "| ranks | straggler | " + " | ".join(heads) + " |"]
    out += ["|---:|---|" + "---|" * len(heads)]
    for row in rows:
        d = row["desc"]
        inj = d["injected"]
        what = f"rank {d['slow_rank']} ({inj['kind']}, {inj['source']})" if inj else "none"
        out.append(
            f"| {row['n']} | {what} | "
            + " | ".join(row["verdict"].get(k, (None, "n/a"))[1].replace("|", "\\|") for k, _, _ in VARIANTS)
            + " |"
        )
    if gpu is not None:
        out += gpu_section(gpu, args)
    if large is not None:
        out += large_section(large, args)
    out += ["", "### Targets", ""] + targets(rows, args, large) + [""]
    return "\n".join(out)


def targets(rows, args, large=None):
    by_n = {row["n"]: row for row in rows}
    lines = []

    r = by_n.get(256)
    w2 = r["res"]["w2"] if r else None
    if w2 is None:
        lines.append(f"- 256 ranks in < {TARGET_256_S:.0f} s with `--workers 2`: not measured (256 not in --sizes)")
    elif w2.wall is None:
        lines.append(
            f"- 256 ranks in < {TARGET_256_S:.0f} s with `--workers 2`: n/a ({w2.error.removeprefix('n/a: ')})"
        )
    else:
        lines.append(
            f"- 256 ranks in < {TARGET_256_S:.0f} s with `--workers 2`: {verdict(w2.wall < TARGET_256_S)} ({w2.wall:.1f} s)"
        )

    for n in (64, 512):
        r = by_n.get(n)
        name, best = best_tracekit(r) if r else (None, None)
        hta = r["res"]["hta"] if r else None
        label = f"- tracekit >= {TARGET_HTA_SPEEDUP:.0f}x faster than HTA on {n} ranks"
        if n == 512:
            label = f"- HTA / tracekit on {n} ranks (no target)"
        if r is None or hta is None or best is None:
            lines.append(f"{label}: not measured")
        elif hta.wall or hta.error.startswith("killed"):
            s = (hta.wall or args.hta_timeout) / best
            detail = f"{s:.1f}x, {name}" if hta.wall else f"> {s:.1f}x, HTA killed at {args.hta_timeout} s"
            ok = f"{verdict(s >= TARGET_HTA_SPEEDUP)} " if n == 64 else ""
            lines.append(f"{label}: {ok}({detail})" if ok else f"{label}: {detail.replace(', ', ' (', 1)})")
        else:
            lines.append(f"{label}: n/a ({hta.error})")
        if r is not None and n == 64:
            lines.append(
                f"- load only, like for like (`tracekit.open` against HTA's load; the target above is of the "
                f"whole analysis), {n} ranks: {load_ratio(r['res'])}"
            )

    checks = []
    for row in rows:
        ref = row["res"]["one"].rss
        for k in ("w1", "w2"):
            wrss = row["cluster"].get(k, (None, None))[0]
            if wrss is not None and ref:
                checks.append((row["n"], k, wrss * 1e6 / ref))
    if checks:
        worst = max(checks, key=lambda c: c[2])
        lines.append(
            f"- worker peak RSS <= {TARGET_WORKER_RSS}x a one-rank analyze of the largest rank file, every size: "
            f"{verdict(worst[2] <= TARGET_WORKER_RSS)} (worst {worst[2]:.2f}x at {worst[0]} ranks)"
        )
        lines += above_floors(rows, getattr(args, "floors", (None, None)))
    else:
        lines.append("- worker peak RSS bounded by the largest rank file: n/a (no per-worker RSS in the report)")
    if large is not None:
        wrss, one = large["cluster"]["default"][0], large["res"]["one"].rss
        if wrss and one:
            lines.append(
                f"- worker peak RSS <= {TARGET_WORKER_RSS}x a one-rank analyze, large ranks, default plan: "
                f"{verdict(wrss * 1e6 / one <= TARGET_WORKER_RSS)} ({wrss * 1e6 / one:.2f}x)"
            )
        else:
            lines.append("- worker peak RSS on large ranks: n/a (a run failed)")

    r = by_n.get(4096)
    red = (
        [r["cluster"][k][1] for k in ("w1", "w2") if r and r["cluster"].get(k, (None, None))[1] is not None]
        if r
        else []
    )
    if r is None:
        lines.append(f"- reduce step < {TARGET_REDUCE_S:.0f} s at 4096 ranks: not measured (4096 not in --sizes)")
    elif not red:
        lines.append(f"- reduce step < {TARGET_REDUCE_S:.0f} s at 4096 ranks: n/a (no reduce time in the report)")
    else:
        lines.append(
            f"- reduce step < {TARGET_REDUCE_S:.0f} s at 4096 ranks: {verdict(max(red) < TARGET_REDUCE_S)} ({max(red):.2f} s)"
        )

    found = [v for row in rows for v in row["verdict"].values()]
    oks = [ok for ok, _ in found if ok is not None]
    why = next((t for ok, t in found if ok is None), "")
    if oks:
        lines.append(f"- injected straggler found with its rank and cause at every size: {verdict(all(oks))}")
    else:
        lines.append(f"- injected straggler found with its rank and cause at every size: n/a ({why or 'not measured'})")
    return lines


def write_section(path, text):
    """Replace the "## Cluster scale" section of path (up to the next # or ## heading), else append it."""
    previous = open(path).read() if os.path.exists(path) else ""
    lines = previous.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == HEADING), None)
    if start is None:
        body = previous.rstrip() + "\n\n" + text.rstrip() + "\n" if previous else text.rstrip() + "\n"
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("# ") or lines[i].startswith("## ")),
            len(lines),
        )
        rest = "".join(lines[end:])
        body = "".join(lines[:start]) + text.rstrip() + "\n" + ("\n" + rest if rest else "")
    with open(path, "w") as f:
        f.write(body)


def load_average():
    with open("/proc/loadavg") as f:
        return " / ".join(f.read().split()[:3])


def above_floors(rows, floors) -> list[str]:
    """The same comparison without what both processes hold before any trace (`ready_floors`)."""
    worker, process = floors
    if not worker or not process:
        return ["- memory above a ready process: n/a (the floors could not be measured)"]
    checks = []
    for row in rows:
        one = row["res"]["one"].rss
        for k in ("w1", "w2"):
            wrss = row["cluster"].get(k, (None, None))[0]
            if wrss is not None and one and one / 1e6 > process:
                checks.append((row["n"], (wrss - worker) / (one / 1e6 - process)))
    if not checks:
        return []
    worst = max(checks, key=lambda c: c[1])
    return [
        f"- the same above what each holds before any trace (a ready worker: {worker:.0f} MB, with Dask, "
        f"tracekit, DuckDB and an empty database; a ready process: {process:.0f} MB), no target: worst "
        f"{worst[1]:.2f}x at {worst[0]} ranks"
    ]


def main():
    ap = argparse.ArgumentParser(description="tracekit on many ranks, HTA beside it")
    ap.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="rank counts")
    ap.add_argument("--hta-sizes", type=int, nargs="*", default=DEFAULT_HTA_SIZES, help="rank counts HTA runs on")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per tracekit process")
    ap.add_argument("--hta-timeout", type=int, default=600, help="seconds per HTA process (shown as '> T s')")
    ap.add_argument("--hta-python", default=run.HTA_PY, help="python of a venv with HTA 0.5 (default run.py's)")
    ap.add_argument("--tracekit", default=run.TRACEKIT, help="tracekit executable (default this tree's .venv)")
    ap.add_argument("--cell", default="slow_compute", help="rank-matrix cell the sets are made of")
    ap.add_argument("--steps", type=int, default=8, help="ProfilerStep windows kept per rank (8: ~0.9 MB JSON)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cores", type=int, default=2, help="CPUs each run is pinned to (the targets are stated for 2)")
    ap.add_argument("--out", default=os.path.join(run.HERE, "RESULTS.md"), help="results file ('-': print only)")
    ap.add_argument("--gpu-ranks", type=int, default=64, help="ranks of the GPU rank set (0: none)")
    ap.add_argument("--large-ranks", type=int, default=16, help="ranks of the large-rank memory run (0: none)")
    ap.add_argument("--large-source", default=os.path.join(run.CORPUS, "hta__df_index_resolver.json.gz"),
                    help="the real trace the large ranks copy")  # fmt: skip
    args = ap.parse_args()

    run.TRACEKIT = args.tracekit
    if not os.path.exists(run.TRACEKIT):
        sys.exit(f"no tracekit at {run.TRACEKIT}: make .venv/.installed first")
    default_hta = args.hta_python == run.HTA_PY
    run.HTA_PY = args.hta_python  # measure and machine_info read the module's
    args.hta_error = None
    if args.hta_sizes:
        args.hta_error = (
            run.ensure_hta() if default_hta else (None if os.path.exists(args.hta_python) else f"no {args.hta_python}")
        )
    flags = analyze_flags()
    r_rules = cross_rank_rules()
    load = load_average()

    # untimed warm-up of each tool on the smallest set, so that no first timed run pays for loading its libraries
    small = min(args.sizes)
    desc = make_rank_set.build(small, cell=args.cell, steps=args.steps, seed=args.seed, jobs=args.cores, quiet=True)
    files = sorted(glob.glob(os.path.join(desc["folder"], "rank*.json.gz")))
    for _, _, extra in VARIANTS:
        if not extra or "--workers" in flags:
            run_tracekit(files, extra, args)
    if args.hta_sizes and not args.hta_error:
        run.measure([run.HTA_PY, "-c", HTA_DIR_CODE, desc["folder"], str(small)], args.cores, args.hta_timeout)

    args.floors = ready_floors(args) if "--workers" in flags else (None, None)
    rows = [run_size(n, args, flags, r_rules) for n in args.sizes]
    large = run_large(args) if args.large_ranks and "--workers" in flags else None
    gpu = run_gpu(args) if args.gpu_ranks and "--workers" in flags else None
    commit = subprocess.run(["git", "-C", run.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    info = run.machine_info(args.cores)
    info.insert(1, ("load average at start; end (1/5/15 min)", f"{load}; {load_average()}"))
    info.insert(2, ("commit", commit.stdout.strip() or "unknown"))
    if args.tracekit != run.ROOT_TRACEKIT:
        info.append(("tracekit executable", args.tracekit))
    text = report(rows, info, args, flags, r_rules, large, gpu)
    print(text)
    if args.out != "-":
        write_section(args.out, text)


if __name__ == "__main__":
    main()
