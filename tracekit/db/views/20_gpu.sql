-- GPU work: kernels, copies and memsets, the runtime calls that launched them, and when each device
-- was busy. Busy time is written once here (the union of activity intervals, `gpu_busy_layers`);
-- everything that needs busy or idle time over a window reads it through `gpu_busy_between`.

-- One row per distinct kernel name, with the classes read from the name alone. The name patterns
-- are the costly part of the `kernels` view (about 20 substring and regular-expression tests on names
-- that average 200+ characters); a trace has tens to a few thousand distinct kernel names against
-- tens of thousands to millions of kernels, so they run here once per name and `kernels` joins the
-- result. While rules run this view is one of the tables computed once (tracekit/engine/shared_views.py).
CREATE OR REPLACE VIEW kernel_names(
    -- kernel name as written
    name,
    -- see `kernels.is_communication`
    is_communication
) AS
SELECT name,
       (name ILIKE 'nccl%' OR name ILIKE '%nccl%Kernel%' OR name ILIKE 'rccl%' OR name ILIKE 'msccl%'
        OR name ILIKE '%cross_device_reduce%' OR name ILIKE '%custom_all_reduce%'
        OR name ILIKE '%multimem_all_reduce%' OR name ILIKE '%multimem_one_shot%' OR name ILIKE '%multimem_all_gather%'
        OR name ILIKE '%one_shot_all_reduce%' OR name ILIKE '%two_shot_all_reduce%'
        OR name LIKE '%oneShotAllReduce%' OR name LIKE '%twoShotAllReduce%'
        OR name LIKE '%deep_ep::%dispatch%' OR name LIKE '%deep_ep::%combine%'
        OR name LIKE '%allreduce_fusion_kernel%' OR name ILIKE '%nvshmem%' OR name ILIKE '%mscclpp%'
        OR name LIKE '%userbuffers_%' OR starts_with(name, 'hcom_') OR name ILIKE 'hccl%'
        OR regexp_matches(name, '(^|/)(AllReduce|AllGather|ReduceScatter|Broadcast|AlltoAll|AllToAll|Send|Receive)-op[0-9]+'))
FROM (SELECT DISTINCT name FROM event_rows WHERE kind = 'kernel');

-- Kernels, with their launch configuration and whether they communicate.
CREATE OR REPLACE VIEW kernels(
    -- the event
    event_id,
    -- the run
    run_id,
    -- kernel name as written (demangled)
    name,
    -- start on the GPU
    ts_ns,
    -- duration on the GPU
    dur_ns,
    -- end on the GPU
    end_ns,
    -- GPU index
    device,
    -- stream
    stream,
    -- CUPTI correlation id: the runtime call that launched it carries it
    correlation,
    -- PyTorch op id of the op that launched it
    external_id,
    -- `args.grid` as written (`[x, y, z]`)
    grid,
    -- `args.block` as written
    block,
    -- `registers per thread`
    registers_per_thread,
    -- `shared memory` in bytes
    shared_memory,
    -- `blocks per SM`
    blocks_per_sm,
    -- `warps per SM`
    warps_per_sm,
    -- `est. achieved occupancy %`
    est_occupancy_pct,
    -- `graph id`: the CUDA graph it was replayed from
    graph_id,
    -- a communication kernel: NCCL/RCCL/MSCCL, vLLM/SGLang custom all-reduce (`cross_device_reduce`,
    -- `custom_all_reduce`), PyTorch symmetric-memory all-reduce/all-gather (`multimem_*`,
    -- `one_shot_all_reduce`, `two_shot_all_reduce`), TensorRT-LLM `oneShotAllReduce` /
    -- `twoShotAllReduce`, FlashInfer/TensorRT-LLM fused `allreduce_fusion_kernel`, DeepEP `deep_ep::`
    -- dispatch/combine, NVSHMEM (`nvshmem`), MSCCL++ (`mscclpp`), TransformerEngine userbuffers
    -- (`userbuffers_`), Ascend HCCL (`hcom_allReduce__...`, `hccl...`, and MindSpore graph mode's
    -- `<scope>/AllReduce-op534`)
    is_communication,
    -- the core an Ascend NPU task ran on, as its profiler names it (`AI_CORE`, `AI_VECTOR_CORE`,
    -- `AI_CPU`, `MIX_AIC`, `MIX_AIV`, `HCCL`, ...: kernel_details' `Accelerator Core`, the db export's
    -- `accelerator core`, a timeline's `Task Type`); NULL on GPUs
    core,
    -- the event's args
    args
) AS
-- the launch configuration in one pass over the args (one `->>` per key parses the JSON once per key:
-- 2.5x the cost on a 1 GB trace)
SELECT event_id, run_id, k.name, ts_ns, dur_ns, end_ns, device, stream, correlation, external_id,
       _launch[1], _launch[2], TRY_CAST(_launch[3] AS INTEGER), TRY_CAST(_launch[4] AS BIGINT),
       TRY_CAST(_launch[5] AS DOUBLE), TRY_CAST(_launch[6] AS DOUBLE), TRY_CAST(_launch[7] AS DOUBLE),
       TRY_CAST(_launch[8] AS BIGINT),
       n.is_communication,
       coalesce(_launch[9], _launch[10], _launch[11]),
       args
FROM (SELECT *, json_extract_string(args, ['grid', 'block', 'registers per thread', 'shared memory', 'blocks per SM',
                                           'warps per SM', 'est. achieved occupancy %', 'graph id',
                                           'accelerator core', 'Accelerator Core', 'Task Type']) AS _launch
      FROM events WHERE kind = 'kernel') k
LEFT JOIN kernel_names n ON n.name = k.name;

-- Kernels, memcpys and memsets with a duration: the work that makes a device busy.
CREATE OR REPLACE VIEW gpu_activities(
    -- the event
    event_id,
    -- the run
    run_id,
    -- `kernel`, `gpu_memcpy` or `gpu_memset`
    kind,
    -- name as written (`Memcpy HtoD (Pageable -> Device)`, ...)
    name,
    -- start on the GPU
    ts_ns,
    -- duration on the GPU
    dur_ns,
    -- end on the GPU
    end_ns,
    -- GPU index
    device,
    -- stream
    stream,
    -- CUPTI correlation id
    correlation,
    -- PyTorch op id
    external_id,
    -- bytes copied or set (`args.bytes`), NULL for kernels
    bytes,
    -- the event's args
    args
) AS
SELECT event_id, run_id, kind, name, ts_ns, dur_ns, end_ns, device, stream, correlation, external_id,
       TRY_CAST(coalesce(args->>'bytes', args->>'Bytes') AS BIGINT), args
FROM events WHERE kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND dur_ns IS NOT NULL;

-- Runtime/driver call <-> the GPU work it enqueued, by CUPTI correlation id. A Kineto file holds
-- one process, so the run scopes the id (GPU events carry the device as pid, never the launching
-- process). One `cudaGraphLaunch` matches every kernel of the replay.
CREATE OR REPLACE VIEW launches(
    -- the run
    run_id,
    -- the runtime/driver call
    runtime_event_id,
    -- its name (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cudaGraphLaunch`, ...)
    runtime_name,
    -- when the call started
    launch_ts_ns,
    -- how long the call took
    launch_dur_ns,
    -- the calling process
    pid,
    -- the calling thread
    tid,
    -- the GPU activity
    gpu_event_id,
    -- its kind (`kernel`, `gpu_memcpy`, `gpu_memset`)
    gpu_kind,
    -- its name
    gpu_name,
    -- its GPU
    device,
    -- its stream
    stream,
    -- its start on the GPU
    gpu_ts_ns,
    -- its duration on the GPU
    gpu_dur_ns,
    -- GPU start minus the end of the call, as HTA defines launch delay; negative when the GPU
    -- started before the call returned
    launch_delay_ns,
    -- the correlation id they share
    correlation,
    -- PyTorch op id (the call's, else the activity's)
    external_id
) AS
SELECT r.run_id, r.event_id, r.name, r.ts_ns, r.dur_ns, r.pid, r.tid, g.event_id, g.kind, g.name, g.device, g.stream,
       g.ts_ns, g.dur_ns, g.ts_ns - (r.ts_ns + r.dur_ns), r.correlation, coalesce(r.external_id, g.external_id)
FROM runtime_calls r JOIN gpu_activities g ON r.run_id = g.run_id AND r.correlation = g.correlation;

-- One row per GPU activity that has a launch record: the earliest runtime call correlated with it
-- (ties by event id). Rules that ask "which call launched this kernel" read this, not `launches`,
-- which can hold several calls for one activity.
CREATE OR REPLACE VIEW first_launches(
    -- the run
    run_id,
    -- the runtime/driver call
    runtime_event_id,
    -- its name
    runtime_name,
    -- when the call started
    launch_ts_ns,
    -- how long the call took
    launch_dur_ns,
    -- when the call returned
    launch_end_ns,
    -- the calling process
    pid,
    -- the calling thread
    tid,
    -- the GPU activity
    gpu_event_id,
    -- its kind
    gpu_kind,
    -- its name
    gpu_name,
    -- its GPU
    device,
    -- its stream
    stream,
    -- its start on the GPU
    gpu_ts_ns,
    -- its duration on the GPU
    gpu_dur_ns,
    -- GPU start minus the end of the call
    launch_delay_ns,
    -- the correlation id
    correlation,
    -- PyTorch op id
    external_id
) AS
SELECT run_id, runtime_event_id, runtime_name, launch_ts_ns, launch_dur_ns, launch_ts_ns + launch_dur_ns, pid, tid,
       gpu_event_id, gpu_kind, gpu_name, device, stream, gpu_ts_ns, gpu_dur_ns, launch_delay_ns, correlation,
       external_id
FROM launches
QUALIFY row_number() OVER (PARTITION BY run_id, gpu_event_id ORDER BY launch_ts_ns, runtime_event_id) = 1;

-- When each device was busy, per layer of work, as disjoint ordered blocks: the union of activity
-- intervals per (run, device, layer). Layers: `all` (kernels, memcpys and memsets: `gpu_busy`),
-- `kernel` (every kernel), `compute` (kernels that do not communicate) and `communication`
-- (`kernels.is_communication`). Blocks are disjoint and ordered, so busy time before any t is
-- busy_before_ns of the last block starting at or before t plus the part of it before t: busy time
-- over any window is two ASOF lookups (`gpu_busy_between`), never a range join.
--
-- Cost: one sort of the run's GPU activities per layer read (filtering on `layer` reads only that
-- layer); `all` costs about as much as the kernels of the trace.
CREATE OR REPLACE VIEW gpu_busy_layers(
    -- the run
    run_id,
    -- GPU index
    device,
    -- `all`, `kernel`, `compute` or `communication`
    layer,
    -- start of the block
    start_ns,
    -- end of the block
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- how many activities the block merges
    activities,
    -- busy time of the layer on the device before the block starts
    busy_before_ns,
    -- busy time of the layer on the device through the block's end
    busy_through_ns,
    -- idle time until the next block of the layer; NULL for the last
    next_gap_ns
) AS
WITH layered AS (
    SELECT run_id, {'device': device, 'layer': 'all'} AS lane, ts_ns, end_ns FROM gpu_activities
    UNION ALL
    SELECT run_id, {'device': device, 'layer': 'kernel'}, ts_ns, end_ns FROM kernels WHERE dur_ns IS NOT NULL
    UNION ALL
    SELECT run_id, {'device': device, 'layer': CASE WHEN is_communication THEN 'communication' ELSE 'compute' END},
           ts_ns, end_ns
    FROM kernels WHERE dur_ns IS NOT NULL
)
SELECT run_id, lane.device, lane.layer, start_ns, end_ns, dur_ns, intervals, busy_before_ns, busy_through_ns, next_gap_ns
FROM interval_union('layered');

-- When each device was busy at all: the union of its kernels, memcpys and memsets as disjoint,
-- ordered blocks (the `all` layer of `gpu_busy_layers`).
--
-- ```sql
-- -- GPU busy share per device
-- SELECT run_id, device, sum(dur_ns) / (max(end_ns) - min(start_ns)) AS busy_share FROM gpu_busy GROUP BY ALL;
-- ```
CREATE OR REPLACE VIEW gpu_busy(
    -- the run
    run_id,
    -- GPU index
    device,
    -- start of the block
    start_ns,
    -- end of the block
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- how many activities the block merges
    activities,
    -- busy time on the device before the block starts
    busy_before_ns,
    -- busy time on the device through the block's end
    busy_through_ns,
    -- idle time until the next block; NULL for the last
    next_gap_ns
) AS
SELECT run_id, device, start_ns, end_ns, dur_ns, activities, busy_before_ns, busy_through_ns, next_gap_ns
FROM gpu_busy_layers WHERE layer = 'all';

-- The device a run's analysis is about: the one with the most busy time (ties: the lowest index).
-- One row per run; device is NULL for a run without GPU work. Steps, the diff and the report
-- break time down on this device.
CREATE OR REPLACE VIEW main_device(
    -- the run
    run_id,
    -- GPU index, NULL when the run has no GPU activity
    device,
    -- the device's busy time (union of its activities)
    busy_ns,
    -- how many devices have GPU activity in the run
    devices
) AS
WITH per_device AS (
    SELECT run_id, device, sum(dur_ns) AS busy_ns FROM gpu_busy GROUP BY run_id, device
), ranked AS (
    SELECT *, count(*) OVER (PARTITION BY run_id) AS devices FROM per_device
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY busy_ns DESC, device) = 1
)
SELECT r.run_id, m.device, CAST(coalesce(m.busy_ns, 0) AS BIGINT), coalesce(m.devices, 0)
FROM runs r LEFT JOIN ranked m USING (run_id);

-- Busy time of one layer of `gpu_busy_layers` inside each of a set of windows, without a range
-- join. `windows` names a table or view with columns run_id, device, start_ns, end_ns (any other
-- columns pass through); `busy_layer` is `all`, `kernel`, `compute` or `communication`. Returns every
-- window row with `busy_ns` added: B(end_ns) - B(start_ns), where B(t) = busy_before_ns +
-- (least(t, end_ns) - start_ns) of the last block starting at or before t.
--
-- Cost: two ASOF joins of the windows against the layer's blocks, O((windows + blocks) log);
-- `a.start_ns < b.end_ns AND a.end_ns > b.start_ns` with an equality on the device is a hash join
-- with a residual filter instead, orders of magnitude slower on large traces. The blocks are those
-- of every run unless `in_run` names the one run the windows are in: a query about one run of a
-- database of many passes it (`in_run := $run_id`), and only that run's activities are merged.
--
-- ```sql
-- CREATE TEMP TABLE w AS SELECT run_id, 0 AS device, ts_ns AS start_ns, end_ns, name FROM events WHERE name LIKE 'ProfilerStep#%';
-- SELECT name, busy_ns / (end_ns - start_ns) AS gpu_util FROM gpu_busy_between('w', 'all');
-- ```
CREATE OR REPLACE MACRO gpu_busy_between(windows, busy_layer, in_run := NULL) AS TABLE
WITH _gpu_windows AS (
    SELECT *, device AS lane FROM query_table(windows)
), _gpu_blocks AS (
    SELECT run_id, device AS lane, start_ns, end_ns, busy_before_ns FROM gpu_busy_layers
    WHERE layer = busy_layer AND run_id = coalesce(in_run, run_id)
)
SELECT * EXCLUDE (lane) FROM busy_between('_gpu_windows', '_gpu_blocks');
