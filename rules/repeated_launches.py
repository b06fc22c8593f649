"""Identical kernels launched again and again inside one op call (K002 repeated-launches).

## What it does
Groups every kernel launch (each kernel once, with the call that launched it: `first_launches`) by
the op call it belongs to and the inner op call that launched it. The inner op is the nearest
`cpu_op` above the runtime call in the call tree (else the one `cpu_op` sharing its `External id`);
the scope is the outermost library op above it, a dispatcher op `namespace::name` outside PyTorch's
own namespaces (`framework_namespaces`: a `torch.library` custom op, fbgemm, vLLM...), else the
inner op itself. A custom op that rebuilds a table does it through aten ops that each launch once,
so only the custom op's call sees the repeat. It finds, inside one scope call, launches of the same
kernel with the launch arguments Kineto records (grid, block, shared memory, registers per thread)
from inner op calls with the same name, input dims, strides, types and scalar arguments (as far as
`record_shapes` recorded them), more than once. One finding per run, op and input shapes reports
the repeated launches, the copies per call and the GPU time of all but one copy of each (the
longest is kept, so the number is a lower bound of what one launch would save), summed over the
calls that repeat, and the share of those calls' GPU time the repeats take.

It stays quiet where identical launches are how the work is done: CUDA-graph replays (a
`cudaGraphLaunch` matches every kernel of the graph, so a call that matched more than one GPU
activity is skipped, as are kernels with a `graph id`), ops of PyTorch itself and compiled regions
(an `aten::lstm` looping over time steps, an autograd node, `CompiledFunction`: never a scope, so
torch.compile's repeated layers, each under its own kernel's op, count once per layer), op families
that chunk a tensor list into identical launches (`_foreach_*`, `multi_tensor_apply`, fused
optimizers: `skip_ops`, matched on the op and the inner op), library primitives that make one
identical launch per pass or per tensor (CUB radix-sort passes and scans, cuDNN layout transforms,
FFT stages: `skip_kernels`), loops over slices or offsets (inside the library op, a call made a
whole number of times per copy with scalar arguments that change between copies, such as `x[g]`,
a slice offset or the chunks of a split, or with a 0-dim tensor whose value the trace does not
record, such as the Python number of `positions + g * n`: the copies may read different data), and
warm-up searches (cuDNN benchmark mode, Triton autotuning) that repeat kernels only the first time
an op meets a shape: a repeat must occur in at least `min_occurrences` calls and in at least
`min_occurrence_share` of the calls of the op with those input shapes.

## Why it matters
A kernel launched twice with the same configuration on equal inputs from the same op call, every
step, often recomputes the same result: a cache (rotary tables, masks, a dequantized weight)
rebuilt inside a custom op, a `.contiguous()`/cast applied per use instead of once, a loop whose
body does not depend on the loop variable. Each extra copy costs its full GPU time plus a launch.
Kineto records neither kernel arguments nor tensor addresses, so equal shapes and launch
configurations are a strong hint, not proof, that the work is the same (a loop over equal-sized
layers or experts whose weights come in as Python objects looks the same): the finding names the
op, the inner ops and the shapes to check.

## Example
`sample_traces/repeated_rope_cache.json.gz` (H200, `scripts/make_repeated_launch_trace.py`): the
custom op `mylib::rope_cache_r4` builds the same cos/sin table for 2048 positions four times per
call (`positions.float()`, `torch.outer`, `cos`, `sin`, `cat`), then a 64x4096x4096 bf16 matmul
runs, for 8 decode steps. Each of the five aten ops launches once per iteration, so the nearest op
never repeats; the custom op's call launches each kernel 4x: 15 extra launches per call, about 73%
of the op's GPU time and half the run's. The GPU is idle most of this launch-bound run, so the
repeats are 0.5% of the window: info. Its healthy twin `single_rope_cache.json.gz` (one table per
call) is quiet.

## Checked on
A matrix of H200 runs (tests/data/launch_matrix, `scripts/make_repeated_launch_matrix.py`, 8 decode
steps each): the table rebuilt 2x per call, 4x without record_shapes, and 4x per call in a
torch.compile'd 4-layer model (Inductor merges the layers' equal calls of the op into one per step)
are reported with their copies per call; one table per head group at `positions + g * 2048`, from
`positions[g]` or from the chunks of `torch.chunk`, and the compiled model building its table once
per call (its Triton and GEMM kernels 4x per step, once per layer) are quiet. Also the
project's H200 traces (eager and CUDA-graph decode, TP=2, GIL and overlap matrices, transfer,
pageable-copy and warm-up runs) and the public Kineto corpus: torch.compile training runs
(`CompiledFunction` regions), fbgemm embedding training with CUB radix-sort passes in
`SplitLookupFunction` backward (3-4 `DeviceRadixSortOnesweepKernel` per call) and scans in
`fbgemm::permute_*`, cuDNN `nchwToNhwcKernel` per tensor in `aten::convolution_backward` and
benchmark-mode searches on the first convolution of each shape in ResNet-50 runs: none reported,
at any `min_share`. Not told apart: a loop over equal-sized tensors handed in as Python objects
(layers' weights, experts) with nothing in the trace that varies between copies.

## Options
- `min_occurrences` (3): the op must repeat the kernel in at least this many calls (steady state,
  not a one-off warm-up).
- `min_occurrence_share` (0.5): ... and in at least this share of the calls of the op with the same
  input shapes (warm-up searches repeat only in the first).
- `min_share` (0.005): report ops whose repeat GPU time is at least this share of the run's kernel
  time (summed over streams). Not of the window: a launch-bound decode leaves the GPU idle most of
  it, so a repeat that is a quarter of the GPU work (the 2x rebuild of the matrix) is under 0.5% of
  the window. No op outside the exempt families repeats in the corpus or the project's traces at
  any share, so the floor only keeps trivia out.
- `framework_namespaces` (`aten,prims,autograd,torch,profiler,c10d,_c10d_functional,c10d_functional,quantized,inductor`):
  comma-separated op namespaces of PyTorch itself: their ops are the framework's implementation,
  not code a user can hoist a computation out of, so they never scope the ops they call.
- `skip_ops` (`_foreach,multi_tensor,_fused_adam,_fused_sgd,fused_adam,fused_sgd`): comma-separated,
  case-insensitive substrings of op names whose identical launches are chunking, not repetition.
- `skip_kernels` (`multi_tensor_apply,RadixSort,DeviceScan,DeviceReduce,DeviceSegmented,DeviceSelect,DeviceHistogram,nchwToNhwc,nhwcToNchw,fft`):
  comma-separated, case-insensitive substrings of kernel names that run once per pass or per
  tensor with the same configuration.
- `critical_share` (0.1): severity critical when an op's repeat GPU time is at least this share of
  the run window.
- `warning_share` (0.02): severity warning from this share on; below it, info.
"""

from __future__ import annotations

from tracekit.engine.phrases import plural, rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _op_launches
from tracekit.units import duration

# The options that decide which repeats count (the evidence query takes them as parameters too).
_SITE_PARAMS = ("skip_ops", "skip_kernels", "min_occurrences", "min_occurrence_share")


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
        "min_share": Param(
            0.005, "smallest repeat GPU time of an op, as a share of the run's kernel time, to report", "ratio"
        ),
        "framework_namespaces": Param(
            "aten,prims,autograd,torch,profiler,c10d,_c10d_functional,c10d_functional,quantized,inductor",
            "comma-separated op namespaces of PyTorch itself, whose ops never scope the ops they call",
            "namespaces",
        ),
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
        **share_params("the op's repeat GPU time over the run window", critical=0.10, warning=0.02),
    },
    example=Example(("repeated_rope_cache.json.gz",)),
)
def check(con, params, ctx):
    runs = [run for run in ctx.runs if run.window_ns > 0]
    if not runs:
        return
    table = _op_launches.GROUPS_TABLE
    # every run's groups, then every run's repeats, one statement each: their planning is paid once
    con.execute(f"DROP TABLE IF EXISTS {table}")
    con.execute(
        f"CREATE TEMP TABLE {table} AS {_op_launches.GROUPS_OF_RUNS_SQL}",
        {"run_ids": [run.run_id for run in runs], "framework_namespaces": params["framework_namespaces"]},
    )
    try:
        found = rows(con, _op_launches.REPEATS_SQL, {**_site_params(params), "min_share": params["min_share"]})
    finally:
        con.execute(f"DROP TABLE IF EXISTS {table}")
    by_id = {run.run_id: run for run in runs}
    for repeat in found:
        yield _finding(by_id[repeat.run_id], ctx, params, repeat)


def _site_params(params) -> dict:
    return {name: params[name] for name in _SITE_PARAMS}


def _only(values: list):
    return values[0] if len(values) == 1 else None


def _short(kernel: str) -> str:
    return kernel if len(kernel) <= 80 else kernel[:77] + "..."


def _site(site: dict) -> dict:
    """One repeated launch of the finding's `extra.sites`: the inner op call, the kernel, its
    configuration, the copies per call and the GPU time of the extra copies."""
    return {
        "inner_op": site["inner_op"],
        "inner_input_shapes": site["inner_shapes"],
        "kernel": site["kernel"],
        "grid": site["grid"],
        "block": site["block"],
        "shared_memory": None if site["smem"] is None else int(site["smem"]),
        "registers_per_thread": None if site["regs"] is None else int(site["regs"]),
        "calls_with_repeats": int(site["occurrences"]),
        "copies_per_call": round(site["launches"] / site["occurrences"], 2),
        "repeat_ns": int(site["repeat_ns"]),
    }


def _finding(run, ctx, params, v) -> Finding:
    op, shapes, repeat_ns = v.op, v.input_shapes, int(v.repeat_ns)
    sites = [_site(s) for s in v.sites]
    top = sites[0]
    op_share = repeat_ns / v.op_gpu_ns if v.op_gpu_ns else 0.0
    pid, tid = _only(v.pids), _only(v.tids)
    launch = {"grid": top["grid"], "block": top["block"]}
    for key in ("shared_memory", "registers_per_thread"):
        if top[key] is not None:
            launch[key] = top[key]
    copies = top["copies_per_call"]
    # the inner op calls in the order the op makes them: the body of the loop that repeats
    body = list(dict.fromkeys(s["inner_op"] for s in sorted(v.sites, key=lambda s: s["inner_offset_ns"])))
    body = [name for name in body if name != op]
    what = f"{', '.join(body)} ({plural(len(sites), 'kernel')})" if body else _short(top["kernel"])
    others = f" and {plural(len(sites) - 1, 'other kernel')}" if len(sites) > 1 else ""
    shapes_text = shapes or "(shapes not recorded)"
    return Finding(
        rule="K002",
        severity=by_share(repeat_ns / run.window_ns, params),
        # without record_shapes the inner calls are told apart by name alone and no loop index shows
        confidence=0.6 if shapes else 0.4,
        title=(
            f"{op} repeats {what} {copies:g}x per call with identical inputs and launch configuration in "
            f"{v.occurrences} of {v.all_occurrences} calls: {duration(repeat_ns)} of extra copies "
            f"({op_share:.0%} of those calls' GPU time)"
        ),
        locality=locality(
            run,
            **ctx.thread(run.run_id, pid, tid),
            device=_only(v.devices),
            stream=_only(v.streams),
            op=op,
            input_shapes=shapes,
            kernel=top["kernel"],
            code_path=ctx.code_path(v.worst_op),
            launch=launch,
        ),
        observed=Quantity(
            repeat_ns,
            "ns",
            f"GPU time of all but the longest copy of each repeated launch in {v.occurrences} calls of {op}: "
            f"{top['inner_op']} launching {_short(top['kernel'])} grid {top['grid']} block {top['block']} "
            f"{copies:g}x per call{others} ({v.repeated} extra launches of {v.launches})",
        ),
        expected=Quantity(0, "ns", "one launch per op call when its inputs and launch configuration are the same"),
        impact_ns=repeat_ns,
        window_ns=run.window_ns,
        sql=_op_launches.REPEAT_SQL,
        sql_params={
            "run_id": run.run_id,
            "framework_namespaces": params["framework_namespaces"],
            **_site_params(params),
            "op": op,
            "input_shapes": shapes,
        },
        sample_event_ids=list(v.worst_ids)[:5],
        hypothesis=(
            f"Each call of {op} with inputs {shapes_text} launches {what} {copies:g} times, each time from an "
            "op call with the same input shapes, strides and scalar arguments and with the same launch "
            "configuration; if the copies read the same data they compute the same result (a table or cache "
            "rebuilt per call or per loop iteration, a per-use cast or .contiguous(), a loop body that does not "
            "depend on the loop variable), and all but one are wasted."
        ),
        next_experiment=(
            f"Read {op}'s source (or the Python frames in code_path) for the code that runs "
            f"{', '.join(body) if body else 'the launch'} {copies:g} times per call: compute the result once and "
            "reuse it (hoist it out of the loop), or cache it across calls when its inputs do not change between "
            "steps (a rotary cos/sin table depends only on the positions and the frequencies); re-profile with "
            "record_shapes=True and check that the kernel launches once per call."
        ),
        acceptance=rerun(
            "trace",
            "repeated_launches (and repeat_ns) of this op drop to 0, and the op's GPU time per call falls by "
            "about the repeat time.",
        ),
        caveats=[
            "Kineto records neither kernel arguments nor tensor addresses: copies with the same shapes and "
            "launch configuration may still work on different data (one launch per chunk, layer or expert of "
            "equal size); confirm before removing any.",
            *(
                []
                if shapes
                else ["record_shapes was off: inner calls are matched by name only, and loop indices do not show."]
            ),
        ],
        extra={
            "occurrences_with_repeats": int(v.occurrences),
            "occurrences_of_op_with_these_shapes": int(v.all_occurrences),
            "copies_per_call": copies,
            "repeated_launches": int(v.repeated),
            "launches": int(v.launches),
            "max_launches_per_call": int(v.max_per_call),
            "repeat_share_of_op_gpu_time": round(op_share, 4),
            "first_call_ns": int(v.first_call_ns),
            "last_call_ns": int(v.last_call_ns),
            "sites": sites,
        },
    )
