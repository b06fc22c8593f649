"""G003 graphed-step-idle: the H200 decode step replayed from a CUDA graph, measured as G002 measures
eager steps; the two rules split the step groups between them."""

from __future__ import annotations

import jsonschema

from tracekit.engine.registry import get_rule
from tracekit.engine.runner import run_rules
from tracekit.findings.model import json_schema

from .conftest import evidence, run_rule
from .test_rule_launch_bound import EVERYTHING


def g003(con, **params):
    return run_rule(con, "G003", **params)


def test_graphed_decode_step_is_measured_and_the_fix_is_not_another_capture(eager, graph):
    assert g003(graph)[0] == [], "busy 63% of the step time: over the default max_busy_share"
    [g] = [f for f in g003(graph, **EVERYTHING)[0] if f.locality["step"] == "decode_step"]
    [e] = [f for f in run_rule(eager, "G002")[0] if f.locality["step"] == "decode_step"]
    assert g.observed.value > e.observed.value, "the graph keeps the GPU busier"
    assert g.extra["step_ns"] < e.extra["step_ns"] and g.extra["launches"] < e.extra["launches"]
    replays = graph.execute(
        """SELECT count(*) FROM runtime_calls r JOIN events s ON s.run_id = r.run_id AND s.kind = 'user_annotation'
           AND s.name = 'decode_step' AND r.ts_ns >= s.ts_ns AND r.ts_ns < s.end_ns WHERE r.name = 'cudaGraphLaunch'
           -- the first replay uploads the graph: a warm-up window, not measured
           AND NOT EXISTS (SELECT 1 FROM run_phases p WHERE p.phase <> 'steady' AND r.ts_ns >= p.start_ns
                           AND r.ts_ns < p.end_ns)"""
    ).fetchone()[0]
    assert g.extra["graph_launches_in_steps"] == replays > 0
    assert "already replays a CUDA graph" in g.hypothesis and "Extend the captured region" in g.next_experiment
    assert "Capture one step in a CUDA graph" not in g.next_experiment
    assert g.confidence < e.confidence and any("CUDA graphs" in c for c in g.caveats)
    assert g.title.startswith("Graph-replaying decode_step") and "G003" in g.acceptance
    ev = evidence(graph, g)
    assert ev["busy_share"] == g.observed.value and ev["graph_launches"] == replays
    assert ev["step_ns"] - ev["busy_ns"] == g.impact_ns
    jsonschema.validate(g.as_dict(), json_schema())


def test_the_documented_example_options_report_it(graph):
    example = get_rule("G003").example
    [f] = g003(graph, **example.params)[0]
    assert f.locality["step"] == "decode_step"
    assert f.observed.value < example.params["max_busy_share"]
    assert f.extra["short_idle_share"] >= example.params["min_short_idle_share"]


def test_g002_and_g003_split_the_step_groups(eager, graph):
    for con in (eager, graph):
        eager_steps = {(f.locality["step"], f.locality["device"]) for f in run_rule(con, "G002", **EVERYTHING)[0]}
        graphed = {(f.locality["step"], f.locality["device"]) for f in g003(con, **EVERYTHING)[0]}
        assert not eager_steps & graphed
        groups = con.execute(
            """SELECT DISTINCT s.name, l.device FROM launches l JOIN step_windows s
               ON s.run_id = l.run_id AND l.launch_ts_ns >= s.start_ns AND l.launch_ts_ns < s.end_ns"""
        ).fetchall()
        assert eager_steps | graphed == set(groups)
    assert g003(eager, **EVERYTHING)[0] == [], "no graph replays in the eager trace"


def test_one_measurement_serves_both_rules_of_an_analysis(graph):
    """G002 and G003 run together take the step measurement once; each finds what it finds alone."""
    together, _ = run_rules(graph, ["G002", "G003"], {code: EVERYTHING for code in ("G002", "G003")})
    alone = [f for code in ("G002", "G003") for f in run_rule(graph, code, **EVERYTHING)[0]]
    assert together and [f.as_dict() for f in together] == [f.as_dict() for f in alone]
