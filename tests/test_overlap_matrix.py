"""The overlap matrix (tests/data/overlap_matrix, scripts/make_overlap_matrix.py, one H200): serial and
chunked-overlap steps of the same layers in one trace, copies or a second stream's matmul overlapped,
at three sizes. `tracekit diff --baseline-step/--candidate-step` compares the two step groups, and
the rules that would propose overlapping read that evidence (cells.json holds each schedule's step
time measured outside the profiler, and whether overlap paid)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tests.conftest import sample

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
MATRIX = Path(__file__).resolve().parent / "data" / "overlap_matrix"
CELLS = json.loads((MATRIX / "cells.json").read_text())["cells"]
IDS = [c["file"].removesuffix(".json.gz") for c in CELLS]
GROUPS = ("--baseline-step", "serial*", "--candidate-step", "overlap*")

# How far the profiled step-time ratio (overlapped / serial) may sit from the one measured without the
# profiler: the profiler adds a few microseconds per launch, and the overlapped schedule launches 4x as
# much, so its ratio reads up to about 20% higher on the small cells.
RATIO_TOLERANCE = 1.3
# A difference of the schedules below this share (measured without the profiler) is a tie: the
# profiler's per-launch overhead is of that order.
TIE = 0.05


def run(*args):
    return subprocess.run([TRACEKIT, "-q", *map(str, args)], capture_output=True, text=True, timeout=300)


def measured_change(cell) -> float:
    return cell["overlap_ms"] / cell["serial_ms"] - 1


@pytest.mark.parametrize("cell", CELLS, ids=IDS)
def test_diff_of_the_step_groups_agrees_with_the_measured_schedules(cell):
    change = measured_change(cell)
    if cell["overlap_pays"]:
        bar = 5.0
    else:
        # a loss must show: at least a third of the measured one, and beyond 5% when it is large
        bar = min(5.0, 100 * change / 3)
    proc = run("diff", MATRIX / cell["file"], *GROUPS, "--accept", f"step_time <= +{bar:.2f}%", "-f", "json")
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    steps = doc["steps"]
    assert steps["comparable"] is True, steps["comparability"]
    assert steps["selected"]["baseline"]["steps"] == ["serial_step"]
    assert steps["selected"]["candidate"]["steps"] == ["overlap_step"]
    assert steps["baseline"] >= cell["steps_each"] - 1 and steps["candidate"] >= cell["steps_each"] - 1
    step = doc["delta"]["step"]
    ratio = step["candidate"]["time_ns"] / step["baseline"]["time_ns"]
    assert abs(math.log(ratio / (1 + change))) < math.log(RATIO_TOLERANCE), (ratio, 1 + change)
    if abs(change) >= TIE:
        assert (ratio < 1) == cell["overlap_pays"]
        assert doc["noise"]["within_noise"] is False
    else:
        assert abs(ratio - 1) < TIE
    # overlap pays: the bar holds; overlap loses: the acceptance fails, with exit code 1
    assert proc.returncode == (0 if cell["overlap_pays"] else 1), doc["acceptance"]
    assert doc["passed"] is cell["overlap_pays"]


def test_two_traces_compare_the_first_ones_baseline_steps_with_the_seconds_candidate_steps():
    path = MATRIX / "overlap_copy_large.json.gz"
    with tracekit.open(path) as one:
        alone = one.diff(one, baseline_steps="serial*", candidate_steps="overlap*")
    pair = json.loads(run("diff", path, path, *GROUPS, "-f", "json").stdout)
    assert pair["steps"]["per_step_ns"] == alone["steps"]["per_step_ns"]
    assert [r["label"] for r in pair["baseline"]["runs"]] == ["baseline/overlap_copy_large"]
    assert pair["delta"]["step"]["delta_ns"] == alone["delta"]["step"]["delta_ns"] < 0


def test_a_glob_matches_the_annotation_as_written():
    with tracekit.open(sample("warm_steady_steps.json.gz")) as t:
        doc = t.diff(t, baseline_steps="ProfilerStep#[34]", candidate_steps="ProfilerStep#[56]")
        same = t.diff(t, baseline_steps="ProfilerStep", candidate_steps="ProfilerStep")
    written = [d for d in doc["steps"]["per_step_ns"].values()]
    assert [len(d) for d in written] == [2, 2]
    assert sorted(written[0] + written[1]) == sorted(same["steps"]["per_step_ns"]["baseline"])
    assert same["delta"]["step"]["delta_ns"] == 0


def test_a_glob_that_matches_no_step_is_one_line_naming_it_and_the_steps():
    proc = run("diff", MATRIX / "overlap_copy_small.json.gz", "--baseline-step", "fused*", "--candidate-step", "o*")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'fused*'" in lines[0]
    assert "overlap_step" in lines[0] and "serial_step" in lines[0]
    half = run("diff", MATRIX / "overlap_copy_small.json.gz", "--baseline-step", "serial*")
    assert half.returncode == 2 and "--candidate-step" in half.stderr
