-- Nsight Compute: kernel metrics per profiled launch.

-- Multiplier of an SI prefix on ncu's auto-scaled units (`Kbyte`, `Mbyte`, `Ghz`, `Tbyte/s`, `Minst`):
-- 1 for base units and for time, which `ncu_time_ns` converts.
CREATE OR REPLACE MACRO ncu_si_scale(unit) AS
    CASE WHEN length(unit) > 1 THEN
        CASE left(unit, 1) WHEN 'K' THEN 1e3 WHEN 'M' THEN 1e6 WHEN 'G' THEN 1e9 WHEN 'T' THEN 1e12 ELSE 1 END
    ELSE 1 END;

-- Nanoseconds per unit of an ncu time (`nsecond`/`ns`, `usecond`/`us`, `msecond`/`ms`, `second`/`s`).
CREATE OR REPLACE MACRO ncu_time_ns(unit) AS
    CASE lower(unit) WHEN 'usecond' THEN 1e3 WHEN 'us' THEN 1e3 WHEN 'msecond' THEN 1e6 WHEN 'ms' THEN 1e6
                     WHEN 'second' THEN 1e9 WHEN 's' THEN 1e9 ELSE 1 END;

-- FP32 lanes per SM by compute capability (CUDA programming guide, arithmetic instructions table):
-- 64 on 6.0, 7.x and 8.0 (P100, V100, A100), 128 elsewhere (8.6/8.9 consumer parts, 9.0 H100/H200, 10.x).
CREATE OR REPLACE MACRO fp32_lanes_per_sm(cc) AS
    CASE WHEN cc IN ('6.0', '7.0', '7.2', '7.5', '8.0') THEN 64 ELSE 128 END;

-- One row per profiled launch (Nsight Compute), with the metrics rules read most, in base units.
-- Raw metric names first, then the details page's own names (`Duration`, `Registers Per Thread`, ...)
-- for reports exported without `--metrics`. Columns are NULL when the report lacks the metric.
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
    -- `gpu__time_duration.sum` (details: `Duration`), in ns
    duration_ns,
    -- `sm__throughput.avg.pct_of_peak_sustained_elapsed` (percent of peak)
    sm_pct,
    -- `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed`, else
    -- `dram__throughput.avg.pct_of_peak_sustained_elapsed` (percent of peak)
    mem_pct,
    -- `sm__inst_executed.sum` (or `smsp__inst_executed.sum`): warp instructions
    inst_executed,
    -- `smsp__sass_thread_inst_executed_op_fp32_pred_on.sum`
    fp32_thread_inst,
    -- `dram__bytes.sum`, else read + write bytes, in bytes
    dram_bytes,
    -- `launch__grid_size`, else the product of `grid`
    grid_size,
    -- NVIDIA's SpeedOfLight rule: `high throughput` when either pct is >= 80, `latency` when both
    -- are < 60, else `compute` / `memory` when one leads by >= 10 points, else `balanced`
    bound,
    -- `launch__block_size`, else the product of `block`: threads per block
    block_size,
    -- `launch__registers_per_thread`
    registers,
    -- `dram__throughput.avg.pct_of_peak_sustained_elapsed`: DRAM bandwidth, percent of peak
    dram_pct,
    -- `smsp__sass_thread_inst_executed_op_fadd_pred_on.sum`: FP32 adds, thread instructions
    fadd_thread_inst,
    -- `smsp__sass_thread_inst_executed_op_fmul_pred_on.sum`: FP32 multiplies, thread instructions
    fmul_thread_inst,
    -- `smsp__sass_thread_inst_executed_op_ffma_pred_on.sum`: FP32 fused multiply-adds, thread instructions
    ffma_thread_inst,
    -- `smsp__sass_inst_executed_op_global_ld.sum` (or `sass__inst_executed_global_loads`): global load
    -- warp instructions
    global_load_inst,
    -- FP32 operations: fadd + fmul + 2 * ffma (NULL without the three counters)
    fp32_flops,
    -- compute capability as written (`9.0`)
    cc,
    -- SMs: `device__attribute_multiprocessor_count`, `launch__sm_count` or `# SMs`
    sm_count,
    -- SM clock in Hz: `device__attribute_clock_rate` (kHz), else the measured `SM Frequency`
    sm_clock_hz,
    -- peak DRAM bandwidth in bytes/s: memory clock x 2 (double data rate) x bus width from the device
    -- attributes, else the achieved bandwidth over `dram_pct`
    dram_peak_bytes_per_s,
    -- peak FP32 rate in FLOP/s: SMs x `fp32_lanes_per_sm(cc)` x 2 (an FMA is two) x SM clock
    fp32_peak_flops_per_s
) AS
WITH m AS (
    SELECT run_id, launch_id, any_value(kernel) AS kernel, any_value(grid) AS grid, any_value(block) AS block,
           any_value(device) AS device, any_value(stream) AS stream, any_value(cc) AS cc,
           max(CASE WHEN metric = 'gpu__time_duration.sum' OR (metric = 'Duration' AND section LIKE '%Speed Of Light%')
                    THEN value * ncu_time_ns(unit) END) AS duration_ns,
           max(CASE WHEN metric IN ('sm__throughput.avg.pct_of_peak_sustained_elapsed', 'Compute (SM) Throughput')
                    THEN value END) AS sm_pct,
           max(CASE WHEN metric = 'gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed'
                      OR (metric = 'Memory Throughput' AND unit = '%') THEN value END) AS compute_memory_pct,
           max(CASE WHEN metric IN ('dram__throughput.avg.pct_of_peak_sustained_elapsed', 'DRAM Throughput')
                    THEN value END) AS dram_pct,
           max(CASE WHEN metric IN ('sm__inst_executed.sum', 'smsp__inst_executed.sum', 'Executed Instructions')
                    THEN value * ncu_si_scale(unit) END) AS inst_executed,
           max(CASE WHEN metric IN ('smsp__sass_thread_inst_executed_op_fp32_pred_on.sum', 'sm__sass_thread_inst_executed_op_fp32_pred_on.sum')
                    THEN value * ncu_si_scale(unit) END) AS fp32_thread_inst,
           max(CASE WHEN metric IN ('smsp__sass_thread_inst_executed_op_fadd_pred_on.sum', 'sm__sass_thread_inst_executed_op_fadd_pred_on.sum')
                    THEN value * ncu_si_scale(unit) END) AS fadd_thread_inst,
           max(CASE WHEN metric IN ('smsp__sass_thread_inst_executed_op_fmul_pred_on.sum', 'sm__sass_thread_inst_executed_op_fmul_pred_on.sum')
                    THEN value * ncu_si_scale(unit) END) AS fmul_thread_inst,
           max(CASE WHEN metric IN ('smsp__sass_thread_inst_executed_op_ffma_pred_on.sum', 'sm__sass_thread_inst_executed_op_ffma_pred_on.sum')
                    THEN value * ncu_si_scale(unit) END) AS ffma_thread_inst,
           max(CASE WHEN metric IN ('smsp__sass_inst_executed_op_global_ld.sum', 'sass__inst_executed_global_loads')
                    THEN value * ncu_si_scale(unit) END) AS global_load_inst,
           max(CASE WHEN metric = 'dram__bytes.sum' THEN value * ncu_si_scale(unit) END) AS dram_bytes_total,
           sum(CASE WHEN metric IN ('dram__bytes_read.sum', 'dram__bytes_write.sum') THEN value * ncu_si_scale(unit) END) AS dram_bytes_rw,
           max(CASE WHEN metric = 'Memory Throughput' AND unit LIKE '%byte/s' THEN value * ncu_si_scale(unit) END) AS dram_bytes_per_s,
           max(CASE WHEN metric = 'launch__grid_size' OR (metric = 'Grid Size' AND section = 'Launch Statistics')
                    THEN value END) AS grid_size_metric,
           max(CASE WHEN metric = 'launch__block_size' OR (metric = 'Block Size' AND section = 'Launch Statistics')
                    THEN value END) AS block_size_metric,
           max(CASE WHEN metric IN ('launch__registers_per_thread', 'Registers Per Thread') THEN value END) AS registers,
           max(CASE WHEN metric IN ('device__attribute_multiprocessor_count', 'launch__sm_count', '# SMs')
                    THEN value END) AS sm_count,
           max(CASE WHEN metric = 'device__attribute_clock_rate' THEN value * 1e3 END) AS sm_clock_attribute_hz,
           max(CASE WHEN metric = 'SM Frequency' THEN value * ncu_si_scale(unit) END) AS sm_clock_measured_hz,
           max(CASE WHEN metric = 'device__attribute_memory_clock_rate' THEN value * 1e3 END) AS memory_clock_hz,
           max(CASE WHEN metric = 'device__attribute_global_memory_bus_width' THEN value END) AS bus_width_bits
    FROM ncu_metrics GROUP BY run_id, launch_id
), l AS (
    SELECT *, coalesce(compute_memory_pct, dram_pct) AS mem_pct,
           coalesce(dram_bytes_total, dram_bytes_rw, dram_bytes_per_s * duration_ns * 1e-9) AS dram_bytes,
           coalesce(sm_clock_attribute_hz, sm_clock_measured_hz) AS sm_clock_hz,
           fadd_thread_inst + fmul_thread_inst + 2 * ffma_thread_inst AS fp32_flops
    FROM m
)
-- every expression aliased with its column's name: DuckDB 2.0 fails the checkpoint of a database
-- whose view was bound in that session when a commented column's bound name differs from the
-- view's column list (a FATAL error at close, the session's writes left in the WAL)
SELECT run_id, launch_id, kernel, grid, block, device, stream, duration_ns, sm_pct, mem_pct, inst_executed, fp32_thread_inst,
       dram_bytes,
       coalesce(grid_size_metric,
                list_product(list_transform(string_split(trim(grid, '()'), ','), lambda x: TRY_CAST(trim(x) AS DOUBLE))))
           AS grid_size,
       CASE WHEN sm_pct IS NULL OR mem_pct IS NULL THEN NULL
            WHEN greatest(sm_pct, mem_pct) >= 80 THEN 'high throughput'
            WHEN sm_pct < 60 AND mem_pct < 60 THEN 'latency'
            WHEN sm_pct - mem_pct >= 10 THEN 'compute'
            WHEN mem_pct - sm_pct >= 10 THEN 'memory'
            ELSE 'balanced' END AS bound,
       coalesce(block_size_metric,
                list_product(list_transform(string_split(trim(block, '()'), ','), lambda x: TRY_CAST(trim(x) AS DOUBLE))))
           AS block_size,
       registers, dram_pct, fadd_thread_inst, fmul_thread_inst, ffma_thread_inst, global_load_inst, fp32_flops, cc,
       sm_count, sm_clock_hz,
       coalesce(memory_clock_hz * 2 * bus_width_bits / 8,
                dram_bytes / (duration_ns * 1e-9) / nullif(dram_pct / 100, 0)) AS dram_peak_bytes_per_s,
       sm_count * fp32_lanes_per_sm(cc) * 2 * sm_clock_hz AS fp32_peak_flops_per_s
FROM l;
