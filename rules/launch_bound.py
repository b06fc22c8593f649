"""Launch-bound steps: the host cannot issue kernels as fast as the GPU runs them (G002 launch-bound).

## What it does
Splits each run into steps by the step rule every part of tracekit shares (the `step_windows` view):
`ProfilerStep#N` annotations (or ops, in old traces) when present, else the most frequent top-level
user annotation that occurs at least twice (e.g. `decode_step`), else the whole run window; steps come
from one thread and never overlap. A run's steps on one device form a group. For each group whose
steps replay no CUDA graph, it measures, over the kernels, copies and memsets launched inside the steps:

- the GPU busy share: the union of all GPU activity on the device inside the step windows, over
  the steps' total time;
- kernels shorter than their launch: GPU duration below the duration of the runtime call that
  launched it (HTA `get_cuda_kernel_launch_stats` "short kernels");
- kernels in runs of tiny kernels: at least `min_run` consecutive kernels on a stream, each shorter
  than `tiny_kernel_ns`;
- short idle: the device's idle time inside the steps that falls in gaps between activities of at
  most `short_gap_ns`, i.e. per-launch host overhead rather than one long stretch of other host
  work (data loading, a sync, start-up);
- HTA's outliers: launch calls over 50 us and launch delays (GPU start - end of the call) over 100 us.

A group is reported when its busy share is below `max_busy_share`, it launched at least
`min_kernels` times, at least `min_short_share` of its launches are shorter than their launch
call or sit in tiny-kernel runs, and at least `min_short_idle_share` of its GPU idle time is short
idle. The finding names the step, the ops (top-level `cpu_op` above
the launch calls, with input shapes) that launched the most kernels and their Python code path,
and whether the run replays CUDA graphs (`cudaGraphLaunch`) outside these steps.

One question: does the host's per-launch cost set the pace of an eager step? Runs of tiny kernels
are a second sign of the same thing (each costs a launch and leaves the GPU dry) and count toward
the same share, not a question of their own. Steps that already replay a CUDA graph ask another
question, what is left outside the graph, with another fix: G003 graphed-step-idle answers it
from the same measurement.

## Why it matters
When a kernel runs for 3 us but its launch (Python, dispatcher, `cudaLaunchKernel`) costs 10-60 us
of host time, the GPU runs dry after every kernel: throughput is set by the CPU, and a faster GPU
or a bigger kernel does not help. Typical for small-batch inference (LLM decode), small models and
optimizer steps over many small tensors. CUDA graphs replay a captured loop body with one launch;
kernel fusion (torch.compile) cuts the number of launches.

## Example
`decode_step` (32 steps, 199 ms) on GPU 0: busy 4.8% of the step time; 2983 of 3040 launches run
shorter than their launch call (median kernel 2.5 us vs launch 8.5 us), 70% of the idle time is in
gaps under 100 us, and `aten::linear` in `nn.Module: Linear_*` launched the most kernels.
Capturing the decode step in a `torch.cuda.CUDAGraph` raised the busy share to 63% and the step
time fell 13x.

## Options
- `max_busy_share` (0.5): report groups whose GPU busy share is below this.
- `min_short_share` (0.5): and where at least this share of launches are shorter than their launch
  call, or in tiny-kernel runs.
- `min_kernels` (50): and which launched at least this many kernels, copies or memsets.
- `min_short_idle_share` (0.5): and where at least this share of the GPU idle time inside the steps
  is in gaps up to `short_gap_ns` (else G001 gpu-idle names the long host gaps instead).
- `short_gap_ns` (100000): idle gaps up to this long count as per-launch host overhead (100 us, a
  few ops' worth of eager host time).
- `min_share` (0.01): and whose GPU idle time inside the steps is at least this share of the run.
- `tiny_kernel_ns` (10000): a kernel under this GPU duration is tiny (10 us, about one launch).
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
from tracekit.engine.phrases import code_path_hint
from tracekit.engine.registry import Example, rule
from tracekit.rules import _steps
from tracekit.units import duration


@rule(
    code="G002",
    name="launch-bound",
    title="Launch-bound step: kernels shorter than their launch, GPU mostly idle",
    category="gpu",
    requires=("launches",),
    params=_steps.PARAMS,
    example=Example(("gpu_prefill_decode_eager.json.gz",)),
)
def check(con, params, ctx):
    for run, group in _steps.reported_groups(con, ctx, params, graphed=False):
        explained = _explain(group, params, ctx.workload(run.run_id))
        finding = _steps.finding("G002", run, ctx, params, group, explained, "Launch-bound")
        yield quality.qualify(ctx, finding, (quality.GPU_TIMELINE, quality.LAUNCH_ATTRIBUTION))


def _explain(group: _steps.Group, params, context) -> tuple[str, str]:
    """(hypothesis, next experiment): why the step is launch-bound and which fix fits its body."""
    g, launches, step = group.row, group.launches, group.step_text
    kernel_vs_call = f"median kernel {duration(g.median_gpu_ns)} vs call {duration(g.median_launch_ns)}"
    if group.run_graphs:
        return (
            f"{step} runs eagerly although the run uses CUDA graphs elsewhere: GPU busy {g.busy_share:.0%} of the "
            f"step time, {g.shorter} of {launches} launches run shorter than their launch call ({kernel_vs_call}). "
            f"{group.top_text}.",
            advice.launch_bound_step(context, "partly_graphed").text,
        )
    if group.repeated and group.static_shapes:
        return (
            f"{step} is launch-bound: GPU busy {g.busy_share:.0%} of the step time; {g.shorter} of {launches} "
            f"launches run shorter than their launch call ({kernel_vs_call}), {g.tiny_run} sit in runs of >= "
            f"{params['min_run']} tiny kernels and {g.short_idle_share:.0%} of the GPU idle time is in gaps under "
            f"{duration(params['short_gap_ns'])}: the host's per-launch cost sets the pace. Every step issues the "
            f"same {group.per_step:.0f} launches with the same shapes: a CUDA graph fits. {group.top_text}.",
            advice.launch_bound_step(context, "static", code_path_hint(group.where)).text,
        )
    if group.repeated:
        return (
            f"{step} is launch-bound: GPU busy {g.busy_share:.0%}; {g.shorter} of {launches} launches run shorter "
            f"than their launch call. Steps repeat the same {group.per_step:.0f} launches but input shapes change "
            f"between steps ({group.signatures} op/shape signatures vs {group.step_signatures} per step). "
            f"{group.top_text}.",
            advice.launch_bound_step(context, "dynamic").text,
        )
    return (
        f"{step} is launch-bound: GPU busy {g.busy_share:.0%}; {g.shorter} of {launches} launches run shorter than "
        f"their launch call ({kernel_vs_call}). The step is not a repeated identical body, so a CUDA graph fits "
        f"less well. {group.top_text}.",
        advice.launch_bound_step(context, "irregular", code_path_hint(group.where)).text,
    )
