"""Next experiments that fit the workload: the one place that chooses, from a run's `workload_context`
row and the cause a rule found, what to try next.

A rule names the cause (the functions below, one per rule family) and passes the run's context;
the first advice whose condition holds in that context is returned. PyTorch advice is given only
where PyTorch is seen, DataLoader advice only where a single-process DataLoader holds the host,
DDP, TorchRec or MPI knobs only where those are seen. When nothing specific fits, the advice says
what to measure next and is not specific: `Advice.cap` then holds the finding at info, because an
engineer cannot act on it yet. That cap lives here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.engine.phrases import CUDA_GRAPH_RECIPE

# A framework cost (DDP buffer broadcasts, DataLoader time) explains host-caused idle time when it
# is at least this share of it.
MATERIAL_SHARE = 0.05

TRAINING_GRAPH_RECIPE = (
    '`torch.compile(model, mode="reduce-overhead")`, or capture the whole training step (forward, backward and '
    "an optimizer built with `capturable=True`) with `torch.cuda.graph` on static input buffers, or "
    "`torch.cuda.make_graphed_callables` for the model alone"
)

# torch_npu's counterparts (Ascend NPUs): graph capture through aclgraph, the host's launch pipeline
NPU_GRAPH_RECIPE = (
    "torchair's reduce-overhead mode (`torch.compile(model, backend=torchair.get_npu_backend(compiler_config="
    'config))` with `config.mode = "reduce-overhead"`, replayed through aclgraph), or `torch.npu.NPUGraph` with '
    "static input/output buffers (capture once, copy the new inputs in and `graph.replay()` per step)"
)
NPU_TASK_QUEUE = (
    "torch_npu enqueues every op through its task queue: run with `TASK_QUEUE_ENABLE=2` (the two-level launch "
    "pipeline) and the launching thread bound to its own cores (`CPU_AFFINITY_CONF=1`)"
)
NPU_SYNC_LINES = (
    "find the Python line of each implicit sync in the profile's stacks (torch_npu's profiler with "
    "`with_stack=True`: the `aclrtSynchronizeStream` calls and the op above each)"
)

NATIVE_GRAPH_RECIPE = (
    "capture the repeated kernel sequence once (`cudaStreamBeginCapture`/`cudaStreamEndCapture`, "
    "`cudaGraphInstantiate`) and replay it with one `cudaGraphLaunch` per iteration"
)


@dataclass(frozen=True)
class Advice:
    text: str
    specific: bool = True

    def cap(self, severity: str) -> str:
        """The severity a finding with this advice may have: at most info when nothing specific fits."""
        return severity if self.specific else "info"


def _measure(text: str) -> Advice:
    return Advice(text, specific=False)


def _is(context, field: str, value) -> bool:
    return getattr(context, field, None) == value


def _material(ns, of_ns) -> bool:
    return bool(ns) and bool(of_ns) and ns >= MATERIAL_SHARE * of_ns


def _npu(context) -> bool:
    """An Ascend NPU run (`workload_context.accelerator`): graph, queue and sync advice in torch_npu's terms."""
    return _is(context, "accelerator", "npu")


def _graph_recipe(context) -> str:
    return NPU_GRAPH_RECIPE if _npu(context) else CUDA_GRAPH_RECIPE


def _a_graph(context) -> str:
    return "an NPU graph" if _npu(context) else "a CUDA graph"


def _graph_it(context) -> str:
    """How to put a repeated PyTorch step in a CUDA graph (an NPU graph on Ascend), for this workload."""
    if _npu(context):
        return NPU_GRAPH_RECIPE
    if _is(context, "engine", "vllm") and _is(context, "execution", "eager"):
        return "run vLLM without `enforce_eager`/`--enforce-eager`, so it captures the decode batches in CUDA graphs"
    if _is(context, "engine", "sglang") and _is(context, "execution", "eager"):
        return "run SGLang without `--disable-cuda-graph`, so it captures the decode batches in CUDA graphs"
    if _is(context, "execution", "compiled"):
        return 'the step is already compiled: compile it with `mode="reduce-overhead"` so Inductor adds CUDA graphs'
    if _is(context, "workload", "training"):
        return TRAINING_GRAPH_RECIPE
    return CUDA_GRAPH_RECIPE


def host_gaps(context, kind: str, host_idle_ns: int) -> Advice:
    """G001's host-caused idle: `launch_bound` (many short gaps), `graphed` (gaps around graph
    replays) or `long` (other host work between launches)."""
    native = _is(context, "framework", "native")
    if kind == "launch_bound":
        if native:
            return Advice(
                "Cut the launches per iteration: fuse consecutive small kernels, or "
                f"{NATIVE_GRAPH_RECIPE}; re-profile the same loop."
            )
        if _npu(context):
            return Advice(
                f"{NPU_TASK_QUEUE}; then capture the repeated loop body in an NPU graph: {NPU_GRAPH_RECIPE}, and "
                "re-profile the same loop."
            )
        return Advice(
            f"Capture the repeated loop body in a CUDA graph: {CUDA_GRAPH_RECIPE}, then re-profile the same loop."
        )
    if kind == "graphed":
        return Advice(
            "Look at the code between graph replays at the listed call sites: move the remaining eager kernels "
            "(sampling, input copies) into the captured region, and drop or defer per-step host syncs "
            "(`.item()`, `.cpu()`) so the next replay is enqueued before the current one finishes; re-profile."
            if not native
            else "Move the launches left between graph replays into the captured graph and drop host "
            "synchronisation between replays so the next one is enqueued early; re-profile."
        )
    if native and _is(context, "parallelism", "mpi"):
        return Advice(
            "The GPU waits while the host does MPI and CPU work between iterations: overlap them with GPU work "
            "(non-blocking MPI_Isend/MPI_Irecv with the wait after the next kernel launch, CUDA-aware MPI on device "
            "buffers instead of staging through the host, cudaMemcpyAsync from pinned buffers on a second stream); "
            "re-profile and compare the idle share."
        )
    if native:
        return _measure(
            "Read what the host does in the largest gaps (nsys CPU sampling and OS runtime rows of the launching "
            "thread in the listed windows) before changing code; then move that work off the launch path."
        )
    if _is(context, "parallelism", "ddp") and _material(context.ddp_buffer_broadcast_ns, host_idle_ns):
        return Advice(
            f"DistributedDataParallel broadcasts the module's buffers at every forward ({context.ddp_buffer_broadcasts} "
            "flatten/unflatten ops, with their syncs): construct DDP with `broadcast_buffers=False` (buffers such as "
            "BatchNorm statistics then stay per rank; use SyncBatchNorm where they must agree) and re-profile."
        )
    if context.per_tensor_allreduce:
        return Advice(
            f"Gradients are all-reduced tensor by tensor ({context.allreduces_per_step:.0f} all-reduces per step), each "
            "issued from the host inside backward: bucket them (DDP's gradient buckets, `bucket_cap_mb`; with "
            "compiled autograd keep DDP's reducer, e.g. `torch._dynamo.config.optimize_ddp`) so a few large "
            "all-reduces overlap backward; re-profile."
        )
    if _is(context, "data_loader", "single-process") and _material(context.data_loader_ns, host_idle_ns):
        return Advice(
            "Batches are loaded on the training thread (single-process DataLoader): set DataLoader `num_workers` > 0 "
            "with `pin_memory=True` and copy the batch with `non_blocking=True`, so loading overlaps the GPU's step; "
            "re-profile."
        )
    if _is(context, "engine", "torchrec"):
        return Advice(
            "Overlap TorchRec's input distribution with the previous batch's compute: train with "
            "`TrainPipelineSparseDist` (sparse data dist of batch i+1 during batch i) and re-profile."
        )
    if _npu(context) and _is(context, "framework", "pytorch"):
        return Advice(
            f"The NPU waits for the host to issue work: {NPU_TASK_QUEUE}, so the Python thread only enqueues and "
            "another thread launches; if the gaps remain, capture the step in an NPU graph "
            f"({NPU_GRAPH_RECIPE}). Re-profile and compare the idle share."
        )
    return _measure(
        "Open the largest gaps' windows in the trace and read what the launching thread does there (rule H001 "
        "lists blocking syncs); the trace does not show which host work to move yet."
    )


def stream_wait(context) -> Advice:
    """G001's idle while other streams of the device are busy."""
    return _measure(
        "Check which stream the largest gaps wait on (the other streams' activities inside the listed windows) "
        "and whether the dependency is needed; overlap independent work or split it so this stream can proceed, "
        "then re-profile."
    )


def kernel_wait(context) -> Advice:
    """G001's launch latency between queued back-to-back kernels."""
    if _is(context, "framework", "native"):
        return Advice(f"Fuse the short kernels, or {NATIVE_GRAPH_RECIPE}, which shortens the inter-kernel latency.")
    return Advice(
        f"Fuse the short kernels (torch.compile, fused optimizers/norms) or replay them in {_a_graph(context)}, "
        "which shortens the inter-kernel latency; re-profile."
    )


def unattributed(context) -> Advice:
    """G001's idle time that no cause explains."""
    tracing = "the CANN (AscendCL) layer traced" if _npu(context) else "CUDA runtime tracing on"
    return _measure(
        "Open the largest gaps' windows in the trace and check what the stream waits on (events, host-side sleeps, "
        f"another process on the device); re-profile with {tracing}."
    )


def blocking_call(
    context, blocking: str, site: str, direction: str | None = None, host_memory: str | None = None
) -> Advice:
    """H001: a blocking host call of kind `blocking` (`sync`, `sync memcpy`, `sync memset`,
    `pageable async memcpy`) issued from `site`; for a copy or the sync of one, the copy's `direction`
    (`HtoD`, `DtoH`, ...) and the memory on its host side (`Pageable`, `Pinned`)."""
    if _is(context, "framework", "native"):
        if blocking == "sync":
            return Advice(
                "Drop the per-kernel device synchronisation: keep the kernels of a timestep in stream order and "
                "synchronise once per timestep (or only before the host reads a result, with cudaEventSynchronize "
                f"on an event after that kernel); or {NATIVE_GRAPH_RECIPE}; re-profile."
            )
        return Advice(
            "Replace the synchronous copy with cudaMemcpyAsync from a pinned buffer (cudaMallocHost) on its own "
            "stream, and wait for it only where the host needs the data (e.g. before the MPI send), so kernels of "
            "the next chunk overlap the copy; re-profile."
        )
    if _is(context, "engine", "torchrec") and "sparse_data_dist" in site:
        return Advice(
            "TorchRec's input distribution reads lengths and splits back to the host to size its all-to-all: train "
            "with `TrainPipelineSparseDist`, which runs the sparse data dist of the next batch on a side stream while "
            "this one computes, and keep the copies it still needs in pinned memory; re-profile."
        )
    if "DistributedDataParallel" in site:
        return Advice(
            "These syncs come from DistributedDataParallel broadcasting buffers at every forward: construct DDP "
            "with `broadcast_buffers=False` (SyncBatchNorm where statistics must agree) and re-profile."
        )
    if direction == "HtoD" and host_memory == "Pageable":
        return Advice(
            "The source tensor is in pageable host memory, so the driver stages every copy and the thread waits for "
            "it: pin the source (`x = x.pin_memory()` once, a preallocated pinned staging buffer, or DataLoader "
            "`pin_memory=True`) and copy with `x.to(device, non_blocking=True)`, so the copy is queued behind the GPU "
            "work instead of waited for; re-profile."
        )
    if direction == "HtoD" and host_memory == "Pinned":
        return Advice(
            "The source is already pinned; the copy blocks because it is made with non_blocking=False: copy with "
            "`x.to(device, non_blocking=True)` and keep the source alive and unmodified until the copy is done (a "
            "CUDA event recorded after it, or the next use on the same stream); re-profile."
        )
    if direction == "DtoH" and host_memory in ("Pageable", "Pinned"):
        event = "torch.npu.Event" if _npu(context) else "torch.cuda.Event"
        return Advice(
            "Read the result into a preallocated pinned buffer instead of `.cpu()`/`.item()`/`.tolist()`: "
            "`buf = torch.empty(shape, dtype=dtype, pin_memory=True)` once, then `buf.copy_(t, non_blocking=True)` "
            f"and `done = {event}(); done.record()`, and `done.synchronize()` only where the host uses the "
            "values (a step later where the loop allows); re-profile."
        )
    if blocking in ("sync memcpy", "sync memset"):
        return Advice(
            "Replace the synchronous copy with an async one from/to pinned host memory (`non_blocking=True` with "
            "`pin_memory()` buffers) and synchronise on an event only where the data is used; re-profile."
        )
    if blocking == "pageable async memcpy":
        return Advice(
            "Copy through pinned host memory (`tensor.pin_memory()`, a preallocated pinned buffer, DataLoader "
            "`pin_memory=True`) with `non_blocking=True`, and read the result after an event instead of at once; "
            "re-profile."
        )
    if _npu(context):
        return Advice(
            f"{NPU_SYNC_LINES[0].upper()}{NPU_SYNC_LINES[1:]}, then move the host read off the per-step path (keep "
            "losses/metrics on the NPU and read them every N steps, or through a pinned buffer with "
            "non_blocking=True) and re-profile."
        )
    if _is(context, "workload", "inference"):
        return Advice(
            "Run the loop with `torch.cuda.set_sync_debug_mode('warn')` to get the Python line of each implicit sync; "
            "check the stop condition every N decode steps, or read it one step late through a pinned buffer with "
            "non_blocking=True; re-profile."
        )
    return Advice(
        "Run the step with `torch.cuda.set_sync_debug_mode('warn')` to get the Python line of each implicit sync, "
        "then move the host read off the per-step path (accumulate losses/metrics on the GPU and read them every N "
        "steps, or through a pinned buffer with non_blocking=True) and re-profile."
    )


def exposed_comm(context, kind: str, collective: str | None, rank=None, late_rank=None, late_loaded=True) -> Advice:
    """C001: exposed communication of `rank` that is `waiting` (for `late_rank`; `late_loaded`: its
    trace is loaded), `small` (latency-bound messages) or `not_overlapped`."""
    inference = _is(context, "workload", "inference")
    if kind == "waiting" and not late_loaded:
        return Advice(
            f"Profile rank {late_rank} over the same steps (its trace is not loaded here) and analyse it with these "
            f"ranks: R001 straggler then names what on rank {late_rank} takes longer. Start the profilers of all ranks "
            "after a torch.distributed.barrier() so the first collective does not absorb start-up skew."
        )
    if kind == "waiting":
        cut = (
            f"{'NPU' if _npu(context) else 'CUDA'} graphs / torch.compile for the decode step, move logging or "
            ".item() off the step"
            if inference
            else "data loading off the step, fewer host syncs, balanced batches across ranks"
        )
        return Advice(
            f"Find why rank {late_rank} reaches each collective late: compare its per-thread CPU time and GPU busy "
            f"share with rank {rank}'s (tracekit summary), and look for host-bound findings (H001 host-sync, launch "
            f"overhead) on it; then cut its host work per step ({cut}) or rebalance its work. Start the profilers of "
            "all ranks after a torch.distributed.barrier() so the first collective does not absorb start-up skew, and "
            "re-profile all ranks."
        )
    if _is(context, "framework", "mindspore") and not inference:
        return Advice(
            "MindSpore fuses the data-parallel gradient all-reduces into few large ones issued after backward: split "
            "the fusion so the first buckets start while backward still runs (`set_auto_parallel_context("
            "all_reduce_fusion_config=[...])` with split indices, or `comm_fusion` with a smaller size), and check "
            "HCCL_BUFFSIZE for the fused size; re-profile and re-run the evidence SQL."
        )
    if _is(context, "framework", "native"):
        return Advice(
            "Overlap the exchange with computation: post non-blocking MPI/NCCL calls early, compute the interior "
            "while the halo moves and wait only before the boundary update; re-profile."
        )
    if (
        _is(context, "engine", "torchrec")
        and collective
        and "all_to_all" in collective.replace("alltoall", "all_to_all")
    ):
        return Advice(
            "The all-to-all is TorchRec's embedding distribution: pipeline it with `TrainPipelineSparseDist` (input "
            "and output dist of one batch overlap the dense compute of another) and halve its bytes with fp16/bf16 "
            "quantized comms (`qcomms_config` of the sharder); re-profile."
        )
    if context.per_tensor_allreduce or (kind == "small" and not inference and _is(context, "parallelism", "ddp")):
        return Advice(
            f"Gradients are all-reduced in many small messages ({context.allreduces_per_step or 0:.0f} all-reduces per "
            "step): bucket them (DDP `bucket_cap_mb`, `gradient_as_bucket_view=True`; with compiled autograd keep "
            "DDP's reducer) so fewer, larger all-reduces overlap backward; re-profile."
        )
    if kind == "small" and inference and _npu(context):
        return Advice(
            "For small latency-bound collectives on Ascend: let HCCL expand them on the vector cores "
            "(`HCCL_OP_EXPANSION_MODE=AIV`), capture the decode step in an NPU graph (torchair reduce-overhead / "
            "aclgraph) so the collective launches with it, or overlap it with the next layer's independent compute "
            "(async_op=True, wait just before the result is used). Re-profile and re-run the evidence SQL."
        )
    if kind == "small" and inference:
        return Advice(
            "For small latency-bound collectives: try a one-shot/custom all-reduce (vLLM custom_all_reduce, torch "
            "symmetric memory) or NCCL_PROTO=LL / NCCL_ALGO=Tree and compare kernel time; fuse the all-reduce with "
            "the following residual-add + RMSNorm (e.g. FlashInfer/TRT-LLM allreduce fusion); capture the decode step "
            "in a CUDA graph; or overlap it with the next layer's independent compute (async_op=True on a side "
            "stream, wait just before the result is used). Re-profile and re-run the evidence SQL."
        )
    if _is(context, "parallelism", "fsdp"):
        return Advice(
            "Let FSDP prefetch: `backward_prefetch=BACKWARD_PRE`, `forward_prefetch=True`, and check "
            "`limit_all_gathers`; re-profile and re-run the evidence SQL."
        )
    if _is(context, "parallelism", "ddp"):
        return Advice(
            "Let DDP overlap the gradient all-reduce with backward: tune `bucket_cap_mb` so the first buckets are "
            "ready early, `gradient_as_bucket_view=True`, and avoid work after backward that waits on the reducer; "
            "re-profile and re-run the evidence SQL."
        )
    knobs = (
        "HCCL_ALGO / HCCL_BUFFSIZE (and HCCL_OP_EXPANSION_MODE for small messages)"
        if _npu(context)
        else "NCCL_ALGO / NCCL_PROTO / NCCL_NCHANNELS"
    )
    return Advice(
        "Issue the collective asynchronously on a communication stream and wait for it only where its result is "
        "needed (async_op=True + work.wait(); sequence-parallel or async-TP so all-reduce overlaps the next matmul), "
        f"and check {knobs} for the message size. Re-profile and re-run the evidence SQL."
    )


def launch_bound_step(context, kind: str, where_hint: str = "") -> Advice:
    """G002: an eager step whose pace the host's per-launch cost sets; `kind` is `static` (a repeated
    body with static shapes), `dynamic` (repeated, shapes change), `partly_graphed` (the run uses
    graphs elsewhere) or `irregular`."""
    if _is(context, "framework", "native"):
        return Advice(f"Cut the launches per iteration: fuse consecutive small kernels, or {NATIVE_GRAPH_RECIPE}.")
    if kind == "partly_graphed":
        return Advice(
            "Check why this step is not captured (dynamic shapes, host syncs, unsupported ops); capture it "
            "as well, with shapes padded to a few buckets if they vary, or fuse its small kernels with "
            "torch.compile; re-profile."
        )
    if kind == "static":
        return Advice(
            f"Capture one step in {_a_graph(context)} and replay it: {_graph_it(context)}; keep host syncs out of the "
            f"captured region{where_hint}. Re-profile the same loop."
        )
    if kind == "dynamic":
        shapes = (
            "a preallocated KV cache with a length mask, shapes padded to a few buckets"
            if _is(context, "workload", "inference")
            else "pad sequence lengths or batch sizes to a few buckets"
        )
        if _npu(context):
            return Advice(
                f"Make the shapes static ({shapes}) and capture the step in NPU graphs, one per bucket "
                f"({NPU_GRAPH_RECIPE}); {NPU_TASK_QUEUE[0].lower()}{NPU_TASK_QUEUE[1:]}. Re-profile."
            )
        return Advice(
            f"Make the shapes static ({shapes}) and capture the step in CUDA graphs, one per bucket "
            '(`torch.compile(mode="reduce-overhead", dynamic=False)` does this); or fuse the small ops with '
            "torch.compile first. Re-profile."
        )
    return Advice(
        "Cut the number of launches: torch.compile the region (fuses elementwise/norm chains), use fused "
        "implementations (fused optimizers with foreach/fused=True, SDPA, fused norms) and larger batches; "
        f"re-profile{where_hint}."
    )


def graphed_step(context, where: str) -> Advice:
    """G003: a step that replays a CUDA graph and still launches eager work around it."""
    return Advice(
        "Extend the captured region to the eager work around the replay (input copies, sampling, the "
        f"ops listed, from {where or 'the step body'}) or batch it into one kernel; remove per-step host "
        "syncs so the next replay is enqueued early. Re-profile and compare the busy share."
    )
