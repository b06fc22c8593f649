"""K003 aicpu-ops on real Ascend outputs of the corpus: the AI CPU tasks of a kernel_details.csv, of a
torch_npu trace_view.json and of a MindSpore msprof timeline are found with their time (recomputed
from the source files here), and GPU traces, whose kernels have no core, are never read."""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import corpus, sample
from tracekit.engine.runner import run_rules

KD = "ascend/msanalyze__advisor_backend_compute_advice__kernel_details.csv"
TRACE = "ascend/msanalyze__timeline_advice__trace_view.json"
MINDSPORE = "ascend/mindinsight__profiler_PROF_2dev"


def test_the_cast_tasks_of_a_kernel_details_csv(loaded):
    (finding,) = run_rules(loaded(corpus(KD)), ["K003"])[0]
    with open(corpus(KD), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Accelerator Core"].strip() == "AI_CPU"]
    assert finding.extra["aicpu_tasks"] == len(rows) == 7
    assert finding.extra["aicpu_ns"] == pytest.approx(sum(float(r["Duration(us)"]) for r in rows) * 1000, abs=len(rows))
    assert [o["op"] for o in finding.extra["ops"]] == ["trans_Cast"]
    assert finding.extra["ops"][0]["input_dtypes"] == ["INT32"]
    assert finding.severity == "info"  # 0.15% of the window: named, not a headline


def test_the_ai_cpu_tasks_of_a_trace_view(loaded):
    (finding,) = run_rules(loaded(corpus(TRACE)), ["K003"])[0]
    events = json.loads(corpus(TRACE).read_text())
    tasks = [e for e in events if e.get("ph") == "X" and (e.get("args") or {}).get("Task Type") == "AI_CPU"]
    assert finding.extra["aicpu_tasks"] == len(tasks) == 2
    assert finding.extra["aicpu_ns"] == pytest.approx(sum(e["dur"] for e in tasks) * 1000, abs=2)
    assert 0.1 < finding.extra["aicpu_ns"] / finding.extra["compute_ns"] < 0.3


def test_mindspore_dropout_masks_on_each_device(loaded):
    found = run_rules(loaded(corpus(MINDSPORE)), ["K003"])[0]
    assert sorted(f.locality["device"] for f in found) == [0, 1]
    assert all([o["op"] for o in f.extra["ops"]] == ["DropoutGenMask"] for f in found)


def test_gpu_kernels_have_no_core_and_no_finding(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    assert con.execute("SELECT count(*) FROM kernels WHERE core IS NOT NULL").fetchone()[0] == 0
    assert run_rules(con, ["K003"])[0] == []
