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


# ------------------------------------------------------------------------------------- truth at a glance


def _figures(page: str, name: str) -> list[tuple[list, dict]]:
    """(traces, layout) of every figure of the page called `name`, read back from their Plotly.newPlot calls."""
    import json

    decoder, out, at = json.JSONDecoder(), [], 0
    while (at := page.find(f'data-figure="{name}"', at)) >= 0:
        call = page.index("Plotly.newPlot(", at)
        start = page.index("[", page.index(",", call))
        data, end = decoder.raw_decode(page, start)
        layout, _ = decoder.raw_decode(page, page.index("{", end))
        out.append((data, layout))
        at = call
    return out


def _stream_busy(con, run_id: int, label: str, lo: int, hi: int) -> int:
    device, stream = map(int, re.match(r"GPU (\d+) stream (\d+)", label.split(": ")[-1]).groups())
    acts = con.execute(
        "SELECT ts_ns, end_ns FROM gpu_activities WHERE run_id = ? AND device = ? AND stream = ? AND dur_ns > 0",
        [run_id, device, stream],
    ).fetchall()
    return union_within(acts, lo, hi)


def test_a_merged_block_is_busy_for_the_union_of_its_slices(loaded):
    """The blocks of a mostly idle stream merge many short kernels with gaps between them: the block
    covers them all, its busy time is only the kernels'."""
    con = loaded(EAGER)
    lo, hi = con.execute("SELECT start_ns, end_ns FROM runs WHERE run_id = 1").fetchone()
    t = timeline.build(con, 1, lo, hi, max_blocks=300)
    (gpu,) = [lane for lane in t.lanes if lane.kind == "gpu"]
    acts = con.execute("SELECT ts_ns, end_ns FROM gpu_activities WHERE run_id = 1 AND dur_ns > 0").fetchall()
    assert any(b.slices > 1 for b in gpu.blocks)
    for b in gpu.blocks:
        assert b.busy_ns == union_within(acts, b.start_ns, b.end_ns) <= b.end_ns - b.start_ns
    assert gpu.busy_ns == union_within(acts, lo, hi)
    extents = sum(b.end_ns - b.start_ns for b in gpu.blocks)
    assert gpu.busy_ns < extents / 5  # what a bar per block drawn solid would overstate


def test_timeline_bars_draw_each_lane_busy_for_as_long_as_the_data_says(loaded, eager_page):
    """A bar's area (length x thickness) over a fully busy bar's thickness is its busy time: summed
    over a lane it is the union of the lane's kernels, on a stream idle 96% of the run."""
    con = loaded(EAGER)
    page, _, _ = eager_page
    lo, hi = con.execute("SELECT start_ns, end_ns FROM runs WHERE run_id = 1").fetchone()
    ((data, layout),) = _figures(page, "timeline")
    drawn: dict[str, float] = {}
    for trace in data:
        for y, x, w in zip(trace["y"], trace["x"], trace["width"]):
            drawn[y] = drawn.get(y, 0.0) + x * 1e6 * w / html_report.BAR_THICKNESS
    gpu = [y for y in drawn if y.startswith("GPU ")]
    assert gpu
    for label in gpu:
        busy = _stream_busy(con, 1, label, lo, hi)
        assert busy / (hi - lo) < 0.05
        assert drawn[label] == pytest.approx(busy, rel=1e-6, abs=len(data[0]["x"]))
        assert label.endswith(f"busy {html_report.share(busy / (hi - lo))}")


def test_finding_labels_keep_apart_at_every_width_from_the_narrowest():
    """Seeded random windows, clustered so that labels compete: in each row, no two labels overlap
    at the width they were placed for nor at any wider one, and none leaves the plot."""
    import random

    from tracekit.render import labels

    rng = random.Random(13)
    for _ in range(200):
        lo, hi = rng.uniform(-1e3, 1e3), 0.0
        hi = lo + rng.choice([1e-3, 1.0, 1e6])
        items = []
        for _ in range(rng.randint(1, 25)):
            a = lo + (hi - lo) * rng.choice([0.0, 0.5, 0.98, rng.random()])
            b = min(hi, a + (hi - lo) * rng.random() * 0.1)
            text = ", ".join(f"#{rng.randint(1, 30)}" for _ in range(rng.randint(1, 3)))
            items.append((a, b, text))
        placed = labels.place(items, lo, hi)
        for scale in (1.0, 1.37, 4.0):
            px = labels.PLOT_PX * scale
            spans: dict[int, list] = {}
            for (a, b, text), p in zip(items, placed):
                w = labels.width_px(text)
                left = (a - lo) / (hi - lo) * px if p.anchor == "left" else (b - lo) / (hi - lo) * px - w
                assert -1e-6 <= left and left + w <= px + 1e-6
                spans.setdefault(p.row, []).append((left, left + w))
            for row in spans.values():
                row.sort()
                assert all(x[1] <= y[0] + 1e-6 for x, y in zip(row, row[1:]))


def test_ranks_share_one_time_axis(loaded):
    """Two ranks in one figure, one subplot each, x axes matched over one range from the earliest
    rank's start, and the page says so; rank 1 starts later, so its bars start later."""
    con = loaded(*TP2)
    page, _ = html_report.build(con, _report(con))
    ((data, layout),) = _figures(page, "timeline")
    starts = dict(con.execute("SELECT rank, start_ns FROM runs").fetchall())
    lo = min(starts.values())
    hi = con.execute("SELECT max(end_ns) FROM runs").fetchone()[0]
    axes = sorted(k for k in layout if re.fullmatch(r"xaxis\d*", k))
    assert axes == ["xaxis", "xaxis2"]
    for k in axes:
        assert layout[k]["range"] == pytest.approx([0, (hi - lo) / 1e6])
    assert layout["xaxis2"]["matches"] == "x"
    assert "the start of rank 0, the earliest rank" in layout["xaxis2"]["title"]["text"]
    assert starts[1] > starts[0]
    for trace in data:
        bases = [b for b, y in zip(trace["base"], trace["y"]) if y.startswith("rank 1: ")]
        assert all(b >= (starts[1] - lo) / 1e6 - 1e-9 for b in bases)
    assert any(y.startswith("rank 1: ") for trace in data for y in trace["y"])
    assert "The ranks share one time axis: 0 ms is the start of rank 0, the earliest rank" in page
    assert f"rank 1 starts {html_report.duration(starts[1] - lo)} later" in page


def _cli_top_kernels(path) -> list[list[str]]:
    """The rows of the `top kernels` table `tracekit analyze` prints: name, count, total, mean."""
    res = CliRunner(env={"COLUMNS": "250"}).invoke(cli, ["analyze", str(path)])
    lines = res.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("top kernels"))
    rows = []
    for line in lines[at + 3 :]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    assert rows
    return rows


def _page_table(page: str, after: str) -> list[list[str]]:
    at = page.index(after)
    body = page[page.index("<tbody>", at) : page.index("</tbody>", at)]
    return [
        [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_every_duration_on_the_page_reads_as_the_cli_prints_it(eager_page):
    """The kernel table and the kernel chart's hovers show the CLI's strings for the same kernels
    (4.71 us, not 0.005 ms), and no hover, title or window elsewhere prints fixed-point ms."""
    page, _, _ = eager_page
    cli_rows = _cli_top_kernels(EAGER)
    table = _page_table(page, "<h3>Kernels:")
    ((data, _),) = _figures(page, "kernels")
    hovers = data[0]["hovertext"]
    for (name, count, total, mean), row, hover in zip(cli_rows, table, hovers):
        assert row[0][:60] == name[:60] and row[1] == count  # both cut long names, at different widths
        assert (row[2], row[3]) == (total, mean)
        assert f"{total} " in hover and f"mean {mean}" in hover
    assert any(mean.endswith(" us") for *_, mean in cli_rows)
    figures_and_text = _outside_scripts(page) + "".join(re.findall(r"Plotly\.newPlot\((.*?)\)\s*\}", page, re.S))
    assert not re.findall(r"\d\.\d{3} ms", figures_and_text)


def test_findings_sharing_a_window_share_one_label_that_fits():
    """Twelve findings over one window: one band and one label naming the first few and counting the
    rest (the hover names all), short enough to fit the narrowest plot."""
    from tracekit.render import labels

    t = timeline.Timeline(1, 0, 1_000_000, 0, [], 0, 0)
    findings = [
        {"id": f"X{i:03d}", "title": f"finding {i}", "severity": "info" if i % 2 else "critical",
         "locality": {"window_ns": [-5, 2_000_000]}}
        for i in range(12)
    ]  # fmt: skip
    numbers = {f["id"]: i for i, f in enumerate(findings, 1)}
    (mark,) = html_report._marks(t, findings, numbers)
    assert (mark.lo_ns, mark.hi_ns) == (0, 1_000_000)  # clipped to the figure
    assert mark.text == "#1, #2, #3, #4 +8"
    assert all(f"#{n} X{n - 1:03d}" in mark.hover for n in numbers.values())
    assert mark.color == html_report.SEVERITY_COLORS["critical"]
    assert labels.width_px(mark.text) < labels.PLOT_PX / 2
