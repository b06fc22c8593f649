"""The analyze report (a dict from the summarizer) -> text (rich), markdown or JSON."""

from __future__ import annotations

import sys

import orjson

REPORT_FORMATS = ("text", "json", "markdown")


def _ms(ns) -> str:
    return "-" if ns is None else f"{ns / 1e6:.2f} ms"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _where(loc: dict) -> str:
    parts = []
    if loc.get("rank") is not None:
        parts.append(f"rank {loc['rank']}")
    elif loc.get("run_label"):
        parts.append(loc["run_label"])
    for key, label in (("device", "gpu"), ("stream", "stream")):
        if loc.get(key) is not None:
            parts.append(f"{label} {loc[key]}")
    if loc.get("thread_name"):
        parts.append(loc["thread_name"])
    elif loc.get("tid") is not None:
        parts.append(f"tid {loc['tid']}")
    if loc.get("op"):
        parts.append(loc["op"])
    if loc.get("kernel"):
        parts.append(loc["kernel"][:80])
    return ", ".join(str(p) for p in parts)


def render(report: dict, fmt: str, out=None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        out.write(orjson.dumps(report, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")
    elif fmt == "markdown":
        out.write(to_markdown(report))
    else:
        to_text(report, out)


def to_markdown(report: dict) -> str:
    lines = ["# tracekit report", ""]
    lines += ["| run | rank | device | events | window |", "|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(
            f"| {r['label']} | {r['rank'] if r['rank'] is not None else '-'} | {r.get('device') or '-'} "
            f"| {r['events_ingested']} | {_ms(r['window_ns'])} |"
        )
    lines += ["", f"## Findings ({report['findings_total']})", ""]
    for i, f in enumerate(report["findings"], 1):
        loc = f["locality"]
        lines += [
            f"### {i}. [{f['severity']}] {f['rule']}: {f['title']}",
            "",
            f"- where: {_where(loc)}" + (f"; window {loc['window_ns']}" if loc.get("window_ns") else ""),
            f"- observed: {f['observed']['value']} {f['observed']['unit']} ({f['observed'].get('what', '')})",
            f"- expected: {f['expected']['value']} {f['expected']['unit']} ({f['expected'].get('what', '')})",
            f"- impact: {_ms(f['impact']['time_ns'])} = {_pct(f['impact']['share_of_window'])} of the window",
            f"- hypothesis: {f['hypothesis']}",
            f"- next experiment: {f['next_experiment']}",
            f"- acceptance: {f['acceptance']}",
            f"- id: `{f['id']}`; confidence {f['confidence']}",
        ]
        if loc.get("code_path"):
            lines.append("- code path: " + " <- ".join(f"`{p}`" for p in loc["code_path"]))
        for c in f["caveats"]:
            lines.append(f"- caveat: {c}")
        lines += [
            "",
            "```sql",
            f["evidence"]["sql"],
            "```",
            f"params: `{orjson.dumps(f['evidence']['params']).decode()}`",
            "",
        ]
    if report["data_quality"]:
        lines += ["## Data quality", ""] + [f"- {d['rule']}: {d['message']}" for d in report["data_quality"]]
    lines += ["", _summary_markdown(report.get("summary") or {})]
    return "\n".join(lines) + "\n"


def _summary_markdown(summary: dict) -> str:
    out = []
    for run in summary.get("runs", []):
        kernels = run.get("top_kernels") or []
        if kernels:
            out += [
                f"## Top kernels: {run.get('label', run.get('run_id'))}",
                "",
                "| kernel | count | total | mean |",
                "|---|---|---|---|",
            ]
            for k in kernels:
                out.append(f"| {k['name'][:90]} | {k['count']} | {_ms(k['total_ns'])} | {k['mean_ns'] / 1e3:.1f} us |")
            out.append("")
    return "\n".join(out)


def to_text(report: dict, out) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=None if out.isatty() else 120, highlight=False)
    runs = Table(title="runs", header_style="bold")
    for col in ("run", "rank", "device", "events", "skipped", "window"):
        runs.add_column(col)
    for r in report["runs"]:
        runs.add_row(
            str(r["label"]),
            "-" if r["rank"] is None else str(r["rank"]),
            str(r.get("device") or "-"),
            str(r["events_ingested"]),
            str(r["events_skipped"]),
            _ms(r["window_ns"]),
        )
    console.print(runs)
    for run in (report.get("summary") or {}).get("runs", []):
        kernels = run.get("top_kernels") or []
        if not kernels:
            continue
        t = Table(title=f"top kernels: {run.get('label', run.get('run_id'))}", header_style="bold")
        for col in ("kernel", "count", "total", "mean"):
            t.add_column(col, overflow="fold")
        for k in kernels[:5]:
            t.add_row(k["name"][:70], str(k["count"]), _ms(k["total_ns"]), f"{k['mean_ns'] / 1e3:.1f} us")
        console.print(t)
    colors = {"critical": "red", "warning": "yellow", "info": "cyan"}
    counts = report["severity_counts"]
    console.print(
        f"\n[bold]{report['findings_total']} findings[/bold] "
        f"({counts['critical']} critical, {counts['warning']} warning, {counts['info']} info)"
    )
    for i, f in enumerate(report["findings"], 1):
        c = colors[f["severity"]]
        console.print(f"\n[{c}]{i}. {f['severity'].upper()} {f['rule']}[/{c}] {f['title']}")
        console.print(f"   where:  {_where(f['locality'])}")
        console.print(
            f"   impact: {_ms(f['impact']['time_ns'])} ({_pct(f['impact']['share_of_window'])} of window), "
            f"confidence {f['confidence']}"
        )
        if f["locality"].get("code_path"):
            console.print("   code:   " + " <- ".join(f["locality"]["code_path"][:3]))
        console.print(f"   next:   {f['next_experiment']}")
        console.print(f"   check:  {f['acceptance']}")
    if report["findings_omitted"]:
        console.print(f"\n({report['findings_omitted']} lower-ranked findings omitted; --max-findings raises the cap)")
    for d in report["data_quality"]:
        console.print(f"[dim]data quality: {d['rule']}: {d['message']}[/dim]")
