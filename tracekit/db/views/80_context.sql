-- Workload context: what kind of program a run profiled, inferred once from the names in the trace,
-- so that a finding's next experiment fits the workload (no DataLoader advice for an inference
-- server or a C++ code, no PyTorch debugging switch for a trace without PyTorch, DDP or TorchRec
-- knobs where DDP or TorchRec is seen). Every column comes with the evidence that decided it.

-- An all-reduce count per step from which gradients are reduced tensor by tensor rather than in
-- buckets: DDP's default 25 MiB buckets give one all-reduce per 25 MiB of gradients (a few per step
-- up to a billion fp32 parameters), while per-parameter reduction gives one per parameter tensor
-- (hundreds per step for a ResNet or a transformer: 404 per step on the corpus's compiled-autograd
-- job, at most 8 on its bucketed DDP jobs).
CREATE OR REPLACE MACRO context_many_allreduces_per_step() AS 50;

-- One row per run: the workload (training or inference), the framework (PyTorch or a native
-- application), how kernels are issued (eager, torch.compile, CUDA graphs), the serving engine or
-- recommender framework, the data-parallel wrapper, the data loader, and the gradient all-reduce
-- rate, each with its evidence. Names are matched on host events only (ops, annotations, Python
-- frames, runtime calls), except torch.compile's generated Triton kernels.
--
-- Cost: one aggregation of the host events by name (the name patterns run once per distinct name),
-- one scan of the kernels, and `step_candidates`.
CREATE OR REPLACE VIEW workload_context(
    -- the run
    run_id,
    -- `training` (autograd backward ops, a `## backward ##` annotation, an optimizer step, or a
    -- MindSpore graph's `Gradients/` kernels),
    -- `inference` (no backward, and prefill/decode/generate annotations or frames, or a serving
    -- engine), else `unknown`
    workload,
    -- the counts that decided `workload`
    workload_evidence,
    -- `mindspore` (kernels named by a MindSpore graph's full scope, `Default/.../Conv2D-op8`, and no
    -- PyTorch op), `pytorch` (PyTorch ops `aten::`/`c10d::`, `ProfilerStep#N` or Python frames),
    -- `native` (GPU runtime calls but no PyTorch op: a C/C++/Fortran application, e.g. an MPI+CUDA
    -- code), else `unknown`
    framework,
    -- the counts that decided `framework`
    framework_evidence,
    -- `cuda_graphs` (`cudaGraphLaunch`/`hipGraphLaunch`/`cuGraphLaunch` calls), else `compiled`
    -- (torch.compile: `CompiledFunction`, `Torch-Compiled Region`, `TorchDynamo` ops or Inductor's
    -- `triton_` kernels), else `eager` (every kernel launched on its own); NULL without GPU work
    execution,
    -- the counts that decided `execution`
    execution_evidence,
    -- true when torch.compile is seen, also in a run whose `execution` is `cuda_graphs`
    compiled,
    -- `vllm`, `sglang`, `torchrec` (`## sparse_data_dist ##`, `ShardedEmbedding`, `torchrec`
    -- frames), `deepspeed`, or NULL when none is seen
    engine,
    -- the names that decided `engine`
    engine_evidence,
    -- `fsdp` (`FullyShardedDataParallel`, `FSDP::`), `ddp` (`DistributedDataParallel.forward`),
    -- `mpi` (`MPI_*` calls or ranges), or NULL
    parallelism,
    -- the names that decided `parallelism`, and the DDP buffer broadcasts seen
    parallelism_evidence,
    -- DDP forward buffer broadcasts: `aten::flatten_dense_tensors`/`unflatten_dense_tensors` ops
    -- inside `DistributedDataParallel.forward` (what `broadcast_buffers=True` costs every forward)
    ddp_buffer_broadcasts,
    -- host time of those ops
    ddp_buffer_broadcast_ns,
    -- `single-process` (`_SingleProcessDataLoaderIter`: batches are loaded on the training thread),
    -- `workers` (`_MultiProcessingDataLoaderIter`), or NULL when no DataLoader is traced
    data_loader,
    -- host time in the DataLoader's `__next__` annotations
    data_loader_ns,
    -- all-reduce kernels per occurrence of the step annotation (`step_candidates`; the whole run
    -- when it has none): many more than
    -- `context_many_allreduces_per_step()` means gradients are reduced tensor by tensor
    allreduces_per_step,
    -- allreduces_per_step is at least `context_many_allreduces_per_step()`: gradients are reduced
    -- tensor by tensor, not in buckets
    per_tensor_allreduce,
    -- `npu` (an Ascend profiler's output, or AscendCL `acl*` runtime calls), `gpu` (GPU work of another
    -- runtime), or NULL without device work: which runtime's terms the advice uses
    accelerator
) AS
WITH host AS (
    -- names repeat (every step runs the same ops): match the patterns once per distinct name
    SELECT run_id, kind, name, count(*) AS n, sum(dur_ns) AS dur_ns FROM events
    WHERE kind IN ('cpu_op', 'user_annotation', 'python_function', 'cuda_runtime', 'cuda_driver')
    GROUP BY ALL
), names AS (
    SELECT run_id,
           sum(n) FILTER (WHERE kind = 'cpu_op' AND (name LIKE 'aten::%' OR name LIKE 'c10d::%')) AS torch_ops,
           sum(n) FILTER (WHERE name LIKE 'ProfilerStep#%') AS profiler_steps,
           sum(n) FILTER (WHERE kind = 'python_function') AS python_frames,
           sum(n) FILTER (WHERE kind IN ('cuda_runtime', 'cuda_driver')) AS runtime_calls,
           sum(n) FILTER (WHERE kind = 'cuda_runtime' AND (name LIKE 'acl%' OR name LIKE 'AscendCL@%')) AS acl_calls,
           sum(n) FILTER (WHERE kind IN ('cpu_op', 'user_annotation')
                            AND (name LIKE '%Backward%' OR name LIKE 'autograd::engine::evaluate_function:%'
                                 OR name LIKE '%## backward ##%' OR name ILIKE '%loss.backward%')) AS backward_ops,
           sum(n) FILTER (WHERE kind IN ('cpu_op', 'user_annotation', 'python_function')
                            AND (name LIKE 'Optimizer.step%' OR name LIKE '%## optimizer ##%'
                                 OR name ILIKE '%optimizer.py(%): step')) AS optimizer_steps,
           sum(n) FILTER (WHERE kind IN ('cpu_op', 'user_annotation', 'python_function')
                            AND (name ILIKE '%decode%' OR name ILIKE '%prefill%' OR name ILIKE '%generate%')) AS inference_names,
           sum(n) FILTER (WHERE kind IN ('cuda_runtime', 'cuda_driver') AND name SIMILAR TO '(cuda|hip|cu)GraphLaunch.*') AS graph_launches,
           sum(n) FILTER (WHERE kind IN ('cpu_op', 'user_annotation')
                            AND (name LIKE 'CompiledFunction%' OR name LIKE 'Torch-Compiled Region%'
                                 OR name LIKE 'TorchDynamo%' OR name LIKE '%CompiledFunctionBackward%')) AS compiled_ops,
           sum(n) FILTER (WHERE name LIKE '%vllm/%' OR name LIKE 'vllm.%' OR name LIKE '%vllm::%') AS vllm_names,
           sum(n) FILTER (WHERE name LIKE '%sglang/%' OR name LIKE 'sglang.%' OR name LIKE '%sglang::%') AS sglang_names,
           sum(n) FILTER (WHERE name LIKE '%sparse_data_dist%' OR name LIKE '%ShardedEmbedding%'
                            OR name LIKE '%torchrec%' OR name LIKE '%TrainPipelineSparseDist%') AS torchrec_names,
           sum(n) FILTER (WHERE name ILIKE '%deepspeed%') AS deepspeed_names,
           sum(n) FILTER (WHERE name LIKE 'FullyShardedDataParallel%' OR name LIKE 'FSDP::%'
                            OR name LIKE '%fully_sharded_data_parallel%') AS fsdp_names,
           sum(n) FILTER (WHERE name = 'DistributedDataParallel.forward') AS ddp_forwards,
           sum(n) FILTER (WHERE name LIKE 'MPI\_%' ESCAPE '\' OR name LIKE 'PMPI\_%' ESCAPE '\') AS mpi_calls,
           sum(n) FILTER (WHERE name LIKE '%_SingleProcessDataLoaderIter%') AS single_loader,
           sum(n) FILTER (WHERE name LIKE '%_MultiProcessingDataLoaderIter%') AS worker_loader,
           coalesce(sum(dur_ns) FILTER (WHERE kind IN ('cpu_op', 'user_annotation') AND name LIKE 'enumerate(DataLoader)%'), 0)
               AS data_loader_ns
    FROM host GROUP BY run_id
), gpu AS (
    -- the name patterns once per distinct kernel name
    SELECT run_id, sum(n) AS kernels,
           coalesce(sum(n) FILTER (WHERE name LIKE 'triton\_%' ESCAPE '\'), 0) AS triton_kernels,
           coalesce(sum(n) FILTER (WHERE is_communication AND name ILIKE '%allreduce%'), 0) AS allreduce_kernels,
           -- MindSpore names a graph's kernels by their full scope: `Default/network-.../Conv2D-op8`,
           -- `Gradients/Default/.../gradConv2D/...-op90`
           coalesce(sum(n) FILTER (WHERE regexp_matches(name, '^(Default|Gradients)/.*-op[0-9]+')), 0) AS mindspore_kernels,
           coalesce(sum(n) FILTER (WHERE starts_with(name, 'Gradients/')), 0) AS mindspore_gradients
    FROM (SELECT run_id, name, is_communication, count(*) AS n FROM kernels GROUP BY ALL) GROUP BY run_id
), step_count AS (
    SELECT run_id, occurrences AS steps FROM step_candidates WHERE choice = 1
), ddp_forwards AS (
    SELECT run_id, pid, tid, ts_ns, end_ns FROM events
    WHERE kind = 'user_annotation' AND name = 'DistributedDataParallel.forward'
), broadcasts AS (
    SELECT f.run_id, count(*) AS n, sum(b.dur_ns) AS ns
    FROM ddp_forwards f JOIN cpu_ops b ON b.run_id = f.run_id AND b.pid = f.pid AND b.tid = f.tid
     AND b.ts_ns >= f.ts_ns AND b.end_ns <= f.end_ns
    WHERE b.name IN ('aten::flatten_dense_tensors', 'aten::unflatten_dense_tensors')
    GROUP BY f.run_id
), facts AS (
    SELECT r.run_id, r.format, n.*, coalesce(g.kernels, 0) AS kernels, coalesce(g.triton_kernels, 0) AS triton_kernels,
           coalesce(g.mindspore_kernels, 0) AS mindspore_kernels, coalesce(g.mindspore_gradients, 0) AS mindspore_gradients,
           coalesce(g.allreduce_kernels, 0) AS allreduce_kernels, coalesce(s.steps, 1) AS steps,
           coalesce(b.n, 0) AS broadcast_ops, coalesce(b.ns, 0) AS broadcast_ns
    FROM runs r LEFT JOIN names n ON n.run_id = r.run_id LEFT JOIN gpu g ON g.run_id = r.run_id
    LEFT JOIN step_count s ON s.run_id = r.run_id LEFT JOIN broadcasts b ON b.run_id = r.run_id
), classified AS (
    SELECT *,
           CASE WHEN vllm_names > 0 THEN 'vllm' WHEN sglang_names > 0 THEN 'sglang'
                WHEN torchrec_names > 0 THEN 'torchrec' WHEN deepspeed_names > 0 THEN 'deepspeed' END AS engine,
           coalesce(torch_ops, 0) + coalesce(profiler_steps, 0) + coalesce(python_frames, 0) > 0 AS is_pytorch,
           coalesce(compiled_ops, 0) + triton_kernels > 0 AS is_compiled
    FROM facts
)
SELECT run_id,
       CASE WHEN backward_ops > 0 OR optimizer_steps > 0 OR mindspore_gradients > 0 THEN 'training'
            WHEN inference_names > 0 OR engine IN ('vllm', 'sglang') THEN 'inference'
            ELSE 'unknown' END,
       format('{} backward ops, {} optimizer steps, {} prefill/decode/generate names, {} MindSpore gradient kernels',
              coalesce(backward_ops, 0), coalesce(optimizer_steps, 0), coalesce(inference_names, 0),
              mindspore_gradients),
       -- a reader that makes ProfilerStep#N annotations from a profiler's step table makes no run PyTorch
       CASE WHEN mindspore_kernels > 0 AND coalesce(torch_ops, 0) = 0 THEN 'mindspore'
            WHEN is_pytorch THEN 'pytorch' WHEN coalesce(runtime_calls, 0) > 0 OR kernels > 0 THEN 'native'
            ELSE 'unknown' END,
       format('{} aten::/c10d:: ops, {} ProfilerStep annotations, {} Python frames, {} runtime calls, {} MindSpore-scoped kernels',
              coalesce(torch_ops, 0), coalesce(profiler_steps, 0), coalesce(python_frames, 0),
              coalesce(runtime_calls, 0), mindspore_kernels),
       CASE WHEN kernels = 0 AND coalesce(graph_launches, 0) = 0 THEN NULL
            WHEN graph_launches > 0 THEN 'cuda_graphs' WHEN is_compiled THEN 'compiled' ELSE 'eager' END,
       format('{} graph launches, {} torch.compile ops, {} triton_ kernels of {}',
              coalesce(graph_launches, 0), coalesce(compiled_ops, 0), triton_kernels, kernels),
       is_compiled,
       engine,
       CASE engine WHEN 'vllm' THEN format('{} vllm names', vllm_names)
                   WHEN 'sglang' THEN format('{} sglang names', sglang_names)
                   WHEN 'torchrec' THEN format('{} sparse_data_dist/ShardedEmbedding/torchrec names', torchrec_names)
                   WHEN 'deepspeed' THEN format('{} deepspeed names', deepspeed_names) END,
       CASE WHEN fsdp_names > 0 THEN 'fsdp' WHEN ddp_forwards > 0 THEN 'ddp' WHEN mpi_calls > 0 THEN 'mpi' END,
       CASE WHEN fsdp_names > 0 THEN format('{} FullyShardedDataParallel/FSDP names', fsdp_names)
            WHEN ddp_forwards > 0 THEN format('{} DistributedDataParallel.forward, {} buffer flatten/unflatten ops in them',
                                              ddp_forwards, broadcast_ops)
            WHEN mpi_calls > 0 THEN format('{} MPI_* calls or ranges', mpi_calls) END,
       CAST(broadcast_ops AS BIGINT),
       CAST(broadcast_ns AS BIGINT),
       CASE WHEN single_loader > 0 THEN 'single-process' WHEN worker_loader > 0 THEN 'workers' END,
       CAST(coalesce(data_loader_ns, 0) AS BIGINT),
       round(allreduce_kernels / steps, 1),
       allreduce_kernels / steps >= context_many_allreduces_per_step(),
       CASE WHEN format IN ('ascend_db', 'ascend_text', 'msprof', 'msprof_cluster') OR acl_calls > 0 THEN 'npu'
            WHEN kernels > 0 THEN 'gpu' END
FROM classified;
