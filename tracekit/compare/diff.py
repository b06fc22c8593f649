"""A/B comparison of two sets of traces: where the time difference comes from, and whether it is real.

Both sides are runs of one database (tracekit.api puts them there: `tracekit diff` labels them
`baseline/<file>` and `candidate/<file>`); every number is SQL over the public views. The time of a *window* (one step, one phase occurrence, or the
whole run) is split exactly on the run's main GPU (the device with the most busy time):

    window time = sum of GPU activity time clipped to the window (per kernel/memcpy/memset name)
                  - overlap (activities running concurrently on several streams)
                  + GPU idle time in the window

so the per-name deltas, the overlap delta and the idle delta add up to the delta of the window time.
The contributors list keeps the largest terms (by absolute delta); what the list leaves out is
`unexplained_ns`. Ops, threads and streams are reported beside it, ranked the same way, but they
overlap each other and the GPU terms, so they are not part of the sum.

A step is a unit of work both sides repeat (tracekit.compare.units); when none matches, or the units
hold different work, the document says the runs are not comparable and gives no verdict. See
docs/diff.md.
"""

from __future__ import annotations

import math
import random
import re

from tracekit.compare.sides import SIDES, Side
from tracekit.compare.units import (
    ANCHOR_KERNEL_SQL,
    KERNEL_FAMILY,
    STEADY_PERIOD_CV,
    WORK_OVERLAP_SQL,
    comparability,
    same_ranks,
    step_groups,
)
from tracekit.compare.window_sums import hits_sql
from tracekit.db.names import name_key
from tracekit.errors import TracekitError
from tracekit.units import duration

DIFF_SCHEMA_VERSION = "1.0"

METRICS = {
    "step_time": "mean step time (ns)",
    "step_p50": "median step time (ns)",
    "wall": "run window, first event to last (ns, mean over the side's runs)",
    "gpu_busy": "GPU busy time per step (ns; union of kernels, memcpys, memsets on the main device)",
    "gpu_util": "GPU busy share of the step time (0..1)",
    "idle": "GPU idle time per step (ns)",
    "launches": "GPU activities per step (kernels + memcpys + memsets)",
    "kernel:<text>": "GPU time per step of the kernels whose name contains <text> (ns)",
    "phase:<name>": "time in a phase per run (ns; prefill / decode annotations)",
}


# ---------------------------------------------------------------------------------------- windows


def _rows(con, sql: str, params=None) -> list[dict]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _main_devices(con, run_ids: list[int]) -> dict[int, int | None]:
    found = dict(con.execute("SELECT run_id, device FROM main_device").fetchall())
    return {r: found.get(r) for r in run_ids}


def find_steps(con, sides: dict[str, Side], step: str | None, globs: dict[str, str] | None = None) -> dict:
    """The unit of work both sides are compared by: with `globs` (a step name glob per side), the
    steps each side's glob selects (`step_groups`); `step` (an annotation name, compared by name key);
    else the stdlib's step rule (`step_candidates`: ProfilerStep#N, else the most frequent top-level
    user annotation, names keyed so per-run ids do not split one annotation) when it picks the same
    annotation in every run; when the runs' picks differ, the annotation the rule would pick over all
    runs together, present in every run; else a kernel that repeats at a steady period in every run
    (`anchor_kernel`: a unit is the time from one of its launches to the next); else the whole run,
    which `comparability` rejects. Needs `record_sides` first."""
    all_runs = [r for s in sides.values() for r in s.run_ids]
    if globs:
        groups = step_groups(con, sides, globs)
        names = {side: sorted({g["step"] for g in groups[side]}) for side in SIDES}
        return {
            "name": " vs ".join(", ".join(names[side]) for side in SIDES),
            "source": "--baseline-step / --candidate-step",
            "groups": groups,
            "selected": {side: {"glob": globs[side], "steps": names[side]} for side in SIDES},
        }
    if step:
        key = name_key(step)
        counts = dict(con.execute("SELECT run_id, count(*) FROM step_windows_named(?) GROUP BY 1", [key]).fetchall())
        missing = [r for r in all_runs if not counts.get(r)]
        if missing:
            labels = [_label(con, r) for r in missing]
            raise TracekitError(f"--step {step!r}: no such annotation in {', '.join(labels)}")
        return {"name": key, "source": "--step"}
    picks = dict(
        con.execute(
            "SELECT r.run_id, {'name': c.name, 'source': c.source} FROM runs r "
            "LEFT JOIN step_candidates c ON c.run_id = r.run_id AND c.choice = 1 WHERE list_contains(?, r.run_id)",
            [all_runs],
        ).fetchall()
    )
    chosen = {(p or {}).get("name") for p in picks.values()}
    if len(chosen) == 1 and None not in chosen:
        return {"name": chosen.pop(), "source": next(iter(picks.values()))["source"]}
    row = con.execute(
        """
        SELECT name, bool_or(source = 'ProfilerStep#N') AS profiler_step FROM step_candidates
        WHERE list_contains($runs, run_id) GROUP BY name
        HAVING count(DISTINCT run_id) = len($runs) AND (profiler_step OR sum(occurrences) >= 2 * len($runs))
        ORDER BY profiler_step DESC, sum(occurrences) DESC, name LIMIT 1
        """,
        {"runs": all_runs},
    ).fetchone()
    if row:
        return {"name": row[0], "source": "ProfilerStep#N" if row[1] else "most frequent top-level user annotation"}
    anchor = con.execute(ANCHOR_KERNEL_SQL, {"runs": len(all_runs), "cv": STEADY_PERIOD_CV}).fetchone()
    if anchor:
        return {"name": None, "source": "repeated kernel sequence", "anchor_kernel": anchor[0]}
    return {"name": None, "source": "no step annotation: the whole run is one step"}


def _label(con, run_id: int) -> str:
    return con.execute("SELECT label FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]


def record_sides(con, sides: dict[str, Side]) -> None:
    """Fill the temp table diff_sides(run_id, side, device): each run's side and main device."""
    devices = _main_devices(con, [r for s in sides.values() for r in s.run_ids])
    con.execute("CREATE OR REPLACE TEMP TABLE diff_sides (run_id INTEGER, side VARCHAR, device INTEGER)")
    for side in sides.values():
        for r in side.run_ids:
            con.execute("INSERT INTO diff_sides VALUES (?, ?, ?)", [r, side.name, devices[r]])


# The steps named $step (by name key) of the runs on side $side (of run $run_id only, unless it is NULL;
# of the annotations $annotations only, unless it is NULL), each with its phase and whether it is
# compared: the steady steps of a run that has any.
STEP_KEPT_SQL = """
INSERT INTO diff_step_kept
SELECT *, phase = 'steady' OR NOT bool_or(phase = 'steady') OVER (PARTITION BY run_id) AS kept FROM (
    SELECT s.side, w.run_id, s.device, w.step_index, w.start_ns, w.end_ns, coalesce(p.phase, 'steady') AS phase
    FROM step_windows_named($step) w JOIN diff_sides s ON s.run_id = w.run_id AND s.side = $side
    LEFT JOIN step_phases_named($step) p ON p.run_id = w.run_id AND p.step_index = w.step_index
    WHERE w.run_id = coalesce($run_id, w.run_id)
      AND ($annotations IS NULL OR list_contains($annotations::VARCHAR[], w.annotation))
)
"""


def build_windows(con, sides: dict[str, Side], step: dict) -> list[str]:
    """Fill the temp table diff_windows(side, run_id, device, grp, idx, ts_ns, end_ns); returns phase names."""
    con.execute(
        "CREATE OR REPLACE TEMP TABLE diff_windows (side VARCHAR, run_id INTEGER, device INTEGER, grp VARCHAR, "
        "idx INTEGER, ts_ns BIGINT, end_ns BIGINT)"
    )
    con.execute(
        "INSERT INTO diff_windows SELECT s.side, r.run_id, s.device, 'run', 0, r.start_ns, r.end_ns "
        "FROM runs r JOIN diff_sides s USING (run_id)"
    )
    if step.get("anchor_kernel"):
        con.execute(
            """
            INSERT INTO diff_windows
            SELECT side, run_id, device, 'step', idx, ts_ns, end_ns FROM (
                SELECT s.side, a.run_id, s.device, a.ts_ns,
                       lead(a.ts_ns) OVER (PARTITION BY a.run_id ORDER BY a.ts_ns, a.event_id) AS end_ns,
                       row_number() OVER (PARTITION BY a.run_id ORDER BY a.ts_ns, a.event_id) - 1 AS idx
                FROM gpu_activities a JOIN diff_sides s ON s.run_id = a.run_id AND s.device = a.device
                WHERE a.kind = 'kernel' AND a.name = ?
            ) WHERE end_ns > ts_ns
            """,
            [step["anchor_kernel"]],
        )
    elif step["name"] is None:
        con.execute("INSERT INTO diff_windows SELECT side, run_id, device, 'step', 0, ts_ns, end_ns FROM diff_windows")
    else:
        # the steady steps of a run that has any: warm-up, capture and profiler steps are other work
        con.execute(
            "CREATE OR REPLACE TEMP TABLE diff_step_kept (side VARCHAR, run_id INTEGER, device INTEGER, "
            "step_index INTEGER, start_ns BIGINT, end_ns BIGINT, phase VARCHAR, kept BOOLEAN)"
        )
        selections = step.get("groups") or {
            side: [{"run_id": None, "step": step["name"], "annotations": None}] for side in SIDES
        }
        for side, selected in selections.items():
            for g in selected:
                con.execute(STEP_KEPT_SQL, {"side": side, **g})
        con.execute(
            "INSERT INTO diff_windows SELECT side, run_id, device, 'step', "
            "CAST(row_number() OVER (PARTITION BY side, run_id ORDER BY start_ns, end_ns) - 1 AS INTEGER), "
            "start_ns, end_ns FROM diff_step_kept WHERE kept"
        )
        left = con.execute(
            "SELECT side, phase, count(*) FROM diff_step_kept WHERE NOT kept GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        step["left_out"] = {side: {phase: n for sd, phase, n in left if sd == side} for side in {r[0] for r in left}}
    # phases: user annotations naming prefill / decode, the outermost ones of each phase per run
    con.execute(
        """
        INSERT INTO diff_windows
        WITH p AS (
            SELECT run_id, ts_ns, end_ns, depth,
                   CASE WHEN lower(name) LIKE '%prefill%' THEN 'prefill' ELSE 'decode' END AS phase
            FROM events WHERE kind = 'user_annotation' AND dur_ns > 0
              AND (lower(name) LIKE '%prefill%' OR lower(name) LIKE '%decode%')
        )
        SELECT s.side, p.run_id, s.device, 'phase:' || p.phase,
               row_number() OVER (PARTITION BY p.run_id, p.phase ORDER BY p.ts_ns) - 1, p.ts_ns, p.end_ns
        FROM p JOIN diff_sides s USING (run_id)
        QUALIFY p.depth = min(p.depth) OVER (PARTITION BY p.run_id, p.phase)
        """
    )
    phases = [r[0] for r in con.execute(
        "SELECT substr(grp, 7) FROM diff_windows WHERE grp LIKE 'phase:%' GROUP BY grp "
        "HAVING count(DISTINCT side) = 2 ORDER BY min(ts_ns)"
    ).fetchall()]  # fmt: skip
    return phases


# ------------------------------------------------------------------------------------ measurements

# Per window: its time, GPU busy time (gpu_busy_between: two ASOF lookups) and how many activities overlap
# it: those starting before its end minus those ending at or before its start, each a count read by ASOF
# from the activities' ordered starts and ends (no range join of windows against activities).
WINDOW_SQL = """
WITH w AS (SELECT side, run_id, idx, device, ts_ns AS start_ns, end_ns FROM diff_windows WHERE grp = $grp),
busy AS (SELECT * FROM gpu_busy_between('w', 'all')),
act AS (SELECT run_id, device, ts_ns, end_ns FROM gpu_activities WHERE run_id IN (SELECT run_id FROM w)),
starts AS (SELECT run_id, device, ts_ns AS t, count(*) OVER (PARTITION BY run_id, device ORDER BY ts_ns) AS n
           FROM act QUALIFY row_number() OVER (PARTITION BY run_id, device, ts_ns) = 1),
ends AS (SELECT run_id, device, end_ns AS t, count(*) OVER (PARTITION BY run_id, device ORDER BY end_ns) AS n
         FROM act QUALIFY row_number() OVER (PARTITION BY run_id, device, end_ns) = 1),
started AS (SELECT w.run_id, w.idx, coalesce(s.n, 0) AS n FROM w ASOF LEFT JOIN starts s
            ON s.run_id = w.run_id AND s.device = w.device AND w.end_ns > s.t),
ended AS (SELECT w.run_id, w.idx, coalesce(e.n, 0) AS n FROM w ASOF LEFT JOIN ends e
          ON e.run_id = w.run_id AND e.device = w.device AND w.start_ns >= e.t)
SELECT b.side, b.run_id, b.idx, b.end_ns - b.start_ns AS dur_ns, b.busy_ns, s.n - e.n AS activities
FROM busy b JOIN started s USING (run_id, idx) JOIN ended e USING (run_id, idx)
ORDER BY b.side, b.run_id, b.idx
"""

# Each GPU activity's time clipped to each window of the group it hits (window_sums finds them by ASOF
# lookups, never by a range join), kept in the temp table diff_activity_hits for the three GPU views below.
ACTIVITY_HITS_SQL = hits_sql("SELECT run_id, device, event_id AS id, ts_ns, end_ns FROM gpu_activities", on_device=True)

# Activity time per (kind, name): the additive GPU terms.
GPU_TERMS_SQL = """
SELECT h.side, a.kind, a.name, sum(h.ns) AS ns, count(*) AS n
FROM diff_activity_hits h JOIN gpu_activities a ON a.event_id = h.id
GROUP BY ALL
"""

STREAMS_SQL = """
SELECT h.side, 'stream ' || a.stream AS name, sum(h.ns) AS ns, count(*) AS n
FROM diff_activity_hits h JOIN gpu_activities a ON a.event_id = h.id
GROUP BY ALL
"""

# Kernels grouped by family, so a kernel renamed by its template arguments or GPU architecture (volta_sgemm
# vs ampere_sgemm, sm80 vs sm90) matches across the sides: the name without 'void ', without template
# arguments / parameter list and with architecture tokens masked.
FAMILIES_SQL = f"""
SELECT h.side, {KERNEL_FAMILY} AS name, sum(h.ns) AS ns, count(*) AS n
FROM diff_activity_hits h JOIN gpu_activities a ON a.event_id = h.id
WHERE a.kind = 'kernel'
GROUP BY ALL
"""

# Op self time (duration minus direct children) of the ops that start in the window.
_OPS = (
    "SELECT run_id, event_id AS id, ts_ns, end_ns FROM cpu_ops "
    "WHERE dur_ns IS NOT NULL AND name NOT LIKE 'ProfilerStep#%'"
)
OPS_SQL = f"""
WITH hits AS ({hits_sql(_OPS, on_device=False, starts_only=True)}),
child AS (
    SELECT e.parent_id, sum(e.dur_ns) AS child_ns FROM events e
    WHERE e.parent_id IN (SELECT id FROM hits) AND e.dur_ns IS NOT NULL GROUP BY 1
)
SELECT h.side, name_key(o.name) AS name, sum(greatest(o.dur_ns - coalesce(c.child_ns, 0), 0)) AS ns, count(*) AS n
FROM hits h JOIN cpu_ops o ON o.event_id = h.id LEFT JOIN child c ON c.parent_id = o.event_id
GROUP BY ALL
"""

# Host time per thread: the outermost cpu_op / runtime / driver events, clipped to the window. The thread
# that holds the step annotation is "step thread"; others are named with their digits masked, so that
# threads match across runs.
_OUTERMOST_HOST = """
SELECT e.run_id, e.event_id AS id, e.ts_ns, e.end_ns FROM events e LEFT JOIN events p ON p.event_id = e.parent_id
WHERE e.kind IN ('cpu_op', 'cuda_runtime', 'cuda_driver') AND e.dur_ns > 0
  AND (p.kind IS NULL OR p.kind NOT IN ('cpu_op', 'cuda_runtime', 'cuda_driver'))
"""
THREADS_SQL = f"""
WITH hits AS ({hits_sql(_OUTERMOST_HOST, on_device=False)}),
steptid AS (
    SELECT DISTINCT e.run_id, e.pid, e.tid FROM events e JOIN diff_windows d
      ON d.grp = 'step' AND d.run_id = e.run_id AND d.ts_ns = e.ts_ns
    WHERE e.kind IN ('user_annotation', 'cpu_op')
)
SELECT h.side,
       CASE WHEN st.tid IS NOT NULL THEN 'step thread'
            ELSE regexp_replace(coalesce(t.name, 'thread'), '[0-9]+', '#', 'g') END AS name,
       sum(h.ns) AS ns, count(*) AS n
FROM hits h JOIN events e ON e.event_id = h.id
LEFT JOIN threads t ON t.run_id = e.run_id AND t.pid = e.pid AND t.tid = e.tid
LEFT JOIN steptid st ON st.run_id = e.run_id AND st.pid = e.pid AND st.tid = e.tid
GROUP BY ALL
"""

LAUNCH_SQL = f"""
WITH hits AS ({hits_sql("SELECT run_id, event_id AS id, ts_ns, end_ns FROM runtime_calls", on_device=False)})
SELECT side, count(*) AS n, sum(ns) AS ns FROM hits GROUP BY ALL
"""

# GPU time in the steps of the kernels whose name contains $name (the `kernel:` acceptance metric).
KERNEL_METRIC_SQL = f"""
WITH hits AS ({
    hits_sql(
        "SELECT run_id, device, event_id AS id, ts_ns, end_ns FROM kernels WHERE contains(name, $name)", on_device=True
    )
})
SELECT side, sum(ns) FROM hits GROUP BY 1
"""


SHORT_GAP_NS = 100_000
IDLE_CAUSES = {
    "host_launch": "GPU idle: waiting for host launches (gaps < 100 us)",
    "host_work": "GPU idle: waiting for host work between launches (gaps >= 100 us)",
    "device": "GPU idle: work queued, launched before the gap ended (dependencies, kernel wait)",
    "outside": "GPU idle: before the first / after the last GPU activity in the window",
}

# Device idle inside the window per cause, from idle_gaps (a gap is host-caused when the call that launched
# the activity ending it returned after the gap began). The gaps of one cause are disjoint blocks of a lane
# (device, cause), so busy_between clips them to the windows by two ASOF lookups.
IDLE_SQL = """
WITH w AS (SELECT * FROM diff_windows WHERE grp = $grp),
gaps AS (
    SELECT run_id, start_ns, end_ns, dur_ns,
           {'device': device, 'cause': CASE WHEN cause = 'host' AND dur_ns < $short THEN 'host_launch'
                                            WHEN cause = 'host' THEN 'host_work' ELSE 'device' END} AS lane
    FROM idle_gaps WHERE run_id IN (SELECT run_id FROM w)
), blocks AS (
    SELECT *, coalesce(sum(dur_ns) OVER (PARTITION BY run_id, lane ORDER BY start_ns
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS busy_before_ns
    FROM gaps
), lanes AS (
    SELECT w.side, w.run_id, w.ts_ns AS start_ns, w.end_ns, c.cause, {'device': w.device, 'cause': c.cause} AS lane
    FROM w, (VALUES ('host_launch'), ('host_work'), ('device')) c(cause)
)
SELECT side, cause, sum(busy_ns) AS ns FROM busy_between('lanes', 'blocks') GROUP BY ALL
"""


def _pct(delta, base):
    return round(100.0 * delta / base, 3) if base else None


def _share(part, whole):
    return round(part / whole, 4) if whole else None


def _stats(values: list[int]) -> dict:
    if not values:
        return {"n": 0}
    v = sorted(values)
    n = len(v)

    def q(p):
        k = (n - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return v[lo] + (v[hi] - v[lo]) * (k - lo)

    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else None
    return {
        "n": n,
        "mean_ns": round(mean),
        "median_ns": round(q(0.5)),
        "p25_ns": round(q(0.25)),
        "p75_ns": round(q(0.75)),
        "iqr_ns": round(q(0.75) - q(0.25)),
        "min_ns": v[0],
        "max_ns": v[-1],
        "stdev_ns": round(sd) if sd is not None else None,
    }


def bootstrap_ci(a: list[int], b: list[int], reps: int = 2000, level: float = 0.95, seed: int = 0):
    """Percentile bootstrap CI of mean(b) - mean(a), resampling each side (deterministic seed)."""
    if len(a) < 2 or len(b) < 2:
        return None
    rng = random.Random(seed)
    na, nb = len(a), len(b)
    diffs = sorted(
        sum(rng.choices(b, k=nb)) / nb - sum(rng.choices(a, k=na)) / na for _ in range(reps)
    )  # fmt: skip
    lo = diffs[int((1 - level) / 2 * reps)]
    hi = diffs[min(reps - 1, int((1 + level) / 2 * reps))]
    return [round(lo), round(hi)]


def _group_measure(con, grp: str, sides: dict[str, Side], per: str) -> dict:
    """Windows, per-side totals and the additive terms of one group. `per`: 'window' (divide by the
    side's window count: per-step means) or 'run' (divide by the side's run count: per-run totals)."""
    windows = _rows(con, WINDOW_SQL, {"grp": grp})
    out: dict = {"grp": grp, "per": per, "sides": {}}
    for name in SIDES:
        ws = [w for w in windows if w["side"] == name]
        div = len(ws) if per == "window" else len(sides[name].run_ids)
        div = div or 1
        durs = [int(w["dur_ns"]) for w in ws]
        busy = sum(int(w["busy_ns"]) for w in ws)
        out["sides"][name] = {
            "windows": len(ws),
            "div": div,
            "durations": durs,
            "time_ns": sum(durs) / div,
            "busy_ns": busy / div,
            "idle_ns": (sum(durs) - busy) / div,
            "activities": sum(int(w["activities"]) for w in ws) / div,
        }
    return out


def _per_side(rows: list[dict], m: dict) -> dict[tuple, dict]:
    """rows (side, key..., ns, n) -> {key: {baseline: (ns, n), candidate: (ns, n)}}, normalised."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = tuple(v for k, v in r.items() if k not in ("side", "ns", "n"))
        div = m["sides"][r["side"]]["div"]
        out.setdefault(key, {})[r["side"]] = (float(r["ns"] or 0) / div, float(r["n"] or 0) / div)
    return out


def _term(category: str, name: str, vals: dict, total_delta: float) -> dict:
    b_ns, b_n = vals.get("baseline", (0.0, 0.0))
    c_ns, c_n = vals.get("candidate", (0.0, 0.0))
    d = c_ns - b_ns
    return {
        "category": category,
        "name": name,
        "baseline_ns": round(b_ns),
        "candidate_ns": round(c_ns),
        "delta_ns": round(d),
        "delta_pct": _pct(d, b_ns),
        "share": _share(d, total_delta),
        "baseline_count": round(b_n, 3),
        "candidate_count": round(c_n, 3),
        "_exact": d,
    }


_CATEGORY = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def decompose(con, grp: str, sides: dict[str, Side], per: str, top: int) -> dict:
    """Delta of a group's time and the ranked terms that add up to it."""
    m = _group_measure(con, grp, sides, per)
    con.execute("CREATE OR REPLACE TEMP TABLE diff_activity_hits (id BIGINT, side VARCHAR, ns BIGINT)")
    con.execute(f"INSERT INTO diff_activity_hits {ACTIVITY_HITS_SQL}", {"grp": grp})
    b, c = m["sides"]["baseline"], m["sides"]["candidate"]
    delta = c["time_ns"] - b["time_ns"]
    terms = []
    act = {"baseline": 0.0, "candidate": 0.0}
    for (kind, name), vals in _per_side(_rows(con, GPU_TERMS_SQL), m).items():
        terms.append(_term(_CATEGORY.get(kind, kind), name, vals, delta))
        for s in SIDES:
            act[s] += vals.get(s, (0.0, 0.0))[0]
    # overlap = sum of clipped activity time - busy time; it enters the sum with a minus sign
    overlap = {s: (-(act[s] - m["sides"][s]["busy_ns"]), 0.0) for s in SIDES}
    if any(abs(v[0]) > 0.5 for v in overlap.values()):
        terms.append(_term("overlap", "GPU work overlapped across streams (subtracted)", overlap, delta))
    launches = {r["side"]: r for r in _rows(con, LAUNCH_SQL, {"grp": grp})}
    detail = {
        s: {
            "gpu_activities": round(m["sides"][s]["activities"], 3),
            "runtime_calls": round(float(launches[s]["n"]) / m["sides"][s]["div"], 3) if s in launches else 0,
            "runtime_call_ns": round(float(launches[s]["ns"]) / m["sides"][s]["div"]) if s in launches else 0,
        }
        for s in SIDES
    }
    # GPU idle split by cause; what no gap covers (before the first / after the last activity) is "outside"
    causes = {(r["side"], r["cause"]): float(r["ns"] or 0) / m["sides"][r["side"]]["div"]
              for r in _rows(con, IDLE_SQL, {"grp": grp, "short": SHORT_GAP_NS})}  # fmt: skip
    for cause, label in IDLE_CAUSES.items():
        vals = {}
        for s in SIDES:
            if cause == "outside":
                gaps = sum(v for (side, _), v in causes.items() if side == s)
                vals[s] = (m["sides"][s]["idle_ns"] - gaps, 0.0)
            else:
                vals[s] = (causes.get((s, cause), 0.0), 0.0)
        if all(abs(v[0]) < 0.5 for v in vals.values()):
            continue
        idle = _term("idle", label, vals, delta)
        idle["cause"] = cause
        idle["detail"] = detail
        terms.append(idle)
    terms.sort(key=lambda t: (-abs(t["_exact"]), t["category"], t["name"]))
    total_terms = sum(t["_exact"] for t in terms)
    listed = terms[:top]
    explained = sum(t["_exact"] for t in listed)
    for i, t in enumerate(listed, 1):
        t["rank"] = i
        del t["_exact"]

    def side_view(name):
        s = m["sides"][name]
        return {
            "windows": s["windows"],
            "time_ns": round(s["time_ns"]),
            "gpu_busy_ns": round(s["busy_ns"]),
            "gpu_idle_ns": round(s["idle_ns"]),
            "gpu_util": _share(s["busy_ns"], s["time_ns"]),
            "gpu_activities": round(s["activities"], 3),
        }

    secondary = {}
    group = {"grp": grp}
    views = (("kernel_families", FAMILIES_SQL, None), ("ops", OPS_SQL, group), ("threads", THREADS_SQL, group),
             ("streams", STREAMS_SQL, None))  # fmt: skip
    for key, sql, params in views:
        cat = {"kernel_families": "kernel_family"}.get(key, key[:-1])
        items = [_term(cat, str(k[0]), v, delta) for k, v in _per_side(_rows(con, sql, params), m).items()]
        items.sort(key=lambda t: (-abs(t["_exact"]), t["name"]))
        for t in items:
            del t["_exact"]
        secondary[key] = items[:top]
    return {
        "group": grp,
        "per": "step" if per == "window" else "run",
        "baseline": side_view("baseline"),
        "candidate": side_view("candidate"),
        "delta_ns": round(delta),
        "delta_pct": _pct(delta, b["time_ns"]),
        "contributors": listed,
        "contributors_total": len(terms),
        "unexplained_ns": round(delta - explained),
        "terms_residual_ns": round(delta - total_terms),
        "by": secondary,
        "_m": m,
    }


def noise(m: dict) -> dict:
    a = m["sides"]["baseline"]["durations"]
    b = m["sides"]["candidate"]["durations"]
    sa, sb = _stats(a), _stats(b)
    delta = (sum(b) / len(b) if b else 0) - (sum(a) / len(a) if a else 0)
    ci = bootstrap_ci(a, b)
    if delta == 0:
        within, why = True, "no difference"
    elif ci is None:
        within, why = None, "fewer than 2 steps on a side: no spread to compare against"
    else:
        within = ci[0] <= 0 <= ci[1]
        why = "95% bootstrap CI of the mean step-time delta " + ("contains 0" if within else "excludes 0")
    return {
        "metric": "step_time",
        "baseline": sa,
        "candidate": sb,
        "delta_mean_ns": round(delta),
        "ci95_delta_ns": ci,
        "method": "percentile bootstrap of mean(candidate) - mean(baseline), 2000 resamples, seed 0",
        "within_noise": within,
        "reason": why,
    }


# ------------------------------------------------------------------------------------- acceptance

_EXPR = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*(?::.+?)?)\s*(<=|>=|==|<|>)\s*([+-]?)\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(%|ns|us|ms|s)?\s*$"
)
_UNITS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9, None: 1}


def parse_accept(expr: str) -> dict:
    m = _EXPR.match(expr)
    if not m:
        raise TracekitError(
            f"--accept {expr!r}: expected METRIC OP VALUE, e.g. 'step_time <= +5%' or 'idle < 2ms' (see --help)"
        )
    metric, op, sign, num, unit = m.groups()
    base = metric.split(":", 1)[0]
    if base not in ("kernel", "phase") and metric not in METRICS:
        raise TracekitError(f"--accept {expr!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}")
    if base in ("kernel", "phase") and ":" not in metric:
        raise TracekitError(f"--accept {expr!r}: {base} needs a name, e.g. {base}:gemm")
    value = float(num) * (-1 if sign == "-" else 1)
    if unit == "%":
        mode = "relative"
    elif sign:
        mode, value = "absolute_change", value * _UNITS[unit]
    else:
        mode, value = "value", value * _UNITS[unit]
    return {"expr": expr.strip(), "metric": metric, "op": op, "threshold": value, "mode": mode}


_OPS = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "==": lambda a, b: abs(a - b) < 1e-9,
}


def metric_values(con, metric: str, doc: dict) -> tuple[float, float]:
    step = doc["delta"]["step"]
    if metric == "step_time":
        return step["baseline"]["time_ns"], step["candidate"]["time_ns"]
    if metric == "step_p50":
        return doc["noise"]["baseline"].get("median_ns", 0), doc["noise"]["candidate"].get("median_ns", 0)
    if metric == "wall":
        e2e = doc["delta"]["end_to_end"]
        return e2e["baseline"]["time_ns"], e2e["candidate"]["time_ns"]
    if metric == "gpu_busy":
        return step["baseline"]["gpu_busy_ns"], step["candidate"]["gpu_busy_ns"]
    if metric == "gpu_util":
        return step["baseline"]["gpu_util"] or 0.0, step["candidate"]["gpu_util"] or 0.0
    if metric == "idle":
        return step["baseline"]["gpu_idle_ns"], step["candidate"]["gpu_idle_ns"]
    if metric == "launches":
        return step["baseline"]["gpu_activities"], step["candidate"]["gpu_activities"]
    kind, name = metric.split(":", 1)
    if kind == "phase":
        phase = doc["delta"]["phases"].get(name)
        if phase is None:
            have = ", ".join(doc["delta"]["phases"]) or "none"
            raise TracekitError(f"--accept {metric}: no phase {name!r} on both sides (phases: {have})")
        return phase["baseline"]["time_ns"], phase["candidate"]["time_ns"]
    rows = con.execute(KERNEL_METRIC_SQL, {"grp": "step", "name": name}).fetchall()
    got = dict(rows)
    if not got:
        raise TracekitError(f"--accept {metric}: no kernel name contains {name!r} on either side")
    per = {s: step[s]["windows"] or 1 for s in SIDES}
    return float(got.get("baseline") or 0) / per["baseline"], float(got.get("candidate") or 0) / per["candidate"]


def evaluate(con, criteria: list[dict], doc: dict) -> list[dict]:
    out = []
    for c in criteria:
        b, v = metric_values(con, c["metric"], doc)
        d = v - b
        pct = _pct(d, b)
        if c["mode"] == "relative":
            measured = pct if pct is not None else (0.0 if d == 0 else math.copysign(math.inf, d))
        elif c["mode"] == "absolute_change":
            measured = d
        else:
            measured = v
        out.append(
            {
                "expr": c["expr"],
                "metric": c["metric"],
                "mode": c["mode"],
                "threshold": c["threshold"],
                "baseline": _num(b),
                "candidate": _num(v),
                "delta": _num(d),
                "delta_pct": pct,
                "measured": _num(measured),
                "passed": bool(_OPS[c["op"]](measured, c["threshold"])),
                # step metrics: whether the step-time delta is within the steps' noise (see `noise`)
                "within_noise": doc["noise"]["within_noise"] if c["metric"] in ("step_time", "step_p50") else None,
            }
        )
    return out


def _num(x):
    if isinstance(x, float) and math.isfinite(x) and abs(x) >= 1000:
        return round(x)
    return round(x, 4) if isinstance(x, float) and math.isfinite(x) else x


# ------------------------------------------------------------------------------------------ driver


def compare(
    con,
    sides: dict[str, Side],
    step: str | None = None,
    accept: list[str] = (),
    top: int = 15,
    step_globs: dict[str, str] | None = None,
) -> dict:
    """The diff document (see docs/diff.md) over a database holding both sides; `step_globs`: a step
    name glob per side (`baseline`, `candidate`) that selects the steps compared."""
    criteria = [parse_accept(a) for a in accept]
    ranks = same_ranks(con, sides)
    sides = ranks.sides
    record_sides(con, sides)
    step_info = find_steps(con, sides, step, step_globs)
    phases = build_windows(con, sides, step_info)
    e2e = decompose(con, "run", sides, "run", top)
    st = decompose(con, "step", sides, "window", top)
    overlap = con.execute(WORK_OVERLAP_SQL).fetchone()[0]
    verdict = comparability(step_info, overlap, ranks)
    ph = {p: decompose(con, f"phase:{p}", sides, "run", top) for p in phases}
    runs = {
        name: [
            _rows(
                con,
                "SELECT r.run_id, r.label, r.source, r.rank, s.device, r.end_ns - r.start_ns AS window_ns "
                "FROM runs r JOIN diff_sides s USING (run_id) WHERE r.run_id = ?",
                [rid],
            )[0]
            for rid in side.run_ids
        ]
        for name, side in sides.items()
    }
    step_doc = {
        "name": step_info["name"],
        "source": step_info["source"],
        "baseline": st["_m"]["sides"]["baseline"]["windows"],
        "candidate": st["_m"]["sides"]["candidate"]["windows"],
        "per_step_ns": {s: st["_m"]["sides"][s]["durations"] for s in SIDES},
        **({"anchor_kernel": step_info["anchor_kernel"]} if step_info.get("anchor_kernel") else {}),
        **({"selected": step_info["selected"]} if step_info.get("selected") else {}),
        # steps not compared: warm-up, capture or profiler steps of a run that has steady ones
        "left_out": step_info.get("left_out", {}),
        "comparable": verdict["comparable"],
        "comparability": verdict["reason"],
        "work_overlap": None if overlap is None else round(overlap, 4),
    }
    nz = noise(st["_m"])
    # what a finding's status is judged by (findings.status): its cost per unit of work on each side
    nz["units_per_run"] = {s: st["_m"]["sides"][s]["windows"] / max(len(sides[s].run_ids), 1) for s in SIDES}
    nz["runs"] = {s: len(sides[s].run_ids) for s in SIDES}
    nz["comparable"], nz["comparability"] = verdict["comparable"], verdict["reason"]
    # per phase: the spread of its occurrences (e.g. every decode step), when both sides have several
    nz["phases"] = {}
    for p, d in ph.items():
        pn = noise(d["_m"])
        pn["metric"] = f"phase:{p} occurrence time"
        pn["method"] = pn["method"].replace("step-time", "occurrence-time")
        pn["reason"] = pn["reason"].replace("step-time", "occurrence-time").replace("steps", "occurrences")
        nz["phases"][p] = pn
    if not verdict["comparable"]:
        for n in (nz, *nz["phases"].values()):
            n["within_noise"], n["reason"] = None, "not comparable: " + verdict["reason"]
    for d in (e2e, st, *ph.values()):
        d.pop("_m")
    doc = {
        "schema_version": DIFF_SCHEMA_VERSION,
        "time_unit": "ns",
        "baseline": {"runs": runs["baseline"]},
        "candidate": {"runs": runs["candidate"]},
        "steps": step_doc,
        "delta": {
            "end_to_end": _headline(e2e),
            "step": _headline(st),
            "phases": {
                p: {**_headline(d), "contributors": d["contributors"], "unexplained_ns": d["unexplained_ns"]}
                for p, d in ph.items()
            },
        },  # fmt: skip
        "contributors": st["contributors"],
        "contributors_total": st["contributors_total"],
        "unexplained_ns": st["unexplained_ns"],
        "by": st["by"],
        "noise": nz,
    }
    doc["acceptance"] = evaluate(con, criteria, doc)
    if not verdict["comparable"]:
        # a verdict on the numbers of two different units of work would be a guess: none is given
        for a in doc["acceptance"]:
            a["passed"], a["verdict"] = False, "not comparable"
    doc["passed"] = all(a["passed"] for a in doc["acceptance"])
    return doc


def _headline(d: dict) -> dict:
    return {k: d[k] for k in ("per", "baseline", "candidate", "delta_ns", "delta_pct")}


# ---------------------------------------------------------------------------------------- rendering


def _dms(ns) -> str:
    """A delta by magnitude, with its sign: +1.20 ms, -850 us."""
    return duration(ns) if ns is None or ns < 0 else "+" + duration(ns)


def _p(x) -> str:
    return "n/a" if x is None else f"{x:+.1f}%"


def _fmt_measured(a: dict) -> str:
    if a["mode"] == "relative":
        return f"{_p(a['delta_pct'])}"
    scale = a["metric"] not in ("gpu_util", "launches")
    if a["mode"] == "absolute_change":
        return _dms(a["delta"]) if scale else f"{a['delta']:+g}"
    return duration(a["candidate"]) if scale else f"{a['candidate']:g}"


def _what(t: dict) -> str:
    name = t["name"] if len(t["name"]) <= 90 else t["name"][:87] + "..."
    extra = ""
    if t["category"] in ("kernel", "memcpy", "memset"):
        extra = f"  (count {t['baseline_count']:g} -> {t['candidate_count']:g})"
    if t.get("cause") == "host_launch":
        b, c = t["detail"]["baseline"], t["detail"]["candidate"]
        extra = (
            f"  (GPU activities {b['gpu_activities']:g} -> {c['gpu_activities']:g}, runtime calls "
            f"{b['runtime_calls']:g} -> {c['runtime_calls']:g})"
        )
    return f"{t['category']}: {name}{extra}"


def to_text(doc: dict) -> str:
    L = []
    sides = " vs ".join(
        f"{s}: " + ", ".join(r["label"].split("/", 1)[-1] for r in doc[s]["runs"]) for s in SIDES
    )  # fmt: skip
    L.append(f"tracekit diff  {sides}")
    st = doc["steps"]
    unit = st["name"] or (
        f"kernel {st['anchor_kernel'][:60]} to the next" if st.get("anchor_kernel") else "(whole run)"
    )
    L.append(f"step: {unit} [{st['source']}], {st['baseline']} vs {st['candidate']} steps")
    for side, phases in st["left_out"].items():
        L.append(f"  {side}: left out " + ", ".join(f"{n} {phase} step(s)" for phase, n in phases.items()))
    if not st["comparable"]:
        L.append(f"NOT COMPARABLE: {st['comparability']}; the numbers below are no verdict")
    L.append("")

    def line(label, d):
        return (
            f"  {label:<18} {duration(d['baseline']['time_ns']):>14} -> {duration(d['candidate']['time_ns']):>14}"
            f"  {_dms(d['delta_ns']):>14} {_p(d['delta_pct']):>9}   GPU util "
            f"{_pp(d['baseline']['gpu_util'])} -> {_pp(d['candidate']['gpu_util'])}"
        )

    L.append(line("end to end (run)", doc["delta"]["end_to_end"]))
    L.append(line("step (mean)", doc["delta"]["step"]))
    for p, d in doc["delta"]["phases"].items():
        L.append(line(f"phase {p} (run)", d))
    n = doc["noise"]
    b, c = n["baseline"], n["candidate"]
    if b.get("n") and c.get("n"):
        L.append(
            f"  noise: median {duration(b['median_ns'])} (IQR {duration(b['iqr_ns'])}) -> {duration(c['median_ns'])} "
            f"(IQR {duration(c['iqr_ns'])}); 95% CI of delta "
            + (f"[{_dms(n['ci95_delta_ns'][0])}, {_dms(n['ci95_delta_ns'][1])}]" if n["ci95_delta_ns"] else "n/a")
            + "; "
            + {True: "WITHIN NOISE", False: "outside noise", None: "noise unknown"}[n["within_noise"]]
            + f" ({n['reason'] if st['comparable'] else 'not comparable: see above'})"
        )
    L.append("")
    L.append(f"What accounts for the step-time delta ({_dms(doc['delta']['step']['delta_ns'])} per step):")
    for t in doc["contributors"]:
        L.append(f"  {t['rank']:>2}. {_dms(t['delta_ns']):>13} {_share_s(t['share']):>7}  {_what(t)}")
    L.append(f"      {_dms(doc['unexplained_ns']):>13} {'':>7}  unexplained (terms not listed)")
    for key in ("kernel_families", "ops", "threads", "streams"):
        items = [t for t in doc["by"][key] if t["delta_ns"]][:5]
        if items:
            L.append(f"By {key} (per step, overlapping views, not additive):")
            for t in items:
                L.append(f"      {_dms(t['delta_ns']):>13} {_share_s(t['share']):>7}  {t['name'][:100]}")
    for p, d in doc["delta"]["phases"].items():
        L.append(f"Phase {p} ({_dms(d['delta_ns'])} per run), top terms:")
        for t in d["contributors"][:5]:
            L.append(f"  {t['rank']:>2}. {_dms(t['delta_ns']):>13} {_share_s(t['share']):>7}  {_what(t)}")
    if doc["acceptance"]:
        L.append("")
        L.append("Acceptance:")
        for a in doc["acceptance"]:
            L.append(f"  {_verdict(a)}  {a['expr']}: measured {_fmt_measured(a)} "
                     f"(baseline {_val(a, 'baseline')}, candidate {_val(a, 'candidate')})"
                     + (" [delta within noise]" if a.get("within_noise") and a["delta"] else ""))  # fmt: skip
    return "\n".join(L) + "\n"


def _verdict(a: dict) -> str:
    return "N/A " if a.get("verdict") == "not comparable" else "PASS" if a["passed"] else "FAIL"


def _val(a, key) -> str:
    return f"{a[key]:g}" if a["metric"] in ("gpu_util", "launches") else duration(a[key])


def _pp(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _share_s(x) -> str:
    return "" if x is None else f"{100 * x + 0.0:.0f}%" if abs(x) >= 0.005 else "0%"


def to_markdown(doc: dict) -> str:
    L = ["# tracekit diff", ""]
    for s in SIDES:
        L.append(f"- **{s}**: " + ", ".join(f"`{r['label']}`" for r in doc[s]["runs"]))
    st = doc["steps"]
    L += [
        f"- **step**: `{st['name'] or st.get('anchor_kernel') or '(whole run)'}` ({st['source']}), "
        f"{st['baseline']} vs {st['candidate']}"
    ]
    if not st["comparable"]:
        L.append(f"- **not comparable**: {st['comparability']}")
    L.append("")
    L += ["| scope | baseline | candidate | delta | delta % |", "|---|---|---|---|---|"]
    rows = [("end to end (per run)", doc["delta"]["end_to_end"]), ("step (mean)", doc["delta"]["step"])]
    rows += [(f"phase {p} (per run)", d) for p, d in doc["delta"]["phases"].items()]
    for label, d in rows:
        L.append(
            f"| {label} | {duration(d['baseline']['time_ns'])} | {duration(d['candidate']['time_ns'])} "
            f"| {_dms(d['delta_ns'])} | {_p(d['delta_pct'])} |"
        )
    n = doc["noise"]
    ci = n["ci95_delta_ns"]
    ci_text = f"[{_dms(ci[0])}, {_dms(ci[1])}]" if ci else "n/a"
    L += ["", f"Noise: within noise = **{n['within_noise']}** ({n['reason']}); CI95 {ci_text}", ""]
    L += ["## Contributors (per step)", "", "| # | delta | share | what |", "|---|---|---|---|"]
    for t in doc["contributors"]:
        L.append(f"| {t['rank']} | {_dms(t['delta_ns'])} | {_share_s(t['share'])} | {_what(t).replace('|', '/')} |")
    L.append(f"| | {_dms(doc['unexplained_ns'])} | | unexplained |")
    if doc["acceptance"]:
        L += ["", "## Acceptance", "", "| criterion | measured | result |", "|---|---|---|"]
        for a in doc["acceptance"]:
            L.append(f"| `{a['expr']}` | {_fmt_measured(a)} | {_verdict(a).strip()} |")
    return "\n".join(L) + "\n"


def render(doc: dict, fmt: str) -> str:
    if fmt == "json":
        import orjson

        return orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str).decode() + "\n"
    if fmt == "markdown":
        return to_markdown(doc)
    return to_text(doc)
