"""`tracekit diff`: a baseline against a candidate: where the time delta comes from, its noise, and
acceptance verdicts (docs/diff.md)."""

from __future__ import annotations

import contextlib
import sys

import click

from tracekit.cli.options import (
    ACCEPT_HELP,
    CONTEXT,
    INPUT,
    check_accepts,
    check_output,
    output_options,
)
from tracekit.errors import TracekitError
from tracekit.render.report import REPORT_FORMATS


@click.command("diff", context_settings=CONTEXT)
@click.argument("traces", nargs=-1, type=INPUT)
@click.option(
    "-b", "--baseline", "baselines", multiple=True, type=INPUT, help="Baseline trace; repeat for several ranks or runs."
)
@click.option(
    "-c",
    "--candidate",
    "candidates",
    multiple=True,
    type=INPUT,
    help="Candidate trace; repeat for several ranks or runs.",
)
@click.option(
    "--step",
    help="Annotation that delimits a step (a trailing #N is ignored). Default: ProfilerStep#N, else the most "
    "frequent top-level user annotation, else the whole run.",
)
@click.option(
    "--baseline-step",
    "baseline_steps",
    metavar="GLOB",
    help="Compare the steps whose name (or annotation as written) matches GLOB as the baseline, against "
    "--candidate-step; with one TRACE both groups come from it.",
)
@click.option("--candidate-step", "candidate_steps", metavar="GLOB", help="The candidate's steps, as --baseline-step.")
@click.option("--accept", "accepts", multiple=True, metavar="EXPR", help=ACCEPT_HELP)
@click.option("--top", type=int, default=15, show_default=True, help="Contributors listed per scope.")
@output_options(REPORT_FORMATS, output=True)
def command(traces, baselines, candidates, step, baseline_steps, candidate_steps, accepts, top, fmt, output):
    """Compare a baseline with a candidate: the time delta (end to end, per step, per phase), the kernels,
    idle time, ops, threads and streams that account for it, its noise, and acceptance verdicts.

    Pass BASELINE CANDIDATE (one trace each), or -b/-c once per trace for several ranks or runs. Either
    side may be a .duckdb database instead (its runs are copied, not parsed again). With
    --baseline-step/--candidate-step, one TRACE compares two groups of its own steps (serial against
    overlapped steps of the same layers), two compare the first's baseline steps with the second's.
    Exit codes: 0 every --accept passed, 1 one failed (or the runs are not comparable), 2 bad input or usage.

    \b
        tracekit diff eager.json.gz graph.json.gz --accept "step_time <= +5%" --accept "idle <= 1ms"
        tracekit diff -b a_rank0.json.gz -b a_rank1.json.gz -c b_rank0.json.gz -c b_rank1.json.gz -f json
        tracekit diff old.json.gz new.json.gz --step decode_step --accept "phase:prefill <= +2%"
        tracekit diff run.json.gz --baseline-step "serial*" --candidate-step "overlap*" --accept "step_time <= +5%"
    """
    from tracekit import api
    from tracekit.cli.console import open_inputs

    if traces and (baselines or candidates):
        raise TracekitError("pass BASELINE CANDIDATE, or --baseline/--candidate options, not both")
    grouped = baseline_steps is not None or candidate_steps is not None
    if grouped and (baseline_steps is None or candidate_steps is None):
        raise TracekitError("--baseline-step and --candidate-step go together: pass both")
    if grouped and step:
        raise TracekitError("--step and --baseline-step/--candidate-step select steps two ways: pass one")
    if grouped and len(traces) == 1:
        check_accepts(accepts)
        check_output(output)
        with open_inputs(traces) as trace:
            doc = trace.diff(trace, accept=accepts, top=top, baseline_steps=baseline_steps,
                             candidate_steps=candidate_steps)  # fmt: skip
        _write(doc, fmt, output)
        return
    if traces:
        if len(traces) != 2:
            raise TracekitError(
                f"expected BASELINE CANDIDATE (2 traces), got {len(traces)}; use -b/-c once per trace for more"
            )
        baselines, candidates = (traces[0],), (traces[1],)
    if not baselines or not candidates:
        raise TracekitError("need a baseline and a candidate: BASELINE CANDIDATE, or -b PATH -c PATH")
    if top < 1:
        raise TracekitError("--top must be at least 1")
    check_accepts(accepts)
    check_output(output)
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(open_inputs(baselines, labels=api.side_labels("baseline", baselines)))
        labels = api.side_labels("candidate", candidates)
        if any(api.is_database(p) for p in [*baselines, *candidates]):
            cand = stack.enter_context(open_inputs(candidates, labels=labels))  # compared in a scratch copy
        else:
            cand = open_inputs(candidates, into=base, labels=labels, same_content="keep")  # one database: in place
        doc = cand.diff(base, step=step, accept=accepts, top=top, baseline_steps=baseline_steps,
                        candidate_steps=candidate_steps)  # fmt: skip
    _write(doc, fmt, output)


def _write(doc: dict, fmt: str, output) -> None:
    from tracekit.cli.console import output as output_stream
    from tracekit.compare.diff import render

    with output_stream(output) as out:
        out.write(render(doc, fmt))
    if not doc["passed"]:
        sys.exit(1)
