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
from tracekit.engine.runner import run_rules
from tracekit.units import duration

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


# ------------------------------------------------------------------- the rules read the trace's evidence

SERIAL_GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
CHUNK_GEMM = "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def collective_variants_trace(path: Path, chunk_gap_us: float, overlapped_bytes: float = 1.0) -> Path:
    """A one-GPU Kineto trace in the shape of the matrix, with an all-reduce as the transfer: 4
    `serial_step`s (per layer a matmul, then its all-reduce on the same stream) alternating with 4
    `overlap_step`s (the layer in 4 chunks, each chunk's all-reduce on a side stream beside the next
    chunk's matmul), each chunk's matmul followed by `chunk_gap_us` of launch overhead; the overlapped
    steps' all-reduces carry `overlapped_bytes` times the serial ones' bytes."""
    layers, chunks, gemm_us, comm_us, launch_us, nelems = 4, 4, 400.0, 300.0, 4.0, 1 << 22
    events, corr = [], iter(range(1, 1_000_000))

    def kernel(name, stream, ts, dur, host_ts):
        c = next(corr)
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": host_ts,
                "dur": launch_us,
                "args": {"correlation": c},
            }
        )
        args = {"correlation": c, "device": 0, "stream": stream}
        if name == ALLREDUCE:  # as PyTorch records it: the chunk's elements and dtype
            scale = overlapped_bytes if stream == 20 else 1.0
            args |= {"Collective name": "allreduce", "dtype": "BFloat16",
                     "In msg nelems": int(scale * nelems * dur / comm_us)}  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                       "args": args})  # fmt: skip

    def step(name, start, body):
        end = body(start + 10)
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaDeviceSynchronize",
                "pid": 1,
                "tid": 1,
                "ts": end - 5,
                "dur": 5,
            }
        )
        events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": start,
                       "dur": end + 10 - start})  # fmt: skip
        return end + 50

    def serial(t):
        for _ in range(layers):
            kernel(SERIAL_GEMM, 7, t, gemm_us, t - 5)
            kernel(ALLREDUCE, 7, t + gemm_us, comm_us, t - 1)
            t += gemm_us + comm_us
        return t

    def overlapped(t):
        for _ in range(layers):
            comm_end = t
            for _ in range(chunks):
                kernel(CHUNK_GEMM, 7, t, gemm_us / chunks, t - 5)
                t += gemm_us / chunks
                kernel(ALLREDUCE, 20, t, comm_us / chunks, t - 1)
                comm_end = t + comm_us / chunks
                t += chunk_gap_us
            t = max(t, comm_end)
        return t

    t = 1000.0
    for _ in range(4):
        t = step("serial_step", t, serial)
        t = step("overlap_step", t, overlapped)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def findings_of(path, rules=None):
    with tracekit.open(path) as t:
        return run_rules(t.connection, rules)[0]


@pytest.mark.parametrize(("gap_us", "verdict"), [(0.0, "pays"), (400.0, "loses")])
def test_exposed_comm_reads_the_overlapped_steps_of_the_same_trace(tmp_path, gap_us, verdict):
    path = collective_variants_trace(tmp_path / f"allreduce_{verdict}.json", gap_us)
    (f,) = findings_of(path, ["C001"])
    v = f.extra["variants"]
    assert v["verdict"] == verdict
    assert (v["serial"]["step"], v["overlapped"]["step"]) == ("serial_step", "overlap_step")
    assert v["serial"]["steps"] == v["overlapped"]["steps"] == 4
    serial, overlapped = v["serial"]["mean_ns"], v["overlapped"]["mean_ns"]
    assert (overlapped < serial) == (verdict == "pays")
    text = f.next_experiment
    assert duration(serial) in text and duration(overlapped) in text and "4 steps" in text
    if verdict == "loses":
        assert text.startswith("Do not overlap") and "side stream" not in text and "async_op" not in text
        assert "fewer, larger chunks" in text
    else:
        assert text.startswith("Overlap already pays here") and "Apply `overlap_step`" in text
    assert "--baseline-step 'serial_step' --candidate-step 'overlap_step'" in text


def expected_verdict(cell) -> str:
    if abs(measured_change(cell)) < TIE:
        return "tie"
    return "pays" if cell["overlap_pays"] else "loses"


# the default advice of G004 and C001: move the copies or the collective to a side stream
PROPOSES_OVERLAP = ("side stream", "async_op", "copies overlap compute")


@pytest.mark.parametrize("cell", CELLS, ids=IDS)
def test_no_rule_proposes_overlap_against_the_traces_own_variants(cell):
    findings = findings_of(MATRIX / cell["file"])
    variants = [f for f in findings if "variants" in f.extra]
    if cell["kind"] == "copy":
        # the copies dominate the GPU's time in every copy cell: G004 reports them, with the verdict
        (f,) = [f for f in findings if f.rule == "G004"]
        v = f.extra["variants"]
        assert v["verdict"] == expected_verdict(cell), v
        assert (v["serial"]["step"], v["overlapped"]["step"]) == ("serial_step", "overlap_step")
        assert v["overlapped"]["streams"] > v["serial"]["streams"]
        text = f.next_experiment
        assert duration(v["serial"]["mean_ns"]) in text and duration(v["overlapped"]["mean_ns"]) in text
        assert f"over {v['serial']['steps']} steps" in text and f"over {v['overlapped']['steps']} steps" in text
        opening = {"pays": "Overlap already pays here", "loses": "Do not overlap the copies further",
                   "tie": "Overlap gains nothing measurable here"}[v["verdict"]]  # fmt: skip
        assert text.startswith(opening)
        assert variants == [f]
    else:
        # a second stream's matmul is no transfer and no collective: nothing proposes hiding it
        assert variants == []
    for f in findings:
        if f.rule in ("C001", "G004") and "variants" not in f.extra:
            pytest.fail(f"{f.rule} proposes its default without the trace's variants: {f.next_experiment}")
        if "variants" in f.extra and f.extra["variants"]["verdict"] != "pays":
            assert not any(p in f.next_experiment for p in PROPOSES_OVERLAP), f.next_experiment


def test_steps_that_move_other_bytes_are_no_variant_of_the_serial_ones(tmp_path):
    # the same kernels with 4x the all-reduce bytes (as prefill against decode): other work, so C001
    # keeps its own advice
    path = collective_variants_trace(tmp_path / "other_bytes.json", 0.0, overlapped_bytes=4.0)
    (f,) = findings_of(path, ["C001"])
    assert "variants" not in f.extra
    assert "Overlap already pays" not in f.next_experiment
