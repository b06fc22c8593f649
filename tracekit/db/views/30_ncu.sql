-- Nsight Compute: kernel metrics per profiled launch.

-- One row per profiled launch (Nsight Compute), with the metrics rules read most, in base units.
-- Columns are NULL when the report lacks the metric.
CREATE OR REPLACE VIEW ncu_launches(
    -- the run
    run_id,
    -- ncu's `ID` of the launch
    launch_id,
    -- kernel name
    kernel,
    -- grid as written
    grid,
    -- block as written
    block,
    -- GPU index
    device,
    -- stream
    stream,
    -- `gpu__time_duration.sum`, in ns
    duration_ns,
    -- `sm__throughput.avg.pct_of_peak_sustained_elapsed` (percent of peak)
    sm_pct,
    -- `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed`, else
    -- `dram__throughput.avg.pct_of_peak_sustained_elapsed` (percent of peak)
    mem_pct,
    -- `sm__inst_executed.sum` (or `smsp__inst_executed.sum`)
    inst_executed,
    -- `smsp__sass_thread_inst_executed_op_fp32_pred_on.sum`
    fp32_thread_inst,
    -- `dram__bytes.sum`, else read + write bytes
    dram_bytes,
    -- `launch__grid_size`, else the product of `grid`
    grid_size,
    -- NVIDIA's SpeedOfLight rule: `high throughput` when either pct is >= 80, `latency` when both
    -- are < 60, else `compute` / `memory` when one leads by >= 10 points, else `balanced`
    bound
) AS
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
       coalesce(dram_bytes_total, dram_bytes_rw),
       coalesce(grid_size_metric,
                list_product(list_transform(string_split(trim(grid, '()'), ','), lambda x: TRY_CAST(trim(x) AS DOUBLE)))),
       CASE WHEN sm_pct IS NULL OR mem_pct IS NULL THEN NULL
            WHEN greatest(sm_pct, mem_pct) >= 80 THEN 'high throughput'
            WHEN sm_pct < 60 AND mem_pct < 60 THEN 'latency'
            WHEN sm_pct - mem_pct >= 10 THEN 'compute'
            WHEN mem_pct - sm_pct >= 10 THEN 'memory'
            ELSE 'balanced' END
FROM m;
