"""Build large Ascend profiler outputs by repeating real corpus outputs in time.

    python benchmarks/make_big_ascend.py [--copies N] [--out-dir DIR]

- a torch_npu db export rank folder (`rank0_ascend_pt`: ascend_pytorch_profiler_0.db, analysis.db,
  profiler_info_0.json) whose event tables hold their rows COPIES times;
- a torch_npu `trace_view.json` whose entries are repeated COPIES times.

Copy k is shifted by k * (span of the source + GAP_NS), so the copies follow each other like
successive profiled steps, and every id that links two rows (connection ids, global task ids, op
ids, flow ids, step ids) is offset by k * a power of ten above the largest id, so a device task still
pairs with its own launch call and never with one of another copy. Tables that are dictionaries
(STRING_IDS, ENUM_*, device and session info) are kept once. Output is deterministic.
"""

import argparse
import json
import os
import shutil
import sqlite3
from decimal import Decimal

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "shared", "corpus", "ascend")
DB_FOLDER = os.path.join(CORPUS, "msinsight__pytorch_db_level1", "rank0_ascend_pt")
TRACE_VIEW = os.path.join(CORPUS, "msanalyze__timeline_advice__trace_view.json")
DEFAULT_OUT = os.path.join(HERE, ".cache")
GAP_NS = 1_000_000  # 1 ms between copies, as between profiled steps

TIME_COLUMNS = ("startNs", "endNs", "timestampNs", "timestamp", "allocationTime", "releaseTime", "activeReleaseTime")
ID_COLUMNS = ("connectionId", "globalTaskId", "opId", "id")
# dictionaries and one-row facts of the export: read once, whatever the number of copies
KEPT_ONCE = ("STRING_IDS", "NPU_INFO", "HOST_INFO", "SESSION_TIME_INFO", "META_DATA", "RANK_DEVICE_MAP",
             "PYTORCH_CALLCHAINS")  # fmt: skip


def _columns(con, table):
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def _types(con, table):
    return {r[1]: r[2].upper() for r in con.execute(f'PRAGMA table_info("{table}")')}


def _tables(con):
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return [t for t in names if t not in KEPT_ONCE and not t.startswith("ENUM_")]


def _span_and_id_step(con, tables):
    first, last, top = None, None, 0
    for table in tables:
        cols = _columns(con, table)
        for col in (c for c in TIME_COLUMNS if c in cols):
            # torch_npu writes PYTORCH_API's times as TEXT
            lo, hi = con.execute(f'SELECT min(CAST("{col}" AS INTEGER)), max(CAST("{col}" AS INTEGER)) FROM "{table}" '
                                 f'WHERE CAST("{col}" AS INTEGER) > 0').fetchone()  # fmt: skip
            if lo is not None:
                first, last = min(first or lo, lo), max(last or hi, hi)
        for col in (c for c in ID_COLUMNS if c in cols):
            top = max(top, con.execute(f'SELECT coalesce(max(abs("{col}")), 0) FROM "{table}"').fetchone()[0] or 0)
    return (last - first) + GAP_NS, 10 ** len(str(int(top)))


def db_folder(copies, out_dir=DEFAULT_OUT, src=DB_FOLDER):
    """A copy of the rank folder whose ascend_pytorch_profiler_0.db holds its event rows `copies` times."""
    dst = os.path.join(out_dir, f"ascend_db_x{copies}", "rank0_ascend_pt")
    if os.path.exists(dst):
        return dst
    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=shutil.copyfile)
    for here, _, _ in os.walk(tmp):  # the corpus is read-only, and copytree keeps a folder's mode
        os.chmod(here, 0o755)
    db = os.path.join(tmp, "ASCEND_PROFILER_OUTPUT", "ascend_pytorch_profiler_0.db")
    con = sqlite3.connect(db)
    tables = _tables(con)
    shift, id_step = _span_and_id_step(con, tables)
    originals = {t: con.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0] or 0 for t in tables}
    for k in range(1, copies):
        for table in tables:
            types = _types(con, table)
            cols = list(types)
            exprs = []
            for c in cols:
                if c in TIME_COLUMNS:
                    shifted = f'CAST("{c}" AS INTEGER) + {k * shift}'
                    shifted = f"CAST({shifted} AS TEXT)" if types[c] == "TEXT" else shifted
                    exprs.append(f'CASE WHEN CAST("{c}" AS INTEGER) > 0 THEN {shifted} ELSE "{c}" END')
                elif c in ID_COLUMNS:
                    exprs.append(f'CASE WHEN "{c}" IS NULL THEN NULL ELSE "{c}" + {k * id_step} END')
                else:
                    exprs.append(f'"{c}"')
            names = ", ".join(f'"{c}"' for c in cols)
            con.execute(f'INSERT INTO "{table}" ({names}) SELECT {", ".join(exprs)} FROM "{table}" '
                        f"WHERE rowid <= {originals[table]} ORDER BY rowid")  # fmt: skip
    con.execute("UPDATE SESSION_TIME_INFO SET endTimeNs = endTimeNs + ?", [(copies - 1) * shift])
    con.commit()
    con.execute("VACUUM")
    con.close()
    os.replace(tmp, dst)
    return dst


def trace_view(copies, out_dir=DEFAULT_OUT, src=TRACE_VIEW):
    """trace_view.json with its entries `copies` times (metadata once)."""
    dst = os.path.join(out_dir, f"trace_view_x{copies}.json")
    if os.path.exists(dst):
        return dst
    with open(src) as f:
        events = json.load(f)
    stamps = [Decimal(str(e["ts"])) for e in events if "ts" in e]
    ends = [Decimal(str(e["ts"])) + Decimal(str(e.get("dur", 0))) for e in events if "ts" in e]
    shift = max(ends) - min(stamps) + Decimal(GAP_NS) / 1000
    id_step = 10 ** len(str(max((int(e["id"]) for e in events if isinstance(e.get("id"), int)), default=1)))
    out = list(events)
    for k in range(1, copies):
        for e in events:
            if e.get("ph") == "M":
                continue
            e = dict(e)
            if "ts" in e:
                e["ts"] = str(Decimal(str(e["ts"])) + k * shift)
            if isinstance(e.get("id"), int):
                e["id"] += k * id_step
            out.append(e)
    os.makedirs(out_dir, exist_ok=True)
    with open(dst + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(dst + ".tmp", dst)
    return dst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=100)
    ap.add_argument("--out-dir", default=DEFAULT_OUT)
    args = ap.parse_args()
    print(db_folder(args.copies, args.out_dir))
    print(trace_view(args.copies, args.out_dir))


if __name__ == "__main__":
    main()
