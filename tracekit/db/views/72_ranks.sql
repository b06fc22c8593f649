-- Ranks of one job: the small per-rank summaries that cross-rank rules read, and the views that put
-- the ranks on one clock. Each `rank_*` view is computed from one rank's own events; a cluster
-- worker computes them for its ranks and sends only them to the reducer, which holds each as a
-- table of the same name, so a cross-rank query reads the same relations in one database of every
-- rank and in the reducer of a cluster run.

-- One row per collective call of a run that has a rank, on the rank's own clock: the per-rank input
-- of the cross-rank views. The span is the call's kernel on the GPU (`on_device`), else its op's or
-- gloo range's on the host; `wait` ops are left out (they end when the host looks, not when the
-- peers meet).
CREATE OR REPLACE VIEW rank_collectives(
    -- the run
    run_id,
    -- its rank
    rank,
    -- its world size
    world_size,
    -- the process group (`collectives.process_group`)
    process_group,
    -- the call's number within its group (`collectives.seq`)
    seq,
    -- its name (`collectives.collective`)
    collective,
    -- the kernel's event for a call on the device, else the op's
    event_id,
    -- true when the span is the call's communication kernel on the GPU
    on_device,
    -- the kernel's device; NULL for a host span
    device,
    -- start of the call on this rank's clock
    start_ns,
    -- end of the call on this rank's clock
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- input message size in bytes (`collectives.bytes`)
    bytes,
    -- `collectives.group_size`
    group_size,
    -- `collectives.dtype`
    dtype
) AS
SELECT run_id, rank, world_size, process_group, seq, collective,
       CASE WHEN gpu_ts_ns IS NOT NULL THEN kernel_event_id ELSE op_event_id END,
       gpu_ts_ns IS NOT NULL, device,
       coalesce(gpu_ts_ns, op_ts_ns), coalesce(gpu_end_ns, op_end_ns),
       coalesce(gpu_end_ns, op_end_ns) - coalesce(gpu_ts_ns, op_ts_ns), bytes, group_size, dtype
FROM collectives
WHERE rank IS NOT NULL AND collective IS DISTINCT FROM 'wait'
  AND coalesce(gpu_ts_ns, op_ts_ns) IS NOT NULL AND coalesce(gpu_end_ns, op_end_ns) IS NOT NULL;

-- Every collective call of the job that this database holds: its `rank_collectives` and the rows
-- of `peer_collectives` (other ranks' calls added to it; empty unless so). In a cluster run's
-- reducer `rank_collectives` holds every rank's calls; a worker holds only its chunk's.
CREATE OR REPLACE VIEW job_collectives(
    -- the run (a peer's run id in the job for a peer's call)
    run_id,
    -- its rank
    rank,
    -- its world size
    world_size,
    -- the process group
    process_group,
    -- the call's number within its group
    seq,
    -- its name
    collective,
    -- the kernel's or op's event (in the peer's own database for a peer's call)
    event_id,
    -- true when the span is a kernel's
    on_device,
    -- the kernel's device
    device,
    -- start on the rank's own clock
    start_ns,
    -- end on the rank's own clock
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- input message size in bytes
    bytes,
    -- group size
    group_size,
    -- dtype of the message
    dtype
) AS
SELECT run_id, rank, world_size, process_group, seq, collective, event_id, on_device, device, start_ns, end_ns, dur_ns, bytes, group_size, dtype FROM rank_collectives
UNION ALL
SELECT run_id, rank, world_size, process_group, seq, collective, event_id, on_device, device, start_ns, end_ns, dur_ns, bytes, group_size, dtype FROM peer_collectives;

-- Per ranked run and process group: its collective calls that ran on a device (communication
-- kernels), and on how many devices. C001 matches a job's ranks call by call only where every rank
-- made as many calls in each group, on one device. Computed from `job_collectives`; a cluster worker
-- reads what it was sent of every rank of the job (`peer_collective_counts`) instead.
CREATE OR REPLACE VIEW collective_counts(
    -- the run
    run_id,
    -- its rank
    rank,
    -- its world size
    world_size,
    -- the process group
    process_group,
    -- the run's device calls in this group
    calls,
    -- the devices they ran on
    devices
) AS
SELECT run_id, rank, world_size, process_group, calls, devices FROM peer_collective_counts
UNION ALL
SELECT run_id, rank, world_size, process_group, count(*), count(DISTINCT device)
FROM job_collectives
WHERE on_device AND NOT EXISTS (SELECT 1 FROM peer_collective_counts)
GROUP BY run_id, rank, world_size, process_group;

-- Per collective of the job's device calls, over its ranks: the call is the n-th device call of a
-- process group on each rank (ranks of one world size). Its two latest starts and two earliest ends
-- are kept with their ranks, each on its rank's own clock, so a rank's latest peer is the first
-- entry that is not itself: C001 reads each rank's wait for its peers from here, without pairing it
-- with every other rank. Ties go to the higher rank for a start, the lower for an end; a rank given
-- twice appears once. A cluster worker combines the rows of every chunk that it was sent
-- (`peer_collective_extremes`) instead of reading its own ranks.
CREATE OR REPLACE VIEW collective_extremes(
    -- the world size of the ranks
    world_size,
    -- the process group
    process_group,
    -- the call's position among the group's device calls on each rank (1, 2, ...)
    n,
    -- how many rank traces made it (in a cluster run a trace given twice, whose copy is dropped,
    -- counts twice here; the lists hold it once)
    ranks,
    -- the two latest starts, latest first: [{start_ns, rank}, ...]
    latest_starts,
    -- the two earliest ends, earliest first: [{end_ns, rank}, ...]
    earliest_ends
) AS
WITH numbered AS (
    SELECT rank, world_size, process_group, start_ns, end_ns,
           row_number() OVER (PARTITION BY run_id, process_group ORDER BY seq) AS n
    FROM job_collectives
    WHERE on_device AND NOT EXISTS (SELECT 1 FROM peer_collective_extremes)
), parts AS (
    SELECT world_size, process_group, n, count(*) AS ranks,
           max({'start_ns': start_ns, 'rank': rank}, 2) AS latest_starts,
           min({'end_ns': end_ns, 'rank': rank}, 2) AS earliest_ends
    FROM numbered GROUP BY world_size, process_group, n
    UNION ALL
    SELECT world_size, process_group, n, ranks, latest_starts, earliest_ends FROM peer_collective_extremes
)
SELECT world_size, process_group, n, CAST(sum(ranks) AS BIGINT),
       list_slice(list_reverse_sort(list_distinct(flatten(list(latest_starts)))), 1, 2),
       list_slice(list_sort(list_distinct(flatten(list(earliest_ends)))), 1, 2)
FROM parts
GROUP BY world_size, process_group, n;

-- Each rank's arrival at each collective it shares with the other ranks of its job, on one clock.
-- A collective instance is (process group, `seq`, collective name) across the ranks of
-- `job_collectives` (a rank that more than one run holds, as when two jobs' traces share a
-- database, takes no part). A collective ends on every rank at about the same moment, since no rank
-- leaves before the last one arrived, so each run's clock offset is the median over its collectives
-- of its end minus that collective's median end over the ranks: offsets come from the collectives
-- themselves, not from wall clocks, good to the spread of the ends (`end_spread_ns`). The rank that
-- arrives last waits least; `wait_ns` is how long a rank sat in the collective before the last one
-- arrived.
CREATE OR REPLACE VIEW collective_arrivals(
    -- the run
    run_id,
    -- its rank
    rank,
    -- the process group (`collectives.process_group`)
    process_group,
    -- the collective's number within its group (`collectives.seq`)
    seq,
    -- its name
    collective,
    -- its start on this rank, on the rank's own clock
    start_ns,
    -- its end on this rank, on the rank's own clock
    end_ns,
    -- what is subtracted from this rank's times to put them on the job's common clock
    clock_offset_ns,
    -- start_ns on the common clock
    aligned_start_ns,
    -- end_ns on the common clock
    aligned_end_ns,
    -- how many ranks hold this collective
    ranks,
    -- the rank that arrived last (latest aligned start)
    last_rank,
    -- how much later than the first rank this rank arrived
    arrival_lag_ns,
    -- how long this rank was in the collective before the last rank arrived: its wait for the others
    wait_ns,
    -- the spread of the aligned ends over the ranks: how far the alignment can be trusted here
    end_spread_ns
) AS
WITH spans AS (
    SELECT run_id, rank, process_group, seq, collective, start_ns, end_ns FROM job_collectives
    QUALIFY count(DISTINCT run_id) OVER (PARTITION BY rank) = 1
), shared AS (
    SELECT *, count(*) OVER w AS ranks, median(end_ns) OVER w AS median_end
    FROM spans WINDOW w AS (PARTITION BY process_group, seq, collective)
), offsets AS (
    SELECT run_id, CAST(median(end_ns - median_end) AS BIGINT) AS clock_offset_ns
    FROM shared WHERE ranks > 1 GROUP BY run_id
), aligned AS (
    SELECT s.run_id, s.rank, s.process_group, s.seq, s.collective, s.start_ns, s.end_ns, o.clock_offset_ns,
           s.start_ns - o.clock_offset_ns AS aligned_start_ns, s.end_ns - o.clock_offset_ns AS aligned_end_ns, s.ranks
    FROM shared s JOIN offsets o USING (run_id)
    WHERE s.ranks > 1
)
SELECT *,
       arg_max(rank, aligned_start_ns) OVER w,
       aligned_start_ns - min(aligned_start_ns) OVER w,
       greatest(least(max(aligned_start_ns) OVER w, aligned_end_ns) - aligned_start_ns, 0),
       max(aligned_end_ns) OVER w - min(aligned_end_ns) OVER w
FROM aligned
WINDOW w AS (PARTITION BY process_group, seq, collective);

-- One row per step of a run that has a rank: the `steps` breakdown with the rank, the time the rank
-- spent inside collective calls, and how late its step thread began its first traced work. This is
-- the per-step per-rank summary a cluster worker sends to the reducer. A step's *iteration* runs
-- from its start to the next step's start (to its own end for the last step): code between two step
-- annotations (a gradient sync written after the profiled region, a data loader) belongs to the
-- iteration it follows, so the cross-rank views count collectives and ops per iteration.
CREATE OR REPLACE VIEW rank_steps(
    -- the run
    run_id,
    -- its rank
    rank,
    -- `steps.step_index`
    step_index,
    -- `steps.name`
    name,
    -- `steps.phase`
    phase,
    -- start of the step on this rank's clock
    start_ns,
    -- end of the step on this rank's clock
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- end of the step's iteration: the next step's start, else end_ns
    iteration_end_ns,
    -- `steps.device`; NULL for a run without GPU work
    device,
    -- `steps.busy_ns`
    busy_ns,
    -- `steps.compute_ns`
    compute_ns,
    -- `steps.comm_ns`
    comm_ns,
    -- `steps.comm_exposed_ns`
    comm_exposed_ns,
    -- `steps.idle_ns`
    idle_ns,
    -- `steps.host_ns`: time the step's thread was inside traced host work
    host_ns,
    -- the summed spans of the rank's collective calls that start in the step's iteration
    -- (`rank_collectives`), waiting for peers included
    collective_ns,
    -- how many collective calls start in the step's iteration
    collectives,
    -- from the step's start to the first op, annotation or runtime call on its thread: a rank that
    -- begins its step late shows it here
    lead_in_ns
) AS
WITH s AS (
    SELECT s.*, r.rank,
           greatest(coalesce(lead(s.start_ns) OVER (PARTITION BY s.run_id ORDER BY s.step_index), s.end_ns), s.end_ns)
               AS iteration_end_ns
    FROM steps s JOIN runs r USING (run_id) WHERE r.rank IS NOT NULL
), calls AS (
    SELECT s.run_id, s.step_index, sum(c.dur_ns) AS collective_ns, count(*) AS collectives
    FROM s JOIN rank_collectives c
      ON c.run_id = s.run_id AND c.start_ns >= s.start_ns AND c.start_ns < s.iteration_end_ns
    GROUP BY ALL
), lead AS (
    SELECT s.run_id, s.step_index, min(e.ts_ns) - s.start_ns AS lead_in_ns
    FROM s JOIN events e ON e.run_id = s.run_id AND e.pid = s.pid AND e.tid = s.tid
                        AND e.ts_ns > s.start_ns AND e.ts_ns < s.end_ns
    WHERE e.kind IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver')
    GROUP BY s.run_id, s.step_index, s.start_ns
)
SELECT s.run_id, s.rank, s.step_index, s.name, s.phase, s.start_ns, s.end_ns, s.dur_ns, s.iteration_end_ns, s.device,
       s.busy_ns,
       s.compute_ns, s.comm_ns, s.comm_exposed_ns, s.idle_ns, s.host_ns,
       coalesce(calls.collective_ns, 0), coalesce(calls.collectives, 0), lead.lead_in_ns
FROM s LEFT JOIN calls USING (run_id, step_index) LEFT JOIN lead USING (run_id, step_index);

-- Per run that has a rank, the steps its per-rank summaries are measured over: the steady steps of
-- `rank_steps`, or every step of a run that has none steady, with how many there are.
CREATE OR REPLACE VIEW rank_measured_steps(
    -- the run
    run_id,
    -- its rank
    rank,
    -- `rank_steps.name`
    name,
    -- start of the step on this rank's clock
    start_ns,
    -- end of the step's iteration: the next step's start, else its end
    iteration_end_ns,
    -- how many steps of the run are measured
    steps
) AS
WITH chosen AS (
    SELECT run_id, rank, name, start_ns, iteration_end_ns FROM rank_steps
    QUALIFY phase = 'steady' OR count(*) FILTER (WHERE phase = 'steady') OVER (PARTITION BY run_id) = 0
)
SELECT *, count(*) OVER (PARTITION BY run_id) FROM chosen;

-- Per run that has a rank, the time per step in each named host op or annotation and each GPU
-- kernel, over the iterations of `rank_measured_steps` (the run's steady steps; all steps when none
-- is steady): what a rank's breakdown is compared on against its peers. Names go through
-- `name_key`, so per-run ids do not split a name; host events of every thread count (the backward
-- pass runs on autograd's own thread). `total_ns` includes nested work; `self_ns` is without the
-- traced work directly nested in it (ops, annotations, runtime calls) and without the time the rank
-- spent in host collective calls of other threads meanwhile (a gloo collective this thread waits
-- for), so host time in plain Python or a sleep inside an annotation shows as its self time, and
-- waiting for peers does not.
CREATE OR REPLACE VIEW rank_op_times(
    -- the run
    run_id,
    -- its rank
    rank,
    -- `host` (cpu ops and annotations) or `gpu` (kernels)
    layer,
    -- `name_key` of the op's, annotation's or kernel's name
    name,
    -- the smallest nesting depth the name has on its threads (0 = top level)
    depth,
    -- how many iterations it was measured over
    steps,
    -- how many calls started in them
    calls,
    -- their summed duration
    total_ns,
    -- their summed duration less that of the traced events nested directly in them and of host
    -- collective calls on other threads during them
    self_ns,
    -- total_ns / steps
    per_step_ns,
    -- self_ns / steps
    self_per_step_ns
) AS
WITH chosen AS (
    SELECT run_id, rank, name AS step_name, start_ns, iteration_end_ns FROM rank_measured_steps
), counted AS (
    SELECT DISTINCT run_id, steps FROM rank_measured_steps
), timed AS (
    SELECT e.run_id, s.rank, e.event_id, e.tid, e.ts_ns, e.end_ns,
           CASE WHEN e.kind = 'kernel' THEN 'gpu' ELSE 'host' END AS layer,
           e.name, e.depth, e.dur_ns
    FROM chosen s JOIN events e ON e.run_id = s.run_id AND e.ts_ns >= s.start_ns AND e.ts_ns < s.iteration_end_ns
    WHERE e.kind IN ('cpu_op', 'user_annotation', 'kernel') AND e.dur_ns IS NOT NULL
      -- the step annotations themselves are the window, not work in it
      AND NOT (e.kind = 'user_annotation' AND (e.name LIKE 'ProfilerStep#%' OR e.name = s.step_name
                                               OR e.name LIKE s.step_name || '#%'))
), nested AS (
    SELECT c.parent_id AS event_id, sum(c.dur_ns) AS nested_ns
    FROM events c JOIN (SELECT DISTINCT run_id FROM chosen) USING (run_id)
    WHERE c.parent_id IS NOT NULL AND c.dur_ns IS NOT NULL
      AND c.kind IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver')
    GROUP BY c.parent_id
), host_calls AS (
    SELECT run_id, tid, op_ts_ns AS ts_ns, op_end_ns AS end_ns FROM collectives
    WHERE gpu_ts_ns IS NULL AND op_ts_ns IS NOT NULL AND op_end_ns IS NOT NULL
      AND list_contains((SELECT list(DISTINCT run_id) FROM chosen), run_id)
), waited AS (
    SELECT t.event_id, sum(least(t.end_ns, h.end_ns) - greatest(t.ts_ns, h.ts_ns)) AS waited_ns
    FROM timed t JOIN host_calls h ON h.run_id = t.run_id AND h.tid IS DISTINCT FROM t.tid
                                  AND h.ts_ns < t.end_ns AND h.end_ns > t.ts_ns
    WHERE t.layer = 'host'
    GROUP BY t.event_id
), own AS (
    SELECT t.*, greatest(t.dur_ns - coalesce(n.nested_ns, 0) - coalesce(w.waited_ns, 0), 0) AS self_ns
    FROM timed t LEFT JOIN nested n USING (event_id) LEFT JOIN waited w USING (event_id)
), by_name AS (
    -- by the name as written first, so that name_key (five regular expressions) runs once per name
    SELECT run_id, rank, layer, name, min(depth) AS depth, count(*) AS calls, sum(dur_ns) AS total_ns,
           sum(self_ns) AS self_ns
    FROM own GROUP BY run_id, rank, layer, name
)
SELECT o.run_id, o.rank, o.layer, name_key(o.name), min(o.depth), c.steps, CAST(sum(o.calls) AS BIGINT),
       sum(o.total_ns), sum(o.self_ns), sum(o.total_ns) / c.steps, sum(o.self_ns) / c.steps
FROM by_name o JOIN counted c USING (run_id)
GROUP BY o.run_id, o.rank, o.layer, name_key(o.name), c.steps;

-- Per run that has a rank, how much input each host op took per step, input by input, over the
-- iterations of `rank_measured_steps` (as `rank_op_times`): the element
-- count of each tensor input (the product of its `Input Dims`, as far as record_shapes recorded them)
-- summed over the op's calls. The same op given more elements on one rank than on its peers is work
-- the job shares unevenly (tokens routed to one expert, a larger shard); the op's time per step
-- beside it says what the extra input cost. Inputs of one element or none (scalars, lists) are left out.
CREATE OR REPLACE VIEW rank_op_inputs(
    -- the run
    run_id,
    -- its rank
    rank,
    -- `name_key` of the op's name
    name,
    -- the input's position among the op's inputs (1 = the first)
    input_index,
    -- how many iterations it was measured over
    steps,
    -- how many calls of the op started in them with this input recorded
    calls,
    -- the input's elements summed over those calls, per iteration
    elements_per_step,
    -- the largest shape the input had in one call (`Input Dims` of that call, as text)
    largest_dims,
    -- the summed duration of those calls, per iteration
    per_step_ns
) AS
WITH chosen AS (
    SELECT run_id, rank, start_ns, iteration_end_ns FROM rank_measured_steps
), counted AS (
    SELECT DISTINCT run_id, steps FROM rank_measured_steps
), calls AS MATERIALIZED (
    -- calls of one op with the same recorded shapes, together: their shapes are parsed once. The calls
    -- without shapes are a group of their own (NULL dims, left out by `inputs`): a filter on them here
    -- would take the shapes out of every call's args twice
    SELECT e.run_id, s.rank, e.name, CAST(e.args->'Input Dims' AS VARCHAR) AS dims_text, count(*) AS n,
           sum(e.dur_ns) AS dur_ns
    FROM chosen s JOIN events e ON e.run_id = s.run_id AND e.ts_ns >= s.start_ns AND e.ts_ns < s.iteration_end_ns
    WHERE e.kind = 'cpu_op' AND e.dur_ns IS NOT NULL
    GROUP BY ALL
), shaped AS (
    SELECT run_id, rank, name_key(name) AS name, n, dur_ns, TRY_CAST(CAST(dims_text AS JSON) AS JSON[]) AS dims
    FROM calls
), inputs AS (
    SELECT run_id, rank, name, n, dur_ns, i AS input_index, TRY_CAST(dims[i] AS BIGINT[]) AS shape
    FROM shaped, range(1, len(dims) + 1) AS t(i)
    WHERE dims IS NOT NULL
), sized AS (
    SELECT *, list_reduce(shape || [1::BIGINT], lambda a, b: a * b) AS elements
    FROM inputs WHERE len(shape) > 0
)
SELECT z.run_id, z.rank, z.name, z.input_index, c.steps, sum(z.n), sum(z.elements * z.n) / c.steps,
       arg_max(CAST(z.shape AS VARCHAR), (z.elements, CAST(z.shape AS VARCHAR))), sum(z.dur_ns) / c.steps
FROM sized z JOIN counted c USING (run_id)
WHERE z.elements > 1
GROUP BY z.run_id, z.rank, z.name, z.input_index, c.steps;

-- Per rank and step, what the step cost the rank in waiting for its peers: the summed `wait_ns`
-- of the collectives that start in the step's iteration (`collective_arrivals`, `rank_steps`), how
-- late the rank arrived at them, and the step's start on the job's common clock.
CREATE OR REPLACE VIEW rank_step_waits(
    -- the run
    run_id,
    -- its rank
    rank,
    -- `rank_steps.step_index`
    step_index,
    -- `rank_steps.phase`
    phase,
    -- `rank_steps.dur_ns`
    dur_ns,
    -- the step's iteration: from its start to the next step's (`rank_steps.iteration_end_ns`)
    iteration_ns,
    -- the step's start on the common clock (its start minus the run's clock offset)
    aligned_start_ns,
    -- collectives of the step shared with other ranks
    collectives,
    -- summed wait for the other ranks in them
    wait_ns,
    -- summed arrival lag behind the first rank in them
    arrival_lag_ns,
    -- how many of them this rank arrived at last
    arrived_last
) AS
WITH offsets AS (SELECT DISTINCT run_id, clock_offset_ns FROM collective_arrivals)
SELECT s.run_id, s.rank, s.step_index, s.phase, s.dur_ns, s.iteration_end_ns - s.start_ns, s.start_ns - o.clock_offset_ns,
       count(a.seq), coalesce(sum(a.wait_ns), 0), coalesce(sum(a.arrival_lag_ns), 0),
       count(*) FILTER (WHERE a.last_rank = s.rank)
FROM rank_steps s JOIN offsets o USING (run_id)
LEFT JOIN collective_arrivals a ON a.run_id = s.run_id AND a.start_ns >= s.start_ns AND a.start_ns < s.iteration_end_ns
GROUP BY s.run_id, s.rank, s.step_index, s.phase, s.dur_ns, s.iteration_end_ns, s.start_ns, o.clock_offset_ns;
