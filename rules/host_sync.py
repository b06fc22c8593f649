"""Blocking host calls in the steady state (H001 host-sync).

## What it does
Finds runtime calls that block the launching CPU thread until the GPU catches up, repeated at the
same call site: `cudaDeviceSynchronize`, `cudaStreamSynchronize`, `cudaEventSynchronize` (and
their `hip*`/`cu*` forms), synchronous `cudaMemcpy`/`cudaMemset`, and async copies into pageable
host memory (which the driver turns synchronous): the `host_blocking` view. A call site is the
thread, the call and the op or Python frame that issued it (e.g. `aten::_local_scalar_dense`, i.e.
`tensor.item()`), so the finding names the line of code to change. A site's cost is the GPU idle
`host_blocking` charges its calls: each idle gap of the run's main device once, to the call that
was waiting when the device drained, from that call's return until the next GPU work. A call that
starts with the GPU already idle returns at once and costs nothing.

## Why it matters
While the host waits it enqueues nothing, so the GPU drains its queue and then idles until the
host launches again: every sync in a decode loop turns the launch queue's lookahead into a bubble.
`.item()`, `.cpu()`, `.tolist()`, `torch.nonzero` and printing a CUDA tensor all sync implicitly.
Mirrors the nsys expert rules `cuda_api_sync`, `cuda_memcpy_sync` and `cuda_memcpy_async`
(pageable), which list calls but do not say who issued them.

## Example
On the H200 eager decode sample (`sample_traces/gpu_prefill_decode_eager.json.gz`):
`cudaStreamSynchronize` 32 times from `aten::_local_scalar_dense` (`tensor.item()`) on the main
thread, a per-step `if (next_token == eos).all().item(): break`; after each return the GPU waits
~0.2 ms for the host to enqueue the next step, 6.9 ms of a 305 ms window.

Use instead: check the stop condition every N steps, or on a side stream with a pinned host buffer
and `non_blocking=True`, and read it one step late.

## Options
- `min_calls` (3): a site must repeat this often to count as steady state.
- `min_share` (0.005): report sites whose cost, the GPU idle charged to their calls, is at least
  this share of the run's window. (Time the host spends blocked is not the cost: the GPU is busy
  then, and when it is the bottleneck the wait is harmless.)
- `small_htod_bytes` (65536): synchronous host-to-device copies up to this size are exempt (as in nsys).
- `critical_share` (0.1): severity critical when a site's cost is at least this share of the run's
  window.
- `warning_share` (0.02): severity warning from this share on; below it, info.
- `all_phases` (False): measure every phase of the run. By default a call that returns in a warm-up,
  CUDA-graph capture or profiler window (`run_phases`) is dropped, idle inside such a window is not
  charged, and shares are of the run's steady time; the finding lists the windows in
  `extra.left_out`, and a run with no steady state at all is left to P001 cold-profile.
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _phases
from tracekit.units import duration

# The run's repeated blocking call sites (thread, call, issuing op or frame) over the thresholds.
SITES_SQL = """
SELECT pid, tid, call, site, any_value(blocking) AS blocking, count(*) AS calls,
       count(*) FILTER (WHERE charged_idle_ns > 0) AS charged_calls, sum(dur_ns) AS blocked_ns,
       min(ts_ns) AS first_ns, max(end_ns) AS last_ns, arg_max(event_id, dur_ns) AS worst_event_id,
       list(event_id ORDER BY charged_idle_ns DESC, dur_ns DESC, event_id)[1:5] AS sample_event_ids,
       median(dur_ns) AS median_ns, sum(charged_idle_ns) AS gpu_idle_after_ns
FROM steady_host_blocking($small_htod_bytes, all_phases := $all_phases) WHERE run_id = $run_id
GROUP BY pid, tid, call, site
HAVING count(*) >= $min_calls AND sum(charged_idle_ns) >= $min_share * $window
ORDER BY sum(charged_idle_ns) DESC, site, call
"""

# The evidence query: the GPU idle charged to one site, its calls and the time they blocked the host.
SITE_SQL = """
SELECT sum(charged_idle_ns) AS gpu_idle_after_ns, count(*) AS calls,
       count(*) FILTER (WHERE charged_idle_ns > 0) AS charged_calls, sum(dur_ns) AS host_blocked_ns,
       min(ts_ns) AS first_ns, max(end_ns) AS last_ns
FROM steady_host_blocking($small_htod_bytes, all_phases := $all_phases)
WHERE run_id = $run_id AND pid IS NOT DISTINCT FROM $pid AND tid IS NOT DISTINCT FROM $tid AND call = $call
  AND site = $site
"""


@rule(
    code="H001",
    name="host-sync",
    title="Blocking host call in the steady state",
    category="host",
    requires=("runtime_calls",),
    params={
        "min_calls": Param(3, "a site must repeat at least this often", "calls"),
        "min_share": Param(0.005, "smallest share of the run window worth reporting", "ratio"),
        "small_htod_bytes": Param(65536, "sync HtoD copies up to this size are exempt", "bytes"),
        **share_params(
            "the GPU idle time charged to the site's calls over the run window", critical=0.10, warning=0.02
        ),
        "all_phases": _phases.ALL_PHASES,
    },
    example=Example(("gpu_prefill_decode_eager.json.gz",)),
)
def check(con, params, ctx):
    for run in ctx.runs:
        window = _phases.window(con, ctx, run, params)
        if window <= 0 or _phases.skip_run(con, ctx, run.run_id, params):
            continue
        sites = rows(
            con,
            _phases.in_rule(con, ctx, SITES_SQL),
            {
                "run_id": run.run_id,
                "small_htod_bytes": params["small_htod_bytes"],
                "min_calls": params["min_calls"],
                "min_share": params["min_share"],
                "window": window,
                "all_phases": params["all_phases"],
            },
        )
        for site in sites:
            left_out = _phases.run_left_out(con, ctx, run, params)
            yield _finding(ctx, run, params, site, window, left_out)


def _finding(ctx, run, params, s, window, left_out) -> Finding:
    cost = int(s.gpu_idle_after_ns)
    implicit = s.blocking == "sync"
    calls = f"{s.charged_calls} of {s.calls}" if s.charged_calls < s.calls else f"{s.calls}"
    return Finding(
        rule="H001",
        severity=by_share(cost / window, params),
        confidence=0.9 if implicit else 0.8,
        title=(
            f"GPU idle {duration(cost)} after {calls} blocking {s.call} ({s.blocking}) "
            f"from {s.site} (host blocked {duration(s.blocked_ns)} in them)"
        ),
        locality=locality(
            run,
            **ctx.thread(run.run_id, s.pid, s.tid),
            op=s.site,
            code_path=ctx.code_path(s.worst_event_id),
            window_ns=[s.first_ns, s.last_ns],
            launch={"call": s.call},
        ),
        observed=Quantity(
            cost,
            "ns",
            f"GPU idle on the main device from the return of {calls} calls (those that were "
            f"waiting when the GPU drained, each gap counted once) until the next GPU work; the host was blocked "
            f"{duration(s.blocked_ns)} in the calls (median {duration(s.median_ns)}), waiting for the GPU",
        ),
        expected=Quantity(0, "ns", "no blocking call inside the steady-state loop"),
        impact_ns=cost,
        window_ns=window,
        sql=SITE_SQL,
        sql_params={
            "run_id": run.run_id,
            "pid": s.pid,
            "tid": s.tid,
            "call": s.call,
            "site": s.site,
            "small_htod_bytes": params["small_htod_bytes"],
            "all_phases": params["all_phases"],
        },
        sample_event_ids=s.sample_event_ids,
        hypothesis=(
            f"{s.site} forces the host to wait for the GPU every time it runs "
            f"({'an implicit sync such as .item()/.cpu()/.tolist()' if implicit else s.blocking}); "
            "while it waits nothing is enqueued, so the GPU idles after each call."
        ),
        next_experiment=(
            "Run the loop with `torch.cuda.set_sync_debug_mode('warn')` to get the Python line of each "
            "implicit sync, then move the check off the per-step path (read the value one step late "
            "through a pinned buffer with non_blocking=True) and re-profile."
        ),
        acceptance=rerun(
            "trace",
            f"calls at this site drop to 0 (or below {params['min_calls']}) and rule G001 reports less idle time "
            "on the stream it fed.",
        ),
        caveats=[note for note in [_phases.caveat(left_out, "the site's calls and the run window")] if note],
        extra={"left_out_ns": sum(w["dur_ns"] for w in left_out), "left_out": _phases.listed(left_out)},
    )
