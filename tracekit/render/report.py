"""The analyze report (build_report's document) -> text (rich), markdown or JSON.

Text follows the terminal width (COLUMNS when piped) and cuts long names with an ellipsis; durations
read by magnitude (4.70 us, 12.3 ms, 1.52 s) in text and markdown alike; JSON keeps integer ns.
"""

from __future__ import annotations

import shutil
import sys

import orjson

from tracekit.render import many_runs
from tracekit.units import duration, share

REPORT_FORMATS = ("text", "json", "markdown")


def _where(loc: dict) -> str:
    parts = []
    link = loc.get("link")
    if link:
        parts.append(f"link rank {link['src_rank']} -> rank {link['dst_rank']}"
                     + (f" ({link['transport']})" if link.get("transport") else ""))  # fmt: skip
    elif loc.get("rank") is not None:
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
        parts.append(_cut(loc["kernel"], 80))
    return ", ".join(str(p) for p in parts)


def _cut(name: str, limit: int) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def render(report: dict, fmt: str, out=None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        out.write(orjson.dumps(report, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")
    elif fmt == "markdown":
        out.write(to_markdown(report))
    else:
        to_text(report, out)


def _also(same: dict) -> str:
    """`the same on 31 more ranks (of ranks 0-31); impact 46.1 ms-46.7 ms`."""
    return (f"the same on {len(same['ids'])} more ranks (of ranks {many_runs.rank_ranges(same['ranks'])}); "
            f"impact {many_runs.span(*same['impact_ns'], duration)}")  # fmt: skip


def to_markdown(report: dict) -> str:
    lines = ["# tracekit report", ""]
    if many_runs.folded(report):
        columns, rows = many_runs.run_groups(report["runs"])
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    else:
        lines += ["| run | rank | device | events | window |", "|---|---|---|---|---|"]
        for r in report["runs"]:
            lines.append(
                f"| {r['label']} | {r['rank'] if r['rank'] is not None else '-'} | {r.get('device') or '-'} "
                f"| {r['events_ingested']} | {duration(r['window_ns'])} |"
            )
    lines += ["", f"## Findings ({report['findings_total']})", ""]
    for i, f in enumerate(report["findings"], 1):
        loc = f["locality"]
        lines += [
            f"### {i}. [{f['severity']}] {f['rule']}: {f['title']}",
            "",
            f"- where: {_where(loc)}" + (f"; window {loc['window_ns']}" if loc.get("window_ns") else ""),
            *(
                [f"- also: {_also(report['same_on_ranks'][f['id']])}"]
                if f["id"] in report.get("same_on_ranks", {})
                else []
            ),
            f"- observed: {f['observed']['value']} {f['observed']['unit']} ({f['observed'].get('what', '')})",
            f"- expected: {f['expected']['value']} {f['expected']['unit']} ({f['expected'].get('what', '')})",
            f"- impact: {duration(f['impact']['time_ns'])} = {share(f['impact']['share_of_window'])} of the window",
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
    lines += ["", _summary_markdown(report.get("summary") or {}, many_runs.folded(report))]
    return "\n".join(lines) + "\n"


def _summary_markdown(summary: dict, fold: bool = False) -> str:
    out = []
    if fold:
        listed, rows = many_runs.kernel_totals(summary.get("runs", []))
        if not rows:
            return ""
        out += [
            f"## Top kernels over {listed} runs (each run's top 5; one run: its least and most time)",
            "",
            "| " + " | ".join(many_runs.KERNEL_COLUMNS) + " |",
            "|" + "---|" * len(many_runs.KERNEL_COLUMNS),
        ]
        out += [f"| {_cut(n, 90)} | {runs} | {count} | {duration(total)} | {duration(mean)} | {one} |"
                for n, runs, count, total, mean, one in rows]  # fmt: skip
        return "\n".join(out) + "\n"
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
                out.append(
                    f"| {_cut(k['name'], 90)} | {k['count']} | {duration(k['total_ns'])} | {duration(k['mean_ns'])} |"
                )
            out.append("")
    return "\n".join(out)


def to_text(report: dict, out) -> None:
    from rich.console import Console
    from rich.markup import escape

    from tracekit.render.tables import table

    width = shutil.get_terminal_size().columns
    console = Console(file=out, width=None if out.isatty() else width, highlight=False)
    console.print("[bold]runs[/bold]")
    if many_runs.folded(report):
        columns, rows = many_runs.run_groups(report["runs"])
        out.write(table(columns, rows, width))
        console.print(f"[dim]({len(report['runs'])} runs, one row per device: `--format json` lists each)[/dim]")
    else:
        rows = [
            (r["label"], "-" if r["rank"] is None else r["rank"], r.get("device") or "-", r["events_ingested"],
             r["events_skipped"], r["window_ns"])
            for r in report["runs"]
        ]  # fmt: skip
        out.write(table(["run", "rank", "device", "events", "skipped", "window"], rows, width, {"window": duration}))
    # measured checks come before the findings they undermine; rules that did not run are a footnote
    measured = [d for d in report["data_quality"] if d.get("check")]
    for d in measured:
        console.print(f"[yellow]data quality (run {d['run_id']}): {escape(d['message'])}[/yellow]")
    summary_runs = (report.get("summary") or {}).get("runs", [])
    if many_runs.folded(report):
        listed, rows = many_runs.kernel_totals(summary_runs)
        if rows:
            console.print(
                f"\n[bold]top kernels over {listed} runs[/bold] (each run's top 5; one run: its least and most time)"
            )
            out.write(table(many_runs.KERNEL_COLUMNS, rows, width, {"total": duration, "mean": duration}))
        summary_runs = []
    for run in summary_runs:
        kernels = run.get("top_kernels") or []
        if not kernels:
            continue
        console.print(f"\n[bold]top kernels: {escape(str(run.get('label', run.get('run_id'))))}[/bold]")
        rows = [(k["name"], k["count"], k["total_ns"], k["mean_ns"]) for k in kernels[:5]]
        out.write(table(["kernel", "count", "total", "mean"], rows, width, {"total": duration, "mean": duration}))
    colors = {"critical": "red", "warning": "yellow", "info": "cyan"}
    counts = report["severity_counts"]
    console.print(
        f"\n[bold]{report['findings_total']} findings[/bold] "
        f"({counts['critical']} critical, {counts['warning']} warning, {counts['info']} info)"
    )
    for i, f in enumerate(report["findings"], 1):
        c = colors[f["severity"]]
        console.print(f"\n[{c}]{i}. {f['severity'].upper()} {f['rule']}[/{c}] {escape(f['title'])}")
        console.print(f"   where:  {escape(_where(f['locality']))}")
        console.print(
            f"   impact: {duration(f['impact']['time_ns'])} ({share(f['impact']['share_of_window'])} of window), "
            f"confidence {f['confidence']}"
        )
        same = report.get("same_on_ranks", {}).get(f["id"])
        if same:
            console.print(f"   also:   {escape(_also(same))}")
        if f["locality"].get("code_path"):
            console.print("   code:   " + escape(" <- ".join(f["locality"]["code_path"][:3])))
        console.print(f"   next:   {escape(f['next_experiment'])}")
        console.print(f"   check:  {escape(f['acceptance'])}")
    if report.get("findings_folded"):
        console.print(f"\n({report['findings_folded']} findings are the same as one above on another rank: `also`)")
    if report["findings_omitted"]:
        console.print(f"\n({report['findings_omitted']} lower-ranked findings omitted; --max-findings raises the cap)")
    for d in report["data_quality"]:
        if not d.get("check"):
            console.print(f"[dim]data quality: {escape(d['rule'])}: {escape(d['message'])}[/dim]")
