"""Ascend NPU ops that run on the AI CPU instead of the AI Core (K003 aicpu-ops).

## What it does
Per run and device of an Ascend NPU (`kernels.core`, the core its profiler says each task ran on),
sums the time of the tasks that ran on the AI CPU and groups them by op (the task's name without
its per-graph suffix) with their input dtypes where the profiler recorded them. It reports a device
whose AI CPU tasks take at least `min_compute_share` of its compute time, at least `min_ns` in all:
the ops, their calls and time, and the share of the window they hold. Severity follows the share
of the window.

## Why it matters
The AI CPU runs the ops (or the dtypes of an op) that have no AI Core kernel: a Cast from int32 to
uint64, a ReduceSum on an integer tensor, MindSpore's DropoutGenMask. Each such task is many times
slower than its AI Core form and serialises the stream: the AI Cores wait for it. msprof-analyze's
advisor has the same check ("AICPU Issues", ops over 20 us); this rule weighs the ops by the device
time they cost, so a rare microsecond op is not the headline.

## Example
The LLM training step of `msanalyze__advisor_backend_compute_advice__kernel_details.csv` (corpus,
kernel_details.csv alone): `trans_Cast_5` and `trans_Cast_18`, int32 inputs cast to uint64 on the AI
CPU, 7 calls and 0.79 ms, 1.6% of the NPU's compute time; 0.15% of the window: info. In the eager
step of `msanalyze__timeline_advice__trace_view.json`, `aclnnReduceSum_CastAiCpu_Cast` and
`aclnnCast_CastAiCpu_Cast` take 0.33 ms of 1.8 ms of compute (18%), 2.3% of the window.

## Checked on
The Ascend outputs of the corpus: the two above, the MindSpore 2-device job (DropoutGenMask on the
AI CPU, 1.0 ms per device, 14-15% of compute time, 2% of the window), and the db exports and msprof folders with no AI CPU
task (quiet). GPU traces have no `core` and are never read (tests/test_rule_aicpu_ops.py).

## Options
- `min_compute_share` (0.01): report a device whose AI CPU tasks take at least this share of its
  compute time.
- `min_ns` (100000): and at least this much time (100 us) in all.
- `critical_share` (0.2): critical when the AI CPU tasks take this share of the window.
- `warning_share` (0.05): warning from this share of the window, else info (every AI CPU op of the
  corpus holds 2.3% of its window at most).
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.units import duration, share

# Per device of a run: AI CPU task time against all compute (non-communication) kernel time. The
# evidence query.
DEVICES_SQL = """
SELECT device, count(*) FILTER (WHERE core = 'AI_CPU') AS tasks,
       coalesce(sum(dur_ns) FILTER (WHERE core = 'AI_CPU'), 0) AS aicpu_ns, sum(dur_ns) AS compute_ns
FROM kernels WHERE run_id = $run_id AND NOT is_communication AND dur_ns IS NOT NULL
GROUP BY device HAVING count(*) FILTER (WHERE core = 'AI_CPU') > 0 ORDER BY device
"""

# The AI CPU ops of one device: a task's name without the graph's numbering (`trans_Cast_5`,
# `DropoutGenMask-op232` are the ops `trans_Cast`, `DropoutGenMask`), with the input dtypes written.
OPS_SQL = """
SELECT regexp_replace(regexp_replace(name, '^.*/', ''), '([-_]op)?[-_]?[0-9]+$', '') AS op,
       count(*) AS calls, sum(dur_ns) AS ns, max(dur_ns) AS longest_ns,
       list(DISTINCT coalesce(args->>'Input Data Types', args->>'input data types')) FILTER (
           WHERE coalesce(args->>'Input Data Types', args->>'input data types') IS NOT NULL) AS dtypes,
       arg_max(name, dur_ns) AS example, arg_max(event_id, dur_ns) AS event_id
FROM kernels WHERE run_id = $run_id AND device = $device AND core = 'AI_CPU' AND dur_ns IS NOT NULL
GROUP BY 1 ORDER BY ns DESC, op
"""


@rule(
    code="K003",
    name="aicpu-ops",
    title="Ascend NPU ops that run on the AI CPU instead of the AI Core",
    category="kernels",
    requires=("kernels",),
    params={
        "min_compute_share": Param(0.01, "report AI CPU tasks taking this share of the device's compute", "ratio"),
        "min_ns": Param(100_000, "and at least this much time in all", "ns"),
        **share_params("the AI CPU tasks' share of the window", critical=0.2, warning=0.05),
    },
    example=Example(("corpus/ascend/msanalyze__advisor_backend_compute_advice__kernel_details.csv",)),
)
def check(con, params, ctx):
    for run in ctx.runs:
        if not ctx.on_npu(run.run_id):
            continue  # only Ascend profilers name a task's core
        for d in rows(con, DEVICES_SQL, {"run_id": run.run_id}):
            if d.aicpu_ns < params["min_ns"] or d.aicpu_ns < params["min_compute_share"] * d.compute_ns:
                continue
            ops = rows(con, OPS_SQL, {"run_id": run.run_id, "device": d.device})
            yield _finding(ctx, run, params, d, ops)


def _op_text(op) -> str:
    dtypes = f" on {', '.join(op.dtypes)} inputs" if op.dtypes else ""
    return f"`{op.op}` {op.calls}x{dtypes}, {duration(op.ns)}"


def _finding(ctx, run, params, d, ops) -> Finding:
    window = max(run.window_ns, 1)
    listed = "; ".join(_op_text(o) for o in ops[:4]) + (f"; and {len(ops) - 4} more ops" if len(ops) > 4 else "")
    worst = ops[0]
    swap = (
        "an AI Core form: cast the input to a dtype the op's AI Core kernel takes (int32/float16/float32 instead of "
        "int64/uint64 or bool; CANN's operator list gives each op's cores and dtypes) before the op, use the "
        "framework's AI Core variant of the op where its version has one, or write the step without the op"
    )
    return Finding(
        rule="K003",
        severity=by_share(d.aicpu_ns / window, params),
        confidence=0.8,
        title=(
            f"NPU {d.device}: {d.tasks} tasks run on the AI CPU, {duration(d.aicpu_ns)} "
            f"({share(d.aicpu_ns / d.compute_ns)} of its compute time, {share(d.aicpu_ns / window)} of the window): "
            f"{listed}"
        ),
        locality=locality(run, device=d.device, kernel=worst.example),
        observed=Quantity(int(d.aicpu_ns), "ns", f"AI CPU task time of {duration(d.compute_ns)} of compute tasks"),
        expected=Quantity(0, "ns", "ops with an AI Core kernel run on the AI Core"),
        impact_ns=int(d.aicpu_ns),
        window_ns=int(window),
        sql=DEVICES_SQL,
        sql_params={"run_id": run.run_id},
        sample_event_ids=[int(o.event_id) for o in ops[:5]],
        hypothesis=(
            f"These ops have no AI Core kernel for their inputs, so CANN runs them on the AI CPU, which is many "
            f"times slower and holds the stream meanwhile; the longest, `{worst.example}`, takes "
            f"{duration(worst.longest_ns)}."
        ),
        next_experiment=(
            f"Find the source of `{worst.op}` (the framework op above the task in the trace) and use {swap}; time the "
            "op alone on the NPU before and after."
        ),
        acceptance=rerun(
            "profile", f"`{worst.op}` is gone from the AI CPU tasks of NPU {d.device} (evidence SQL: aicpu_ns falls)."
        ),
        extra={
            "device": d.device,
            "aicpu_tasks": int(d.tasks),
            "aicpu_ns": int(d.aicpu_ns),
            "compute_ns": int(d.compute_ns),
            "ops": [
                {
                    "op": o.op,
                    "calls": int(o.calls),
                    "ns": int(o.ns),
                    "longest_ns": int(o.longest_ns),
                    "input_dtypes": list(o.dtypes or []),
                    "example": o.example,
                }
                for o in ops
            ],  # fmt: skip
        },
    )
