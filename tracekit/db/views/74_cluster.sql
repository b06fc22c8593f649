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

-- Per (run, group, step, op, link): what msprof-analyze's communication matrix measured on one
-- src -> dst link (`cluster_link.*` run_metrics): the data it moved, the time it took and the
-- bandwidth, with the link's transport (HCCS, PCIE, RDMA, SIO; LOCAL for a rank's copy to itself).
CREATE OR REPLACE VIEW cluster_links(
    -- the run (one cluster analysis of the whole job)
    run_id,
    -- the communication group, as msprof-analyze names it (its ranks, e.g. `(0,1,2,3)`)
    process_group,
    -- the step, as msprof-analyze numbers it
    step,
    -- the op or op class the matrix row is for (`allreduce-total`, `broadcast-top1`, an op name)
    op,
    -- the sending rank
    src_rank,
    -- the receiving rank
    dst_rank,
    -- the link's transport
    transport,
    -- megabytes moved over the link (msprof-analyze's transit size, MB)
    transit_mb,
    -- time the transfer took
    transit_ns,
    -- achieved bandwidth, GB/s (msprof-analyze's own figure)
    bandwidth_gbps
) AS
SELECT run_id, args->>'group', TRY_CAST(args->>'step' AS BIGINT), args->>'op',
       TRY_CAST(args->>'src_rank' AS INTEGER), TRY_CAST(args->>'dst_rank' AS INTEGER), args->>'transport',
       max(value) FILTER (WHERE name = 'cluster_link.transit_size_mb'),
       max(value) FILTER (WHERE name = 'cluster_link.transit_time_ns'),
       max(value) FILTER (WHERE name = 'cluster_link.bandwidth_gbps')
FROM run_metrics
WHERE starts_with(name, 'cluster_link.')
GROUP BY ALL;

-- One row per rank of a job: its mean time per iteration in the three parts a step splits into
-- on every rank (the split msprof-analyze's step trace uses, so the profiler's own cluster summary
-- and tracekit's traces compare alike): computing, communication not hidden behind computing, and
-- free time, over the steady steps (every step when a run has none). From the traces
-- (`rank_steps`): on a GPU run the device's compute, exposed communication and idle time; on a
-- CPU-only run (a gloo job) the step thread's traced host work outside collective calls, the
-- collective calls, and the rest of the iteration; a job is the ranked runs of one world size. From
-- a profiler's cluster summary (`cluster_step_components`, msprof-analyze): its own numbers per
-- rank, the iteration being their sum; a job is that summary's run.
CREATE OR REPLACE VIEW rank_components(
    -- the job's world size (`runs.world_size`)
    world_size,
    -- the run that holds the rank's numbers
    run_id,
    -- the rank
    rank,
    -- steps averaged over
    steps,
    -- where the numbers come from: `trace` (tracekit's own `rank_steps`) or `cluster summary` (the
    -- profiler's, `cluster_step_components`)
    source,
    -- mean iteration: a step's start to the next step's
    iteration_ns,
    -- mean computing time per iteration
    computing_ns,
    -- mean communication time per iteration not overlapped with computing
    communication_ns,
    -- mean free time per iteration: the device (or the step thread) doing neither
    free_ns
) AS
WITH s AS (
    SELECT s.*, r.world_size FROM rank_steps s JOIN runs r USING (run_id)
    WHERE r.world_size > 1
    QUALIFY s.phase = 'steady' OR count(*) FILTER (WHERE s.phase = 'steady') OVER (PARTITION BY s.run_id) = 0
)
SELECT world_size, run_id, rank, count(*), 'trace', avg(iteration_end_ns - start_ns),
       avg(CASE WHEN device IS NULL THEN greatest(host_ns - collective_ns, 0) ELSE compute_ns END),
       avg(CASE WHEN device IS NULL THEN collective_ns ELSE comm_exposed_ns END),
       avg(CASE WHEN device IS NULL THEN greatest(iteration_end_ns - start_ns - host_ns, 0) ELSE idle_ns END)
FROM s GROUP BY world_size, run_id, rank
UNION ALL
SELECT r.world_size, c.run_id, c.rank, count(*), 'cluster summary',
       avg(c.computing_ns + c.communication_not_overlapped_ns + c.free_ns), avg(c.computing_ns),
       avg(c.communication_not_overlapped_ns), avg(c.free_ns)
FROM cluster_step_components c JOIN runs r USING (run_id)
WHERE c.rank IS NOT NULL AND r.world_size > 1
GROUP BY r.world_size, c.run_id, c.rank;
