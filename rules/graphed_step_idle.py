"""Steps that replay a CUDA graph and still leave the GPU mostly idle (G003 graphed-step-idle).

## What it does
Measures steps exactly as G002 launch-bound does (the same step windows, GPU busy share, launches
shorter than their call, tiny-kernel runs and short idle, over the launches made outside the
graph), but only the step groups whose steps replay a CUDA graph (`cudaGraphLaunch` inside them).
A group is reported on the same thresholds as G002: busy share below `max_busy_share`, at least
`min_kernels` eager launches, at least `min_short_share` of them shorter than their launch call or
in tiny-kernel runs, and at least `min_short_idle_share` of the GPU idle time in short gaps. The
finding names the eager ops around the replay that launched the most kernels, and their code path.

## Why it matters
A CUDA graph removes the launch cost of the work it captured, not of what the step still does
eagerly: input copies, sampling, a few ops left outside the capture, a host sync between replays.
When those are short kernels behind long launch calls, the GPU waits on the host around every
replay and the step stays host-bound although it "uses CUDA graphs". The fix is to extend the
capture or fuse what is left, not to capture again, which is why this is not G002's question.

## Example
The H200 decode loop with its decode step captured (`sample_traces/gpu_prefill_decode_cudagraph.json.gz`):
`decode_step` replays one graph per step (32 replays) and launches 6 eager kernels per step around
it, all shorter than their launch call; the GPU is busy 63% of the 15.5 ms of steps, and 30% of
its idle time there is in gaps under 100 us (most of the rest follows the per-step `.item()` sync
that H001 host-sync reports). That is over the default `max_busy_share` (0.5) and under
`min_short_idle_share` (0.5), so the rule is quiet there; with 0.7 and 0.3 it reports the step and
names the eager ops around the replay.

## Options
- `max_busy_share` (0.5): report groups whose GPU busy share is below this.
- `min_short_share` (0.5): and where at least this share of the eager launches are shorter than
  their launch call, or in tiny-kernel runs.
- `min_kernels` (50): and which made at least this many eager launches (kernels, copies, memsets).
- `min_short_idle_share` (0.5): and where at least this share of the GPU idle time inside the steps
  is in gaps up to `short_gap_ns`.
- `short_gap_ns` (100000): idle gaps up to this long count as per-launch host overhead.
- `min_share` (0.01): and whose GPU idle time inside the steps is at least this share of the run.
- `tiny_kernel_ns` (10000): a kernel under this GPU duration is tiny.
- `min_run` (8): consecutive tiny kernels on a stream that make a run.
- `critical_share` (0.3): severity critical when the GPU idle time inside the steps is at least this
  share of the run window.
- `warning_share` (0.1): severity warning from this share on; below it, info.
- `all_phases` (False): measure every phase of the run. By default warm-up, capture and profiler
  steps and windows (`run_phases`) are left out of the steps, and shares are of the run's steady
  time; the finding lists them in `extra.left_out`, and a run with no steady state at all is left
  to P001 cold-profile.
"""

from __future__ import annotations

from tracekit.engine import advice, quality
from tracekit.engine.registry import Example, rule
from tracekit.rules import _steps


@rule(
    code="G003",
    name="graphed-step-idle",
    title="Step replays a CUDA graph, yet eager launches around it keep the GPU mostly idle",
    category="gpu",
    requires=("launches",),
    params=_steps.PARAMS,
    example=Example(
        ("gpu_prefill_decode_cudagraph.json.gz",),
        params={"max_busy_share": 0.7, "min_short_idle_share": 0.3},
        note="the graphed decode step is busy 63% of its time, and only 30% of its idle time is in short gaps",
    ),
)
def check(con, params, ctx):
    for run, group in _steps.reported_groups(con, ctx, params, graphed=True):
        explained = _explain(group, ctx.workload(run.run_id))
        finding = _steps.finding("G003", run, ctx, params, group, explained, "Graph-replaying", "eager launches")
        yield quality.qualify(ctx, finding, (quality.GPU_TIMELINE, quality.LAUNCH_ATTRIBUTION))


def _explain(group: _steps.Group, context) -> tuple[str, str]:
    g = group.row
    return (
        f"{group.step_text} already replays a CUDA graph ({group.graphs_here} replays), but the GPU is still busy "
        f"only {g.busy_share:.0%} of the step time: {group.per_step:.0f} eager launches per step outside the graph "
        f"({g.launch_bound} of {group.launches} shorter than their launch call or in tiny runs) and the host work "
        f"between replays keep it waiting. {group.top_text}.",
        advice.graphed_step(context, group.where).text,
    )
