"""Build a ~1 GB Kineto trace by repeating a real corpus trace in time.

    python benchmarks/make_big_trace.py [--src GZ] [--out JSON] [--copies N]

The traceEvents of hta__df_index_resolver (54 MB raw) are written COPIES
times; copy k has every ts shifted by k * (trace span + GAP_US) so copies
follow each other like successive profiling windows, and its correlation /
External id / flow id / Ev Idx values offset by k * id_step so they stay
unique while a kernel's correlation still matches its runtime call and flow.

The rewrite works on the text, not on parsed objects: the output keeps
Kineto's exact layout (header, one event per "  {...}" block, footer) and
memory stays at a few copies of the 54 MB source however big the output.
Output is deterministic: same source + copies -> same bytes.
"""

import argparse
import gzip
import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "shared", "corpus")
DEFAULT_SRC = os.path.join(CORPUS, "hta__df_index_resolver.json.gz")
DEFAULT_OUT = os.path.join(HERE, ".cache", "big_1gb.json")
DEFAULT_COPIES = 19  # 19 x 53.7 MB of events ~= 1.02 GB
GAP_US = 1_000_000  # 1 s of idle between copies, as between profiler windows

ID_KEYS = ("correlation", "External id", "id", "Ev Idx")
# Keys are matched with their quotes, so `"id"` never hits "Device Id" and a
# key-like text inside a JSON string cannot match (its quotes are escaped).
FIELD_RE = re.compile(r'"(ts|correlation|External id|id|Ev Idx)": (-?\d+)')


def _split(text):
    """Return (header, events block, footer) of a Kineto JSON text."""
    start = text.index('"traceEvents": [')
    start = text.index("\n", start) + 1
    end = text.rindex("\n  ]")  # traceEvents is the last array in the object
    return text[:start], text[start:end], text[end:]


def build(src=DEFAULT_SRC, out=DEFAULT_OUT, copies=DEFAULT_COPIES):
    with gzip.open(src, "rt", encoding="utf-8") as f:
        text = f.read()
    header, block, footer = _split(text)

    # Parse the 54 MB source once (not the output) for the exact span/ids.
    events = json.loads(text)["traceEvents"]
    starts = [e["ts"] for e in events if "ts" in e]
    ends = [e["ts"] + e.get("dur", 0) for e in events if "ts" in e]
    ids = [e["id"] for e in events if isinstance(e.get("id"), int)]
    for e in events:
        args = e.get("args")
        if isinstance(args, dict):
            ids += [args[k] for k in ID_KEYS if isinstance(args.get(k), int)]
    assert all(isinstance(t, int) for t in starts), "text rewrite assumes integer ts"
    ts_step = max(ends) - min(starts) + GAP_US
    id_step = 10 ** len(str(max(ids)))  # copy k: k*10^n + original id
    del events, starts, ends, ids, text

    tmp = out + ".tmp"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(header)
        for k in range(copies):
            if k:
                f.write(",\n")
                dts, did = k * ts_step, k * id_step
                f.write(FIELD_RE.sub(lambda m: f'"{m[1]}": {int(m[2]) + (dts if m[1] == "ts" else did)}', block))
            else:
                f.write(block)
        f.write(footer)
    os.replace(tmp, out)  # never leave a truncated file that looks finished
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
