"""Kernel launches grouped by the op occurrence that issued them and their launch configuration
(what K002 repeated-launches measures)."""

from __future__ import annotations

# One row per (op occurrence, kernel, launch configuration): how often the op launched it. Each GPU
# activity counts once, by the call that launched it (`first_launches`); launches are calls that
# launched one activity, outside CUDA graphs; the op is the nearest cpu_op ancestor of the call
# (ProfilerStep#N is a step, not an op), else the only cpu_op with the call's External id. The op is
# named by its name key: a record_function op carrying a per-run id is one op.
GROUPS_SQL = """
WITH RECURSIVE calls AS (
    SELECT runtime_event_id, any_value(runtime_name) AS runtime_name, any_value(external_id) AS external_id,
           count(*) AS gpu_work
    FROM first_launches WHERE run_id = $run_id GROUP BY runtime_event_id
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
    FROM first_launches l JOIN calls c ON c.runtime_event_id = l.runtime_event_id
    LEFT JOIN by_tree t ON t.runtime_event_id = l.runtime_event_id
    LEFT JOIN by_external x ON x.external_id = c.external_id
    WHERE l.run_id = $run_id AND c.gpu_work = 1 AND NOT regexp_matches(c.runtime_name, 'GraphLaunch')
), occurrence AS (
    SELECT op_id, sum(gpu_dur_ns) AS op_gpu_ns FROM work WHERE op_id IS NOT NULL GROUP BY op_id
)
SELECT w.op_id, name_key(o.name) AS op, o.input_dims AS input_shapes, o.pid, o.tid, o.ts_ns AS op_ts_ns,
       k.name AS kernel, k.grid, k.block, k.shared_memory, k.registers_per_thread, k.device, k.stream,
       count(*) AS launches, sum(k.dur_ns) AS kernel_ns, sum(k.dur_ns) - max(k.dur_ns) AS repeat_ns,
       any_value(occurrence.op_gpu_ns) AS op_gpu_ns, list(k.event_id ORDER BY k.ts_ns) AS kernel_ids
FROM work w JOIN kernels k ON k.event_id = w.gpu_event_id
JOIN cpu_ops o ON o.event_id = w.op_id JOIN occurrence ON occurrence.op_id = w.op_id
WHERE coalesce(k.graph_id, 0) = 0
GROUP BY w.op_id, o.name, o.input_dims, o.pid, o.tid, o.ts_ns, k.name, k.grid, k.block, k.shared_memory,
         k.registers_per_thread, k.device, k.stream
"""

GROUPS_TABLE = "_k002_groups"

# Repeat sites of one run (op, input shapes, kernel, launch configuration) over the thresholds, from
# the run's groups in GROUPS_TABLE; per_shape counts the op's occurrences with those input shapes.
SITES_SQL = f"""
WITH per_shape AS (
    SELECT op, input_shapes, count(DISTINCT op_id) AS occurrences FROM {GROUPS_TABLE} GROUP BY ALL
)
SELECT g.op, g.input_shapes, g.kernel, g.grid, g.block, g.shared_memory AS smem, g.registers_per_thread AS regs,
       count(*) AS occurrences, any_value(s.occurrences) AS all_occurrences, sum(g.repeat_ns) AS repeat_ns,
       sum(g.launches - 1) AS repeated, sum(g.launches) AS launches, max(g.launches) AS max_per_call,
       sum(g.op_gpu_ns) AS op_gpu_ns, min(g.op_ts_ns) AS first_call_ns, max(g.op_ts_ns) AS last_call_ns,
       -- the worst occurrence; ties go to the earliest, so the code path (and the finding id) is stable
       list(g.op_id ORDER BY g.repeat_ns DESC, g.op_ts_ns, g.op_id)[1] AS worst_op,
       list(g.kernel_ids ORDER BY g.repeat_ns DESC, g.op_ts_ns, g.op_id)[1] AS worst_ids,
       list(DISTINCT g.pid) AS pids, list(DISTINCT g.tid) AS tids,
       list(DISTINCT g.device) AS devices, list(DISTINCT g.stream) AS streams
FROM {GROUPS_TABLE} g JOIN per_shape s
  ON s.op = g.op AND s.input_shapes IS NOT DISTINCT FROM g.input_shapes
WHERE g.launches > 1
GROUP BY g.op, g.input_shapes, g.kernel, g.grid, g.block, g.shared_memory, g.registers_per_thread
HAVING count(*) >= $min_occurrences AND count(*) >= $min_occurrence_share * any_value(s.occurrences)
   AND sum(g.repeat_ns) >= $min_share * $window
ORDER BY sum(g.repeat_ns) DESC, g.op, g.kernel, g.grid, g.block
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
