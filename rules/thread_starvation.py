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
- `critical_share` (0.1): a significant pair is critical when the starved thread's lost time is at
  least this share of the run window and the effect is strong (see `critical_rate_ratio`); else a
  warning.
- `critical_rate_ratio` (0.2): the in-window rate ratio at or below which the effect is strong (a
  pair carried by the handoff test is strong too).
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun, thread_label
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _gil_windows
from tracekit.units import duration

# the in/out rate ratio a fix must reach: the in-window rate within 20% of the outside rate
ACCEPTED_RATIO = 0.8


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
        "critical_share": Param(
            0.1, "severity critical from this lost share of the run window (strong effect)", "ratio"
        ),
        "critical_rate_ratio": Param(0.2, "in-window rate ratio at or below which the effect is strong", "ratio"),
    },
    example=Example(("gil_hold.json.gz",)),
)
def check(con, params, ctx):
    for run in ctx.runs:
        by_thread = _gil_windows.candidates(con, run.run_id, params)
        if not by_thread:
            continue
        pairs = _gil_windows.strongest_pairs(con, run.run_id, params, by_thread)
        significant = {(pid, a, b): best.key[0] for pid, a, b, best in pairs if best.stats["significant"]}
        for pid, a_tid, b_tid, best in pairs:
            reverse = significant.get((pid, b_tid, a_tid))
            if best.stats["significant"] and reverse is not None and (reverse, b_tid) < (best.key[0], a_tid):
                continue  # the other direction is the stronger one: B starves A, not A starves B
            if best.stats["significant"] or params["report_clear"]:
                yield _finding(con, params, ctx, run, pid, a_tid, b_tid, best)


def _p_text(p: float) -> str:
    return f"{p:.1e}" if p < 0.001 else f"{p:.3f}"


def _lost_ns(best: _gil_windows.Candidate) -> int:
    """The starved thread's time lost to the windows: its idle time inside them when the handoff test
    carries the pair, else the windows' time scaled by how much slower it ran there."""
    row = best.row
    if best.stats["handoff_significant"] or row.rate_ratio is None:
        return int(row.gap_in_windows_ns or 0)
    return int(max(0.0, int(row.window_total_ns) * (1 - row.rate_ratio)))


def _severity(best: _gil_windows.Candidate, share: float, params) -> str:
    if not best.stats["significant"]:
        return "info"
    ratio = best.row.rate_ratio
    strong = (ratio is not None and ratio <= params["critical_rate_ratio"]) or best.stats["handoff_significant"]
    return "critical" if strong and share >= params["critical_share"] else "warning"


def _measurements(best: _gil_windows.Candidate, params, a_short: str) -> str:
    """The numbers behind the verdict, in words: rates, idle gaps, units of work."""
    row, op = best.row, best.op
    text = (
        f"its activity rate inside {row.windows} `{op}` windows on thread {a_short} "
        f"({row.window_total_ns / 1e6:.1f} ms) vs outside them: {row.rate_in_per_ms:.3f} vs "
        f"{row.rate_out_per_ms or 0:.3f} events/ms ({row.starts_in} vs {row.starts_out} starts); "
        f"{row.windows_slower} of {row.windows_paired} windows slower than the stretch before them, "
        f"{row.windows_silent} silent"
    )
    if row.gap_ns:
        text += (
            f"; {row.gap_in_windows_ns / row.gap_ns:.0%} of its idle-gap time (gaps >= "
            f"{duration(params['min_gap_ns'])}) falls in the windows, which cover {row.window_share_of_span:.0%} of "
            f"the span; {row.gaps_ending_at_window_edge} of its {row.idle_gaps} idle gaps end within "
            f"{duration(params['handoff_ns'])} of a window's start or end (expected share {row.handoff_expected:.0%})"
        )
    unit = best.sql_params["unit_name"]
    if unit and row.units_in and row.units_out:
        text += (
            f"; its `{unit}` units overlapping a window take {duration(row.unit_p50_in_ns)} (median, "
            f"{row.units_in}) vs {duration(row.unit_p50_out_ns)} for the others ({row.units_out})"
        )
    return text


def _observed(best: _gil_windows.Candidate, params, a_short: str, b_short: str) -> tuple[Quantity, Quantity, str]:
    """(observed, expected, title) for the evidence column that carries the pair."""
    row, op, stats = best.row, best.op, best.stats
    p = _p_text(stats["p_value"])
    column = stats["observed_column"]
    numbers = _measurements(best, params, a_short)
    if column == "rate_ratio":
        value = row.rate_ratio
        observed = Quantity(
            value, "ratio", f"thread {b_short}: in-window / out-of-window activity rate; {numbers}; p = {p}"
        )
        expected = Quantity(
            1.0, "ratio", "a thread sharing no lock with the op runs as often inside its windows as outside"
        )
    else:
        value = row.handoff_share
        observed = Quantity(
            value,
            "ratio",
            f"thread {b_short}: share of its idle gaps that end at a window's start or end (it runs again only when "
            f"thread {a_short} enters or leaves `{op}` and lets the GIL go); {numbers}; p = {p}",
        )
        expected = Quantity(
            row.handoff_expected, "ratio", "the share of the span within handoff_ns of a window's start or end"
        )
    shown = f"{value:.2f}" if value is not None else "n/a"
    if stats["significant"] and column == "rate_ratio":
        title = (
            f"Thread {b_short} starved inside {row.windows} `{op}` windows on thread {a_short}: "
            f"{shown}x its outside activity rate (p = {p})"
        )
    elif stats["significant"]:
        title = (
            f"Thread {b_short} resumes only at the edges of `{op}` windows on thread {a_short}: "
            f"{row.gaps_ending_at_window_edge} of {row.idle_gaps} idle gaps end there (p = {p})"
        )
    else:
        title = (
            f"Thread {b_short} not starved by `{op}` on thread {a_short}: {column} {shown} (not significant, p = {p})"
        )
    return observed, expected, title


def _caveats(best: _gil_windows.Candidate) -> list[str]:
    row = best.row
    handoff = (
        [
            f"Carried by the handoff test alone ({row.gaps_ending_at_window_edge} of {row.idle_gaps} idle gaps): the "
            "thread is starved outside the windows too, so the op is one of the GIL holders, not necessarily the "
            "only one."
        ]
        if best.stats["handoff_significant"]
        else []
    )
    return [
        *handoff,
        "A correlation: another shared lock (allocator, I/O, a mutex in the extension) starves a thread the "
        "same way; the GIL sampler in next_experiment tells them apart.",
        "The Poisson p-value treats activity starts as independent (nested frames of one unit cluster); "
        "the per-window sign test does not, and the reported p is the larger of the two.",
    ]


def _finding(con, params, ctx, run, pid, a_tid, b_tid, best: _gil_windows.Candidate):
    row, op, kind, stats = best.row, best.op, best.kind, best.stats
    a_name = ctx.thread_name(run.run_id, pid, a_tid)
    b_name = ctx.thread_name(run.run_id, pid, b_tid)
    a_short, b_short = thread_label(a_name, a_tid), thread_label(b_name, b_tid)
    if a_short == b_short:  # two threads both called `python3`: tell them apart by tid
        a_short, b_short = f"{a_short} (tid {a_tid})", f"{b_short} (tid {b_tid})"
    samples = _gil_windows.window_samples(con, run.run_id, pid, a_tid, kind, op, params, row.first_ns, row.last_ns)
    native = _gil_windows.native_call(con, run.run_id, pid, a_tid, samples[0], op) if samples else None
    significant = stats["significant"]
    lost = _lost_ns(best)
    share = lost / run.window_ns if run.window_ns else 0.0
    observed, expected, title = _observed(best, params, a_short, b_short)
    column = stats["observed_column"]
    return Finding(
        rule="H002",
        severity=_severity(best, share, params),
        confidence=(0.8 if kind != "python_function" or native is None else 0.7) if significant else 0.3,
        title=title,
        locality=locality(
            run,
            pid=pid,
            tid=b_tid,
            thread_name=b_name or f"tid {b_tid}",
            op=op,
            code_path=ctx.code_path(samples[0]) if samples else [],
            window_ns=[row.first_ns, row.last_ns],
        ),
        observed=observed,
        expected=expected,
        impact_ns=lost if significant else 0,
        window_ns=run.window_ns,
        sql=_gil_windows.STATS_SQL,
        sql_params=best.sql_params,
        sample_event_ids=samples,
        hypothesis=(
            f"`{op}`{f' ({native})' if native else ''} on thread {a_short} holds the Python GIL while it waits, so "
            f"thread {b_short} (and every other Python thread of pid {pid}) cannot run until it returns."
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
        acceptance=rerun(
            "trace",
            f"rate_ratio for thread {b_short} is at least {ACCEPTED_RATIO} (its in-window rate within "
            f"{1 - ACCEPTED_RATIO:.0%} of its outside rate), windows_slower is about half of windows_paired and "
            "handoff_share is near handoff_expected; this rule then reports nothing for the pair.",
        ),
        caveats=_caveats(best),
        extra={
            "window_thread": {"tid": a_tid, "name": a_name},
            "starved_thread": {"tid": b_tid, "name": b_name},
            "window_kind": kind,
            "native_call": native,
            **stats,
            **{k: (float(v) if isinstance(v, float) else v) for k, v in row._asdict().items() if k != column},
        },
    )
