-- Tables: what the readers write. One run is one profiled input (a trace file, with the runtime-event
-- logs given with it); every table carries its run_id.

-- Key/value facts about the database itself: `schema_version` (this document's version),
-- `tracekit_version` (the tracekit that last opened it for writing) and `stdlib_digest` (which
-- stdlib of views is installed, so that opening an up-to-date database re-creates nothing).
CREATE TABLE IF NOT EXISTS tracekit_meta (
    -- name of the fact
    key VARCHAR PRIMARY KEY,
    -- its value, as text
    value VARCHAR
);

-- One row per ingested file: the run and its analysed window.
CREATE TABLE IF NOT EXISTS runs (
    -- 1, 2, ... in ingest order
    run_id INTEGER PRIMARY KEY,
    -- path of the input file
    source VARCHAR,
    -- `kineto`, `chrome_json` (Chrome trace JSON from another producer), `nsys_sqlite` (Nsight Systems
    -- SQLite export), `nsys_stats_csv` (`nsys stats` trace report), `ncu_csv`, `numerics_report`,
    -- `serving_log`, `otlp_json`, `bench_serving`, `perfetto_proto` (Perfetto protobuf trace), `ascend_db`
    -- (Ascend torch_npu/msprof SQLite export), `ascend_text` (torch_npu text export), `msprof` (msprof /
    -- MindSpore Profiler folder), `msprof_cluster` (msprof-analyze cluster analysis), or
    -- `runtime_events` for a runtime-event log with no trace to join
    format VARCHAR,
    -- `--label`, else the file name without `.json(.gz)` (`.jsonl(.gz)`)
    label VARCHAR,
    -- `distributedInfo.rank`, else `rank<N>` in the file name, else `--rank`; NULL if none
    rank INTEGER,
    -- `distributedInfo.world_size`
    world_size INTEGER,
    -- where rank came from: `distributedInfo`, `file name` or `--rank`; for an Ascend db export the
    -- file or table that states it (`profiler_info_0.json`, `RANK_DEVICE_MAP`, `META_DATA`)
    rank_source VARCHAR,
    -- Kineto `deviceProperties` (NULL when the trace has none)
    device_properties JSON,
    -- every other top-level key of the trace (schemaVersion, distributedInfo, cupti_version, traceName, ...)
    metadata JSON,
    -- `baseTimeNanoseconds` of the trace
    base_time_ns BIGINT,
    -- first start over non-metadata events: the start of the analysed window
    start_ns BIGINT,
    -- last end over non-metadata events: the end of the analysed window (a trace's window is the
    -- profiler's: runtime events attached to it do not widen it)
    end_ns BIGINT
);

-- Processes, from `process_name` / `process_labels` / `process_sort_index` metadata.
CREATE TABLE IF NOT EXISTS processes (
    -- the run
    run_id INTEGER,
    -- process id as written
    pid BIGINT,
    -- `process_name`
    name VARCHAR,
    -- `process_labels`
    labels VARCHAR,
    -- `process_sort_index`
    sort_index BIGINT
);

-- Host threads: every (pid, tid) that has host events, with its `thread_name` (when a thread is
-- named twice, the specific name wins over `(python)`).
CREATE TABLE IF NOT EXISTS threads (
    -- the run
    run_id INTEGER,
    -- process id
    pid BIGINT,
    -- thread id
    tid BIGINT,
    -- `thread_name` (NULL when the trace names none)
    name VARCHAR,
    -- `thread_sort_index`
    sort_index BIGINT
);

-- Every GPU (device, stream) with device activity.
CREATE TABLE IF NOT EXISTS streams (
    -- the run
    run_id INTEGER,
    -- GPU index
    device INTEGER,
    -- stream id
    stream BIGINT,
    -- the stream's track name as written (e.g. `stream 7`), NULL when unnamed
    name VARCHAR
);

-- Reconciliation, one row per file read: what was read, ingested and skipped, and why.
-- `events_read = events_ingested + events_skipped` always.
--
-- A runtime-event log has its own row, with the `run_id` of the run it joined and format
-- `runtime_events`. `events_read` counts its non-blank lines; skip reasons are `malformed JSON`,
-- `not a JSON object`, `missing ts_ns`, `missing name`, `ts_ns not an integer`, `name not a string`,
-- `dur_ns not an integer`, `negative dur_ns`, `pid not an integer`, `tid not an integer`,
-- `thread not a string`. `notes` holds `clock`, `run` (which run it joined), `blank_lines`, `empty` /
-- `no_valid_lines` when nothing was ingested, and `alignment` (see Runtime-event logs).
CREATE TABLE IF NOT EXISTS ingest_log (
    -- the run the file went into
    run_id INTEGER,
    -- path of the file
    source VARCHAR,
    -- the format it was read as (see `runs.format`)
    format VARCHAR,
    -- raw bytes read, after decompression
    bytes_read BIGINT,
    -- events (lines, rows, packets: the format's unit) read
    events_read BIGINT,
    -- of those, the ones ingested
    events_ingested BIGINT,
    -- of those, the ones skipped
    events_skipped BIGINT,
    -- JSON object reason -> count: `missing ph`, `missing ts`, `complete event without dur`,
    -- `negative dur`, `not a JSON object`, `ts not a finite time in range`, `dur not a finite
    -- duration in range` (NaN, Infinity, or beyond 127 years of microseconds); in every other
    -- format `time not in range (NaN, infinite, or beyond 127 years of ns)` and `id not an integer
    -- of its column's size`; and the format-specific reasons below
    skipped_reasons JSON,
    -- JSON: the clock used, event keys outside the Trace Event Format kept in `events.extra`,
    -- `content_digest` (the file's sha256, or for a file over 16 MiB a sha256 of its size, ends and
    -- 32 blocks between: a trace of the same content is not ingested twice, unless `--replace`),
    -- `loaded_in_batch_of` (a small trace loaded in one statement with others of its format: how
    -- many files that batch held), `loaded_alone_after_batch` (why a small trace that was to load in
    -- a batch loaded alone: the batch was rolled back), and the format-specific notes below
    notes JSON,
    -- wall-clock seconds the read took (of a file loaded in a batch: the batch's, shared by size)
    seconds DOUBLE
);

-- Ingests begun and not finished: one row per run id an ingest took, committed before any of its
-- rows and deleted in the transaction that writes its `runs` row. A row that outlives its process
-- names an ingest that was killed (or whose rollback failed); the next time tracekit opens the
-- database for writing it deletes every row of that run, and of any run id that has rows but no
-- `runs` row, and says so. Run ids come from the sequence `run_ids`, so a killed ingest's id is
-- never handed out again.
CREATE TABLE IF NOT EXISTS ingest_pending (
    -- the run id the ingest took
    run_id INTEGER,
    -- the process that ingests it
    pid INTEGER,
    -- path of the file being ingested
    source VARCHAR,
    -- when the ingest began (UTC)
    started_at TIMESTAMP
);

-- @internal
-- One row per trace event, in file order within a run: the storage behind the `events` view (same
-- columns, without `event_id` and `end_ns`). Query the views.
CREATE TABLE IF NOT EXISTS event_rows (
    -- the run
    run_id INTEGER,
    -- normalized kind (see `events.kind`)
    kind VARCHAR,
    -- phase as written
    ph VARCHAR,
    -- category as written
    cat VARCHAR,
    -- event name
    name VARCHAR,
    -- start
    ts_ns BIGINT,
    -- duration (NULL for instants)
    dur_ns BIGINT,
    -- process (for GPU work: the device)
    pid BIGINT,
    -- thread (for GPU work: the stream)
    tid BIGINT,
    -- `pid/tid` as written when either is not a number
    track VARCHAR,
    -- GPU index of GPU kinds
    device INTEGER,
    -- stream of GPU kinds
    stream BIGINT,
    -- CUPTI correlation id
    correlation BIGINT,
    -- PyTorch op id (`External id`)
    external_id BIGINT,
    -- id of a flow event
    flow_id VARCHAR,
    -- the event's args, lossless
    args JSON USING COMPRESSION zstd,  -- JSON text: zstd writes faster and smaller than the default FSST
    -- top-level event keys outside the Trace Event Format
    extra JSON,
    -- enclosing complete event on the same track
    parent_id BIGINT,
    -- nesting depth on the track (0 = root)
    depth INTEGER
);

-- Nsight Compute CSV, one row per (launch, metric). From `ncu --csv` output, either layout:
-- `--page details` / `--metrics` (long: one row per metric) or `--page raw` (wide: one column per
-- metric, with its units row). Profiler chatter lines (`==PROF==`, `==WARNING==`) are not data.
-- `ingest_log` counts metric rows read, ingested and skipped.
CREATE TABLE IF NOT EXISTS ncu_metrics (
    -- the run
    run_id INTEGER,
    -- ncu's `ID` of the profiled launch
    launch_id INTEGER,
    -- profiled process id
    pid BIGINT,
    -- profiled process name
    process VARCHAR,
    -- host name
    host VARCHAR,
    -- kernel name
    kernel VARCHAR,
    -- CUDA context
    context INTEGER,
    -- stream id
    stream BIGINT,
    -- block size as written, e.g. `(128, 1, 1)`
    block VARCHAR,
    -- grid size as written, e.g. `(128, 1, 1)`
    grid VARCHAR,
    -- GPU index
    device INTEGER,
    -- compute capability
    cc VARCHAR,
    -- report section
    section VARCHAR,
    -- metric name
    metric VARCHAR,
    -- metric unit as written
    unit VARCHAR,
    -- value as written, locale separators included
    value_text VARCHAR,
    -- value as a number (NULL when not a number)
    value DOUBLE,
    -- rule name (recent ncu versions)
    rule_name VARCHAR,
    -- rule type (recent ncu versions)
    rule_type VARCHAR,
    -- rule description (recent ncu versions)
    rule_description VARCHAR,
    -- estimated speedup type (recent ncu versions)
    speedup_type VARCHAR,
    -- estimated speedup (recent ncu versions)
    speedup VARCHAR
);

-- Numerics (correctness) reports, one row per (check row, error metric). From a report with one
-- row per check (`tracekit.numerics.compare` / `write_report` make them): CSV, JSON (an array of
-- objects), JSON Lines or Parquet, each a run of its own (format `numerics_report`). Error metrics
-- are the columns whose name says error (a token starting with `err`, or `rms`, `fro`, `abs`);
-- fractional columns and columns the rows do not need to be told apart are measurements; the rest
-- are conditions (parsers/numerics_report.py). Typed copies of well-known conditions take the first
-- matching column name, case-insensitive.
--
-- ```sql
-- -- Error growth with sequence length per precision
-- SELECT metric, precision, variant, regr_slope(ln(value), ln(seq_len)) AS exponent, max(value)
-- FROM numerics WHERE value > 0 GROUP BY ALL ORDER BY metric, precision;
-- ```
CREATE TABLE IF NOT EXISTS numerics (
    -- the run
    run_id INTEGER,
    -- 0-based row of the check in the file
    row_index INTEGER,
    -- the error column's name
    metric VARCHAR,
    -- the error; rows whose error is not a number are skipped and counted in `ingest_log`
    value DOUBLE,
    -- JSON object of every condition column, as written
    conditions JSON,
    -- `precision`, `input_precision`, `dot_precision`, `fp32_precision` (lower-cased text)
    precision VARCHAR,
    -- `dtype`, `input_dtype`, `data_type` (lower-cased)
    dtype VARCHAR,
    -- `variant`, `impl`, `implementation`, `path`, `method` (lower-cased)
    variant VARCHAR,
    -- the size the errors are tested against: the integer condition named like a size (`seq_len`,
    -- `seqlen`, `T`, `num_tokens`, `context_len`, ...), else the one with the most levels
    seq_len BIGINT,
    -- `partitions`, `num_partitions`, `n_partitions`, `parts`, `cp`, `cp_size`
    partitions INTEGER,
    -- the conditions without a typed copy, as JSON text with sorted keys: group or join on it
    -- together with the typed columns to compare like with like
    other_conditions VARCHAR,
    -- the tensor the metric measures when its name says it (`output`, `state`), else NULL
    tensor VARCHAR,
    -- the reference's magnitude for this tensor, from a measurement column (`ref_*`, `*scale*`);
    -- NULL when the report has none
    reference_scale DOUBLE,
    -- JSON object of the row's measurement columns (reference magnitudes, times, counts, diffs)
    measurements JSON
);

-- The stored findings of an analysis, one row per finding. Written by `Trace.findings()` and
-- `tracekit analyze --db`; findings of different rule selections never mix.
CREATE TABLE IF NOT EXISTS findings (
    -- names the analysis: the rule selection and parameter overrides, hashed
    analysis_key VARCHAR,
    -- finding id, stable across runs (see the finding record)
    id VARCHAR,
    -- rule code
    rule VARCHAR,
    -- rule name
    name VARCHAR,
    -- `critical`, `warning` or `info`
    severity VARCHAR,
    -- 0..1
    confidence DOUBLE,
    -- one-line title
    title VARCHAR,
    -- the run the finding is about
    run_id INTEGER,
    -- the run's rank
    rank INTEGER,
    -- the finding's impact
    impact_ns BIGINT,
    -- impact over the analysed window
    share_of_window DOUBLE,
    -- the whole finding record as JSON
    record JSON
);

-- Run-level quantities a source states itself, one row per (run, metric): filled by readers of
-- end-to-end results (serving benchmark JSON) and logs that print totals; it holds numbers the
-- source computed, not numbers tracekit derived.
CREATE TABLE IF NOT EXISTS run_metrics (
    -- the run
    run_id INTEGER,
    -- e.g. `request_throughput`, `ttft_p99`
    name VARCHAR,
    -- the quantity
    value DOUBLE,
    -- `req/s`, `tok/s`, `ms`, `count`...
    unit VARCHAR,
    -- JSON: where the value came from, e.g. the benchmark's own key
    args JSON
);

-- Collective calls of the job's other ranks, in the columns of `rank_collectives`, for a database
-- that holds some ranks of a job: rows added here (e.g. `INSERT INTO peer_collectives SELECT * FROM
-- other.rank_collectives` from another rank's database) are part of `job_collectives`, and so of
-- `collective_arrivals`, `collective_counts` and `collective_extremes`. tracekit fills it nowhere: a
-- cluster worker is sent the job's `peer_collective_counts` and `peer_collective_extremes` instead,
-- which do not grow with the ranks times their calls.
CREATE TABLE IF NOT EXISTS peer_collectives (
    -- the peer's run id in the job
    run_id INTEGER,
    -- its rank
    rank INTEGER,
    -- its world size
    world_size INTEGER,
    -- the process group
    process_group VARCHAR,
    -- the call's number within its group
    seq BIGINT,
    -- its name
    collective VARCHAR,
    -- the kernel's or op's event in the peer's own database
    event_id BIGINT,
    -- true when the span is a kernel's
    on_device BOOLEAN,
    -- the kernel's device
    device INTEGER,
    -- start on the peer's clock
    start_ns BIGINT,
    -- end on the peer's clock
    end_ns BIGINT,
    -- end_ns - start_ns
    dur_ns BIGINT,
    -- input message size in bytes
    bytes BIGINT,
    -- group size
    group_size INTEGER,
    -- dtype of the message
    dtype VARCHAR
);

-- What a cluster worker is sent of the job's ranks for `collective_counts`: its rows over every rank
-- of the job (the worker's own included), in that view's columns; empty elsewhere. Where it has
-- rows, `collective_counts` reads them instead of computing its own.
CREATE TABLE IF NOT EXISTS peer_collective_counts (
    -- the run, by its id in the job
    run_id INTEGER,
    -- its rank
    rank INTEGER,
    -- its world size
    world_size INTEGER,
    -- the process group
    process_group VARCHAR,
    -- the run's collective calls in this group that ran on a device
    calls BIGINT,
    -- on how many devices
    devices BIGINT
);

-- What a cluster worker is sent of the job's ranks for `collective_extremes`: each chunk's rows of
-- that view over its own ranks (the worker's own chunk's included), combined there into the job's;
-- empty elsewhere. Its size is chunks x collectives, not ranks x collectives.
CREATE TABLE IF NOT EXISTS peer_collective_extremes (
    -- the world size of the ranks
    world_size INTEGER,
    -- the process group
    process_group VARCHAR,
    -- the position of the call among the group's device calls on each rank (1, 2, ...)
    n BIGINT,
    -- how many of the chunk's ranks made this call
    ranks BIGINT,
    -- the two latest starts among them, latest first, each on its rank's own clock
    latest_starts STRUCT(start_ns BIGINT, rank INTEGER)[],
    -- the two earliest ends among them, earliest first
    earliest_ends STRUCT(end_ns BIGINT, rank INTEGER)[]
);
