"""Build a rank set of N ranks from the real eight-rank runs of tests/data/rank_matrix.

    python benchmarks/make_rank_set.py 512                       # slow_compute, straggler at 512 // 3
    python benchmarks/make_rank_set.py 64 --steps 8 --slow-rank 10 --seed 3
    python benchmarks/make_rank_set.py 4 --cell healthy --straggler slow_compute --steps 2 --out /tmp/r4

Every target rank K is a copy of one real rank trace of a cell (`--cell`, default slow_compute):
the straggler rank (`--slow-rank`, default N // 3) is the slow rank of the straggler cell
(`--straggler`, default the cell itself: slow_compute's rank 5, +20% compute in `extra_compute`),
every other rank one of the cell's other ranks, cycled. Each copy is re-labelled:

- `distributedInfo.rank` = K, `world_size` = N, the process groups of the whole world (`pg_config`
  entries and `Group size` / `Process Group Ranks` args that named the 8-rank world) now name N ranks;
- the OS pid and thread ids rewritten (pid 100000 + 100 K, its threads pid + 1, + 2, ...), so that no
  two ranks share a pid, thread names and sort indexes with them; the GPU pseudo-processes of the
  metadata (pid = device index) and named tracks ("Spans", "Traces") stay as they are;
- its clock shifted by a seeded random offset (uniform in +-`--max-offset-ms`, 1 ns grid).

Collectives keep their identity: every copy holds the same collectives in the same order (process
group, position), so they match across ranks by (process group, seq). `--steps S` keeps the first S
`ProfilerStep#` windows: every event that starts before the end of the S-th step (any thread), the
metadata, flows whose both ends are kept; the profiler's "Record Window End" moves to the cut.

Writes <out>/rank<K>.json.gz (default out: benchmarks/.cache/ranks-N) and the set's description
<out>.set.json beside the folder (not in it: HTA's `TraceAnalysis(trace_dir=...)` takes every .json
and .gz of the folder for a trace). A set whose description matches the arguments is not rebuilt.
Rank files are written by a pool of `--jobs` processes (default 2).
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MATRIX = os.path.join(ROOT, "tests", "data", "rank_matrix")
CACHE = os.path.join(HERE, ".cache")
PID_BASE, PID_STRIDE = 100000, 100
FORMAT = 1  # bump when the output of the same arguments changes

_STEP = re.compile(r"ProfilerStep#\d+$")
_THREAD_NAME = re.compile(r"^thread \d+")


def default_out(n: int) -> str:
    return os.path.join(CACHE, f"ranks-{n}")


def manifest_path(out: str) -> str:
    return os.path.normpath(out) + ".set.json"


def load_cells(matrix: str = MATRIX) -> dict:
    with open(os.path.join(matrix, "cells.json")) as f:
        return {c["name"]: c for c in json.load(f)["cells"]}


def _load(path: str) -> dict:
    with gzip.open(path, "rb") as f:
        return json.load(f)


def cut_steps(trace: dict, steps: int | None) -> dict:
    """Keep the first `steps` ProfilerStep windows of the trace (in place); None keeps everything."""
    if not steps:
        return trace
    events = trace["traceEvents"]
    windows = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and _STEP.match(str(e.get("name", ""))) and "dur" in e
    )
    if len(windows) < steps:
        raise SystemExit(f"trace has {len(windows)} ProfilerStep windows, fewer than --steps {steps}")
    cut = windows[steps - 1][1]
    kept = []
    for e in events:
        if e.get("ph") == "M" or "ts" not in e:
            kept.append(e)
        elif e.get("name") == "Record Window End":
            kept.append({**e, "ts": cut})
        elif e["ts"] < cut:
            kept.append(e)
    # flows: keep an id only with both its start and its finish
    ends: dict[tuple, set] = {}
    for e in kept:
        if e.get("ph") in ("s", "f", "t"):
            ends.setdefault((e.get("cat"), e.get("id")), set()).add(e["ph"])
    whole = {k for k, v in ends.items() if {"s", "f"} <= v}
    trace["traceEvents"] = [
        e for e in kept if e.get("ph") not in ("s", "f", "t") or (e.get("cat"), e.get("id")) in whole
    ]
    return trace


def _collective_count(trace: dict) -> int:
    return sum(
        1
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
        and (
            str(e.get("name", "")).startswith("gloo:")
            or e.get("name") == "record_param_comms"
            or "nccl" in str(e.get("name", "")).lower()
        )
    )


def _os_pid(trace: dict) -> int:
    """The profiled process: the integer pid of the most complete events."""
    counts: dict[int, int] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and isinstance(e.get("pid"), int):
            counts[e["pid"]] = counts.get(e["pid"], 0) + 1
    return max(counts, key=counts.get)


def plan(n: int, cell: dict, straggler: dict | None, slow_rank: int | None, seed: int, max_offset_ms: float):
    """[(target rank, source cell name, source rank, offset us)] for the N ranks."""
    others = [r for r in range(cell["world_size"]) if r != cell.get("slow_rank")]
    rng = random.Random(seed)
    rows, i = [], 0
    for k in range(n):
        offset_us = round(rng.uniform(-max_offset_ms, max_offset_ms) * 1000.0, 3)
        if straggler is not None and k == slow_rank:
            rows.append((k, straggler["name"], straggler["slow_rank"], offset_us))
        else:
            rows.append((k, cell["name"], others[i % len(others)], offset_us))
            i += 1
    return rows


def _rewrite_group(value, src_world: int, n: int):
    """A `Group size` / `Process Group Ranks` arg that named the whole source world, for the new world."""
    if isinstance(value, int) and value == src_world:
        return n
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if parsed == list(range(src_world)):
            return json.dumps(list(range(n)))
        if isinstance(parsed, int) and parsed == src_world:
            return str(n)
    if isinstance(value, list) and value == list(range(src_world)):
        return list(range(n))
    return value


def relabel(src: dict, k: int, n: int, offset_us: float, seed: int) -> dict:
    """A copy of the source rank trace as rank k of n, its pids/tids rewritten and its clock shifted."""
    info = dict(src.get("distributedInfo") or {})
    src_world = int(info.get("world_size") or 0)
    old_pid = _os_pid(src)
    new_pid = PID_BASE + PID_STRIDE * k
    tids = sorted(
        {e["tid"] for e in src["traceEvents"] if e.get("pid") == old_pid and isinstance(e.get("tid"), int)} - {old_pid}
    )
    if len(tids) >= PID_STRIDE:
        raise SystemExit(f"{len(tids)} threads in one rank: more than the pid stride {PID_STRIDE}")
    tid_map = {old_pid: new_pid, **{t: new_pid + 1 + i for i, t in enumerate(tids)}}

    events = []
    for e in src["traceEvents"]:
        e = dict(e)
        if "ts" in e and isinstance(e["ts"], (int, float)):
            e["ts"] = round(e["ts"] + offset_us, 3)
        if e.get("pid") == old_pid:
            e["pid"] = new_pid
            if e.get("tid") in tid_map:
                e["tid"] = tid_map[e["tid"]]
        args = e.get("args")
        if args:
            if e.get("ph") == "M":
                name = e.get("name")
                if name == "process_sort_index" and e["pid"] == new_pid:
                    args = {**args, "sort_index": new_pid}
                elif name == "thread_sort_index" and e["pid"] == new_pid and args.get("sort_index") in tid_map:
                    args = {**args, "sort_index": tid_map[args["sort_index"]]}
                elif name == "thread_name" and e["pid"] == new_pid:
                    args = {**args, "name": _THREAD_NAME.sub(f"thread {e['tid']}", str(args.get("name", "")))}
            elif "Group size" in args or "Process Group Ranks" in args:
                args = dict(args)
                for key in ("Group size", "Process Group Ranks"):
                    if key in args:
                        args[key] = _rewrite_group(args[key], src_world, n)
            e["args"] = args
        events.append(e)

    info["rank"], info["world_size"] = k, n
    if "pg_config" in info:
        pgs = []
        for pg in info["pg_config"]:
            pg = dict(pg)
            if pg.get("pg_size") == src_world:
                pg["pg_size"] = n
            if pg.get("ranks") == list(range(src_world)):
                pg["ranks"] = list(range(n))
            pgs.append(pg)
        info["pg_config"] = pgs
    # distributedInfo first: HTA finds a file's rank with the first match of '"rank":\s+(\d+)'
    out = {"distributedInfo": info}
    for key, value in src.items():
        if key in ("distributedInfo", "traceEvents"):
            continue
        out[key] = value
    out["trace_id"] = f"{seed & 0xFFFFFFFF:08X}{n:08X}{k:08X}{0:08X}"
    out["traceName"] = f"rank{k}.json"
    out["traceEvents"] = events
    return out


# --- the worker pool: each process loads (and cuts) a source trace once, on first use


_SOURCES: dict = {}
_CONFIG: dict = {}


def _init(config: dict) -> None:
    _CONFIG.update(config)


def _source(cell: str, rank: int) -> dict:
    key = (cell, rank)
    if key not in _SOURCES:
        path = os.path.join(_CONFIG["matrix"], cell, f"rank{rank}.json.gz")
        _SOURCES[key] = cut_steps(_load(path), _CONFIG["steps"])
    return _SOURCES[key]


def _write(row) -> tuple[int, int, int]:
    k, cell, rank, offset_us = row
    return _write_rank(relabel(_source(cell, rank), k, _CONFIG["n"], offset_us, _CONFIG["seed"]), k)


def _write_rank(trace: dict, k: int) -> tuple[int, int, int]:
    """rank<k>.json.gz in the set's folder: (k, JSON bytes, gzip bytes)."""
    # ": " after keys (HTA's rank regex wants a space), no space after commas
    text = json.dumps(trace, separators=(",", ": ")).encode()
    path = os.path.join(_CONFIG["out"], f"rank{k}.json.gz")
    with open(path + ".tmp", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return k, len(text), os.path.getsize(path)


def _previous(out: str, wanted: dict, n: int) -> dict | None:
    """The description of the set already at `out` when it was built with `wanted` and is whole."""
    mpath = manifest_path(out)
    if not os.path.exists(mpath):
        return None
    with open(mpath) as f:
        previous = json.load(f)
    whole = all(os.path.exists(os.path.join(out, f"rank{k}.json.gz")) for k in range(n))
    return previous if whole and {k: previous.get(k) for k in wanted} == wanted else None


def _clear(out: str) -> None:
    """An empty set folder: a smaller set must not leave the ranks of a bigger one behind."""
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        if re.fullmatch(r"rank\d+\.json\.gz(\.tmp)?", name):
            os.remove(os.path.join(out, name))
    if os.path.exists(manifest_path(out)):
        os.remove(manifest_path(out))


def _save(out: str, description: dict) -> dict:
    mpath = manifest_path(out)
    with open(mpath + ".tmp", "w") as f:
        json.dump(description, f, indent=1)
    os.replace(mpath + ".tmp", mpath)
    return description


def build(
    n: int,
    out: str | None = None,
    cell: str = "slow_compute",
    straggler: str | None = "",
    slow_rank: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    max_offset_ms: float = 50.0,
    jobs: int = 2,
    matrix: str = MATRIX,
    force: bool = False,
    quiet: bool = False,
) -> dict:
    """Build (or reuse) the set; return its description (also written to <out>.set.json).

    straggler: the cell whose slow rank is injected; "" = `cell` itself if it has a slow rank, None or
    "none" = no straggler.
    """
    out = os.path.abspath(out or default_out(n))
    cells = load_cells(matrix)
    if cell not in cells:
        raise SystemExit(f"no cell {cell!r} in {matrix}/cells.json ({', '.join(cells)})")
    base = cells[cell]
    if straggler == "":
        straggler = cell if base.get("slow_rank") is not None else None
    if straggler in (None, "none"):
        slow = None
    else:
        if straggler not in cells or cells[straggler].get("slow_rank") is None:
            raise SystemExit(f"straggler cell {straggler!r} has no slow rank")
        slow = cells[straggler]
    if slow is not None:
        slow_rank = n // 3 if slow_rank is None else slow_rank
        if not 0 <= slow_rank < n:
            raise SystemExit(f"--slow-rank {slow_rank} outside 0..{n - 1}")
    else:
        slow_rank = None
    wanted = {
        "format": FORMAT,
        "world_size": n,
        "cell": cell,
        "straggler_cell": slow["name"] if slow else None,
        "slow_rank": slow_rank,
        "steps": steps,
        "seed": seed,
        "max_offset_ms": max_offset_ms,
    }
    previous = None if force else _previous(out, wanted, n)
    if previous is not None:
        return previous

    rows = plan(n, base, slow, slow_rank, seed, max_offset_ms)
    _clear(out)

    # the sources must agree on their collectives, or the copies will not match across ranks
    config = {"matrix": matrix, "steps": steps, "n": n, "seed": seed, "out": out}
    _init(config)
    sources = sorted({(c, r) for _, c, r, _ in rows})
    counts = {f"{c}/rank{r}": _collective_count(_source(c, r)) for c, r in sources}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"source ranks disagree on their number of collectives: {counts}")
    _SOURCES.clear()

    t0 = time.perf_counter()
    sizes = [None] * n
    if jobs > 1 and n > 1:
        with mp.get_context("fork").Pool(jobs, initializer=_init, initargs=(config,)) as pool:
            for i, (k, raw, gz) in enumerate(pool.imap_unordered(_write, rows, chunksize=8)):
                sizes[k] = (raw, gz)
                if not quiet and (i + 1) % 256 == 0:
                    print(f"  {i + 1}/{n} ranks", file=sys.stderr, flush=True)
    else:
        for k, raw, gz in map(_write, rows):
            sizes[k] = (raw, gz)
    _SOURCES.clear()
    seconds = time.perf_counter() - t0

    description = {
        **wanted,
        "folder": out,
        "files": [f"rank{k}.json.gz" for k in range(n)],
        "source_matrix": os.path.relpath(matrix, ROOT) if matrix.startswith(ROOT) else matrix,
        "injected": (
            {"kind": slow["kind"], **slow["injected"], "source": f"{slow['name']}/rank{slow['slow_rank']}"}
            if slow
            else None
        ),
        "sources": [f"{c}/rank{r}" for _, c, r, _ in rows],
        "offsets_us": [o for _, _, _, o in rows],
        "pids": [PID_BASE + PID_STRIDE * k for k in range(n)],
        "collectives_per_rank": next(iter(counts.values())),
        "raw_json_bytes": [s[0] for s in sizes],
        "gz_bytes": [s[1] for s in sizes],
        "total_raw_json_bytes": sum(s[0] for s in sizes),
        "largest_raw_json_bytes": max(s[0] for s in sizes),
        "build_seconds": round(seconds, 2),
        "note": (
            "the straggler comes from another run than the other ranks: they did not wait for it"
            if slow and slow["name"] != cell
            else ""
        ),
    }
    return _save(out, description)


def _write_copy(row) -> tuple[int, int, int]:
    k, offset_us = row
    source = _CONFIG["sources"][k % len(_CONFIG["sources"])]
    if source not in _SOURCES:
        with (gzip.open if source.endswith(".gz") else open)(source, "rb") as f:
            _SOURCES[source] = json.load(f)
    return _write_rank(relabel(_SOURCES[source], k, _CONFIG["n"], offset_us, _CONFIG["seed"]), k)


def build_copies(sources, n: int, out: str, seed: int = 0, max_offset_ms: float = 50.0, jobs: int = 2) -> dict:
    """N ranks, rank k a copy of sources[k % len(sources)] (real Kineto traces of one process each)
    re-labelled as `relabel` does: large ranks for measuring a worker's memory, or GPU ranks (the
    TP=2 sample's two ranks, with equal clocks so that their NCCL kernels match across ranks), where
    `build`'s rank matrix gives CPU ranks of about 1 MB. Reused when its description matches."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    out = os.path.abspath(out)
    wanted = {"format": FORMAT, "world_size": n, "sources": [os.path.abspath(s) for s in sources], "seed": seed,
              "max_offset_ms": max_offset_ms}  # fmt: skip
    previous = _previous(out, wanted, n)
    if previous is not None:
        return previous
    _clear(out)
    rng = random.Random(seed)
    rows = [(k, round(rng.uniform(-max_offset_ms, max_offset_ms) * 1000.0, 3)) for k in range(n)]
    config = {"sources": wanted["sources"], "n": n, "seed": seed, "out": out}
    _init(config)
    t0 = time.perf_counter()
    sizes = [None] * n
    with mp.get_context("fork").Pool(max(1, jobs), initializer=_init, initargs=(config,)) as pool:
        for k, raw, gz in pool.imap_unordered(_write_copy, rows):
            sizes[k] = (raw, gz)
    description = {**wanted, "folder": out, "files": [f"rank{k}.json.gz" for k in range(n)],
                   "raw_json_bytes": [s[0] for s in sizes], "gz_bytes": [s[1] for s in sizes],
                   "largest_raw_json_bytes": max(s[0] for s in sizes),
                   "build_seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip
    return _save(out, description)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, help="number of ranks")
    ap.add_argument("--out", help="folder of the rank files (default benchmarks/.cache/ranks-N)")
    ap.add_argument("--cell", default="slow_compute", help="rank-matrix cell of the other ranks")
    ap.add_argument(
        "--straggler",
        default="",
        help="cell whose slow rank is injected (default: --cell's own slow rank; 'none' for no straggler)",
    )
    ap.add_argument("--slow-rank", type=int, help="where the straggler goes (default N // 3)")
    ap.add_argument("--steps", type=int, help="keep only the first S ProfilerStep windows (8 gives ~1 MB ranks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-offset-ms", type=float, default=50.0, help="clock offsets drawn in +-this")
    ap.add_argument("--jobs", type=int, default=2, help="processes writing rank files")
    ap.add_argument("--matrix", default=MATRIX, help="the rank matrix (folder with cells.json)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the set exists")
    args = ap.parse_args(argv)
    d = build(
        args.n,
        out=args.out,
        cell=args.cell,
        straggler=args.straggler,
        slow_rank=args.slow_rank,
        steps=args.steps,
        seed=args.seed,
        max_offset_ms=args.max_offset_ms,
        jobs=args.jobs,
        matrix=args.matrix,
        force=args.force,
    )
    print(
        f"{d['folder']}: {d['world_size']} ranks, {d['total_raw_json_bytes'] / 1e6:.0f} MB JSON "
        f"(largest {d['largest_raw_json_bytes'] / 1e6:.2f} MB), straggler "
        + (f"rank {d['slow_rank']} from {d['injected']['source']}" if d["injected"] else "none")
        + f", built in {d['build_seconds']} s; description {manifest_path(d['folder'])}"
    )


if __name__ == "__main__":
    main()
