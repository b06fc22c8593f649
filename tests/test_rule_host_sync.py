"""H001 host-sync on real traces: the per-step .item() sync of the H200 decode loop, pageable
device-to-host copies inside a named region (TorchRec's `## sparse_data_dist ##` and the project's
H200 run of the same pattern), staged pageable uploads whose stream syncs are not blamed, an MPI
code's data reads left to G001, and silence where no blocking call repeats. Blocking copies and the
stream syncs of `aten::copy_` are named as the copies they are (direction, memory, size, bandwidth),
with the next experiment their host memory calls for; pinned twins get none of it."""

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


# ------------------------------------------------------------------------------- copies named as copies

RESNET = "kineto__resnet50_num_workers_0__worker0.pt.trace.json.gz"
RESNET_AUTOGRAD = "kineto__resnet50_autograd_api_num_workers_4__worker0.pt.trace.json.gz"
PAGEABLE_UPLOADS = [
    # weight streaming on the project's H200: 12 x 64 MiB `w.to("cuda")` per forward
    lambda: sample("transfer_bound_pageable.json.gz"),
    # a conv-net's input batch, `x.to("cuda")` from pageable memory every step (H200)
    lambda: sample("warm_steady_steps.json.gz"),
    # Kineto's ResNet-50 traces (V100), the batch copied from the DataLoader's pageable tensors
    lambda: corpus(RESNET),
    lambda: corpus(RESNET_AUTOGRAD),
]
COPY_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")


def _copy_sites(found, call="cudaMemcpyAsync"):
    return [f for f in found if f.locality["launch"]["call"] == call and f.locality["op"] in COPY_OPS]


@pytest.mark.parametrize("path", PAGEABLE_UPLOADS, ids=["h200_weights", "h200_batch", "resnet50", "resnet50_autograd"])
def test_pageable_uploads_are_named_with_their_memory_size_and_bandwidth(path, loaded):
    con = loaded(path())
    found, _ = findings(con, min_share=0.0)
    [f] = _copy_sites(found)
    copy, row = f.extra["copy"], evidence(con, f)
    assert (copy["direction"], copy["src"], copy["dst"]) == ("HtoD", "Pageable", "Device")
    # the numbers are the copies' own GPU records, as the evidence query recomputes them
    assert (copy["calls"], copy["bytes"], copy["gpu_ns"]) == (row["copy_calls"], row["copy_bytes"], row["copy_gpu_ns"])
    records = con.execute(
        "SELECT sum(bytes), sum(dur_ns) FROM gpu_activities WHERE name = 'Memcpy HtoD (Pageable -> Device)'"
    ).fetchone()
    # the steady copies run at the rate of all of them (warm-up ones included), not at some other figure
    assert copy["gb_per_s"] == pytest.approx(records[0] / records[1], rel=0.25)
    assert "host-to-device copies from pageable memory (Pageable -> Device" in f.title and "GB/s" in f.title
    assert "pageable" in f.hypothesis and "implicit sync" not in f.hypothesis
    assert "pin_memory()" in f.next_experiment and "non_blocking=True" in f.next_experiment
    assert "set_sync_debug_mode" not in f.next_experiment
    assert "Pinned -> Device" in f.acceptance


@pytest.mark.parametrize("path", [lambda: corpus(RESNET), lambda: corpus(TORCHREC)], ids=["resnet50", "torchrec"])
def test_the_stream_sync_of_a_pageable_copy_is_the_copy_not_an_anonymous_sync(path, loaded):
    # `x.to("cuda")` without non_blocking: aten::copy_ issues the cudaMemcpyAsync and then a cudaStreamSynchronize;
    # the sync's site is that copy, not "an implicit sync such as .item()"
    con = loaded(path())
    found, _ = findings(con, min_share=0.0)
    syncs = _copy_sites(found, "cudaStreamSynchronize")
    assert syncs
    for f in syncs:
        assert "Pageable" in (f.extra["copy"]["src"], f.extra["copy"]["dst"])
        assert " after " in f.title and "copies" in f.title and "(sync)" not in f.title
        assert "implicit sync" not in f.hypothesis and "non_blocking=True" in f.hypothesis
    # and in these traces every stream sync of an aten::copy_ has the copy it waited for
    untied = con.execute(
        "SELECT count(*) FROM host_blocking WHERE call = 'cudaStreamSynchronize' AND site = 'aten::copy_' "
        "AND copy_direction IS NULL"
    ).fetchone()[0]
    assert untied == 0


def test_a_batch_upload_sync_gets_the_pinned_memory_advice(loaded):
    con = loaded(corpus(RESNET))
    found, _ = findings(con, min_share=0.0)
    [sync] = _copy_sites(found, "cudaStreamSynchronize")
    [copy] = _copy_sites(found)
    assert sync.next_experiment == copy.next_experiment and "pin_memory" in sync.next_experiment
    assert sync.extra["copy"]["bytes_per_call"] == copy.extra["copy"]["bytes_per_call"]


def test_reads_into_pageable_memory_get_a_pinned_buffer_and_an_event(loaded):
    # `.cpu()` of the gradients before a gloo all-reduce: pageable device-to-host copies
    con = loaded(sample("gloo_rank1.json.gz"))
    found, _ = findings(con)
    [f] = _copy_sites(found)
    assert f.severity == "warning"
    assert (f.extra["copy"]["direction"], f.extra["copy"]["dst"]) == ("DtoH", "Pageable")
    assert "device-to-host copies to pageable memory (Device -> Pageable" in f.title
    assert all(s in f.next_experiment for s in ("pin_memory=True", "non_blocking=True", "Event", ".cpu()"))
    assert "pin_memory()" not in f.next_experiment  # the upload's advice is not the read's


def test_torchrec_reads_keep_the_pipeline_advice_and_name_every_copy_kind(loaded):
    # `## sparse_data_dist ##` copies both ways through pageable memory: the site names the kind that held the
    # host longest and counts the other
    con = loaded(corpus(TORCHREC))
    found, _ = findings(con)
    [f] = _site(found, "## sparse_data_dist ##")
    kinds = {(c["direction"], c["src"], c["dst"]): c["calls"] for c in f.extra["copies"]}
    assert kinds.keys() == {("DtoH", "Device", "Pageable"), ("HtoD", "Pageable", "Device")}
    assert sum(kinds.values()) == evidence(con, f)["calls"]
    assert f.extra["copy"] == f.extra["copies"][0] and "also " in f.title
    assert "TrainPipelineSparseDist" in f.next_experiment


def test_native_pageable_copies_are_named_from_the_nsys_columns(loaded):
    # CloverLeaf's cudaMemcpy calls: Nsight Systems gives copyKind/srcKind/dstKind, the names follow them
    con = loaded(corpus(CLOVERLEAF))
    found, _ = findings(con)
    [f] = [f for f in found if f.locality["launch"] == {"call": "cudaMemcpy"}]
    assert (f.extra["copy"]["direction"], f.extra["copy"]["src"]) == ("HtoD", "Pageable")
    assert "cudaMallocHost" in f.next_experiment and "pin_memory" not in f.next_experiment


@pytest.mark.parametrize(
    "path",
    [lambda: sample("transfer_bound_pinned.json.gz"), lambda: sample("gpu_prefill_decode_eager.json.gz")],
    ids=["pinned_weights", "decode_item"],
)
def test_pinned_twins_get_no_pageable_advice(path, loaded):
    # the pinned, non_blocking twin of the weight-streaming run, and a decode loop whose `.item()` reads go to
    # pinned memory: no copy blocks, and the `.item()` sync stays the implicit sync it is
    con = loaded(path())
    found, _ = findings(con, min_share=0.0)
    assert found
    for f in found:
        assert "pin_memory()" not in f.next_experiment and "pageable" not in f.title
        assert f.extra["copy"] is None or f.extra["copy"]["src"] != "Pageable"
    assert not _copy_sites(found)


def test_a_sync_waits_for_the_last_copy_of_its_own_op():
    from tests.test_views import make_run, rows, step

    # aten::copy_ A [0-100): a pageable upload, then its stream sync; aten::copy_ B [200-300): a pinned read back
    # (not blocking by itself), its sync, then another sync; a top-level sync at 400 belongs to no op's copy
    def call(name, ts, dur, corr=None):
        return {"kind": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "corr": corr, "depth": 1}

    def copy(name, ts, dur, corr, nbytes):
        return {"kind": "gpu_memcpy", "name": name, "ts": ts, "dur": dur, "corr": corr, "args": {"bytes": nbytes}}

    con = make_run([
        step("aten::copy_", 0, 100, kind="cpu_op"),
        call("cudaMemcpyAsync", 10, 50, corr=1), copy("Memcpy HtoD (Pageable -> Device)", 20, 40, 1, 4000),
        call("cudaStreamSynchronize", 70, 20),
        step("aten::copy_", 200, 100, kind="cpu_op"),
        call("cudaMemcpyAsync", 210, 5, corr=2), copy("Memcpy DtoH (Device -> Pinned)", 220, 10, 2, 1000),
        call("cudaStreamSynchronize", 230, 20), call("cudaStreamSynchronize", 260, 20),
        {**call("cudaStreamSynchronize", 400, 10), "depth": 0},
    ])  # fmt: skip
    con.execute(
        "UPDATE event_rows r SET parent_id = (SELECT o.rowid FROM event_rows o WHERE o.kind = 'cpu_op' "
        "AND o.ts_ns <= r.ts_ns AND o.ts_ns + o.dur_ns >= r.ts_ns + r.dur_ns) WHERE r.kind = 'cuda_runtime'"
    )
    got = {
        r["ts_ns"]: (
            r["blocking"],
            r["copy_direction"],
            r["copy_src"],
            r["copy_dst"],
            r["copy_bytes"],
            r["copy_gpu_ns"],
        )
        for r in rows(con, "SELECT * FROM host_blocking")
    }
    assert got == {
        10: ("pageable async memcpy", "HtoD", "Pageable", "Device", 4000, 40),
        70: ("sync", "HtoD", "Pageable", "Device", 4000, 40),
        230: ("sync", "DtoH", "Device", "Pinned", 1000, 10),
        260: ("sync", "DtoH", "Device", "Pinned", 1000, 10),
        400: ("sync", None, None, None, None, None),
    }


@pytest.mark.parametrize(
    "path", [lambda: sample("transfer_bound_pageable.json.gz"), lambda: corpus(RESNET_AUTOGRAD)], ids=["h200", "resnet"]
)
def test_idle_charged_through_a_copys_sync_survives_the_steady_view(path, loaded):
    # the stream sync after a pageable copy waits for the gap, the copy (the op's longest call) is charged: the
    # steady view must measure the charge on the sync's gap, or every pageable upload loses its GPU idle
    con = loaded(path())
    by_view, by_steady, handed_on = con.execute(
        "SELECT (SELECT sum(charged_idle_ns) FROM host_blocking), "
        "(SELECT sum(charged_idle_ns) FROM steady_host_blocking(65536, all_phases := true)), "
        "(SELECT count(*) FROM host_blocking WHERE idle_charged_to <> event_id)"
    ).fetchone()
    assert handed_on > 0 and by_steady == by_view > 0
    copies = con.execute(
        "SELECT sum(charged_idle_ns) FROM steady_host_blocking(65536) WHERE call = 'cudaMemcpyAsync'"
    ).fetchone()[0]
    assert copies > 0
