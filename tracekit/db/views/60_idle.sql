-- GPU idle time and the host calls that cause it: every gap between busy blocks of a device with
-- the launch that ended it, and every blocking host call with the idle it is charged.

-- A gap not caused by the host and shorter than this is the fixed latency between queued
-- back-to-back kernels (HTA's "kernel wait"; measured 0.4-3 us on V100/A100/H200 traces).
CREATE OR REPLACE MACRO idle_kernel_wait_ns() AS 5000;

-- One row per idle gap of a device: the time between two consecutive blocks of `gpu_busy` (the
-- time before the first and after the last block of a run is not a gap), with the launch that
-- ended it and its cause, as G001 gpu-idle classifies a gap:
--
-- - `host`: the runtime call that launched the activity starting the next block returned after
--   the gap began: the GPU waited for the host to enqueue work;
-- - `kernel_wait`: not host-caused and shorter than `idle_kernel_wait_ns()`;
-- - `other`: the rest (work queued before the gap, an activity without a launch record).
--
-- G001's fourth cause, `other_gpu` (other streams busy during a stream's gap), does not occur here:
-- a device gap has no stream of the device busy. When several activities start the next block, the
-- one whose launch returned last ended the gap.
--
-- Cost: `gpu_busy`, an equality join of the gaps' ends with the activities, `first_launches`, and
-- an ASOF lookup of the step (`step_windows`).
CREATE OR REPLACE VIEW idle_gaps(
    -- the run
    run_id,
    -- GPU index
    device,
    -- gap start: the end of a busy block
    start_ns,
    -- gap end: the start of the next busy block
    end_ns,
    -- end_ns - start_ns
    dur_ns,
    -- `host`, `kernel_wait` or `other` (see above)
    cause,
    -- the GPU activity that ended the gap (starts the next block)
    next_event_id,
    -- its kind
    next_kind,
    -- its name
    next_name,
    -- the runtime call that launched it (its first launch); NULL without a launch record
    runtime_event_id,
    -- that call's name (`cudaLaunchKernel`, `cudaGraphLaunch`, ...)
    runtime_name,
    -- when that call started
    launch_ts_ns,
    -- when that call returned
    launch_end_ns,
    -- the thread that made the call
    launch_tid,
    -- the step (`step_windows.step_index`) the gap starts in; NULL between steps
    step_index
) AS
WITH gaps AS (
    SELECT run_id, device, end_ns AS start_ns, end_ns + next_gap_ns AS end_ns, next_gap_ns AS dur_ns
    FROM gpu_busy WHERE next_gap_ns > 0
), ended AS (
    SELECT g.run_id, g.device, g.start_ns, g.end_ns, g.dur_ns,
           first(a.event_id ORDER BY l.launch_end_ns DESC NULLS LAST, a.event_id) AS next_event_id,
           first(a.kind ORDER BY l.launch_end_ns DESC NULLS LAST, a.event_id) AS next_kind,
           first(a.name ORDER BY l.launch_end_ns DESC NULLS LAST, a.event_id) AS next_name,
           first(l.runtime_event_id ORDER BY l.launch_end_ns DESC NULLS LAST, a.event_id) AS runtime_event_id,
           first(l.runtime_name ORDER BY l.launch_end_ns DESC NULLS LAST, a.event_id) AS runtime_name,
           first(l.launch_ts_ns ORDER BY l.launch_end_ns DESC NULLS LAST, a.event_id) AS launch_ts_ns,
           max(l.launch_end_ns) AS launch_end_ns,
           first(l.tid ORDER BY l.launch_end_ns DESC NULLS LAST, a.event_id) AS launch_tid
    FROM gaps g
    JOIN gpu_activities a ON a.run_id = g.run_id AND a.device = g.device AND a.ts_ns = g.end_ns
    LEFT JOIN first_launches l ON l.run_id = a.run_id AND l.gpu_event_id = a.event_id
    GROUP BY g.run_id, g.device, g.start_ns, g.end_ns, g.dur_ns
)
SELECT e.run_id, e.device, e.start_ns, e.end_ns, e.dur_ns,
       CASE WHEN e.launch_end_ns > e.start_ns THEN 'host'
            WHEN e.dur_ns < idle_kernel_wait_ns() THEN 'kernel_wait'
            ELSE 'other' END,
       e.next_event_id, e.next_kind, e.next_name, e.runtime_event_id, e.runtime_name, e.launch_ts_ns, e.launch_end_ns,
       e.launch_tid, CASE WHEN e.start_ns < s.end_ns THEN s.step_index END
FROM ended e ASOF LEFT JOIN step_windows s ON e.run_id = s.run_id AND e.start_ns >= s.start_ns;

-- Synchronous host-to-device copies up to this many bytes are not blocking calls (as nsys exempts
-- them): the driver stages them through a pinned buffer and returns at once.
CREATE OR REPLACE MACRO host_blocking_small_htod_bytes() AS 65536;

-- Device-to-host copies larger than this many bytes carry data the host then works on, not a value
-- it checks: the GPU idle after such a copy is that work (a data dependency G001 gpu-idle reports),
-- not a sync to remove, so `host_blocking` charges it to no call. A read of a few bytes (`.item()`,
-- `.tolist()` of a flag, a count or the splits of an all-to-all) decides control flow and can be
-- deferred or kept on the device. On the corpus and the sample traces the blocking reads are up to
-- 7.8 KB (flags, counts, TorchRec splits) or from 16 MiB up (tensors, an MPI code's results): the
-- bound of `host_blocking_small_htod_bytes()` separates them with room on both sides.
CREATE OR REPLACE MACRO host_blocking_read_bytes() AS 65536;

-- The rows of `host_blocking` with another size up to which synchronous host-to-device copies are
-- exempt (H001's `small_htod_bytes` option): which calls block decides which call a gap is charged
-- to, so the threshold is an argument here, not a filter on the view. Same columns as `host_blocking`.
--
-- Cost: one scan of the runtime calls, an equality join with the copies they issued, `gpu_busy` of
-- the main device once (one ASOF lookup of each blocking call's return among its gaps, two of each
-- call on a critical thread for its stall), an equality join of the waited-for gaps' ends with the
-- activities and their `launches`, and a join of the blocking calls with the user annotations and
-- `nn.Module` frames of their thread.
CREATE OR REPLACE MACRO host_blocking_exempting(small_htod_bytes) AS TABLE
WITH _launches AS MATERIALIZED (
    SELECT run_id, runtime_event_id, launch_ts_ns, launch_dur_ns, pid, tid, gpu_event_id, gpu_kind, gpu_name, device
    FROM launches
), _copies AS (
    SELECT l.run_id, l.runtime_event_id, first(l.gpu_name ORDER BY l.gpu_event_id) AS copy_name,
           first(g.bytes ORDER BY l.gpu_event_id) AS bytes, first(g.dur_ns ORDER BY l.gpu_event_id) AS copy_gpu_ns,
           first(l.gpu_kind ORDER BY l.gpu_event_id) = 'gpu_memcpy' AS is_memcpy
    FROM _launches l
    JOIN (SELECT event_id, bytes, dur_ns FROM gpu_activities WHERE kind IN ('gpu_memcpy', 'gpu_memset')) g
      ON g.event_id = l.gpu_event_id
    WHERE l.gpu_kind IN ('gpu_memcpy', 'gpu_memset')
    GROUP BY l.run_id, l.runtime_event_id
), _classified AS (
    SELECT r.run_id, r.event_id, r.name AS call, r.pid, r.tid, r.ts_ns, r.dur_ns, r.end_ns, r.parent_id,
           c.copy_name, c.bytes, c.copy_gpu_ns, c.is_memcpy,
           CASE
             WHEN r.name IN ('cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventSynchronize',
                             'cuCtxSynchronize', 'cuStreamSynchronize', 'cuEventSynchronize',
                             'hipDeviceSynchronize', 'hipStreamSynchronize', 'hipEventSynchronize',
                             'aclrtSynchronizeDevice', 'aclrtSynchronizeStream', 'aclrtSynchronizeStreamWithTimeout',
                             'aclrtSynchronizeEvent') THEN 'sync'
             WHEN regexp_matches(r.name, '^(cuda|hip|aclrt)Memcpy') AND NOT contains(r.name, 'Async')
                  AND NOT (contains(coalesce(c.copy_name, ''), 'HtoD') AND coalesce(c.bytes, 0) <= small_htod_bytes)
                  AND NOT contains(coalesce(c.copy_name, ''), 'DtoD') THEN 'sync memcpy'
             WHEN regexp_matches(r.name, '^(cuda|hip|aclrt)Memset') AND NOT contains(r.name, 'Async') THEN 'sync memset'
             WHEN contains(r.name, 'Async') AND contains(coalesce(c.copy_name, ''), 'Pageable') THEN 'pageable async memcpy'
           END AS blocking
    FROM runtime_calls r LEFT JOIN _copies c ON c.run_id = r.run_id AND c.runtime_event_id = r.event_id
), _op_copies AS (
    SELECT run_id, parent_id, ts_ns, copy_name, bytes, copy_gpu_ns
    FROM _classified WHERE is_memcpy AND parent_id IS NOT NULL
), _blocking AS MATERIALIZED (
    -- the calls one op invocation makes (a pageable copy and its stream sync) block as one; a
    -- top-level call is its own (negative keys never collide with the parents' event ids). The copy a
    -- call moved or waited for: its own, else the last one its op invocation issued before it (the
    -- `cudaMemcpyAsync` before the `cudaStreamSynchronize` of one `aten::copy_`)
    SELECT b.*, coalesce(b.parent_id, -1 - b.event_id) AS episode,
           CASE WHEN b.is_memcpy THEN b.copy_name WHEN b.copy_name IS NULL THEN o.copy_name END AS moved_name,
           CASE WHEN b.is_memcpy THEN b.bytes WHEN b.copy_name IS NULL THEN o.bytes END AS copy_bytes,
           CASE WHEN b.is_memcpy THEN b.copy_gpu_ns WHEN b.copy_name IS NULL THEN o.copy_gpu_ns END AS moved_gpu_ns
    FROM (SELECT * FROM _classified WHERE blocking IS NOT NULL) b
    ASOF LEFT JOIN _op_copies o ON o.run_id = b.run_id AND o.parent_id = b.parent_id AND b.ts_ns >= o.ts_ns
), _episodes AS (
    SELECT run_id, episode, arg_max(event_id, dur_ns) AS primary_event_id,
           contains(coalesce(arg_max(copy_name, dur_ns), ''), 'DtoH')
             AND coalesce(arg_max(bytes, dur_ns), 0) > host_blocking_read_bytes() AS reads_data
    FROM _blocking GROUP BY run_id, episode
), _main AS MATERIALIZED (
    SELECT run_id, device FROM main_device WHERE device IS NOT NULL
), _main_busy AS MATERIALIZED (
    SELECT b.run_id, b.device AS lane, b.start_ns, b.end_ns, b.busy_before_ns, b.next_gap_ns
    FROM gpu_busy b JOIN _main m ON m.run_id = b.run_id AND m.device = b.device
), _critical_threads AS (
    -- every thread that fed the main device: the step's thread, and in training the autograd thread
    -- that launches the backward pass
    SELECT DISTINCT l.run_id, l.pid, l.tid FROM _launches l JOIN _main d ON d.run_id = l.run_id AND d.device = l.device
), _critical_calls AS (
    SELECT b.run_id, m.device AS lane, b.ts_ns AS start_ns, b.end_ns, b.event_id
    FROM _blocking b
    JOIN _main m ON m.run_id = b.run_id
    WHERE EXISTS (
        SELECT 1 FROM _critical_threads t
        WHERE t.run_id = b.run_id AND t.pid IS NOT DISTINCT FROM b.pid AND t.tid IS NOT DISTINCT FROM b.tid)
), _stalls AS (
    SELECT event_id, end_ns - start_ns - busy_ns AS stalled_ns FROM busy_between('_critical_calls', '_main_busy')
), _annotated AS (
    -- by its name key: a live object's address (`<lambda> object at 0x7efb...`), a `#N` counter or a
    -- per-run op id would make one region per call
    SELECT b.event_id, arg_max(name_key(u.name), u.depth) AS region
    FROM _blocking b JOIN events u
      ON u.run_id = b.run_id AND u.pid = b.pid AND u.tid = b.tid AND u.ts_ns <= b.ts_ns AND u.end_ns >= b.end_ns
    WHERE u.kind = 'user_annotation' AND u.name NOT LIKE 'ProfilerStep#%'
    GROUP BY b.event_id
), _modules AS (
    SELECT b.event_id, arg_max(f.name, f.depth) AS region
    FROM _blocking b JOIN python_functions f
      ON f.run_id = b.run_id AND f.pid = b.pid AND f.tid = b.tid AND f.ts_ns <= b.ts_ns AND f.end_ns >= b.end_ns
    WHERE f.name LIKE 'nn.Module: %'
    GROUP BY b.event_id
), _main_gaps AS (
    SELECT run_id, lane AS device, end_ns AS gap_start, end_ns + next_gap_ns AS gap_end FROM _main_busy WHERE next_gap_ns > 0
), _placed AS (
    SELECT c.*, g.device,
           CASE WHEN c.end_ns <= g.gap_end THEN g.gap_start END AS gap_start_ns,
           CASE WHEN c.end_ns <= g.gap_end THEN g.gap_end END AS gap_end_ns
    FROM _blocking c
    ASOF LEFT JOIN _main_gaps g ON c.run_id = g.run_id AND c.end_ns > g.gap_start
), _ranked AS (
    -- the waiting calls of a gap in the order they returned: the first one is charged
    SELECT *, ts_ns <= gap_start_ns AS waited,
           row_number() OVER (PARTITION BY run_id, gap_start_ns, ts_ns <= gap_start_ns ORDER BY end_ns, event_id) AS gap_rank
    FROM _placed
), _host_ended AS (
    -- the waited-for gaps that the host ended, as `idle_gaps` classifies a gap (cause `host`): the launch
    -- of the work after the gap returned after the gap began (checked for these gaps only: cheaper
    -- than classifying every gap of the trace)
    SELECT run_id, gap_start_ns FROM (
        -- each activity starting the next block, with the return of its first launch call
        SELECT g.run_id, g.gap_start_ns, a.event_id,
               arg_min(l.launch_ts_ns + l.launch_dur_ns, (l.launch_ts_ns, l.runtime_event_id)) AS launch_end_ns
        FROM (SELECT DISTINCT run_id, device, gap_start_ns, gap_end_ns FROM _ranked WHERE waited AND gap_rank = 1) g
        JOIN gpu_activities a ON a.run_id = g.run_id AND a.device = g.device AND a.ts_ns = g.gap_end_ns
        JOIN _launches l ON l.run_id = a.run_id AND l.gpu_event_id = a.event_id
        GROUP BY g.run_id, g.gap_start_ns, a.event_id)
    GROUP BY run_id, gap_start_ns
    HAVING max(launch_end_ns) > gap_start_ns
), _waits AS MATERIALIZED (
    -- each charged gap: the call that waited for it and returned first, and the call it is charged to
    SELECT r.run_id, r.event_id, e.primary_event_id, r.gap_end_ns - r.end_ns AS idle_ns
    FROM _ranked r
    JOIN _episodes e ON e.run_id = r.run_id AND e.episode = r.episode
    JOIN _host_ended h ON h.run_id = r.run_id AND h.gap_start_ns = r.gap_start_ns
    WHERE r.waited AND r.gap_rank = 1 AND NOT e.reads_data
), _charges AS (
    SELECT run_id, primary_event_id AS event_id, sum(idle_ns) AS charged_idle_ns
    FROM _waits GROUP BY run_id, primary_event_id
)
SELECT r.run_id, r.event_id, r.call, r.blocking, r.pid, r.tid, r.ts_ns, r.dur_ns, r.end_ns, r.parent_id,
       coalesce(p.name, '(top level)') AS site, r.copy_name, r.bytes,
       nullif(regexp_extract(r.moved_name, '^Memcpy ([^(]*[^( ])', 1), '') AS copy_direction,
       nullif(regexp_extract(r.moved_name, '\(([^()]*) -> ', 1), '') AS copy_src,
       nullif(regexp_extract(r.moved_name, ' -> ([^()]*)\)', 1), '') AS copy_dst,
       r.copy_bytes, r.moved_gpu_ns AS copy_gpu_ns, r.device, r.gap_start_ns, r.gap_end_ns,
       coalesce(ch.charged_idle_ns, 0) AS charged_idle_ns, coalesce(a.region, m.region) AS region,
       st.event_id IS NOT NULL AS critical_thread, coalesce(st.stalled_ns, 0) AS stalled_ns,
       w.primary_event_id AS idle_charged_to
FROM _ranked r
LEFT JOIN events p ON p.event_id = r.parent_id
LEFT JOIN _charges ch ON ch.run_id = r.run_id AND ch.event_id = r.event_id
LEFT JOIN _waits w ON w.run_id = r.run_id AND w.event_id = r.event_id
LEFT JOIN _annotated a ON a.event_id = r.event_id
LEFT JOIN _modules m ON m.event_id = r.event_id
LEFT JOIN _stalls st ON st.event_id = r.event_id;

-- One row per blocking host call: a call that holds the launching thread until the GPU catches up:
-- `cudaDeviceSynchronize`, `cudaStreamSynchronize`, `cudaEventSynchronize` and their `cu*`, `hip*` and
-- `aclrt*` forms (`sync`); a synchronous `cudaMemcpy`/`hipMemcpy`/`aclrtMemcpy` (`sync memcpy`; not
-- device-to-device copies, nor host-to-device ones up to `host_blocking_small_htod_bytes()`); a
-- synchronous memset (`sync memset`); an async copy whose device side touched pageable host memory,
-- which the driver turns synchronous (`pageable async memcpy`).
--
-- Two costs, kept apart because they are different time (H001 host-sync reports the larger):
--
-- - GPU idle after the call (`charged_idle_ns`): the device waits for the host. Every idle gap of the
--   run's main device is charged at most ONCE, so sums over calls never count a gap twice. A call
--   waited for a gap when it started at or before the gap's start (the device drained while the call
--   held its thread) and returned inside the gap. Only a gap the host ended is charged
--   (`idle_gaps.cause` = `host`: the launch of the work after it returned after the gap began); one
--   that queued work or a missing launch record ended did not wait for the host. Of the calls that
--   waited for a gap, the first to return charges it: the idle from that return to the gap's end goes
--   to the longest blocking call of the same op invocation (the pageable copy that held the thread
--   for milliseconds, not the stream sync after it that waited for its last microseconds). A gap
--   whose op invocation reads data back (its longest call copies device-to-host more than
--   `host_blocking_read_bytes()`: a `.cpu()` of a tensor, a synchronous `cudaMemcpy` of a result)
--   is charged to no call: the idle after it is the host using that data, a data dependency that
--   G001 gpu-idle reports as host-caused idle. Every other call is charged 0: one that started with
--   the device already idle returned at once and blocked nothing, as is one that returns while the
--   device is busy.
-- - Host time stalled in the call (`stalled_ns`): the part of a call on a critical thread of the run
--   (`critical_thread`: a thread that launched work on the main device: the step's thread, and in
--   training the autograd thread of the backward pass) during which the main device ran nothing:
--   neither the thread that feeds the device nor the device made progress (a wait on another
--   stream's or device's work, a pageable copy's staging before and after its transfer, a sync's
--   wake-up). The call's whole duration (`dur_ns`) is not a cost by itself: while the device runs the
--   work the host waits for, the wait is harmless when the device is the bottleneck, and a long
--   transfer it waits for is the transfer's time (rule G004 transfer-bound).
CREATE OR REPLACE VIEW host_blocking(
    -- the run
    run_id,
    -- the runtime call
    event_id,
    -- its name
    call,
    -- `sync`, `sync memcpy`, `sync memset` or `pageable async memcpy` (see above)
    blocking,
    -- process
    pid,
    -- thread
    tid,
    -- start of the call
    ts_ns,
    -- how long the thread was blocked in it
    dur_ns,
    -- when it returned
    end_ns,
    -- the event directly enclosing the call (e.g. `aten::_local_scalar_dense` for `tensor.item()`)
    parent_id,
    -- that event's name, `(top level)` when the call has none: the call site
    site,
    -- the copy or memset it issued (`Memcpy DtoH (Device -> Pageable)`), if any
    copy_name,
    -- bytes of that copy or memset
    bytes,
    -- the memcpy the call moved or waited for: its own, else (a sync) the last one its op invocation
    -- issued before it, the `cudaMemcpyAsync` of the same `aten::copy_`; its direction from the copy's
    -- name (`HtoD`, `DtoH`, `DtoD`, `PtoP`, ...; NULL without such a copy)
    copy_direction,
    -- that copy's source memory (`Pageable`, `Pinned`, `Device`, ...; NULL when its name does not say)
    copy_src,
    -- its destination memory
    copy_dst,
    -- its bytes
    copy_bytes,
    -- its duration on the GPU: copy_bytes / copy_gpu_ns is the bandwidth it achieved (bytes per ns = GB/s)
    copy_gpu_ns,
    -- the run's main device, whose gaps are charged (NULL when the call returns before its first gap)
    device,
    -- start of the main device's idle gap the call returned in; NULL when it returned while the
    -- device was busy (or outside its first and last block)
    gap_start_ns,
    -- end of that gap
    gap_end_ns,
    -- GPU idle charged to this call (see above): for the longest blocking call of an op invocation that
    -- waited for a gap, from the waiting call's return to the gap's end; 0 for every other call
    charged_idle_ns,
    -- the innermost region the call ran in: the enclosing user annotation (`record_function`, NVTX
    -- range; by `name_key`, so counters, addresses and per-run ids are masked; `ProfilerStep#N` skipped: it names the
    -- step, not the code) of greatest depth on the call's thread, else the innermost `nn.Module: ...`
    -- Python frame; NULL when neither encloses it. A site is the region and the op:
    -- `## sparse_data_dist ##` says which part of the step copies, `aten::copy_` only how
    region,
    -- whether the call ran on a critical thread: one that launched work on the main device (see above)
    critical_thread,
    -- on a critical thread, the part of the call with the main device idle (see above); 0 on other
    -- threads
    stalled_ns,
    -- for the call that waited for a charged gap and returned first: the call the gap's idle, from this
    -- call's return to gap_end_ns, is charged to (itself, or the longest blocking call of its op
    -- invocation); NULL for every other call
    idle_charged_to
) AS
SELECT * FROM host_blocking_exempting(host_blocking_small_htod_bytes());
