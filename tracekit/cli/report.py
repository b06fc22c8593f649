"""Visual output commands (issue 6): report (self-contained HTML), annotate (findings on the trace)."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.errors import TracekitError


def _analyse(traces, rule_keys, rank, max_findings):
    """Ingest into an in-memory database and run the rules: (con, report document)."""
    from tracekit import db
    from tracekit.engine.registry import get_rule
    from tracekit.engine.runner import run_rules
    from tracekit.findings.report import build_report
    from tracekit.findings.time_summary import top_costs
    from tracekit.ingest.pipeline import ingest

    select = [k.strip() for k in rule_keys.split(",") if k.strip()] if rule_keys else None
    try:
        for key in select or []:
            get_rule(key)
    except KeyError as e:
        raise TracekitError(str(e.args[0])) from None
    if max_findings is not None and max_findings < 0:
        raise TracekitError("--max-findings must be at least 0")
    if any(Path(t).suffix == ".duckdb" for t in traces):
        raise TracekitError("pass trace files, not a .duckdb database")
    con = db.connect(None)
    ingest(con, [Path(t) for t in traces], rank=rank)
    try:
        findings, notes = run_rules(con, select, None)
    except (KeyError, ValueError) as e:
        raise TracekitError(str(e.args[0] if e.args else e)) from None
    limit = len(findings) if max_findings is None else max_findings
    return con, build_report(con, findings, notes, top_costs(con), max_findings=limit)


def _check_out(out: Path, suffixes: tuple[str, ...]) -> None:
    if not out.name.endswith(suffixes):
        raise TracekitError(f"{out}: the output name should end in {' or '.join(suffixes)}")
    if not out.parent.exists():
        raise TracekitError(f"{out}: directory {out.parent} does not exist")


def register(cli, group_cls, context) -> None:
    """Add this module's commands to the top-level click group."""

    @cli.command()
    @click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
    @click.option("-o", "--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
                  help="HTML file to write.")  # fmt: skip
    @click.option(
        "--baseline", "baselines", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
        help="Baseline trace (repeatable): add the waterfall of what explains the delta of TRACES against it.",
    )  # fmt: skip
    @click.option("--step", help="With --baseline: annotation that delimits a step (see `tracekit diff`).")
    @click.option("--rules", "rule_keys", help="Comma-separated rule codes or names (default: all).")
    @click.option("--max-findings", type=int, default=25, show_default=True, help="Cap on findings in the report.")
    @click.option("--rank", type=int, help="Rank for traces with none in distributedInfo or the file name.")
    @click.option("--title", default=None, help="Page title (default: the trace names).")
    def report(traces, out, baselines, step, rule_keys, max_findings, rank, title):
        """Write a self-contained HTML report: timeline around the findings, time per step, per-rank
        comparison, top kernels and ops, every finding with its evidence and next experiment, and with
        --baseline the waterfall of the step-time delta. Opens offline: nothing is fetched.

        \b
            tracekit report run.json.gz -o report.html
            tracekit report rank0.json.gz rank1.json.gz -o ranks.html
            tracekit report new.json.gz --baseline old.json.gz -o diff.html
        """
        from tracekit.render.html import build

        _check_out(out, (".html", ".htm"))
        if step and not baselines:
            raise TracekitError("--step needs --baseline")
        con, doc = _analyse(traces, rule_keys, rank, max_findings)
        diff_doc = None
        if baselines:
            from tracekit.compare.diff import run_diff

            diff_doc = run_diff(list(baselines), list(traces), step=step)
        name = title or "tracekit report: " + ", ".join(Path(t).name for t in traces)
        if baselines and not title:
            name += " vs " + ", ".join(Path(b).name for b in baselines)
        page, figures = build(con, doc, diff_doc, title=name)
        con.close()
        out.write_text(page, encoding="utf-8")
        click.echo(f"{out}: {figures} figures, {len(doc['findings'])} findings, {len(page) / 1e6:.1f} MB")

    @cli.command()
    @click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
    @click.option("-o", "--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
                  help="Annotated trace to write (.json or .json.gz).")  # fmt: skip
    @click.option("--rules", "rule_keys", help="Comma-separated rule codes or names (default: all).")
    @click.option("--max-findings", type=int, default=None, help="Annotate only the N top-ranked findings.")
    @click.option("--rank", type=int, help="Rank for a trace with none in distributedInfo or the file name.")
    def annotate(trace, out, rule_keys, max_findings, rank):
        """Write TRACE with a "tracekit findings" track: one slice per finding window, its args holding
        the finding. Open it in https://ui.perfetto.dev or chrome://tracing. The original events are
        copied unchanged; a non-Chrome input (e.g. an Nsight Systems export) is written as Chrome JSON.

        \b
            tracekit annotate run.pt.trace.json.gz -o annotated.json.gz
        """
        from tracekit.render.annotate import annotate as write_annotated

        _check_out(out, (".json", ".json.gz"))
        if out.resolve() == trace.resolve():
            raise TracekitError(f"{out}: the output would overwrite the input")
        con, doc = _analyse([trace], rule_keys, rank, max_findings)
        runs = con.execute("SELECT run_id, source, format, base_time_ns FROM runs ORDER BY run_id").fetchall()
        if len(runs) != 1:
            raise TracekitError(f"{trace}: expected one run, the input made {len(runs)}")
        run = dict(zip(("run_id", "source", "format", "base_time_ns"), runs[0]))
        if run["format"] in ("ncu_csv", "numerics_report"):
            raise TracekitError(f"{trace}: {run['format']} has no timeline to annotate; pass a trace")
        result = write_annotated(con, run, doc["findings"], out)
        con.close()
        click.echo(
            f"{out}: {result['slices']} finding slices on {result['lanes']} lane(s) of process "
            f"{result['pid']} ({result['mode']})"
        )
