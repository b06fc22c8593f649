-- Communication: every collective of every rank, with what it moved and on which process group.

-- Bytes per element of a dtype as traces name it (`Float`, `BFloat16`, `c10::Half`, `float8_e4m3fn`,
-- `int64`, and the C type names of record_function input types: `long int`, `unsigned char`, ...);
-- NULL when unknown.
CREATE OR REPLACE MACRO dtype_bytes(dtype) AS
    CASE WHEN starts_with(lower(replace(dtype, 'c10::', '')), 'float8') THEN 1
         ELSE CASE lower(replace(dtype, 'c10::', ''))
              WHEN 'float' THEN 4 WHEN 'float32' THEN 4 WHEN 'double' THEN 8 WHEN 'float64' THEN 8
              WHEN 'half' THEN 2 WHEN 'float16' THEN 2 WHEN 'bfloat16' THEN 2
              WHEN 'int' THEN 4 WHEN 'int32' THEN 4 WHEN 'long' THEN 8 WHEN 'int64' THEN 8
              WHEN 'long int' THEN 8 WHEN 'long long int' THEN 8 WHEN 'short int' THEN 2
              WHEN 'unsigned char' THEN 1 WHEN 'signed char' THEN 1
              WHEN 'short' THEN 2 WHEN 'int16' THEN 2 WHEN 'char' THEN 1 WHEN 'int8' THEN 1
              WHEN 'byte' THEN 1 WHEN 'uint8' THEN 1 WHEN 'bool' THEN 1
              WHEN 'complexfloat' THEN 8 WHEN 'complexdouble' THEN 16 END END;

-- One row per collective per rank: every communication kernel (`kernels.is_communication`) with
-- the `record_param_comms` op that issued it, and every `record_param_comms` op that launched no
-- communication kernel (a `wait`, a CPU-side collective), and every `gloo:<collective>` range (gloo
-- runs a collective on a worker thread of its own, without a kernel: the range spans the algorithm
-- and the wait for the peers; its tensor's dims and type give the message). A kernel's op is the one with its
-- `External id`; older Kineto gives kernels the correlation id as External id, so then it is the
-- innermost op enclosing the kernel's launch call on the launching thread. The collective's
-- parameters come from the kernel's args (newer Kineto copies them there), else the op's; its name
-- from those args, else the `nccl:<collective>` annotation around the launch call (the
-- collective PyTorch asked for: an all-to-all runs as NCCL SendRecv kernels), else the kernel's
-- NCCL or HCCL name (`ncclDevKernel_AllReduce_...`, `hcom_allReduce__...` -> `allreduce`). `seq` numbers the collectives of a
-- process group in time order, so the n-th of a group on one rank is the n-th on every other rank.
--
-- Cost: one scan of the kernels and cpu_ops, `first_launches` of the communication kernels, and an
-- ASOF lookup of each launch call among the `record_param_comms` ops of its thread.
CREATE OR REPLACE VIEW collectives(
    -- the run
    run_id,
    -- the run's rank (`runs.rank`)
    rank,
    -- the run's world size (`runs.world_size`)
    world_size,
    -- `Collective name` (`allreduce`, `allgather`, `reduce_scatter`, `broadcast`, `wait`, ...), else the
    -- `nccl:` annotation's (`all_reduce`, `all_to_all`, `_all_gather_base`), else from the kernel name
    collective,
    -- `Process Group Name` (`0` for the default group); '' when the trace does not say
    process_group,
    -- `Process Group Description` (`default_pg`, ...)
    process_group_desc,
    -- `Process Group Ranks` as written (`[0, 1]`)
    group_ranks,
    -- `Group size`
    group_size,
    -- `dtype` of the message
    dtype,
    -- `In msg nelems`: elements this rank sends in
    in_nelems,
    -- `Out msg nelems`: elements it gets out
    out_nelems,
    -- input message size in bytes: in_nelems times the dtype's size (`dtype_bytes`)
    bytes,
    -- the communication kernel; NULL for an op without one
    kernel_event_id,
    -- its name
    kernel_name,
    -- its GPU
    device,
    -- its stream
    stream,
    -- its start on the GPU
    gpu_ts_ns,
    -- its end on the GPU
    gpu_end_ns,
    -- its duration on the GPU
    gpu_dur_ns,
    -- the runtime call that launched the kernel (`first_launches`); NULL without a launch record
    launch_event_id,
    -- the `nccl:<collective>` user annotation directly enclosing that call, as written; NULL if none
    annotation,
    -- the `record_param_comms` op; NULL for a kernel without one
    op_event_id,
    -- the op's start on the host
    op_ts_ns,
    -- the op's end on the host
    op_end_ns,
    -- the op's process
    pid,
    -- the op's thread
    tid,
    -- 1, 2, ... per (run, process_group) in time order (GPU start, else host start)
    seq
) AS
WITH ops AS (
    SELECT run_id, event_id, external_id, ts_ns, end_ns, pid, tid, args
    FROM cpu_ops WHERE name = 'record_param_comms'
), comm AS (
    SELECT run_id, event_id, external_id, name, device, stream, ts_ns, end_ns, dur_ns, args
    FROM kernels WHERE is_communication AND dur_ns IS NOT NULL
), launched AS (
    SELECT c.*, l.runtime_event_id, l.pid AS launch_pid, l.tid AS launch_tid, l.launch_ts_ns, l.launch_end_ns,
           CASE WHEN a.kind = 'user_annotation' AND starts_with(a.name, 'nccl:') THEN a.name END AS annotation
    FROM comm c
    LEFT JOIN first_launches l ON l.run_id = c.run_id AND l.gpu_event_id = c.event_id
    LEFT JOIN runtime_calls r ON r.event_id = l.runtime_event_id
    LEFT JOIN events a ON a.event_id = r.parent_id
), by_external AS (
    SELECT k.event_id AS kernel_event_id, min(o.event_id) AS op_event_id
    FROM comm k JOIN ops o ON o.run_id = k.run_id AND o.external_id = k.external_id
    GROUP BY k.event_id
), by_tree AS (
    SELECT k.event_id AS kernel_event_id, CASE WHEN k.launch_end_ns <= o.end_ns THEN o.event_id END AS op_event_id
    FROM (SELECT * FROM launched WHERE runtime_event_id IS NOT NULL) k
    ASOF JOIN ops o ON o.run_id = k.run_id AND o.pid = k.launch_pid AND o.tid = k.launch_tid AND k.launch_ts_ns >= o.ts_ns
), paired AS (
    SELECT k.run_id, k.event_id AS kernel_event_id, k.name AS kernel_name, k.device, k.stream, k.ts_ns AS gpu_ts_ns,
           k.end_ns AS gpu_end_ns, k.dur_ns AS gpu_dur_ns, k.runtime_event_id AS launch_event_id, k.annotation,
           o.event_id AS op_event_id, o.ts_ns AS op_ts_ns, o.end_ns AS op_end_ns, o.pid, o.tid,
           k.args AS kernel_args, o.args AS op_args
    FROM launched k
    LEFT JOIN by_external x ON x.kernel_event_id = k.event_id
    LEFT JOIN by_tree t ON t.kernel_event_id = k.event_id
    LEFT JOIN ops o ON o.event_id = coalesce(x.op_event_id, t.op_event_id)
), lone_ops AS (
    SELECT o.run_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, o.event_id, o.ts_ns, o.end_ns, o.pid, o.tid,
           NULL, o.args
    FROM ops o WHERE o.event_id NOT IN (SELECT op_event_id FROM paired WHERE op_event_id IS NOT NULL)
), gloo_ranges AS (
    SELECT run_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, name, event_id, ts_ns, end_ns, pid, tid, NULL,
           args
    FROM events WHERE kind = 'user_annotation' AND starts_with(name, 'gloo:') AND dur_ns IS NOT NULL
), parameters AS (
    -- each args object parsed once: the parameter keys, in the order of described's columns
    SELECT p.*,
           json_extract_string(kernel_args, ['$."Collective name"', '$."Process Group Name"',
               '$."Process Group Description"', '$."Process Group Ranks"', '$."Group size"', '$.dtype',
               '$."In msg nelems"', '$."Out msg nelems"']) AS k,
           json_extract_string(op_args, ['$."Collective name"', '$."Process Group Name"',
               '$."Process Group Description"', '$."Process Group Ranks"', '$."Group size"', '$.dtype',
               '$."In msg nelems"', '$."Out msg nelems"']) AS o
    FROM (SELECT * FROM paired UNION ALL SELECT * FROM lone_ops UNION ALL SELECT * FROM gloo_ranges) p
), described AS (
    SELECT * EXCLUDE (k, o, kernel_args, op_args),
           coalesce(k[1], o[1], substr(annotation, 6),
                    nullif(lower(regexp_extract(kernel_name, '^(?:nccl(?:Dev)?Kernel_|hcom_)([A-Za-z]+)', 1)), '')) AS collective,
           coalesce(k[2], o[2], '') AS process_group,
           coalesce(k[3], o[3]) AS process_group_desc,
           coalesce(k[4], o[4]) AS group_ranks,
           TRY_CAST(coalesce(k[5], o[5]) AS INTEGER) AS group_size,
           coalesce(k[6], o[6], CASE WHEN starts_with(annotation, 'gloo:') THEN op_args->'$."Input type"'->>0 END) AS dtype,
           coalesce(TRY_CAST(coalesce(k[7], o[7]) AS BIGINT),
                    CASE WHEN starts_with(annotation, 'gloo:')
                         THEN CAST(list_product(CAST(op_args->'$."Input Dims"'->0 AS BIGINT[])) AS BIGINT) END) AS in_nelems,
           TRY_CAST(coalesce(k[8], o[8]) AS BIGINT) AS out_nelems
    FROM parameters
)
SELECT d.run_id, r.rank, r.world_size, d.collective, d.process_group, d.process_group_desc, d.group_ranks, d.group_size,
       d.dtype, d.in_nelems, d.out_nelems, d.in_nelems * dtype_bytes(d.dtype), d.kernel_event_id, d.kernel_name, d.device,
       d.stream, d.gpu_ts_ns, d.gpu_end_ns, d.gpu_dur_ns, d.launch_event_id, d.annotation, d.op_event_id, d.op_ts_ns,
       d.op_end_ns, d.pid, d.tid,
       row_number() OVER (PARTITION BY d.run_id, d.process_group
                          ORDER BY coalesce(d.gpu_ts_ns, d.op_ts_ns), d.kernel_event_id, d.op_event_id)
FROM described d JOIN runs r USING (run_id);
