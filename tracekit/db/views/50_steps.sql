-- Steps: one rule for what a step is, shared by the rules, the diff and the report, and the time
-- breakdown of every step on the run's main device.
--
-- The rule, per run: `ProfilerStep#N` annotations (user_annotation or cpu_op: `torch.profiler`'s
-- `prof.step()`) when the run has any; else the most frequent top-level user annotation that occurs
-- at least twice, preferring those that enclose kernel launches (an `MPI_Send` range around host
-- communication is no step of GPU work; ties: the name); else the whole run is one step. Steps are the occurrences of that
-- annotation on the thread that holds most of them, one per start time (old traces hold a
-- ProfilerStep both as a user_annotation and as a cpu_op), in time order; an occurrence that starts
-- before the previous one ended (nested or overlapping) is not a step of its own, so steps never
-- overlap. `step_candidates` shows what the rule chose from; `steps_named(name)` applies a name
-- given by the user instead (`tracekit diff --step`).
--
-- Phase of a step, first match wins: `capture` when the step holds CUDA-graph capture
-- (`cudaStreamBeginCapture` / `cudaStreamEndCapture`, `cuStream*Capture`, `hipStream*Capture`,
-- `capture_begin`, vLLM `_capture_cudagraphs`); `warm-up` for a cold first step of a run with at
-- least two steps: it holds lazy initialisation that no later step repeats as often (`cudaFree`,
-- `cuModuleLoad*`, `cuLibraryLoad*`, `cudaStreamCreate*`, `cudaEventCreate*`, cuDNN/cuBLAS/MIOpen
-- handle creation and their `hip*` forms), or the run's first kernel launch call is in it and lasts
-- more than `step_warmup_launch_factor()` times the run's median launch, or it lasts more than
-- `step_warmup_duration_factor()` times the median of the later steps; `profiler` when the profiler's
-- own bookkeeping (`overhead` events: Kineto's `Activity Buffer Request`, CUPTI buffer flushes) takes
-- at least `step_profiler_overhead_share()` of the step; else `steady`. `phase_reason` says which
-- evidence fired, with its numbers.

-- A first step longer than this many times the median of the run's later steps is a warm-up step.
CREATE OR REPLACE MACRO step_warmup_duration_factor() AS 2.0;

-- A run's first kernel launch call longer than this many times the run's median launch call marks its
-- step as warm-up (lazy module loading and context creation happen inside the first launch).
CREATE OR REPLACE MACRO step_warmup_launch_factor() AS 10.0;

-- A step whose profiler overhead events take at least this share of it is profiler bookkeeping.
CREATE OR REPLACE MACRO step_profiler_overhead_share() AS 0.1;

-- What the step rule chose from: one row per (run, annotation name) that can delimit steps, i.e.
-- every `ProfilerStep#N` name and every top-level user annotation name (by `name_key`: `#N` suffix and
-- per-run ids masked, so `op_id = 150891` and `op_id = 150892` are one name), with
-- how often it occurs and on which thread most. `choice = 1` is the run's step annotation.
CREATE OR REPLACE VIEW step_candidates(
    -- the run
    run_id,
    -- annotation name by `name_key` (without a trailing `#N`, per-run ids masked)
    name,
    -- `ProfilerStep#N` or `most frequent top-level user annotation`
    source,
    -- how many times it occurs (distinct start times per thread, summed over threads)
    occurrences,
    -- launch calls of GPU work (`first_launches`) made inside its occurrences on their threads
    launches,
    -- process of the thread that holds most occurrences
    pid,
    -- that thread (ties: the lowest pid, then tid)
    tid,
    -- the step rule's order among the eligible names: ProfilerStep first, then names that enclose
    -- launches, then by occurrences (descending) and name; NULL for a top-level annotation that
    -- occurs once (not eligible)
    choice
) AS
WITH annotations AS (
    SELECT run_id, pid, tid, ts_ns, end_ns, name_key(name) AS name,
           name LIKE 'ProfilerStep#%' AS profiler_step
    FROM events
    WHERE dur_ns > 0
      AND ((kind IN ('user_annotation', 'cpu_op') AND name LIKE 'ProfilerStep#%') OR (kind = 'user_annotation' AND depth = 0))
), launched AS (
    -- top-level annotations of one thread do not overlap: the latest one starting before a launch
    -- call is the only one that can hold it
    SELECT a.run_id, a.name, a.profiler_step, count(*) AS launches
    FROM (SELECT DISTINCT run_id, pid, tid, launch_ts_ns FROM first_launches) l
    ASOF JOIN (SELECT * FROM annotations WHERE NOT profiler_step) a
      ON a.run_id = l.run_id AND a.pid = l.pid AND a.tid = l.tid AND l.launch_ts_ns >= a.ts_ns
    WHERE l.launch_ts_ns < a.end_ns
    GROUP BY ALL
), per_thread AS (
    SELECT run_id, name, profiler_step, pid, tid, count(DISTINCT ts_ns) AS n FROM annotations GROUP BY ALL
), per_name AS (
    SELECT run_id, name, profiler_step, sum(n) AS occurrences,
           first(pid ORDER BY n DESC, pid, tid) AS pid, first(tid ORDER BY n DESC, pid, tid) AS tid,
           profiler_step OR sum(n) >= 2 AS eligible
    FROM per_thread GROUP BY run_id, name, profiler_step
)
SELECT p.run_id, p.name, CASE WHEN p.profiler_step THEN 'ProfilerStep#N' ELSE 'most frequent top-level user annotation' END,
       CAST(p.occurrences AS BIGINT), CAST(coalesce(l.launches, 0) AS BIGINT), p.pid, p.tid,
       CASE WHEN p.eligible THEN row_number() OVER (PARTITION BY p.run_id, p.eligible
                                                    ORDER BY p.profiler_step DESC, coalesce(l.launches, 0) > 0 DESC,
                                                             p.occurrences DESC, p.name) END
FROM per_name p LEFT JOIN launched l USING (run_id, name, profiler_step);

-- @internal
-- The body of `step_windows_named`; `step_windows` reads it with `step_name` NULL.
CREATE OR REPLACE MACRO step_windows_computed(step_name) AS TABLE
WITH _chosen AS (
    SELECT run_id, name, source FROM step_candidates WHERE step_name IS NULL AND choice = 1
    UNION ALL
    SELECT run_id, name_key(step_name), 'named' FROM runs WHERE step_name IS NOT NULL
), _names AS (
    -- each distinct name's key once, not every event's (name_key is five regular expressions)
    SELECT n.run_id, n.name AS annotation, c.name, c.source
    FROM (SELECT DISTINCT run_id, name FROM events WHERE kind IN ('user_annotation', 'cpu_op') AND dur_ns > 0) n
    JOIN _chosen c ON n.run_id = c.run_id AND name_key(n.name) = c.name
), _occurrences AS (
    SELECT e.run_id, e.event_id, e.name AS annotation, c.name, c.source, e.pid, e.tid, e.ts_ns, e.end_ns, e.depth
    FROM events e JOIN _names c ON e.run_id = c.run_id AND e.name = c.annotation
    WHERE e.kind IN ('user_annotation', 'cpu_op') AND e.dur_ns > 0
), _thread AS (
    SELECT run_id, pid, tid FROM (SELECT run_id, pid, tid, count(DISTINCT ts_ns) AS n FROM _occurrences GROUP BY ALL)
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY n DESC, pid, tid) = 1
), _starts AS (
    SELECT o.run_id, o.ts_ns AS start_ns, max(o.end_ns) AS end_ns,
           first(o.event_id ORDER BY o.end_ns DESC, o.event_id) AS event_id,
           first(o.annotation ORDER BY o.end_ns DESC, o.event_id) AS annotation,
           any_value(o.name) AS name, any_value(o.source) AS source, any_value(o.pid) AS pid,
           any_value(o.tid) AS tid, min(o.depth) AS depth
    FROM _occurrences o
    JOIN _thread t ON o.run_id = t.run_id AND o.pid IS NOT DISTINCT FROM t.pid AND o.tid IS NOT DISTINCT FROM t.tid
    GROUP BY o.run_id, o.ts_ns
), _tiled AS (
    SELECT * FROM _starts
    QUALIFY start_ns >= coalesce(max(end_ns) OVER (PARTITION BY run_id ORDER BY start_ns
                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns)
), _host_thread AS (
    SELECT run_id, pid, tid FROM (
        SELECT run_id, pid, tid, sum(dur_ns) AS busy FROM events
        WHERE depth = 0 AND dur_ns > 0 AND NOT is_device_kind(kind)
          AND kind NOT IN ('python_function', 'profiler_span', 'overhead')
          AND step_name IS NULL
        GROUP BY ALL)
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY busy DESC, pid, tid) = 1
), _whole AS (
    SELECT r.run_id, r.start_ns, r.end_ns, NULL::BIGINT AS event_id, NULL::VARCHAR AS annotation,
           NULL::VARCHAR AS name, 'whole run' AS source, h.pid, h.tid, -1 AS depth
    FROM runs r LEFT JOIN _host_thread h USING (run_id)
    WHERE step_name IS NULL AND r.start_ns IS NOT NULL AND r.run_id NOT IN (SELECT run_id FROM _chosen)
)
SELECT run_id, CAST(row_number() OVER (PARTITION BY run_id ORDER BY start_ns) - 1 AS INTEGER) AS step_index, name,
       annotation, event_id, source, start_ns, end_ns, end_ns - start_ns AS dur_ns, pid, tid, CAST(depth AS INTEGER) AS depth
FROM (SELECT run_id, start_ns, end_ns, event_id, annotation, name, source, pid, tid, depth FROM _tiled
      UNION ALL
      SELECT run_id, start_ns, end_ns, event_id, annotation, name, source, pid, tid, depth FROM _whole);

-- One row per step per run, by the step rule (see above): where the step is and who delimits it,
-- without the breakdown of `steps` (cheaper: no GPU or host time is computed).
CREATE OR REPLACE VIEW step_windows(
    -- the run
    run_id,
    -- 0, 1, ... in time order within the run
    step_index,
    -- the step annotation without a trailing `#N` (`ProfilerStep`, `decode_step`); NULL when the
    -- whole run is one step
    name,
    -- the delimiting annotation as written (`ProfilerStep#12`); NULL for a whole-run step
    annotation,
    -- the delimiting event (the longest one starting at start_ns); NULL for a whole-run step
    event_id,
    -- which branch of the rule chose the annotation: `ProfilerStep#N`, `most frequent top-level user
    -- annotation`, `whole run`, or `named` (from `steps_named`)
    source,
    -- start of the step
    start_ns,
    -- end of the step
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- process of the step's thread (the thread of the annotations; for a whole-run step, the thread
    -- with the most top-level host time)
    pid,
    -- the step's thread
    tid,
    -- depth of the delimiting annotation on its thread; -1 for a whole-run step
    depth
) AS
SELECT run_id, step_index, name, annotation, event_id, source, start_ns, end_ns, dur_ns, pid, tid, depth
FROM step_windows_computed(NULL);

-- The step windows of every run, delimited by the annotation `step_name` (compared by `name_key`:
-- a trailing `#N` and per-run ids are ignored), or by the step rule when `step_name` is NULL (that
-- is the `step_windows` view). A run without that annotation has no rows; with the rule, a run
-- without a step annotation is one step.
-- Same columns as `step_windows`.
--
-- Cost: one scan of the user annotations and cpu_ops (their name keys), plus one of the
-- top-level host events when a run is one step; with `step_name` NULL, a read of `step_windows`
-- (a table while rules run, so the step rule's windows are computed once per analysis).
CREATE OR REPLACE MACRO step_windows_named(step_name) AS TABLE
-- the planner drops the branch whose condition is false, a bound parameter included
SELECT * FROM step_windows WHERE step_name IS NULL
UNION ALL
SELECT * FROM step_windows_computed(step_name) WHERE step_name IS NOT NULL;

-- The phase of every step delimited by the annotation `step_name` (a trailing `#N` is ignored), or
-- by the step rule when `step_name` is NULL: `steps.phase` and `steps.phase_reason` without the time
-- breakdown, so that rules and `run_phases` read the phases without computing every step's GPU and
-- host time.
--
-- Cost: `step_windows_named`, one scan of the events named like capture, lazy-init and
-- profiler-overhead calls, one of the launch calls.
CREATE OR REPLACE MACRO step_phases_named(step_name) AS TABLE
WITH _w AS MATERIALIZED (
    SELECT * FROM step_windows_named(step_name)
), _marks AS (
    SELECT run_id, ts_ns, least(end_ns, ts_ns + coalesce(dur_ns, 0)) AS end_ns, name,
           CASE WHEN regexp_matches(name, '^(cuda|cu|hip)Stream(Begin|End)Capture')
                     OR contains(name, 'capture_begin') OR contains(name, '_capture_cudagraphs') THEN 'capture'
                WHEN kind = 'overhead' THEN 'profiler'
                WHEN regexp_matches(name, '^(cuda|hip)Free$|^(cuModuleLoad|cuLibraryLoad|cudaStreamCreate|cudaEventCreate'
                                          || '|hipModuleLoad|hipStreamCreate|hipEventCreate|cudnnCreate|cublasCreate'
                                          || '|cublasLtCreate|hipblasCreate|hipblasLtCreate|miopenCreate)') THEN 'lazy_init'
           END AS mark
    FROM events
    WHERE run_id IN (SELECT run_id FROM _w) AND NOT is_device_kind(kind)
      AND (kind = 'overhead' OR contains(name, 'Capture') OR contains(name, 'capture') OR suffix(name, 'Free')
           OR contains(name, 'Load') OR contains(name, 'Create'))
), _evidence AS (
    SELECT w.run_id, w.step_index,
           count(*) FILTER (WHERE m.mark = 'capture') AS capture_calls,
           string_agg(DISTINCT m.name, ', ' ORDER BY m.name) FILTER (WHERE m.mark = 'capture') AS capture_names,
           count(*) FILTER (WHERE m.mark = 'lazy_init') AS lazy_calls,
           string_agg(DISTINCT m.name, ', ' ORDER BY m.name) FILTER (WHERE m.mark = 'lazy_init') AS lazy_names,
           coalesce(sum(least(m.end_ns, w.end_ns) - m.ts_ns) FILTER (WHERE m.mark = 'profiler'), 0) AS profiler_ns
    FROM (SELECT * FROM _marks WHERE mark IS NOT NULL) m
    ASOF JOIN _w w ON m.run_id = w.run_id AND m.ts_ns >= w.start_ns
    WHERE m.ts_ns < w.end_ns
    GROUP BY w.run_id, w.step_index
), _launch_calls AS (
    SELECT run_id, ts_ns, dur_ns FROM runtime_calls
    WHERE run_id IN (SELECT run_id FROM _w) AND regexp_matches(name, '^(cuda|cu|hip|hipExt)(Module)?LaunchKernel')
), _runs AS (
    SELECT w.run_id, count(*) AS steps_in_run,
           median(w.dur_ns) FILTER (WHERE w.step_index > 0) AS later_median_ns,
           coalesce(max(e.lazy_calls) FILTER (WHERE w.step_index > 0), 0) AS later_lazy_max,
           any_value(l.first_launch_ts) AS first_launch_ts, any_value(l.first_launch_ns) AS first_launch_ns,
           any_value(l.median_launch_ns) AS median_launch_ns
    FROM _w w
    LEFT JOIN _evidence e USING (run_id, step_index)
    LEFT JOIN (SELECT run_id, min(ts_ns) AS first_launch_ts, first(dur_ns ORDER BY ts_ns) AS first_launch_ns,
                      median(dur_ns) AS median_launch_ns
               FROM _launch_calls GROUP BY run_id) l USING (run_id)
    GROUP BY w.run_id
), _tested AS (
    SELECT w.*, coalesce(e.capture_calls, 0) AS capture_calls, e.capture_names,
           coalesce(e.lazy_calls, 0) AS lazy_calls, e.lazy_names, coalesce(e.profiler_ns, 0) AS profiler_ns,
           r.later_median_ns, r.later_lazy_max, r.first_launch_ns, r.median_launch_ns,
           w.step_index = 0 AND r.steps_in_run >= 2 AS first_of_several,
           coalesce(e.lazy_calls, 0) > r.later_lazy_max AS cold_init,
           r.first_launch_ts >= w.start_ns AND r.first_launch_ts < w.end_ns
               AND r.first_launch_ns > step_warmup_launch_factor() * r.median_launch_ns AS cold_launch,
           w.dur_ns > step_warmup_duration_factor() * r.later_median_ns AS long_first
    FROM _w w LEFT JOIN _evidence e USING (run_id, step_index) JOIN _runs r USING (run_id)
)
SELECT run_id, step_index,
       CASE WHEN capture_calls > 0 THEN 'capture'
            WHEN first_of_several AND (cold_init OR cold_launch OR long_first) THEN 'warm-up'
            WHEN profiler_ns >= step_profiler_overhead_share() * dur_ns THEN 'profiler'
            ELSE 'steady' END AS phase,
       CASE WHEN capture_calls > 0 THEN printf('CUDA-graph capture in the step: %s (%d calls)', capture_names, capture_calls)
            WHEN first_of_several AND (cold_init OR cold_launch OR long_first) THEN concat_ws('; ',
                CASE WHEN cold_init THEN printf('lazy initialisation not repeated as often later: %s (%d calls, at most %d in a later step)',
                                                lazy_names, lazy_calls, later_lazy_max) END,
                CASE WHEN cold_launch THEN printf('first kernel launch call %.1f us, %.0fx the median launch call (%.1f us)',
                                                  first_launch_ns / 1e3, first_launch_ns / median_launch_ns, median_launch_ns / 1e3) END,
                CASE WHEN long_first THEN printf('%.2fx the median of the later steps (%.3f ms vs %.3f ms)',
                                                 dur_ns / later_median_ns, dur_ns / 1e6, later_median_ns / 1e6) END)
            WHEN profiler_ns >= step_profiler_overhead_share() * dur_ns
                THEN printf('profiler overhead events take %.3f ms, %.0f%% of the step', profiler_ns / 1e6, 100 * profiler_ns / dur_ns)
            ELSE 'no CUDA-graph capture, cold start or profiler overhead in the step' END AS phase_reason
FROM _tested;

-- One row per step per run, by the step rule (see above), with its phase but without the time
-- breakdown of `steps` (cheaper: no GPU or host time is computed). `run_phases` reads it.
CREATE OR REPLACE VIEW step_phases(
    -- the run
    run_id,
    -- the step (`step_windows.step_index`)
    step_index,
    -- `steady`, `warm-up`, `capture` or `profiler` (see above)
    phase,
    -- the evidence for the phase, with its numbers
    phase_reason
) AS
SELECT run_id, step_index, phase, phase_reason FROM step_phases_named(NULL);

-- The steps of every run delimited by the annotation `step_name` (a trailing `#N` is ignored), or
-- by the step rule when `step_name` is NULL (that is the `steps` view), with their phase
-- (`step_phases_named`) and time breakdown. Same columns as `steps`.
--
-- Cost: `step_windows_named`, `step_phases_named`, two ASOF lookups per step and layer of
-- `gpu_busy_layers` (one sort of the run's activities per layer), one sweep over the step thread's
-- host events.
CREATE OR REPLACE MACRO steps_named(step_name) AS TABLE
WITH _w AS MATERIALIZED (
    SELECT s.*, m.device FROM step_windows_named(step_name) s JOIN main_device m USING (run_id)
), _layer_windows AS (
    SELECT w.run_id, w.step_index, w.start_ns, w.end_ns, l.layer, {'device': w.device, 'layer': l.layer} AS lane
    FROM _w w, (VALUES ('all'), ('kernel'), ('compute'), ('communication')) l(layer)
    WHERE w.device IS NOT NULL
), _layer_blocks AS (
    SELECT run_id, {'device': device, 'layer': layer} AS lane, start_ns, end_ns, busy_before_ns FROM gpu_busy_layers
    WHERE run_id IN (SELECT run_id FROM _w)
), _gpu AS (
    SELECT run_id, step_index,
           sum(busy_ns) FILTER (WHERE layer = 'all') AS all_ns,
           sum(busy_ns) FILTER (WHERE layer = 'kernel') AS kernel_ns,
           sum(busy_ns) FILTER (WHERE layer = 'compute') AS compute_busy_ns,
           sum(busy_ns) FILTER (WHERE layer = 'communication') AS comm_busy_ns
    FROM busy_between('_layer_windows', '_layer_blocks') GROUP BY run_id, step_index
), _run_thread AS (
    SELECT run_id, any_value(pid) AS pid, any_value(tid) AS tid, min(depth) AS depth, any_value(name) AS name
    FROM _w GROUP BY run_id
), _host_events AS (
    -- (`thread_step`, not `step_name`: a column named after the macro's parameter would be replaced by it)
    SELECT e.run_id, e.event_id, e.parent_id, e.ts_ns, e.end_ns, e.kind, e.name, t.name AS thread_step
    FROM events e JOIN _run_thread t ON e.run_id = t.run_id AND e.pid = t.pid AND e.tid = t.tid
    WHERE e.ph = 'X' AND e.dur_ns > 0 AND e.depth > t.depth AND NOT is_device_kind(e.kind)
      AND e.kind NOT IN ('python_function', 'profiler_span', 'overhead')
), _host_keys AS MATERIALIZED (
    -- each distinct name's key once, not every event's (name_key is five regular expressions)
    SELECT name, name_key(name) AS key
    FROM (SELECT DISTINCT name FROM _host_events WHERE thread_step IS NOT NULL AND kind IN ('user_annotation', 'cpu_op'))
), _host_work AS (
    -- the step thread's host work below the step annotation (the annotation itself covers the step)
    SELECT h.run_id, h.event_id, h.parent_id, h.ts_ns, h.end_ns
    FROM _host_events h LEFT JOIN _host_keys k ON k.name = h.name
    WHERE NOT (h.thread_step IS NOT NULL AND h.kind IN ('user_annotation', 'cpu_op') AND k.key = h.thread_step)
), _host_intervals AS (
    -- an event inside its parent, itself host work, adds nothing to their union: the union's windows
    -- then sort the outer events only
    SELECT c.run_id, 0 AS lane, c.ts_ns, c.end_ns
    FROM _host_work c LEFT JOIN _host_work p ON p.event_id = c.parent_id
    WHERE p.event_id IS NULL OR c.ts_ns < p.ts_ns OR c.end_ns > p.end_ns
), _host_blocks AS (
    SELECT * FROM interval_union('_host_intervals')
), _hw AS (
    SELECT run_id, step_index, 0 AS lane, start_ns, end_ns FROM _w
), _host AS (
    SELECT run_id, step_index, busy_ns FROM busy_between('_hw', '_host_blocks')
), _tested AS (
    SELECT w.*, g.all_ns, g.kernel_ns, g.compute_busy_ns, g.comm_busy_ns, h.busy_ns AS host_busy_ns, p.phase, p.phase_reason
    FROM _w w
    LEFT JOIN _gpu g USING (run_id, step_index)
    LEFT JOIN _host h USING (run_id, step_index)
    JOIN step_phases_named(step_name) p USING (run_id, step_index)
)
SELECT run_id, step_index, name, annotation, event_id, source, start_ns, end_ns, dur_ns, phase, phase_reason,
       device,
       CAST(all_ns AS BIGINT) AS busy_ns,
       CAST(compute_busy_ns AS BIGINT) AS compute_ns,
       CAST(comm_busy_ns AS BIGINT) AS comm_ns,
       CAST(kernel_ns - compute_busy_ns AS BIGINT) AS comm_exposed_ns,
       CAST(all_ns - kernel_ns AS BIGINT) AS memcpy_ns,
       CAST(dur_ns - all_ns AS BIGINT) AS idle_ns,
       CAST(coalesce(host_busy_ns, 0) AS BIGINT) AS host_ns,
       pid, tid
FROM _tested
ORDER BY run_id, step_index;

-- One row per step per run, by the step rule (see above), with its phase and where its time went on
-- the run's main device. On that device, busy_ns = compute_ns + comm_exposed_ns + memcpy_ns and
-- dur_ns = busy_ns + idle_ns exactly. Diff, report and rules read their steps here.
CREATE OR REPLACE VIEW steps(
    -- the run
    run_id,
    -- 0, 1, ... in time order within the run
    step_index,
    -- the step annotation without a trailing `#N`; NULL when the whole run is one step
    name,
    -- the delimiting annotation as written (`ProfilerStep#12`); NULL for a whole-run step
    annotation,
    -- the delimiting event; NULL for a whole-run step
    event_id,
    -- which branch of the rule chose the annotation (see `step_windows.source`)
    source,
    -- start of the step
    start_ns,
    -- end of the step
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- `steady`, `warm-up`, `capture` or `profiler` (see above)
    phase,
    -- the evidence for the phase, with its numbers
    phase_reason,
    -- the main device the breakdown is on (`main_device`); NULL for a run without GPU work, and
    -- then every GPU column below is NULL
    device,
    -- GPU busy time in the step: the union of kernels, memcpys and memsets on the device
    busy_ns,
    -- union of the device's non-communication kernels in the step
    compute_ns,
    -- union of the device's communication kernels in the step
    comm_ns,
    -- communication time in the step not overlapped by compute kernels (comm_ns minus its overlap
    -- with compute_ns)
    comm_exposed_ns,
    -- memcpy/memset time in the step not overlapped by any kernel
    memcpy_ns,
    -- the step's time with the device idle: dur_ns - busy_ns
    idle_ns,
    -- on the step's thread (`pid`, `tid`), the union of the complete host events nested below the step
    -- annotation (ops, runtime and driver calls, inner annotations; not Python frames or profiler
    -- spans), clipped to the step: the time that thread was inside traced host work; for a whole-run
    -- step, the union of every host event of the thread with the most top-level host time
    host_ns,
    -- process of the step's thread
    pid,
    -- the step's thread
    tid
) AS
SELECT run_id, step_index, name, annotation, event_id, source, start_ns, end_ns, dur_ns, phase, phase_reason, device,
       busy_ns, compute_ns, comm_ns, comm_exposed_ns, memcpy_ns, idle_ns, host_ns, pid, tid
FROM steps_named(NULL);
