"""GPU idle time per stream, attributed to its cause (G001 gpu-idle).

## What it does
For every (run, device, stream) with GPU work (kernels, memcpys, memsets), takes the gaps between
consecutive activities on the stream inside the run window and attributes each gap to one cause,
in this order (the same split as HTA's `get_idle_time_breakdown`, plus the other streams):

- **host**: the runtime call that launched the activity after the gap (via `launches`) ended after
  the previous activity had finished, i.e. it started late or was still being issued: the GPU waited
  for the host to enqueue work (HTA "host wait").
- **other GPU work**: not host-caused, and other streams of the same device were busy for at least
  half of the gap: the stream waited on work elsewhere on the device (an event wait, a collective,
  a copy on a side stream).
- **kernel wait**: not the above, and the gap is shorter than `kernel_wait_ns`: the fixed latency
  between queued back-to-back kernels (HTA "kernel wait", `consecutive_kernel_delay`).
- **other**: everything else (e.g. activities with no launch record).

It reports per stream the idle time, its share of the stream's active window (first start to last
end), the split by cause, how much of the idle time the whole device was idle ("exposed"), the
largest gaps with their windows, and the call sites (runtime call, enclosing op, Python frames)
whose launches ended the host gaps. A stream is reported when its exposed idle time is at least
`min_idle_share` of its active window and at least `min_idle_ns`, so a communication side stream
that idles while compute runs elsewhere on the device is not reported.

Only the steady state counts (`run_phases`): warm-up (lazy initialisation, first launches, cuDNN
algorithm search, warm-up steps), CUDA-graph capture and profiler windows are cut out of both the
gaps and the active window, and listed in `extra.left_out` with why; a run that is all start-up gets
P001 cold-profile instead.

## Why it matters
Idle GPU time is time the accelerator is paid for and unused. When the gaps are host-caused and
short, the host spends longer issuing each kernel (Python, dispatcher, launch) than the GPU spends
running it: the loop is launch-bound and CUDA graphs (`torch.compile(mode="reduce-overhead")`,
`torch.cuda.CUDAGraph`) remove the per-kernel launch cost. Long host gaps point at host work
between launches instead (data loading, `.item()` syncs, Python logic). Gaps spent waiting on other
streams point at cross-stream dependencies that serialize the device. nsys reports gaps
(`gpu_gaps`, default 500 ms) and low-utilization chunks (`gpu_time_util`) without a cause.

## Example
Device 0 stream 7 idle 95% of its 207 ms active window (197 ms in 3101 gaps, median 56 us), all of
it host-caused, in a greedy decode loop run eagerly: every kernel runs ~3 us but takes ~65 us of
host time to issue. Capturing the decode step in a CUDA graph cut the stream's idle share to 47%.

One finding per device: streams of a device see the same device idle, so the finding is on the
busiest stream over the thresholds, and the others are listed in `evidence.details.other_idle_streams`.

## Options
- `min_idle_share` (0.2): report streams whose exposed idle time is at least this share of the
  stream's active window.
- `min_idle_ns` (1000000): and at least this much exposed idle time (1 ms).
- `kernel_wait_ns` (5000): non-host gaps shorter than this count as kernel wait (back-to-back launch
  latency; measured 0.4-3 us between queued kernels on V100/A100/H200 traces).
- `short_gap_ns` (100000): host gaps up to this long are per-launch overhead; when they make most of
  the host-caused idle time the finding suggests CUDA graphs.
- `top_gaps` (5): how many of the largest gaps to list.
- `critical_share` (0.5): severity critical when the exposed idle time is at least this share of
  the stream's active window.
- `warning_share` (0.3): severity warning from this share on; below it, info.
- `all_phases` (False): measure every phase of the run. By default warm-up, CUDA-graph capture and
  profiler windows (`run_phases`) are left out of both the idle time and the active window; the
  finding lists them in `extra.left_out`, with a caveat, and a run with no steady state at all is
  left to P001 cold-profile.
"""

from __future__ import annotations

from tracekit.engine import advice, quality
from tracekit.engine.phrases import rerun
from tracekit.engine.registry import DataQuality, Example, Param, rule
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, user_frame
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _idle_gaps, _phases
from tracekit.units import duration

# What G001's numbers rest on, for data-quality checks that undermine them.
_USES = (quality.GPU_TIMELINE, quality.LAUNCH_ATTRIBUTION)
_CAUSE_LABELS = {"host": "host", "other_gpu": "other GPU work", "kernel_wait": "kernel wait", "other": "other"}


@rule(
    code="G001",
    name="gpu-idle",
    title="GPU stream idle between activities, attributed to host / other GPU work / launch latency",
    category="gpu",
    requires=("gpu_activities",),
    params={
        "min_idle_share": Param(0.2, "smallest exposed idle share of the stream's active window to report", "ratio"),
        "min_idle_ns": Param(1_000_000, "smallest exposed idle time to report", "ns"),
        "kernel_wait_ns": Param(5_000, "non-host gaps shorter than this are back-to-back launch latency", "ns"),
        "short_gap_ns": Param(100_000, "host gaps up to this long count as per-launch overhead", "ns"),
        "top_gaps": Param(5, "how many of the largest gaps to list", "gaps"),
        **share_params("the exposed idle share of the stream's active window", critical=0.5, warning=0.3),
        "all_phases": _phases.ALL_PHASES,
    },
    example=Example(("gpu_prefill_decode_eager.json.gz",)),
)
def check(con, params, ctx):
    _idle_gaps.build_gap_table(con, ctx, params)
    runs = [run for run in ctx.runs if run.window_ns > 0 and not _phases.skip_run(con, ctx, run.run_id, params)]
    summaries = _idle_gaps.stream_summaries(con, [run.run_id for run in runs], params)
    chosen: dict[int, list] = {}  # run -> (stream summary, the device's other reported streams)
    for run in runs:
        reported = [s for s in summaries.get(run.run_id, []) if _over_threshold(s, params)]
        # Exposed idle is device idle seen from a stream: streams of one device mostly report the same
        # idle time. One finding per device, on its busiest stream (the one whose next launch ends the
        # idle most often); the other streams go into the finding's details.
        for s in reported:
            same_device = [o for o in reported if o.device == s.device]
            if s is max(same_device, key=lambda o: (o.activities, -o.stream)):
                chosen.setdefault(run.run_id, []).append((s, [_stream_brief(o) for o in same_device if o is not s]))
    # every chosen stream's gaps, sites and launch lookups together
    asked = [(run_id, s.device, s.stream) for run_id, streams in chosen.items() for s, _ in streams]
    details = _idle_gaps.gaps_and_sites(con, ctx, asked, params["top_gaps"])
    launched = {r for (r,) in con.execute("SELECT DISTINCT run_id FROM launches").fetchall()}
    for run in runs:
        if run.run_id not in summaries:
            continue
        graph_launches = ctx.graph_launches(run.run_id)
        for s, others in chosen.get(run.run_id, []):
            largest, sites = details[run.run_id, s.device, s.stream]
            finding = _finding(con, ctx, run, params, s, graph_launches, others, largest, sites)
            yield quality.qualify(ctx, finding, _USES)
        if run.run_id not in launched:
            yield DataQuality(
                "G001",
                "gpu-idle: no runtime call correlates with GPU work (launches is empty), so no gap is "
                "attributed to the host",
                run.run_id,
            )


def _active_ns(s) -> int:
    """The stream's active window (first start to last end), steady time only unless all_phases."""
    return int(s.active_ns)


def _over_threshold(s, params: dict) -> bool:
    active = _active_ns(s)
    if active <= 0 or not s.idle_ns:
        return False
    return s.exposed_ns / active >= params["min_idle_share"] and s.exposed_ns >= params["min_idle_ns"]


def _stream_brief(s) -> dict:
    return {
        "stream": int(s.stream),
        "activities": int(s.activities),
        "idle_ns": int(s.idle_ns),
        "exposed_idle_ns": int(s.exposed_ns),
        "host_ns": int(s.host_ns),
    }


def _caveats(s, graph_launches: int) -> tuple[list[str], float]:
    caveats, confidence = [], 0.85
    if s.gaps_with_launch < s.gaps:
        missing = s.gaps - s.gaps_with_launch
        caveats.append(
            f"{missing} of {s.gaps} gaps have no launch record (no runtime call with the activity's "
            "correlation id); they can not be attributed to the host"
        )
        confidence = 0.85 if missing / s.gaps < 0.1 else 0.6
    if graph_launches:
        caveats.append(
            f"the run replays CUDA graphs ({graph_launches} graph launches): the kernels of one replay share one "
            "launch call, so gaps inside a replay count as host-caused while that call is still running"
        )
    return caveats, confidence


def _explain(s, split, dominant, params, graph_launches, site_text, device, context) -> tuple[str, advice.Advice]:
    """(hypothesis, next experiment) for the dominant cause of the stream's idle time, fitted to the workload."""
    idle = s.idle_ns
    host_share = s.host_ns / idle
    short_host = s.host_ns and s.host_short_ns / s.host_ns >= 0.5 and s.host_gaps >= 50
    median = duration(s.host_gap_median_ns)
    if dominant == "host" and short_host and not graph_launches:
        return (
            f"The stream is launch-bound: {s.host_gaps} host-caused gaps (median {median}) make {host_share:.0%} "
            "of its idle time; the host takes longer to issue each kernel (Python, dispatcher, launch) than the "
            "GPU takes to run it." + site_text,
            advice.host_gaps(context, "launch_bound", s.host_ns),
        )
    if dominant == "host" and graph_launches:
        return (
            f"CUDA graphs are already replayed, yet {host_share:.0%} of the idle time is host-caused "
            f"({s.host_gaps} gaps, median {median}): work outside the graphs (eager kernels, copies, per-step "
            "syncs and Python between replays) keeps the GPU waiting." + site_text,
            advice.host_gaps(context, "graphed", s.host_ns),
        )
    if dominant == "host":
        long_share = 1 - s.host_short_ns / s.host_ns
        return (
            f"{host_share:.0%} of the idle time is host-caused ({s.host_gaps} gaps, median {median}, "
            f"{long_share:.0%} of it in gaps over {duration(params['short_gap_ns'])}): the host does other work "
            "between launches (syncs, host computation, allocation, data preparation)." + site_text,
            advice.host_gaps(context, "long", s.host_ns),
        )
    if dominant == "other_gpu":
        return (
            f"{split['other_gpu'] / idle:.0%} of the idle time passes while other streams of device {device} are "
            "busy: this stream waits on their work (an event wait, a collective or copy on a side stream).",
            advice.stream_wait(context),
        )
    if dominant == "kernel_wait":
        return (
            f"{split['kernel_wait'] / idle:.0%} of the idle time is launch latency between queued back-to-back "
            f"kernels (gaps under {duration(params['kernel_wait_ns'])}): the stream runs many very short kernels.",
            advice.kernel_wait(context),
        )
    return (
        f"{split['other'] / idle:.0%} of the idle time could not be attributed (no launch record, or long "
        "gaps with the launch already queued).",
        advice.unattributed(context),
    )


# DataLoader time inside the stream's active window: loading done before the first kernel (or after
# the last) idles no part of the window, so it explains none of the gaps.
LOADER_IN_WINDOW_SQL = """
SELECT coalesce(sum(least(end_ns, $last) - greatest(ts_ns, $first)), 0) FROM events
WHERE run_id = $run_id AND kind IN ('cpu_op', 'user_annotation') AND name LIKE 'enumerate(DataLoader)%'
  AND ts_ns < $last AND end_ns > $first
"""


def _in_window(con, context, run_id: int, s):
    """The run's context with its DataLoader time cut to the stream's active window."""
    if context is None or not getattr(context, "data_loader_ns", None):
        return context
    within = con.execute(LOADER_IN_WINDOW_SQL, {"run_id": run_id, "first": s.first_ns, "last": s.last_ns}).fetchone()[0]
    return context._replace(data_loader_ns=int(within))


def _finding(con, ctx, run, params, s, graph_launches, others, largest, host_sites):
    where = {"device": s.device, "stream": s.stream}
    idle, active = int(s.idle_ns), _active_ns(s)
    share, exposed_share = idle / active, s.exposed_ns / active
    split = {c: int(getattr(s, f"{c}_ns")) for c in _idle_gaps.CAUSES}
    dominant = max(_idle_gaps.CAUSES, key=lambda c: split[c])
    site_text = ""
    if host_sites:
        h = host_sites[0]
        frame = user_frame(h["code_path"]) or h["op"] or h["site"]
        site_text = f" The largest share of host gaps ends at launches from {h['site']} ({frame})."
    hypothesis, advised = _explain(
        s,
        split,
        dominant,
        params,
        graph_launches,
        site_text,
        s.device,
        _in_window(con, ctx.workload(run.run_id), run.run_id, s),
    )
    caveats, confidence = _caveats(s, graph_launches)
    left_out = _phases.left_out(con, ctx, run.run_id, s.first_ns, s.last_ns, params)
    note = _phases.caveat(left_out, "the stream's active window")
    if note:
        caveats.append(note)
    by_cause = ", ".join(f"{label} {split[c] / idle:.0%}" for c, label in _CAUSE_LABELS.items())
    return Finding(
        rule="G001",
        severity=advised.cap(by_share(exposed_share, params)),
        confidence=confidence,
        title=(
            f"{ctx.device_word(run.run_id)} {s.device} stream {s.stream} idle {share:.0%} of its active window "
            f"({duration(idle)} of {duration(active)}): {by_cause}"
        ),
        locality=locality(run, device=int(s.device), stream=int(s.stream), window_ns=[s.first_ns, s.last_ns]),
        observed=Quantity(
            idle,
            "ns",
            f"idle in {s.gaps} gaps between {s.activities} activities: "
            + ", ".join(f"{label} {duration(split[c])}" for c, label in _CAUSE_LABELS.items())
            + f"; {duration(s.exposed_ns)} of it with the whole device idle",
        ),
        expected=Quantity(
            int(params["min_idle_share"] * active),
            "ns",
            f"idle below {params['min_idle_share']:.0%} of the stream's active window",
        ),
        impact_ns=int(s.exposed_ns),
        window_ns=active,
        sql=_idle_gaps.STREAM_SQL,
        sql_params={
            "run_id": run.run_id,
            **where,
            "kernel_wait_ns": params["kernel_wait_ns"],
            "all_phases": params["all_phases"],
            "short_gap_ns": params["short_gap_ns"],
        },
        sample_event_ids=[g["next_activity"]["event_id"] for g in largest],
        hypothesis=hypothesis,
        next_experiment=advised.text,
        acceptance=rerun(
            "trace of the same workload",
            f"idle_ns falls below {params['min_idle_share']:.0%} of the stream's active window (last_ns - first_ns) "
            f"and the dominant cause ({dominant}_ns) shrinks; G001 no longer reports this stream.",
        ),
        caveats=caveats,
        extra={
            "idle_share": round(share, 4),
            "exposed_share": round(exposed_share, 4),
            "idle_by_cause_ns": split,
            "idle_share_by_cause": {c: round(v / idle, 4) for c, v in split.items()},
            "dominant_cause": dominant,
            "gaps": int(s.gaps),
            "host_gaps": int(s.host_gaps),
            "host_gap_median_ns": s.host_gap_median_ns,
            "host_short_gap_ns": int(s.host_short_ns),
            "graph_launches": int(graph_launches),
            "largest_gaps": largest,
            "host_gap_sites": host_sites,
            "other_idle_streams": others,
            "active_window_ns": [int(s.first_ns), int(s.last_ns)],
            "left_out_ns": sum(w["dur_ns"] for w in left_out),
            "left_out": _phases.listed(left_out),
            "hta_equivalent": "get_idle_time_breakdown: host_wait = host, kernel_wait = kernel_wait, "
            "other = other_gpu + other",
        },
    )
