"""Benchmark tracekit's non-Kineto readers against what a user of each format would run instead.

    python benchmarks/formats.py [--formats nsys perfetto serving] [--skip-big] [--out PATH]

- Nsight Systems SQLite: `tracekit ingest X.sqlite --db x.duckdb` vs nsys-ai 0.3.0 opening the profile
  so that it can be queried: `nsys_ai.profile.open(X, cache_mode="parquet")`, with no cache beside X,
  i.e. its first-open ETL (DuckDB ATTACH of the SQLite file, 13 base tables + the pre-joined `kernels`
  table copied to ZSTD Parquet in `X.nsys-cache/`, views over them, kernel/NVTX metadata scan;
  nvtx_kernel_map deferred, its default). Its venv (`.venv-nsysai`) pins DuckDB 1.5.5 with the
  PyPI-packaged sqlite extension, installed under `.venv-nsysai/home` (HOME for its runs), because
  DuckDB cannot download the extension offline and nsys-ai would otherwise fall back to raw sqlite3.
- Perfetto protobuf: tracekit ingest vs `Trace.FromString(whole file)` with the `perfetto` package's
  bundled classes and a loop over the packets (payload type of each), in the project venv.
- Ascend (torch_npu) db export and trace_view.json: tracekit ingest of a rank folder / of the JSON vs
  the plainest full decode of the same data: every row of every table through Python's sqlite3, and
  orjson.loads of the JSON with a loop over its entries (no mapping, pairing or storage).
- Serving logs: tracekit ingest vs a plain loop over lines with the regexes a user would write for
  SGLang batch statistics (timestamp + `key: number` fields of `Prefill/Decode batch` lines).

Every measured thing is a fresh process pinned to `--cores` CPUs (as run.py): wall time from spawn to
exit, peak RSS from os.wait4. A process whose RSS passes `--rss-cap-gb` is killed (the machine is
shared) and reported as such. Each tracekit run's JSON output is checked: events read = ingested +
skipped, and events read = the count of source items made independently (SQLite count(*) of the
event tables, the peer's packet count, the peer's line count). Stdlib only here.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

import make_big_ascend
import make_big_nsys
from run import CACHE, CORPUS, HERE, PROJECT_PY, TRACEKIT, cpu_and_memory, venv_query, write_results

NSYSAI_VENV = os.path.join(HERE, ".venv-nsysai")
NSYSAI_PY = os.path.join(NSYSAI_VENV, "bin", "python")
NSYSAI_HOME = os.path.join(NSYSAI_VENV, "home")  # DuckDB looks for extensions under $HOME/.duckdb
NSYSAI_PINS = ["nsys-ai==0.3.0", "duckdb==1.5.5", "duckdb-extension-sqlite==1.5.5"]

NSYS_FILES = [
    "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    "pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite",
]
NSYS_SCALED = [200, 2000]  # copies of cloverleaf's event rows: 64 MB (1.2 M rows) and 0.64 GB (11.9 M rows)
PERFETTO_FILES = ["perfetto__nested_tracks.perfetto-trace", "pftx__example.pftrace"]
PERFETTO_COPIES = 20  # pftx concatenated: ~28 MB
ASCEND_COPIES = 100  # the db export's event rows and trace_view.json's entries x100: ~49 MB and ~67 MB
SERVING_FILE = "sglsetup__sglang.log"
SERVING_COPIES = 100  # ~75 MB
TARGET_NSYS_SPEEDUP = 1.5  # nsys-ai s / tracekit s on every corpus export and the 0.64 GB one

NSYS_EVENT_TABLES = make_big_nsys.EVENT_TABLES + ("ThreadNames",)  # what tracekit's nsys reader counts as read

NSYSAI_CODE = """\
import json, sys
from nsys_ai import profile
p = profile.open(sys.argv[1], cache_mode="parquet")
# a failed build falls back to querying the SQLite file in place: that would not be the step we time
assert p.db is not None and p.cache_error is None, p.cache_error
print(json.dumps({"kernels": p.meta.kernel_count}))
p.close()
"""
PERFETTO_CODE = """\
import json, sys
from collections import Counter
from perfetto.protos.perfetto.trace import perfetto_trace_pb2
with open(sys.argv[1], "rb") as f:
    trace = perfetto_trace_pb2.Trace.FromString(f.read())
kinds = Counter(p.WhichOneof("data") for p in trace.packet)
print(json.dumps({"packets": sum(kinds.values())}))
"""
SQLITE_CODE = """\
import glob, json, os, sqlite3, sys
db = sys.argv[1]
if os.path.isdir(db):
    (db,) = glob.glob(os.path.join(db, "ASCEND_PROFILER_OUTPUT", "ascend_pytorch_profiler_*.db"))
con = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
rows = sum(len(con.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables)
print(json.dumps({"rows": rows, "tables": len(tables)}))
"""
JSON_CODE = """\
import json, sys
import orjson
with open(sys.argv[1], "rb") as f:
    events = orjson.loads(f.read())
phases = {}
for e in events:
    phases[e.get("ph")] = phases.get(e.get("ph"), 0) + 1
print(json.dumps({"entries": len(events)}))
"""
SERVING_CODE = r"""
import json, re, sys
TS = re.compile(rb"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
BATCH = re.compile(rb"\b(Prefill|Decode) batch[.,]? (.*)")
FIELD = re.compile(rb"([#\w][\w %/]*?): (-?\d[\d,]*\.?\d*)")
lines, rows = 0, []
with open(sys.argv[1], "rb") as f:
    for line in f:
        lines += 1
        m = BATCH.search(line)
        if m:
            ts = TS.search(line)
            fields = {k.decode(): float(v.replace(b",", b"")) for k, v in FIELD.findall(m[2])}
            rows.append((ts[1].decode() if ts else None, m[1].decode(), fields))
print(json.dumps({"lines": lines, "batch_rows": len(rows)}))
"""


class Result:
    def __init__(self, wall=None, rss=None, error=None, stdout=""):
        self.wall, self.rss, self.error, self.stdout = wall, rss, error, stdout  # s, bytes, text, text


def _rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(cmd, args, env=None):
    """Run cmd as its own pinned process; Result for that process only (stdout kept for the checks)."""
    cpus = sorted(os.sched_getaffinity(0))[: args.cores]
    cap = args.rss_cap_gb * 1e9
    why = []

    def pin():
        os.sched_setaffinity(0, cpus)

    def kill(reason):
        why.append(reason)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, preexec_fn=pin, start_new_session=True, env=env)
        done = threading.Event()

        def watch():
            # the machine is shared: a reader that would take all its memory is stopped, not waited for
            while not done.wait(0.2):
                if _rss(p.pid) > cap:
                    kill(f"killed at the {args.rss_cap_gb:g} GB RSS cap after {time.perf_counter() - t0:.0f} s")
                    return
                if time.perf_counter() - t0 > args.timeout:
                    kill(f"killed at the {args.timeout} s timeout")
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        watcher.join()
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read().decode(errors="replace")
        if code == 0:
            return Result(wall, ru.ru_maxrss * 1024, stdout=stdout)
        if why:
            return Result(rss=ru.ru_maxrss * 1024, error=why[0])
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
        return Result(error=f"exit {code}: " + (lines[-1] if lines else "no stderr"))


def ensure_nsysai():
    """Create the nsys-ai venv (and its DuckDB sqlite extension) on first use; an error text or None."""
    if os.path.exists(os.path.join(NSYSAI_HOME, ".duckdb")):
        return None
    print(f"creating {NSYSAI_VENV} with {' '.join(NSYSAI_PINS)} ...", file=sys.stderr)
    install = (
        "import duckdb, duckdb_extension_sqlite, glob, os\n"
        "d = os.path.dirname(duckdb_extension_sqlite.__file__)\n"
        "duckdb.execute(\"INSTALL '\" + glob.glob(d + '/extensions/*/sqlite.duckdb_extension')[0] + \"'\")\n"
    )
    try:
        subprocess.run([sys.executable, "-m", "venv", NSYSAI_VENV], check=True)
        subprocess.run([NSYSAI_PY, "-m", "pip", "install", "-q", *NSYSAI_PINS], check=True)
        os.makedirs(NSYSAI_HOME, exist_ok=True)
        subprocess.run([NSYSAI_PY, "-c", install], check=True, env=nsysai_env())
    except subprocess.CalledProcessError as e:
        shutil.rmtree(NSYSAI_VENV, ignore_errors=True)  # retry from scratch next run
        return f"nsys-ai venv setup failed: {e}"
    return None


def nsysai_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSYS_AI_")}  # its defaults, no overrides
    env["HOME"] = NSYSAI_HOME
    return env


def concat(src, copies, name):
    dst = os.path.join(CACHE, name)
    if not os.path.exists(dst):
        os.makedirs(CACHE, exist_ok=True)
        with open(dst + ".tmp", "wb") as o:
            for _ in range(copies):
                with open(src, "rb") as i:
                    shutil.copyfileobj(i, o, 1 << 20)
        os.replace(dst + ".tmp", dst)
    return dst


def nsys_inputs(args):
    """(label, path): the corpus exports copied into the cache (nsys-ai writes its cache beside the
    file, and the corpus is read-only) and the scaled-up cloverleaf exports."""
    os.makedirs(CACHE, exist_ok=True)
    jobs = []
    for name in NSYS_FILES:
        dst = os.path.join(CACHE, name)
        if not os.path.exists(dst):
            shutil.copyfile(os.path.join(CORPUS, name), dst)
        jobs.append((name.removesuffix(".sqlite"), dst))
    for copies in NSYS_SCALED[:1] if args.skip_big else NSYS_SCALED:
        dst = os.path.join(CACHE, f"nsys_cloverleaf_x{copies}.sqlite")
        if not os.path.exists(dst):
            print(f"building {dst} ...", file=sys.stderr)
            make_big_nsys.build(out=dst, copies=copies)
        jobs.append((f"cloverleaf x{copies} (event rows repeated)", dst))
    return jobs


def nsys_expected(path):
    """Rows of the tables tracekit's nsys reader reads, counted by SQLite itself."""
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return sum(con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in NSYS_EVENT_TABLES if t in names)
    finally:
        con.close()


def tracekit_ingest(path, args):
    tmp = tempfile.mkdtemp(prefix="tracekit-bench-")
    try:  # a fresh database every time: ingest must not append to a previous run
        return measure([TRACEKIT, "ingest", path, "--db", os.path.join(tmp, "x.duckdb"), "-f", "json"], args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def nsysai_open(path, args, setup_error):
    if setup_error:
        return Result(error=setup_error)
    cache = os.path.splitext(path)[0] + ".nsys-cache"
    shutil.rmtree(cache, ignore_errors=True)  # cold: the first open of a profile, which builds the cache
    try:
        return measure([NSYSAI_PY, "-c", NSYSAI_CODE, path], args, env=nsysai_env())
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if os.path.exists(cache + ".build.lock"):  # nsys-ai's lock file, left behind by every build
            os.remove(cache + ".build.lock")


def check(tk, expected):
    """One line: does tracekit's ingest account for every source item?"""
    if tk.error:
        return "not checked (tracekit did not finish)"
    (r,) = json.loads(tk.stdout)
    read, ing, skip = r["events_read"], r["events_ingested"], r["events_skipped"]
    ok = read == ing + skip and (expected is None or read == expected)
    text = f"read {read} = ingested {ing} + skipped {skip}"
    if expected is not None:
        text += f"; source items counted independently: {expected}"
    return ("ok: " if ok else "**MISMATCH**: ") + text


def run_nsys(args, setup_error):
    jobs = nsys_inputs(args)
    tracekit_ingest(jobs[0][1], args)  # untimed warm-up of each tool on the smallest input
    nsysai_open(jobs[0][1], args, setup_error)
    rows = []
    for label, path in jobs:
        print(f"nsys: {label} ...", file=sys.stderr, flush=True)
        tk, peer = tracekit_ingest(path, args), nsysai_open(path, args, setup_error)
        note = check(tk, nsys_expected(path))
        if peer.error is None:
            note += f"; nsys-ai kernels {json.loads(peer.stdout)['kernels']}"
        rows.append((label, os.path.getsize(path), tk, peer, note))
    return rows


def run_counted(jobs, peer_cmd, count_key, fmt, args):
    """Formats whose peer counts the source items itself (packets, lines): that count is the check."""
    tracekit_ingest(min((p for _, p in jobs), key=_size), args)
    measure(peer_cmd(jobs[0][1]), args)
    rows = []
    for label, path in jobs:
        print(f"{fmt}: {label} ...", file=sys.stderr, flush=True)
        tk, peer = tracekit_ingest(path, args), measure(peer_cmd(path), args)
        said = json.loads(peer.stdout) if peer.error is None else {}
        note = check(tk, said.get(count_key))
        note += "".join(f"; peer {k} {v}" for k, v in said.items() if k != count_key)
        rows.append((label, _size(path), tk, peer, note))
    return rows


def _size(path):
    if os.path.isdir(path):  # a rank folder read as one input
        return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)
    return os.path.getsize(path)


def run_perfetto(args):
    jobs = [(n, os.path.join(CORPUS, n)) for n in PERFETTO_FILES]
    src = os.path.join(CORPUS, "pftx__example.pftrace")
    jobs.append(
        (
            f"pftx__example x{PERFETTO_COPIES} (concatenated)",
            concat(src, PERFETTO_COPIES, f"pftx_x{PERFETTO_COPIES}.pftrace"),
        )
    )
    return run_counted(jobs, lambda p: [PROJECT_PY, "-c", PERFETTO_CODE, p], "packets", "perfetto", args)


def run_ascend(args):
    """The db export's rank folder and trace_view.json from the corpus, and each scaled up in time."""
    out = []
    db_jobs = [("msinsight__pytorch_db_level1/rank0_ascend_pt", make_big_ascend.DB_FOLDER),
               (f"rank0_ascend_pt x{ASCEND_COPIES} (event rows repeated)", make_big_ascend.db_folder(ASCEND_COPIES))]  # fmt: skip
    out.append(("db", run_counted(db_jobs, lambda p: [sys.executable, "-c", SQLITE_CODE, p], None, "ascend db", args)))
    json_jobs = [(os.path.basename(make_big_ascend.TRACE_VIEW), make_big_ascend.TRACE_VIEW),
                 (f"trace_view.json x{ASCEND_COPIES} (entries repeated)", make_big_ascend.trace_view(ASCEND_COPIES))]  # fmt: skip
    out.append(("json", run_counted(json_jobs, lambda p: [PROJECT_PY, "-c", JSON_CODE, p], None, "ascend json", args)))
    return out


def run_serving(args):
    src = os.path.join(CORPUS, SERVING_FILE)
    big = concat(src, SERVING_COPIES, f"sglang_x{SERVING_COPIES}.log")
    jobs = [(SERVING_FILE, src), (f"sglang.log x{SERVING_COPIES} (concatenated)", big)]
    return run_counted(jobs, lambda p: [sys.executable, "-c", SERVING_CODE, p], "lines", "serving", args)


def version(py, dist):
    return venv_query(py, f"import importlib.metadata as m; print(m.version({dist!r}))")


def machine_info(args):
    model, mem_gb = cpu_and_memory()
    upb = "from google.protobuf.internal import api_implementation as a; print(a.Type())"
    backend = subprocess.run([PROJECT_PY, "-c", upb], capture_output=True, text=True).stdout.strip() or "?"
    return [
        ("date (UTC)", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")),
        ("nproc", f"{len(os.sched_getaffinity(0))} (each run pinned to {args.cores})"),
        ("load average at start (1/5/15 min)", " / ".join(f"{x:.1f}" for x in os.getloadavg())),
        ("CPU", model),
        ("memory", f"{mem_gb:.1f} GB"),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("tracekit / its duckdb", f"{version(PROJECT_PY, 'tracekit')} / {version(PROJECT_PY, 'duckdb')}"),
        ("nsys-ai / its duckdb", f"{version(NSYSAI_PY, 'nsys-ai')} / {version(NSYSAI_PY, 'duckdb')}"),
        ("perfetto / protobuf", f"{version(PROJECT_PY, 'perfetto')} / {version(PROJECT_PY, 'protobuf')} ({backend})"),
    ]


def cell(r, fmt):
    return fmt(r) if r.error is None else r.error.replace("|", "\\|")[:100]


def table(title, peer_name, rows):
    out = [
        f"### {title}",
        "",
        f"| file | MB | tracekit s | {peer_name} s | {peer_name} s / tracekit s | tracekit peak RSS MB | {peer_name} peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, size, tk, peer, _ in rows:
        ratio = f"{peer.wall / tk.wall:.2f}" if tk.wall and peer.wall else "n/a"
        # a process killed at the cap had at least that much: its peak is a lower bound
        rss = [(">= " if r.error else "") + f"{r.rss / 1e6:.0f}" if r.rss else "n/a" for r in (tk, peer)]
        out.append(
            f"| {label} | {size / 1e6:.1f} | {cell(tk, lambda r: f'{r.wall:.2f}')} | "
            f"{cell(peer, lambda r: f'{r.wall:.2f}')} | {ratio} | {rss[0]} | {rss[1]} |"
        )
    out += ["", "Reconciliation of each tracekit ingest:", ""]
    out += [f"- {label}: {note}" for label, _, _, _, note in rows]
    return out + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", nargs="+", default=["nsys", "perfetto", "ascend", "serving"])
    ap.add_argument("--skip-big", action="store_true", help="skip the ~0.6 GB Nsight export")
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"), help="RESULTS.md: its make bench-formats block")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process")
    ap.add_argument("--rss-cap-gb", type=float, default=8.0, help="kill a process whose RSS passes this")
    args = ap.parse_args()

    nsys_setup = ensure_nsysai() if "nsys" in args.formats else None  # before its version goes in the table
    info = machine_info(args)
    sections, verdicts = [], []
    if "nsys" in args.formats:
        rows = run_nsys(args, nsys_setup)
        sections += table("Nsight Systems SQLite: tracekit ingest vs nsys-ai first open (cache build)", "nsys-ai", rows)
        verdicts += nsys_targets(rows, args)
    if "perfetto" in args.formats:
        rows = run_perfetto(args)
        sections += table("Perfetto protobuf: tracekit ingest vs Trace.FromString + packet loop", "FromString", rows)
        verdicts.append(reported("Perfetto protobuf", "Trace.FromString + packet loop", rows))
    if "ascend" in args.formats:
        (_, db_rows), (_, json_rows) = run_ascend(args)
        sections += table(
            "Ascend db export: tracekit ingest of a rank folder vs sqlite3 reading every row", "sqlite3", db_rows
        )
        sections += table("Ascend trace_view.json: tracekit ingest vs orjson.loads + a loop", "orjson", json_rows)
        verdicts.append(reported("Ascend db export", "sqlite3 reading every row", db_rows))
        verdicts.append(reported("Ascend trace_view.json", "orjson.loads + a loop", json_rows))
    if "serving" in args.formats:
        rows = run_serving(args)
        sections += table("Serving log (SGLang): tracekit ingest vs a regex loop", "regex loop", rows)
        verdicts.append(reported("SGLang serving log", "a regex loop", rows))

    out = ["## make bench-formats", ""]
    out += ["| machine | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in info] + [""] + sections
    out += ["### Targets", ""] + verdicts + [""]
    text = "\n".join(out)
    if args.out.endswith("RESULTS.md"):
        write_results(args.out, text, writer="make bench-formats")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


def nsys_targets(rows, args) -> list[str]:
    """The Nsight Systems target: at least TARGET_NSYS_SPEEDUP x nsys-ai's first open on every corpus
    export and on the 0.64 GB one (the issue's "600 MB export"), with tracekit's peak RSS beside."""
    judged = [
        r for r in rows if not r[0].startswith("cloverleaf x") or r[0].startswith(f"cloverleaf x{NSYS_SCALED[-1]}")
    ]
    ratios = [(label, peer.wall / tk.wall) for label, _, tk, peer, _ in judged if tk.wall and peer.wall]
    if not ratios or len(ratios) < len(judged):
        verdict = "n/a"
    else:
        verdict = "**met**" if min(r for _, r in ratios) >= TARGET_NSYS_SPEEDUP else "**NOT met**"
    detail = ", ".join(f"{label}: {r:.2f}x" for label, r in ratios) or "not measured"
    if args.skip_big:
        detail += "; the 0.64 GB export skipped (--skip-big)"
    memory = ", ".join(
        f"{label}: tracekit {tk.rss / 1e6:.0f} MB, nsys-ai {peer.rss / 1e6:.0f} MB"
        for label, _, tk, peer, _ in rows
        if label.startswith("cloverleaf x") and tk.rss and peer.rss
    )
    return [
        f"- Nsight Systems SQLite ingest >= {TARGET_NSYS_SPEEDUP}x faster than nsys-ai's first open on every corpus "
        f"export and the 0.64 GB one: {verdict} ({detail})",
        f"- Nsight Systems SQLite peak RSS (bounded memory), reported: {memory or 'not measured'}",
    ]


def reported(what, peer, rows) -> str:
    """A format with no speed target: its rows against the fastest plain decoder, reported."""
    ratios = ", ".join(
        f"{label}: {peerr.wall / tk.wall:.2f}x" for label, _, tk, peerr, _ in rows if tk.wall and peerr.wall
    )
    return f"- {what} against {peer} (no target; the decoder's time / tracekit's), reported: {ratios or 'not measured'}"


if __name__ == "__main__":
    main()
