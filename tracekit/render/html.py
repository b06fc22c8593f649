"""The analyze report as one self-contained HTML page: figures from SQL over the trace database.

Sections: runs, findings (each with its evidence SQL and next experiment), a timeline per run (GPU
streams and host threads, merged to a bounded number of blocks, finding windows highlighted) with a
close-up around each top finding, the time breakdown per step, a per-rank comparison, the top kernels
and ops, and for a diff the waterfall of what explains the step-time delta. plotly.js is inlined once;
the page loads nothing from the network. A script at the top of the page records script errors in
`#tk-errors`, so a browser test (and a reader) can see that every figure drew.
"""

from __future__ import annotations

import html
import json

from tracekit.render import timeline as tl
from tracekit.units import duration

COLORS = {
    "compute": "#4C78A8",
    "communication": "#F58518",
    "memcpy/memset": "#54A24B",
    "idle": "#D0CCC8",
    "host": "#B279A2",
    "runtime": "#9D755D",
}
SEVERITY_COLORS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}
MAX_BLOCKS = 20_000  # rectangles on the whole page, over every timeline
MAX_RUNS_DRAWN = 4  # runs with their own timeline and step figures; the rest appear in the comparison
MAX_STEPS = 300  # bars per step figure: more steps are averaged in consecutive groups
DETAILS_PER_RUN = 2

_ERROR_HOOK = """
<script>
(function () {
  function record(msg) {
    var box = document.getElementById('tk-errors');
    if (!box) { window.__tkPending = (window.__tkPending || []).concat([msg]); return; }
    box.textContent += msg + '\\n';
    box.style.display = 'block';
  }
  window.__tkRecord = record;
  window.addEventListener('error', function (e) { record('error: ' + (e.message || e.type)); });
  window.addEventListener('unhandledrejection', function (e) { record('unhandled rejection: ' + e.reason); });
  var original = console.error;
  console.error = function () {
    record('console.error: ' + Array.prototype.map.call(arguments, String).join(' '));
    return original.apply(console, arguments);
  };
})();
</script>
"""

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 12px 20px; color: #222; }
h1 { font-size: 1.5em; margin: 0.2em 0; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 6px 0 14px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.sev { color: white; border-radius: 3px; padding: 1px 6px; font-size: 0.8em; }
.finding { border: 1px solid #ddd; border-left: 5px solid #999; border-radius: 4px; padding: 6px 12px; margin: 10px 0; }
.finding h3 { margin: 4px 0; font-size: 1.05em; } .finding p { margin: 4px 0; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 0.8em; white-space: pre-wrap; }
.note { color: #666; font-size: 0.85em; } #tk-errors { display: none; color: #b00; border: 1px solid #b00; }
.tk-figure { margin: 8px 0 18px; }
"""


# ---------------------------------------------------------------------------------------------- helpers


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _short(name: str, n: int = 90) -> str:
    name = name or ""
    return name if len(name) <= n else name[: n - 3] + "..."


def _rows(con, sql: str, params=None) -> list[dict]:
    cur = con.execute(sql, params or {})
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


class _Page:
    """Collects sections and figures; plotly.js goes in once, before the first figure."""

    def __init__(self):
        self.parts: list[str] = []
        self.figures = 0

    def add(self, fragment: str) -> None:
        self.parts.append(fragment)

    def figure(self, fig, name: str) -> None:
        import plotly.io as pio

        self.figures += 1
        div = pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            div_id=f"tk-fig-{self.figures}",
            config={"displaylogo": False, "responsive": True, "scrollZoom": False},
        )
        self.parts.append(f'<div class="tk-figure" data-figure="{_e(name)}">{div}</div>')


# ------------------------------------------------------------------------------------------ step windows

BREAKDOWN = ("compute", "communication", "memcpy/memset", "host", "idle")


def step_breakdown(con, run_ids: list[int]) -> tuple[dict, dict[int, list[dict]]]:
    """Per run, per step (the `steps` view): ns of compute, exposed communication, memcpy/memset and
    idle on the run's main GPU, which add up to the step; for a run without GPU work, host time of the
    step's thread and idle. Also the step annotation and how it was chosen (one name when every run
    agrees, else the names joined)."""
    rows = _rows(
        con,
        "SELECT run_id, step_index, name, source, start_ns, dur_ns, phase, device, busy_ns, compute_ns, "
        "comm_exposed_ns, memcpy_ns, idle_ns, host_ns FROM steps WHERE list_contains($runs, run_id) "
        "ORDER BY run_id, step_index",
        {"runs": list(run_ids)},
    )
    out: dict[int, list[dict]] = {}
    for r in rows:
        item = {"idx": r["step_index"], "name": r["name"], "ts_ns": r["start_ns"], "dur_ns": r["dur_ns"],
                "phase": r["phase"]}  # fmt: skip
        if r["device"] is not None:
            item.update({"busy_ns": r["busy_ns"], "compute": r["compute_ns"], "communication": r["comm_exposed_ns"],
                         "memcpy/memset": r["memcpy_ns"], "host": 0, "idle": r["idle_ns"]})  # fmt: skip
        else:
            host = min(r["host_ns"], r["dur_ns"])
            item.update({"busy_ns": host, "compute": 0, "communication": 0, "memcpy/memset": 0, "host": host,
                         "idle": r["dur_ns"] - host})  # fmt: skip
        out.setdefault(r["run_id"], []).append(item)
    names = sorted({r["name"] or "(whole run)" for r in rows})
    sources = sorted({r["source"] for r in rows})
    step = {
        "name": None if names in ([], ["(whole run)"]) else ", ".join(names),
        "source": ", ".join(sources) if sources else "no runs",
    }
    return step, out


def _bucket(steps: list[dict], limit: int) -> tuple[list[dict], int]:
    """At most `limit` bars: consecutive steps averaged in groups of equal size."""
    if len(steps) <= limit:
        return steps, 1
    size = -(-len(steps) // limit)
    out = []
    for i in range(0, len(steps), size):
        group = steps[i : i + size]
        avg = {k: sum(s[k] for s in group) / len(group) for k in (*BREAKDOWN, "dur_ns")}
        avg["idx"] = group[0]["idx"]
        avg["last_idx"] = group[-1]["idx"]
        out.append(avg)
    return out, size


# ------------------------------------------------------------------------------------------------ figures


def _timeline_figure(t: tl.Timeline, findings: list[dict], origin_ns: int, title: str):
    import plotly.graph_objects as go

    labels = [lane.label for lane in t.lanes]
    fig = go.Figure()
    by_cat: dict[str, dict[str, list]] = {}
    for lane in t.lanes:
        for b in lane.blocks:
            d = by_cat.setdefault(b.category, {"y": [], "x": [], "base": [], "text": []})
            d["y"].append(lane.label)
            d["x"].append(max(b.end_ns - b.start_ns, 1) / 1e6)
            d["base"].append((b.start_ns - origin_ns) / 1e6)
            what = _e(_short(b.name, 70))
            more = f"<br>{b.slices} slices merged, {(b.slice_ns / 1e6):.3f} ms in slices" if b.slices > 1 else ""
            d["text"].append(
                f"{what}<br>{(b.end_ns - b.start_ns) / 1e6:.3f} ms at {(b.start_ns - origin_ns) / 1e6:.3f} ms{more}"
            )
    for cat in tl.CATEGORIES:
        d = by_cat.get(cat)
        if not d:
            continue
        fig.add_trace(
            go.Bar(
                y=d["y"], x=d["x"], base=d["base"], orientation="h", name=cat, marker_color=COLORS[cat],
                marker_line_width=0, hovertext=d["text"], hoverinfo="text", width=0.8,
            )
        )  # fmt: skip
    for f in findings:
        w = f["locality"].get("window_ns")
        if not w:
            continue
        lo, hi = max(w[0], t.lo_ns), min(w[1], t.hi_ns)
        if hi <= lo:
            continue
        color = SEVERITY_COLORS.get(f["severity"], "#999")
        fig.add_vrect(
            x0=(lo - origin_ns) / 1e6, x1=(hi - origin_ns) / 1e6, fillcolor=color, opacity=0.08, line_width=1,
            line_color=color, layer="below", annotation_text=f["id"], annotation_position="top left",
            annotation_font_size=10, annotation_font_color=color,
        )  # fmt: skip
    fig.update_layout(
        title=title, barmode="overlay", height=max(220, 90 + 28 * len(labels)),
        margin={"l": 10, "r": 10, "t": 60, "b": 40}, legend={"orientation": "h", "y": -0.15},
        xaxis={"title": "ms from run start", "range": [(t.lo_ns - origin_ns) / 1e6, (t.hi_ns - origin_ns) / 1e6]},
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(labels)), "automargin": True},
        plot_bgcolor="white",
    )  # fmt: skip
    return fig


def _steps_figure(steps: list[dict], label: str, step_name: str | None):
    import plotly.graph_objects as go

    bars, size = _bucket(steps, MAX_STEPS)
    x = [
        (f"{s['idx']}" + ("*" if s.get("phase", "steady") != "steady" else ""))
        if s.get("last_idx") in (None, s["idx"])
        else f"{s['idx']}-{s['last_idx']}"
        for s in bars
    ]
    fig = go.Figure()
    for cat in BREAKDOWN:
        ys = [s[cat] / 1e6 for s in bars]
        if any(ys):
            fig.add_trace(go.Bar(x=x, y=ys, name=cat, marker_color=COLORS[cat], hovertemplate="%{y:.3f} ms"))
    what = f"steps = {step_name}" if step_name else "the whole run as one step"
    avg = f"; bars average {size} consecutive steps" if size > 1 else ""
    fig.update_layout(
        title=f"Time per step: {_e(label)} ({what}{avg})", barmode="stack", height=380,
        xaxis={"title": "step", "type": "category"}, yaxis={"title": "ms"},
        margin={"l": 10, "r": 10, "t": 60, "b": 40}, plot_bgcolor="white",
    )  # fmt: skip
    return fig


def _ranks_figure(runs: list[dict], steps: dict[int, list[dict]]):
    import plotly.graph_objects as go

    names = [_run_name(r) for r in runs]
    fig = go.Figure()
    for cat in BREAKDOWN:
        ys = []
        for r in runs:
            s = steps.get(r["run_id"], [])
            ys.append(sum(x[cat] for x in s) / len(s) / 1e6 if s else 0)
        if any(ys):
            fig.add_trace(go.Bar(y=names, x=ys, name=cat, orientation="h", marker_color=COLORS[cat],
                                 hovertemplate="%{x:.3f} ms"))  # fmt: skip
    fig.update_layout(
        title="Per-rank comparison: mean time per step", barmode="stack", height=max(240, 120 + 34 * len(runs)),
        xaxis={"title": "ms per step"}, yaxis={"autorange": "reversed", "automargin": True},
        margin={"l": 10, "r": 10, "t": 60, "b": 40}, plot_bgcolor="white",
    )  # fmt: skip
    return fig


def _kernels_figure(summary: dict, runs: list[dict]):
    import plotly.graph_objects as go

    fig = go.Figure()
    for run in summary["runs"][:MAX_RUNS_DRAWN]:
        ks = run["top_kernels"]
        if not ks:
            continue
        fig.add_trace(
            go.Bar(
                y=[_short(k["name"], 60) for k in ks], x=[k["total_ns"] / 1e6 for k in ks], orientation="h",
                name=_run_name(run), hovertext=[_e(_short(k["name"], 200)) for k in ks],
                hovertemplate="%{hovertext}<br>%{x:.3f} ms<extra></extra>",
            )
        )  # fmt: skip
    if not fig.data:
        return None
    fig.update_layout(
        title="Top kernels by GPU time", barmode="group", height=max(300, 80 + 22 * len(fig.data[0].y) * len(fig.data)),
        xaxis={"title": "ms"}, yaxis={"autorange": "reversed", "automargin": True},
        margin={"l": 10, "r": 10, "t": 60, "b": 40}, plot_bgcolor="white",
    )  # fmt: skip
    return fig


def _waterfall_figure(doc: dict):
    import plotly.graph_objects as go

    st = doc["delta"]["step"]
    terms = doc["contributors"]
    x = ["baseline step"] + [f"{i}. {t['category']}: {_short(t['name'], 40)}" for i, t in enumerate(terms, 1)]
    y = [st["baseline"]["time_ns"] / 1e6] + [t["delta_ns"] / 1e6 for t in terms]
    measure = ["absolute"] + ["relative"] * len(terms)
    if doc["unexplained_ns"]:
        x.append("unexplained (terms not listed)")
        y.append(doc["unexplained_ns"] / 1e6)
        measure.append("relative")
    x.append("candidate step")
    y.append(st["candidate"]["time_ns"] / 1e6)
    measure.append("total")
    fig = go.Figure(
        go.Waterfall(
            x=x, y=y, measure=measure, connector={"line": {"color": "#999"}},
            increasing={"marker": {"color": "#d62728"}}, decreasing={"marker": {"color": "#2ca02c"}},
            totals={"marker": {"color": "#4C78A8"}}, hovertemplate="%{x}<br>%{y:.3f} ms<extra></extra>",
        )
    )  # fmt: skip
    pct = f" ({st['delta_pct']:+.1f}%)" if st.get("delta_pct") is not None else ""
    fig.update_layout(
        title=f"What explains the step-time delta: {st['delta_ns'] / 1e6:+.3f} ms per step{pct}", height=520,
        yaxis={"title": "ms per step"}, xaxis={"tickangle": -30, "automargin": True},
        margin={"l": 10, "r": 10, "t": 60, "b": 40}, plot_bgcolor="white", showlegend=False,
    )  # fmt: skip
    return fig


# ------------------------------------------------------------------------------------------------- tables


def _run_name(r: dict) -> str:
    return f"rank {r['rank']}" if r.get("rank") is not None else str(r.get("label") or f"run {r['run_id']}")


def _table(headers: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f'<th class="{"num" if i in numeric else ""}">{_e(h)}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"num" if i in numeric else ""}">{_e(c)}</td>' for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _where(loc: dict) -> str:
    parts = []
    for key, label in (("run_label", ""), ("rank", "rank "), ("device", "GPU "), ("stream", "stream "),
                       ("thread_name", ""), ("op", "op "), ("kernel", "kernel "), ("step", "step ")):  # fmt: skip
        if loc.get(key) is not None:
            parts.append(f"{label}{_short(str(loc[key]), 80)}")
    return ", ".join(parts)


def _finding_html(f: dict, origin: dict[int, int]) -> str:
    loc = f["locality"]
    color = SEVERITY_COLORS.get(f["severity"], "#999")
    w = loc.get("window_ns")
    when = ""
    if w and loc.get("run_id") in origin:
        o = origin[loc["run_id"]]
        when = f"; window {(w[0] - o) / 1e6:.3f}-{(w[1] - o) / 1e6:.3f} ms from run start"
    obs, exp = f["observed"], f["expected"]
    code = loc.get("code_path")
    code_html = f"<p><b>Code path</b>: {_e(' <- '.join(code[:4]))}</p>" if code else ""
    caveats = "".join(f"<li>{_e(c)}</li>" for c in f.get("caveats") or [])
    params = json.dumps(f["evidence"].get("params") or {}, default=str)
    return f"""
<div class="finding" id="{_e(f["id"])}" style="border-left-color: {color}">
<h3><span class="sev" style="background: {color}">{_e(f["severity"])}</span> {_e(f["title"])}</h3>
<p class="note">{_e(f["id"])} &middot; {_e(_where(loc))}{_e(when)} &middot; impact {duration(f["impact"]["time_ns"])}
({_pct(f["impact"]["share_of_window"])} of the window) &middot; confidence {f["confidence"]}</p>
<p><b>Observed</b>: {_e(obs.get("value"))} {_e(obs.get("unit"))} {_e(obs.get("what"))};
<b>expected</b>: {_e(exp.get("value"))} {_e(exp.get("unit"))} {_e(exp.get("what"))}</p>
{code_html}
<p><b>Hypothesis</b>: {_e(f["hypothesis"])}</p>
<p><b>Next experiment</b>: {_e(f["next_experiment"])}</p>
<p><b>Acceptance</b>: {_e(f["acceptance"])}</p>
{f"<ul>{caveats}</ul>" if caveats else ""}
<details><summary>Evidence SQL (parameters {_e(params)})</summary><pre>{_e(f["evidence"]["sql"])}</pre></details>
</div>"""


# ------------------------------------------------------------------------------------------------- report


def _detail_window(f: dict, run_lo: int, run_hi: int, con) -> tuple[int, int] | None:
    """A close-up inside a finding's window: the whole window when short, else about a twentieth of the
    run (at least 1 ms) around the finding's first sample event."""
    w = f["locality"].get("window_ns")
    if not w:
        return None
    lo, hi = max(int(w[0]), run_lo), min(int(w[1]), run_hi)
    if hi <= lo:
        return None
    span = max(1_000_000, (run_hi - run_lo) // 20)
    if hi - lo <= span:
        pad = (hi - lo) // 10
        return max(run_lo, lo - pad), min(run_hi, hi + pad)
    centre = lo
    ids = f["evidence"].get("sample_event_ids") or []
    if ids:
        row = con.execute("SELECT ts_ns FROM events WHERE event_id = ?", [int(ids[0])]).fetchone()
        if row and lo <= row[0] <= hi:
            centre = row[0]
    start = max(lo, min(centre - span // 4, hi - span))
    return start, start + span


def build(con, report: dict, diff_doc: dict | None = None, title: str = "tracekit report",
          max_blocks: int = MAX_BLOCKS) -> tuple[str, int]:  # fmt: skip
    """(the HTML page, number of figures). `report` is build_report's document; `diff_doc` run_diff's."""
    from plotly.offline import get_plotlyjs

    page = _Page()
    runs = report["runs"]
    summary = report["summary"]
    findings = report["findings"]
    origin = {r["run_id"]: r["start_ns"] for r in runs if r.get("start_ns") is not None}

    # runs
    rows = [
        [r["run_id"], r["label"], r["rank"] if r["rank"] is not None else "-", r["format"], r.get("device") or "-",
         r["events_ingested"], r["events_skipped"], duration(r["window_ns"])]
        for r in runs
    ]  # fmt: skip
    page.add("<h2>Runs</h2>" + _table(["run", "label", "rank", "format", "device", "events", "skipped", "window"],
                                      rows, {0, 5, 6, 7}))  # fmt: skip

    # findings
    sev = report["severity_counts"]
    counts = ", ".join(f"{v} {k}" for k, v in sev.items() if v) or "none"
    omitted = f" ({report['findings_omitted']} more not shown)" if report["findings_omitted"] else ""
    page.add(f"<h2>Findings: {report['findings_total']} ({counts}){omitted}</h2>")
    if findings:
        page.add(
            _table(
                ["#", "severity", "finding", "where", "impact"],
                [
                    [i, f["severity"], f["title"], _where(f["locality"]), duration(f["impact"]["time_ns"])]
                    for i, f in enumerate(findings, 1)
                ],
                {0, 4},
            )  # fmt: skip
        )
        page.add(
            '<p class="note">Each finding in detail (evidence SQL, next experiment) is under '
            '<a href="#tk-details">Findings in detail</a>.</p>'
        )
    else:
        page.add('<p class="note">No rule reported a finding.</p>')
    notes = report.get("data_quality") or []
    if notes:
        items = "".join(f"<li>{_e(n.get('rule'))}: {_e(n.get('message'))}</li>" for n in notes)
        page.add(
            f'<p class="note">Data quality (rules that could not run or ran with limits):</p><ul class="note">{items}</ul>'
        )

    # timelines: budget split between the runs drawn, half for the overviews, half for close-ups
    drawn = [r for r in runs if r.get("start_ns") is not None and r.get("end_ns") is not None][:MAX_RUNS_DRAWN]
    if drawn:
        page.add("<h2>Timeline</h2>")
        page.add(
            '<p class="note">GPU streams and host threads (top-level events). Slices closer than about a pixel '
            "are merged into one block (hover: how many); shaded bands are finding windows. Drag to zoom, "
            "double-click to reset.</p>"
        )
        per_run = max(200, max_blocks // len(drawn))
        for r in drawn:
            run_findings = [f for f in findings if f["locality"].get("run_id") == r["run_id"]]
            t = tl.build(con, r["run_id"], r["start_ns"], r["end_ns"], max_blocks=per_run // 2, pixels=4000)
            if not t.lanes:
                page.add(f'<p class="note">{_e(_run_name(r))}: no timed events to draw.</p>')
                continue
            extra = f"; {t.lanes_omitted} quieter threads not drawn" if t.lanes_omitted else ""
            page.figure(
                _timeline_figure(t, run_findings, r["start_ns"],
                                 f"{_e(_run_name(r))}: whole run ({t.slices:,} slices in {t.blocks:,} blocks{extra})"),
                "timeline",
            )  # fmt: skip
            windows = []
            for f in run_findings:
                w = _detail_window(f, r["start_ns"], r["end_ns"], con)
                if w and w not in windows:
                    windows.append((w, f))
                if len(windows) >= DETAILS_PER_RUN:
                    break
            for (lo, hi), f in windows:
                d = tl.build(con, r["run_id"], lo, hi, max_blocks=per_run // (2 * len(windows)), pixels=4000)
                if d.lanes:
                    page.figure(
                        _timeline_figure(d, run_findings, r["start_ns"],
                                         f"{_e(_run_name(r))}: close-up on {_e(f['id'])} ({duration(hi - lo)}, "
                                         f"{d.slices:,} slices in {d.blocks:,} blocks)"),
                        "timeline-detail",
                    )  # fmt: skip

    # time breakdown per step, per-rank comparison
    run_ids = [r["run_id"] for r in runs if r.get("start_ns") is not None]
    step, steps = step_breakdown(con, run_ids)
    if steps:
        page.add("<h2>Time per step</h2>")
        page.add(
            f'<p class="note">Steps: {_e(step["name"] or "(whole run)")} ({_e(step["source"])}). On the main GPU, '
            "compute is the union of non-communication kernels, communication the communication kernels' time "
            "not overlapped by compute, memcpy/memset the copies not overlapped by any kernel, idle the rest of "
            "the step: they add up to it. Runs without GPU work show the host time of the step's thread (its "
            "ops and runtime calls inside the step) and idle. Steps marked * are not steady (warm-up, CUDA-graph "
            "capture, profiler bookkeeping).</p>"
        )
        for r in drawn:
            if steps.get(r["run_id"]):
                run_steps = steps[r["run_id"]]
                page.figure(_steps_figure(run_steps, _run_name(r), run_steps[0]["name"]), "steps")
        if len([r for r in runs if steps.get(r["run_id"])]) > 1:
            page.add("<h2>Per-rank comparison</h2>")
            page.figure(_ranks_figure([r for r in runs if steps.get(r["run_id"])], steps), "ranks")
            rows = []
            for r in runs:
                s = steps.get(r["run_id"]) or []
                if s:
                    mean = {k: sum(x[k] for x in s) / len(s) for k in (*BREAKDOWN, "dur_ns")}
                    rows.append(
                        [_run_name(r), len(s), duration(mean["dur_ns"])] + [duration(mean[k]) for k in BREAKDOWN]
                    )
            page.add(_table(["run", "steps", "mean step", *BREAKDOWN], rows, set(range(1, 3 + len(BREAKDOWN)))))

    # top kernels and ops
    page.add("<h2>Top kernels and ops</h2>")
    fig = _kernels_figure(summary, runs)
    if fig is not None:
        page.figure(fig, "kernels")
    for run in summary["runs"]:
        if run["top_kernels"]:
            page.add(f"<h3>Kernels: {_e(_run_name(run))}</h3>")
            page.add(_table(
                ["kernel", "count", "total", "mean", "max", "share of GPU busy", "comm"],
                [[_short(k["name"], 120), k["count"], duration(k["total_ns"]), duration(k["mean_ns"]), duration(k["max_ns"]),
                  _pct(k["share_of_gpu_busy"]), "yes" if k["is_communication"] else ""] for k in run["top_kernels"]],
                {1, 2, 3, 4, 5},
            ))  # fmt: skip
        if run["top_cpu_ops"]:
            page.add(f"<h3>CPU ops by self time: {_e(_run_name(run))}</h3>")
            page.add(_table(
                ["op", "input dims", "count", "self", "total", "mean", "self share of window"],
                [[o["name"], _short(o["input_dims"] or "", 80), o["count"], duration(o["self_ns"]), duration(o["total_ns"]),
                  duration(o["mean_ns"]), _pct(o["self_share_of_window"])] for o in run["top_cpu_ops"]],
                {2, 3, 4, 5, 6},
            ))  # fmt: skip

    # diff
    if diff_doc is not None:
        page.add("<h2>Diff against the baseline</h2>")
        d = diff_doc["delta"]
        rows = [["end to end (per run)", d["end_to_end"]], ["step (mean)", d["step"]]]
        rows += [[f"phase {p} (per run)", v] for p, v in d["phases"].items()]
        page.add(_table(
            ["scope", "baseline", "candidate", "delta", "delta %"],
            [[label, duration(v["baseline"]["time_ns"]), duration(v["candidate"]["time_ns"]), duration(v["delta_ns"]),
              "-" if v["delta_pct"] is None else f"{v['delta_pct']:+.1f}%"] for label, v in rows],
            {1, 2, 3, 4},
        ))  # fmt: skip
        n = diff_doc["noise"]
        page.add(
            f'<p class="note">Steps: {_e(diff_doc["steps"]["name"] or "(whole run)")}; noise: {_e(n["reason"])}.</p>'
        )
        page.figure(_waterfall_figure(diff_doc), "waterfall")
        page.add(_table(
            ["#", "delta", "share", "category", "name", "baseline", "candidate"],
            [[t["rank"], duration(t["delta_ns"]), _pct(t["share"]), t["category"], _short(t["name"], 120),
              duration(t["baseline_ns"]), duration(t["candidate_ns"])] for t in diff_doc["contributors"]],
            {0, 1, 2, 5, 6},
        ))  # fmt: skip

    if findings:
        page.add('<h2 id="tk-details">Findings in detail</h2>' + "".join(_finding_html(f, origin) for f in findings))

    errors = '<pre id="tk-errors"></pre><script>(window.__tkPending || []).forEach(window.__tkRecord);</script>'
    head = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f'<meta name="tracekit-figures" content="{page.figures}">'
        f"<style>{_CSS}</style>{_ERROR_HOOK}"
        + (f"<script>{get_plotlyjs()}</script>" if page.figures else "")
        + "</head>"
    )
    intro = (
        f'<body data-figures="{page.figures}"><h1>{_e(title)}</h1>{errors}'
        f'<p class="note">tracekit {_e(report.get("tracekit_version"))}; {len(runs)} run(s); '
        f"{page.figures} figure(s); figure axes in ms.</p>"
    )
    return head + intro + "".join(page.parts) + "</body></html>\n", page.figures
