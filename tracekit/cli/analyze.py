"""`tracekit analyze`: ingest (or open a database), run the rules, print the ranked findings; with
--baseline, the diff and each finding's status against it."""

from __future__ import annotations

import contextlib
import sys

import click

from tracekit.cli.options import (
    CONTEXT,
    INPUT,
    check_accepts,
    check_output,
    cluster_options,
    metric_option,
    offset_option,
    output_options,
    param_option,
    parse_params,
    rank_option,
    rules_option,
    step_option,
)  # fmt: skip
from tracekit.errors import TracekitError
from tracekit.render.report import REPORT_FORMATS


@click.command("analyze", context_settings=CONTEXT)
@click.argument("traces", nargs=-1, required=True, type=INPUT)
@output_options(REPORT_FORMATS + ("feedback",), output=True,
                help="feedback: ranked, deduplicated records for an agent (JSON, see docs/agents.md).")  # fmt: skip
@rules_option
@click.option(
    "--db", "db_path", type=click.Path(dir_okay=False), help="Keep the database (and its findings) in this file."
)
@click.option("--fail-on", type=click.Choice(["info", "warning", "critical"]), help="Exit 1 on a finding this severe.")
@param_option
@rank_option
@click.option("--max-findings", type=int, default=25, show_default=True, help="Cap on findings in the report.")
@offset_option
@metric_option
@click.option(
    "--baseline", "baselines", multiple=True, type=INPUT,
    help="Baseline trace (repeatable): add a diff of TRACES against it (see `tracekit diff`).",
)  # fmt: skip
@step_option
@click.option("--accept", "accepts", multiple=True, metavar="EXPR",
              help="With --baseline: acceptance criterion (see `tracekit diff`).")  # fmt: skip
@click.option("--budget-tokens", type=click.IntRange(min=200), help="With --format feedback: token budget.")
@click.option(
    "--llm", is_flag=True, help="With --format feedback: a model writes the prose (checked; see docs/agents.md)."
)
@click.option("--base-url", envvar="OPENAI_BASE_URL", help="With --llm: OpenAI-compatible endpoint.")
@click.option("--model", help="With --llm: model id, e.g. glm-4.6.")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="With --llm: env var of the API key.")
@cluster_options
def command(
    traces, fmt, output, rule_keys, db_path, fail_on, params, rank, max_findings, metrics, baselines, step, accepts,
    budget_tokens, llm, base_url, model, api_key_env, workers, scheduler, chunk_size,
):  # fmt: skip
    """Ingest traces (or open a .duckdb made by `ingest`), run the rules, print ranked findings.

    \b
        tracekit analyze run.json.gz
        tracekit analyze run.json.gz --format json --rules host-sync,G001 --param G001.min_idle_share=0.1
        tracekit analyze new.json.gz --baseline old.json.gz --accept "step_time <= +5%"
        tracekit analyze /shared/traces/rank*.json.gz --workers 8       # map/reduce over ranks (docs/cluster.md)
    """
    from tracekit import api
    from tracekit.cli.console import open_inputs, rule_timings, timed
    from tracekit.cli.console import output as output_stream
    from tracekit.findings.model import SEVERITY_RANK
    from tracekit.findings.report import worst_severity

    overrides = parse_params(params)
    api.analysis_key(rule_keys, overrides)  # unknown rules and parameters fail before any ingest
    if (step or accepts) and not baselines:
        raise TracekitError("--step and --accept need --baseline")
    if (budget_tokens or llm) and fmt != "feedback":
        raise TracekitError("--budget-tokens and --llm need --format feedback")
    if llm and not model:
        raise TracekitError("--llm needs --model (and --base-url for a provider other than OpenAI)")
    if baselines and any(api.is_database(t) for t in traces):
        raise TracekitError("--baseline compares trace files: pass the candidate's trace files, not a .duckdb")
    check_accepts(accepts)
    check_output(output)
    if workers is not None or scheduler:
        return _cluster(traces, fmt, output, rule_keys, overrides, db_path, fail_on, rank, max_findings, metrics,
                        baselines, llm, budget_tokens, workers, scheduler, chunk_size)  # fmt: skip
    client = _llm_client(base_url, api_key_env) if llm else None
    with contextlib.ExitStack() as stack:
        trace = stack.enter_context(open_inputs(traces, db=db_path, rank=rank, metrics=metrics))
        with timed("rules and summary"):
            report = trace.report_document(rule_keys, overrides, max_findings)
        analysis = trace.analysis(rule_keys, overrides)  # the report's, kept
        rule_timings(analysis.timings)
        findings = analysis.findings
        base = diff_doc = status_doc = None
        if baselines:
            base = stack.enter_context(open_inputs(
                baselines, shifted=False, labels=api.side_labels("baseline", baselines), metrics=metrics
            ))  # fmt: skip
            with timed("diff and finding status"):
                diff_doc = trace.diff(base, step=step, accept=accepts)
                status_doc = trace.status(base, step=step, rules=rule_keys, params=overrides)
        with output_stream(output) as out:
            if fmt == "feedback":
                doc = trace.feedback(
                    budget_tokens, rule_keys, overrides, baseline=base, step=step, llm=client, model=model
                )
                _write_fenced(doc, out)
            else:
                _write_report(report, diff_doc, status_doc, fmt, out)
    worst = worst_severity(findings)
    if fail_on and worst and SEVERITY_RANK[worst] >= SEVERITY_RANK[fail_on]:
        sys.exit(1)
    if diff_doc is not None and not diff_doc["passed"]:
        sys.exit(1)


def _cluster(traces, fmt, output, rule_keys, overrides, db_path, fail_on, rank, max_findings, metrics, baselines,
             llm, budget_tokens, workers, scheduler, chunk_size):  # fmt: skip
    """The map/reduce path (tracekit.cluster): the same report, findings computed chunk by chunk;
    an input left out is said on stderr and the exit code is 2 once the report is out."""
    from tracekit.cli.console import detail
    from tracekit.cli.console import output as output_stream
    from tracekit.cli.options import offsets, verbosity
    from tracekit.cluster import analyze_job
    from tracekit.cluster.job import missing_line
    from tracekit.findings.model import SEVERITY_RANK

    refused = [name for name, given in (("--db", db_path), ("--baseline", baselines), ("--llm", llm),
                                        ("--offset", offsets())) if given]  # fmt: skip
    if refused:
        raise TracekitError(
            f"{', '.join(refused)}: not with --workers/--scheduler (the map/reduce path keeps no database)"
        )
    job = analyze_job(list(traces), workers=workers or None, scheduler=scheduler, rules=rule_keys, params=overrides,
                      chunk_size=chunk_size, rank=rank, metrics=metrics, progress=detail)  # fmt: skip
    c = job.cluster
    detail(f"cluster: {c['backend']}, {c['workers']} workers, {c['chunks']} chunks; map {c['map_seconds']} s, "
           f"reduce {c['reduce_seconds']} s; peak RSS per worker (MB): {c['peak_rss_mb']}")  # fmt: skip
    for m in job.missing:
        click.echo(f"error: not analysed: {missing_line(m)}", err=True)
    if verbosity() >= 0:
        for d in c["duplicates"]:
            click.echo(f"note: {d}", err=True)
    with output_stream(output) as out:
        if fmt == "feedback":
            from tracekit.findings.feedback import build_feedback

            _write_fenced(build_feedback(job.records, budget_tokens), out)
        else:
            _write_report(job.report_document(max_findings), None, None, fmt, out)
    if job.missing:
        sys.exit(2)
    worst = max((r["severity"] for r in job.records), key=SEVERITY_RANK.__getitem__, default=None)
    if fail_on and worst and SEVERITY_RANK[worst] >= SEVERITY_RANK[fail_on]:
        sys.exit(1)


def _write_report(report: dict, diff_doc: dict | None, status_doc: dict | None, fmt: str, out) -> None:
    from tracekit.compare.diff import render as render_diff
    from tracekit.findings.status import to_text as status_text
    from tracekit.render.report import render

    if diff_doc is not None and fmt == "json":
        report = {**report, "diff": diff_doc, "finding_status": status_doc}
    render(report, fmt, out)
    if diff_doc is not None and fmt != "json":
        out.write("\n" + render_diff(diff_doc, fmt) + status_text(status_doc))


def _write_fenced(doc: dict, out) -> None:
    # the records go to models, and their names come from the trace: fenced as data, as the tools send them
    from tracekit.findings.fence import fence

    out.write(fence(doc, "feedback", indent=2) + "\n")


def _llm_client(base_url: str | None, api_key_env: str):
    import os

    from tracekit.errors import require_extra

    require_extra("openai", "agent", "analyze --llm")
    key = os.environ.get(api_key_env)
    if not key:
        raise TracekitError(f"--llm: no API key: set {api_key_env} (or pass --api-key-env NAME)")
    from tracekit.agent.client import openai_client

    return openai_client(base_url, key)
