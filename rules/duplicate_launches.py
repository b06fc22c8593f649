"""Identical kernels launched again and again inside one op (K002 repeated-launches).

## What it does
Groups every kernel launch by the op occurrence that issued it (the nearest `cpu_op` above the
runtime call in the call tree, else the one `cpu_op` sharing its `External id`) and finds launches
of the same kernel with the same launch arguments Kineto records (grid, block, shared memory,
registers per thread) more than once inside one occurrence. It reports, per run, op, input shapes,
kernel and launch configuration, the GPU time of all but one copy (the longest is kept, so the
number is a lower bound of what one launch would save), summed over the occurrences that repeat,
and the share of those occurrences' GPU time the repeats take.

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
"""

from __future__ import annotations

from tracekit.engine.registry import Param, rule
from tracekit.findings.model import Finding, Quantity

# One row per (op occurrence, kernel, launch configuration): how often the op launched it. Launches
# are single-kernel runtime calls outside CUDA graphs; the op is the nearest cpu_op ancestor of the
# call (ProfilerStep#N is a step, not an op), else the only cpu_op with the call's External id.
GROUPS_SQL = """
WITH RECURSIVE calls AS (
    SELECT runtime_event_id, any_value(runtime_name) AS runtime_name, any_value(external_id) AS external_id,
           count(*) AS gpu_work
    FROM launches WHERE run_id = $run_id GROUP BY runtime_event_id
), nodes AS MATERIALIZED (
    -- the host call tree of this run, read once: every step of the walk below joins this, not event_rows
    SELECT rowid AS id, parent_id, kind = 'cpu_op' AND name NOT LIKE 'ProfilerStep#%' AS is_op
    FROM event_rows WHERE run_id = $run_id AND ph = 'X' AND pid IS NOT NULL AND kind NOT IN (
        'kernel', 'gpu_memcpy', 'gpu_memset', 'gpu_user_annotation', 'python_function')
), up(runtime_event_id, cur, hops) AS (
    SELECT c.runtime_event_id, r.parent_id, 0 FROM calls c JOIN nodes r ON r.id = c.runtime_event_id
    UNION ALL
    SELECT u.runtime_event_id, p.parent_id, u.hops + 1 FROM up u JOIN nodes p ON p.id = u.cur
    WHERE NOT p.is_op AND u.hops < 64
), by_tree AS (
    SELECT u.runtime_event_id, u.cur AS op_id FROM up u JOIN nodes p ON p.id = u.cur WHERE p.is_op
), by_external AS (
    SELECT external_id, min(event_id) AS op_id FROM cpu_ops
    WHERE run_id = $run_id AND external_id > 0 AND name NOT LIKE 'ProfilerStep#%'
    GROUP BY external_id HAVING count(*) = 1
), work AS (
    SELECT l.gpu_event_id, l.gpu_kind, l.gpu_dur_ns, coalesce(t.op_id, x.op_id) AS op_id
    FROM launches l JOIN calls c ON c.runtime_event_id = l.runtime_event_id
    LEFT JOIN by_tree t ON t.runtime_event_id = l.runtime_event_id
    LEFT JOIN by_external x ON x.external_id = c.external_id
    WHERE l.run_id = $run_id AND c.gpu_work = 1 AND NOT regexp_matches(c.runtime_name, 'GraphLaunch')
), occurrence AS (
    SELECT op_id, sum(gpu_dur_ns) AS op_gpu_ns FROM work WHERE op_id IS NOT NULL GROUP BY op_id
)
SELECT w.op_id, o.name AS op, o.input_dims AS input_shapes, o.pid, o.tid, o.ts_ns AS op_ts_ns,
       k.name AS kernel, k.grid, k.block, k.shared_memory, k.registers_per_thread, k.device, k.stream,
       count(*) AS launches, sum(k.dur_ns) AS kernel_ns, sum(k.dur_ns) - max(k.dur_ns) AS repeat_ns,
       any_value(occurrence.op_gpu_ns) AS op_gpu_ns, list(k.event_id ORDER BY k.ts_ns) AS kernel_ids
FROM work w JOIN kernels k ON k.event_id = w.gpu_event_id
JOIN cpu_ops o ON o.event_id = w.op_id JOIN occurrence ON occurrence.op_id = w.op_id
WHERE coalesce(k.graph_id, 0) = 0
GROUP BY w.op_id, o.name, o.input_dims, o.pid, o.tid, o.ts_ns, k.name, k.grid, k.block, k.shared_memory,
         k.registers_per_thread, k.device, k.stream
"""

# The evidence query: one site (op, input shapes, kernel, launch configuration) of one run.
SITE_SQL = (
    "SELECT coalesce(sum(repeat_ns), 0) AS repeat_ns, count(*) AS occurrences_with_repeats,\n"
    "       coalesce(sum(launches - 1), 0) AS repeated_launches, coalesce(sum(launches), 0) AS launches,\n"
    "       coalesce(sum(op_gpu_ns), 0) AS op_gpu_ns, min(op_ts_ns) AS first_ns\n"
    "FROM (" + GROUPS_SQL + ") g\n"
    "WHERE launches > 1 AND op = $op AND input_shapes IS NOT DISTINCT FROM $input_shapes AND kernel = $kernel\n"
    "  AND grid IS NOT DISTINCT FROM $grid AND block IS NOT DISTINCT FROM $block\n"
    "  AND shared_memory IS NOT DISTINCT FROM $shared_memory\n"
    "  AND registers_per_thread IS NOT DISTINCT FROM $registers_per_thread"
)


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
    },
)
def check(con, params, ctx):
    skip_ops = _patterns(params["skip_ops"])
    skip_kernels = _patterns(params["skip_kernels"])
    for run in ctx.runs:
        window = run.window_ns
        if window <= 0:
            continue
        con.execute("DROP TABLE IF EXISTS _k002_groups")
        con.execute(f"CREATE TEMP TABLE _k002_groups AS {GROUPS_SQL}", {"run_id": run.run_id})
        try:
            cur = con.execute(
                """
                WITH per_shape AS (
                    SELECT op, input_shapes, count(DISTINCT op_id) AS occurrences FROM _k002_groups GROUP BY ALL
                )
                SELECT g.op, g.input_shapes, g.kernel, g.grid, g.block, g.shared_memory AS smem, g.registers_per_thread AS regs,
                       count(*) AS occ, any_value(s.occurrences) AS all_occ, sum(g.repeat_ns) AS repeat_ns,
                       sum(g.launches - 1) AS repeated, sum(g.launches) AS launches, max(g.launches) AS most,
                       sum(g.op_gpu_ns) AS op_gpu_ns, min(g.op_ts_ns) AS first, max(g.op_ts_ns) AS last,
                       arg_max(g.op_id, g.repeat_ns) AS worst_op, arg_max(g.kernel_ids, g.repeat_ns) AS worst_ids,
                       list(DISTINCT g.pid) AS pids, list(DISTINCT g.tid) AS tids,
                       list(DISTINCT g.device) AS devices, list(DISTINCT g.stream) AS streams
                FROM _k002_groups g JOIN per_shape s
                  ON s.op = g.op AND s.input_shapes IS NOT DISTINCT FROM g.input_shapes
                WHERE g.launches > 1
                GROUP BY g.op, g.input_shapes, g.kernel, g.grid, g.block, g.shared_memory, g.registers_per_thread
                HAVING count(*) >= $min_occurrences AND count(*) >= $min_occurrence_share * any_value(s.occurrences)
                   AND sum(g.repeat_ns) >= $min_share * $window
                ORDER BY sum(g.repeat_ns) DESC, g.op, g.kernel, g.grid, g.block
                """,
                {
                    "min_occurrences": params["min_occurrences"],
                    "min_occurrence_share": params["min_occurrence_share"],
                    "min_share": params["min_share"],
                    "window": window,
                },
            )
            names = [d[0] for d in cur.description]
            sites = [dict(zip(names, r)) for r in cur.fetchall()]
        finally:
            con.execute("DROP TABLE IF EXISTS _k002_groups")
        for site in sites:
            if _skipped(site["op"], skip_ops) or _skipped(site["kernel"], skip_kernels):
                continue
            yield _finding(run, ctx, window, site)


def _finding(run, ctx, window, v) -> Finding:
    op, kernel, shapes, repeat_ns = v["op"], v["kernel"], v["input_shapes"], int(v["repeat_ns"])
    share = repeat_ns / window
    op_share = repeat_ns / v["op_gpu_ns"] if v["op_gpu_ns"] else 0.0
    severity = "critical" if share >= 0.10 else "warning" if share >= 0.02 else "info"
    one = lambda xs: xs[0] if len(xs) == 1 else None  # noqa: E731
    pid, tid = one(v["pids"]), one(v["tids"])
    launch = {"grid": v["grid"], "block": v["block"]}
    if v["smem"] is not None:
        launch["shared_memory"] = int(v["smem"])
    if v["regs"] is not None:
        launch["registers_per_thread"] = int(v["regs"])
    path = ctx.code_path(v["worst_op"])
    short = kernel if len(kernel) <= 80 else kernel[:77] + "..."
    per_call = v["launches"] / v["occ"]
    return Finding(
        rule="K002",
        severity=severity,
        confidence=0.6,
        title=(
            f"{op} launches {short} {per_call:.1f}x per call with identical grid {v['grid']} block {v['block']} "
            f"in {v['occ']} of {v['all_occ']} calls: {repeat_ns / 1e6:.2f} ms of repeats "
            f"({op_share:.0%} of those calls' GPU time)"
        ),
        locality={
            **run.locality(),
            "pid": pid,
            "tid": tid,
            "thread_name": ctx.thread_name(run.run_id, pid, tid) if pid is not None and tid is not None else None,
            "device": one(v["devices"]),
            "stream": one(v["streams"]),
            "op": op,
            "input_shapes": shapes,
            "kernel": kernel,
            "code_path": path or None,
            "launch": launch,
        },
        observed=Quantity(
            repeat_ns,
            "ns",
            f"GPU time of all but the longest copy of {kernel} in each of {v['occ']} calls of {op} that launched it "
            f"more than once ({v['repeated']} extra launches of {v['launches']}, up to {v['most']} per call)",
        ),
        expected=Quantity(0, "ns", "one launch per op call when its inputs and launch configuration are the same"),
        impact_ns=repeat_ns,
        window_ns=window,
        sql=SITE_SQL,
        sql_params={
            "run_id": run.run_id,
            "op": op,
            "input_shapes": shapes,
            "kernel": kernel,
            "grid": v["grid"],
            "block": v["block"],
            "shared_memory": v["smem"],
            "registers_per_thread": v["regs"],
        },
        sample_event_ids=list(v["worst_ids"])[:5],
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
        acceptance=(
            "Re-run the evidence SQL on the new trace: repeated_launches (and repeat_ns) at this site drop to 0, "
            "and the op's GPU time per call falls by about the repeat time."
        ),
        caveats=[
            "Kineto does not record kernel arguments: launches with the same configuration may still work on "
            "different data (e.g. one launch per tensor of a list); confirm before removing any.",
        ],
        extra={
            "occurrences_with_repeats": int(v["occ"]),
            "occurrences_of_op_with_these_shapes": int(v["all_occ"]),
            "repeated_launches": int(v["repeated"]),
            "launches": int(v["launches"]),
            "max_launches_per_call": int(v["most"]),
            "repeat_share_of_op_gpu_time": round(op_share, 4),
            "first_call_ns": int(v["first"]),
            "last_call_ns": int(v["last"]),
        },
    )
