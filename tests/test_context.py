"""The workload context inferred from real traces, and the next experiments chosen for it."""

from __future__ import annotations

import pytest

from tests.conftest import corpus, run_rule, sample
from tracekit.engine import advice
from tracekit.engine.toolkit import Context


def context_of(con):
    return Context(con).workload(1)


def test_native_applications_are_not_pytorch(loaded):
    cloverleaf = context_of(loaded(corpus("pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite")))
    saxpy = context_of(loaded(corpus("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite")))
    assert cloverleaf.framework == saxpy.framework == "native"
    assert "0 aten::/c10d:: ops" in cloverleaf.framework_evidence
    # a kernel named generate_chunk is the mini-app's own, not an inference loop
    assert cloverleaf.workload == "unknown"
    assert saxpy.parallelism == "mpi"


def test_training_frameworks_are_named_with_their_evidence(loaded):
    ddp = context_of(loaded(corpus("hta__nccl_parser_config__nccl_data.json.gz")))
    assert (ddp.workload, ddp.parallelism) == ("training", "ddp")
    assert ddp.ddp_buffer_broadcasts > 0 and ddp.ddp_buffer_broadcast_ns > 0
    compiled = context_of(loaded(corpus("hta__df_index_resolver.json.gz")))
    assert compiled.execution == "compiled" and compiled.compiled
    assert compiled.per_tensor_allreduce and compiled.allreduces_per_step >= 50
    torchrec = context_of(loaded(corpus("hta__trace_diff__control.json.gz")))
    assert torchrec.engine == "torchrec" and "sparse_data_dist" in torchrec.engine_evidence
    assert torchrec.data_loader == "workers" and not torchrec.per_tensor_allreduce


def test_inference_decode_loops_are_inference(loaded):
    eager = context_of(loaded(sample("gpu_prefill_decode_eager.json.gz")))
    graphed = context_of(loaded(sample("gpu_prefill_decode_cudagraph.json.gz")))
    assert eager.workload == graphed.workload == "inference"
    assert (eager.execution, graphed.execution) == ("eager", "cuda_graphs")


@pytest.mark.parametrize(
    ("trace", "rule", "says", "never"),
    [
        # C++ mini-app: drop the per-kernel device syncs, no PyTorch switch
        ("pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite", "H001", "per-kernel device", "torch"),
        # MPI+CUDA: overlap MPI with GPU work, no DataLoader
        ("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite", "G001", "MPI_Isend", "DataLoader"),
        # compiled autograd issuing hundreds of allreduces per step: bucketing
        ("hta__df_index_resolver.json.gz", "G001", "bucket", "DataLoader"),
        # DDP forward buffer broadcasts are the host work
        ("hta__nccl_parser_config__nccl_data.json.gz", "G001", "broadcast_buffers=False", "DataLoader"),
        # TorchRec all-to-all
        ("hta__trace_diff__control.json.gz", "C001", "TrainPipelineSparseDist", "decode"),
        # a single-process DataLoader holds the training thread: the DataLoader advice is right here
        ("kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz", "G001", "num_workers", "decode"),
    ],
)
def test_next_experiment_fits_the_workload(loaded, trace, rule, says, never):
    findings, _ = run_rule(loaded(corpus(trace)), rule)
    reported = [f for f in findings if f.severity != "info"]
    assert reported, f"{rule} reports nothing above info on {trace}"
    assert all(says in f.next_experiment and never not in f.next_experiment for f in reported)


def test_decode_loop_keeps_cuda_graph_advice_and_training_is_not_told_about_decode(loaded):
    eager = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    (g001,) = [f for f in run_rule(eager, "G001")[0] if f.severity != "info"]
    assert "CUDA graph" in g001.next_experiment
    training = context_of(loaded(corpus("hta__df_index_resolver.json.gz")))
    waiting = advice.exposed_comm(training, "waiting", "allreduce", rank=1, late_rank=0)
    assert "decode" not in waiting.text


def test_advice_without_a_specific_fit_holds_the_finding_at_info(loaded):
    # ResNet-50 with 4 DataLoader workers: the idle is start-up, not data loading, and nothing in the
    # trace names a fix; G001 says what to measure instead and is not rated above info.
    con = loaded(corpus("kineto__resnet50_autograd_api_num_workers_4__worker0.pt.trace.json.gz"))
    findings, _ = run_rule(con, "G001")
    assert findings and all(f.severity == "info" for f in findings)
    assert all("DataLoader" not in f.next_experiment for f in findings)
    assert advice.unattributed(context_of(con)).cap("critical") == "info"


def test_graph_recipe_fits_training_and_compiled_steps(loaded):
    training = context_of(loaded(sample("warm_steady_steps.json.gz")))
    assert training.workload == "training"
    text = advice.launch_bound_step(training, "static").text
    assert "capturable=True" in text and "decode" not in text
    compiled = context_of(loaded(corpus("hta__df_index_resolver.json.gz")))
    assert 'mode="reduce-overhead"' in advice.host_gaps(compiled, "launch_bound", 1).text


def test_torchrec_input_dist_copies_get_the_pipeline(loaded):
    con = loaded(sample("pageable_dtoh_region.json.gz"))
    torchrec = context_of(con)
    assert torchrec.engine == "torchrec"
    text = advice.blocking_call(torchrec, "pageable async memcpy", "## sparse_data_dist ##").text
    assert "TrainPipelineSparseDist" in text
    # the same copy elsewhere in the step is a plain pinned-memory fix
    assert "TrainPipelineSparseDist" not in advice.blocking_call(torchrec, "pageable async memcpy", "aten::copy_").text


class _FailingContextQuery:
    """A connection whose workload_context query fails the way an out-of-memory error would."""

    def __init__(self, con):
        self._con = con

    def execute(self, sql, *args):
        import duckdb

        if sql.strip() == "SELECT * FROM workload_context":
            raise duckdb.OutOfMemoryException("out of memory")
        return self._con.execute(sql, *args)


def test_a_failed_context_query_leaves_every_column_unknown(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    columns = [d[0] for d in con.execute("SELECT * FROM workload_context LIMIT 0").description]
    unknown = Context(_FailingContextQuery(con)).workload(1)
    assert list(unknown._fields) == columns
    assert unknown.run_id == 1 and all(getattr(unknown, c) is None for c in columns[1:])
    assert Context(con).workload(1).workload == "inference"
