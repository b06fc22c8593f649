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
from dataclasses import dataclass, replace

from tracekit.render import labels
from tracekit.render import timeline as tl
from tracekit.units import duration, share

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
# timeline geometry: a block fully busy is BAR_THICKNESS of its lane thick, a block busy 5% of its
# extent 5% of that, so that the ink drawn is the busy time and never more
BAR_THICKNESS = 0.8
# Plotly widens an opaque bar thinner than 2 px to whole pixels, which would draw tiny kernels as
# more busy than they were; a colour a little short of opaque is drawn at its exact size
BAR_ALPHA = 0.92
LANE_PX = 32
LABEL_ROW_PX = 16
LABEL_NUMBERS = 4  # findings named in one label; the rest of a shared window's are counted (all in the hover)
TRACK_GAP_PX = 28
TOP_PX = 56  # the title
BOTTOM_PX = 86  # the time axis, its title and the legend

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


def _signed(ns) -> str:
    return ("+" if ns > 0 else "") + duration(ns)


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


@dataclass
class _Track:
    """One run's lanes in a timeline figure; a figure stacks several on one time axis."""

    name: str | None  # prefixes the lane labels when the figure holds more than one run
    timeline: tl.Timeline
    findings: list[dict]


@dataclass
class _Mark:
    """The finding windows that share one span of a track: one band, one label."""

    lo_ns: int
    hi_ns: int
    text: str  # what the label shows: the findings' numbers in the findings table
    html: str
    hover: str
    color: str


def _translucent(hex_color: str, alpha: float = BAR_ALPHA) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _marks(t: tl.Timeline, findings: list[dict], numbers: dict[str, int]) -> list[_Mark]:
    spans: dict[tuple[int, int], list[dict]] = {}
    for f in findings:
        w = f["locality"].get("window_ns")
        if not w:
            continue
        lo, hi = max(int(w[0]), t.lo_ns), min(int(w[1]), t.hi_ns)
        if hi > lo:
            spans.setdefault((lo, hi), []).append(f)
    out = []
    severities = list(SEVERITY_COLORS)
    for (lo, hi), fs in sorted(spans.items()):
        fs.sort(key=lambda f: numbers[f["id"]])
        color = SEVERITY_COLORS[min((f["severity"] for f in fs), key=severities.index)]
        # plotly colours links its own blue unless the link says otherwise
        shown = fs[:LABEL_NUMBERS]
        links = [
            f'<a href="#{_e(f["id"])}" target="_self" style="color:{color}">#{numbers[f["id"]]}</a>' for f in shown
        ]
        more = f" +{len(fs) - len(shown)}" if len(fs) > len(shown) else ""
        text = ", ".join(f"#{numbers[f['id']]}" for f in shown) + more
        hover = "<br>".join(f"#{numbers[f['id']]} {_e(f['id'])}: {_e(_short(f['title'], 100))}" for f in fs)
        out.append(_Mark(lo, hi, text, ", ".join(links) + more, hover, color))
    return out


def _timeline_figure(tracks: list[_Track], lo_ns: int, hi_ns: int, origin_ns: int, origin_what: str,
                     numbers: dict[str, int], title: str):  # fmt: skip
    """Every track on one time axis from lo_ns to hi_ns (ms from origin_ns): one subplot per track,
    stacked, their x axes matched so that zooming one zooms all. A block's bar is as thick as its
    busy share, so its area is its busy time; finding windows are bands labelled with their numbers,
    the labels in rows that keep them apart."""
    import plotly.graph_objects as go

    fig = go.Figure()
    laid = []
    for track in tracks:
        marks = _marks(track.timeline, track.findings, numbers)
        placed = labels.place([(m.lo_ns, m.hi_ns, m.text) for m in marks], lo_ns, hi_ns)
        rows = 1 + max((p.row for p in placed), default=-1)
        laid.append((track, marks, placed, rows * LABEL_ROW_PX, max(1, len(track.timeline.lanes)) * LANE_PX))
    plot_px = sum(band + lanes for *_, band, lanes in laid) + TRACK_GAP_PX * (len(laid) - 1)
    x_range = [(lo_ns - origin_ns) / 1e6, (hi_ns - origin_ns) / 1e6]
    layout: dict = {}
    shapes, annotations, in_legend = [], [], set()
    top = 0
    for i, (track, marks, placed, band, lanes_px) in enumerate(laid, 1):
        t = track.timeline
        suffix = "" if i == 1 else str(i)
        xref, yref = f"x{suffix}", f"y{suffix}"
        window = max(1, t.hi_ns - t.lo_ns)
        names = {}
        for lane in t.lanes:
            label = f"{lane.label} · busy {share(lane.busy_ns / window)}"
            names[lane.key, lane.kind] = f"{track.name}: {label}" if track.name else label
        by_cat: dict[str, dict[str, list]] = {}
        for lane in t.lanes:
            for b in lane.blocks:
                d = by_cat.setdefault(b.category, {"y": [], "x": [], "base": [], "width": [], "text": []})
                extent = b.end_ns - b.start_ns
                d["y"].append(names[lane.key, lane.kind])
                d["x"].append(max(extent, 1) / 1e6)
                d["base"].append((b.start_ns - origin_ns) / 1e6)
                d["width"].append(BAR_THICKNESS * b.busy_share)
                merged = f"{b.slices} slices, " if b.slices > 1 else ""
                d["text"].append(
                    f"{_e(_short(b.name, 70))}<br>{duration(extent)} from {duration(b.start_ns - origin_ns)}"
                    f"<br>{merged}busy {duration(b.busy_ns)} ({share(b.busy_share)})"
                )
        for cat in tl.CATEGORIES:
            d = by_cat.get(cat)
            if not d:
                continue
            fig.add_trace(
                go.Bar(
                    y=d["y"], x=d["x"], base=d["base"], width=d["width"], orientation="h", name=cat,
                    legendgroup=cat, showlegend=cat not in in_legend, marker_color=_translucent(COLORS[cat]),
                    marker_line_width=0, hovertext=d["text"], hoverinfo="text", xaxis=xref, yaxis=yref,
                )
            )  # fmt: skip
            in_legend.add(cat)
        for m, p in zip(marks, placed):
            shapes.append({"type": "rect", "xref": xref, "yref": f"{yref} domain", "x0": (m.lo_ns - origin_ns) / 1e6,
                           "x1": (m.hi_ns - origin_ns) / 1e6, "y0": 0, "y1": 1, "fillcolor": m.color, "opacity": 0.08,
                           "line": {"width": 1, "color": m.color}, "layer": "below"})  # fmt: skip
            annotations.append({
                "xref": xref, "yref": f"{yref} domain", "y": 1,
                "x": ((m.lo_ns if p.anchor == "left" else m.hi_ns) - origin_ns) / 1e6, "xanchor": p.anchor,
                "yanchor": "bottom", "yshift": 2 + p.row * LABEL_ROW_PX, "text": m.html,
                "hovertext": m.hover, "showarrow": False, "font": {"size": 10, "color": m.color},
            })  # fmt: skip
        top += band
        lane_labels = [names[lane.key, lane.kind] for lane in t.lanes]
        layout[f"yaxis{suffix}"] = {
            "domain": [max(0.0, 1 - (top + lanes_px) / plot_px), 1 - top / plot_px], "anchor": xref,
            "categoryorder": "array", "categoryarray": list(reversed(lane_labels)), "automargin": True,
        }  # fmt: skip
        last = i == len(laid)
        layout[f"xaxis{suffix}"] = {
            "range": x_range, "anchor": yref, "showticklabels": last,
            **({"matches": "x"} if i > 1 else {}),
            **({"title": f"ms from {origin_what}"} if last else {}),
        }  # fmt: skip
        top += lanes_px + TRACK_GAP_PX
    fig.update_layout(
        title=title, barmode="overlay", height=TOP_PX + plot_px + BOTTOM_PX, shapes=shapes, annotations=annotations,
        margin={"l": 10, "r": 10, "t": TOP_PX, "b": BOTTOM_PX}, plot_bgcolor="white",
        legend={"orientation": "h", "yanchor": "top", "y": -(BOTTOM_PX - 24) / plot_px}, **layout,
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
            fig.add_trace(go.Bar(x=x, y=ys, name=cat, marker_color=COLORS[cat],
                                 hovertext=[duration(s[cat]) for s in bars], hovertemplate="%{hovertext}"))  # fmt: skip
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
        means = []
        for r in runs:
            s = steps.get(r["run_id"], [])
            means.append(sum(x[cat] for x in s) / len(s) if s else 0)
        if any(means):
            fig.add_trace(go.Bar(y=names, x=[m / 1e6 for m in means], name=cat, orientation="h",
                                 marker_color=COLORS[cat], hovertext=[duration(m) for m in means],
                                 hovertemplate="%{hovertext}"))  # fmt: skip
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
                name=_run_name(run), hoverinfo="text",
                hovertext=[f"{_e(_short(k['name'], 200))}<br>{duration(k['total_ns'])} in {k['count']:,} launches, "
                           f"mean {duration(k['mean_ns'])}" for k in ks],
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
    ns = [st["baseline"]["time_ns"]] + [t["delta_ns"] for t in terms]
    measure = ["absolute"] + ["relative"] * len(terms)
    if doc["unexplained_ns"]:
        x.append("unexplained (terms not listed)")
        ns.append(doc["unexplained_ns"])
        measure.append("relative")
    x.append("candidate step")
    ns.append(st["candidate"]["time_ns"])
    measure.append("total")
    y = [v / 1e6 for v in ns]
    text = [duration(v) if m != "relative" else _signed(v) for v, m in zip(ns, measure)]
    fig = go.Figure(
        go.Waterfall(
            x=x, y=y, measure=measure, connector={"line": {"color": "#999"}},
            increasing={"marker": {"color": "#d62728"}}, decreasing={"marker": {"color": "#2ca02c"}},
            totals={"marker": {"color": "#4C78A8"}}, hovertext=text,
            hovertemplate="%{x}<br>%{hovertext}<extra></extra>",
        )
    )  # fmt: skip
    pct = f" ({st['delta_pct']:+.1f}%)" if st.get("delta_pct") is not None else ""
    fig.update_layout(
        title=f"What explains the step-time delta: {_signed(st['delta_ns'])} per step{pct}", height=520,
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
    link = loc.get("link")
    parts = (
        [f"link rank {link['src_rank']} -> rank {link['dst_rank']} {link.get('transport') or ''}".rstrip()]
        if link
        else []
    )
    for key, label in (("run_label", ""), ("rank", "rank "), ("device", "GPU "), ("stream", "stream "),
                       ("thread_name", ""), ("op", "op "), ("kernel", "kernel "), ("step", "step ")):  # fmt: skip
        if loc.get(key) is not None:
            parts.append(f"{label}{_short(str(loc[key]), 80)}")
    return ", ".join(parts)


def _finding_html(f: dict, number: int, origins: dict[int, tuple[int, str]]) -> str:
    loc = f["locality"]
    color = SEVERITY_COLORS.get(f["severity"], "#999")
    w = loc.get("window_ns")
    when = ""
    if w and loc.get("run_id") in origins:
        o, what = origins[loc["run_id"]]
        when = f"; window {duration(w[0] - o)} to {duration(w[1] - o)} from {what}"
    obs, exp = f["observed"], f["expected"]
    code = loc.get("code_path")
    code_html = f"<p><b>Code path</b>: {_e(' <- '.join(code[:4]))}</p>" if code else ""
    caveats = "".join(f"<li>{_e(c)}</li>" for c in f.get("caveats") or [])
    params = json.dumps(f["evidence"].get("params") or {}, default=str)
    return f"""
<div class="finding" id="{_e(f["id"])}" style="border-left-color: {color}">
<h3>#{number} <span class="sev" style="background: {color}">{_e(f["severity"])}</span> {_e(f["title"])}</h3>
<p class="note">{_e(f["id"])} &middot; {_e(_where(loc))}{_e(when)} &middot; impact {duration(f["impact"]["time_ns"])}
({share(f["impact"]["share_of_window"])} of the window) &middot; confidence {f["confidence"]}</p>
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


def _shared_axis(runs: list[dict]) -> list[dict]:
    """The runs drawn on one time axis: the ranks of one job (two or more runs, each a different rank),
    so that what the ranks do at the same moment lines up; [] when there are none."""
    ranks = [r for r in runs if r.get("rank") is not None]
    return ranks if len(ranks) > 1 and len({r["rank"] for r in ranks}) == len(ranks) else []


def _time_origins(runs: list[dict], drawn: list[dict]) -> dict[int, tuple[int, str]]:
    """Per run, the 0 of its time axis and what it is: a run's own start, or for ranks on one axis the
    start of the earliest of them."""
    origins = {r["run_id"]: (r["start_ns"], "run start") for r in runs if r.get("start_ns") is not None}
    together = _shared_axis(drawn)
    if together:
        first = min(together, key=lambda r: (r["start_ns"], r["rank"]))
        for r in together:
            origins[r["run_id"]] = (first["start_ns"], f"the start of {_run_name(first)}, the earliest rank")
    return origins


def _timelines(page: _Page, con, drawn: list[dict], findings: list[dict], origins: dict[int, tuple[int, str]],
               max_blocks: int) -> None:  # fmt: skip
    """A whole-run figure per run (one for all the ranks on a shared axis), each run followed by its
    close-ups."""
    numbers = {f["id"]: i for i, f in enumerate(findings, 1)}
    per_run = max(200, max_blocks // len(drawn))
    tracks: dict[int, _Track] = {}
    for r in drawn:
        t = tl.build(con, r["run_id"], r["start_ns"], r["end_ns"], max_blocks=per_run // 2, pixels=4000)
        if t.lanes:
            run_findings = [f for f in findings if f["locality"].get("run_id") == r["run_id"]]
            tracks[r["run_id"]] = _Track(None, t, run_findings)
        else:
            page.add(f'<p class="note">{_e(_run_name(r))}: no timed events to draw.</p>')
    drawable = [r for r in drawn if r["run_id"] in tracks]
    together = _shared_axis(drawable)
    groups = ([together] if together else []) + [[r] for r in drawable if r not in together]
    for group in groups:
        origin, what = origins[group[0]["run_id"]]
        shown = [replace(tracks[r["run_id"]], name=_run_name(r) if len(group) > 1 else None) for r in group]
        slices, blocks = sum(s.timeline.slices for s in shown), sum(s.timeline.blocks for s in shown)
        omitted = sum(s.timeline.lanes_omitted for s in shown)
        extra = f"; {omitted} quieter threads not drawn" if omitted else ""
        if len(group) > 1:
            names = _e(", ".join(s.name for s in shown))
            title = f"{names} on one time axis ({slices:,} slices in {blocks:,} blocks{extra})"
            later = "; ".join(f"{_e(_run_name(r))} starts {duration(r['start_ns'] - origin)} later"
                              for r in group if r["start_ns"] > origin)  # fmt: skip
            page.add(f'<p class="note">The ranks share one time axis: 0 ms is {_e(what)}'
                     f"{'; ' + later if later else ''}.</p>")  # fmt: skip
        else:
            title = f"{_e(_run_name(group[0]))}: whole run ({slices:,} slices in {blocks:,} blocks{extra})"
        lo, hi = min(r["start_ns"] for r in group), max(r["end_ns"] for r in group)
        page.figure(_timeline_figure(shown, lo, hi, origin, what, numbers, title), "timeline")
        for r in group:
            _close_ups(page, con, r, tracks[r["run_id"]].findings, origins[r["run_id"]], numbers, per_run)


def _close_ups(page: _Page, con, r: dict, run_findings: list[dict], origin: tuple[int, str],
               numbers: dict[str, int], per_run: int) -> None:  # fmt: skip
    windows = []
    for f in run_findings:
        w = _detail_window(f, r["start_ns"], r["end_ns"], con)
        if w and w not in [seen for seen, _ in windows]:
            windows.append((w, f))
        if len(windows) >= DETAILS_PER_RUN:
            break
    for (lo, hi), f in windows:
        d = tl.build(con, r["run_id"], lo, hi, max_blocks=per_run // (2 * len(windows)), pixels=4000)
        if d.lanes:
            title = (f"{_e(_run_name(r))}: close-up on #{numbers[f['id']]} {_e(f['id'])} ({duration(hi - lo)}, "
                     f"{d.slices:,} slices in {d.blocks:,} blocks)")  # fmt: skip
            page.figure(
                _timeline_figure([_Track(None, d, run_findings)], lo, hi, *origin, numbers, title), "timeline-detail"
            )


def build(con, report: dict, diff_doc: dict | None = None, title: str = "tracekit report",
          max_blocks: int = MAX_BLOCKS) -> tuple[str, int]:  # fmt: skip
    """(the HTML page, number of figures). `report` is build_report's document; `diff_doc` run_diff's."""
    from plotly.offline import get_plotlyjs

    page = _Page()
    runs = report["runs"]
    summary = report["summary"]
    findings = report["findings"]
    drawn = [r for r in runs if r.get("start_ns") is not None and r.get("end_ns") is not None][:MAX_RUNS_DRAWN]
    origins = _time_origins(runs, drawn)

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
    if drawn:
        page.add("<h2>Timeline</h2>")
        page.add(
            '<p class="note">GPU streams and host threads (top-level events). Slices closer than about a pixel '
            "are merged into one block; a block is as thick as the share of it that is busy (full height: busy "
            "throughout; hover: its slices and busy time), and each lane's label gives its busy share of its "
            "run's window (of the close-up, in a close-up). Shaded bands are finding windows, labelled with "
            "their numbers in the findings table. Drag to zoom, double-click to reset.</p>"
        )
        _timelines(page, con, drawn, findings, origins, max_blocks)

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
                  share(k["share_of_gpu_busy"]), "yes" if k["is_communication"] else ""] for k in run["top_kernels"]],
                {1, 2, 3, 4, 5},
            ))  # fmt: skip
        if run["top_cpu_ops"]:
            page.add(f"<h3>CPU ops by self time: {_e(_run_name(run))}</h3>")
            page.add(_table(
                ["op", "input dims", "count", "self", "total", "mean", "self share of window"],
                [[o["name"], _short(o["input_dims"] or "", 80), o["count"], duration(o["self_ns"]), duration(o["total_ns"]),
                  duration(o["mean_ns"]), share(o["self_share_of_window"])] for o in run["top_cpu_ops"]],
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
            [[t["rank"], duration(t["delta_ns"]), share(t["share"]), t["category"], _short(t["name"], 120),
              duration(t["baseline_ns"]), duration(t["candidate_ns"])] for t in diff_doc["contributors"]],
            {0, 1, 2, 5, 6},
        ))  # fmt: skip

    if findings:
        page.add(
            '<h2 id="tk-details">Findings in detail</h2>'
            + "".join(_finding_html(f, i, origins) for i, f in enumerate(findings, 1))
        )

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
