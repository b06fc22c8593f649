"""G002 launch-bound on real traces: eager vs CUDA-graph decode on an H200, TP ranks, training traces, quiet inputs."""

from __future__ import annotations

import re

import jsonschema
import pytest

import tracekit.rules.launch_bound as launch_bound
from tracekit.engine.registry import get_rule
from tracekit.findings.model import json_schema
from tracekit.ingest.pipeline import ingest

from .conftest import corpus, evidence, run_rule, sample, trace
from .test_views import kernel, make_run, step

EAGER = "gpu_prefill_decode_eager.json.gz"
TP = ("gpu_tp2_rank0.json.gz", "gpu_tp2_rank1.json.gz")
LEGACY = "kineto__resnet50_num_workers_0__worker0.pt.trace.json.gz"  # ProfilerStep#N is an op, not an annotation
NO_STEPS = "hta__cuda_event_sync_multi_stream__event_sync_trace.json.gz"  # no annotations at all
# Thresholds off: every (step group, device) that launched something is reported.
EVERYTHING = {
    "max_busy_share": 1.01,
    "min_short_share": 0.0,
    "min_short_idle_share": 0.0,
    "min_kernels": 1,
    "min_share": 0.0,
}


def g002(con, cache=True, **params):
    return run_rule(con, "G002", cache, **params)


def steps_of(con, f):
    """The step windows of a finding's group, read straight from the annotations."""
    return con.execute(
        """SELECT ts_ns, end_ns FROM events WHERE run_id = ? AND tid = ? AND kind IN ('user_annotation', 'cpu_op')
           AND regexp_replace(name, '#[0-9]+$', '') = ? ORDER BY ts_ns""",
        [f.locality["run_id"], f.locality["tid"], f.locality["step"]],
    ).fetchall()


def test_rule_is_registered_with_documented_options():
    rule = get_rule("G002")
    assert rule is get_rule("launch-bound") and rule.check is launch_bound.check
    for heading in ("## What it does", "## Why it matters", "## Example", "## Options"):
        assert heading in rule.doc
    options = rule.doc.split("## Options", 1)[1]
    assert set(rule.params) <= set(re.findall(r"`([a-z_]+)`", options))


def test_eager_decode_loop_is_launch_bound_and_fits_a_cuda_graph(eager):
    findings, notes = g002(eager)
    assert notes == []
    decode = [f for f in findings if f.locality["step"] == "decode_step"]
    assert len(decode) == 1
    [f] = decode
    loc = f.locality
    steps = steps_of(eager, f)
    assert f.extra["steps"] == len(steps) > 1
    assert loc["window_ns"] == [steps[0][0], max(e for _, e in steps)]
    assert f.observed.value < f.expected.value, "GPU busy below the threshold share of the step time"
    assert f.extra["shorter_than_launch"] > 0.5 * f.extra["launches"]
    assert f.extra["median_kernel_ns"] < f.extra["median_launch_call_ns"]
    assert f.extra["short_idle_share"] >= 0.5
    assert f.severity == "critical" and f.impact_ns == f.extra["step_ns"] - f.extra["gpu_busy_ns"]
    # Same launches every step, same shapes, no graph yet: suggest capturing it.
    assert f.extra["repeated_body"] and f.extra["static_shapes"] and f.extra["graph_launches_in_run"] == 0
    assert "CUDAGraph" in f.next_experiment and "reduce-overhead" in f.next_experiment
    ops = {r[0] for r in eager.execute("SELECT DISTINCT name FROM cpu_ops").fetchall()}
    top = f.extra["top_ops"]
    assert loc["op"] == top[0]["op"] in ops
    assert [o["launches"] for o in top] == sorted((o["launches"] for o in top), reverse=True)
    assert sum(o["launches"] for o in top) <= f.extra["launches"]
    assert loc["code_path"] and any("decode" in frame for frame in loc["code_path"])
    assert not any(re.search(r"0x[0-9a-f]{6,}", frame) for frame in loc["code_path"]), "addresses leak into the id"
    assert f.sample_event_ids and set(f.sample_event_ids) <= {
        r[0] for r in eager.execute("SELECT runtime_event_id FROM launches").fetchall()
    }


@pytest.mark.parametrize("name", [EAGER, LEGACY])
def test_busy_short_idle_and_short_kernels_match_an_independent_computation(loaded, name):
    con = loaded(trace(name))
    [f] = [f for f in g002(con, **EVERYTHING)[0] if f.locality["step"] in ("decode_step", "ProfilerStep")]
    steps = steps_of(con, f)
    acts = con.execute(
        "SELECT ts_ns, end_ns FROM gpu_activities WHERE run_id = ? AND device = ? ORDER BY ts_ns, end_ns",
        [f.locality["run_id"], f.locality["device"]],
    ).fetchall()
    merged: list[list[int]] = []
    for s, e in acts:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])

    def inside(intervals):
        return sum(max(0, min(e, se) - max(s, ss)) for ss, se in steps for s, e in intervals)

    busy, step_ns = inside(merged), sum(e - s for s, e in steps)
    gap_ns = f.sql_params["short_gap_ns"]
    short = inside([(a[1], b[0]) for a, b in zip(merged, merged[1:]) if b[0] - a[1] <= gap_ns])
    assert f.extra["gpu_busy_ns"] == busy and f.extra["step_ns"] == step_ns
    assert f.observed.value == round(busy / step_ns, 4)
    assert f.extra["short_idle_ns"] == short < step_ns - busy
    launches = con.execute(
        "SELECT launch_ts_ns, gpu_dur_ns, launch_dur_ns FROM launches WHERE run_id = ? AND device = ?",
        [f.locality["run_id"], f.locality["device"]],
    ).fetchall()
    inside = [(g, c) for t, g, c in launches if any(s <= t < e for s, e in steps)]
    assert f.extra["launches"] == len(inside)
    assert f.extra["shorter_than_launch"] == sum(g < c for g, c in inside)


def test_steps_that_replay_a_graph_are_left_to_g003(eager, graph):
    """G002 asks whether an eager step is launch-bound; a step replaying a CUDA graph is G003's question."""
    assert g002(graph, **EVERYTHING)[0] == [], "every decode step replays a graph"
    [e] = [f for f in g002(eager)[0] if f.locality["step"] == "decode_step"]
    assert e.extra["graph_launches_in_run"] == 0 and not any("CUDA graphs" in c for c in e.caveats)


def test_eager_steps_of_a_run_that_replays_graphs_elsewhere():
    #  0         100        200      250
    #  [step----)[step-----)         cudaGraphLaunch: a replay outside the steps
    #   launch     launch
    con = make_run([
        step("step", 0, 100), step("step", 100, 100),
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 20, "corr": 1, "depth": 1},
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 110, "dur": 20, "corr": 2, "depth": 1},
        {"kind": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 250, "dur": 5, "corr": 3},
        kernel("k", 35, 2, corr=1), kernel("k", 135, 2, corr=2), kernel("replayed", 256, 10, corr=3),
    ], end=300)  # fmt: skip
    [f] = g002(con, **EVERYTHING)[0]
    assert (f.locality["step"], f.extra["steps"], f.extra["launches"]) == ("step", 2, 2)
    assert f.extra["graph_launches_in_steps"] == 0 and f.extra["graph_launches_in_run"] == 1
    assert "uses CUDA graphs elsewhere" in f.hypothesis and any("CUDA graphs" in c for c in f.caveats)
    assert "Capture one step in a CUDA graph" not in f.next_experiment
    assert run_rule(con, "G003", **EVERYTHING)[0] == [], "no step replays the graph"


@pytest.mark.parametrize(
    "names", [(EAGER,), TP, (LEGACY,), (NO_STEPS,), ("hta__trace_diff__control.json.gz",)],
    ids=lambda n: n[0].split(".")[0],
)  # fmt: skip
def test_evidence_reproduces_observed_and_invariants(loaded, names):
    con = loaded(*(sample(n) if n.startswith("gpu_") else corpus(n) for n in names))
    findings, _ = g002(con, **EVERYTHING)
    assert findings
    assert len({f.id for f in findings}) == len(findings)
    schema = json_schema()
    for f in findings:
        ev = evidence(con, f)
        assert ev["busy_share"] == f.observed.value
        assert 0 <= ev["busy_ns"] <= ev["step_ns"] and f.observed.value == round(ev["busy_ns"] / ev["step_ns"], 4)
        assert 0 <= ev["short_idle_ns"] <= ev["step_ns"] - ev["busy_ns"] == f.impact_ns
        assert ev["shorter"] <= ev["launches"] and ev["tiny_run"] <= ev["launches"]
        assert ev["launch_bound"] <= ev["shorter"] + ev["tiny_run"]
        assert ev["min_step_launches"] <= ev["launches"] / ev["steps"] <= ev["max_step_launches"]
        assert ev["first_ns"] == f.locality["window_ns"][0] and ev["last_ns"] == f.locality["window_ns"][1]
        # shares are of the run's steady time (`run_steady`), warm-up steps left out
        assert (
            f.window_ns
            == con.execute("SELECT steady_ns FROM run_steady WHERE run_id = ?", [f.locality["run_id"]]).fetchone()[0]
        )
        assert f.locality["op"] is None or not f.locality["op"].startswith("ProfilerStep#")
        jsonschema.validate(f.as_dict(), schema)


def test_old_traces_step_on_profiler_step_ops(loaded):
    con = loaded(trace(LEGACY))
    findings, _ = g002(con, **EVERYTHING)
    steps = con.execute("SELECT count(*) FROM cpu_ops WHERE name LIKE 'ProfilerStep#%'").fetchone()[0]
    [f] = findings
    assert f.locality["step"] == "ProfilerStep" and f.extra["steps"] == steps > 1
    # Idle there is mostly long host gaps (data loading with num_workers=0), not launch overhead: not reported.
    assert f.extra["short_idle_share"] < 0.5 and g002(con)[0] == []


def test_without_annotations_the_whole_run_is_one_step(loaded):
    con = loaded(trace(NO_STEPS))
    [f] = g002(con, **EVERYTHING)[0]
    run = con.execute("SELECT start_ns, end_ns FROM runs").fetchone()
    assert f.locality["step"] == "(whole run)" and f.extra["steps"] == 1
    assert f.locality["window_ns"] == list(run) and f.extra["step_ns"] == run[1] - run[0]
    assert f.extra["launches"] == con.execute("SELECT count(*) FROM launches").fetchone()[0]
    assert any("whole run" in c for c in f.caveats)


def test_thresholds_gate_the_finding(eager):
    [f] = [f for f in g002(eager)[0] if f.locality["step"] == "decode_step"]

    def decode(**p):
        return [g for g in g002(eager, **p)[0] if g.locality["step"] == "decode_step"]

    assert decode(max_busy_share=f.observed.value) == []
    assert decode(min_kernels=f.extra["launches"] + 1) == []
    assert decode(min_short_idle_share=f.extra["short_idle_share"] + 0.01) == []
    assert decode(min_share=f.impact_share + 0.01) == []
    [same] = decode(tiny_kernel_ns=1)
    assert same.id == f.id and same.extra["in_tiny_runs"] == 0 < f.extra["in_tiny_runs"]
    assert same.observed.value == f.observed.value


@pytest.mark.parametrize(
    "name", ["cpu_two_threads.json.gz", "hta__mtia_inference_trace__mtia_inference_rank_0.json.gz"]
)
def test_quiet_without_cuda_launches(loaded, name):
    findings, notes = g002(loaded(trace(name)), **EVERYTHING)
    assert findings == []
    assert notes and "launches" in notes[0].message


def test_ids_and_values_are_stable_across_ingests(eager, fresh_db):
    ingest(fresh_db, [sample(EAGER)])
    first, again = g002(eager, **EVERYTHING)[0], g002(fresh_db, cache=False, **EVERYTHING)[0]
    assert [f.id for f in first] == [f.id for f in again]
    assert [f.observed.value for f in first] == [f.observed.value for f in again]
    assert [f.as_dict()["locality"] for f in first] == [f.as_dict()["locality"] for f in again]


def test_tensor_parallel_ranks_are_analysed_apart(loaded):
    both = loaded(*(sample(n) for n in TP))
    found = g002(both)[0]
    for rank, name in enumerate(TP):
        alone = g002(loaded(sample(name)))[0]
        mine = [f for f in found if f.locality["rank"] == rank]
        assert [(f.id, f.observed.value) for f in mine] == [(f.id, f.observed.value) for f in alone]
    # Rank 1's eager decode steps are launch-bound just like the single-GPU eager trace.
    assert any(f.locality["rank"] == 1 and f.locality["step"] == "decode_step" for f in found)
