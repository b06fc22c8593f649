"""The runs and top kernels of a report of many runs (a job's ranks), folded for reading.

A table row per rank and a top-kernels table per rank is 9 lines a rank: 580 lines before the first
finding at 64 ranks, 37,000 at 4096. Past MANY_RUNS runs, the runs fold into one row per device
(how many, which ranks, the range of events and windows), and the runs' top kernels into one table
(per kernel: how many runs list it, their calls and time, and the smallest and largest time of one
run, which is where a rank that waits shows: 796 us against 509 ms in an all-reduce). The JSON
report keeps every run as it is.
"""

from __future__ import annotations

from tracekit.findings.report import MANY_RUNS
from tracekit.units import duration


def folded(report: dict) -> bool:
    """More runs than MANY_RUNS: the text and markdown reports fold them (the findings are folded
    in the report itself, findings.report.fold)."""
    return len(report.get("runs") or []) > MANY_RUNS


def rank_ranges(ranks) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    values = sorted({int(r) for r in ranks if r is not None})
    parts, start = [], None
    for i, r in enumerate(values):
        if start is None:
            start = r
        if i + 1 == len(values) or values[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts) or "-"


def span(low, high, show=str) -> str:
    """`low`, or `low-high` where they differ, each shown by `show`."""
    return show(low) if low == high else f"{show(low)}-{show(high)}"


def run_groups(runs: list[dict]) -> tuple[list[str], list[tuple]]:
    """One row per device: runs, ranks, device, events, skipped (summed), window (smallest-largest)."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(r.get("device") or "-", []).append(r)
    rows = []
    for device, members in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        events = [m["events_ingested"] for m in members]
        windows = [m["window_ns"] or 0 for m in members]
        rows.append((
            len(members),
            rank_ranges(m["rank"] for m in members),
            device,
            span(min(events), max(events)),
            sum(m["events_skipped"] for m in members),
            span(min(windows), max(windows), duration),
        ))  # fmt: skip
    return ["runs", "ranks", "device", "events", "skipped", "window"], rows


def kernel_totals(summary_runs: list[dict], top: int = 5) -> tuple[int, list[tuple]]:
    """(runs with kernels, rows): per kernel in any run's top list, the runs that list it, their
    calls and time, the mean call, and the smallest and largest time in one run; most time first."""
    per: dict[str, list[dict]] = {}
    listed = 0
    for run in summary_runs:
        kernels = run.get("top_kernels") or []
        listed += bool(kernels)
        for k in kernels[:top]:
            per.setdefault(k["name"], []).append(k)
    rows = []
    for name, ks in per.items():
        count, total = sum(k["count"] for k in ks), sum(k["total_ns"] for k in ks)
        per_run = [k["total_ns"] for k in ks]
        rows.append((name, len(ks), count, total, total // count if count else 0,
                     span(min(per_run), max(per_run), duration)))  # fmt: skip
    rows.sort(key=lambda r: (-r[3], r[0]))
    return listed, rows[:top]


KERNEL_COLUMNS = ["kernel", "runs", "count", "total", "mean", "one run"]
