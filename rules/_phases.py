"""The steady state the rules analyse, and what they leave out of it (the `run_phases` view).

Rules that measure idle time, blocking calls, steps or exposed communication read only the steady
pieces of a run unless their `all_phases` option is set; each finding then says, in `extra.left_out`
and a caveat, which warm-up, capture and profiler windows of its window were left out and why. A run
with no steady state worth analysing (`run_steady.all_cold`) gets P001 cold-profile instead.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from tracekit.engine.registry import Param
from tracekit.engine.toolkit import rows
from tracekit.units import duration

ALL_PHASES = Param(
    False, "analyse every phase (warm-up, CUDA-graph capture, profiler bookkeeping), not only the steady state", "bool"
)

# How many left-out windows a finding lists (the longest); the totals cover all of them.
LISTED_WINDOWS = 5


@dataclass
class RunSplit:
    """One run's steady time and its left-out windows (the non-steady rows of `run_phases`)."""

    window_ns: int
    steady_ns: int
    all_cold: bool
    left_out: list = field(default_factory=list)


# The rules' own queries read `run_phases` from this table, computed once per analysis (a Context);
# their evidence SQL reads the view, so it stays self-contained.
PHASES_TABLE = "_run_phases"

_SPLITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def in_rule(con, ctx, sql: str) -> str:
    """`sql` (which calls the phase macros with `all_phases := $all_phases`) reading the phases of this
    analysis from its table rather than evaluating the view again."""
    _splits(con, ctx)
    return sql.replace("all_phases := $all_phases)", f"all_phases := $all_phases, phases := '{PHASES_TABLE}')")


def _splits(con, ctx) -> dict[int, RunSplit]:
    if ctx not in _SPLITS:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {PHASES_TABLE} AS SELECT * FROM run_phases")
        out = {
            r.run_id: RunSplit(int(r.window_ns or 0), int(r.steady_ns or 0), bool(r.all_cold))
            for r in rows(
                con,
                "SELECT run_id, window_ns, steady_ns, all_cold FROM run_steady",  # a table while rules run
            )
        }
        for w in rows(
            con,
            f"SELECT run_id, phase, start_ns, end_ns, dur_ns, windows, reason FROM {PHASES_TABLE} "
            "WHERE phase <> 'steady' ORDER BY run_id, start_ns",
        ):
            if w.run_id in out:
                out[w.run_id].left_out.append(w)
        _SPLITS[ctx] = out
    return _SPLITS[ctx]


def phases_table(con, ctx) -> str:
    """The name of the table holding this analysis's `run_phases` rows."""
    _splits(con, ctx)
    return PHASES_TABLE


def split(con, ctx, run_id: int) -> RunSplit:
    return _splits(con, ctx).get(run_id) or RunSplit(0, 0, False)


def skip_run(con, ctx, run_id: int, params) -> bool:
    """The run has no steady state worth analysing (P001 cold-profile reports it), unless every phase is asked."""
    return not params["all_phases"] and split(con, ctx, run_id).all_cold


def window(con, ctx, run, params) -> int:
    """The run window a rule measures shares against: its steady time, or all of it with all_phases."""
    if params["all_phases"]:
        return run.window_ns
    steady = split(con, ctx, run.run_id)
    return steady.steady_ns if steady.window_ns else run.window_ns


def left_out(con, ctx, run_id: int, start_ns: int, end_ns: int, params) -> list[dict]:
    """The left-out windows inside [start_ns, end_ns], clipped to it, longest first."""
    if params["all_phases"]:
        return []
    out = []
    for w in split(con, ctx, run_id).left_out:
        lo, hi = max(int(w.start_ns), int(start_ns)), min(int(w.end_ns), int(end_ns))
        if hi > lo:
            out.append({"phase": w.phase, "start_ns": lo, "end_ns": hi, "dur_ns": hi - lo, "windows": int(w.windows),
                        "reason": w.reason})  # fmt: skip
    return sorted(out, key=lambda w: (-w["dur_ns"], w["start_ns"]))


def run_left_out(con, ctx, run, params) -> list[dict]:
    """Every left-out window of the run: what a rule measuring shares of the run's steady time left out."""
    return left_out(con, ctx, run.run_id, run.start_ns or 0, run.end_ns or 0, params)


def listed(windows: list[dict]) -> list[dict]:
    """What a finding's `extra.left_out` holds: the longest windows."""
    return windows[:LISTED_WINDOWS]


def caveat(windows: list[dict], measured: str) -> str | None:
    """One line saying what was left out of `measured` and how to include it; None when nothing was."""
    if not windows:
        return None
    by_phase: dict[str, int] = {}
    for w in windows:
        by_phase[w["phase"]] = by_phase.get(w["phase"], 0) + w["dur_ns"]
    totals = ", ".join(f"{duration(ns)} of {phase}" for phase, ns in sorted(by_phase.items(), key=lambda kv: -kv[1]))
    longest = windows[0]
    return (
        f"Steady state only: left out of {measured} {totals} ({len(windows)} window(s); the longest, "
        f"{duration(longest['dur_ns'])}: {longest['reason']}). Set all_phases=true to include every phase."
    )
