"""Build a large Nsight Systems SQLite export by repeating a real corpus export in time.

    python benchmarks/make_big_nsys.py [--src SQLITE] [--out SQLITE] [--copies N]

The output is a copy of the source file (every table, string ids, GPU info, CPU samples as they
were) whose event tables (CUDA runtime, kernels, memcpy, memset, synchronization, NVTX) hold their
rows COPIES times: copy k has start/end shifted by k * (span of the event tables + GAP_NS), so the
copies follow each other like successive capture windows, and correlationId (and a kernel's gridId)
offset by k * a power of ten above the largest id, so a kernel still pairs with its own launch call
and never with one of another copy. Copies are appended in order, so rowid order stays time order
within each copy, as in a real export. Output is deterministic: same source + copies -> same rows.
"""

import argparse
import os
import shutil
import sqlite3

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "shared", "corpus")
DEFAULT_SRC = os.path.join(CORPUS, "pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite")
DEFAULT_OUT = os.path.join(HERE, ".cache", "big_nsys.sqlite")
DEFAULT_COPIES = 2000  # 2000 x 5,951 event rows of cloverleaf: 0.64 GB, 11.9 M rows
GAP_NS = 1_000_000_000  # 1 s of idle between copies, as between capture windows

EVENT_TABLES = (
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "NVTX_EVENTS",
)
TIME_COLUMNS = ("start", "end")
ID_COLUMNS = ("correlationId", "gridId")


def _columns(con, table):
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def source_counts(path):
    """Rows per event table present in an export: what an ingest must account for, COPIES times."""
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in EVENT_TABLES if t in names}
    finally:
        con.close()


def build(src=DEFAULT_SRC, out=DEFAULT_OUT, copies=DEFAULT_COPIES):
    counts = source_counts(src)
    tmp = out + ".tmp"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    shutil.copyfile(src, tmp)
    con = sqlite3.connect(tmp)
    try:
        # A scratch file rebuilt from scratch on failure: no journal, no fsync.
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        tables = [t for t in counts if counts[t]]
        cols = {t: _columns(con, t) for t in tables}
        lo = min(con.execute(f'SELECT min(start) FROM "{t}"').fetchone()[0] for t in tables)
        hi = max(con.execute(f'SELECT max(coalesce("end", start)) FROM "{t}"').fetchone()[0] for t in tables)
        ts_step = hi - lo + GAP_NS
        top = 0
        for t in tables:
            for c in ID_COLUMNS:
                if c in cols[t]:
                    top = max(top, con.execute(f'SELECT max("{c}") FROM "{t}"').fetchone()[0] or 0)
        id_step = 10 ** len(str(top))
        for t in tables:
            exprs = []
            for c in cols[t]:
                if c in TIME_COLUMNS:
                    exprs.append(f'"{c}" + :dts')
                elif c in ID_COLUMNS:
                    exprs.append(f'"{c}" + :did')
                else:
                    exprs.append(f'"{c}"')
            names = ", ".join(f'"{c}"' for c in cols[t])
            # rowid <= n: only the source's own rows are copied, never an earlier copy
            sql = f'INSERT INTO "{t}" ({names}) SELECT {", ".join(exprs)} FROM "{t}" WHERE rowid <= :n ORDER BY rowid'
            n = con.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0]
            for k in range(1, copies):
                con.execute(sql, {"dts": k * ts_step, "did": k * id_step, "n": n})
        con.commit()
    finally:
        con.close()
    os.replace(tmp, out)  # never leave a half-built file that looks finished
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=DEFAULT_SRC)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--copies", type=int, default=DEFAULT_COPIES)
    a = ap.parse_args()
    path = build(a.src, a.out, a.copies)
    print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
