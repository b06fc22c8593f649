"""A trace that holds no steady state: all start-up, capture or profiler bookkeeping (P001 cold-profile).

## What it does
Reads `run_steady` and `run_phases`: a run has no steady state worth analysing when at least
`phase_min_left_out_share()` (90%) of its main device's active window (first to last GPU activity)
is warm-up, CUDA-graph capture or profiler bookkeeping, and fewer than two steady steps hold GPU
work. Warm-up is found by steps (`step_phases`) and inside runs without steps: GPU idle gaps that
lazy initialisation, allocator growth, first kernel launches (lazy module loading) or cuDNN
algorithm searches explain, and annotations that name a warm-up (`phase_evidence`). For such a run
the idle, launch, sync and communication rules (G001, G002, G003, H001, C001) report nothing, since
every number they would give describes start-up, and this rule gives one info finding instead: how
much was left out, by phase, the longest windows with their evidence, and how to profile the steady
state.

## Why it matters
A profile that starts with the first iteration measures CUDA context creation, module loading,
cuDNN benchmarking and allocator growth: seconds of GPU idle time that the next iteration does not
repeat. Read as steady state, it says "GPU idle 99%, caused by the host" and sends the engineer to
data loading or syncs that cost nothing once warm. A capture phase is the same: the captured kernels
do not run, so the GPU looks idle while the host records the graph.

## Example
`corpus/hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz`: one
AlexNet forward labelled `warmup` by its benchmark harness; 12.8 of the GPU's 12.9 s active window is
warm-up (a 10.0 s idle gap inside a 6.0 s `cudaFree` and a 3.1 s first `cudaLaunchKernel`, a 0.8 s
`cudaStreamCreateWithFlags`, 1.9 s of idle inside `cudaMalloc` calls). G001 with `all_phases` calls
the same window 99% host-caused idle.

## Options
None: the thresholds are the documented SQL macros `phase_min_left_out_share()`,
`phase_cold_call_factor()`, `phase_autotune_factor()` and `phase_gap_cover_share()` of the `run_phases`
views, which the other rules share.
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, rule
from tracekit.engine.toolkit import locality, one
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _phases
from tracekit.units import duration

# The evidence query: the left-out part of the main device's active window (first column, = observed).
RUN_SQL = """
SELECT active_ns - active_steady_ns AS left_out_active_ns, active_ns, active_steady_ns, warm_up_ns, capture_ns,
       profiler_ns, steps, steady_gpu_steps, all_cold
FROM run_steady WHERE run_id = $run_id
"""

ACTIVE_WINDOW_SQL = """
SELECT min(g.start_ns) AS start_ns, max(g.end_ns) AS end_ns
FROM gpu_busy g JOIN main_device m ON m.run_id = g.run_id AND m.device = g.device WHERE g.run_id = $run_id
"""

_TORCH_SCHEDULE = (
    "profile with `torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=2, active=3), "
    "on_trace_ready=...)` and call `prof.step()` once per iteration, so the first iterations run before "
    "recording starts (or run a few iterations before entering the profiler)"
)
_NSYS_RANGE = (
    "start recording after the warm-up iterations: call `cudaProfilerStart()` there and run "
    "`nsys profile --capture-range=cudaProfilerApi` (or an NVTX capture range)"
)


@rule(
    code="P001",
    name="cold-profile",
    title="The trace holds no steady state: start-up, CUDA-graph capture or profiler bookkeeping only",
    category="profile",
    requires=("gpu_activities",),
    params={},
    example=Example(("corpus/hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",)),
)
def check(con, params, ctx):
    for run in ctx.runs:
        if not _phases.skip_run(con, ctx, run.run_id, {"all_phases": False}):
            continue
        yield _finding(con, ctx, run)


def _advice(dominant: str, torch: bool) -> str:
    if dominant == "capture":
        return (
            "Profile the graph replays, not the capture: start the profiler after the CUDA graphs are captured "
            "(after `torch.cuda.graph(...)` / `CUDAGraph.capture_end()`, or once the serving engine has finished "
            "its start-up capture) and record several replays; then re-analyse."
        )
    if dominant == "profiler":
        return (
            "The profiler's own bookkeeping fills the window: record less per step (with_stack=False, "
            "record_shapes=False, fewer active steps) or fewer steps, and profile a longer steady stretch; "
            "then re-analyse."
        )
    how = _TORCH_SCHEDULE if torch else _NSYS_RANGE
    return f"Profile the steady state instead: {how}; then re-analyse the new trace."


def _finding(con, ctx, run) -> Finding:
    r = one(con, RUN_SQL, {"run_id": run.run_id})
    active = one(con, ACTIVE_WINDOW_SQL, {"run_id": run.run_id})
    left_out = _phases.left_out(con, ctx, run.run_id, active.start_ns, active.end_ns, {"all_phases": False})
    by_phase = {"warm-up": int(r.warm_up_ns), "capture": int(r.capture_ns), "profiler": int(r.profiler_ns)}
    dominant = max(by_phase, key=lambda p: (by_phase[p], p == "warm-up"))
    left = int(r.left_out_active_ns)
    share = left / r.active_ns
    torch = one(con, "SELECT EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = ?) AS found", [run.run_id]).found
    longest = "; ".join(f"{duration(w['dur_ns'])}: {w['reason']}" for w in left_out[:2])
    phases = ", ".join(f"{duration(ns)} {p}" for p, ns in sorted(by_phase.items(), key=lambda kv: -kv[1]) if ns)
    return Finding(
        rule="P001",
        severity="info",
        confidence=0.8,
        title=(
            f"No steady state to analyse: {share:.0%} of the GPU's active window ({duration(r.active_ns)}) is "
            f"{dominant}, {int(r.steady_gpu_steps)} steady step(s) with GPU work"
        ),
        locality=locality(run, window_ns=[int(active.start_ns), int(active.end_ns)]),
        observed=Quantity(
            left,
            "ns",
            f"left out of the main device's active window: {phases}; steady time in it {duration(r.active_steady_ns)}",
        ),
        expected=Quantity(
            0, "ns", "a profile of the steady state: repeated iterations after start-up, replays after capture"
        ),
        impact_ns=left,
        window_ns=int(r.active_ns),
        sql=RUN_SQL,
        sql_params={"run_id": run.run_id},
        hypothesis=(
            f"The trace records {dominant} rather than the workload's steady state (longest windows: {longest}); "
            "idle, launch and sync numbers from it would describe start-up, so G001, G002, G003, H001 and C001 "
            "report nothing on this run."
        ),
        next_experiment=_advice(dominant, torch),
        acceptance=rerun(
            "trace",
            "all_cold is false: less than 90% of the active window is left out, or at least two steady steps "
            "hold GPU work; the other rules then analyse the steady state.",
        ),
        caveats=[
            "Run the other rules with all_phases=true (e.g. --param G001.all_phases=true) to analyse this trace "
            "as it is, start-up included."
        ],
        extra={
            "left_out_active_ns": left,
            "left_out_share": round(share, 4),
            "left_out_by_phase_ns": by_phase,
            "steady_active_ns": int(r.active_steady_ns),
            "steps": int(r.steps),
            "steady_gpu_steps": int(r.steady_gpu_steps),
            "left_out": _phases.listed(left_out),
        },
    )
