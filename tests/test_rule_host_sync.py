"""H001 host-sync on real traces: the per-step .item() sync of the H200 decode loop, pageable
device-to-host copies inside a named region (TorchRec's `## sparse_data_dist ##` and the project's
H200 run of the same pattern), staged pageable uploads whose stream syncs are not blamed, an MPI
code's data reads left to G001, and silence where no blocking call repeats."""

from __future__ import annotations

import jsonschema
import pytest

from tests.conftest import corpus, evidence, run_rule, sample
from tracekit.engine.runner import run_rules
from tracekit.findings.model import json_schema

TORCHREC = "hta__negative_queue_length_values_check__rank0.json.gz"
SAXPY = "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
CLOVERLEAF = "pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite"


def findings(con, **params):
    found, notes = run_rules(con, ["H001"], {"H001": params} if params else None)
    return found, notes


def test_item_sync_in_decode_loop_is_found_and_localized(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    found, _ = findings(con)
    sync = [f for f in found if f.locality["op"] == "aten::_local_scalar_dense"]
    assert len(sync) == 1
    f = sync[0]
    assert f.locality["launch"] == {"call": "cudaStreamSynchronize", "region": "decode_step"}
    assert f.extra["cost"] == "gpu_idle" and f.extra["critical_thread"] and f.severity == "warning"
    assert any("item" in frame for frame in f.locality["code_path"])
    row = evidence(con, f)
    # the evidence query recomputes the observed cost exactly: GPU idle after the calls
    assert row["gpu_idle_after_ns"] == f.observed.value
    assert 0 < row["host_blocked_ns"] < row["last_ns"] - row["first_ns"]
    assert row["calls"] >= 3
    assert f.window_ns > 0 and 0 < f.impact_share < 1
    jsonschema.validate(f.as_dict(), json_schema())
    assert set(f.sample_event_ids) <= {
        r[0] for r in con.execute("SELECT event_id FROM runtime_calls WHERE name = 'cudaStreamSynchronize'").fetchall()
    }


def test_same_site_same_id_in_graph_and_eager_runs(loaded):
    eager, _ = findings(loaded(sample("gpu_prefill_decode_eager.json.gz")), min_share=0.0)
    graph, _ = findings(loaded(sample("gpu_prefill_decode_cudagraph.json.gz")), min_share=0.0)
    ids = lambda fs: {f.id for f in fs if f.locality["op"] == "aten::_local_scalar_dense"}  # noqa: E731
    # the same line of code syncs in both runs: one id, so a fix can be tracked across runs
    assert ids(eager) and ids(eager) == ids(graph)


def test_thresholds_are_respected(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    found, _ = findings(con)
    calls = min(evidence(con, f)["calls"] for f in found)
    assert findings(con, min_calls=calls + 1000)[0] == []


@pytest.mark.parametrize(
    "path",
    [
        lambda: sample("cpu_two_threads.json.gz"),
        lambda: corpus("kineto__docs_traces__before_fix_trace.json"),  # one cudaDeviceSynchronize: not steady state
    ],
)
def test_quiet_without_repeated_blocking_calls(path, loaded):
    found, _ = findings(loaded(path()))
    assert found == []


def _site(found, region, call="cudaMemcpyAsync", op="aten::copy_"):
    return [f for f in found if f.locality["launch"] == {"call": call, "region": region} and f.locality["op"] == op]


def test_pageable_reads_in_torchrec_sparse_data_dist_are_found_by_their_host_time(loaded):
    # the main thread's pageable device-to-host copies inside `## sparse_data_dist ##` hold it for most of each
    # step; the ~10 us stream syncs after them are not the problem. This trace's GPU records are incomplete (the
    # device idles with its next work already launched: a data-quality check), so the copies are rated by their own
    # duration on the launching thread, a host record, and the GPU-idle figures are only context
    con = loaded(corpus(TORCHREC))
    assert con.execute(
        "SELECT bool_or(flagged AND caps_severity) FROM data_quality WHERE check_name = 'idle_with_work_queued'"
    ).fetchone()[0]
    found, _ = findings(con)
    [f] = _site(found, "## sparse_data_dist ##")
    row = evidence(con, f)
    assert f.severity == "critical" and f.extra["cost"] == "host_blocked" and f.extra["critical_thread"]
    assert row["host_blocked_ns"] == f.impact_ns == f.observed.value
    assert row["stalled_ns"] <= row["host_blocked_ns"] and any("incomplete" in c for c in f.caveats)
    steps = con.execute("SELECT sum(dur_ns) FROM steps").fetchone()[0]
    assert row["host_blocked_ns"] > 0.5 * steps  # the host spends most of every step in these copies
    assert "sparse_data_dist" in f.title
    syncs = [f for f in found if f.locality["launch"]["call"] == "cudaStreamSynchronize"]
    assert all(f.severity == "info" for f in syncs)


def test_pageable_reads_in_the_h200_region_run(loaded):
    # the project's run of the same pattern: 6 x 16 MiB `.cpu()` per step in `## sparse_data_dist ##`, and a
    # side-stream synchronize with nothing queued
    con = loaded(sample("pageable_dtoh_region.json.gz"))
    found, _ = findings(con)
    [f] = _site(found, "## sparse_data_dist ##")
    row = evidence(con, f)
    assert f.severity in ("warning", "critical") and f.extra["cost"] == "host_stall"
    # 16 MiB reads are data the host takes: the idle after them is not charged as a sync's
    assert row["gpu_idle_after_ns"] == 0 < row["stalled_ns"] < row["host_blocked_ns"]
    assert not [f for f in found if f.locality["launch"]["call"] == "cudaStreamSynchronize"]


def test_staged_pageable_uploads_are_blamed_not_the_sync_after_them(loaded):
    # weight streaming from pageable memory: each `w.to("cuda")` is a cudaMemcpyAsync that holds the thread
    # for the whole staged copy, then a cudaStreamSynchronize that waits for its last microseconds
    con = loaded(sample("transfer_bound_pageable.json.gz"))
    found, _ = findings(con)
    assert [f.locality["launch"]["call"] for f in found if f.locality["op"] == "aten::copy_"] == ["cudaMemcpyAsync"]
    sync_idle, copy_idle = con.execute(
        "SELECT sum(charged_idle_ns) FILTER (WHERE call = 'cudaStreamSynchronize'), "
        "sum(charged_idle_ns) FILTER (WHERE call = 'cudaMemcpyAsync') FROM host_blocking WHERE site = 'aten::copy_'"
    ).fetchone()
    assert sync_idle == 0 < copy_idle


def test_mpi_data_reads_are_left_to_gpu_idle(loaded):
    # SAXPY over MPI: each iteration reads its 262 MB result back with cudaMemcpy and exchanges it; the GPU
    # idles through the exchange. That idle is G001's (host-caused); H001 does not restate it as a sync's
    con = loaded(corpus(SAXPY))
    found, _ = findings(con)
    assert all(f.severity == "info" for f in found)
    read_idle = con.execute(
        "SELECT sum(charged_idle_ns) FROM host_blocking WHERE contains(copy_name, 'DtoH') AND bytes > 65536"
    ).fetchone()[0]
    host_idle = con.execute("SELECT sum(dur_ns) FROM idle_gaps WHERE cause = 'host'").fetchone()[0]
    assert read_idle == 0 and host_idle > 0.5e9
    [g001] = [f for f in run_rule(con, "G001")[0] if f.severity != "info"]
    assert g001.impact_ns > 0.5e9


def test_device_sync_after_every_kernel_stays_reported(loaded):
    # CloverLeaf calls cudaDeviceSynchronize after each of its 1312 kernels: the launch latency after every
    # return is exposed
    con = loaded(corpus(CLOVERLEAF))
    found, _ = findings(con)
    [f] = [f for f in found if f.locality["launch"] == {"call": "cudaDeviceSynchronize"}]
    assert f.severity == "warning" and f.extra["cost"] == "gpu_idle" and f.locality["op"] == "(top level)"
    assert evidence(con, f)["calls"] > 1000
