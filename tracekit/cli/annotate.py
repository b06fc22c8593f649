"""`tracekit annotate`: the trace with a track of findings, for Perfetto / chrome://tracing (docs/report.md)."""

from __future__ import annotations

import click

from tracekit.cli.options import CONTEXT, INPUT, OUTPUT, check_output, rank_option, rules_option, verbosity_options
from tracekit.errors import TracekitError


@click.command("annotate", context_settings=CONTEXT)
@click.argument("trace", type=INPUT)
@click.option("-o", "--output", "--out", "out", required=True, type=OUTPUT,
              help="Annotated trace to write (.json or .json.gz).")  # fmt: skip
@rules_option
@click.option("--max-findings", type=int, default=None, help="Annotate only the N top-ranked findings.")
@rank_option
@verbosity_options
def command(trace, out, rule_keys, max_findings, rank):
    """Write TRACE with a "tracekit findings" track: one slice per finding window, its args holding
    the finding. Open it in https://ui.perfetto.dev or chrome://tracing. The original events are
    copied unchanged; a non-Chrome input (e.g. an Nsight Systems export) is written as Chrome JSON.

    \b
        tracekit annotate run.pt.trace.json.gz -o annotated.json.gz
    """
    from tracekit import api
    from tracekit.cli.console import open_inputs, status

    check_output(out, (".json", ".json.gz"))
    if out.resolve() == trace.resolve():
        raise TracekitError(f"{out}: the output would overwrite the input")
    if api.is_database(trace):
        raise TracekitError(f"{trace}: annotate writes a trace file's events: pass the trace, not a database")
    if max_findings is not None and max_findings < 0:
        raise TracekitError("--max-findings must be at least 0")
    api.analysis_key(rule_keys)
    with open_inputs([trace], rank=rank) as opened:
        result = opened.annotate(out, rules=rule_keys, max_findings=max_findings)
    status(
        f"{out}: {result['slices']} finding slices on {result['lanes']} lane(s) of process "
        f"{result['pid']} ({result['mode']})"
    )
