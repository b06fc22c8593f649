-- Events: every event of every run, and one view per family of event (host ops, runtime calls,
-- Python frames, runtime-event logs, flows, counters), with the args rules read most as typed columns.

-- Whether an event kind's pid/tid are a device and a stream (GPU work), not an OS process and thread.
CREATE OR REPLACE MACRO is_device_kind(kind) AS kind IN ({DEVICE_KINDS});

-- Every event of every run, in file order within a run.
--
-- Kinds: `cpu_op` (also legacy `Operator`), `python_function`, `user_annotation`,
-- `gpu_user_annotation`, `cuda_runtime` (also legacy `Runtime`, ROCm `hip*` and Ascend CANN `acl*` calls), `cuda_driver`,
-- `kernel`, `gpu_memcpy`, `gpu_memset`, `cuda_sync`, `cuda_event`, `cpu_instant_event`, `overhead`,
-- `profiler_span` (the `Trace` span), `runtime_event` (a line of a runtime-event log), `span` (an
-- OTLP span), `flow` (ph s/t/f: `ac2g`, `async_cpu_to_gpu`, `async`, `fwdbwd`), `metadata` (ph M),
-- `counter` (ph C), `memory` (`[memory]` instants), `async` (ph b/e/n), `instant`, `other`; any other
-- category keeps its lower-cased name (`mtia_runtime`, `mtia_ccp_events`, ...).
--
-- Nesting: `parent_id`/`depth` are computed for complete (`X`) events per track (pid, tid); roots
-- have depth 0 and no parent, non-`X` events have neither. Kernels, memcpys and memsets nest only
-- under `gpu_user_annotation` ranges, so without such ranges in a run they are all roots. Python
-- frames (`python_function`) form their own tree, because `record_function` annotations open in one
-- frame and close in another; an op's Python stack is the set of frames on its thread that contain it.
CREATE OR REPLACE VIEW events(
    -- unique in the database; within a run, events are numbered in file order, so ingesting the
    -- same files in the same order gives the same ids
    event_id,
    -- the run
    run_id,
    -- normalized kind (see above)
    kind,
    -- phase as written (`X`, `i`, `s`, `f`, `M`, `C`, ...)
    ph,
    -- category as written
    cat,
    -- event name
    name,
    -- start
    ts_ns,
    -- duration (NULL for instants)
    dur_ns,
    -- end: ts_ns + dur_ns (ts_ns for instants)
    end_ns,
    -- process; for GPU work the device (as Kineto writes it)
    pid,
    -- thread; for GPU work the stream (as Kineto writes it)
    tid,
    -- `pid/tid` as written when either is not a number (`Spans/PyTorch Profiler`, `0/stream 7`);
    -- `runtime_events` for runtime events
    track,
    -- for GPU kinds: `args.device`, else pid
    device,
    -- for GPU kinds: `args.stream`, else tid
    stream,
    -- CUPTI correlation id (runtime/driver calls, GPU work, ac2g flows)
    correlation,
    -- PyTorch op id (`External id`): links a cpu_op to its runtime calls and kernels
    external_id,
    -- id of a flow event
    flow_id,
    -- enclosing complete event on the same track (call tree, see above)
    parent_id,
    -- depth in the call tree (0 = root); NULL for events that are not complete (`X`)
    depth,
    -- the event's args, lossless JSON (keys keep their case: `bytes` and `Bytes` both survive)
    args,
    -- top-level event keys outside the Trace Event Format, if any
    extra
) AS
SELECT rowid, run_id, kind, ph, cat, name, ts_ns, dur_ns, ts_ns + coalesce(dur_ns, 0),
       pid, tid, track, device, stream, correlation, external_id, flow_id, parent_id,
       CASE WHEN ph = 'X' THEN coalesce(depth, 0) END, args, extra
FROM event_rows;

-- Host ops (`cpu_op`: PyTorch operators and `record_function` ops), with their recorded inputs.
CREATE OR REPLACE VIEW cpu_ops(
    -- the event
    event_id,
    -- the run
    run_id,
    -- op name (`aten::mm`, ...)
    name,
    -- start
    ts_ns,
    -- duration
    dur_ns,
    -- end
    end_ns,
    -- process
    pid,
    -- thread
    tid,
    -- PyTorch op id: the op's runtime calls and kernels carry it
    external_id,
    -- enclosing event on the thread
    parent_id,
    -- depth in the thread's call tree
    depth,
    -- JSON text of `Input Dims` (present with `record_shapes`)
    input_dims,
    -- JSON text of `Input type`
    input_types,
    -- JSON text of `Concrete Inputs` (scalar arguments)
    concrete_inputs,
    -- autograd `Sequence number`
    sequence_number,
    -- `Fwd thread id` of a backward op
    fwd_thread_id,
    -- the event's args
    args
) AS
-- the args read in one pass (one `->` per key parses the JSON once per key)
SELECT event_id, run_id, name, ts_ns, dur_ns, end_ns, pid, tid, external_id, parent_id, depth,
       CAST(coalesce(_op[1], _op[2]) AS VARCHAR), CAST(_op[3] AS VARCHAR), CAST(_op[4] AS VARCHAR),
       TRY_CAST(_op[5] AS BIGINT), TRY_CAST(_op[6] AS BIGINT),
       args
FROM (SELECT *, json_extract(args, ['Input Dims', 'Input dims', 'Input type', 'Concrete Inputs', 'Sequence number',
                                    'Fwd thread id']) AS _op
      FROM events WHERE kind = 'cpu_op');

-- CUDA/HIP runtime and driver calls (and MTIA runtime).
CREATE OR REPLACE VIEW runtime_calls(
    -- the event
    event_id,
    -- the run
    run_id,
    -- `cuda_runtime`, `cuda_driver` or `mtia_runtime`
    kind,
    -- call name (`cudaLaunchKernel`, ...)
    name,
    -- start
    ts_ns,
    -- duration
    dur_ns,
    -- end
    end_ns,
    -- process
    pid,
    -- thread
    tid,
    -- CUPTI correlation id: the GPU work it enqueued carries it
    correlation,
    -- PyTorch op id of the op that made the call
    external_id,
    -- CUPTI callback id (`cbid`)
    cbid,
    -- enclosing event on the thread
    parent_id,
    -- depth in the thread's call tree
    depth,
    -- the event's args
    args
) AS
SELECT event_id, run_id, kind, name, ts_ns, dur_ns, end_ns, pid, tid, correlation, external_id,
       TRY_CAST(args->>'cbid' AS INTEGER), parent_id, depth, args
FROM events WHERE kind IN ('cuda_runtime', 'cuda_driver', 'mtia_runtime');

-- Python frames (`python_function`, with `with_stack`): their own call tree per thread.
CREATE OR REPLACE VIEW python_functions(
    -- the event
    event_id,
    -- the run
    run_id,
    -- `file.py(line): function`
    name,
    -- start
    ts_ns,
    -- duration
    dur_ns,
    -- end
    end_ns,
    -- process
    pid,
    -- thread
    tid,
    -- enclosing frame
    parent_id,
    -- depth among the thread's frames
    depth,
    -- `Python id`
    python_id,
    -- `Python parent id`
    python_parent_id
) AS
SELECT event_id, run_id, name, ts_ns, dur_ns, end_ns, pid, tid, parent_id, depth,
       TRY_CAST(_py[1] AS BIGINT), TRY_CAST(_py[2] AS BIGINT)
FROM (SELECT *, json_extract(args, ['Python id', 'Python parent id']) AS _py FROM events WHERE kind = 'python_function');

-- Events of runtime-event logs (JSON Lines), on their run's clock.
--
-- ```sql
-- -- Runtime steps next to the profiler's annotation of the same name
-- SELECT r.name, r.ts_ns - a.ts_ns AS start_diff_ns, r.dur_ns - a.dur_ns AS dur_diff_ns
-- FROM runtime_events r JOIN events a ON a.run_id = r.run_id AND a.kind = 'user_annotation' AND a.name = r.name;
-- ```
CREATE OR REPLACE VIEW runtime_events(
    -- the run
    run_id,
    -- the event
    event_id,
    -- the line's `name`
    name,
    -- start, on the run's clock (after alignment)
    ts_ns,
    -- duration (NULL for an instant)
    dur_ns,
    -- end
    end_ns,
    -- the line's `pid`
    pid,
    -- the line's `tid`
    tid,
    -- the line's `thread`
    thread,
    -- JSON: every other key of the line, lossless
    attributes,
    -- line number in the log
    line,
    -- enclosing event among the log's own events on the thread
    parent_id,
    -- depth among the log's own events on the thread
    depth
) AS
SELECT run_id, event_id, name, ts_ns, dur_ns, end_ns, pid, tid, extra->>'thread',
       args, TRY_CAST(extra->>'line' AS BIGINT), parent_id, depth
FROM events WHERE kind = 'runtime_event';

-- Flow arrows (ph s/t/f) paired by (run, category, id): ac2g / async_cpu_to_gpu launch flows,
-- fwdbwd links.
CREATE OR REPLACE VIEW flows(
    -- the run
    run_id,
    -- flow category
    cat,
    -- flow id
    flow_id,
    -- the arrow's start event (ph s)
    start_event_id,
    -- its end event (ph f); NULL when the end is missing
    end_event_id,
    -- start time
    start_ts_ns,
    -- process of the start
    start_pid,
    -- thread of the start
    start_tid,
    -- end time
    end_ts_ns,
    -- process of the end
    end_pid,
    -- thread of the end
    end_tid,
    -- track of the end
    end_track
) AS
SELECT s.run_id, s.cat, s.flow_id, s.event_id, f.event_id, s.ts_ns, s.pid, s.tid, f.ts_ns, f.pid, f.tid, f.track
FROM (SELECT * FROM events WHERE kind = 'flow' AND ph = 's') s
LEFT JOIN (SELECT * FROM events WHERE kind = 'flow' AND ph = 'f') f
  ON s.run_id = f.run_id AND s.cat = f.cat AND s.flow_id = f.flow_id;

-- Counter samples (ph C), one row per series key of args.
CREATE OR REPLACE VIEW counters(
    -- the counter event
    event_id,
    -- the run
    run_id,
    -- counter name
    name,
    -- the args key (one series per key)
    series,
    -- sample time
    ts_ns,
    -- process
    pid,
    -- thread
    tid,
    -- the sample (NULL when not a number)
    value
) AS
SELECT c.event_id, c.run_id, c.name, k.key, c.ts_ns, c.pid, c.tid,
       TRY_CAST(json_extract_string(c.args, '$."' || k.key || '"') AS DOUBLE)
FROM (SELECT * FROM events WHERE kind = 'counter') c, LATERAL (SELECT unnest(json_keys(c.args)) AS key) k;
