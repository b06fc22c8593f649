-- Data quality: whether a trace holds what the rules' numbers are built on. A sampled or filtered
-- trace (HTA's trace_filter output), dropped GPU records or broken flows still ingest cleanly, and then an idle or overlap share describes the missing data,
-- not the workload. Each check measures one thing with its threshold; `tracekit analyze` prints the
-- flagged ones as data-quality notes, and findings built on what they affect are lowered in
-- confidence (and held at info when `caps_severity`).

-- A device idle longer than this share of the run window while its next activity had already been
-- launched means GPU records are missing. On the corpus: at most 0.016 on complete traces,
-- 0.25 on HTA's event-sampled traces and 0.53 on the trace HTA keeps for its negative queue lengths.
CREATE OR REPLACE MACRO dq_max_queued_idle_share() AS 0.05;

-- A run whose GPU activities lack a launch record more often than this cannot attribute that
-- share of its idle time to the host (on the corpus: 0 on most traces, 0.04-0.11 on a few).
CREATE OR REPLACE MACRO dq_max_unlaunched_share() AS 0.05;

-- A run whose flow arrows lack their end more often than this lost events at the window's edges
-- or in the profiler's buffers (on the corpus: up to 0.15 on complete traces, 1.0 on one without
-- GPU activity records).
CREATE OR REPLACE MACRO dq_max_open_flow_share() AS 0.5;

-- A run whose busiest device holds less GPU work than this (ns of busy time, every activity merged)
-- is a toy or a unit-test fixture, not a workload whose owner tunes it: idle and overlap shares of a
-- few hundred microseconds of work say nothing about the real job. On the corpus and the project's
-- samples the fixtures hold 0.15-0.75 ms (a 16-activity ROCm toy, HTA's 5-iteration gemv loop, a
-- 6-kernel event-sync sample, the RoPE and capture samples) and every real workload 2 ms or more.
CREATE OR REPLACE MACRO dq_min_gpu_work_ns() AS 1000000;

-- One row per (run, check): what was measured, the threshold, whether it is flagged, what it says
-- with its numbers, and which measurements it undermines. Checks:
--
-- - `idle_with_work_queued`: share of the run window during which a device is idle although the
--   activity that ends the gap had been launched before the gap began (`idle_gaps` cause `other`
--   with a launch record), on the device with the most such idle time. A complete trace cannot show that: the device would be running
--   the queued work. So GPU records are missing (an event-sampled or filtered trace, records
--   dropped by CUPTI) or another process shares the device. Undermines the GPU timeline: idle,
--   busy and overlap shares.
-- - `gpu_work_without_launch`: share of GPU activities with no runtime call of their correlation id
--   (runs with at least one launch record: G001 notes a run without any). Undermines host attribution of idle time and launch statistics.
-- - `flows_without_end`: share of flow arrows without their end event.
-- - `too_little_gpu_work`: GPU busy time of the run's busiest device, flagged below
--   `dq_min_gpu_work_ns()`: a capture too small to judge a steady state. Undermines the GPU
--   timeline (its shares).
-- - `profiler_dropped_records`: activity records the profiler itself reports dropping (Kineto
--   writes its `Dropped N activity records` warnings into the trace's metadata when its logger
--   metadata is kept), as a share of the GPU activities and runtime calls kept. Undermines the GPU
--   timeline and host attribution.
--
-- A capture without a steady step is not a check here: `steps.phase` says which steps are
-- start-up, capture or profiler bookkeeping, and the rules that measure steady state read it.
CREATE OR REPLACE VIEW data_quality(
    -- the run
    run_id,
    -- the check's name (see above)
    check_name,
    -- what was measured: a share (GPU busy ns for `too_little_gpu_work`)
    value,
    -- the threshold: flagged above it
    threshold,
    -- whether the value is past the threshold (above it; below it for `too_little_gpu_work`)
    flagged,
    -- one sentence with the numbers, for the report
    detail,
    -- the measurements the check undermines: `gpu_timeline`, `launch_attribution`
    affects,
    -- whether a finding built on an affected measurement is held at info while flagged (else only
    -- its confidence is lowered)
    caps_severity
) AS
WITH windows AS (
    SELECT run_id, end_ns - start_ns AS window_ns FROM runs WHERE end_ns > start_ns
), per_device AS (
    SELECT run_id, device,
           count(*) FILTER (WHERE cause = 'other' AND runtime_event_id IS NOT NULL) AS gaps,
           coalesce(sum(dur_ns) FILTER (WHERE cause = 'other' AND runtime_event_id IS NOT NULL), 0) AS idle_ns
    FROM idle_gaps GROUP BY run_id, device
), queued AS (
    SELECT run_id, arg_max(device, idle_ns) AS device, arg_max(gaps, idle_ns) AS gaps, max(idle_ns) AS idle_ns
    FROM per_device GROUP BY run_id
), launched AS (
    SELECT a.run_id, count(*) AS activities, count(f.gpu_event_id) AS with_launch
    FROM gpu_activities a LEFT JOIN first_launches f ON f.run_id = a.run_id AND f.gpu_event_id = a.event_id
    GROUP BY a.run_id HAVING count(f.gpu_event_id) > 0
), flow_ends AS (
    SELECT run_id, count(*) AS flows, count(*) FILTER (WHERE end_event_id IS NULL) AS open FROM flows GROUP BY run_id
), dropped AS (
    SELECT r.run_id, sum(CAST(n AS BIGINT)) AS records,
           (SELECT count(*) FROM gpu_activities a WHERE a.run_id = r.run_id)
           + (SELECT count(*) FROM runtime_calls c WHERE c.run_id = r.run_id) AS kept
    FROM runs r, unnest(regexp_extract_all(CAST(r.metadata AS VARCHAR), 'Dropped ([0-9]+) [a-z ]*records', 1)) AS t(n)
    GROUP BY r.run_id
), busiest AS (
    SELECT run_id, max(busy_ns) AS busy_ns
    FROM (SELECT run_id, device, sum(dur_ns) AS busy_ns FROM gpu_busy GROUP BY run_id, device) GROUP BY run_id
), checks AS (
    SELECT q.run_id, 'idle_with_work_queued' AS check_name, q.idle_ns / w.window_ns AS value,
           dq_max_queued_idle_share() AS threshold, q.idle_ns / w.window_ns > dq_max_queued_idle_share() AS flagged,
           CASE WHEN q.gaps = 0 THEN 'no device idles with its next work already launched'
                ELSE format('GPU {} idles {} ms ({:.1f}% of the window) in {} gaps although the work that ends each '
                            'gap was already launched: GPU activity records are missing (a sampled or filtered trace, '
                            'records dropped by the profiler) or another process shares the GPU; idle, busy and '
                            'overlap shares are not reliable',
                            q.device, round(q.idle_ns / 1e6, 2), 100 * q.idle_ns / w.window_ns, q.gaps) END AS detail,
           ['gpu_timeline'] AS affects, true AS caps_severity
    FROM queued q JOIN windows w ON w.run_id = q.run_id
    UNION ALL
    SELECT run_id, 'gpu_work_without_launch', 1 - with_launch / activities, dq_max_unlaunched_share(),
           1 - with_launch / activities > dq_max_unlaunched_share(),
           format('{} of {} GPU activities ({:.1f}%) have no launch record (no runtime call with their correlation '
                  'id): idle before them cannot be attributed to the host', activities - with_launch, activities,
                  100 * (1 - with_launch / activities)),
           ['launch_attribution'], false
    FROM launched
    UNION ALL
    SELECT run_id, 'flows_without_end', open / flows, dq_max_open_flow_share(), open / flows > dq_max_open_flow_share(),
           format('{} of {} flow arrows ({:.1f}%) have no end event: events were lost at the window''s edges or '
                  'in the profiler''s buffers', open, flows, 100 * open / flows),
           []::VARCHAR[], false
    FROM flow_ends
    UNION ALL
    SELECT run_id, 'profiler_dropped_records', records / greatest(kept, 1), 0, records > 0,
           format('the profiler reports dropping {} activity records (the trace kept {} GPU activities and runtime '
                  'calls): the GPU timeline and launch records have holes', records, kept),
           ['gpu_timeline', 'launch_attribution'], false
    FROM dropped
    UNION ALL
    SELECT run_id, 'too_little_gpu_work', busy_ns, dq_min_gpu_work_ns(), busy_ns < dq_min_gpu_work_ns(),
           format('the busiest GPU runs {} us of work in this trace: a toy or test capture, too little to judge a '
                  'steady state; profile more iterations of the real workload', round(busy_ns / 1e3, 1)),
           ['gpu_timeline'], true
    FROM busiest
)
SELECT run_id, check_name, CAST(value AS DOUBLE), CAST(threshold AS DOUBLE), flagged, detail, affects, caps_severity
FROM checks;
