"""Parity check against HolisticTraceAnalysis: idle time per stream and kernel launch statistics.

Runs HTA 0.5.0 (in benchmarks/.venv-hta, created by run.py) and tracekit's SQL views on the same
trace and prints both side by side. HTA keeps only GPU work launched before the last ProfilerStep
starts (and drops GPU work it cannot tie to a launch), so the tracekit side applies the same cut;
with that, the numbers must agree exactly.

    python benchmarks/hta_parity.py [CORPUS_FILE_NAME ...]     (make parity)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from run import HTA_PY, decompress, ensure_hta, resolve  # noqa: E402

DEFAULT_FILES = ["hta__trace_diff__control", "hta__negative_queue_length_values_check__rank0"]

HTA_SIDE = r"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
path, tmp = sys.argv[1], sys.argv[2]
ta = TraceAnalysis(trace_files={0: path}, trace_dir=tmp)
idle = ta.get_idle_time_breakdown(ranks=[0], visualize=False)
idle = idle[0] if isinstance(idle, tuple) else idle
out = {"idle": {}}
for row in idle.itertuples():
    out["idle"].setdefault(str(int(row.stream)), {})[row.idle_category] = float(row.idle_time)
ks = ta.get_cuda_kernel_launch_stats(ranks=[0], visualize=False)[0]
out["launch"] = {
    "launches": int(len(ks)),
    "gpu_shorter_than_cpu": int((ks["gpu_duration"] < ks["cpu_duration"]).sum()),
    "cpu_over_50us": int((ks["cpu_duration"] > 50).sum()),
    "launch_delay_over_100us": int((ks["launch_delay"] > 100).sum()),
}
print(json.dumps(out))
"""

# HTA's definitions over tracekit's views (times in us, as HTA reports them).
IDLE_SQL = """
WITH cut AS (SELECT coalesce(max(ts_ns), (SELECT end_ns FROM runs)) AS t FROM events
             WHERE name LIKE 'ProfilerStep#%' AND ts_ns = (SELECT max(ts_ns) FROM events WHERE name LIKE 'ProfilerStep#%')),
a AS (SELECT g.stream, g.ts_ns, g.end_ns, l.launch_ts_ns FROM gpu_activities g
      JOIN launches l ON l.gpu_event_id = g.event_id, cut WHERE l.launch_ts_ns < cut.t),
s AS (SELECT *, lag(end_ns) OVER w AS prev_end, ts_ns - lag(end_ns) OVER w AS idle FROM a
      WINDOW w AS (PARTITION BY stream ORDER BY ts_ns))
SELECT stream,
       sum(idle) FILTER (WHERE launch_ts_ns > prev_end) / 1e3 AS host_wait,
       coalesce(sum(idle) FILTER (WHERE NOT coalesce(launch_ts_ns > prev_end, false) AND idle < 30000), 0) / 1e3 AS kernel_wait,
       coalesce(sum(idle) FILTER (WHERE NOT coalesce(launch_ts_ns > prev_end, false) AND idle >= 30000), 0) / 1e3 AS other
FROM s WHERE idle IS NOT NULL GROUP BY stream ORDER BY stream
"""

LAUNCH_SQL = """
WITH cut AS (SELECT coalesce(max(ts_ns), (SELECT end_ns FROM runs)) AS t FROM events
             WHERE name LIKE 'ProfilerStep#%' AND ts_ns = (SELECT max(ts_ns) FROM events WHERE name LIKE 'ProfilerStep#%'))
SELECT count(*), count(*) FILTER (WHERE gpu_dur_ns < launch_dur_ns), count(*) FILTER (WHERE launch_dur_ns > 50000),
       count(*) FILTER (WHERE greatest(launch_delay_ns, 0) > 100000)
FROM launches, cut
WHERE runtime_name IN ('cudaLaunchKernel', 'cudaMemcpyAsync', 'cudaMemsetAsync') AND launch_ts_ns < cut.t
"""


def tracekit_side(path: str) -> dict:
    from tracekit import db
    from tracekit.ingest.pipeline import ingest

    con = db.connect(None)
    ingest(con, [path])
    idle = {
        str(stream): {"host_wait": hw or 0.0, "kernel_wait": kw, "other": ot}
        for stream, hw, kw, ot in con.execute(IDLE_SQL).fetchall()
    }
    n, short, slow, late = con.execute(LAUNCH_SQL).fetchone()
    launch = {"launches": n, "gpu_shorter_than_cpu": short, "cpu_over_50us": slow, "launch_delay_over_100us": late}
    return {"idle": idle, "launch": launch}


def main(names: list[str]) -> int:
    ensure_hta()
    mismatches = 0
    for name in names or DEFAULT_FILES:
        plain = decompress(resolve(name))
        with tempfile.TemporaryDirectory() as tmp:
            link = os.path.join(tmp, os.path.basename(plain))
            os.symlink(plain, link)
            out = subprocess.run([HTA_PY, "-c", HTA_SIDE, link, tmp], capture_output=True, text=True, check=True)
        hta = json.loads(out.stdout.strip().splitlines()[-1])
        ours = tracekit_side(plain)
        print(f"## {name}\n\n| stream | category | HTA (us) | tracekit (us) |\n|---|---|---:|---:|")
        for stream in sorted(set(hta["idle"]) | set(ours["idle"]), key=int):
            for cat in ("host_wait", "kernel_wait", "other"):
                h = hta["idle"].get(stream, {}).get(cat, 0.0)
                t = ours["idle"].get(stream, {}).get(cat, 0.0)
                mismatches += abs(h - t) > 0.5
                print(f"| {stream} | {cat} | {h:.0f} | {t:.0f} |")
        print("\n| launch statistic | HTA | tracekit |\n|---|---:|---:|")
        for key in hta["launch"]:
            mismatches += hta["launch"][key] != ours["launch"][key]
            print(f"| {key} | {hta['launch'][key]} | {ours['launch'][key]} |")
        print()
    print(f"{mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
