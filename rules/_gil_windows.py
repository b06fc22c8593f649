"""Native calls on one thread that keep the GIL, and another thread's activity around them, with the
tests that tell a starved thread from an independent one (what H002 thread-starvation measures).

A window is a native call in which its thread runs no Python: a C-function frame (`<built-in ...>`,
a pybind11 method) with no Python frame of its own below it. Python frames are never windows: two
threads that both run Python share the GIL by design. Calls that are mostly one op's
own work (`relu` around `aten::relu`) and the profiler's own bookkeeping are not windows either. A
window is named after the innermost `record_function` annotation or op around it that holds no other
call of the same function (`deepep_like::intranode_dispatch`), else after the frame itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tracekit.engine.toolkit import one, rows

# Starts of these events are a thread's activity: Python frames, annotations, ops and CUDA calls.
ACTIVITY_KINDS = ("python_function", "user_annotation", "cpu_op", "cuda_runtime", "cuda_driver")
# waits that release the GIL by design: a thread blocked in them starves nobody
GIL_FREE_WAITS = r"^<built-in (function|method) (sleep|wait|acquire|join|select|poll|epoll|recv|recv_into|accept|get)\b"
ADDRESS = " at 0x[0-9a-f]+"

# The native calls of thread $window_tid lasting at least $min_window_ns, each with the op it is named after.
WINDOWS_CTE = f"""
frames AS (
    SELECT event_id, parent_id, name, ts_ns, end_ns, dur_ns FROM python_functions
    WHERE run_id = $run_id AND pid = $pid AND tid = $window_tid
), leaf AS (
    SELECT f.event_id, f.ts_ns, f.end_ns, f.dur_ns, regexp_replace(f.name, '{ADDRESS}', '') AS native
    FROM frames f
    WHERE f.dur_ns >= $min_window_ns AND starts_with(f.name, '<built-in') AND NOT regexp_matches(f.name, $gil_free)
      AND NOT EXISTS (SELECT 1 FROM frames c WHERE c.parent_id = f.event_id)
), ops AS (
    SELECT event_id, name, ts_ns, end_ns, dur_ns FROM events
    WHERE run_id = $run_id AND pid = $pid AND tid = $window_tid AND kind IN ('user_annotation', 'cpu_op')
      AND NOT starts_with(name, 'ProfilerStep#')
), op_work AS (  -- calls that are mostly one op's own work (`relu` around aten::relu), not a wait
    SELECT DISTINCT leaf.event_id FROM leaf JOIN ops
      ON ops.ts_ns >= leaf.ts_ns AND ops.end_ns <= leaf.end_ns AND 2 * ops.dur_ns >= leaf.dur_ns
), profiler_own AS (  -- the profiler's bookkeeping inside record_function's enter and exit
    SELECT DISTINCT leaf.event_id FROM leaf JOIN frames f
      ON f.ts_ns <= leaf.ts_ns AND f.end_ns >= leaf.end_ns AND starts_with(f.name, 'torch/autograd/profiler.py(')
), waits AS (
    SELECT * FROM leaf
    WHERE event_id NOT IN (SELECT event_id FROM op_work) AND event_id NOT IN (SELECT event_id FROM profiler_own)
), around AS (  -- the innermost annotation or op that encloses each call
    SELECT waits.event_id, arg_min(ops.event_id, ops.dur_ns) AS op_id, arg_min(ops.name, ops.dur_ns) AS op
    FROM waits JOIN ops ON ops.ts_ns <= waits.ts_ns AND ops.end_ns >= waits.end_ns GROUP BY waits.event_id
), named_calls AS (  -- named after it when it holds no other call of that native function
    SELECT waits.*,
           coalesce(CASE WHEN count(*) OVER (PARTITION BY around.op_id, waits.native) = 1 THEN around.op END,
                    waits.native) AS op
    FROM waits LEFT JOIN around USING (event_id)
), bounds AS (  -- every start and end of the thread's activity: a thread running bytecode makes calls
    SELECT ts_ns AS t FROM events
    WHERE run_id = $run_id AND pid = $pid AND tid = $window_tid AND kind IN {ACTIVITY_KINDS}
    UNION ALL
    SELECT end_ns FROM events
    WHERE run_id = $run_id AND pid = $pid AND tid = $window_tid AND kind IN {ACTIVITY_KINDS}
), gaps AS (SELECT t AS lo, lead(t) OVER (ORDER BY t) AS hi FROM bounds),
typical_gap AS (SELECT median(hi - lo) AS ns FROM gaps WHERE hi > lo),
silences AS (  -- stretches with no call far longer than the thread's own typical gap: native code
    SELECT lo, hi FROM gaps, typical_gap WHERE hi - lo >= $silence_factor * typical_gap.ns
), silence_in AS (  -- the innermost annotation or op around each silence
    SELECT s.lo, s.hi, arg_min(ops.event_id, ops.dur_ns) AS op_id, arg_min(ops.name, ops.dur_ns) AS op
    FROM silences s JOIN ops ON ops.ts_ns <= s.lo AND ops.end_ns >= s.hi GROUP BY s.lo, s.hi
), silence_frame AS (  -- and the innermost Python frame around it
    SELECT s.lo, s.hi, arg_min(f.event_id, f.dur_ns) AS frame_id, arg_min(f.name, f.dur_ns) AS frame
    FROM silence_in s JOIN frames f ON f.ts_ns <= s.lo AND f.end_ns >= s.hi GROUP BY s.lo, s.hi
), silent_calls AS (  -- a call that leaves no frame (ctypes) between two calls of a Python frame, one per op:
    -- silence in a frame that calls nothing is its own bytecode, and a C-function frame is a window above
    SELECT arg_max(s.op_id, s.hi - s.lo) AS event_id, arg_max(s.lo, s.hi - s.lo) AS ts_ns,
           arg_max(s.hi, s.hi - s.lo) AS end_ns, max(s.hi - s.lo) AS dur_ns,
           'native call with no frame in ' || regexp_replace(arg_max(sf.frame, s.hi - s.lo), '{ADDRESS}', '')
               AS native, s.op
    FROM silence_in s JOIN silence_frame sf USING (lo, hi)
    WHERE NOT starts_with(sf.frame, '<built-in')
      AND EXISTS (SELECT 1 FROM frames c WHERE c.parent_id = sf.frame_id)
      AND NOT EXISTS (SELECT 1 FROM named_calls n JOIN ops o ON o.event_id = s.op_id
                      WHERE n.ts_ns >= o.ts_ns AND n.end_ns <= o.end_ns)
    GROUP BY s.op_id, s.op
), named AS (
    SELECT event_id, ts_ns, end_ns, dur_ns, native, op FROM named_calls
    UNION ALL SELECT event_id, ts_ns, end_ns, dur_ns, native, op FROM silent_calls
)"""

# the parameters WINDOWS_CTE reads
WINDOW_KEYS = ("run_id", "pid", "window_tid", "min_window_ns", "gil_free", "silence_factor")

# Window ops per (thread A, thread B) pair, most window time first. $min_window_ns is B's own scale.
CANDIDATES_SQL = f"""
WITH {WINDOWS_CTE}
SELECT op, native, count(*) AS n, sum(dur_ns) AS total_ns FROM named
GROUP BY op, native HAVING count(*) >= $min_windows ORDER BY total_ns DESC, op
"""

# Threads with Python activity, with their activity starts and active span (their own event rate).
THREADS_SQL = f"""
SELECT run_id, pid, tid, count(*) FILTER (WHERE kind = 'python_function') AS python_events, count(*) AS starts,
       max(ts_ns) - min(ts_ns) AS active_ns
FROM events
WHERE list_contains($run_ids, run_id) AND kind IN {ACTIVITY_KINDS} AND pid IS NOT NULL AND tid IS NOT NULL
GROUP BY ALL HAVING count(*) FILTER (WHERE kind = 'python_function') >= $min_thread_events ORDER BY run_id, pid, tid
"""

# The evidence query: one row of numbers for the windows of ops $window_ops on thread A against thread B.
STATS_SQL = f"""
WITH {WINDOWS_CTE},
act AS (
    SELECT event_id, ts_ns FROM events
    WHERE run_id = $run_id AND pid = $pid AND tid = $thread_tid AND kind IN {ACTIVITY_KINDS}
), active AS (SELECT min(ts_ns) AS lo, max(ts_ns) AS hi FROM act),
w AS (  -- the windows inside the starved thread's active span, with the window time up to each one's end
    SELECT named.event_id, ts_ns, end_ns, dur_ns, sum(dur_ns) OVER (ORDER BY ts_ns) AS cum_ns
    FROM named, active
    WHERE list_contains($window_ops, [op, native]) AND ts_ns >= active.lo AND end_ns <= active.hi
), span AS (SELECT min(ts_ns) AS lo, max(end_ns) AS hi, count(*) AS windows, sum(dur_ns) AS in_ns FROM w),
s AS (  -- each activity start with the window at or before it; outside starts get a clock with windows cut out
    SELECT a.ts_ns, a.event_id, prv.event_id AS prv_id, coalesce(a.ts_ns < prv.end_ns, false) AS inside,
           a.ts_ns - coalesce(prv.cum_ns, 0) AS outside_clock_ns
    FROM (SELECT act.* FROM act, span WHERE act.ts_ns >= span.lo AND act.ts_ns < span.hi) a
    ASOF LEFT JOIN w prv ON a.ts_ns >= prv.ts_ns
), outside_gaps AS (  -- gaps between the thread's starts outside the windows, on that clock
    SELECT lead(outside_clock_ns) OVER (ORDER BY ts_ns, event_id) - outside_clock_ns AS gap_ns
    FROM s WHERE NOT inside
), silent_chance AS (  -- per window: the chance that as long a stretch outside holds no start
    SELECT w.event_id,
           (SELECT coalesce(sum(gap_ns - w.dur_ns), 0) FROM outside_gaps WHERE gap_ns > w.dur_ns)
           / nullif((SELECT sum(gap_ns) FROM outside_gaps), 0) AS p_silent
    FROM w
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
    any_value(span.windows) - count(DISTINCT prv_id) FILTER (WHERE inside) AS windows_silent,
    round((SELECT sum(p_silent) FROM silent_chance), 2) AS windows_silent_expected,
    round(any_value(span.in_ns) / any_value(span.hi - span.lo), 4) AS window_share_of_span,
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

# The longest windows inside the measured span: the native calls themselves.
SAMPLES_SQL = f"""
WITH {WINDOWS_CTE}
SELECT event_id FROM named
WHERE list_contains($window_ops, [op, native]) AND ts_ns >= $lo AND end_ns <= $hi
ORDER BY dur_ns DESC, event_id LIMIT 5
"""


# A thread's entry point: its longest Python frame outside the threading module (`transfer_worker`).
ENTRY_SQL = f"""
SELECT regexp_replace(name, '{ADDRESS}', '') AS name FROM python_functions
WHERE run_id = $run_id AND pid = $pid AND tid = $tid AND NOT starts_with(name, 'threading.py(')
  AND NOT starts_with(name, '<built-in')
ORDER BY dur_ns DESC, event_id LIMIT 1
"""


def entry_frame(con, run_id: int, pid: int, tid: int) -> str | None:
    found = one(con, ENTRY_SQL, {"run_id": run_id, "pid": pid, "tid": tid})
    return found.name if found else None


def threads(con, run_ids: list[int], params) -> dict[int, list]:
    """The Python threads of each run worth testing, in one statement for every run."""
    out: dict[int, list] = {}
    for t in rows(con, THREADS_SQL, {"run_ids": run_ids, "min_thread_events": params["min_thread_events"]}):
        out.setdefault(t.run_id, []).append(t)
    return out


def units(con, run_id: int, params) -> dict[tuple, str]:
    found = rows(con, UNITS_SQL, {"run_id": run_id, "min_windows": params["min_windows"]})
    return {(u.pid, u.tid): u.unit for u in found}


def min_window_ns(starved, params) -> int:
    """The shortest call worth testing: one the starved thread would start `min_expected_starts` events
    in at its own mean rate (shorter ones cannot show it missing)."""
    mean_interval_ns = starved.active_ns / max(1, starved.starts - 1)
    return max(1, int(params["min_expected_starts"] * mean_interval_ns))


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
    """p-values of the two tests over all windows together, and whether the pair is significant.

    Poisson: the starved thread's starts inside the windows against its outside rate (optimistic: the
    frames of one unit of work cluster). Silent windows: how many windows hold none of its starts,
    against the chance that an outside stretch as long holds none (binomial at the mean chance; the
    windows' chances differ, which only narrows the true spread); clusters count once here. The pair
    is judged on the larger p-value."""
    p_poisson = p_silent = 1.0
    if row.rate_out_per_ms:
        p_poisson = poisson_cdf(int(row.starts_in), row.rate_out_per_ms * row.window_total_ns / 1e6)
    if row.windows and row.windows_silent_expected is not None:
        p_silent = binom_upper(int(row.windows_silent), int(row.windows), row.windows_silent_expected / row.windows)
    p_value = max(p_poisson, p_silent)
    ratio = row.rate_ratio
    return {
        "p_value": p_value,
        "p_poisson": p_poisson,
        "p_silent_windows": p_silent,
        "significant": ratio is not None and ratio <= params["max_rate_ratio"] and p_value < params["alpha"],
    }


@dataclass
class Pair:
    """The windows of some ops on thread A measured against thread B."""

    pid: int
    window_tid: int
    starved_tid: int
    ops: list[str]
    natives: list[str]
    row: object
    stats: dict
    sql_params: dict

    @property
    def strength(self) -> float:
        """Smaller is stronger: the in-window rate ratio."""
        return self.row.rate_ratio if self.row.rate_ratio is not None else 1.0


def pairs(con, run_id: int, params, checked: list) -> list[Pair]:
    """For every ordered pair of the run's Python threads `checked` (`threads`) of one process: the
    window ops of A that starve B, measured together (or, when none does, the op with the most window
    time, not significant)."""
    pids = [t.pid for t in checked]
    if len(set(pids)) == len(pids):  # no process with two threads: no pair, nothing more to read
        return []
    unit_names = units(con, run_id, params)
    found = []
    for a in checked:
        for b in checked:
            if b.pid != a.pid or b.tid == a.tid:
                continue
            pair = _pair(con, run_id, params, a, b, unit_names.get((b.pid, b.tid)))
            if pair is not None:
                found.append(pair)
    return found


def _pair(con, run_id, params, a, b, unit_name) -> Pair | None:
    base = {
        "run_id": run_id,
        "pid": a.pid,
        "window_tid": a.tid,
        "thread_tid": b.tid,
        "min_window_ns": min_window_ns(b, params),
        "gil_free": GIL_FREE_WAITS,
        "silence_factor": params["silence_factor"],
        "unit_name": unit_name,
    }
    ops = rows(con, CANDIDATES_SQL, {k: base[k] for k in WINDOW_KEYS} | {"min_windows": params["min_windows"]})
    tested = []
    for c in ops[: params["max_candidates"]]:
        sql_params = {**base, "window_ops": [[c.op, c.native]]}
        row = one(con, STATS_SQL, sql_params)
        if row is None or not row.windows or row.windows < params["min_windows"]:
            continue
        tested.append((c, row, significance(row, params), sql_params))
    if not tested:
        return None
    starving = [t for t in tested if t[2]["significant"]]
    if len(starving) <= 1:
        c, row, stats, sql_params = starving[0] if starving else tested[0]
        return Pair(a.pid, a.tid, b.tid, [c.op], [c.native], row, stats, sql_params)
    # every op that starves the thread, measured together: one finding for dispatch and combine
    sql_params = {**base, "window_ops": sorted([t[0].op, t[0].native] for t in starving)}
    row = one(con, STATS_SQL, sql_params)
    ops = sorted({t[0].op for t in starving})
    natives = sorted({t[0].native for t in starving})
    return Pair(a.pid, a.tid, b.tid, ops, natives, row, significance(row, params), sql_params)


def window_samples(con, pair: Pair) -> list[int]:
    params = {k: pair.sql_params[k] for k in (*WINDOW_KEYS, "window_ops")}
    found = rows(con, SAMPLES_SQL, params | {"lo": pair.row.first_ns, "hi": pair.row.last_ns})
    return [s.event_id for s in found]
