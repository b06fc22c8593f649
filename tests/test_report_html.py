"""tracekit report: the page is self-contained, its figures agree with direct SQL, large traces stay bounded."""

from __future__ import annotations

import bisect
import html
import re

import pytest
from click.testing import CliRunner

from tracekit.cli.app import cli
from tracekit.engine.runner import run_rules
from tracekit.findings.report import build_report
from tracekit.findings.time_summary import top_costs
from tracekit.render import html as html_report
from tracekit.render import timeline

from .conftest import corpus, sample, union_within

EAGER = sample("gpu_prefill_decode_eager.json.gz")
GRAPH = sample("gpu_prefill_decode_cudagraph.json.gz")
TP2 = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]


def _report(con):
    findings, notes = run_rules(con)
    return build_report(con, findings, notes, top_costs(con), max_findings=len(findings))


def _outside_scripts(page: str) -> str:
    return re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S | re.I)


# ------------------------------------------------------------------------------------------- timeline


@pytest.mark.parametrize("name", ["eager", "df_index_resolver"])
def test_timeline_blocks_cover_every_slice_and_stay_bounded(loaded, name):
    path = EAGER if name == "eager" else corpus("hta__df_index_resolver.json.gz")
    con = loaded(path)
    lo, hi = con.execute("SELECT start_ns, end_ns FROM runs").fetchone()
    t = timeline.build(con, 1, lo, hi, max_blocks=300)
    assert t.blocks <= 300
    raw = con.execute(
        "SELECT device::VARCHAR || '/' || stream::VARCHAR, ts_ns, end_ns FROM gpu_activities WHERE run_id = 1 AND dur_ns > 0"
    ).fetchall()
    by_lane: dict[str, list] = {}
    for lane, s, e in raw:
        by_lane.setdefault(lane, []).append((s, e))
    gpu = {lane.key: lane for lane in t.lanes if lane.kind == "gpu"}
    assert set(gpu) == set(by_lane)
    for key, intervals in by_lane.items():
        blocks = gpu[key].blocks
        assert gpu[key].slices == len(intervals)
        starts = [b.start_ns for b in blocks]
        assert starts == sorted(starts)
        assert all(a.end_ns + t.gap_ns < b.start_ns for a, b in zip(blocks, blocks[1:]))  # merged: gaps > threshold
        for s, e in intervals:  # every slice lies inside one block
            b = blocks[bisect.bisect_right(starts, s) - 1]
            assert b.start_ns <= s and e <= b.end_ns
        # a block is busy at least as long as its slices' union, and its slices add up
        assert sum(b.slices for b in blocks) == len(intervals)
        assert sum(b.end_ns - b.start_ns for b in blocks) >= union_within(intervals, lo, hi)


def test_timeline_clips_to_a_window(eager):
    lo, hi = eager.execute("SELECT start_ns, end_ns FROM runs").fetchone()
    a, b = lo + (hi - lo) // 3, lo + (hi - lo) // 3 + 2_000_000
    t = timeline.build(eager, 1, a, b)
    expected = eager.execute(
        "SELECT count(*) FROM gpu_activities WHERE run_id = 1 AND dur_ns > 0 AND ts_ns < ? AND end_ns > ?", [b, a]
    ).fetchone()[0]
    assert sum(lane.slices for lane in t.lanes if lane.kind == "gpu") == expected
    assert all(a <= blk.start_ns and blk.end_ns <= b for lane in t.lanes for blk in lane.blocks)


# -------------------------------------------------------------------------------------- step breakdown


def test_step_breakdown_matches_an_independent_union(eager):
    step, steps = html_report.step_breakdown(eager, [1])
    assert step["name"]
    windows = eager.execute(
        "SELECT ts_ns, end_ns FROM events WHERE run_id = 1 AND kind IN ('user_annotation', 'cpu_op') "
        "AND regexp_replace(name, '#[0-9]+$', '') = ? AND dur_ns > 0 GROUP BY ALL ORDER BY 1",
        [step["name"]],
    ).fetchall()
    device = eager.execute("SELECT device FROM gpu_busy GROUP BY 1 ORDER BY sum(dur_ns) DESC LIMIT 1").fetchone()[0]
    acts = eager.execute(
        "SELECT ts_ns, end_ns FROM gpu_activities WHERE run_id = 1 AND device = ? AND dur_ns > 0", [device]
    ).fetchall()
    got = steps[1]
    assert [(s["ts_ns"], s["ts_ns"] + s["dur_ns"]) for s in got] == windows
    for s, (lo, hi) in zip(got, windows):
        assert s["busy_ns"] == union_within(acts, lo, hi)
        parts = sum(s[k] for k in html_report.BREAKDOWN)
        assert parts == pytest.approx(s["dur_ns"], abs=1)
        assert s["idle"] == s["dur_ns"] - s["busy_ns"] and s["host"] == 0


def test_cpu_only_run_shows_host_time_of_the_step_thread(loaded):
    """Without GPU work a step is host time and idle: host = the union of the work nested below the step
    annotation on its thread (steps.host_ns), not of every thread (two threads overlap here)."""
    con = loaded(sample("cpu_two_threads.json.gz"))
    _, steps = html_report.step_breakdown(con, [1])
    pid, tid = con.execute(
        "SELECT pid, tid FROM events WHERE run_id = 1 AND name LIKE 'ProfilerStep#%' GROUP BY ALL ORDER BY count(*) DESC LIMIT 1"
    ).fetchone()
    below = con.execute(
        "SELECT ts_ns, end_ns FROM events WHERE run_id = 1 AND pid = ? AND tid = ? AND ph = 'X' AND depth > 0 "
        "AND dur_ns > 0 AND kind NOT IN ('python_function', 'profiler_span', 'overhead') "
        "AND name NOT LIKE 'ProfilerStep#%'",
        [pid, tid],
    ).fetchall()
    other_threads = con.execute(
        "SELECT ts_ns, end_ns FROM events WHERE run_id = 1 AND NOT (pid = ? AND tid = ?) AND ph = 'X' AND depth = 0 "
        "AND dur_ns > 0 AND kind NOT IN ('profiler_span', 'overhead')",
        [pid, tid],
    ).fetchall()
    assert steps[1] and other_threads
    for s in steps[1]:
        lo, hi = s["ts_ns"], s["ts_ns"] + s["dur_ns"]
        assert s["compute"] == s["communication"] == 0
        assert s["host"] == union_within(below, lo, hi) > 0
        assert s["host"] + s["idle"] == s["dur_ns"]


# ----------------------------------------------------------------------------------------------- page


@pytest.fixture(scope="module")
def eager_page(loaded):
    con = loaded(EAGER)
    report = _report(con)
    page, figures = html_report.build(con, report)
    return page, figures, report


def test_page_is_self_contained(eager_page):
    page, _, _ = eager_page
    outside = _outside_scripts(page)
    assert not re.search(r"""\b(src|href)\s*=\s*["']?\s*(https?:)?//""", outside, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", outside, re.I)
    assert not re.search(r"<script[^>]+\bsrc\s*=", page, re.I)  # every script is inline
    assert not re.search(r"<link\b", page, re.I)
    assert page.count("* plotly.js v") == 1 and page.count("Plotly.newPlot") >= 1  # plotly.js inlined once


def test_every_figure_and_finding_is_on_the_page(eager_page):
    page, figures, report = eager_page
    assert page.count('class="tk-figure"') == figures
    assert f'data-figures="{figures}"' in page
    names = re.findall(r'data-figure="([^"]+)"', page)
    assert {"timeline", "timeline-detail", "steps", "kernels"} <= set(names)
    assert report["findings"]
    for f in report["findings"]:
        assert f'id="{f["id"]}"' in page
        assert html.escape(f["next_experiment"]) in page
        assert html.escape(f["evidence"]["sql"]) in page
    assert '<pre id="tk-errors"></pre>' in page


def test_ranks_are_compared(loaded):
    con = loaded(*TP2)
    page, figures = html_report.build(con, _report(con))
    assert 'data-figure="ranks"' in page
    assert "Per-rank comparison" in page and "rank 0" in page and "rank 1" in page


def test_bounded_on_the_largest_corpus_trace(loaded):
    con = loaded(corpus("hta__df_index_resolver.json.gz"))
    page, _ = html_report.build(con, _report(con), max_blocks=2000)
    # every bar of every timeline figure: plotly stores one base value per bar
    bars = sum(len(m.split(",")) for m in re.findall(r'"base":\[([^\]]*)\]', page))
    assert 0 < bars <= 2000
    assert len(page) < 8_000_000


def _figure_data(page: str, name: str) -> list:
    """The plotly traces of the page's figure called `name`, read back from its Plotly.newPlot call."""
    import json

    at = page.index(f'data-figure="{name}"')
    call = page.index("Plotly.newPlot(", at)
    start = page.index("[", page.index(",", call))
    return json.JSONDecoder().raw_decode(page[start:])[0]


def test_diff_waterfall_adds_up(tmp_path):
    out = tmp_path / "diff.html"
    res = CliRunner().invoke(cli, ["report", str(GRAPH), "--baseline", str(EAGER), "-o", str(out)])
    assert res.exit_code == 0, res.output
    (w,) = _figure_data(out.read_text(), "waterfall")
    assert w["type"] == "waterfall"
    assert list(w["measure"]) == ["absolute"] + ["relative"] * (len(w["y"]) - 2) + ["total"]
    # baseline + every listed term + what the list leaves out = candidate (each term rounded to 1 ns)
    assert w["y"][0] + sum(w["y"][1:-1]) == pytest.approx(w["y"][-1], abs=1e-6 * len(w["y"]))
    assert w["y"][-1] < w["y"][0]  # replaying decode from a CUDA graph makes the step shorter


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b not gzip")
    for args in (
        ["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "r.html")],
        ["report", str(bad), "-o", str(tmp_path / "r.html")],
        ["report", str(EAGER), "-o", str(tmp_path / "r.txt")],
        ["report", str(EAGER), "-o", str(tmp_path / "r.html"), "--rules", "nope"],
        ["report", str(EAGER), "-o", str(tmp_path / "r.html"), "--step", "decode_step"],
    ):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert not (tmp_path / "r.html").exists()
