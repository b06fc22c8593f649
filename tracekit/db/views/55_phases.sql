-- Phases: the run's time split into steady state and the windows that are not (warm-up, CUDA-graph
-- capture, profiler bookkeeping), with the evidence for each. Rules analyse the steady state by
-- default and say what they left out.
--
-- Step phases (`step_phases`) classify whole steps, but many traces have no step markers (the
-- whole run is one step), so the cold part of a run is also found inside it: a GPU idle gap that
-- cold host work explains is not steady-state idle. On the corpus, the warm-up gaps of cold
-- iterations are 82-100% covered by one or two such calls (a 6.0 s `cudaFree` and a 3.1 s first
-- `cudaLaunchKernel` in a 10.0 s gap; a 0.64 s `cudaStreamCreateWithFlags` in a 0.64 s gap; a 6.5 ms
-- first `hipLaunchKernel` in a 6.6 ms gap), while steady-state gaps hold none: such calls there last
-- about one launch (`cudaEventCreate` 2-5 us), under `phase_cold_call_factor()` medians.

-- A lazy-initialisation, allocation or first-launch call is cold evidence when it lasts more than
-- this many times the run's median kernel launch call (the step rule's `step_warmup_launch_factor()`
-- uses the same factor for the first launch): context creation, module loading and allocator growth
-- take milliseconds to seconds, a steady-state launch microseconds. A lazy-init or allocation call
-- must also last more than this many times the median call of its own name (when the run holds at
-- least three): `cudaMalloc`/`cudaFree` take 0.2-2 ms whenever the caching allocator grows, and a
-- long call that keeps recurring at the same length (`torch.cuda.empty_cache()` every step) is
-- steady-state behaviour worth reporting, while start-up outliers are 100-5000x their name's median
-- on the corpus (`cudaFree` 6.0 s against 1.5 ms, `cudaStreamCreateWithFlags` 0.64 s against 2 us).
CREATE OR REPLACE MACRO phase_cold_call_factor() AS 10.0;

-- A convolution op whose first call with given input shapes lasts more than this many times the
-- median of its later calls with the same shapes ran the cuDNN/MIOpen algorithm search
-- (`torch.backends.cudnn.benchmark`): warm-up.
CREATE OR REPLACE MACRO phase_autotune_factor() AS 10.0;

-- A GPU idle gap is left out of the steady state when the union of the cold evidence that overlaps
-- it covers at least this share of it: the host was busy with start-up, not with the workload. The
-- warm-up gaps of the corpus are covered 82-100%; gaps covered less mix cold and steady host work
-- and stay steady (analysed).
CREATE OR REPLACE MACRO phase_gap_cover_share() AS 0.5;

-- A run has no steady state worth analysing when at least this share of its main device's active
-- window (first to last GPU activity) is left out and fewer than two steady steps hold GPU work:
-- rules then report nothing idle-like and P001 cold-profile says how to profile instead.
CREATE OR REPLACE MACRO phase_min_left_out_share() AS 0.9;

-- A duration as the phase reasons print it, by magnitude: `6.01 s`, `3.06 ms`, `8.5 us`.
CREATE OR REPLACE MACRO phase_duration_text(ns) AS
    CASE WHEN ns >= 1e9 THEN printf('%.2f s', ns / 1e9) WHEN ns >= 1e6 THEN printf('%.2f ms', ns / 1e6)
         ELSE printf('%.1f us', ns / 1e3) END;

-- One row per host event that shows the run is not in its steady state, with the phase it shows:
--
-- - `warm-up`, evidence `context creation`: the first runtime call of a process, when it lasts
--   more than `phase_cold_call_factor()` times the run's median kernel launch call (the CUDA
--   context is created inside whatever call comes first);
-- - `warm-up`, `lazy init`: `cuModuleLoad*`, `cuLibraryLoad*`, `cuModuleGetFunction`,
--   `cudaStreamCreate*`, `cudaEventCreate*`, `cuCtxCreate*`, cuDNN/cuBLAS/cuBLASLt/MIOpen/rocBLAS
--   handle creation and their `hip*`/`cu*` forms; `allocation`: `cudaMalloc*`, `cudaHostAlloc`,
--   `cudaFree*` and their forms; both when longer than `phase_cold_call_factor()` times the median
--   launch call and than that factor times the median call of their name;
-- - `warm-up`, `first launch`: the call that first launched a kernel (by name), when longer than
--   `phase_cold_call_factor()` times the median launch call (CUDA lazy module loading, HIP
--   code-object loading happen inside it);
-- - `warm-up`, `autotune`: `cudnnFind*` / `miopenFind*` calls, and the first call of a convolution
--   op with given input shapes when it lasts more than `phase_autotune_factor()` times the median of
--   its later calls with the same shapes (cudnn.benchmark's algorithm search);
-- - `warm-up`, `warm-up annotation`: a user annotation whose name says warm-up (`warmup`,
--   `warm_up`, `warm-up` as a word: benchmark harnesses label their warm-up iterations);
-- - `capture`, `capture region`: from `cudaStreamBeginCapture` to the next `cudaStreamEndCapture` on
--   the thread (and the `cu*`/`hip*` forms), from `capture_begin` to the next `capture_end`
--   (torch.cuda.CUDAGraph), and spans named like a graph capture (`capture_cudagraphs`, vLLM
--   `_capture_cudagraphs`, `capture_model`, `graph_capture`): the captured kernels do not run;
--   `graph instantiation`: `cudaGraphInstantiate*` calls;
-- - `profiler`, `profiler overhead`: the profiler's own events (`overhead` kind: Kineto's
--   `Activity Buffer Request`, CUPTI buffer flushes).
--
-- Cost: one scan of the runtime calls, of the launches' first calls, of the convolution ops and of
-- the events named like captures and warm-up.
CREATE OR REPLACE VIEW phase_evidence(
    -- the run
    run_id,
    -- the host event (for a capture region, the event that opens it)
    event_id,
    -- `warm-up`, `capture` or `profiler`
    phase,
    -- what kind of evidence (see above): `context creation`, `lazy init`, `allocation`, `first
    -- launch`, `autotune`, `warm-up annotation`, `capture region`, `graph instantiation`,
    -- `profiler overhead`
    evidence,
    -- the event's name (for a capture region, the name of the event that opens it)
    name,
    -- process
    pid,
    -- thread
    tid,
    -- start of the event (or region)
    start_ns,
    -- its end
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- the numbers behind it: the call's length against the median launch call, the kernel it first
    -- launched, the later calls of the op
    detail
) AS
WITH _median_launch AS (
    SELECT run_id, median(dur_ns) AS median_ns FROM runtime_calls
    WHERE regexp_matches(name, '^(cuda|cu|hip|hipExt)(Module)?LaunchKernel') GROUP BY run_id
), _first_calls AS (
    SELECT run_id, pid, arg_min(event_id, (ts_ns, event_id)) AS event_id FROM runtime_calls GROUP BY run_id, pid
), _long AS (
    -- aggregates, not window functions, over the calls: only the few long ones are looked at closer
    SELECT r.run_id, r.event_id, r.name, r.pid, r.tid, r.ts_ns, r.end_ns, r.dur_ns, m.median_ns,
           r.event_id IN (SELECT event_id FROM _first_calls) AS first_of_process,
           CASE WHEN regexp_matches(r.name, '^(cuda|hip)(Malloc|MallocHost|MallocAsync|MallocManaged|HostAlloc|Free|FreeHost|FreeAsync)$'
                                            || '|^cuMem(Alloc|Free|HostAlloc|AllocHost)') THEN 'allocation'
                WHEN regexp_matches(r.name, '^(cuModuleLoad|cuLibraryLoad|cuModuleGetFunction|cuLibraryGetKernel|cuCtxCreate'
                                            || '|cuDevicePrimaryCtxRetain|cudaStreamCreate|cudaEventCreate|cuStreamCreate'
                                            || '|cuEventCreate|hipModuleLoad|hipStreamCreate|hipEventCreate|cudnnCreate'
                                            || '|cublasCreate|cublasLtCreate|hipblasCreate|hipblasLtCreate|miopenCreate'
                                            || '|rocblas_create)') THEN 'lazy init'
           END AS cold_kind
    FROM runtime_calls r JOIN _median_launch m USING (run_id)
    WHERE r.dur_ns > phase_cold_call_factor() * m.median_ns
), _name_stats AS (
    SELECT run_id, name, count(*) AS name_calls, median(dur_ns) AS name_median_ns FROM runtime_calls
    WHERE name IN (SELECT name FROM _long WHERE cold_kind IS NOT NULL) GROUP BY run_id, name
), _cold_calls AS (
    SELECT l.run_id, l.event_id, 'warm-up' AS phase,
           CASE WHEN l.first_of_process THEN 'context creation' ELSE l.cold_kind END AS evidence, l.name, l.pid, l.tid,
           l.ts_ns, l.end_ns,
           printf('%s call %s, %.0fx the median launch call (%.1f us)', l.name, phase_duration_text(l.dur_ns),
                  l.dur_ns / l.median_ns, l.median_ns / 1e3) AS detail
    FROM _long l LEFT JOIN _name_stats n USING (run_id, name)
    WHERE l.first_of_process
       OR (l.cold_kind IS NOT NULL AND (n.name_calls < 3 OR l.dur_ns > phase_cold_call_factor() * n.name_median_ns))
), _first_of_kernel AS (
    SELECT run_id, gpu_name, arg_min(runtime_event_id, (launch_ts_ns, runtime_event_id)) AS runtime_event_id
    FROM launches WHERE gpu_kind = 'kernel' GROUP BY run_id, gpu_name
), _first_launches AS (
    SELECT r.run_id, r.event_id AS runtime_event_id, any_value(r.name) AS name, any_value(r.pid) AS pid,
           any_value(r.tid) AS tid, any_value(r.ts_ns) AS ts_ns, any_value(r.end_ns) AS end_ns,
           any_value(r.dur_ns) AS dur_ns, min(k.gpu_name) AS kernel, count(*) AS kernels
    FROM _first_of_kernel k JOIN runtime_calls r ON r.event_id = k.runtime_event_id
    GROUP BY r.run_id, r.event_id
), _cold_launches AS (
    SELECT l.run_id, l.runtime_event_id, 'warm-up', 'first launch', l.name, l.pid, l.tid, l.ts_ns, l.end_ns,
           printf('first launch of %s%s: %s call %s, %.0fx the median launch call (%.1f us)', l.kernel,
                  CASE WHEN l.kernels > 1 THEN printf(' and %d more kernels', l.kernels - 1) ELSE '' END,
                  l.name, phase_duration_text(l.dur_ns), l.dur_ns / m.median_ns, m.median_ns / 1e3)
    FROM _first_launches l JOIN _median_launch m USING (run_id)
    WHERE l.dur_ns > phase_cold_call_factor() * m.median_ns
      AND l.runtime_event_id NOT IN (SELECT event_id FROM _cold_calls)
), _conv AS (
    SELECT run_id, event_id, name, pid, tid, ts_ns, end_ns, dur_ns, CAST(input_dims AS VARCHAR) AS shapes,
           row_number() OVER (PARTITION BY run_id, name, CAST(input_dims AS VARCHAR) ORDER BY ts_ns, event_id) AS nth
    FROM cpu_ops WHERE contains(name, 'convolution') AND dur_ns > 0
), _conv_later AS (
    SELECT *, median(dur_ns) FILTER (WHERE nth > 1) OVER (PARTITION BY run_id, name, shapes) AS later_median_ns,
           count(*) OVER (PARTITION BY run_id, name, shapes) AS sig_calls
    FROM _conv
), _autotune AS (
    SELECT run_id, event_id, 'warm-up', 'autotune', name, pid, tid, ts_ns, end_ns,
           printf('first %s with these input shapes took %s, %.0fx the median of its %d later calls (%s): '
                  || 'algorithm search (cudnn.benchmark)', name, phase_duration_text(dur_ns),
                  dur_ns / later_median_ns, sig_calls - 1, phase_duration_text(later_median_ns))
    FROM _conv_later WHERE nth = 1 AND dur_ns > phase_autotune_factor() * later_median_ns
    UNION ALL
    SELECT run_id, event_id, 'warm-up', 'autotune', name, pid, tid, ts_ns, end_ns,
           printf('%s call %s: algorithm search', name, phase_duration_text(dur_ns))
    FROM runtime_calls WHERE regexp_matches(name, '^(cudnn|miopen)Find')
), _named AS (
    SELECT run_id, event_id, name, kind, pid, tid, ts_ns, end_ns,
           CASE WHEN regexp_matches(name, '^(cuda|cu|hip)StreamBeginCapture') OR contains(name, 'capture_begin') THEN 'begin'
                WHEN regexp_matches(name, '^(cuda|cu|hip)StreamEndCapture') OR contains(name, 'capture_end') THEN 'end'
                WHEN regexp_matches(name, '^(cuda|cu|hip)GraphInstantiate') THEN 'instantiate'
                WHEN regexp_matches(lower(name), 'capture_?cuda_?graphs?|cuda_?graph_?capture|graph_capture|capture_model')
                     AND dur_ns > 0 THEN 'span'
                WHEN kind = 'user_annotation' AND regexp_matches(lower(name), '(^|[^a-z])warm[-_ ]?up([^a-z]|$)')
                     AND dur_ns > 0 THEN 'warm-up'
           END AS mark
    FROM events
    WHERE NOT is_device_kind(kind) AND kind <> 'flow'
      AND (contains(lower(name), 'capture') OR contains(name, 'GraphInstantiate') OR contains(lower(name), 'warm'))
), _capture_regions AS (
    SELECT b.run_id, b.event_id, 'capture', 'capture region', b.name, b.pid, b.tid, b.ts_ns, e.end_ns,
           printf('CUDA-graph capture from %s to %s: %s in which the captured kernels do not run', b.name, e.name,
                  phase_duration_text(e.end_ns - b.ts_ns))
    FROM (SELECT * FROM _named WHERE mark = 'end') e
    ASOF JOIN (SELECT * FROM _named WHERE mark = 'begin') b
      ON b.run_id = e.run_id AND b.pid IS NOT DISTINCT FROM e.pid AND b.tid IS NOT DISTINCT FROM e.tid AND e.ts_ns >= b.ts_ns
    UNION ALL
    SELECT run_id, event_id, 'capture', 'capture region', name, pid, tid, ts_ns, end_ns,
           printf('%s span of %s: CUDA-graph capture, the captured kernels do not run', name, phase_duration_text(end_ns - ts_ns))
    FROM _named WHERE mark = 'span'
    UNION ALL
    SELECT run_id, event_id, 'capture', 'graph instantiation', name, pid, tid, ts_ns, end_ns,
           printf('%s call %s', name, phase_duration_text(end_ns - ts_ns))
    FROM _named WHERE mark = 'instantiate'
    UNION ALL
    SELECT run_id, event_id, 'warm-up', 'warm-up annotation', name, pid, tid, ts_ns, end_ns,
           printf('annotation %s (%s) names a warm-up', name, phase_duration_text(end_ns - ts_ns))
    FROM _named WHERE mark = 'warm-up'
), _profiler AS (
    SELECT run_id, event_id, 'profiler', 'profiler overhead', name, pid, tid, ts_ns, end_ns,
           printf('profiler bookkeeping %s (%s)', name, phase_duration_text(end_ns - ts_ns))
    FROM events WHERE kind = 'overhead' AND dur_ns > 0
)
SELECT run_id, event_id, phase, evidence, name, pid, tid, ts_ns, end_ns, end_ns - ts_ns, detail
FROM (SELECT * FROM _cold_calls UNION ALL SELECT * FROM _cold_launches UNION ALL SELECT * FROM _autotune
      UNION ALL SELECT * FROM _capture_regions UNION ALL SELECT * FROM _profiler);

-- One row per window of a run that is not steady state, with the evidence for it (windows of one
-- run may overlap; `run_phases` tiles them):
--
-- - `step`: a step whose `step_phases.phase` is not `steady`;
-- - `idle gap`: a GPU idle gap of a device (`gpu_busy`) that the cold evidence overlapping it
--   (`phase_evidence`) covers for at least `phase_gap_cover_share()` of its length; its phase is
--   the phase of the evidence that covers most of it;
-- - `region`: a capture region, warm-up annotation or autotuning op itself (the GPU work inside
--   one is not the workload's steady state either: benchmark kernels, warm-up iterations).
--
-- Cost: `step_phases`, `phase_evidence`, and a range join of the evidence with the GPU idle gaps
-- (the evidence is a few calls per run).
CREATE OR REPLACE VIEW phase_windows(
    -- the run
    run_id,
    -- `warm-up`, `capture` or `profiler`
    phase,
    -- `step`, `idle gap` or `region` (see above)
    source,
    -- start of the window
    start_ns,
    -- end of the window
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- the GPU of an idle gap; NULL for the other sources
    device,
    -- the step of a `step` window; NULL for the other sources
    step_index,
    -- share of an idle gap covered by the evidence; NULL for the other sources
    covered_share,
    -- why it is not steady state, with the numbers
    reason
) AS
WITH _evidence AS MATERIALIZED (
    SELECT * FROM phase_evidence
), _gaps AS (
    SELECT run_id, device, end_ns AS gap_start, end_ns + next_gap_ns AS gap_end FROM gpu_busy
    WHERE next_gap_ns > 0 AND run_id IN (SELECT run_id FROM _evidence)
), _hits AS (
    SELECT g.run_id, g.device, g.gap_start, g.gap_end, e.phase, e.detail,
           greatest(e.start_ns, g.gap_start) AS ts_ns, least(e.end_ns, g.gap_end) AS end_ns
    FROM _gaps g JOIN _evidence e ON e.run_id = g.run_id AND e.start_ns < g.gap_end AND e.end_ns > g.gap_start
), _hit_intervals AS (
    SELECT run_id, {'device': device, 'gap_start': gap_start} AS lane, ts_ns, end_ns FROM _hits
), _covered AS (
    SELECT run_id, lane.device AS device, lane.gap_start AS gap_start, sum(dur_ns) AS covered_ns
    FROM interval_union('_hit_intervals') GROUP BY ALL
), _gap_phase AS (
    SELECT run_id, device, gap_start, any_value(gap_end) AS gap_end,
           arg_max(phase, (hit_ns, list_position(['profiler', 'warm-up', 'capture'], phase))) AS phase,
           string_agg(detail, '; ' ORDER BY hit_ns DESC, detail) AS details
    FROM (SELECT run_id, device, gap_start, gap_end, phase, detail, sum(end_ns - ts_ns) AS hit_ns
          FROM _hits GROUP BY ALL)
    GROUP BY run_id, device, gap_start
)
SELECT s.run_id, s.phase, 'step', w.start_ns, w.end_ns, w.end_ns - w.start_ns, NULL::INTEGER, w.step_index, NULL::DOUBLE,
       printf('step %d (%s): %s', w.step_index, coalesce(w.annotation, 'whole run'), s.phase_reason)
FROM step_phases s JOIN step_windows w USING (run_id, step_index)
WHERE s.phase <> 'steady'
UNION ALL
SELECT p.run_id, p.phase, 'idle gap', p.gap_start, p.gap_end, p.gap_end - p.gap_start, p.device, NULL,
       c.covered_ns / (p.gap_end - p.gap_start),
       printf('GPU %d idle %s, %.0f%% of it inside %s', p.device, phase_duration_text(p.gap_end - p.gap_start),
              100 * c.covered_ns / (p.gap_end - p.gap_start), p.details)
FROM _gap_phase p JOIN _covered c USING (run_id, device, gap_start)
WHERE c.covered_ns >= phase_gap_cover_share() * (p.gap_end - p.gap_start)
UNION ALL
SELECT run_id, phase, 'region', start_ns, end_ns, dur_ns, NULL, NULL, NULL, detail
FROM _evidence WHERE evidence IN ('capture region', 'warm-up annotation', 'autotune') AND dur_ns > 0;

-- Each run's window (`runs.start_ns` to `runs.end_ns`) tiled into consecutive, disjoint phases: the
-- `phase_windows` merged, where they overlap the phase of higher rank (capture, then warm-up, then
-- profiler), and `steady` for all the time between them. Rules analyse the `steady` rows by
-- default (`steady_between`, `steady_pieces`); the other rows are what they leave out, and why.
--
-- ```sql
-- -- what the rules leave out of run 1
-- SELECT phase, phase_duration_text(dur_ns), reason FROM run_phases WHERE run_id = 1 AND phase <> 'steady';
-- ```
CREATE OR REPLACE VIEW run_phases(
    -- the run
    run_id,
    -- `steady`, `warm-up`, `capture` or `profiler`
    phase,
    -- start of the piece
    start_ns,
    -- its end (the next piece's start)
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- how many `phase_windows` of this phase it merges (0 for steady time)
    windows,
    -- the reasons of up to three of those windows, longest first; NULL for steady time
    reason
) AS
WITH _windows AS MATERIALIZED (
    SELECT w.run_id, w.phase, greatest(w.start_ns, r.start_ns) AS start_ns, least(w.end_ns, r.end_ns) AS end_ns,
           w.reason, list_position(['capture', 'warm-up', 'profiler'], w.phase) AS rank
    FROM phase_windows w JOIN runs r USING (run_id)
    WHERE least(w.end_ns, r.end_ns) > greatest(w.start_ns, r.start_ns)
), _points AS (
    SELECT run_id, start_ns AS t FROM _windows UNION SELECT run_id, end_ns FROM _windows
    UNION SELECT run_id, start_ns FROM runs WHERE start_ns IS NOT NULL
    UNION SELECT run_id, end_ns FROM runs WHERE end_ns IS NOT NULL
), _segments AS (
    SELECT run_id, t AS start_ns, lead(t) OVER (PARTITION BY run_id ORDER BY t) AS end_ns FROM _points
), _labelled AS (
    SELECT s.run_id, s.start_ns, s.end_ns, coalesce(min(w.rank), 0) AS rank
    FROM _segments s LEFT JOIN _windows w ON w.run_id = s.run_id AND w.start_ns < s.end_ns AND w.end_ns > s.start_ns
    WHERE s.end_ns IS NOT NULL
    GROUP BY s.run_id, s.start_ns, s.end_ns
), _islands AS (
    SELECT *, sum(CASE WHEN rank IS DISTINCT FROM prev_rank THEN 1 ELSE 0 END)
                  OVER (PARTITION BY run_id ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS island
    FROM (SELECT *, lag(rank) OVER (PARTITION BY run_id ORDER BY start_ns) AS prev_rank FROM _labelled)
), _merged AS (
    SELECT run_id, island, any_value(rank) AS rank, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM _islands GROUP BY run_id, island
)
SELECT m.run_id, coalesce(['capture', 'warm-up', 'profiler'][m.rank], 'steady') AS phase, m.start_ns, m.end_ns,
       m.end_ns - m.start_ns AS dur_ns, count(w.run_id) AS windows,
       array_to_string(list(w.reason ORDER BY w.end_ns - w.start_ns DESC, w.start_ns)[1:3], ' | ') AS reason
FROM _merged m
LEFT JOIN _windows w ON m.rank > 0 AND w.run_id = m.run_id AND w.rank = m.rank
                    AND w.start_ns < m.end_ns AND w.end_ns > m.start_ns
GROUP BY m.run_id, m.rank, m.start_ns, m.end_ns
ORDER BY m.run_id, m.start_ns;

-- Steady and left-out time inside each of a set of windows, without a range join. `windows` names a
-- relation with run_id, start_ns, end_ns (any other columns pass through).
-- Returns every window row with `left_out_ns` (time in `run_phases` that is not steady) and
-- `steady_ns` (the rest) added; with `all_phases` true nothing is left out. `phases` names the
-- relation the phases are read from: `run_phases`, or a table holding its rows (rules compute the
-- view once per analysis).
--
-- Cost: two ASOF joins of the windows against the left-out pieces of `run_phases`, and `run_phases`
-- itself unless `phases` names a table of it.
CREATE OR REPLACE MACRO steady_between(windows, all_phases := false, phases := 'run_phases') AS TABLE
-- busy_between's two ASOF lookups against the left-out pieces, with columns of their own so that the
-- windows may carry any columns (a `lane` too)
WITH _steady_windows AS MATERIALIZED (
    SELECT *, row_number() OVER () AS _steady_window FROM query_table(windows)
), _left_out AS (
    SELECT run_id AS _lo_run, start_ns AS _lo_start, end_ns AS _lo_end,
           coalesce(sum(dur_ns) OVER (PARTITION BY run_id ORDER BY start_ns
                                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS _lo_before
    FROM query_table(phases) WHERE phase <> 'steady' AND NOT all_phases
), _lo_at_start AS (
    SELECT w._steady_window, coalesce(b._lo_before + least(w.start_ns, b._lo_end) - b._lo_start, 0) AS left_out
    FROM _steady_windows w ASOF LEFT JOIN _left_out b ON w.run_id = b._lo_run AND w.start_ns >= b._lo_start
), _lo_at_end AS (
    SELECT w._steady_window, coalesce(b._lo_before + least(w.end_ns, b._lo_end) - b._lo_start, 0) AS left_out
    FROM _steady_windows w ASOF LEFT JOIN _left_out b ON w.run_id = b._lo_run AND w.end_ns >= b._lo_start
)
SELECT w.* EXCLUDE (_steady_window), CAST(e.left_out - s.left_out AS BIGINT) AS left_out_ns,
       CAST(w.end_ns - w.start_ns - (e.left_out - s.left_out) AS BIGINT) AS steady_ns
FROM _steady_windows w JOIN _lo_at_start s USING (_steady_window) JOIN _lo_at_end e USING (_steady_window)
ORDER BY w._steady_window;

-- The steady parts of each of a set of windows: a window inside steady time comes back as it is,
-- one that overlaps left-out time (`run_phases`) as one row per steady piece of it, with start_ns and
-- end_ns clipped to that piece, and one wholly left out not at all. `windows`, `all_phases` and
-- `phases` as in `steady_between`; with `all_phases` true every window comes back whole.
--
-- Cost: `steady_between`, and a range join with the steady pieces for the few windows that overlap
-- left-out time.
CREATE OR REPLACE MACRO steady_pieces(windows, all_phases := false, phases := 'run_phases') AS TABLE
WITH _split AS (
    SELECT * FROM steady_between(windows, all_phases := all_phases, phases := phases)
), _steady AS (
    -- the steady pieces of the runs that have left-out time: the only ones a window can be cut by
    SELECT run_id AS _piece_run, start_ns AS _piece_start, end_ns AS _piece_end FROM query_table(phases)
    WHERE phase = 'steady' AND NOT all_phases
      AND run_id IN (SELECT run_id FROM query_table(phases) WHERE phase <> 'steady')
)
-- one relation, not a union of the whole and the cut windows: busy lookups over a union's rows
-- (gpu_busy_between) are planned as a join of every window with every other
SELECT * EXCLUDE (start_ns, end_ns, left_out_ns, steady_ns, _piece_run, _piece_start, _piece_end),
       CASE WHEN _piece_run IS NULL THEN start_ns ELSE greatest(start_ns, _piece_start) END AS start_ns,
       CASE WHEN _piece_run IS NULL THEN end_ns ELSE least(end_ns, _piece_end) END AS end_ns
FROM _split LEFT JOIN _steady
  ON left_out_ns > 0 AND _piece_run = run_id AND _piece_start < end_ns AND _piece_end > start_ns
WHERE left_out_ns = 0 OR (_piece_run IS NOT NULL AND steady_ns > 0);

-- The rows of `run_steady`, with the phases read from the relation `phases` (as in
-- `steady_between`). Same columns as `run_steady`.
--
-- Cost: `gpu_busy_between` and `steady_between` over the steps, and `run_phases` unless `phases`
-- names a table of it.
CREATE OR REPLACE MACRO run_steady_of(phases := 'run_phases') AS TABLE
WITH _active AS (
    SELECT g.run_id, min(g.start_ns) AS start_ns, max(g.end_ns) AS end_ns
    FROM gpu_busy g JOIN main_device m ON m.run_id = g.run_id AND m.device = g.device GROUP BY g.run_id
), _active_split AS (
    SELECT * FROM steady_between('_active', phases := phases)
), _by_phase AS (
    SELECT run_id, sum(dur_ns) FILTER (WHERE phase = 'steady') AS steady_ns,
           coalesce(sum(dur_ns) FILTER (WHERE phase = 'warm-up'), 0) AS warm_up_ns,
           coalesce(sum(dur_ns) FILTER (WHERE phase = 'capture'), 0) AS capture_ns,
           coalesce(sum(dur_ns) FILTER (WHERE phase = 'profiler'), 0) AS profiler_ns
    FROM query_table(phases) GROUP BY run_id
), _step_gpu AS (
    SELECT w.run_id, w.step_index, w.start_ns, w.end_ns, m.device FROM step_windows w JOIN main_device m USING (run_id)
    WHERE m.device IS NOT NULL
), _step_busy AS (
    SELECT * FROM gpu_busy_between('_step_gpu', 'all')
), _steps AS (
    -- a step of another phase is left out whole: a steady step is one mostly in steady time
    SELECT run_id, count(*) AS steps, count(*) FILTER (WHERE 2 * steady_ns > end_ns - start_ns AND busy_ns > 0)
               AS steady_gpu_steps
    FROM steady_between('_step_busy', phases := phases) GROUP BY run_id
)
SELECT r.run_id, r.end_ns - r.start_ns AS window_ns, CAST(coalesce(p.steady_ns, 0) AS BIGINT) AS steady_ns,
       CAST(coalesce(p.warm_up_ns, 0) AS BIGINT) AS warm_up_ns, CAST(coalesce(p.capture_ns, 0) AS BIGINT) AS capture_ns,
       CAST(coalesce(p.profiler_ns, 0) AS BIGINT) AS profiler_ns, a.end_ns - a.start_ns AS active_ns,
       a.steady_ns AS active_steady_ns, coalesce(s.steps, 0) AS steps, coalesce(s.steady_gpu_steps, 0) AS steady_gpu_steps,
       coalesce(a.left_out_ns >= phase_min_left_out_share() * (a.end_ns - a.start_ns) AND coalesce(s.steady_gpu_steps, 0) < 2,
                false) AS all_cold
FROM runs r LEFT JOIN _by_phase p USING (run_id) LEFT JOIN _active_split a USING (run_id) LEFT JOIN _steps s USING (run_id);

-- One row per run: how much of it is steady state, what was left out by phase, and whether a steady
-- state worth analysing is there at all (see `phase_min_left_out_share()`).
CREATE OR REPLACE VIEW run_steady(
    -- the run
    run_id,
    -- runs.end_ns - runs.start_ns
    window_ns,
    -- steady time of the run window
    steady_ns,
    -- warm-up time left out
    warm_up_ns,
    -- capture time left out
    capture_ns,
    -- profiler bookkeeping time left out
    profiler_ns,
    -- the main device's active window: first start to last end of its GPU activities (NULL without GPU
    -- work)
    active_ns,
    -- steady time inside that active window
    active_steady_ns,
    -- steps of the run (`step_phases`)
    steps,
    -- steady steps with GPU work on the main device (steps mostly in steady time: a step of another
    -- phase is left out whole)
    steady_gpu_steps,
    -- no steady state worth analysing: at least `phase_min_left_out_share()` of the active window left
    -- out and fewer than two steady steps with GPU work
    all_cold
) AS
SELECT run_id, window_ns, steady_ns, warm_up_ns, capture_ns, profiler_ns, active_ns, active_steady_ns, steps,
       steady_gpu_steps, all_cold
FROM run_steady_of();
