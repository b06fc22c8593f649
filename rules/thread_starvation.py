"""A thread starved while another thread of its process is inside a long native op (H002 thread-starvation).

## What it does
Looks for the GIL case: a long native call on one thread (A) that keeps the Python GIL while it
waits, so every other Python thread of the process (B) stops until it returns. Windows are A's
repeated long events of one name: `cpu_op`, `user_annotation` (`record_function`) or
`python_function` (a C builtin such as `<built-in method intranode_dispatch ...>`) lasting at least
`min_window_ns`, at least `min_windows` times (outermost only; Python waits that release the GIL,
`time.sleep`, lock/queue/select waits, are never windows). For each other thread B of the same pid
with Python activity, over the span from the first to the last window (inside B's own active span)
it measures:

- B's activity rate (starts of its `python_function`, `user_annotation`, `cpu_op` and CUDA runtime
  events, per ms) inside the windows vs outside them; `observed` is the ratio in/out;
- a per-window paired test: B's rate in each window vs in the stretch just before it (as long as
  the window, cut at the previous window's end); under independence B is slower inside as often as
  faster, a sign test gives the p-value;
- a Poisson test of B's in-window count against its out-of-window rate (events of one unit of work
  cluster, so this one is optimistic; the finding reports the larger of the two p-values);
- the share of B's idle gaps (starts `min_gap_ns` or more apart) that falls inside the windows,
  next to the windows' share of the span;
- the latency of B's units of work (its most frequent `record_function` name, e.g.
  `kv_transfer_chunk`) that overlap a window vs those that do not;
- a handoff test: the share of B's idle gaps that end within `handoff_ns` of the start or end of a
  window whose core B never runs in, against that zone's share of the span (binomial test). A thread
  starved everywhere (when the code around the op is pure Python that also keeps the GIL) has no
  in/out contrast, but it still only gets to run at the few points where A lets the GIL go:
  `record_function` enter/exit and the op's own return.

A pair is reported when B's in-window rate is at most `max_rate_ratio` of its outside rate with
p < `alpha` (`observed` is the rate ratio), or else when at least `min_handoff_gaps` gaps, and at
least half of them, end at such edges with p < `alpha` (`observed` is that share;
`evidence.details.observed_column` names the evidence column either way). Per pair of threads the
window op with the strongest effect is kept (user annotations and ops before the Python builtin
inside them), and when two threads seem to starve each other only the stronger direction is kept.

## Why it matters
A native op that waits without `py::gil_scoped_release` (DeepEP `intranode_dispatch` in v1.2.1,
a blocking recv, a polling loop in a C extension) freezes every Python thread of the process for the
whole wait: a KV-cache transfer thread (Mooncake, NIXL), a scheduler, a detokenizer or a metrics
thread stall for milliseconds per step, and the stall shows up far from its cause, as slow
transfers, TTFT spikes or timeouts on another thread. Nothing on the starved thread's own timeline
names the culprit; only the correlation with the other thread's windows does.

## Example
`sample_traces/gil_hold.json.gz` (H200, `scripts/make_gil_traces.py`): the main thread calls a C++
spin-wait of 3 ms inside `record_function("deepep_like::intranode_dispatch")` 120 times, holding the
GIL. Thread `kv_transfer` starts 0.96 events/ms inside those windows (369 ms) vs 24 per ms outside
(ratio 0.04; 118 of 119 windows slower than the stretch before them, p ~ 1e-36); 141 of its 157
idle gaps end at a window edge where 9% would by chance, and its `kv_transfer_chunk` units that
overlap a window take 3.3 ms (median) vs 0.19 ms for the others. The finding names the builtin
inside the windows, `<built-in method dispatch_hold ...>`, as the native call. With the GIL released
around the wait (`gil_release.json.gz`, same workload) the thread runs 2.9x faster inside the windows
than outside (the main thread's Python is out of its way) and nothing is reported.

## Options
- `min_window_ns` (1000000): an event must last this long to be a window (1 ms).
- `min_windows` (10): a window op must occur this often on its thread.
- `min_thread_events` (20): a thread needs this many `python_function` events in the span to be
  checked as starved.
- `max_rate_ratio` (0.5): report when the starved thread's in-window activity rate is at most
  this share of its outside rate.
- `alpha` (0.001): and the larger of the two p-values (sign test, Poisson test) is below this.
- `min_gap_ns` (500000): gaps between the starved thread's activity starts at least this long
  count as idle gaps.
- `handoff_ns` (100000): an idle gap that ends this close to the start or end of a window (whose
  core the thread never runs in) ends at a handoff.
- `min_handoff_gaps` (5): the handoff test needs at least this many gaps ending at a handoff.
- `max_candidates` (8): window ops tried per thread (the longest in total).
- `report_clear` (false): also report checked pairs that are not significant, as `info` findings
  with the numbers (useful to confirm a fix).
"""

from __future__ import annotations

import math
import re

from tracekit.engine.registry import Param, rule
from tracekit.findings.model import Finding, Quantity

ACTIVITY_KINDS = ("python_function", "user_annotation", "cpu_op", "cuda_runtime", "cuda_driver")
WINDOW_KINDS = ("user_annotation", "cpu_op", "python_function")
KIND_PREFERENCE = {"user_annotation": 0, "cpu_op": 1, "python_function": 2}
# waits that release the GIL by design: a thread blocked in them starves nobody
GIL_FREE_WAITS = (
    r"^<built-in (function|method) (sleep|wait|acquire|join|select|poll|epoll|recv|recv_into|accept|get)\b"
    r"|^(threading|queue|selectors|socket|asyncio/.*|concurrent/.*|multiprocessing/.*)\.py\("
)
ADDRESS_SQL = "regexp_replace(name, ' at 0x[0-9a-f]+', '')"

CANDIDATES_SQL = f"""
SELECT pid, tid, kind, {ADDRESS_SQL} AS op, count(*) AS n, sum(dur_ns) AS total_ns
FROM events
WHERE run_id = $run_id AND kind IN ('user_annotation', 'cpu_op', 'python_function')
  AND dur_ns >= $min_window_ns AND pid IS NOT NULL AND tid IS NOT NULL
  AND NOT starts_with(name, 'ProfilerStep#')
  AND NOT regexp_matches(name, $gil_free)
  AND (kind <> 'python_function' OR starts_with(name, '<built-in'))  -- Python frames run bytecode, not a native wait
GROUP BY ALL
HAVING count(*) >= $min_windows
ORDER BY pid, tid, total_ns DESC, op
"""

THREADS_SQL = """
SELECT pid, tid, count(*) AS n FROM python_functions WHERE run_id = $run_id
GROUP BY ALL HAVING count(*) >= $min_thread_events ORDER BY pid, tid
"""

# The evidence query: one row of numbers for one (window op on thread A, starved thread B) pair.
STATS_SQL = f"""
WITH raw AS (
    SELECT event_id, ts_ns, end_ns,
           max(end_ns) OVER (ORDER BY ts_ns, event_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_to
    FROM events
    WHERE run_id = $run_id AND pid = $pid AND tid = $window_tid AND kind = $window_kind
      AND {ADDRESS_SQL} = $window_op AND dur_ns >= $min_window_ns
), act AS (
    SELECT event_id, ts_ns FROM events
    WHERE run_id = $run_id AND pid = $pid AND tid = $thread_tid
      AND kind IN ('python_function', 'user_annotation', 'cpu_op', 'cuda_runtime', 'cuda_driver')
), active AS (SELECT min(ts_ns) AS lo, max(ts_ns) AS hi FROM act),
w AS (  -- outermost windows inside the starved thread's active span
    SELECT raw.event_id, ts_ns, end_ns, end_ns - ts_ns AS dur_ns, lag(end_ns) OVER (ORDER BY ts_ns) AS prev_end
    FROM raw, active
    WHERE (covered_to IS NULL OR ts_ns >= covered_to) AND ts_ns >= active.lo AND end_ns <= active.hi
), span AS (SELECT min(ts_ns) AS lo, max(end_ns) AS hi, count(*) AS windows, sum(dur_ns) AS in_ns FROM w),
s AS (  -- each activity start with the window at or before it and the window after it
    SELECT a.ts_ns, a.event_id, prv.event_id AS prv_id, a.ts_ns < prv.end_ns AS inside, nxt.event_id AS nxt_id
    FROM (SELECT act.* FROM act, span WHERE act.ts_ns >= span.lo AND act.ts_ns < span.hi) a
    ASOF LEFT JOIN w prv ON a.ts_ns >= prv.ts_ns
    ASOF LEFT JOIN w nxt ON a.ts_ns < nxt.ts_ns
), per_window AS (  -- B's rate in each window vs in the stretch just before it
    SELECT w.event_id, w.dur_ns, w.ts_ns - greatest(w.prev_end, w.ts_ns - w.dur_ns) AS ctrl_ns,
           (SELECT count(*) FROM s WHERE s.prv_id = w.event_id AND s.inside) AS n_in,
           (SELECT count(*) FROM s WHERE s.nxt_id = w.event_id
               AND s.ts_ns >= greatest(w.prev_end, w.ts_ns - w.dur_ns)) AS n_ctrl
    FROM w WHERE w.prev_end IS NOT NULL AND w.prev_end < w.ts_ns
), gaps AS (
    SELECT ts_ns AS g0, nx AS g1 FROM (
        SELECT ts_ns, lead(ts_ns) OVER (ORDER BY ts_ns, event_id) AS nx FROM s) t
    WHERE nx - ts_ns >= $min_gap_ns
), quiet AS (  -- windows whose core (all but $handoff_ns at each edge) holds no activity of B
    SELECT w.ts_ns, w.end_ns FROM w
    WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.prv_id = w.event_id
                      AND s.ts_ns >= w.ts_ns + $handoff_ns AND s.ts_ns < w.end_ns - $handoff_ns)
), edges AS (SELECT ts_ns AS t FROM quiet UNION ALL SELECT end_ns FROM quiet),
handoff AS (  -- does each idle gap end at an edge of a quiet window, i.e. when A lets the GIL go?
    SELECT count(*) AS gaps_n,
           count(*) FILTER (WHERE coalesce(g1 - pe.t <= $handoff_ns, false)
                               OR coalesce(ne.t - g1 <= $handoff_ns, false)) AS gaps_at_edge
    FROM gaps
    ASOF LEFT JOIN edges pe ON gaps.g1 >= pe.t
    ASOF LEFT JOIN edges ne ON gaps.g1 < ne.t
), gap_cover AS (
    SELECT coalesce(sum(least(g1, w.end_ns) - greatest(g0, w.ts_ns)), 0) AS covered_ns
    FROM gaps JOIN w ON w.ts_ns < gaps.g1 AND w.end_ns > gaps.g0
), units AS (  -- the starved thread's units of work (its record_function ranges of one name)
    SELECT u.event_id, u.dur_ns, coalesce(u.ts_ns < ow.end_ns, false) AS hits_window
    FROM (SELECT e.event_id, e.ts_ns, e.end_ns, e.dur_ns FROM events e, span
          WHERE e.run_id = $run_id AND e.pid = $pid AND e.tid = $thread_tid AND e.kind = 'user_annotation'
            AND e.name = $unit_name AND e.ts_ns >= span.lo AND e.end_ns <= span.hi) u
    ASOF LEFT JOIN w ow ON u.end_ns > ow.ts_ns
)
SELECT
    round((count(*) FILTER (WHERE inside) / any_value(span.in_ns))
          / nullif(count(*) FILTER (WHERE NOT inside) / nullif(any_value(span.hi - span.lo - span.in_ns), 0), 0),
          4) AS rate_ratio,
    any_value(span.windows) AS windows,
    any_value(span.in_ns) AS window_total_ns,
    any_value(span.lo) AS first_ns,
    any_value(span.hi) AS last_ns,
    any_value(span.hi - span.lo) AS span_ns,
    count(*) FILTER (WHERE inside) AS starts_in,
    count(*) FILTER (WHERE NOT inside) AS starts_out,
    round(1e6 * count(*) FILTER (WHERE inside) / any_value(span.in_ns), 4) AS rate_in_per_ms,
    round(1e6 * count(*) FILTER (WHERE NOT inside) / nullif(any_value(span.hi - span.lo - span.in_ns), 0), 4)
        AS rate_out_per_ms,
    (SELECT count(*) FROM per_window WHERE n_in * ctrl_ns < n_ctrl * dur_ns) AS windows_slower,
    (SELECT count(*) FROM per_window WHERE n_in * ctrl_ns > n_ctrl * dur_ns) AS windows_faster,
    (SELECT count(*) FROM per_window WHERE n_in = 0) AS windows_silent,
    (SELECT count(*) FROM per_window) AS windows_paired,
    (SELECT coalesce(sum(g1 - g0), 0) FROM gaps) AS gap_ns,
    (SELECT covered_ns FROM gap_cover) AS gap_in_windows_ns,
    round(any_value(span.in_ns) / any_value(span.hi - span.lo), 4) AS window_share_of_span,
    (SELECT gaps_n FROM handoff) AS idle_gaps,
    (SELECT gaps_at_edge FROM handoff) AS gaps_ending_at_window_edge,
    round((SELECT gaps_at_edge / nullif(gaps_n, 0) FROM handoff), 4) AS handoff_share,
    round(least(1.0, 4 * $handoff_ns * any_value(span.windows) / any_value(span.hi - span.lo)), 4) AS handoff_expected,
    (SELECT count(*) FROM units WHERE hits_window) AS units_in,
    (SELECT count(*) FROM units WHERE NOT hits_window) AS units_out,
    (SELECT median(dur_ns) FROM units WHERE hits_window) AS unit_p50_in_ns,
    (SELECT median(dur_ns) FROM units WHERE NOT hits_window) AS unit_p50_out_ns
FROM s, span
"""


def _poisson_cdf(k: int, mu: float) -> float:
    """P(X <= k) for X ~ Poisson(mu)."""
    if mu <= 0 or k >= mu:
        return 1.0  # not below expectation: the lower tail is at least ~1/2, report no evidence
    total, log_term = 0.0, -mu
    for i in range(k + 1):
        if i:
            log_term += math.log(mu) - math.log(i)
        total += math.exp(log_term)
    return min(1.0, total)


def _binom_upper(k: int, n: int, q: float = 0.5) -> float:
    """P(X >= k) for X ~ Binomial(n, q)."""
    if n <= 0 or k <= 0 or q >= 1:
        return 1.0
    if q <= 0:
        return 0.0
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(q) + (n - i) * math.log1p(-q)
        for i in range(k, n + 1)
    ]
    return min(1.0, sum(math.exp(x) for x in logs))


def _short(thread_name: str | None, tid) -> str:
    """`thread 4830 (kv_transfer)` -> `kv_transfer`; an unnamed thread -> `tid 4830`."""
    if not thread_name:
        return f"tid {tid}"
    m = re.fullmatch(r"thread \d+ \((.*)\)", thread_name)
    return m.group(1) if m else thread_name


def _p_text(p: float) -> str:
    return f"{p:.1e}" if p < 0.001 else f"{p:.3f}"


@rule(
    code="H002",
    name="thread-starvation",
    title="Thread starved while another thread is inside a long native op (GIL held)",
    category="host",
    requires=("python_functions",),
    params={
        "min_window_ns": Param(1_000_000, "an event must last this long to be a window", "ns"),
        "min_windows": Param(10, "a window op must occur this often on its thread", "windows"),
        "min_thread_events": Param(20, "python_function events a thread needs to be checked", "events"),
        "max_rate_ratio": Param(
            0.5, "report when the in-window rate is at most this share of the outside rate", "ratio"
        ),
        "alpha": Param(0.001, "significance level for the larger of the two p-values", "p"),
        "min_gap_ns": Param(500_000, "gaps between activity starts this long are idle gaps", "ns"),
        "handoff_ns": Param(
            100_000, "an idle gap ending this close to a window's start or end ends at a handoff", "ns"
        ),
        "min_handoff_gaps": Param(5, "idle gaps that must end at a window edge for the handoff test", "gaps"),
        "max_candidates": Param(8, "window ops tried per thread", "ops"),
        "report_clear": Param(False, "also report checked, not significant pairs as info", ""),
    },
)
def check(con, params, ctx):
    for run in ctx.runs:
        yield from _check_run(con, params, ctx, run)


def _check_run(con, params, ctx, run):
    base = {"run_id": run.run_id, "min_window_ns": params["min_window_ns"]}
    cands = con.execute(
        CANDIDATES_SQL, {**base, "min_windows": params["min_windows"], "gil_free": GIL_FREE_WAITS}
    ).fetchall()
    if not cands:
        return
    threads = con.execute(
        THREADS_SQL, {"run_id": run.run_id, "min_thread_events": params["min_thread_events"]}
    ).fetchall()
    by_thread: dict = {}
    for pid, tid, kind, op, n, total in cands:
        by_thread.setdefault((pid, tid), []).append((kind, op, n, total))
    units = dict(
        ((pid, tid), name)
        for pid, tid, name in con.execute(
            """
            SELECT pid, tid, arg_max(name, n) FROM (
                SELECT pid, tid, name, count(*) AS n FROM events
                WHERE run_id = $run_id AND kind = 'user_annotation' GROUP BY ALL HAVING count(*) >= $min_windows)
            GROUP BY ALL
            """,
            {"run_id": run.run_id, "min_windows": params["min_windows"]},
        ).fetchall()
    )
    results = []
    for (pid, a_tid), ops in by_thread.items():
        for b_pid, b_tid, _ in threads:
            if b_pid != pid or b_tid == a_tid:
                continue
            items = []
            for kind, op, n, total in ops[: params["max_candidates"]]:
                sql_params = {
                    **base,
                    "pid": pid,
                    "window_tid": a_tid,
                    "window_kind": kind,
                    "window_op": op,
                    "thread_tid": b_tid,
                    "min_gap_ns": params["min_gap_ns"],
                    "handoff_ns": params["handoff_ns"],
                    "unit_name": units.get((pid, b_tid)),
                }
                cur = con.execute(STATS_SQL, sql_params)
                row = dict(zip([d[0] for d in cur.description], cur.fetchone()))
                if not row["windows"] or row["windows"] < params["min_windows"]:
                    continue
                stats = _significance(row, params)
                ratio = row["rate_ratio"]
                if stats["rate_significant"]:
                    strength = round(ratio, 1)
                elif stats["handoff_significant"]:
                    strength = 1 + round(1 - row["handoff_share"], 1)
                else:
                    strength = 2.0  # nothing significant: report (with report_clear) the preferred kind
                key = (strength, KIND_PREFERENCE[kind], -row["window_total_ns"], op)
                items.append((key, stats, kind, op, row, sql_params))
            if items:
                results.append((pid, a_tid, b_tid, _pick(items)))
    significant_pairs = {(pid, a, b): best[0][0] for pid, a, b, best in results if best[1]["significant"]}
    for pid, a_tid, b_tid, best in results:
        key, stats, kind, op, row, sql_params = best
        reverse = significant_pairs.get((pid, b_tid, a_tid))
        if stats["significant"] and reverse is not None and (reverse, b_tid) < (key[0], a_tid):
            continue  # the other direction is the stronger one: B starves A, not A starves B
        if not stats["significant"] and not params["report_clear"]:
            continue
        yield _finding(con, params, ctx, run, pid, a_tid, b_tid, kind, op, row, sql_params, stats)


def _pick(items: list) -> tuple:
    """The strongest window op for a pair; a Python builtin loses to a significant annotation or op around
    it (about as many windows, at most 1.5x its time): the name the user wrote is the one to report."""
    best = min(items, key=lambda item: item[0])
    _, stats, kind, _, row, _ = best
    if kind == "python_function" and stats["significant"]:
        outer = [
            item
            for item in items
            if item[2] != "python_function"
            and item[1]["significant"]
            and abs(item[4]["windows"] - row["windows"]) <= 0.1 * row["windows"]
            and row["window_total_ns"] <= item[4]["window_total_ns"] <= 1.5 * row["window_total_ns"]
        ]
        if outer:
            return min(outer, key=lambda item: item[0])
    return best


def _significance(row: dict, params: dict) -> dict:
    """p-values of the three tests on one pair's numbers, and which of them is significant."""
    ratio = row["rate_ratio"]
    p_poisson = p_sign = 1.0
    if row["rate_out_per_ms"]:
        expected_in = row["rate_out_per_ms"] * row["window_total_ns"] / 1e6
        p_poisson = _poisson_cdf(int(row["starts_in"]), expected_in)
    p_sign = _binom_upper(int(row["windows_slower"]), int(row["windows_slower"] + row["windows_faster"]))
    p_rate = max(p_poisson, p_sign)
    rate_significant = ratio is not None and ratio <= params["max_rate_ratio"] and p_rate < params["alpha"]
    p_handoff = _binom_upper(
        int(row["gaps_ending_at_window_edge"] or 0), int(row["idle_gaps"] or 0), row["handoff_expected"] or 1.0
    )
    handoff_significant = (
        not rate_significant
        and (row["gaps_ending_at_window_edge"] or 0) >= params["min_handoff_gaps"]
        and (row["handoff_share"] or 0) >= 0.5
        and p_handoff < params["alpha"]
    )
    return {
        "p_value": p_rate if rate_significant or not handoff_significant else p_handoff,
        "p_sign_test": p_sign,
        "p_poisson": p_poisson,
        "p_handoff": p_handoff,
        "rate_significant": rate_significant,
        "handoff_significant": handoff_significant,
        "significant": rate_significant or handoff_significant,
        "observed_column": "handoff_share" if handoff_significant or ratio is None else "rate_ratio",
    }


def _finding(con, params, ctx, run, pid, a_tid, b_tid, kind, op, row, sql_params, stats):
    window = run.window_ns
    a_name = ctx.thread_name(run.run_id, pid, a_tid)
    b_name = ctx.thread_name(run.run_id, pid, b_tid)
    a_short, b_short = _short(a_name, a_tid), _short(b_name, b_tid)
    if a_short == b_short:  # two threads both called `python3`: tell them apart by tid
        a_short, b_short = f"{a_short} (tid {a_tid})", f"{b_short} (tid {b_tid})"
    samples = [
        r[0]
        for r in con.execute(
            f"""
            SELECT event_id FROM events
            WHERE run_id = $run_id AND pid = $pid AND tid = $tid AND kind = $kind AND {ADDRESS_SQL} = $op
              AND dur_ns >= $min_window_ns AND ts_ns >= $lo AND end_ns <= $hi
            ORDER BY dur_ns DESC, event_id LIMIT 5
            """,
            {
                "run_id": run.run_id,
                "pid": pid,
                "tid": a_tid,
                "kind": kind,
                "op": op,
                "min_window_ns": params["min_window_ns"],
                "lo": row["first_ns"],
                "hi": row["last_ns"],
            },
        ).fetchall()
    ]
    # the native call inside the window: the longest Python builtin frame under it on thread A
    inner = None
    if samples:
        hit = con.execute(
            f"""
            SELECT {ADDRESS_SQL} FROM python_functions f, (SELECT ts_ns, end_ns, dur_ns FROM events WHERE event_id = $id) w
            WHERE f.run_id = $run_id AND f.pid = $pid AND f.tid = $tid
              AND f.ts_ns >= w.ts_ns AND f.end_ns <= w.end_ns AND f.dur_ns >= w.dur_ns / 2
            ORDER BY f.dur_ns ASC LIMIT 1
            """,
            {"id": samples[0], "run_id": run.run_id, "pid": pid, "tid": a_tid},
        ).fetchone()
        inner = hit[0] if hit and hit[0] != op else None
    path = ctx.code_path(samples[0]) if samples else []
    ratio = row["rate_ratio"]
    significant, p = stats["significant"], stats["p_value"]
    column = stats["observed_column"]
    in_ns = int(row["window_total_ns"])
    if stats["handoff_significant"] or ratio is None:
        lost = int(row["gap_in_windows_ns"] or 0)  # B's idle time inside the windows
    else:
        lost = int(max(0.0, in_ns * (1 - ratio)))
    share = lost / window if window else 0.0
    severity = "info"
    if significant:
        strong = (ratio is not None and ratio <= 0.2) or stats["handoff_significant"]
        severity = "critical" if strong and share >= 0.1 else "warning"
    gap_share = row["gap_in_windows_ns"] / row["gap_ns"] if row["gap_ns"] else None
    unit_name = sql_params["unit_name"]
    unit_text = ""
    if unit_name and row["units_in"] and row["units_out"]:
        unit_text = (
            f"; its `{unit_name}` units overlapping a window take {row['unit_p50_in_ns'] / 1e6:.2f} ms (median, "
            f"{row['units_in']}) vs {row['unit_p50_out_ns'] / 1e6:.2f} ms for the others ({row['units_out']})"
        )
    gap_text = (
        f"; {gap_share:.0%} of its idle-gap time (gaps >= {params['min_gap_ns'] / 1e3:.0f} us) falls in the windows, "
        f"which cover {row['window_share_of_span']:.0%} of the span; {row['gaps_ending_at_window_edge']} of its "
        f"{row['idle_gaps']} idle gaps end within {params['handoff_ns'] / 1e3:.0f} us of a window's start or end "
        f"(expected share {row['handoff_expected']:.0%})"
        if gap_share is not None
        else ""
    )
    native = f" ({inner})" if inner else ""
    rate_text = (
        f"its activity rate inside {row['windows']} `{op}` windows on thread {a_short} ({in_ns / 1e6:.1f} ms) vs "
        f"outside them: {row['rate_in_per_ms']:.3f} vs {row['rate_out_per_ms'] or 0:.3f} events/ms "
        f"({row['starts_in']} vs {row['starts_out']} starts); {row['windows_slower']} of {row['windows_paired']} "
        f"windows slower than the stretch before them, {row['windows_silent']} silent"
    )
    if column == "rate_ratio":
        what = f"thread {b_short}: in-window / out-of-window activity rate; {rate_text}{gap_text}{unit_text}; p = {_p_text(p)}"
        value, expected = (
            ratio,
            Quantity(1.0, "ratio", "a thread sharing no lock with the op runs as often inside its windows as outside"),
        )
    else:
        what = (
            f"thread {b_short}: share of its idle gaps that end at a window's start or end (it runs again only when "
            f"thread {a_short} enters or leaves `{op}` and lets the GIL go); {rate_text}{gap_text}{unit_text}; p = {_p_text(p)}"
        )
        value = row["handoff_share"]
        expected = Quantity(
            row["handoff_expected"], "ratio", "the share of the span within handoff_ns of a window's start or end"
        )
    shown = f"{value:.2f}" if value is not None else "n/a"
    if significant and column == "rate_ratio":
        title = (
            f"Thread {b_short} starved inside {row['windows']} `{op}` windows on thread {a_short}: "
            f"{shown}x its outside activity rate (p = {_p_text(p)})"
        )
    elif significant:
        title = (
            f"Thread {b_short} resumes only at the edges of `{op}` windows on thread {a_short}: "
            f"{row['gaps_ending_at_window_edge']} of {row['idle_gaps']} idle gaps end there (p = {_p_text(p)})"
        )
    else:
        title = (
            f"Thread {b_short} not starved by `{op}` on thread {a_short}: {column} {shown} "
            f"(not significant, p = {_p_text(p)})"
        )
    tolerance = 0.8
    return Finding(
        rule="H002",
        severity=severity,
        confidence=(0.8 if kind != "python_function" or inner is None else 0.7) if significant else 0.3,
        title=title,
        locality={
            **run.locality(),
            "pid": pid,
            "tid": b_tid,
            "thread_name": b_name or f"tid {b_tid}",
            "op": op,
            "code_path": path or None,
            "window_ns": [int(row["first_ns"]), int(row["last_ns"])],
        },
        observed=Quantity(value, "ratio", what),
        expected=expected,
        impact_ns=lost if significant else 0,
        window_ns=window,
        sql=STATS_SQL,
        sql_params=sql_params,
        sample_event_ids=samples,
        hypothesis=(
            f"`{op}`{native} on thread {a_short} holds the Python GIL while it waits, so thread {b_short} "
            f"(and every other Python thread of pid {pid}) cannot run until it returns."
            if significant
            else f"No evidence that `{op}` on thread {a_short} blocks thread {b_short}."
        ),
        next_experiment=(
            f"Sample the GIL holder during the windows (`py-spy dump --native --pid {pid}` or "
            "`py-spy record --gil --native`, or py_gil_spy): if thread "
            f"{a_short} holds the GIL inside `{op}`, release it around the native wait "
            "(`py::gil_scoped_release` in the binding, `Py_BEGIN_ALLOW_THREADS` in C, `ctypes.CDLL` not `PyDLL`) "
            "and re-profile with with_stack=True and profile_all_threads=True."
        ),
        acceptance=(
            f"Re-run the evidence SQL on the new trace: rate_ratio for thread {b_short} is at least {tolerance} "
            f"(its in-window rate within {1 - tolerance:.0%} of its outside rate), windows_slower is about half "
            "of windows_paired and handoff_share is near handoff_expected; this rule then reports nothing for the pair."
        ),
        caveats=[
            *(
                [
                    f"Carried by the handoff test alone ({row['gaps_ending_at_window_edge']} of {row['idle_gaps']} "
                    "idle gaps): the thread is starved outside the windows too, so the op is one of the GIL holders, "
                    "not necessarily the only one."
                ]
                if stats["handoff_significant"]
                else []
            ),
            "A correlation: another shared lock (allocator, I/O, a mutex in the extension) starves a thread the "
            "same way; the GIL sampler in next_experiment tells them apart.",
            "The Poisson p-value treats activity starts as independent (nested frames of one unit cluster); "
            "the per-window sign test does not, and the reported p is the larger of the two.",
        ],
        extra={
            "window_thread": {"tid": a_tid, "name": a_name},
            "starved_thread": {"tid": b_tid, "name": b_name},
            "window_kind": kind,
            "native_call": inner,
            **stats,
            **{k: (float(v) if isinstance(v, float) else v) for k, v in row.items() if k != column},
        },
    )
