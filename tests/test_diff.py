"""tracekit diff / analyze --baseline: the delta decomposes exactly, noise and acceptance verdicts,
exit codes through the real console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tests.conftest import corpus, sample
from tracekit import db
from tracekit.api import side_labels
from tracekit.compare.diff import bootstrap_ci, parse_accept, render
from tracekit.compare.window_sums import hits_sql
from tracekit.errors import TracekitError
from tracekit.units import duration

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
EAGER = sample("gpu_prefill_decode_eager.json.gz")
GRAPH = sample("gpu_prefill_decode_cudagraph.json.gz")

_DOCS: dict = {}


def run_diff(baseline, candidate, **kw):
    """Both sides in one database, as `tracekit diff` builds it."""
    with tracekit.open(*baseline, labels=side_labels("baseline", baseline)) as base:
        cand = base.add(*candidate, labels=side_labels("candidate", candidate), same_content="keep")
        return cand.diff(base, **kw)


def diff(base, cand, **kw):
    key = (str(base), str(cand), tuple(sorted((k, str(v)) for k, v in kw.items())))
    if key not in _DOCS:
        _DOCS[key] = run_diff([base], [cand], **kw)
    return _DOCS[key]


def hta_pair():
    return corpus("hta__trace_diff__control.json.gz"), corpus("hta__trace_diff__test.json.gz")


def run(*args):
    return subprocess.run([TRACEKIT, *map(str, args)], capture_output=True, text=True, timeout=300)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for frag in fragments:
        assert frag in lines[0]


def _scopes(doc):
    yield "step", doc["delta"]["step"]["delta_ns"], doc["contributors"], doc["unexplained_ns"]
    for name, p in doc["delta"]["phases"].items():
        yield name, p["delta_ns"], p["contributors"], p["unexplained_ns"]


@pytest.mark.parametrize("pair", ["graph", "hta"])
def test_contributors_plus_unexplained_add_up_to_the_delta(pair):
    base, cand = (EAGER, GRAPH) if pair == "graph" else hta_pair()
    doc = diff(base, cand)
    for scope, delta, contributors, unexplained in _scopes(doc):
        total = sum(c["delta_ns"] for c in contributors) + unexplained
        assert abs(total - delta) <= len(contributors) + 1, scope  # each term rounded to 1 ns
        ranked = [abs(c["delta_ns"]) for c in contributors]
        assert ranked == sorted(ranked, reverse=True)
    # with every term listed, nothing stays unexplained: busy + idle is the window time
    full = diff(base, cand, top=100_000)
    assert full["contributors_total"] == len(full["contributors"])
    assert abs(full["unexplained_ns"]) <= len(full["contributors"]) + 1
    step = full["delta"]["step"]
    for side in ("baseline", "candidate"):
        s = step[side]
        assert s["gpu_busy_ns"] + s["gpu_idle_ns"] == pytest.approx(s["time_ns"], abs=2)


def test_self_diff_is_zero_within_noise_and_passes():
    doc = diff(EAGER, EAGER, accept=("step_time <= +0%", "idle == +0ns", "phase:decode <= +1%"))
    assert doc["delta"]["step"]["delta_ns"] == 0
    assert doc["delta"]["end_to_end"]["delta_ns"] == 0
    assert all(p["delta_ns"] == 0 for p in doc["delta"]["phases"].values())
    assert all(c["delta_ns"] == 0 for c in doc["contributors"])
    assert doc["unexplained_ns"] == 0
    assert doc["noise"]["within_noise"] is True
    lo, hi = doc["noise"]["ci95_delta_ns"]
    assert lo <= 0 <= hi
    assert doc["passed"] and all(a["passed"] for a in doc["acceptance"])


def test_cudagraph_decode_speedup_is_idle_time_and_prefill_gpu_work_unchanged():
    doc = diff(EAGER, GRAPH)
    assert doc["steps"]["name"] == "decode_step" and doc["steps"]["baseline"] == doc["steps"]["candidate"] > 1
    decode, prefill = doc["delta"]["phases"]["decode"], doc["delta"]["phases"]["prefill"]
    assert decode["candidate"]["time_ns"] < 0.5 * decode["baseline"]["time_ns"]
    top = doc["contributors"][0]
    assert top["category"] == "idle" and top["cause"] == "host_launch"
    assert sum(c["share"] for c in doc["contributors"] if c["category"] == "idle") > 0.9
    # fewer host launches per step is where the idle went
    assert top["detail"]["candidate"]["runtime_calls"] < top["detail"]["baseline"]["runtime_calls"] / 2
    assert doc["noise"]["within_noise"] is False
    assert doc["noise"]["phases"]["decode"]["within_noise"] is False
    assert doc["noise"]["phases"]["prefill"]["within_noise"] is None  # one prefill per side
    base_busy, cand_busy = prefill["baseline"]["gpu_busy_ns"], prefill["candidate"]["gpu_busy_ns"]
    assert abs(cand_busy - base_busy) < 0.1 * base_busy


def test_hta_pair_profiler_steps_and_a_real_slowdown():
    doc = diff(*hta_pair())
    assert doc["steps"]["source"] == "ProfilerStep#N"
    assert doc["steps"]["baseline"] == len(doc["steps"]["per_step_ns"]["baseline"]) > 1
    assert doc["delta"]["step"]["delta_ns"] > 0
    assert doc["noise"]["within_noise"] is False
    assert doc["baseline"]["runs"][0]["rank"] != doc["candidate"]["runs"][0]["rank"]
    assert {c["category"] for c in doc["contributors"]} & {"kernel", "memcpy"}
    for key in ("kernel_families", "ops", "threads", "streams"):
        assert doc["by"][key]


def test_step_option_and_missing_step():
    doc = diff(EAGER, GRAPH, step="prefill")
    assert doc["steps"]["baseline"] == doc["steps"]["candidate"] == 1
    assert doc["noise"]["within_noise"] is None  # one step per side: no spread
    with pytest.raises(TracekitError, match="no such annotation"):
        run_diff([EAGER], [GRAPH], step="nope")


def test_accept_parsing():
    assert parse_accept("step_time <= +5%") == {
        "expr": "step_time <= +5%", "metric": "step_time", "op": "<=", "threshold": 5.0, "mode": "relative"
    }  # fmt: skip
    assert parse_accept("idle < -2ms")["threshold"] == -2e6
    assert parse_accept("idle < -2ms")["mode"] == "absolute_change"
    assert parse_accept("gpu_util >= 0.5")["mode"] == "value"
    assert parse_accept("step_p50 < 2ms")["metric"] == "step_p50"
    assert parse_accept("kernel:gemm<=1.5us")["threshold"] == 1500
    for bad in ("step_time", "speed <= 5%", "step_time ~ 5%", "kernel <= 5%", "step_time <= 5 parsecs"):
        with pytest.raises(TracekitError):
            parse_accept(bad)


def test_acceptance_verdicts_measure_the_metric():
    doc = diff(
        EAGER, GRAPH, accept=("step_time <= -50%", "step_time > +0%", "launches >= 1", "kernel:elementwise < +50%")
    )
    verdicts = {a["expr"]: a for a in doc["acceptance"]}
    assert verdicts["step_time <= -50%"]["passed"] is True
    assert verdicts["step_time > +0%"]["passed"] is False
    assert verdicts["step_time <= -50%"]["delta_pct"] == doc["delta"]["step"]["delta_pct"]
    assert verdicts["launches >= 1"]["passed"] is True
    assert verdicts["kernel:elementwise < +50%"]["baseline"] > 0
    assert doc["passed"] is False


def test_bootstrap_is_deterministic_and_brackets_the_delta():
    a, b = [100, 110, 90, 105, 95], [200, 210, 190, 205, 195]
    ci = bootstrap_ci(a, b)
    assert ci == bootstrap_ci(a, b)
    assert ci[0] <= 100 <= ci[1] and ci[0] > 0
    assert bootstrap_ci([1], b) is None


def test_cli_exit_codes_and_json_document(tmp_path):
    ok = run("diff", EAGER, EAGER, "--accept", "step_time <= +5%", "-f", "json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    for key in ("schema_version", "baseline", "candidate", "steps", "delta", "contributors", "unexplained_ns",
                "acceptance", "noise"):  # fmt: skip
        assert key in doc
    assert set(doc["acceptance"][0]) >= {"expr", "metric", "baseline", "candidate", "delta", "delta_pct", "passed"}
    fail = run("diff", "-b", EAGER, "-c", GRAPH, "--accept", "step_time >= +5%")
    assert fail.returncode == 1 and "FAIL" in fail.stdout
    md = run("diff", EAGER, GRAPH, "-f", "markdown")
    assert md.returncode == 0 and md.stdout.startswith("# tracekit diff")
    assert_one_line_error(run("diff", EAGER), "BASELINE CANDIDATE")
    assert_one_line_error(run("diff", EAGER, GRAPH, EAGER), "2 traces")
    assert_one_line_error(run("diff", EAGER, GRAPH, "--accept", "step_time <= fast"), "--accept")
    assert_one_line_error(run("diff", EAGER, GRAPH, "--accept", "phase:nope <= +1%"), "phase")
    assert_one_line_error(run("diff", EAGER, GRAPH, "--step", "nope"), "nope")
    assert_one_line_error(run("diff", EAGER, tmp_path / "missing.json.gz"), "missing.json.gz")
    assert_one_line_error(run("diff", EAGER, "-c", GRAPH), "not both")


def test_analyze_with_baseline():
    doc = json.loads(run("analyze", GRAPH, "--baseline", EAGER, "-f", "json").stdout)
    assert doc["findings"] is not None and doc["diff"]["delta"]["step"]["delta_ns"] < 0
    assert [r["label"] for r in doc["runs"]] == ["gpu_prefill_decode_cudagraph"]  # the rules see the candidate only
    failing = run("analyze", GRAPH, "--baseline", EAGER, "--accept", "step_time >= +0%")
    assert failing.returncode == 1 and "Acceptance" in failing.stdout
    assert run("analyze", GRAPH, "--baseline", EAGER, "--accept", "step_time <= +0%").returncode == 0
    assert_one_line_error(run("analyze", GRAPH, "--accept", "step_time <= +0%"), "--baseline")


def test_help_lists_every_metric():
    from tracekit.cli.options import ACCEPT_HELP
    from tracekit.compare.diff import METRICS

    for metric in METRICS:
        assert metric.split(":")[0] in ACCEPT_HELP


def test_text_and_markdown_print_durations_by_magnitude():
    doc = diff(EAGER, GRAPH)
    step = doc["delta"]["step"]
    assert step["candidate"]["time_ns"] < 1e6 < step["baseline"]["time_ns"]
    for out in (render(doc, "text"), render(doc, "markdown")):
        assert duration(step["baseline"]["time_ns"]).endswith(" ms") and duration(step["baseline"]["time_ns"]) in out
        assert duration(step["candidate"]["time_ns"]).endswith(" us") and duration(step["candidate"]["time_ns"]) in out
        assert duration(step["delta_ns"]) in out  # negative deltas keep their sign


def test_window_hits_match_a_range_join():
    # windows of two sides: disjoint, overlapping, nested and empty ones; intervals spanning window edges
    # and several windows, covering a whole window, zero-length, touching an edge, on another device
    windows = [("baseline", 1, 0, 10, 50), ("baseline", 1, 0, 40, 90), ("baseline", 1, 0, 42, 44), ("baseline", 1, 0, 95, 95),
               ("baseline", 1, 0, 100, 120), ("candidate", 2, 0, 0, 30), ("candidate", 2, 0, 60, 61)]  # fmt: skip
    intervals = [(1, 0, 0, 15), (1, 0, 20, 20), (1, 0, 45, 100), (1, 0, 50, 60), (1, 1, 10, 90), (1, 0, 0, 200),
                 (1, 0, 95, 96), (2, 0, 5, 70), (2, 0, 30, 40), (2, 0, 29, 29), (2, 0, 61, 62), (2, 0, 60, 60)]  # fmt: skip
    con = db.connect(None)
    con.execute("CREATE TEMP TABLE diff_windows (side VARCHAR, run_id INTEGER, device INTEGER, grp VARCHAR, idx INTEGER, "
                "ts_ns BIGINT, end_ns BIGINT)")  # fmt: skip
    con.executemany("INSERT INTO diff_windows VALUES (?, ?, ?, 'g', 0, ?, ?)", windows)
    con.execute("CREATE TEMP TABLE iv (id INTEGER, run_id INTEGER, device INTEGER, ts_ns BIGINT, end_ns BIGINT)")
    con.executemany("INSERT INTO iv VALUES (?, ?, ?, ?, ?)", [(i, *iv) for i, iv in enumerate(intervals)])
    for on_device in (True, False):
        for starts_only in (False, True):
            expected = sorted(
                (i, side, min(end, hi) - max(ts, lo))
                for side, run, dev, lo, hi in windows
                for i, (r, d, ts, end) in enumerate(intervals)
                if r == run and (d == dev or not on_device)
                and ((lo <= ts < hi) if starts_only else (ts < hi and end > lo))
            )  # fmt: skip
            got = con.execute(hits_sql("SELECT * FROM iv", on_device, starts_only), {"grp": "g"}).fetchall()
            assert sorted(got) == expected, (on_device, starts_only)


# ------------------------------------------------------------------------ units of work, comparability

RESNET = "kineto__resnet50_num_workers_0__worker0.pt.trace.json.gz"


def test_a_different_workload_is_not_comparable():
    # ResNet-50 training (V100, ProfilerStep) against LLM decode (H200, decode_step): no common unit
    doc = diff(corpus(RESNET), EAGER, accept=("step_time <= +5%",))
    steps = doc["steps"]
    assert steps["comparable"] is False and "no unit of work" in steps["comparability"]
    assert doc["noise"]["within_noise"] is None and doc["noise"]["reason"].startswith("not comparable")
    assert doc["acceptance"][0]["verdict"] == "not comparable" and doc["passed"] is False
    assert "NOT COMPARABLE" in render(doc, "text") and "N/A" in render(doc, "text")


def test_units_of_different_work_are_not_comparable():
    # AlexNet against ResNet-50, both CNN training on one GPU: a unit is found, but the work in it differs
    alexnet = corpus("hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz")
    doc = diff(alexnet, corpus("kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"))
    assert doc["steps"]["comparable"] is False


def test_captures_without_step_markers_compare_per_repeated_kernel_sequence():
    # two ResNet-50 tb_plugin samples; the autograd-API one has no ProfilerStep: the unit is a kernel
    # launched once per iteration, the same on both sides
    base = corpus("kineto__resnet50_autograd_api_num_workers_4__worker0.pt.trace.json.gz")
    cand = corpus("kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    doc = diff(base, cand)
    steps = doc["steps"]
    assert steps["source"] == "repeated kernel sequence" and steps["comparable"] is True
    assert steps["baseline"] >= 3 and steps["candidate"] >= 3
    assert steps["work_overlap"] > 0.5
    with tracekit.open(base) as t:
        launches = t.sql("SELECT count(*) FROM kernels WHERE name = $name", name=steps["anchor_kernel"]).fetchall()[0][
            0
        ]
    assert launches == steps["baseline"] + 1  # one window from each launch to the next
    per_step = doc["delta"]["step"]["baseline"]["time_ns"]
    assert per_step < doc["delta"]["end_to_end"]["baseline"]["time_ns"] / 3


def test_warm_up_steps_are_left_out():
    doc = diff(sample("volatile_ids_run1.json.gz"), sample("volatile_ids_run2.json.gz"))
    steps = doc["steps"]
    assert steps["left_out"] == {"baseline": {"warm-up": 1}}
    assert steps["baseline"] == 5 and steps["candidate"] == 6
    # without the cold first step, one workload runs at one speed
    assert doc["noise"]["within_noise"] is True
    assert abs(doc["delta"]["step"]["delta_pct"]) < 10


def test_statuses_compare_cost_per_unit_of_work():
    with tracekit.open(EAGER) as base, tracekit.open(GRAPH) as cand:
        status = cand.status(base)
        units = cand.diff(base)["noise"]["units_per_run"]
    assert units == {"baseline": 32, "candidate": 32}
    g001 = next(e for e in status["findings"] if e["rule"] == "G001")
    b, c = g001["baseline"], g001["candidate"]
    assert b["per_unit_ns"] == round(b["time_ns"] / 32) and c["per_unit_ns"] == round(c["time_ns"] / 32)
    assert c["per_unit_ns"] < 0.1 * b["per_unit_ns"]
    assert g001["status"] == "improved" and g001["trend"] == "better"  # -95% is not "unchanged"


def test_one_run_sides_match_a_finding_across_ranks():
    # HTA's pair: rank 3 of one job against rank 1 of another; C001 on NCCL stream 21 vs 15
    with tracekit.open(hta_pair()[0]) as base, tracekit.open(hta_pair()[1]) as cand:
        status = cand.status(base)
    c001 = [e for e in status["findings"] if e["rule"] == "C001"]
    assert len(c001) == 1 and c001[0]["baseline_finding_id"] != c001[0]["finding_id"]
    assert c001[0]["status"] in ("unchanged", "improved", "regressed")


def test_ranks_on_one_side_only_are_left_out():
    tp2 = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]
    doc = run_diff(tp2, tp2[:1])
    assert doc["steps"]["comparable"] is True and "ranks [1]" in doc["steps"]["comparability"]
    assert [r["rank"] for r in doc["baseline"]["runs"]] == [0]
