"""`tracekit report`: the self-contained HTML report (docs/report.md)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from tracekit.cli.options import (
    CONTEXT,
    INPUT,
    OUTPUT,
    check_output,
    rank_option,
    rules_option,
    step_option,
    verbosity_options,
)  # fmt: skip
from tracekit.errors import TracekitError


@click.command("report", context_settings=CONTEXT)
@click.argument("traces", nargs=-1, required=True, type=INPUT)
@click.option("-o", "--output", "--out", "out", required=True, type=OUTPUT, help="HTML file to write.")
@click.option(
    "--baseline", "baselines", multiple=True, type=INPUT,
    help="Baseline trace (repeatable): add the waterfall of what explains the delta of TRACES against it.",
)  # fmt: skip
@step_option
@rules_option
@click.option("--max-findings", type=int, default=25, show_default=True, help="Cap on findings in the report.")
@rank_option
@click.option("--title", default=None, help="Page title (default: the trace names).")
@verbosity_options
def command(traces, out, baselines, step, rule_keys, max_findings, rank, title):
    """Write a self-contained HTML report: timeline around the findings, time per step, per-rank
    comparison, top kernels and ops, every finding with its evidence and next experiment, and with
    --baseline the waterfall of the step-time delta. Opens offline: nothing is fetched.

    \b
        tracekit report run.json.gz -o report.html
        tracekit report rank0.json.gz rank1.json.gz -o ranks.html
        tracekit report new.json.gz --baseline old.json.gz -o diff.html
    """
    from tracekit import api
    from tracekit.cli.console import open_inputs, status, timed
    from tracekit.errors import require_extra

    require_extra("plotly", "report", "tracekit report")
    check_output(out, (".html", ".htm"))
    if step and not baselines:
        raise TracekitError("--step needs --baseline")
    if max_findings < 0:
        raise TracekitError("--max-findings must be at least 0")
    api.analysis_key(rule_keys)  # an unknown rule fails before any ingest
    name = title or "tracekit report: " + ", ".join(Path(t).name for t in traces)
    if baselines and not title:
        name += " vs " + ", ".join(Path(b).name for b in baselines)
    with contextlib.ExitStack() as stack:
        trace = stack.enter_context(open_inputs(traces, rank=rank))
        base = None
        if baselines:
            base = stack.enter_context(open_inputs(baselines, labels=api.side_labels("baseline", baselines)))
        with timed("report"):
            written = trace.report(
                out, rules=rule_keys, max_findings=max_findings, baseline=base, step=step, title=name
            )
    status(f"{out}: {written['figures']} figures, {written['findings']} findings, {written['bytes'] / 1e6:.1f} MB")
