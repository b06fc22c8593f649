"""G004 transfer-bound on real traces: the project's H200 weight-streaming runs (pageable and pinned),
an MPI code whose GPU time is its copies, and silence on the corpus where copies are a small part of
GPU time."""

from __future__ import annotations

import jsonschema
import pytest

from tests.conftest import corpus, evidence, run_rule, sample
from tracekit.engine.runner import run_rules
from tracekit.findings.model import json_schema
from tracekit.findings.report import rank
from tracekit.rules.transfer_bound import PCIE_GEN4, PCIE_GEN5, host_link

PAGEABLE, PINNED = sample("transfer_bound_pageable.json.gz"), sample("transfer_bound_pinned.json.gz")


def copy_and_kernel_time(con) -> tuple[int, int]:
    """Copy and kernel time of the main device summed per activity, independently of the busy layers."""
    return con.execute(
        "SELECT sum(dur_ns) FILTER (WHERE kind = 'gpu_memcpy'), sum(dur_ns) FILTER (WHERE kind = 'kernel') "
        "FROM gpu_activities a JOIN main_device m ON m.run_id = a.run_id AND m.device = a.device"
    ).fetchone()


def test_pageable_weight_streaming_is_the_primary_finding(loaded):
    con = loaded(PAGEABLE)
    [f] = run_rule(con, "G004")[0]
    copies, kernels = copy_and_kernel_time(con)
    assert copies > 100 * kernels  # the trace: 48 x 64 MiB uploads against 48 tiny matmuls
    row = evidence(con, f)
    assert row["copy_only_ns"] == f.observed.value == f.impact_ns and row["busy_ns"] - row["kernel_ns"] == f.impact_ns
    assert f.severity == "critical" and f.locality["device"] == 0
    [upload] = [d for d in f.extra["directions"] if d["direction"] == "HtoD"]
    assert upload["memory"] == "pageable" and upload["link"] == PCIE_GEN5.name and upload["below_link"]
    assert upload["achieved_gbps"] == pytest.approx(upload["bytes"] / upload["copy_ns"], abs=0.01)
    assert f.expected.value < f.observed.value / 5  # the same bytes at the link's rate
    assert "pageable" in f.title and "PCIe Gen5" in f.title and "pin" in f.next_experiment
    assert any("make_phase_traces.py" in frame for frame in f.locality["code_path"])
    jsonschema.validate(f.as_dict(), json_schema())
    # the GPU time is the copies: their finding comes first, before H001 about the thread they block
    found, _ = run_rules(con)
    assert rank(found)[0].id == f.id


def test_pinned_copies_reach_the_link_and_keep_the_id(loaded):
    [pageable] = run_rule(loaded(PAGEABLE), "G004")[0]
    [pinned] = run_rule(loaded(PINNED), "G004")[0]
    # still transfer-bound (the weights still stream every step), same place: a fix is tracked as one finding
    assert pinned.id == pageable.id and pinned.impact_ns < pageable.impact_ns / 5
    [fast] = [d for d in pinned.extra["directions"] if d["direction"] == "HtoD"]
    [slow] = [d for d in pageable.extra["directions"] if d["direction"] == "HtoD"]
    assert fast["memory"] == "pinned" and not fast["below_link"] and fast["achieved_gbps"] > 5 * slow["achieved_gbps"]
    assert "resident" in pinned.next_experiment and "nvidia-smi" in pinned.next_experiment


def test_mpi_code_bound_by_its_pageable_copies(loaded):
    # SAXPY over MPI on an A100: 262 MB up and back per iteration through pageable memory, a short kernel
    con = loaded(corpus("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"))
    [f] = run_rule(con, "G004")[0]
    copies, kernels = copy_and_kernel_time(con)
    assert copies > 2 * kernels
    assert f.extra["device_name"].startswith("NVIDIA A100") and f.extra["link"] == PCIE_GEN4.name
    assert {(d["direction"], d["memory"]) for d in f.extra["directions"]} == {
        ("HtoD", "pageable"),
        ("DtoH", "pageable"),
    }
    assert f.severity in ("warning", "critical") and f.extra["copy_share_of_busy"] > 0.5


@pytest.mark.parametrize(
    "name",
    [
        "hta__df_index_resolver.json.gz",
        "hta__trace_diff__test.json.gz",
        "hta__negative_queue_length_values_check__rank0.json.gz",
        "kineto__resnet50_num_workers_0__worker0.pt.trace.json.gz",
        "pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite",
    ],
)
def test_quiet_where_copies_are_a_small_part_of_gpu_time(name, loaded):
    con = loaded(corpus(name))
    copies, kernels = copy_and_kernel_time(con)
    assert copies < 0.2 * kernels
    assert run_rule(con, "G004")[0] == []


def test_quiet_on_a_cold_start_whose_copies_are_a_sliver_of_the_window(loaded):
    # AlexNet's first iteration uploads its inputs (84% of the little GPU time), in a 30 s window of start-up
    con = loaded(corpus("hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"))
    copies, kernels = copy_and_kernel_time(con)
    assert copies > kernels
    assert run_rule(con, "G004")[0] == []


def test_host_link_table():
    assert host_link("NVIDIA H200") == host_link("NVIDIA H100 80GB HBM3") == PCIE_GEN5
    assert host_link("NVIDIA GH200 480GB").name == "NVLink-C2C"  # not the H200 its name contains
    assert host_link("Tesla V100-SXM2-16GB").gb_per_s == pytest.approx(15.75)
    assert host_link("AMD Radeon Graphics") is None and host_link(None) is None


def test_unknown_device_compares_pageable_with_pinned():
    # a device the link table does not know (no device properties): the pinned copies of the same run are the
    # yardstick, and the finding says the link is unknown
    from tests.test_views import make_run

    def copy(name, ts, dur, nbytes):
        return {"kind": "gpu_memcpy", "name": name, "ts": ts, "dur": dur, "args": {"bytes": nbytes}}

    con = make_run([
        copy("Memcpy HtoD (Pageable -> Device)", 0, 1000, 4000), copy("Memcpy HtoD (Pinned -> Device)", 1000, 100, 4000),
        {"kind": "kernel", "name": "k", "ts": 1100, "dur": 10},
    ])  # fmt: skip
    [f] = run_rule(con, "G004")[0]
    assert f.extra["link"] is None and any("link" in c and "unknown" in c for c in f.caveats)
    assert "pinned copies of this run: 40.0 GB/s; host link unknown" in f.title
    assert [d["achieved_gbps"] for d in f.extra["directions"]] == [4.0, 40.0]
