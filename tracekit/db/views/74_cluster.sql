-- Cluster analyses a profiler computed over every rank of a job (msprof-analyze's
-- cluster_analysis_output/ or cluster_analysis.db, read as run_metrics by the `msprof_cluster`
-- reader): the inputs a cross-rank question can use on Ascend without the ranks' own traces.

-- Per (run, step, rank): msprof-analyze's step breakdown (`cluster_step.*` run_metrics).
CREATE OR REPLACE VIEW cluster_step_components(
    -- the run (one cluster analysis of the whole job)
    run_id,
    -- the step, as msprof-analyze numbers it (`step2` -> 2)
    step,
    -- the rank
    rank,
    -- time the rank's NPU ran compute tasks in the step
    computing_ns,
    -- communication time not hidden behind compute (on the step's critical path)
    communication_not_overlapped_ns,
    -- communication time that ran under compute
    overlapped_ns,
    -- all communication time (overlapped + not overlapped)
    communication_ns,
    -- time the NPU ran neither compute nor communication (host-bound, data loading, launch gaps)
    free_ns,
    -- the rank's pipeline-stage time as msprof-analyze computes it (the step minus the bubble)
    stage_ns,
    -- pipeline bubble: time the rank waited on other stages (0 without pipeline parallelism)
    bubble_ns,
    -- communication not overlapped, receive ops left out (what the rank's own sends cost)
    comm_not_overlapped_no_receive_ns
) AS
SELECT run_id, TRY_CAST(args->>'step' AS BIGINT) AS step, TRY_CAST(args->>'rank' AS INTEGER) AS rank,
       max(value) FILTER (WHERE name = 'cluster_step.computing_ns'),
       max(value) FILTER (WHERE name = 'cluster_step.communication_not_overlapped_ns'),
       max(value) FILTER (WHERE name = 'cluster_step.overlapped_ns'),
       max(value) FILTER (WHERE name = 'cluster_step.communication_ns'),
       max(value) FILTER (WHERE name = 'cluster_step.free_ns'),
       max(value) FILTER (WHERE name = 'cluster_step.stage_ns'),
       max(value) FILTER (WHERE name = 'cluster_step.bubble_ns'),
       max(value) FILTER (WHERE name = 'cluster_step.communication_not_overlapped_and_exclude_receive_ns')
FROM run_metrics
WHERE starts_with(name, 'cluster_step.')
GROUP BY run_id, TRY_CAST(args->>'step' AS BIGINT), TRY_CAST(args->>'rank' AS INTEGER);
