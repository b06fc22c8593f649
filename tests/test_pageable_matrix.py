"""H001 host-sync over the blocking-copy matrix (tests/data/pageable_matrix, real H200 runs made by
scripts/make_pageable_copy_trace.py; cells.json holds each cell's dimensions and its measured step time).

Every cell queues matmuls, copies, then does host work before using the copy. A copy that blocks the
host (pageable memory either way, or a pinned upload without `non_blocking`) leaves the GPU idle through
that host work: H001 names the copy (direction, memory, size, bandwidth) on the call that holds the
thread (the cudaMemcpyAsync, or the stream sync aten::copy_ issues after it) with the fix its memory
calls for. The pinned, non_blocking twins are quiet, and they are the faster cells, which is what
makes the other verdicts true.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, evidence, run_rule

MATRIX = ROOT / "tests" / "data" / "pageable_matrix"
CELLS = json.loads((MATRIX / "cells.json").read_text())["cells"]
HEALTHY = "pinned"
# What each blocking cell's finding says: the copy's kind and the heart of the advice.
EXPECTED = {
    ("upload", "pageable"): (("HtoD", "Pageable", "Device"), ("pin_memory()", "non_blocking=True")),
    ("upload", "pinned_blocking"): (("HtoD", "Pinned", "Device"), ("already pinned", "non_blocking=True")),
    ("read", "pageable"): (("DtoH", "Device", "Pageable"), ("pin_memory=True", "non_blocking=True", "Event")),
}


def _twin(cell: dict) -> dict:
    return next(
        c for c in CELLS if (c["direction"], c["size"], c["memory"]) == (cell["direction"], cell["size"], HEALTHY)
    )


def _findings(con) -> list:
    found, notes = run_rule(con, "H001")
    assert notes == []
    return found


def _copy_findings(con) -> list:
    return [f for f in _findings(con) if f.locality["op"] == "aten::copy_"]


@pytest.mark.parametrize("cell", CELLS, ids=[c["file"].removesuffix(".json.gz") for c in CELLS])
def test_verdict(cell, loaded):
    con = loaded(MATRIX / cell["file"])
    if cell["memory"] == HEALTHY:
        # nothing blocks: no H001 finding at all, not even an info one
        assert _findings(con) == [], [f.title for f in _findings(con)]
        return
    found = _copy_findings(con)
    # the twin measured faster: the blocking copy costs real step time
    assert cell["mean_step_ms"] > 1.2 * _twin(cell)["mean_step_ms"]
    kind, advice = EXPECTED[(cell["direction"], cell["memory"])]
    [f] = [f for f in found if f.severity != "info"]
    copy = f.extra["copy"]
    assert (copy["direction"], copy["src"], copy["dst"]) == kind
    assert copy["bytes_per_call"] == cell["bytes_per_step"] and copy["calls"] == cell["steps"]
    row = evidence(con, f)
    assert copy["gb_per_s"] == pytest.approx(row["copy_bytes"] / row["copy_gpu_ns"], rel=1e-3)
    assert f"{copy['src']} -> {copy['dst']}" in f.title and "GB/s" in f.title
    assert all(a in f.next_experiment for a in advice), f.next_experiment
    assert "set_sync_debug_mode" not in f.next_experiment and "implicit sync" not in f.hypothesis


def test_a_small_upload_is_reported_on_its_sync_as_the_copy(loaded):
    # 16 KiB from pageable memory: the cudaMemcpyAsync returns at once, the stream sync after it waits for the
    # queued matmuls; that sync is the site, named as the pageable upload it belongs to
    con = loaded(MATRIX / "upload_pageable_small.json.gz")
    [f] = [f for f in _copy_findings(con) if f.severity != "info"]
    assert f.locality["launch"]["call"] == "cudaStreamSynchronize"
    assert "after host-to-device copies from pageable memory" in f.title
