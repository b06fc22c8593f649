"""K002 repeated-launches: the project's H200 rotary-cache pair (a custom op rebuilding the same
cos/sin table 4x per call through aten ops that each launch once, and its twin building it once),
then minimal synthetic Kineto traces: a custom op launching one kernel N times per call, every step,
next to its healthy twin, CUDA-graph replays, a _foreach op, a warm-up search, launches that differ
in grid, and custom-op bodies whose inner calls differ in shapes or scalar arguments, compiled
regions and framework ops, which repeat kernels over different data."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.conftest import CORPUS, ROOT, SAMPLES, evidence, run_rule, sample
from tracekit import db
from tracekit.engine.registry import get_rule
from tracekit.engine.severity import by_share
from tracekit.findings.model import json_schema
from tracekit.ingest.pipeline import ingest

KINETO_FILES = sorted(p.name for p in CORPUS.glob("*.json*")) if CORPUS.exists() else []

OP = "mylib::rope_cache"
KERNEL = "rope_table_kernel(float*, int)"
SHAPES = [[4096, 64]]


class TraceBuilder:
    """Kineto events: one host thread (pid 100, tid 100), one GPU stream (device 0, stream 7)."""

    def __init__(self):
        self.events = [
            {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "MainThread"}},
        ]
        self.ext = 1000
        self.corr = 1
        self.gpu_t = 0.0

    def _kernel(self, name, corr, ext, ts, dur, grid, block):
        self.gpu_t = max(self.gpu_t, ts + 5)
        self.events.append(
            {
                "ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": self.gpu_t, "dur": dur,
                "args": {
                    "device": 0, "stream": 7, "correlation": corr, "External id": ext, "grid": grid,
                    "block": block, "shared memory": 0, "registers per thread": 32,
                },
            }
        )  # fmt: skip
        self.gpu_t += dur + 1

    def op(self, ts, name, launches, kernel=KERNEL, dur=100.0, grids=None, shapes=SHAPES, graph=False, driver=False):
        """A cpu_op at ts (us) whose body launches `launches` kernels (one cudaGraphLaunch replaying
        them all when graph is set; each cudaLaunchKernel with the cuLaunchKernel inside it, carrying
        the same correlation, when driver is set); returns the op's end."""
        self.ext += 1
        ext = self.ext
        calls = 1 if graph else launches
        end = ts + 10 + calls * 10
        self.events.append(
            {
                "ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": end - ts,
                "args": {"External id": ext, "Input Dims": shapes, "Input type": ["float"] * len(shapes)},
            }
        )  # fmt: skip
        for i in range(calls):
            corr = self.corr
            self.corr += 1
            call_ts = ts + 5 + i * 10
            self.events.append(
                {
                    "ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch" if graph else "cudaLaunchKernel",
                    "pid": 100, "tid": 100, "ts": call_ts, "dur": 5, "args": {"correlation": corr, "External id": ext},
                }
            )  # fmt: skip
            if driver:
                self.events.append(
                    {
                        "ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 100, "tid": 100,
                        "ts": call_ts + 1, "dur": 3, "args": {"correlation": corr, "External id": ext},
                    }
                )  # fmt: skip
            for j in range(launches if graph else 1):
                grid = (grids or [[64, 1, 1]] * launches)[j if graph else i]
                self._kernel(kernel, corr, ext, call_ts + 6, dur, grid, [256, 1, 1])
        return end

    def call(self, ts, name, shapes=SHAPES, scalars=None, kernel=None, grid=(64, 1, 1), children=()):
        """A cpu_op at ts (us) with its child calls (each a dict of this method's arguments) one after
        another inside it, launching `kernel` once when given (as an aten op does); returns its end."""
        self.ext += 1
        ext = self.ext
        args = {"External id": ext, "Input Dims": shapes, "Input type": ["float"] * len(shapes),
                "Input Strides": [[1] * len(dims) for dims in shapes],
                "Concrete Inputs": scalars or [""] * len(shapes)}  # fmt: skip
        event = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": ts, "args": args}
        self.events.append(event)
        t = ts + 2
        for child in children:
            t = self.call(t, **child) + 2
        if kernel:
            corr = self.corr
            self.corr += 1
            self.events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": t,
                 "dur": 5, "args": {"correlation": corr, "External id": ext}}
            )  # fmt: skip
            self._kernel(kernel, corr, ext, t + 6, 3.0, list(grid), [128, 1, 1])
            t += 7
        event["dur"] = t - ts
        return t

    def write(self, path):
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": self.events}))
        return path


def build(tmp_path, name, repeats=4, steps=6, extra=None):
    """`steps` steps, each calling OP once with `repeats` identical launches, then `extra(b, t, step)`."""
    b = TraceBuilder()
    t = 0.0
    for step in range(steps):
        start = t
        t = b.op(t, OP, repeats) + 20
        if extra:
            t = extra(b, t, step) + 20
        b.events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 100, "tid": 100,
             "ts": start - 1, "dur": t - start + 2, "args": {}}
        )  # fmt: skip
        t = max(t, b.gpu_t) + 50
    return b.write(tmp_path / f"{name}.json")


def load(path):
    con = db.connect(None)
    ingest(con, [path])
    return con


def k002(con, **params):
    return run_rule(con, "K002", cache=False, **params)


def test_repeated_launches_in_one_op_call_are_found(tmp_path):
    con = load(build(tmp_path, "repeat", repeats=4))
    found, notes = k002(con)
    assert notes == []
    assert len(found) == 1
    f = found[0]
    assert f.rule == "K002"
    assert f.locality["op"] == OP
    assert f.locality["kernel"] == KERNEL
    assert json.loads(f.locality["input_shapes"]) == SHAPES
    assert f.locality["launch"]["grid"] == "[64,1,1]" and f.locality["launch"]["block"] == "[256,1,1]"
    assert f.locality["thread_name"] == "MainThread" and f.locality["stream"] == 7
    row = evidence(con, f)
    # the evidence query recomputes the observed repeat time exactly
    assert row["repeat_ns"] == f.observed.value == f.impact_ns
    steps, per_call = row["occurrences_with_repeats"], row["launches"] // row["occurrences_with_repeats"]
    assert per_call == 4 and row["repeated_launches"] == steps * (per_call - 1)
    # all but one copy: with equal kernels the repeats are (n-1)/n of the op's GPU time
    assert f.extra["repeat_share_of_op_gpu_time"] == pytest.approx((per_call - 1) / per_call, abs=1e-3)
    kernel_ns = con.execute("SELECT sum(dur_ns) FROM kernels WHERE name = ?", [KERNEL]).fetchone()[0]
    assert 0 < f.observed.value < kernel_ns == row["op_gpu_ns"]
    assert 0 < f.impact_share < 1
    sample_ids = {r[0] for r in con.execute("SELECT event_id FROM kernels WHERE name = ?", [KERNEL]).fetchall()}
    assert set(f.sample_event_ids) <= sample_ids and len(f.sample_event_ids) == per_call
    jsonschema.validate(f.as_dict(), json_schema())
    # a longer run of the same code keeps the finding's id (no timings in it)
    found_longer, _ = k002(load(build(tmp_path, "repeat_longer", repeats=4, steps=9)))
    assert [g.id for g in found_longer] == [f.id]


def test_healthy_twin_with_one_launch_per_call_is_quiet(tmp_path):
    con = load(build(tmp_path, "healthy", repeats=1))
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
    assert k002(con, min_share=0.0, min_occurrences=1, min_occurrence_share=0.0)[0] == []


def test_a_kernel_recorded_with_its_runtime_and_driver_call_launches_once(tmp_path):
    # CUPTI can record both the runtime call and the driver call under it with one correlation id
    b = TraceBuilder()
    t = 0.0
    for _ in range(6):
        t = b.op(t, OP, 1, driver=True) + 50
    con = load(b.write(tmp_path / "driver.json"))
    assert con.execute("SELECT count(*) FROM launches").fetchone()[0] == 2 * 6
    assert k002(con, min_share=0.0, min_occurrences=1, min_occurrence_share=0.0)[0] == []


def test_fixed_trace_evidence_drops_to_zero(tmp_path):
    before = load(build(tmp_path, "before", repeats=3))
    (f,) = k002(before)[0]
    after = load(build(tmp_path, "after", repeats=1))
    row = evidence(after, f)
    assert row["repeated_launches"] == 0 and row["repeat_ns"] == 0


def _graph_replay(b, t, step):
    return b.op(t, "mylib::decode_graph", 6, kernel="graph_body_kernel", graph=True)


def _foreach(b, t, step):
    return b.op(t, "aten::_foreach_mul_", 5, kernel="vectorized_elementwise_kernel<4, MulFunctor<float>>")


def _warmup_search(b, t, step):
    # cuDNN benchmark / Triton autotune style: the kernel repeats only the first time the shape is seen
    return b.op(t, "mylib::autotuned_gemm", 8 if step == 0 else 1, kernel="gemm_kernel_cfg3", dur=400.0)


def _different_grids(b, t, step):
    grids = [[64, 1, 1], [32, 1, 1], [16, 1, 1], [8, 1, 1]]
    return b.op(t, "mylib::pyramid", 4, kernel="downsample_kernel", grids=grids)


@pytest.mark.parametrize("extra", [_graph_replay, _foreach, _warmup_search, _different_grids])
def test_legitimate_repeats_are_quiet(tmp_path, extra):
    con = load(build(tmp_path, extra.__name__, repeats=1, extra=extra))
    other = con.execute("SELECT count(*) FROM kernels WHERE name <> ?", [KERNEL]).fetchone()[0]
    assert other >= 5
    assert k002(con, min_share=0.0)[0] == []


def test_foreach_is_exempt_only_through_skip_ops(tmp_path):
    con = load(build(tmp_path, "foreach", repeats=1, extra=_foreach))
    found, _ = k002(con, min_share=0.0, skip_ops="")
    assert [f.locality["op"] for f in found] == ["aten::_foreach_mul_"]


def test_thresholds_are_respected(tmp_path):
    con = load(build(tmp_path, "thresholds", repeats=4, steps=6))
    (f,) = k002(con)[0]
    steps = evidence(con, f)["occurrences_with_repeats"]
    assert k002(con, min_occurrences=steps + 1)[0] == []
    # the floor is a share of the run's kernel time, not of its window
    gpu_share = f.impact_ns / con.execute("SELECT sum(dur_ns) FROM kernels").fetchone()[0]
    assert gpu_share > f.impact_share
    assert k002(con, min_share=gpu_share + 0.01)[0] == []
    assert len(k002(con, min_share=gpu_share - 0.01)[0]) == 1
    assert k002(con, skip_kernels="rope_table")[0] == []


QUIET_SAMPLES = sorted(p.name for p in SAMPLES.glob("*.json.gz") if p.name != "repeated_rope_cache.json.gz")


@pytest.mark.parametrize("name", QUIET_SAMPLES)
def test_quiet_on_the_other_samples(name, loaded):
    # eager and CUDA-graph decode, TP=2, GIL, transfer and warm-up runs: nothing repeats inside one call
    found, notes = run_rule(loaded(sample(name)), "K002")
    assert found == [] and all("failed" not in n.message for n in notes)


@pytest.mark.parametrize("name", KINETO_FILES)
def test_no_crash_and_quiet_on_corpus(name, loaded):
    found, notes = run_rule(loaded(CORPUS / name), "K002")
    # the corpus's repeats are radix-sort passes, per-tensor layout transforms and cuDNN benchmark searches
    assert found == []
    assert all("failed" not in n.message for n in notes)


ROPE_OP = "mylib::rope_cache_r4"
# the loop body of scripts/make_repeated_launch_trace.py: positions.float(), torch.outer, cos, sin, cat
ROPE_BODY = {"aten::copy_", "aten::mul", "aten::cos", "aten::sin", "aten::cat"}


def test_custom_op_rebuilding_its_table_through_aten_ops_is_found_on_the_h200_sample(loaded):
    con = loaded(sample("repeated_rope_cache.json.gz"))
    found, notes = run_rule(con, "K002")
    assert notes == []
    (f,) = found
    assert f.locality["op"] == ROPE_OP and f.locality["input_shapes"] == "[[2048],[64]]"
    sites = f.extra["sites"]
    # each aten op of the body launches once per iteration: the repeat shows only at the custom op's call
    assert {s["inner_op"] for s in sites} == ROPE_BODY
    assert f.extra["copies_per_call"] == 4 and all(s["copies_per_call"] == 4 for s in sites)
    assert f.extra["occurrences_with_repeats"] == f.extra["occurrences_of_op_with_these_shapes"] == 8
    top = sites[0]
    assert f.locality["kernel"] == top["kernel"] and f.locality["launch"]["grid"] == top["grid"]
    assert top["repeat_ns"] == max(s["repeat_ns"] for s in sites)
    assert f.extra["repeated_launches"] == len(ROPE_BODY) * 3 * 8
    for name in (ROPE_OP, "4x per call", top["grid"]):
        assert name in f.title + f.observed.what
    assert "cache" in f.next_experiment and "hoist" in f.next_experiment
    # all but the longest of four near-equal copies: at most three quarters of the op's GPU time
    assert 0.5 < f.extra["repeat_share_of_op_gpu_time"] <= 0.75
    assert f.severity == by_share(f.impact_share, get_rule("K002").resolve_params())
    row = evidence(con, f)
    assert row["repeat_ns"] == f.observed.value == f.impact_ns
    assert row["repeated_launches"] == f.extra["repeated_launches"] and row["max_launches_per_call"] == 4
    jsonschema.validate(f.as_dict(), json_schema())


def test_the_h200_twin_building_its_table_once_is_quiet(loaded):
    con = loaded(sample("single_rope_cache.json.gz"))
    ops = con.execute("SELECT count(*) FROM cpu_ops WHERE name = 'mylib::rope_cache_r1'").fetchone()[0]
    assert ops == 8
    assert run_rule(con, "K002", min_share=0.0, min_occurrences=1, min_occurrence_share=0.0)[0] == []


def _aten(name, shapes, kernel, grid=(64, 1, 1), scalars=None):
    return {"name": name, "shapes": shapes, "kernel": kernel, "grid": grid, "scalars": scalars}


TABLE_BODY = [
    _aten("aten::mul", [[2048, 1], [64]], "elementwise_kernel<mul>", (512, 1, 1)),
    _aten("aten::cos", [[2048, 64]], "elementwise_kernel<cos>"),
]


def build_calls(tmp_path, name, body, op=OP, repeats=4, steps=6, outer=None):
    """`steps` steps, each one call of `op` running `body(i)` for i in range(repeats), under the call
    `outer` when given (a compiled region, an autograd node)."""
    b = TraceBuilder()
    t = 0.0
    for _ in range(steps):
        call = {"name": op, "shapes": SHAPES, "children": [c for i in range(repeats) for c in body(i)]}
        if outer:
            call = {"name": outer, "shapes": [], "children": [call]}
        t = b.call(t, **call) + 50
        t = max(t, b.gpu_t) + 50
    return load(b.write(tmp_path / f"{name}.json"))


def test_a_table_rebuilt_in_a_custom_op_is_found_under_a_compiled_region(tmp_path):
    con = build_calls(tmp_path, "table", lambda i: TABLE_BODY, outer="CompiledFunction")
    (f,) = k002(con, min_share=0.0)[0]
    assert f.locality["op"] == OP and f.extra["copies_per_call"] == 4
    assert {s["inner_op"] for s in f.extra["sites"]} == {"aten::mul", "aten::cos"}
    assert evidence(con, f)["repeat_ns"] == f.observed.value


def _per_group_slice(i):
    # out[g] = table(x[g]): the loop index reaches aten::select, so each iteration reads another slice
    return [{"name": "aten::select", "shapes": [[4, 2048], [], []], "scalars": ["", "0", str(i)]}, *TABLE_BODY]


def _growing_shapes(i):
    return [_aten("aten::cos", [[2048 >> i, 64]], "elementwise_kernel<cos>")]


def _permuted_shapes(i):
    # the same kernel, grid and element count on inputs of other shapes
    shapes = [[2048, 8, 8], [8, 2048, 8], [8, 8, 2048], [64, 32, 64]]
    return [_aten("aten::cos", [shapes[i]], "elementwise_kernel<cos>")]


def _scalar_argument(i):
    return [_aten("aten::pow", [[2048, 64], []], "elementwise_kernel<pow>", scalars=["", str(i + 1)])]


@pytest.mark.parametrize("body", [_per_group_slice, _growing_shapes, _permuted_shapes, _scalar_argument])
def test_custom_op_bodies_over_different_inputs_are_quiet(tmp_path, body):
    con = build_calls(tmp_path, body.__name__, body)
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] >= 4 * 6
    assert k002(con, min_share=0.0, min_occurrences=1, min_occurrence_share=0.0)[0] == []


def test_the_same_kernel_once_in_each_of_several_custom_op_calls_is_quiet(tmp_path):
    con = build_calls(tmp_path, "per_call", lambda i: TABLE_BODY, repeats=1, steps=12)
    assert k002(con, min_share=0.0, min_occurrences=1, min_occurrence_share=0.0)[0] == []


def test_compiled_layers_each_under_their_kernels_op_are_quiet(tmp_path):
    # inductor output code: one op per Triton kernel launch, the same kernel once per layer
    def layer(i):
        return [_aten("triton_poi_fused_add_mul_0", [[64, 4096]], "triton_poi_fused_add_mul_0")]

    con = build_calls(tmp_path, "compiled", layer, op="CompiledFunction", repeats=8, outer="Torch-Compiled Region: 0/0")
    assert k002(con, min_share=0.0, min_occurrences=1, min_occurrence_share=0.0)[0] == []


def test_framework_ops_do_not_scope_the_calls_they_make(tmp_path):
    # aten::lstm without cuDNN loops over time steps: one aten::addmm per step on a different step's input
    def step(i):
        return [_aten("aten::addmm", [[256], [64, 128], [128, 256]], "gemm_kernel")]

    con = build_calls(tmp_path, "lstm", step, op="aten::lstm", repeats=16)
    assert k002(con, min_share=0.0)[0] == []
    (f,) = k002(con, min_share=0.0, framework_namespaces="prims")[0]
    assert f.locality["op"] == "aten::lstm" and f.extra["copies_per_call"] == 16


MATRIX = ROOT / "tests" / "data" / "launch_matrix"
MATRIX_CELLS = json.loads((MATRIX / "cells.json").read_text())["cells"]


@pytest.mark.parametrize("cell", MATRIX_CELLS, ids=[c["file"] for c in MATRIX_CELLS])
def test_matrix_verdicts(cell, loaded):
    """Every cell of the H200 matrix (scripts/make_repeated_launch_matrix.py): the rebuilt table is
    reported with its copies per call, eager or compiled, with or without record_shapes; tables over
    other positions (offsets, select, chunks) and per-layer repeats are quiet at any share."""
    con = loaded(MATRIX / cell["file"])
    if cell["expected"] == "quiet":
        assert k002(con, min_share=0.0, min_occurrences=1, min_occurrence_share=0.0)[0] == []
        return
    found, notes = run_rule(con, "K002")
    assert notes == []
    (f,) = found
    assert f.locality["op"] == cell["op"] and f.extra["copies_per_call"] == cell["copies_per_call"]
    assert {s["inner_op"] for s in f.extra["sites"]} == ROPE_BODY
    # one call per step, compiled too: Inductor merges the layers' equal calls of the functional op
    assert f.extra["occurrences_with_repeats"] == f.extra["occurrences_of_op_with_these_shapes"] == 8
    assert f.severity == by_share(f.impact_share, get_rule("K002").resolve_params())
    assert (f.locality["input_shapes"] is None) == (not cell["record_shapes"])
    assert f.confidence < 0.5 if not cell["record_shapes"] else f.confidence >= 0.5
    assert evidence(con, f)["repeat_ns"] == f.observed.value
