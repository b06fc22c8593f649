"""The reduce step at thousands of ranks, from the summaries of a real map.

    python benchmarks/reduce_scale.py [--ranks 512 1024 4096] [--base 64]

Ingesting and mapping 4096 rank files costs about 15 minutes on 2 cores; what the reducer does with
their summaries does not depend on how they were made. So the map runs once, in this process, on
two real rank sets of `--base` ranks (make_rank_set.py from the rank matrix's `healthy` cell, 8
ProfilerStep windows): one with slow_compute's slow rank injected at rank `--base // 3`, one
without. The reducer's inputs for N ranks are the straggler set's summaries plus N / base - 1
copies of the healthy set's, each copy's run ids and ranks moved past the ones before and every
world size set to N: one job of N ranks whose process groups span the world, with one straggler.

Then reduce 2 (`tracekit.cluster.reduce.job_analysis` and `merge`: the reducer database of the
summaries, the job rules, the ranking) runs on them, timed, with the reducer's peak RSS measured
as a fresh process's (one child per size). Prints a markdown table; whether R001 names the injected
rank is in the last column.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time

import make_rank_set

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(HERE, ".cache")


def map_summaries(folder: str) -> list:
    """Phase 1 and 2 of a cluster run over one rank set, in this process: the Analyzed chunks."""
    import glob

    from tracekit.cluster import reduce
    from tracekit.cluster.backends import InProcessBackend
    from tracekit.cluster.plan import auto_chunk_size, plan

    paths = sorted(glob.glob(os.path.join(folder, "rank*.json.gz")))
    with InProcessBackend() as backend:
        chunks = plan(paths, auto_chunk_size(len(paths), 2))
        ingested = backend.ingest(chunks)
        numbering = reduce.number(ingested)
        jobs = [(i, numbering.remaps[i.chunk.index], numbering.event_bases[i.chunk.index]) for i in ingested]
        return backend.analyze(jobs, numbering.peers, None, None, True)


def replicate(slow: list, healthy: list, ranks: int, base: int) -> list:
    """The straggler set's chunks, then healthy copies moved by base ranks each, as one job of `ranks`."""
    import copy

    import pyarrow as pa
    import pyarrow.compute as pc

    def moved(item, shift: int):
        out = copy.copy(item)
        out.tables = {}
        for name, table in item.tables.items():
            for column, add in (("run_id", shift), ("rank", shift)):
                if column in table.column_names:
                    i = table.column_names.index(column)
                    table = table.set_column(
                        i, column, pc.add(table.column(column), pa.scalar(add, table.schema.field(column).type))
                    )
            if "world_size" in table.column_names:
                i = table.column_names.index("world_size")
                table = table.set_column(
                    i, "world_size", pa.array([ranks] * table.num_rows, table.schema.field("world_size").type)
                )
            out.tables[name] = table
        return out

    parts, index = [], 0
    for copy_no in range(ranks // base):
        for item in slow if copy_no == 0 else healthy:
            part = moved(item, copy_no * base)
            part.chunk = dataclasses.replace(item.chunk, index=index)
            index += 1
            parts.append(part)
    return parts


def reduce_once(pickled: str) -> None:
    """In a fresh process: load the chunks, time reduce 2, print seconds, RSS and the straggler."""
    from tracekit.cluster import reduce

    with open(pickled, "rb") as f:
        parts, slow_rank = pickle.load(f)
    started = time.perf_counter()
    records, notes = reduce.job_analysis(parts)
    merged, _ = reduce.merge(parts, records, notes)
    seconds = time.perf_counter() - started
    named = [r for r in records if r["rule"] == "R001"]
    hit = next((r for r in named if r["locality"].get("rank") == slow_rank), None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    title = " ".join((hit["title"] if hit else "-").split())
    print(f"{seconds:.3f}\t{peak:.0f}\t{hit is not None}\t{len(named)}\t{len(merged)}\t{title}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[512, 1024, 4096])
    ap.add_argument("--base", type=int, default=64, help="ranks of the real sets that are mapped")
    ap.add_argument("--reduce-one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.reduce_one:
        return reduce_once(args.reduce_one)
    slow_rank = args.base // 3
    sets = {}
    for name, straggler in (("slow", "slow_compute"), ("healthy", "none")):
        out = os.path.join(CACHE, f"reduce-{args.base}-{name}")
        make_rank_set.build(args.base, out=out, cell="healthy", straggler=straggler, slow_rank=slow_rank, steps=8,
                            quiet=True)  # fmt: skip
        started = time.perf_counter()
        sets[name] = map_summaries(out)
        print(
            f"map of {args.base} {name} ranks in this process: {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
    print("| ranks | reduce 2 (s) | reducer peak RSS (MB) | R001 findings | the one naming the injected rank |")
    print("|---:|---:|---:|---:|---|")
    for n in args.ranks:
        parts = replicate(sets["slow"], sets["healthy"], n, args.base)
        with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
            pickle.dump((parts, slow_rank), f)
        try:
            line = subprocess.run([sys.executable, __file__, "--reduce-one", f.name], capture_output=True, text=True,
                                  check=True).stdout.rstrip("\n").split("\t")  # fmt: skip
        finally:
            os.remove(f.name)
        seconds, rss, found, count, _, title = line
        print(f"| {n} | {seconds} | {rss} | {count} | {title if found == 'True' else 'NOT FOUND'} |", flush=True)


if __name__ == "__main__":
    main()
