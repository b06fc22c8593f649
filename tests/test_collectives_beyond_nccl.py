"""Communication that is not an NCCL kernel: gloo collectives (real two-rank runs,
scripts/make_gloo_traces.py) and the custom communication kernels of serving and training stacks."""

from __future__ import annotations

import statistics

import pytest

import tracekit
from tests.conftest import sample
from tracekit import db

# scripts/make_gloo_traces.py: rank 1 sleeps this long before each all_reduce, rank 0 waits for it
STRAGGLER_HOST_MS = 8.0


@pytest.fixture(scope="module")
def gloo():
    with tracekit.open(sample("gloo_rank0.json.gz"), sample("gloo_rank1.json.gz")) as trace:
        yield trace.sql(
            "SELECT rank, collective, dtype, in_nelems, bytes, seq, op_end_ns - op_ts_ns AS dur_ns, kernel_event_id "
            "FROM collectives ORDER BY seq, rank"
        ).fetchall()


def test_gloo_ranges_are_collectives_with_their_message(gloo):
    by_rank = {r: [row for row in gloo if row[0] == r] for r in (0, 1)}
    assert [row[1] for row in by_rank[0]] == [row[1] for row in by_rank[1]]  # the same sequence on both ranks
    assert {row[1] for row in gloo} == {"all_reduce", "all_to_all"}
    assert all(row[7] is None for row in gloo)  # no kernel: gloo runs on the host
    for _, collective, dtype, nelems, size, *_ in gloo:
        assert nelems > 0
        assert size == nelems * {"float": 4, "long int": 8}[dtype]


def test_the_rank_that_waits_for_a_straggler_spends_longer_in_each_all_reduce(gloo):
    reduces = [row for row in gloo if row[1] == "all_reduce"]
    by_seq: dict[int, dict[int, int]] = {}
    for rank, _, _, _, _, seq, dur, _ in reduces:
        by_seq.setdefault(seq, {})[rank] = dur
    waits = [d[0] - d[1] for seq, d in sorted(by_seq.items())[1:]]  # the first one also waits for start-up
    assert len(waits) >= 4
    assert 0.5 * STRAGGLER_HOST_MS * 1e6 < statistics.median(waits) < 1.5 * STRAGGLER_HOST_MS * 1e6


# Kernel names as these libraries define them (their sources), each a communication kernel.
COMMUNICATION_KERNELS = [
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
    "void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8>(tensorrt_llm::kernels::AllReduceParams)",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*)",
    "void userbuffers_fp16_sum_inplace_gpu_rr_rs<8>(int, int, int, int, int, int, void**, int, unsigned long long)",
]
NOT_COMMUNICATION = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
]


def test_communication_kernels_beyond_nccl_are_classified():
    con = db.connect(None)
    names = COMMUNICATION_KERNELS + NOT_COMMUNICATION
    con.executemany(
        "INSERT INTO event_rows (run_id, kind, ph, name, ts_ns, dur_ns, pid, tid, device, stream) "
        "VALUES (1, 'kernel', 'X', ?, ?, 10, 0, 7, 0, 7)",
        [[name, 100 * i] for i, name in enumerate(names)],
    )
    flagged = dict(con.execute("SELECT name, is_communication FROM kernels").fetchall())
    assert [flagged[n] for n in names] == [True] * len(COMMUNICATION_KERNELS) + [False] * len(NOT_COMMUNICATION)
