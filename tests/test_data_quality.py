"""Data-quality checks on real traces: said out loud, and lowering the findings built on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import corpus, run_rule, sample
from tracekit.engine.runner import run_rules
from tracekit.ingest.pipeline import ingest

SAMPLED = ("hta__trace_filter__sampled_rank-0.json.gz", "hta__trace_filter__sampled_rank-1.json.gz")
INCONSISTENT = "hta__negative_queue_length_values_check__rank0.json.gz"


def flagged(con) -> dict:
    return {
        name: (value, threshold)
        for name, value, threshold in con.execute(
            "SELECT check_name, value, threshold FROM data_quality WHERE flagged"
        ).fetchall()
    }


@pytest.mark.parametrize("name", [*SAMPLED, INCONSISTENT])
def test_missing_gpu_records_are_flagged(loaded, name):
    value, threshold = flagged(loaded(corpus(name)))["idle_with_work_queued"]
    assert value > 4 * threshold  # far past it, not a borderline call


@pytest.mark.parametrize(
    "name",
    [
        "hta__nccl_parser_config__nccl_data.json.gz",
        "hta__df_index_resolver.json.gz",
        "hta__trace_diff__control.json.gz",
        "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    ],
)
def test_complete_traces_are_not_flagged_for_missing_gpu_records(loaded, name):
    assert "idle_with_work_queued" not in flagged(loaded(corpus(name)))


def test_gpu_work_without_launch_is_counted(loaded):
    con = loaded(corpus(INCONSISTENT))
    missing, total = con.execute(
        "SELECT count(*) FILTER (WHERE f.gpu_event_id IS NULL), count(*) FROM gpu_activities a "
        "LEFT JOIN first_launches f ON f.run_id = a.run_id AND f.gpu_event_id = a.event_id"
    ).fetchone()
    value, _ = flagged(con)["gpu_work_without_launch"]
    assert value == pytest.approx(missing / total) and missing > 0


@pytest.mark.parametrize(("name", "rule"), [(SAMPLED[0], "G001"), (SAMPLED[0], "C001"), (INCONSISTENT, "G001")])
def test_findings_built_on_missing_gpu_records_are_held_at_info(loaded, name, rule):
    findings, _ = run_rule(loaded(corpus(name)), rule)
    assert findings
    for f in findings:
        assert f.severity == "info" and f.confidence <= 0.3
        assert "idle_with_work_queued" in [d["check"] for d in f.extra["data_quality"]]
        assert any("idle_with_work_queued" in c for c in f.caveats)


def test_notes_carry_the_numbers_into_the_report(loaded):
    con = loaded(corpus(INCONSISTENT))
    _, notes = run_rules(con, ["G001"])
    note = next(n.as_dict() for n in notes if n.check == "idle_with_work_queued")
    assert note["value"] > note["threshold"] and "% of the window" in note["message"]


def test_a_clean_sample_has_no_notes_and_keeps_its_severity(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    assert flagged(con) == {}
    findings, _ = run_rule(con, "G001")
    assert [f.severity for f in findings] == ["critical"] and "data_quality" not in findings[0].extra


def test_analyze_says_it_before_the_findings_and_in_json():
    tracekit = Path(sys.executable).with_name("tracekit")
    path = corpus(SAMPLED[1])
    wide = {**os.environ, "COLUMNS": "400"}
    text = subprocess.run([tracekit, "analyze", path], capture_output=True, text=True, timeout=300, env=wide)
    lines = text.stdout.splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith("data quality (run 1): GPU 1 idles"))
    assert said < next(i for i, line in enumerate(lines) if " findings (" in line)
    doc = json.loads(
        subprocess.run([tracekit, "analyze", path, "-f", "json"], capture_output=True, text=True, timeout=300).stdout
    )
    (note,) = [d for d in doc["data_quality"] if d.get("check") == "idle_with_work_queued"]
    assert note["value"] > note["threshold"]
    assert doc["severity_counts"]["critical"] == doc["severity_counts"]["warning"] == 0


def test_records_the_profiler_reports_dropping_are_counted(tmp_path, fresh_db):
    # Kineto writes its logger warnings into the trace when it keeps logger metadata; no corpus trace
    # dropped records, so this is a hand-made one with the warning as Kineto words it
    trace = {
        "schemaVersion": 1,
        "WARNING": ["WARNING:2026-01-01 00:00:00 1:1 CuptiActivityApi.cpp:270] Dropped 120 activity records"],
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 5,
             "args": {"correlation": 7}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 8, "dur": 20,
             "args": {"correlation": 7, "device": 0, "stream": 7}},
        ],
    }  # fmt: skip
    path = tmp_path / "dropped.json"
    path.write_text(json.dumps(trace))
    ingest(fresh_db, [path])
    value, threshold = flagged(fresh_db)["profiler_dropped_records"]
    assert value == pytest.approx(120 / 2) and threshold == 0


TOYS = ("hta__with_gpu_user_annotation__step_based_trace_2543932.json.gz",
        "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")  # fmt: skip


@pytest.mark.parametrize("name", TOYS)
def test_a_toy_capture_is_flagged_and_its_gpu_findings_held_at_info(loaded, name):
    con = loaded(corpus(name))
    busy = con.execute("SELECT max(b) FROM (SELECT sum(dur_ns) AS b FROM gpu_busy GROUP BY run_id, device)").fetchone()[
        0
    ]
    value, threshold = flagged(con)["too_little_gpu_work"]
    assert value == busy < threshold
    findings, _ = run_rule(con, "G001")
    assert all(f.severity == "info" for f in findings)


def test_real_workloads_hold_enough_gpu_work(loaded):
    for name in ("hta__nccl_parser_config__nccl_data.json.gz", "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"):
        assert "too_little_gpu_work" not in flagged(loaded(corpus(name)))
    assert "too_little_gpu_work" not in flagged(loaded(sample("gpu_prefill_decode_eager.json.gz")))
