"""Kernel launches grouped by the op call that issued them, the inner op that launched them and their
launch configuration (what K002 repeated-launches measures)."""

from __future__ import annotations

import re

from tracekit.engine.toolkit import contains_any

# Kineto's `Input type` of a tensor is its dtype name (`float`, `long int`, `c10::BFloat16`); other
# arguments are `Scalar`, `ScalarList`, `TensorList`, `GenericList` or empty.
_DTYPE = r"^(float|double|bool|c10::.+|((un)?signed |short |long )*(char|int|long|short)( int)?)$"

# One row per (scope occurrence, inner op call identity, kernel, launch configuration): how often the
# scope launched it. Each GPU activity counts once, by the call that launched it (`first_launches`);
# launches are calls that launched one activity, outside CUDA graphs. The inner op is the nearest
# cpu_op ancestor of the call (ProfilerStep#N is a step, not an op), else the only cpu_op with the
# call's External id. The scope is the outermost library op above the call (a dispatcher op
# `namespace::name` outside $framework_namespaces: a torch.library custom op, fbgemm, vLLM...), else
# the inner op itself: a custom op rebuilding a cache does it through aten ops that each launch once,
# so only the custom op's call sees the repeat. Inner op calls are the same call when their name key,
# input dims, strides, types and scalar arguments are equal (as far as record_shapes recorded them).
# Ops are named by their name key: a record_function op carrying a per-run id is one op.
GROUPS_SQL = f"""
WITH RECURSIVE calls AS (
    SELECT runtime_event_id, any_value(run_id) AS run_id, any_value(runtime_name) AS runtime_name,
           any_value(external_id) AS external_id, count(*) AS gpu_work
    FROM first_launches WHERE run_id = $run_id GROUP BY runtime_event_id
), op_names AS MATERIALIZED (
    -- the name tests once per distinct op name, not once per op call
    SELECT name, name_key(name) AS key, name NOT LIKE 'ProfilerStep#%' AS is_op,
           regexp_matches(name, '^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_]')
           AND NOT list_contains(string_split($framework_namespaces, ','), split_part(name, '::', 1)) AS is_library
    FROM (SELECT DISTINCT name FROM event_rows WHERE run_id = $run_id AND kind = 'cpu_op')
), nodes AS MATERIALIZED (
    -- the host call tree of this run, read once: every step of the walk below joins this, not event_rows
    SELECT e.rowid AS id, e.run_id, e.parent_id, coalesce(n.is_op, false) AS is_op,
           coalesce(n.is_library, false) AS is_library
    FROM event_rows e LEFT JOIN op_names n ON e.kind = 'cpu_op' AND n.name = e.name
    WHERE e.run_id = $run_id AND e.ph = 'X' AND e.pid IS NOT NULL AND e.kind NOT IN (
        'kernel', 'gpu_memcpy', 'gpu_memset', 'gpu_user_annotation', 'python_function')
), has_library AS (
    SELECT DISTINCT run_id FROM nodes WHERE is_library
), up(runtime_event_id, cur, hops) AS (
    SELECT c.runtime_event_id, r.parent_id, 0 FROM calls c JOIN nodes r ON r.id = c.runtime_event_id
    UNION ALL
    -- past the nearest op only where a library op may be above it
    SELECT u.runtime_event_id, p.parent_id, u.hops + 1 FROM up u JOIN nodes p ON p.id = u.cur
    WHERE (NOT p.is_op OR p.run_id IN (SELECT run_id FROM has_library)) AND u.hops < 64
), by_tree AS (
    SELECT u.runtime_event_id, arg_min(u.cur, u.hops) FILTER (WHERE p.is_op) AS inner_id,
           arg_max(u.cur, u.hops) FILTER (WHERE p.is_library) AS library_id
    FROM up u JOIN nodes p ON p.id = u.cur GROUP BY u.runtime_event_id
), by_external AS (
    SELECT run_id, external_id, min(event_id) AS op_id FROM cpu_ops
    WHERE run_id = $run_id AND external_id > 0 AND name NOT LIKE 'ProfilerStep#%'
    GROUP BY run_id, external_id HAVING count(*) = 1
), work AS (
    SELECT l.gpu_event_id, l.gpu_dur_ns, coalesce(t.inner_id, x.op_id) AS inner_id,
           coalesce(t.library_id, t.inner_id, x.op_id) AS op_id
    FROM first_launches l JOIN calls c ON c.runtime_event_id = l.runtime_event_id
    LEFT JOIN by_tree t ON t.runtime_event_id = l.runtime_event_id
    LEFT JOIN by_external x ON x.run_id = c.run_id AND x.external_id = c.external_id
    WHERE l.run_id = $run_id AND c.gpu_work = 1 AND NOT regexp_matches(c.runtime_name, 'GraphLaunch')
), occurrence AS (
    SELECT op_id, sum(gpu_dur_ns) AS op_gpu_ns, count(*) AS work_items FROM work WHERE op_id IS NOT NULL GROUP BY op_id
), body_calls AS (
    -- the op calls inside each library op occurrence
    SELECT o.event_id AS op_id, d.name, d.input_dims, d.input_types, d.concrete_inputs,
           CAST(d.args->'Input Strides' AS VARCHAR) AS strides,
           CAST(d.args->'Input Dims' AS JSON[]) AS dims, CAST(d.args->'Input type' AS VARCHAR[]) AS types,
           CAST(d.args->'Concrete Inputs' AS VARCHAR[]) AS scalars
    FROM (SELECT DISTINCT library_id FROM by_tree WHERE library_id IS NOT NULL) s
    JOIN cpu_ops o ON o.event_id = s.library_id
    JOIN cpu_ops d ON d.run_id = o.run_id AND d.pid = o.pid AND d.tid = o.tid AND d.ts_ns >= o.ts_ns
     AND d.end_ns <= o.end_ns AND d.event_id <> o.event_id
), scalar_counts AS (
    -- by call type (name key, input dims, strides, types) and scalar arguments; opaque: a 0-dim
    -- tensor input whose value the trace does not record (a Python number wrapped as a tensor,
    -- `positions + g * n`), so equal calls may still differ
    SELECT op_id, hash(name_key(name), input_dims, strides, input_types) AS call_type, concrete_inputs,
           len(list_filter(range(1, len(types) + 1), lambda j: CAST(dims[j] AS VARCHAR) = '[]'
               AND regexp_matches(types[j], '{_DTYPE}') AND coalesce(scalars[j], '') = '')) > 0 AS opaque,
           count(*) AS n
    FROM body_calls GROUP BY ALL
), varying AS (
    -- call types made with more than one set of scalar arguments (a loop index or offset, when a
    -- value's count is not a whole number of copies: below) or with an unrecorded scalar
    SELECT op_id, sum(n) AS n, list(n) AS per_value, bool_or(opaque) AS opaque
    FROM scalar_counts GROUP BY op_id, call_type
    HAVING count(*) > 1 OR bool_or(opaque)
), grouped AS (
SELECT w.op_id, o.run_id, any_value(ok.key) AS op, o.input_dims AS input_shapes, o.pid, o.tid, o.ts_ns AS op_ts_ns,
       any_value(ik.key) AS inner_op, i.input_dims AS inner_shapes, min(i.ts_ns) - o.ts_ns AS inner_offset_ns,
       k.name AS kernel, k.grid, k.block, k.shared_memory, k.registers_per_thread, k.device, k.stream,
       -- one repeat site: the scope op and its input shapes, the inner op call, the kernel and its configuration
       hash(any_value(ok.key), o.input_dims, any_value(ik.key), i.input_dims, CAST(i.args->'Input Strides' AS VARCHAR),
            i.input_types, i.concrete_inputs, k.name, k.grid, k.block, k.shared_memory, k.registers_per_thread) AS site,
       count(*) AS launches, sum(k.dur_ns) AS kernel_ns, sum(k.dur_ns) - max(k.dur_ns) AS repeat_ns,
       any_value(occurrence.op_gpu_ns) AS op_gpu_ns, list(k.event_id ORDER BY k.ts_ns) AS kernel_ids
FROM work w JOIN kernels k ON k.event_id = w.gpu_event_id
JOIN cpu_ops o ON o.event_id = w.op_id JOIN cpu_ops i ON i.event_id = w.inner_id
JOIN op_names ok ON ok.name = o.name JOIN op_names ik ON ik.name = i.name
JOIN occurrence ON occurrence.op_id = w.op_id
WHERE coalesce(k.graph_id, 0) = 0 AND occurrence.work_items > 1
GROUP BY w.op_id, o.run_id, o.name, o.input_dims, o.pid, o.tid, o.ts_ns, i.name, i.input_dims, i.args->'Input Strides',
         i.input_types, i.concrete_inputs, k.name, k.grid, k.block, k.shared_memory, k.registers_per_thread,
         k.device, k.stream
UNION ALL BY NAME
-- an op call that launched one piece of GPU work repeats nothing, but counts among the calls of its op
-- with those input shapes: the row the grouping above would give it, without the columns only a
-- repeat reads (most calls launch once: on hta__df_index_resolver 390k of 423k launches)
SELECT w.op_id, o.run_id, ok.key AS op, o.input_dims AS input_shapes, o.pid, o.tid, o.ts_ns AS op_ts_ns,
       1 AS launches, k.dur_ns AS kernel_ns, 0 AS repeat_ns, occurrence.op_gpu_ns
FROM work w JOIN occurrence ON occurrence.op_id = w.op_id AND occurrence.work_items = 1
JOIN kernels k ON k.event_id = w.gpu_event_id JOIN cpu_ops o ON o.event_id = w.op_id
JOIN op_names ok ON ok.name = o.name
WHERE coalesce(k.graph_id, 0) = 0 AND w.inner_id IN (SELECT event_id FROM cpu_ops)
)
-- loop_variant: the copies come from loop iterations that pass different scalars (x[g], a slice
-- offset, the chunks of a split), or a scalar the trace does not show, to a call the body makes a
-- whole number of times per copy: they may read different data
SELECT g.*, EXISTS (
    SELECT 1 FROM varying v WHERE v.op_id = g.op_id AND g.launches > 1 AND v.n % g.launches = 0
       AND (v.opaque OR len(list_filter(v.per_value, lambda c: c % g.launches <> 0)) > 0)
) AS loop_variant
FROM grouped g
"""

# The same for several runs at once ($run_ids): one statement for every run of an analysis, whose
# planning costs as much as one run's execution on a small trace (64 GPU ranks: 28 ms a run, half of
# it planning). Each row is of one run (`run_id`), as the per-run statement gives it.
GROUPS_OF_RUNS_SQL, _filters = re.subn(r"([\w.]*run_id) = \$run_id", r"list_contains($run_ids, \1)", GROUPS_SQL)
if _filters != 5 or re.search(r"\$run_id\b", GROUPS_OF_RUNS_SQL):  # a filter left out would mix runs
    raise RuntimeError(f"GROUPS_OF_RUNS_SQL: {_filters} run filters rewritten, 5 expected")

GROUPS_TABLE = "_k002_groups"


# The repeat sites (groups of one op with those input shapes that launched the same inner op call's
# kernel more than once, over the steady-state thresholds and not exempt), then one row per op and
# input shapes: its repeat time, launches and occurrences over all its sites, and the sites; each run's
# apart from the others'.
_REPEATS_BODY = f"""
per_shape AS (
    SELECT run_id, op, input_shapes, count(DISTINCT op_id) AS occurrences FROM groups GROUP BY ALL
), sites AS (
    SELECT g.run_id, g.site, any_value(g.op) AS op, any_value(g.input_shapes) AS input_shapes,
           any_value(g.inner_op) AS inner_op, any_value(g.inner_shapes) AS inner_shapes,
           min(g.inner_offset_ns) AS inner_offset_ns,
           any_value(g.kernel) AS kernel, any_value(g.grid) AS grid, any_value(g.block) AS block,
           any_value(g.shared_memory) AS smem, any_value(g.registers_per_thread) AS regs,
           count(*) AS occurrences, any_value(s.occurrences) AS all_occurrences,
           sum(g.repeat_ns) AS repeat_ns, sum(g.launches) AS launches
    FROM groups g JOIN per_shape s
      ON s.run_id = g.run_id AND s.op = g.op AND s.input_shapes IS NOT DISTINCT FROM g.input_shapes
    WHERE g.launches > 1 AND NOT g.loop_variant AND NOT {contains_any("g.op", "$skip_ops")}
      AND NOT {contains_any("g.inner_op", "$skip_ops")} AND NOT {contains_any("g.kernel", "$skip_kernels")}
    GROUP BY g.run_id, g.site
    HAVING count(*) >= $min_occurrences AND count(*) >= $min_occurrence_share * any_value(s.occurrences)
), repeats AS (
    SELECT g.* FROM groups g SEMI JOIN sites s ON s.run_id = g.run_id AND s.site = g.site WHERE g.launches > 1
), per_call AS (
    SELECT run_id, op, input_shapes, op_id, any_value(op_gpu_ns) AS op_gpu_ns, any_value(op_ts_ns) AS op_ts_ns,
           sum(repeat_ns) AS repeat_ns
    FROM repeats GROUP BY ALL
), op_calls AS (
    SELECT run_id, op, input_shapes, count(*) AS occurrences, sum(op_gpu_ns) AS op_gpu_ns,
           min(op_ts_ns) AS first_call_ns, max(op_ts_ns) AS last_call_ns,
           -- the worst call; ties go to the earliest, so the code path (and the finding id) is stable
           arg_max(op_id, (repeat_ns, -op_ts_ns, -op_id)) AS worst_op
    FROM per_call GROUP BY ALL
), per_op AS (
    SELECT run_id, op, input_shapes, sum(repeat_ns) AS repeat_ns, sum(launches - 1) AS repeated, sum(launches) AS launches,
           max(launches) AS max_per_call, list(DISTINCT pid) AS pids, list(DISTINCT tid) AS tids,
           list(DISTINCT device) AS devices, list(DISTINCT stream) AS streams
    FROM repeats GROUP BY ALL
)
SELECT p.run_id, p.op, p.input_shapes, c.occurrences, p.repeat_ns, p.repeated, p.launches, p.max_per_call, c.op_gpu_ns,
       c.first_call_ns, c.last_call_ns, c.worst_op, p.pids, p.tids, p.devices, p.streams,
       (SELECT max(all_occurrences) FROM sites s WHERE s.run_id = p.run_id AND s.op = p.op
          AND s.input_shapes IS NOT DISTINCT FROM p.input_shapes) AS all_occurrences,
       (SELECT list(struct_pack(inner_op, inner_shapes, inner_offset_ns, kernel, grid, block, smem, regs, occurrences,
                                launches, repeat_ns) ORDER BY repeat_ns DESC, kernel, grid, block, inner_op)
        FROM sites s WHERE s.run_id = p.run_id AND s.op = p.op AND s.input_shapes IS NOT DISTINCT FROM p.input_shapes)
           AS sites,
       (SELECT flatten(list(kernel_ids ORDER BY repeat_ns DESC, kernel)) FROM repeats r WHERE r.op_id = c.worst_op)
           AS worst_ids
FROM per_op p JOIN op_calls c
  ON c.run_id = p.run_id AND c.op = p.op AND c.input_shapes IS NOT DISTINCT FROM p.input_shapes
"""

# The repeat rows over the thresholds of every run in GROUPS_TABLE, run by run; the floor is a share of
# the run's kernel time, not of its window, which a launch-bound run leaves mostly idle.
REPEATS_SQL = (
    f"WITH groups AS (SELECT * FROM {GROUPS_TABLE}), {_REPEATS_BODY}"
    "WHERE p.repeat_ns >= $min_share * (SELECT coalesce(sum(dur_ns), 0) FROM kernels k WHERE k.run_id = p.run_id)\n"
    "ORDER BY p.run_id, p.repeat_ns DESC, p.op, p.input_shapes"
)

# The evidence query: the repeats of one op with one set of input shapes, recomputed from the trace.
REPEAT_SQL = (
    "SELECT coalesce(sum(repeat_ns), 0) AS repeat_ns, coalesce(sum(occurrences), 0) AS occurrences_with_repeats,\n"
    "       coalesce(sum(repeated), 0) AS repeated_launches, coalesce(sum(launches), 0) AS launches,\n"
    "       coalesce(sum(op_gpu_ns), 0) AS op_gpu_ns, max(max_per_call) AS max_launches_per_call,\n"
    "       min(first_call_ns) AS first_ns\n"
    f"FROM (WITH groups AS ({GROUPS_SQL}), {_REPEATS_BODY}"
    "WHERE p.op = $op AND p.input_shapes IS NOT DISTINCT FROM $input_shapes)"
)
