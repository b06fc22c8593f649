"""Identical kernels launched again and again inside one op (K002 repeated-launches).

## What it does
Groups every kernel launch (each kernel once, with the call that launched it: `first_launches`) by
the op occurrence that issued it (the nearest `cpu_op` above the runtime call in the call tree, else
the one `cpu_op` sharing its `External id`) and finds launches of the same kernel with the same
launch arguments Kineto records (grid, block, shared memory, registers per thread) more than once
inside one occurrence. It reports, per run, op, input shapes, kernel and launch configuration, the
GPU time of all but one copy (the longest is kept, so the number is a lower bound of what one
launch would save), summed over the occurrences that repeat, and the share of those occurrences'
GPU time the repeats take.

It stays quiet where identical launches are how the work is done: CUDA-graph replays (a
`cudaGraphLaunch` matches every kernel of the graph, so a call that matched more than one GPU
activity is skipped, as are kernels with a `graph id`), op families that chunk a tensor list into
identical launches (`_foreach_*`, `multi_tensor_apply`, fused optimizers: `skip_ops`), library
primitives that make one identical launch per pass or per tensor (CUB radix-sort passes and scans,
cuDNN layout transforms, FFT stages: `skip_kernels`), and warm-up searches (cuDNN benchmark mode,
Triton autotuning) that repeat kernels only the first time an op meets a shape: a site must repeat
in at least `min_occurrences` occurrences and in at least `min_occurrence_share` of the
occurrences of the op with those input shapes.

## Why it matters
A kernel launched twice with the same configuration from the same op call, every step, often
recomputes the same result: a cache (rotary tables, masks, a dequantized weight) rebuilt inside a
custom op, a `.contiguous()`/cast applied per use instead of once, a loop whose body does not
depend on the loop variable. Each extra copy costs its full GPU time plus a launch. Kineto does
not record kernel arguments, so identical launch configurations are a strong hint, not proof,
that the work is the same: the finding names the op and the shapes to check.

## Example
None of the project's H200 traces (eager, CUDA-graph, TP=2) or the public corpus traces
has a steady-state repeat outside the exempt families; the repeats they do have are CUB radix-sort
passes in fbgemm's `SplitLookupFunction` backward (3-4 `DeviceRadixSortOnesweepKernel` launches
per call), cuDNN `nchwToNhwcKernel` per tensor in `aten::convolution_backward`, and cuDNN
benchmark-mode algorithm searches on the first convolution of each shape in a ResNet-50 run. A
custom op `mylib::rope_cache` with inputs `[[4096, 64]]` that launches `rope_table_kernel` grid
[64,1,1] block [256,1,1] four times per call on every step reports three of the four copies: 75%
of the op's GPU time.

## Options
- `min_occurrences` (3): the op must repeat the kernel in at least this many occurrences (steady
  state, not a one-off warm-up).
- `min_occurrence_share` (0.5): ... and in at least this share of the occurrences of the op with
  the same input shapes (warm-up searches repeat only in the first).
- `min_share` (0.005): report sites whose repeat GPU time is at least this share of the run window.
- `skip_ops` (`_foreach,multi_tensor,_fused_adam,_fused_sgd,fused_adam,fused_sgd`): comma-separated,
  case-insensitive substrings of op names whose identical launches are chunking, not repetition.
- `skip_kernels` (`multi_tensor_apply,RadixSort,DeviceScan,DeviceReduce,DeviceSegmented,DeviceSelect,DeviceHistogram,nchwToNhwc,nhwcToNchw,fft`):
  comma-separated, case-insensitive substrings of kernel names that run once per pass or per
  tensor with the same configuration.
- `critical_share` (0.1): severity critical when a site's repeat GPU time is at least this share of
  the run window.
- `warning_share` (0.02): severity warning from this share on; below it, info.
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _op_launches
from tracekit.units import duration


def _patterns(text: str) -> list[str]:
    return [p.strip().lower() for p in str(text).split(",") if p.strip()]


def _skipped(name: str, patterns: list[str]) -> bool:
    low = (name or "").lower()
    return any(p in low for p in patterns)


@rule(
    code="K002",
    name="repeated-launches",
    title="Identical kernel launched repeatedly inside one op call",
    category="kernel",
    requires=("kernels", "launches", "cpu_ops"),
    params={
        "min_occurrences": Param(3, "op occurrences that must repeat the kernel (steady state)", "occurrences"),
        "min_occurrence_share": Param(
            0.5, "share of the op's occurrences with these input shapes that must repeat it", "ratio"
        ),
        "min_share": Param(0.005, "smallest repeat GPU time, as a share of the run window, to report", "ratio"),
        "skip_ops": Param(
            "_foreach,multi_tensor,_fused_adam,_fused_sgd,fused_adam,fused_sgd",
            "comma-separated op name substrings whose identical launches are chunking",
            "patterns",
        ),
        "skip_kernels": Param(
            "multi_tensor_apply,RadixSort,DeviceScan,DeviceReduce,DeviceSegmented,DeviceSelect,DeviceHistogram,"
            "nchwToNhwc,nhwcToNchw,fft",
            "comma-separated kernel name substrings that launch once per pass or per tensor",
            "patterns",
        ),
        **share_params("the site's repeat GPU time over the run window", critical=0.10, warning=0.02),
    },
    example=Example(
        ("corpus/hta__trace_diff__control.json.gz",),
        params={"skip_kernels": "", "min_share": 0.0},
        note="no bundled or corpus trace repeats a kernel outside the exempt families; with the CUB "
        "radix-sort passes of a corpus training trace no longer exempt, and no share threshold, it reports them",
    ),
)
def check(con, params, ctx):
    skip_ops = _patterns(params["skip_ops"])
    skip_kernels = _patterns(params["skip_kernels"])
    for run in ctx.runs:
        window = run.window_ns
        if window <= 0:
            continue
        for site in _sites(con, run, params):
            if not (_skipped(site.op, skip_ops) or _skipped(site.kernel, skip_kernels)):
                yield _finding(run, ctx, params, site)


def _sites(con, run, params) -> list:
    table = _op_launches.GROUPS_TABLE
    con.execute(f"DROP TABLE IF EXISTS {table}")
    con.execute(f"CREATE TEMP TABLE {table} AS {_op_launches.GROUPS_SQL}", {"run_id": run.run_id})
    try:
        return rows(
            con,
            _op_launches.SITES_SQL,
            {
                "min_occurrences": params["min_occurrences"],
                "min_occurrence_share": params["min_occurrence_share"],
                "min_share": params["min_share"],
                "window": run.window_ns,
            },
        )
    finally:
        con.execute(f"DROP TABLE IF EXISTS {table}")


def _only(values: list):
    return values[0] if len(values) == 1 else None


def _finding(run, ctx, params, v) -> Finding:
    op, kernel, shapes, repeat_ns = v.op, v.kernel, v.input_shapes, int(v.repeat_ns)
    op_share = repeat_ns / v.op_gpu_ns if v.op_gpu_ns else 0.0
    pid, tid = _only(v.pids), _only(v.tids)
    launch = {"grid": v.grid, "block": v.block}
    if v.smem is not None:
        launch["shared_memory"] = int(v.smem)
    if v.regs is not None:
        launch["registers_per_thread"] = int(v.regs)
    short = kernel if len(kernel) <= 80 else kernel[:77] + "..."
    per_call = v.launches / v.occurrences
    return Finding(
        rule="K002",
        severity=by_share(repeat_ns / run.window_ns, params),
        confidence=0.6,
        title=(
            f"{op} launches {short} {per_call:.1f}x per call with identical grid {v.grid} block {v.block} "
            f"in {v.occurrences} of {v.all_occurrences} calls: {duration(repeat_ns)} of repeats "
            f"({op_share:.0%} of those calls' GPU time)"
        ),
        locality=locality(
            run,
            **ctx.thread(run.run_id, pid, tid),
            device=_only(v.devices),
            stream=_only(v.streams),
            op=op,
            input_shapes=shapes,
            kernel=kernel,
            code_path=ctx.code_path(v.worst_op),
            launch=launch,
        ),
        observed=Quantity(
            repeat_ns,
            "ns",
            f"GPU time of all but the longest copy of {kernel} in each of {v.occurrences} calls of {op} that launched "
            f"it more than once ({v.repeated} extra launches of {v.launches}, up to {v.max_per_call} per call)",
        ),
        expected=Quantity(0, "ns", "one launch per op call when its inputs and launch configuration are the same"),
        impact_ns=repeat_ns,
        window_ns=run.window_ns,
        sql=_op_launches.SITE_SQL,
        sql_params={
            "run_id": run.run_id,
            "op": op,
            "input_shapes": shapes,
            "kernel": kernel,
            "grid": v.grid,
            "block": v.block,
            "shared_memory": v.smem,
            "registers_per_thread": v.regs,
        },
        sample_event_ids=list(v.worst_ids)[:5],
        hypothesis=(
            f"Each call of {op} with inputs {shapes or '(shapes not recorded)'} launches {short} "
            f"{per_call:.1f} times with the same configuration; if the launches read the same data they compute "
            "the same result (a cache rebuilt per call, a per-use cast or .contiguous(), a loop body that does "
            "not depend on the loop variable), and all but one are wasted."
        ),
        next_experiment=(
            f"Microbenchmark {op} alone with inputs {shapes or '(record_shapes=True to get them)'} under "
            "torch.profiler and count launches of the kernel per call; read the op's source (or the Python frames "
            "in code_path) for a launch whose inputs do not change between iterations or steps, then cache or "
            "hoist it and re-profile."
        ),
        acceptance=rerun(
            "trace",
            "repeated_launches (and repeat_ns) at this site drop to 0, and the op's GPU time per call falls by "
            "about the repeat time.",
        ),
        caveats=[
            "Kineto does not record kernel arguments: launches with the same configuration may still work on "
            "different data (e.g. one launch per tensor of a list); confirm before removing any.",
        ],
        extra={
            "occurrences_with_repeats": int(v.occurrences),
            "occurrences_of_op_with_these_shapes": int(v.all_occurrences),
            "repeated_launches": int(v.repeated),
            "launches": int(v.launches),
            "max_launches_per_call": int(v.max_per_call),
            "repeat_share_of_op_gpu_time": round(op_share, 4),
            "first_call_ns": int(v.first_call_ns),
            "last_call_ns": int(v.last_call_ns),
        },
    )
