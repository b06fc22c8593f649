"""The public SQL schema of a tracekit database: tables, views and their version.

docs/schema.md documents every name here; tests/test_schema_docs.py fails when the two drift.
Bump SCHEMA_VERSION whenever a public column or view changes meaning or disappears.
"""

SCHEMA_VERSION = "1.2"

# Kineto categories as written (lower-cased) -> normalized kind. Legacy 2020-2021 traces use
# capitalised names (Operator/Runtime/Kernel/Memcpy/Memset); ROCm keeps cuda_runtime for hip* calls.
CATEGORY_KINDS = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "python_function": "python_function",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "memset": "gpu_memset",
    "cuda_sync": "cuda_sync",
    "cuda_event": "cuda_event",
    "trace": "profiler_span",
    "cpu_instant_event": "cpu_instant_event",
    "overhead": "overhead",
}

# Kinds whose pid/tid are a device and a stream, not an OS process and thread.
DEVICE_KINDS = (
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "mtia_ccp_events",
)

# Kinds that nest as a call tree on one track (thread or stream); parent/depth are computed for them.
NESTING_PHASES = ("X",)

TABLES_DDL = """
CREATE TABLE IF NOT EXISTS tracekit_meta (key VARCHAR PRIMARY KEY, value VARCHAR);

CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    source VARCHAR,
    format VARCHAR,
    label VARCHAR,
    rank INTEGER,
    world_size INTEGER,
    rank_source VARCHAR,
    device_properties JSON,
    metadata JSON,
    base_time_ns BIGINT,
    start_ns BIGINT,
    end_ns BIGINT
);

CREATE TABLE IF NOT EXISTS processes (run_id INTEGER, pid BIGINT, name VARCHAR, labels VARCHAR, sort_index BIGINT);
CREATE TABLE IF NOT EXISTS threads (run_id INTEGER, pid BIGINT, tid BIGINT, name VARCHAR, sort_index BIGINT);
CREATE TABLE IF NOT EXISTS streams (run_id INTEGER, device INTEGER, stream BIGINT, name VARCHAR);

CREATE TABLE IF NOT EXISTS ingest_log (
    run_id INTEGER,
    source VARCHAR,
    format VARCHAR,
    bytes_read BIGINT,
    events_read BIGINT,
    events_ingested BIGINT,
    events_skipped BIGINT,
    skipped_reasons JSON,
    notes JSON,
    seconds DOUBLE
);

-- One row per trace event, in file order within a run. event_id is the table's rowid (see the events view).
CREATE TABLE IF NOT EXISTS event_rows (
    run_id INTEGER,
    kind VARCHAR,
    ph VARCHAR,
    cat VARCHAR,
    name VARCHAR,
    ts_ns BIGINT,
    dur_ns BIGINT,
    pid BIGINT,
    tid BIGINT,
    track VARCHAR,
    device INTEGER,
    stream BIGINT,
    correlation BIGINT,
    external_id BIGINT,
    flow_id VARCHAR,
    args JSON USING COMPRESSION zstd,  -- JSON text: zstd writes faster and smaller than the default FSST
    extra JSON,
    parent_id BIGINT,
    depth INTEGER
);

-- Nsight Compute CSV (parsers/ncu_csv.py): one row per (launch, metric).
CREATE TABLE IF NOT EXISTS ncu_metrics (
    run_id INTEGER,
    launch_id INTEGER,
    pid BIGINT,
    process VARCHAR,
    host VARCHAR,
    kernel VARCHAR,
    context INTEGER,
    stream BIGINT,
    block VARCHAR,
    grid VARCHAR,
    device INTEGER,
    cc VARCHAR,
    section VARCHAR,
    metric VARCHAR,
    unit VARCHAR,
    value_text VARCHAR,
    value DOUBLE,
    rule_name VARCHAR,
    rule_type VARCHAR,
    rule_description VARCHAR,
    speedup_type VARCHAR,
    speedup VARCHAR
);

-- Numerics (correctness) reports (parsers/numerics_report.py): one row per (check row, error metric).
CREATE TABLE IF NOT EXISTS numerics (
    run_id INTEGER,
    row_index INTEGER,
    metric VARCHAR,
    value DOUBLE,
    conditions JSON,
    precision VARCHAR,
    dtype VARCHAR,
    variant VARCHAR,
    seq_len BIGINT,
    partitions INTEGER,
    other_conditions VARCHAR
);

-- Findings of one analysis (a rule selection and its parameters, `analysis_key`) of the runs of this
-- database: typed columns for filtering and ranking, and the whole finding record as JSON.
CREATE TABLE IF NOT EXISTS findings (
    analysis_key VARCHAR,
    id VARCHAR,
    rule VARCHAR,
    name VARCHAR,
    severity VARCHAR,
    confidence DOUBLE,
    title VARCHAR,
    run_id INTEGER,
    rank INTEGER,
    impact_ns BIGINT,
    share_of_window DOUBLE,
    record JSON
);

-- Run-level quantities a source states itself (a serving benchmark's throughput and latency
-- percentiles, a server log's totals): one row per (run, metric).
CREATE TABLE IF NOT EXISTS run_metrics (
    run_id INTEGER,
    name VARCHAR,
    value DOUBLE,
    unit VARCHAR,
    args JSON
);
"""

VIEWS_DDL = """
CREATE OR REPLACE VIEW events AS
SELECT rowid AS event_id, run_id, kind, ph, cat, name, ts_ns, dur_ns, ts_ns + coalesce(dur_ns, 0) AS end_ns,
       pid, tid, track, device, stream, correlation, external_id, flow_id, parent_id,
       CASE WHEN ph = 'X' THEN coalesce(depth, 0) END AS depth, args, extra
FROM event_rows;

CREATE OR REPLACE VIEW kernels AS
SELECT event_id, run_id, name, ts_ns, dur_ns, end_ns, device, stream, correlation, external_id,
       args->>'grid' AS grid, args->>'block' AS block,
       TRY_CAST(args->>'registers per thread' AS INTEGER) AS registers_per_thread,
       TRY_CAST(args->>'shared memory' AS BIGINT) AS shared_memory,
       TRY_CAST(args->>'blocks per SM' AS DOUBLE) AS blocks_per_sm,
       TRY_CAST(args->>'warps per SM' AS DOUBLE) AS warps_per_sm,
       TRY_CAST(args->>'est. achieved occupancy %' AS DOUBLE) AS est_occupancy_pct,
       TRY_CAST(args->>'graph id' AS BIGINT) AS graph_id,
       (name ILIKE 'nccl%' OR name ILIKE '%nccl%Kernel%' OR name ILIKE 'rccl%' OR name ILIKE 'msccl%'
        OR name ILIKE '%cross_device_reduce%' OR name ILIKE '%custom_all_reduce%') AS is_communication,
       args
FROM events WHERE kind = 'kernel';

CREATE OR REPLACE VIEW gpu_activities AS
SELECT event_id, run_id, kind, name, ts_ns, dur_ns, end_ns, device, stream, correlation, external_id,
       TRY_CAST(coalesce(args->>'bytes', args->>'Bytes') AS BIGINT) AS bytes, args
FROM events WHERE kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND dur_ns IS NOT NULL;

-- Union of GPU activity intervals per (run, device): when the device was busy at all. Blocks are
-- disjoint and ordered, so busy time before any t is busy_before_ns of the block at t plus the part
-- of it before t: rules read utilisation, gaps and overlaps off this without range joins.
CREATE OR REPLACE VIEW gpu_busy AS
WITH marked AS (
    SELECT run_id, device, ts_ns, end_ns,
           CASE WHEN ts_ns <= max(end_ns) OVER (PARTITION BY run_id, device ORDER BY ts_ns, end_ns
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                THEN 0 ELSE 1 END AS starts_block
    FROM gpu_activities
), blocks AS (
    SELECT run_id, device, ts_ns, end_ns,
           sum(starts_block) OVER (PARTITION BY run_id, device ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS block
    FROM marked
), merged AS (
    SELECT run_id, device, min(ts_ns) AS start_ns, max(end_ns) AS end_ns, count(*) AS activities
    FROM blocks GROUP BY run_id, device, block
)
SELECT run_id, device, start_ns, end_ns, end_ns - start_ns AS dur_ns, activities,
       sum(end_ns - start_ns) OVER w - (end_ns - start_ns) AS busy_before_ns,
       sum(end_ns - start_ns) OVER w AS busy_through_ns,
       lead(start_ns) OVER (PARTITION BY run_id, device ORDER BY start_ns) - end_ns AS next_gap_ns
FROM merged
WINDOW w AS (PARTITION BY run_id, device ORDER BY start_ns ROWS UNBOUNDED PRECEDING);

CREATE OR REPLACE VIEW cpu_ops AS
SELECT event_id, run_id, name, ts_ns, dur_ns, end_ns, pid, tid, external_id, parent_id, depth,
       CAST(coalesce(args->'Input Dims', args->'Input dims') AS VARCHAR) AS input_dims,
       CAST(args->'Input type' AS VARCHAR) AS input_types,
       CAST(args->'Concrete Inputs' AS VARCHAR) AS concrete_inputs,
       TRY_CAST(args->>'Sequence number' AS BIGINT) AS sequence_number,
       TRY_CAST(args->>'Fwd thread id' AS BIGINT) AS fwd_thread_id,
       args
FROM events WHERE kind = 'cpu_op';

CREATE OR REPLACE VIEW runtime_calls AS
SELECT event_id, run_id, kind, name, ts_ns, dur_ns, end_ns, pid, tid, correlation, external_id,
       TRY_CAST(args->>'cbid' AS INTEGER) AS cbid, parent_id, depth, args
FROM events WHERE kind IN ('cuda_runtime', 'cuda_driver', 'mtia_runtime');

-- Runtime/driver call <-> the GPU work it enqueued, by CUPTI correlation id. A Kineto file holds one
-- process, so the run scopes the id; GPU events carry the device as pid, never the launching process.
CREATE OR REPLACE VIEW launches AS
SELECT r.run_id, r.event_id AS runtime_event_id, r.name AS runtime_name, r.ts_ns AS launch_ts_ns,
       r.dur_ns AS launch_dur_ns, r.pid, r.tid, g.event_id AS gpu_event_id, g.kind AS gpu_kind,
       g.name AS gpu_name, g.device, g.stream, g.ts_ns AS gpu_ts_ns, g.dur_ns AS gpu_dur_ns,
       g.ts_ns - (r.ts_ns + r.dur_ns) AS launch_delay_ns, r.correlation, coalesce(r.external_id, g.external_id) AS external_id
FROM runtime_calls r JOIN gpu_activities g ON r.run_id = g.run_id AND r.correlation = g.correlation;

-- Flow arrows (ph s/t/f) paired by (run, category, id): ac2g / async_cpu_to_gpu launch flows, fwdbwd links.
CREATE OR REPLACE VIEW flows AS
SELECT s.run_id, s.cat, s.flow_id, s.event_id AS start_event_id, f.event_id AS end_event_id,
       s.ts_ns AS start_ts_ns, s.pid AS start_pid, s.tid AS start_tid,
       f.ts_ns AS end_ts_ns, f.pid AS end_pid, f.tid AS end_tid, f.track AS end_track
FROM (SELECT * FROM events WHERE kind = 'flow' AND ph = 's') s
LEFT JOIN (SELECT * FROM events WHERE kind = 'flow' AND ph = 'f') f
  ON s.run_id = f.run_id AND s.cat = f.cat AND s.flow_id = f.flow_id;

-- Counter samples (ph C): one row per series key of args.
CREATE OR REPLACE VIEW counters AS
SELECT c.event_id, c.run_id, c.name, k.key AS series, c.ts_ns, c.pid, c.tid,
       TRY_CAST(json_extract_string(c.args, '$."' || k.key || '"') AS DOUBLE) AS value
FROM (SELECT * FROM events WHERE kind = 'counter') c, LATERAL (SELECT unnest(json_keys(c.args)) AS key) k;

CREATE OR REPLACE VIEW python_functions AS
SELECT event_id, run_id, name, ts_ns, dur_ns, end_ns, pid, tid, parent_id, depth,
       TRY_CAST(args->>'Python id' AS BIGINT) AS python_id,
       TRY_CAST(args->>'Python parent id' AS BIGINT) AS python_parent_id
FROM events WHERE kind = 'python_function';

-- Events of runtime-event logs (JSON Lines), on the run's clock; attributes = every other key of the line.
CREATE OR REPLACE VIEW runtime_events AS
SELECT run_id, event_id, name, ts_ns, dur_ns, end_ns, pid, tid, extra->>'thread' AS thread,
       args AS attributes, TRY_CAST(extra->>'line' AS BIGINT) AS line, parent_id, depth
FROM events WHERE kind = 'runtime_event';

-- One row per profiled launch (Nsight Compute), with the metrics rules read most, in base units.
-- *_pct are percent of peak; bound follows NVIDIA's SpeedOfLight rule (thresholds 60/80, balance 10).
CREATE OR REPLACE VIEW ncu_launches AS
WITH m AS (
    SELECT run_id, launch_id, any_value(kernel) AS kernel, any_value(grid) AS grid, any_value(block) AS block,
           any_value(device) AS device, any_value(stream) AS stream,
           max(CASE WHEN metric = 'gpu__time_duration.sum' THEN value *
                    CASE lower(unit) WHEN 'usecond' THEN 1e3 WHEN 'msecond' THEN 1e6 WHEN 'second' THEN 1e9 ELSE 1 END END) AS duration_ns,
           max(CASE WHEN metric = 'sm__throughput.avg.pct_of_peak_sustained_elapsed' THEN value END) AS sm_pct,
           max(CASE WHEN metric IN ('gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed',
                                    'dram__throughput.avg.pct_of_peak_sustained_elapsed') THEN value END) AS mem_pct,
           max(CASE WHEN metric IN ('sm__inst_executed.sum', 'smsp__inst_executed.sum') THEN value END) AS inst_executed,
           max(CASE WHEN metric IN ('smsp__sass_thread_inst_executed_op_fp32_pred_on.sum', 'sm__sass_thread_inst_executed_op_fp32_pred_on.sum') THEN value END) AS fp32_thread_inst,
           max(CASE WHEN metric = 'dram__bytes.sum' THEN value END) AS dram_bytes_total,
           sum(CASE WHEN metric IN ('dram__bytes_read.sum', 'dram__bytes_write.sum') THEN value END) AS dram_bytes_rw,
           max(CASE WHEN metric = 'launch__grid_size' THEN value END) AS grid_size_metric
    FROM ncu_metrics GROUP BY run_id, launch_id
)
SELECT run_id, launch_id, kernel, grid, block, device, stream, duration_ns, sm_pct, mem_pct, inst_executed, fp32_thread_inst,
       coalesce(dram_bytes_total, dram_bytes_rw) AS dram_bytes,
       coalesce(grid_size_metric,
                list_product(list_transform(string_split(trim(grid, '()'), ','), lambda x: TRY_CAST(trim(x) AS DOUBLE)))) AS grid_size,
       CASE WHEN sm_pct IS NULL OR mem_pct IS NULL THEN NULL
            WHEN greatest(sm_pct, mem_pct) >= 80 THEN 'high throughput'
            WHEN sm_pct < 60 AND mem_pct < 60 THEN 'latency'
            WHEN sm_pct - mem_pct >= 10 THEN 'compute'
            WHEN mem_pct - sm_pct >= 10 THEN 'memory'
            ELSE 'balanced' END AS bound
FROM m;
"""

PUBLIC_TABLES = (
    "runs", "processes", "threads", "streams", "ingest_log", "ncu_metrics", "numerics", "run_metrics", "findings",
)
PUBLIC_VIEWS = (
    "ncu_launches",
    "events",
    "kernels",
    "gpu_activities",
    "gpu_busy",
    "cpu_ops",
    "runtime_calls",
    "launches",
    "flows",
    "counters",
    "python_functions",
    "runtime_events",
)
