"""Benchmark tracekit against HolisticTraceAnalysis and plain json.load.

    python benchmarks/run.py [--files NAME ...] [--skip-big] [--out benchmarks/RESULTS.md]

Every measured thing is one fresh subprocess, timed from spawn to exit, and
its peak RSS comes from os.wait4 on that child alone (the kernel folds in
the max of any children it reaped, e.g. HTA's parser pool worker). Stdlib only:
tracekit and HTA run from their own venvs, so their deps never load here.
"""

import argparse
import datetime
import gzip
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import make_big_trace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.normpath(os.path.join(ROOT, "..", "shared", "corpus"))
CACHE = os.path.join(HERE, ".cache")
PROJECT_PY = os.path.join(ROOT, ".venv", "bin", "python")
TRACEKIT = os.path.join(ROOT, ".venv", "bin", "tracekit")
HTA_VENV = os.path.join(HERE, ".venv-hta")
HTA_PY = os.path.join(HTA_VENV, "bin", "python")
HTA_PIN = "holistictraceanalysis==0.5.0"

FILES = [
    "hta__df_index_resolver.json.gz",
    "hta__trace_diff__control.json.gz",
    "hta__trace_diff__test.json.gz",
    "hta__negative_queue_length_values_check__rank0.json.gz",
    "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta__mtia_inference_trace__mtia_inference_rank_0.json.gz",
    "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
    # the project's own with_stack trace (scripts/make_with_stack_trace.py): 41% of its events are Python frames
    os.path.join(ROOT, "sample_traces", "with_stack_decode.json.gz"),
]
BIG_LABEL = "big_1gb (df_index_resolver x19)"

HTA_CODE = (
    "import os, sys\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "p = sys.argv[1]\n"
    "TraceAnalysis(trace_files={0: p}, trace_dir=os.path.dirname(p))\n"
)
JSON_CODE = (
    "import gzip, json, sys\n"
    "p = sys.argv[1]\n"
    "with (gzip.open if p.endswith('.gz') else open)(p, 'rb') as f:\n"
    "    json.load(f)\n"
)

# Column order of every table: (key, header).
TOOLS = [("ingest", "tracekit ingest"), ("analyze", "tracekit analyze"), ("hta", "HTA load"), ("json", "json.load")]

TARGET_SPEEDUP = 5.0  # HTA time / tracekit ingest time, every file
TARGET_MBPS = 200.0  # raw JSON MB/s for tracekit ingest, 1 GB trace
TARGET_RSS_RATIO = 1.5  # tracekit ingest peak RSS / raw size, 1 GB trace
TARGET_ANALYZE_S = 15.0  # tracekit analyze wall time, 1 GB trace


class Result:
    def __init__(self, wall=None, rss=None, error=None):
        self.wall, self.rss, self.error = wall, rss, error  # s, bytes, text


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # it finished just as the timer fired
        pass


def measure(cmd, cores, timeout):
    """Run cmd as its own process; return a Result for that process only."""
    cpus = sorted(os.sched_getaffinity(0))[:cores]

    def pin():
        # Pin before exec so the whole process, threads included, sees `cores` CPUs.
        os.sched_setaffinity(0, cpus)

    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        # New session so a timeout can kill the child's own workers too.
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=pin, start_new_session=True)
        timer = threading.Timer(timeout, kill_group, (p.pid,))
        timer.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)  # we reaped it, not Popen
        if p.returncode == 0:
            return Result(wall, ru.ru_maxrss * 1024)  # ru_maxrss is KiB on Linux
        if p.returncode == -signal.SIGKILL:
            why = f"killed after {wall:.0f} s (timeout {timeout} s or out of memory)"
        else:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines()
            why = f"exit {p.returncode}: " + (lines[-1] if lines else "no stderr")
        return Result(error=why)


def ensure_hta():
    """Create the HTA venv on first use; return an error text or None."""
    if os.path.exists(HTA_PY):
        return None
    print(f"creating {HTA_VENV} with {HTA_PIN} ...", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", HTA_VENV], check=True)
        subprocess.run([HTA_PY, "-m", "pip", "install", "-q", HTA_PIN], check=True)
    except subprocess.CalledProcessError as e:
        shutil.rmtree(HTA_VENV, ignore_errors=True)  # retry from scratch next run
        return f"HTA venv setup failed: {e}"
    return None


def decompress(src):
    """Corpus .gz -> plain .json in the cache, so every tool reads the same bytes."""
    name = os.path.basename(src)
    dst = os.path.join(CACHE, name[:-3] if name.endswith(".gz") else name)
    if not os.path.exists(dst):
        os.makedirs(CACHE, exist_ok=True)
        opener = gzip.open if src.endswith(".gz") else open
        with opener(src, "rb") as i, open(dst + ".tmp", "wb") as o:
            shutil.copyfileobj(i, o, 1 << 20)
        os.replace(dst + ".tmp", dst)
    return dst


def resolve(name):
    for cand in (name, os.path.join(CORPUS, name), os.path.join(CORPUS, name + ".json.gz")):
        if os.path.isfile(cand):
            return cand
    sys.exit(f"no such trace: {name} (looked in {CORPUS})")


def run_file(path, args, hta_error):
    res = {}
    if os.path.exists(TRACEKIT):
        tmp = tempfile.mkdtemp(prefix="tracekit-bench-")
        try:  # fresh database every time: ingest must not append to a previous run
            res["ingest"] = measure(
                [TRACEKIT, "ingest", path, "--db", os.path.join(tmp, "x.duckdb")], args.cores, args.timeout
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        res["analyze"] = measure([TRACEKIT, "analyze", path, "--format", "json"], args.cores, args.timeout)
    else:
        res["ingest"] = res["analyze"] = Result(error="tracekit not installed")
    res["hta"] = (
        Result(error=hta_error) if hta_error else measure([HTA_PY, "-c", HTA_CODE, path], args.cores, args.timeout)
    )
    res["json"] = measure([sys.executable, "-c", JSON_CODE, path], args.cores, args.timeout)
    return res


def venv_query(py, code):
    if not os.path.exists(py):
        return "not installed"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "not installed"


def cpu_and_memory() -> tuple[str, float]:
    """The CPU model and GB of memory, for the machine table of a results file."""
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_gb = int(f.readline().split()[1]) / 1e6
    return model, mem_gb


def machine_info(cores):
    model, mem_gb = cpu_and_memory()
    version = "import importlib.metadata as m; print(m.version({!r}))"
    return [
        ("date (UTC)", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("nproc", f"{len(os.sched_getaffinity(0))} (each run pinned to {cores})"),
        ("CPU", model),
        ("memory", f"{mem_gb:.1f} GB"),
        ("OS", platform.platform()),
        ("Python (json.load)", platform.python_version()),
        ("Python (tracekit venv)", venv_query(PROJECT_PY, "import platform; print(platform.python_version())")),
        ("duckdb", venv_query(PROJECT_PY, version.format("duckdb"))),
        ("tracekit", venv_query(PROJECT_PY, version.format("tracekit"))),
        ("HTA", venv_query(HTA_PY, version.format("HolisticTraceAnalysis"))),
        ("pandas (HTA venv)", venv_query(HTA_PY, version.format("pandas"))),
    ]


def cell(r, fmt):
    return fmt(r) if r.error is None else r.error.replace("|", "\\|")[:120]


def ratio(a, b):
    return f"{a / b:.1f}x" if a is not None and b else "n/a"


def report(rows, info, args):
    """rows: [(label, raw bytes, {tool: Result})] -> markdown text."""
    heads = [h for _, h in TOOLS]
    out = [
        "# tracekit benchmark",
        "",
        "One run; each cell is one fresh process, wall time from spawn to exit, "
        "peak RSS from os.wait4. MB = 10^6 bytes; all tools read the same "
        "decompressed .json from the page cache, after one untimed warm-up run of each tool on the smallest file.",
        "",
    ]
    out += ["| machine | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in info] + [""]

    out += [
        "## Wall time (s)",
        "",
        "| file | raw MB | " + " | ".join(heads) + " | HTA / ingest | ingest MB/s |",
        "|---|---:|" + "---:|" * (len(heads) + 2),
    ]
    for label, size, res in rows:
        ing = res["ingest"].wall
        out.append(
            f"| {label} | {size / 1e6:.1f} | "
            + " | ".join(cell(res[k], lambda r: f"{r.wall:.2f}") for k, _ in TOOLS)
            + f" | {ratio(res['hta'].wall, ing)} | "
            + (f"{size / 1e6 / ing:.0f}" if ing else "n/a")
            + " |"
        )

    out += [
        "",
        "## Peak RSS (MB)",
        "",
        "| file | raw MB | " + " | ".join(heads) + " | ingest RSS / raw | HTA RSS / raw | json.load RSS / raw |",
        "|---|---:|" + "---:|" * (len(heads) + 3),
    ]
    for label, size, res in rows:
        out.append(
            f"| {label} | {size / 1e6:.1f} | "
            + " | ".join(cell(res[k], lambda r: f"{r.rss / 1e6:.0f}") for k, _ in TOOLS)
            + " | "
            + " | ".join(ratio(res[k].rss, size) for k in ("ingest", "hta", "json"))
            + " |"
        )

    out += ["", "## Targets", ""] + targets(rows, args) + [""]
    return "\n".join(out)


def targets(rows, args):
    def verdict(ok):
        return "n/a" if ok is None else ("**met**" if ok else "**NOT met**")

    lines = []
    speed = [
        (label, res["hta"].wall / res["ingest"].wall)
        for label, _, res in rows
        if res["ingest"].wall and res["hta"].wall
    ]
    ok = min(s for _, s in speed) >= TARGET_SPEEDUP if speed else None
    detail = ", ".join(f"{label}: {s:.1f}x" for label, s in speed) or "not measured"
    lines.append(f"- ingest >= {TARGET_SPEEDUP:.0f}x faster than HTA load on every file: {verdict(ok)} ({detail})")

    big = next((res for label, _, res in rows if label == BIG_LABEL), None)
    size = next((s for label, s, _ in rows if label == BIG_LABEL), None)
    if big is None:
        why = "--skip-big" if args.skip_big else "big trace not run"
        lines += [f"- 1 GB trace targets: not measured ({why})"]
        return lines
    ing, ana = big["ingest"], big["analyze"]
    mbps = size / 1e6 / ing.wall if ing.wall else None
    lines.append(
        f"- ingest >= {TARGET_MBPS:.0f} MB/s of raw JSON on {args.cores} cores (1 GB trace): "
        + (f"{verdict(mbps >= TARGET_MBPS)} ({mbps:.0f} MB/s)" if mbps else f"n/a ({ing.error})")
    )
    rr = ing.rss / size if ing.rss else None
    lines.append(
        f"- ingest peak RSS <= {TARGET_RSS_RATIO}x raw size (1 GB trace): "
        + (f"{verdict(rr <= TARGET_RSS_RATIO)} ({rr:.2f}x)" if rr else f"n/a ({ing.error})")
    )
    lines.append(
        f"- analyze (ingest + all rules) of the 1 GB trace < {TARGET_ANALYZE_S:.0f} s: "
        + (f"{verdict(ana.wall < TARGET_ANALYZE_S)} ({ana.wall:.1f} s)" if ana.wall else f"n/a ({ana.error})")
    )
    return lines


FORMATS_HEADING = "# Non-Kineto formats"


def main():
    ap = argparse.ArgumentParser(description="tracekit vs HTA vs json.load")
    ap.add_argument("--files", nargs="+", default=FILES, help="corpus file names (with or without .json.gz) or paths")
    ap.add_argument("--skip-big", action="store_true", help="skip the ~1 GB trace")
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--cores", type=int, default=2, help="CPUs each run is pinned to (the targets are stated for 2)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per process")
    args = ap.parse_args()

    hta_error = ensure_hta()
    paths = [decompress(resolve(f)) for f in args.files]
    jobs = [(os.path.basename(p).removesuffix(".json"), p) for p in paths]
    if not args.skip_big:
        big = os.path.join(CACHE, "big_1gb.json")
        if not os.path.exists(big):
            print("building the 1 GB trace ...", file=sys.stderr)
            make_big_trace.build(out=big)
        jobs.append((BIG_LABEL, big))

    # One untimed pass of every tool on the smallest file first, so that no tool's first timed run
    # pays for loading its interpreter and libraries from disk.
    run_file(min((p for _, p in jobs), key=os.path.getsize), args, hta_error)
    rows = []
    for label, path in jobs:
        print(f"{label} ...", file=sys.stderr, flush=True)
        rows.append((label, os.path.getsize(path), run_file(path, args, hta_error)))

    text = report(rows, machine_info(args.cores), args)
    print(text)
    # the non-Kineto section (benchmarks/formats.py, pasted by hand) outlives a re-run of this one
    kept = ""
    if os.path.exists(args.out):
        previous = open(args.out).read()
        start = previous.find(FORMATS_HEADING)
        kept = previous[start:] if start >= 0 else ""
    with open(args.out, "w") as f:
        f.write(text.rstrip() + "\n\n" + kept if kept else text)


if __name__ == "__main__":
    main()
