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
import re
import shutil
import signal
import statistics
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

# Every Kineto trace of TARGET_MIN_MB or more in ../shared/corpus and sample_traces (the speed target's
# set), and the largest one under it.
FILES = [
    "hta__df_index_resolver.json.gz",
    "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
    "hta__trace_diff__control.json.gz",
    "hta__trace_diff__test.json.gz",
    "kineto__resnet50_num_workers_0__worker0.pt.trace.json.gz",
    "hta__negative_queue_length_values_check__rank0.json.gz",
    "kineto__resnet50_autograd_api_num_workers_4__worker0.pt.trace.json.gz",
    "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta__nccl_parser_config__nccl_data.json.gz",
    "hta__mtia_inference_trace__mtia_inference_rank_0.json.gz",
    # the project's own: with_stack (scripts/make_with_stack_trace.py: 41% of its events are Python
    # frames), eager decode, and the GIL matrix's release twin
    os.path.join(ROOT, "sample_traces", "with_stack_decode.json.gz"),
    os.path.join(ROOT, "sample_traces", "gpu_prefill_decode_eager.json.gz"),
    os.path.join(ROOT, "sample_traces", "gil_release.json.gz"),
]
# the start-up target's "1 MB trace" (0.78 MB of JSON)
SMALL_TRACE = os.path.join(ROOT, "sample_traces", "repeated_rope_cache.json.gz")
STARTUP_RUNS = 5  # start-up figures are the median of this many fresh processes
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

# The targets of the speed issue, on 2 cores (`--cores`).
TARGET_SPEEDUP = 5.0  # HTA load time / tracekit ingest time, every Kineto trace of TARGET_MIN_MB or more
TARGET_MIN_MB = 5.0
TARGET_MBPS_MEMORY = 300.0  # raw JSON MB/s into an in-memory database, 1 GB trace
TARGET_MBPS = 200.0  # raw JSON MB/s into a database file (`tracekit ingest --db`), 1 GB trace
TARGET_RSS_RATIO = 1.5  # tracekit ingest peak RSS / raw size, 1 GB trace
TARGET_ANALYZE_S = 10.0  # tracekit analyze wall time, 1 GB trace
TARGET_RULE_SHARE = 0.10  # no rule's wall time above this share of analyze time, 1 GB trace
TARGET_HELP_S = 0.15  # `tracekit --help`
TARGET_SMALL_INGEST_S = 0.3  # a fresh `tracekit ingest` of SMALL_TRACE, end to end

MEMORY_INGEST_CODE = "import sys, tracekit\ntracekit.open(sys.argv[1]).close()\n"


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


def run_file(path, args, hta_error, big=False):
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
        if big:  # the targets of the 1 GB trace: ingest into memory, and each rule's share of analyze
            res["memory"] = measure([PROJECT_PY, "-c", MEMORY_INGEST_CODE, path], args.cores, args.timeout)
            res["rules"] = rule_times(path, args)
    else:
        res["ingest"] = res["analyze"] = Result(error="tracekit not installed")
    res["hta"] = (
        Result(error=hta_error) if hta_error else measure([HTA_PY, "-c", HTA_CODE, path], args.cores, args.timeout)
    )
    res["json"] = measure([sys.executable, "-c", JSON_CODE, path], args.cores, args.timeout)
    return res


_TIMING = re.compile(r"^  (?P<what>\S.*?): (?P<value>[\d.]+) (?P<unit>s|ms|us) \(\d+%\)$")


def rule_times(path, args) -> list[tuple[str, float]]:
    """(rule or stage, wall seconds) from `tracekit analyze -v` (its stage timings on stderr), largest
    first; a run of its own, after the timed one."""
    cpus = sorted(os.sched_getaffinity(0))[: args.cores]
    done = subprocess.run(
        [TRACEKIT, "analyze", path, "--format", "json", "-o", os.devnull, "-v"],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        timeout=args.timeout,
    )
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
    times = []
    for line in done.stderr.splitlines():
        m = _TIMING.match(line)
        if m:
            times.append((m["what"], float(m["value"]) * scale[m["unit"]]))
    return sorted(times, key=lambda t: -t[1])


def startup(args) -> dict[str, Result]:
    """Median of STARTUP_RUNS fresh processes each: `tracekit --help`, and `tracekit ingest` of
    SMALL_TRACE into a new database file."""
    out = {}
    tmp = tempfile.mkdtemp(prefix="tracekit-bench-")
    try:

        def ingest_small(n):
            return [TRACEKIT, "ingest", SMALL_TRACE, "--db", os.path.join(tmp, f"s{n}.duckdb")]

        for key, command in (("help", lambda n: [TRACEKIT, "--help"]), ("small_ingest", ingest_small)):
            runs = [measure(command(n), args.cores, args.timeout) for n in range(STARTUP_RUNS)]
            failed = next((r for r in runs if r.error), None)
            out[key] = failed or Result(statistics.median(r.wall for r in runs), max(r.rss for r in runs))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


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
        ("date (UTC)", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")),
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


def report(rows, info, args, started):
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

    out += [""] + rule_table(rows) + startup_table(started)
    out += ["## Targets", ""] + targets(rows, args, started) + [""]
    return "\n".join(out)


def targets(rows, args, started):
    """One line per target of the speed issue, each met, NOT met or not measured, with the figure."""

    def verdict(ok):
        return "n/a" if ok is None else ("**met**" if ok else "**NOT met**")

    lines = []
    speed = [
        (label, res["hta"].wall / res["ingest"].wall)
        for label, size, res in rows
        if res["ingest"].wall and res["hta"].wall and size >= TARGET_MIN_MB * 1e6
    ]
    ok = min(s for _, s in speed) >= TARGET_SPEEDUP if speed else None
    detail = ", ".join(f"{label}: {s:.1f}x" for label, s in speed) or "not measured"
    lines.append(
        f"- ingest >= {TARGET_SPEEDUP:.0f}x faster than HTA load on every Kineto trace of {TARGET_MIN_MB:.0f} MB "
        f"or more: {verdict(ok)} ({detail})"
    )
    for key, limit, what in (
        ("help", TARGET_HELP_S, "`tracekit --help`"),
        ("small_ingest", TARGET_SMALL_INGEST_S, f"a fresh `tracekit ingest` of {os.path.basename(SMALL_TRACE)}"),
    ):
        r = started.get(key)
        figure = "not measured" if r is None else (r.error or f"{r.wall:.2f} s, median of {STARTUP_RUNS}")
        ok = None if r is None or r.error else r.wall < limit
        lines.append(f"- {what} under {limit:g} s: {verdict(ok)} ({figure})")

    big = next((res for label, _, res in rows if label == BIG_LABEL), None)
    size = next((s for label, s, _ in rows if label == BIG_LABEL), None)
    if big is None:
        why = "--skip-big" if args.skip_big else "big trace not run"
        lines += [f"- 1 GB trace targets: not measured ({why})"]
        return lines
    for key, limit, what in (
        ("memory", TARGET_MBPS_MEMORY, "into an in-memory database (`tracekit.open`)"),
        ("ingest", TARGET_MBPS, "into a database file (`tracekit ingest --db`)"),
    ):
        r = big.get(key) or Result(error="not measured")
        mbps = size / 1e6 / r.wall if r.wall else None
        lines.append(
            f"- 1 GB trace {what} at >= {limit:.0f} MB/s of raw JSON on {args.cores} cores: "
            + (f"{verdict(mbps >= limit)} ({mbps:.0f} MB/s, {r.wall:.1f} s)" if mbps else f"n/a ({r.error})")
        )
    ing, ana = big["ingest"], big["analyze"]
    rr = ing.rss / size if ing.rss else None
    lines.append(
        f"- 1 GB trace ingest peak RSS <= {TARGET_RSS_RATIO}x raw size: "
        + (f"{verdict(rr <= TARGET_RSS_RATIO)} ({rr:.2f}x)" if rr else f"n/a ({ing.error})")
    )
    lines.append(
        f"- `tracekit analyze` (ingest + all rules + report) of the 1 GB trace under {TARGET_ANALYZE_S:.0f} s: "
        + (f"{verdict(ana.wall < TARGET_ANALYZE_S)} ({ana.wall:.1f} s)" if ana.wall else f"n/a ({ana.error})")
    )
    rules = [(what, t) for what, t in big.get("rules", []) if re.match(r"^[A-Z]\d{3} ", what)]
    if rules and ana.wall:
        worst, seconds = rules[0]
        lines.append(
            f"- no rule over {TARGET_RULE_SHARE:.0%} of analyze time on the 1 GB trace: "
            f"{verdict(seconds <= TARGET_RULE_SHARE * ana.wall)} (largest: {worst} {seconds:.2f} s, "
            f"{seconds / ana.wall:.0%} of {ana.wall:.1f} s)"
        )
    else:
        lines.append(f"- no rule over {TARGET_RULE_SHARE:.0%} of analyze time on the 1 GB trace: n/a (no timings)")
    return lines


def rule_table(rows):
    """Each rule's and stage's wall time in the 1 GB trace's `analyze -v` run."""
    big = next((res for label, _, res in rows if label == BIG_LABEL), None)
    if not big or not big.get("rules"):
        return []
    wall = big["analyze"].wall
    out = [
        "## Per-rule time on the 1 GB trace",
        "",
        "`tracekit analyze -v` (a run of its own after the timed one): each rule's and stage's wall time, and "
        "its share of the timed analyze run"
        + (f" ({wall:.1f} s)" if wall else "")
        + ". Rules taking under 10 ms are summed in the last row.",
        "",
        "| rule or stage | seconds | share of analyze |",
        "|---|---:|---:|",
    ]
    small = [(w, t) for w, t in big["rules"] if t < 0.01]
    for what, t in big["rules"]:
        if t >= 0.01:
            out.append(f"| {what} | {t:.2f} | {t / wall:.0%} |" if wall else f"| {what} | {t:.2f} | n/a |")
    if small:
        total = sum(t for _, t in small)
        out.append(f"| {len(small)} others | {total:.2f} | {total / wall:.0%} |" if wall else "")
    return out + [""]


def startup_table(started):
    if not started:
        return []
    out = [
        f"## Start-up (median of {STARTUP_RUNS} fresh processes)",
        "",
        "| command | s | peak RSS MB |",
        "|---|---:|---:|",
    ]
    names = {"help": "tracekit --help", "small_ingest": f"tracekit ingest {os.path.basename(SMALL_TRACE)} --db new"}
    for key, r in started.items():
        out.append(
            f"| {names[key]} | {cell(r, lambda x: f'{x.wall:.2f}')} | {cell(r, lambda x: f'{x.rss / 1e6:.0f}')} |"
        )
    return out + [""]


def write_results(path: str, text: str, writer: str = "make bench") -> None:
    """Put `text` in RESULTS.md between the writer's two markers (at the top the first time): each
    benchmark rewrites only its own block, and the notes on earlier runs around them stay."""
    start, end = f"<!-- {writer}: start -->", f"<!-- {writer}: end -->"
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    previous = open(path).read() if os.path.exists(path) else ""
    if start in previous and end in previous:
        head, rest = previous.split(start, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = block + ("\n" + previous if previous else "")
    with open(path, "w") as f:
        f.write(new)


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
        rows.append((label, os.path.getsize(path), run_file(path, args, hta_error, big=label == BIG_LABEL)))
    print("start-up ...", file=sys.stderr, flush=True)
    started = startup(args) if os.path.exists(TRACEKIT) else {}

    text = report(rows, machine_info(args.cores), args, started)
    print(text)
    write_results(args.out, text)


if __name__ == "__main__":
    main()
