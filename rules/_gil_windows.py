"""Windows of a long native op on one thread and another thread's activity around them, with the
tests that tell a starved thread from an independent one (what H002 thread-starvation measures)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tracekit.engine.toolkit import one, rows

# Window kinds in the order their names are reported: what the user wrote before the builtin inside it.
KIND_PREFERENCE = {"user_annotation": 0, "cpu_op": 1, "python_function": 2}

# Starts of these events are a thread's activity: Python frames, annotations, ops and CUDA calls.
ACTIVITY_KINDS = ("python_function", "user_annotation", "cpu_op", "cuda_runtime", "cuda_driver")
WINDOW_KINDS = ("user_annotation", "cpu_op", "python_function")
# waits that release the GIL by design: a thread blocked in them starves nobody
GIL_FREE_WAITS = (
    r"^<built-in (function|method) (sleep|wait|acquire|join|select|poll|epoll|recv|recv_into|accept|get)\b"
    r"|^(threading|queue|selectors|socket|asyncio/.*|concurrent/.*|multiprocessing/.*)\.py\("
)
ADDRESS_SQL = "regexp_replace(name, ' at 0x[0-9a-f]+', '')"

CANDIDATES_SQL = f"""
SELECT pid, tid, kind, {ADDRESS_SQL} AS op, count(*) AS n, sum(dur_ns) AS total_ns
FROM events
WHERE run_id = $run_id AND kind IN {WINDOW_KINDS}
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
      AND kind IN {ACTIVITY_KINDS}
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

# The starved thread's unit of work: its most frequent record_function name (e.g. kv_transfer_chunk).
UNITS_SQL = """
SELECT pid, tid, arg_max(name, n) AS unit FROM (
    SELECT pid, tid, name, count(*) AS n FROM events
    WHERE run_id = $run_id AND kind = 'user_annotation' GROUP BY ALL HAVING count(*) >= $min_windows)
GROUP BY ALL
"""

# The longest windows of the op on its thread inside the measured span.
SAMPLES_SQL = f"""
SELECT event_id FROM events
WHERE run_id = $run_id AND pid = $pid AND tid = $tid AND kind = $kind AND {ADDRESS_SQL} = $op
  AND dur_ns >= $min_window_ns AND ts_ns >= $lo AND end_ns <= $hi
ORDER BY dur_ns DESC, event_id LIMIT 5
"""

# The native call inside a window: the shortest Python frame under it that covers half of it.
NATIVE_SQL = f"""
SELECT {ADDRESS_SQL} AS name
FROM python_functions f, (SELECT ts_ns, end_ns, dur_ns FROM events WHERE event_id = $id) w
WHERE f.run_id = $run_id AND f.pid = $pid AND f.tid = $tid
  AND f.ts_ns >= w.ts_ns AND f.end_ns <= w.end_ns AND f.dur_ns >= w.dur_ns / 2
ORDER BY f.dur_ns ASC LIMIT 1
"""


def candidates(con, run_id: int, params) -> dict[tuple, list]:
    """Window ops per (pid, tid), longest in total first."""
    found = rows(
        con,
        CANDIDATES_SQL,
        {"run_id": run_id, "min_window_ns": params["min_window_ns"], "min_windows": params["min_windows"],
         "gil_free": GIL_FREE_WAITS},
    )  # fmt: skip
    by_thread: dict[tuple, list] = {}
    for c in found:
        by_thread.setdefault((c.pid, c.tid), []).append(c)
    return by_thread


def threads(con, run_id: int, params) -> list:
    return rows(con, THREADS_SQL, {"run_id": run_id, "min_thread_events": params["min_thread_events"]})


def units(con, run_id: int, params) -> dict[tuple, str]:
    found = rows(con, UNITS_SQL, {"run_id": run_id, "min_windows": params["min_windows"]})
    return {(u.pid, u.tid): u.unit for u in found}


def stats(con, sql_params: dict):
    """The evidence row of one (window op, starved thread) pair."""
    return one(con, STATS_SQL, sql_params)


def window_samples(con, run_id, pid, tid, kind, op, params, lo, hi) -> list[int]:
    found = rows(
        con,
        SAMPLES_SQL,
        {"run_id": run_id, "pid": pid, "tid": tid, "kind": kind, "op": op,
         "min_window_ns": params["min_window_ns"], "lo": lo, "hi": hi},
    )  # fmt: skip
    return [s.event_id for s in found]


def native_call(con, run_id, pid, tid, window_event_id, op) -> str | None:
    hit = one(con, NATIVE_SQL, {"id": window_event_id, "run_id": run_id, "pid": pid, "tid": tid})
    return hit.name if hit and hit.name != op else None


def poisson_cdf(k: int, mu: float) -> float:
    """P(X <= k) for X ~ Poisson(mu)."""
    if mu <= 0 or k >= mu:
        return 1.0  # not below expectation: the lower tail is at least ~1/2, report no evidence
    total, log_term = 0.0, -mu
    for i in range(k + 1):
        if i:
            log_term += math.log(mu) - math.log(i)
        total += math.exp(log_term)
    return min(1.0, total)


def binom_upper(k: int, n: int, q: float = 0.5) -> float:
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


def significance(row, params: dict) -> dict:
    """p-values of the three tests on one pair's numbers, and which of them is significant."""
    ratio = row.rate_ratio
    p_poisson = p_sign = 1.0
    if row.rate_out_per_ms:
        expected_in = row.rate_out_per_ms * row.window_total_ns / 1e6
        p_poisson = poisson_cdf(int(row.starts_in), expected_in)
    p_sign = binom_upper(int(row.windows_slower), int(row.windows_slower + row.windows_faster))
    p_rate = max(p_poisson, p_sign)
    rate_significant = ratio is not None and ratio <= params["max_rate_ratio"] and p_rate < params["alpha"]
    p_handoff = binom_upper(
        int(row.gaps_ending_at_window_edge or 0), int(row.idle_gaps or 0), row.handoff_expected or 1.0
    )
    handoff_significant = (
        not rate_significant
        and (row.gaps_ending_at_window_edge or 0) >= params["min_handoff_gaps"]
        and (row.handoff_share or 0) >= 0.5
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


@dataclass
class Candidate:
    """One window op on thread A measured against thread B."""

    key: tuple  # (strength, kind preference, -window time, op): smaller is stronger
    stats: dict
    kind: str
    op: str
    row: object
    sql_params: dict


def strongest_pairs(con, run_id: int, params, by_thread) -> list[tuple]:
    """(pid, thread A, thread B, strongest candidate) for every pair of threads of one process."""
    unit_names = units(con, run_id, params)
    checked = threads(con, run_id, params)
    pairs = []
    for (pid, a_tid), ops in by_thread.items():
        for b in checked:
            if b.pid != pid or b.tid == a_tid:
                continue
            measured = [
                _candidate(con, run_id, params, pid, a_tid, b.tid, c, unit_names)
                for c in ops[: params["max_candidates"]]
            ]
            measured = [m for m in measured if m is not None]
            if measured:
                pairs.append((pid, a_tid, b.tid, _pick(measured)))
    return pairs


def _candidate(con, run_id, params, pid, a_tid, b_tid, c, unit_names) -> Candidate | None:
    sql_params = {
        "run_id": run_id,
        "min_window_ns": params["min_window_ns"],
        "pid": pid,
        "window_tid": a_tid,
        "window_kind": c.kind,
        "window_op": c.op,
        "thread_tid": b_tid,
        "min_gap_ns": params["min_gap_ns"],
        "handoff_ns": params["handoff_ns"],
        "unit_name": unit_names.get((pid, b_tid)),
    }
    row = stats(con, sql_params)
    if not row.windows or row.windows < params["min_windows"]:
        return None
    tests = significance(row, params)
    if tests["rate_significant"]:
        strength = round(row.rate_ratio, 1)
    elif tests["handoff_significant"]:
        strength = 1 + round(1 - row.handoff_share, 1)
    else:
        strength = 2.0  # nothing significant: report (with report_clear) the preferred kind
    key = (strength, KIND_PREFERENCE[c.kind], -row.window_total_ns, c.op)
    return Candidate(key, tests, c.kind, c.op, row, sql_params)


def _pick(items: list[Candidate]) -> Candidate:
    """The strongest window op for a pair; a Python builtin loses to a significant annotation or op around
    it (about as many windows, at most 1.5x its time): the name the user wrote is the one to report."""
    best = min(items, key=lambda c: c.key)
    if best.kind == "python_function" and best.stats["significant"]:
        windows, total = best.row.windows, best.row.window_total_ns
        outer = [
            c
            for c in items
            if c.kind != "python_function"
            and c.stats["significant"]
            and abs(c.row.windows - windows) <= 0.1 * windows
            and total <= c.row.window_total_ns <= 1.5 * total
        ]
        if outer:
            return min(outer, key=lambda c: c.key)
    return best
