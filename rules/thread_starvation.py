"""A thread starved while another thread of its process is inside a native call that keeps the GIL (H002 thread-starvation).

## What it does
Looks for the GIL case: a native call on one thread (A) that keeps the Python GIL while it waits, so
every other Python thread of the process (B) stops until it returns. Windows are A's native calls in
which A runs no Python: C-function frames (`<built-in method intranode_dispatch ...>`, a pybind11
method) with no Python frame below them, named after the innermost `record_function` annotation or op
around them that holds no other call of that function (`deepep_like::intranode_dispatch`), else after
the frame. A call that leaves no frame (a `ctypes` function) shows as a stretch in which A starts and
ends nothing for at least `silence_factor` times its own median gap between activity boundaries (a
thread running bytecode makes calls every few µs; one with no call for milliseconds is in native code),
inside a `record_function` range or op, between two calls of one Python frame: such a stretch is a
window too, named after the range (the longest one per range). Python frames are never windows (two
threads that both run Python share the GIL by design; a stretch inside a frame that calls nothing is
that frame's own bytecode), nor are waits that release the GIL by design (`time.sleep`,
lock/queue/select waits), calls that are mostly one op's own work (`relu` around `aten::relu`) or the
profiler's own bookkeeping.

For each other thread B of the same pid with Python activity, a C-function call is long enough to test
when B would start `min_expected_starts` events in it at its own mean rate (so the window length comes
from B, not from a fixed threshold). A stretch with no call is already long on A's own scale and is
not held to B's mean rate: a starved B has a low mean rate because it is starved.

Each window op (op name and native function) that occurs at least `min_windows` times is measured
over all its windows together, from the first to the last (inside B's own active span):

- B's activity rate (starts of its `python_function`, `user_annotation`, `cpu_op` and CUDA runtime
  events, per ms) inside the windows vs outside them; `observed` is the ratio in/out;
- a Poisson test of B's in-window count against its out-of-window rate (events of one unit of work
  cluster, so this one is optimistic);
- a silent-window test: how many windows hold none of B's starts, against the chance that a stretch
  of B's outside time as long holds none (from B's own gaps outside the windows; binomial at the
  windows' mean chance); clusters count once here. The pair's p-value is the larger of the two;
- the latency of B's units of work (its most frequent `record_function` name, e.g.
  `kv_transfer_chunk`) that overlap a window vs those that do not.

A window op starves B when B's in-window rate is at most `max_rate_ratio` of its outside rate with
p < `alpha`. All the ops of A that starve B (DeepEP's dispatch and combine) are measured again
together and reported as one finding that names them all; when two threads seem to starve each
other only the stronger direction is kept.

Checked on `tests/data/gil_matrix/` (18 real H200 runs, `scripts/make_gil_matrix.py`): GIL held or
released around a 0.1-5 ms wait, polling a flag with no CUDA call or polling `cudaEventQuery`, one or
two native ops per layer, a transfer thread (Python, a side-stream copy, `event.synchronize()`, a
sleep), a Python-only thread or none: every held cell with a second thread is a warning naming
`kv_transfer` and the op(s), every other cell is quiet, in both directions. Also on the project's
`gil_hold`/`gil_release` samples and the corpus traces without a second Python thread. And on two H200
runs made outside the project (`../shared/reference/experiments/exp_gil.py`): a `ctypes` `usleep` of
3 ms inside `record_function("deep_ep::intranode_dispatch(sim)")`, through `PyDLL` (GIL held: the
transfer thread ran 8 times in 0.7 s, never inside a wait; a warning) or `CDLL` (released: quiet).

Not covered: a `ctypes` wait alone in a Python function of its own (`def wait(): lib.usleep(n)`)
cannot be told from that function's own bytecode, and a wait inside a custom op's `cpu_op` counts as
that op's work. Kineto records no Python thread names (`threading.Thread(name=...)`): an unnamed
starved thread is told by its entry frame (`transfer_worker`).

## Why it matters
A native op that waits without `py::gil_scoped_release` (DeepEP `intranode_dispatch` in v1.2.1,
a blocking recv, a polling loop in a C extension) freezes every Python thread of the process for the
whole wait: a KV-cache transfer thread (Mooncake, NIXL), a scheduler, a detokenizer or a metrics
thread stall for every dispatch, and the stall shows up far from its cause, as slow transfers, TTFT
spikes or timeouts on another thread. Nothing on the starved thread's own timeline names the culprit;
only the correlation with the other thread's windows does.

## Example
`sample_traces/gil_hold.json.gz` (H200, `scripts/make_gil_traces.py`): the main thread calls a C++
spin-wait of 3 ms inside `record_function("deepep_like::intranode_dispatch")` 120 times, holding the
GIL. Thread `kv_transfer` starts almost nothing inside those windows against tens of events per ms
outside them, nearly every window is silent where a handful would be by chance, and its
`kv_transfer_chunk` units that overlap a window take milliseconds against a fraction of one for the
others. The finding names the op and the native call inside it, `<built-in method dispatch_hold ...>`.
With the GIL released around the wait (`gil_release.json.gz`, same workload) the thread runs faster
inside the windows than outside (the main thread's Python is out of its way) and nothing is reported.

## Options
- `min_expected_starts` (3): a native call is a window when the starved thread would start this many
  events in it at its own mean rate (at 3, a window of an independent thread is silent by chance
  about 5% of the time under a Poisson rhythm: shorter silences say nothing).
- `min_windows` (10): a window op must occur this often on its thread.
- `min_thread_events` (20): a thread needs this many `python_function` events to be checked.
- `max_rate_ratio` (0.5): report when the starved thread's in-window activity rate is at most
  this share of its outside rate.
- `alpha` (0.001): and the larger of the two p-values (Poisson, silent windows) is below this.
- `silence_factor` (1000): a stretch with no call is native code from this many times the thread's
  median gap between activity boundaries (0.4-3 µs over the samples and the reference runs, so a
  stretch of 0.4-3 ms; the reference waits are 3 ms, about 2800 times the holder's 1.1 µs).
- `max_candidates` (8): window ops tried per pair of threads (the longest in total).
- `report_clear` (false): also report checked pairs that are not significant, as `info` findings
  with the numbers (useful to confirm a fix).
- `critical_share` (1.0): severity ladder: info for a cleared pair (with `report_clear`), warning
  for a starved thread, critical when its lost time is at least this share of the run window (so
  never by default). The trace shows the starved thread's delay, not what the delay costs the job
  (whether anything waits on that thread): over the matrix and the samples the lost share runs from
  about 0.1 to 0.9 with nothing else in the runs to tell a costly stall from a cheap one.
  Set it for a workload where the starved thread is known to be on the critical path.
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
    title="Thread starved while another thread is inside a native call that keeps the GIL",
    category="host",
    requires=("python_functions",),
    params={
        "min_expected_starts": Param(
            3.0, "a call is a window when the starved thread would start this many events in it", "events"
        ),
        "min_windows": Param(10, "a window op must occur this often on its thread", "windows"),
        "min_thread_events": Param(20, "python_function events a thread needs to be checked", "events"),
        "max_rate_ratio": Param(
            0.5, "report when the in-window rate is at most this share of the outside rate", "ratio"
        ),
        "alpha": Param(0.001, "significance level for the larger of the two p-values", "p"),
        "silence_factor": Param(
            1000.0, "a stretch with no call is native code from this many times the thread's median gap", "ratio"
        ),
        "max_candidates": Param(8, "window ops tried per pair of threads", "ops"),
        "report_clear": Param(False, "also report checked, not significant pairs as info", ""),
        "critical_share": Param(
            1.0, "critical from this lost share of the run window (1.0: never; see the docs)", "ratio"
        ),
    },
    example=Example(("gil_hold.json.gz",)),
)
def check(con, params, ctx):
    checked = _gil_windows.threads(con, [run.run_id for run in ctx.runs], params)
    for run in ctx.runs:
        pairs = _gil_windows.pairs(con, run.run_id, params, checked.get(run.run_id, []))
        strength = {(p.pid, p.window_tid, p.starved_tid): p.strength for p in pairs if p.stats["significant"]}
        for pair in pairs:
            reverse = strength.get((pair.pid, pair.starved_tid, pair.window_tid))
            if (
                pair.stats["significant"]
                and reverse is not None
                and (reverse, pair.starved_tid)
                < (
                    pair.strength,
                    pair.window_tid,
                )
            ):
                continue  # the other direction is the stronger one: B starves A, not A starves B
            if pair.stats["significant"] or params["report_clear"]:
                yield _finding(con, params, ctx, run, pair)


def _p_phrase(p: float) -> str:
    if p < 1e-300:  # the tail underflowed a float
        return "p < 1e-300"
    return f"p = {p:.1e}" if p < 0.001 else f"p = {p:.3f}"


def _lost_ns(pair: _gil_windows.Pair) -> int:
    """The starved thread's time lost to the windows: their time scaled by how much slower it ran there."""
    row = pair.row
    return int(max(0.0, int(row.window_total_ns) * (1 - (row.rate_ratio or 0))))


def _severity(pair: _gil_windows.Pair, share: float, params) -> str:
    if not pair.stats["significant"]:
        return "info"
    return "critical" if share >= params["critical_share"] else "warning"


def _ops_text(pair: _gil_windows.Pair) -> str:
    return " and ".join(f"`{op}`" for op in pair.ops)


def _measurements(pair: _gil_windows.Pair, a_short: str) -> str:
    """The numbers behind the verdict, in words: rates, silent windows, units of work."""
    row = pair.row
    text = (
        f"its activity rate inside {row.windows} {_ops_text(pair)} windows on thread {a_short} "
        f"({row.window_total_ns / 1e6:.1f} ms, {row.window_share_of_span:.0%} of the span) vs outside them: "
        f"{row.rate_in_per_ms:.3f} vs {row.rate_out_per_ms or 0:.3f} events/ms ({row.starts_in} vs "
        f"{row.starts_out} starts); {row.windows_silent} of {row.windows} windows silent where "
        f"{row.windows_silent_expected or 0:.1f} would be at its own outside rhythm"
    )
    unit = pair.sql_params["unit_name"]
    if unit and row.units_in and row.units_out:
        text += (
            f"; its `{unit}` units overlapping a window take {duration(row.unit_p50_in_ns)} (median, "
            f"{row.units_in}) vs {duration(row.unit_p50_out_ns)} for the others ({row.units_out})"
        )
    return text


def _code_path(ctx, samples: list[int], pair: _gil_windows.Pair) -> list[str]:
    path = ctx.code_path(samples[0], limit=7) if samples else []
    # a native call's own frame names the variant (hold/release) and would give the fixed run another id
    return path[1:] if path and path[0] in pair.natives else path


def _finding(con, params, ctx, run, pair: _gil_windows.Pair):
    row, stats, pid = pair.row, pair.stats, pair.pid
    a_name = ctx.thread_name(run.run_id, pid, pair.window_tid)
    b_name = ctx.thread_name(run.run_id, pid, pair.starved_tid)
    a_short, b_short = thread_label(a_name, pair.window_tid), thread_label(b_name, pair.starved_tid)
    if a_short == b_short:  # two threads both called `python3`: tell them apart by tid
        a_short, b_short = f"{a_short} (tid {pair.window_tid})", f"{b_short} (tid {pair.starved_tid})"
    b_where = b_name or f"tid {pair.starved_tid}"
    if not b_name or a_short.split(" (tid ")[0] == b_short.split(" (tid ")[0]:
        # the OS name tells nothing (Python's thread names are not in the trace): say what the thread runs;
        # in the locality it stands in for the name, so the finding keeps its id from run to run
        entry = _gil_windows.entry_frame(con, run.run_id, pid, pair.starved_tid)
        if entry:
            b_short = f"tid {pair.starved_tid} running `{entry}`"
            b_where = f"thread {pair.starved_tid} ({entry})"
    samples = _gil_windows.window_samples(con, pair)
    significant = stats["significant"]
    lost = _lost_ns(pair)
    share = lost / run.window_ns if run.window_ns else 0.0
    p = _p_phrase(stats["p_value"])
    ops = _ops_text(pair)
    native = ", ".join(f"`{n}`" for n in pair.natives if n not in pair.ops)
    ratio = (
        "n/a"
        if row.rate_ratio is None
        else f"{row.rate_ratio:.2f}"
        if row.rate_ratio >= 0.01
        else f"{row.rate_ratio:.1g}"
    )
    if significant:
        title = (
            f"Thread {b_short} starved inside {row.windows} {ops} windows on thread {a_short}: "
            f"{ratio}x its outside activity rate ({p})"
        )
    else:
        title = f"Thread {b_short} not starved by {ops} on thread {a_short}: rate ratio {ratio} ({p})"
    return Finding(
        rule="H002",
        severity=_severity(pair, share, params),
        confidence=0.8 if significant else 0.3,
        title=title,
        locality=locality(
            run,
            pid=pid,
            tid=pair.starved_tid,
            thread_name=b_where,
            op=", ".join(pair.ops),
            code_path=_code_path(ctx, samples, pair),
            window_ns=[row.first_ns, row.last_ns],
        ),
        observed=Quantity(
            row.rate_ratio,
            "ratio",
            f"thread {b_short}: in-window / out-of-window activity rate; {_measurements(pair, a_short)}; {p}",
        ),
        expected=Quantity(
            1.0, "ratio", "a thread sharing no lock with the op runs as often inside its windows as outside"
        ),
        impact_ns=lost if significant else 0,
        window_ns=run.window_ns,
        sql=_gil_windows.STATS_SQL,
        sql_params=pair.sql_params,
        sample_event_ids=samples,
        hypothesis=(
            f"{ops}{f' ({native})' if native else ''} on thread {a_short} holds the Python GIL while it waits "
            f"(a native call that runs no Python and does not release it), so thread {b_short} (and every other "
            f"Python thread of pid {pid}) cannot run until it returns."
            if significant
            else f"No evidence that {ops} on thread {a_short} blocks thread {b_short}."
        ),
        next_experiment=(
            f"Confirm who holds the GIL during a window: `py-spy dump --native --pid {pid}` while it runs (thread "
            f"{a_short} inside the native call, {b_short} in `take_gil`/`PyGILState_Ensure`) or "
            "`py-spy record --gil --native` (or py_gil_spy on Python 3.12+). Then release the GIL around the wait "
            "in the extension (`py::gil_scoped_release` in the pybind11 binding, `Py_BEGIN_ALLOW_THREADS` in C), "
            "or move the transfer loop to its own process or a native thread, and re-profile with with_stack=True "
            "and profile_all_threads=True."
        ),
        acceptance=rerun(
            "trace",
            f"rate_ratio for thread {b_short} is at least {ACCEPTED_RATIO} (its activity rate inside the windows "
            f"back within {1 - ACCEPTED_RATIO:.0%} of its outside rate) and windows_silent is near "
            "windows_silent_expected; this rule then reports nothing for the pair.",
        ),
        caveats=[
            "A correlation: another shared lock (allocator, I/O, a mutex in the extension) starves a thread the "
            "same way; the GIL sampler in next_experiment tells them apart.",
            "The trace shows the starved thread's delay, not what it costs the job: whether anything waits on "
            f"thread {b_short}'s work decides how much the {duration(lost)} it lost matter.",
        ],
        extra={
            "window_thread": {"tid": pair.window_tid, "name": a_name},
            "starved_thread": {"tid": pair.starved_tid, "name": b_name},
            "ops": pair.ops,
            "native_calls": pair.natives,
            "observed_column": "rate_ratio",
            **stats,
            **{k: (float(v) if isinstance(v, float) else v) for k, v in row._asdict().items() if k != "rate_ratio"},
        },
    )
