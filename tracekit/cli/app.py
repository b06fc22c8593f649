"""tracekit command line: verbs over one trace database (ingest, sql, analyze, rules, schema).

Heavy modules (duckdb, rich) are imported inside commands so `tracekit --help` stays fast.
Exit codes: 0 ok, 1 a finding at or above --fail-on, 2 bad input or usage (one line, no traceback).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracekit.errors import TracekitError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# kept here (not imported from .diff) so that `tracekit --help` does not import the diff module
_ACCEPT_HELP = (
    "Acceptance criterion METRIC OP VALUE, repeatable; exit 1 when one fails. OP: <= < >= > ==. VALUE: "
    "+5% / -10% (relative change), +2ms / -500us (signed: absolute change), 80ms / 0.9 (unsigned: the "
    "candidate's value); units ns us ms s. Metrics: step_time (mean step), step_p50 (median step), wall "
    "(run window), gpu_busy, gpu_util (0..1), idle (GPU idle per step), launches (GPU activities per step), "
    "kernel:TEXT (GPU time per step of kernels whose name contains TEXT), phase:NAME (prefill/decode time "
    "per run)."
)


class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TracekitError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(package_name="tracekit")
def cli():
    """Profiler traces in, attributable performance findings out.

    \b
        tracekit analyze run.pt.trace.json.gz
        tracekit ingest rank*.json.gz --db run.duckdb
        tracekit sql run.duckdb "SELECT name, sum(dur_ns) FROM kernels GROUP BY 1 ORDER BY 2 DESC LIMIT 5"
    """


def _progress(total: int):
    """A progress bar on stderr while ingesting (files done of total), only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )  # fmt: skip
    task = bar.add_task("ingesting", total=total)
    bar.start()
    done = {"n": -1}

    def update(message: str) -> None:
        done["n"] += 1  # a message announces the next file, so the previous one is done
        bar.update(task, description=message, completed=done["n"])

    return bar, update


def _open_db(path: str | None, must_exist: bool = False):
    from tracekit import db

    if path and must_exist and not Path(path).exists():
        raise TracekitError(f"{path}: database not found")
    try:
        return db.connect(path)
    except Exception as e:  # duckdb.IOException etc.: a locked or non-DuckDB file
        raise TracekitError(f"{path}: cannot open as a tracekit database ({str(e).splitlines()[0]})") from None


def _keep_offsets(ctx, _param, value):
    ctx.meta["tracekit.offsets"] = value
    return value


# expose_value=False: the specs reach _ingest through the click context, not every command's signature
OFFSET_OPTION = click.option(
    "--offset", "offsets", multiple=True, metavar="FILE=DURATION", expose_value=False, callback=_keep_offsets,
    help="Shift one input onto the run's clock (e.g. server.log=-7h, events.jsonl=+250us); overrides the "
    "measured alignment. Repeatable.",
)  # fmt: skip


def _ingest(con, traces, rank, labels, metrics=()):
    from tracekit.ingest.offsets import parse_offsets
    from tracekit.ingest.pipeline import ingest

    specs = click.get_current_context().meta.get("tracekit.offsets", ())
    offsets = parse_offsets(specs, traces)
    bar, progress = _progress(len(traces))
    try:
        return ingest(
            con, list(traces), rank=rank, labels=list(labels) or None, progress=progress, metrics=metrics,
            offsets=offsets,
        )  # fmt: skip
    finally:
        if bar:
            bar.stop()


@cli.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--db", "db_path", required=True, type=click.Path(dir_okay=False), help="DuckDB file to create or add to."
)
@click.option("--rank", type=int, help="Rank for traces with none in distributedInfo or the file name.")
@click.option("--label", "labels", multiple=True, help="Run label, once per run (default: file name).")
@click.option(
    "--metric", "metrics", multiple=True, metavar="COLUMN",
    help="Error column of a numerics report (repeatable; default: every column whose name contains 'err').",
)  # fmt: skip
@OFFSET_OPTION
@click.option("-f", "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def ingest(traces, db_path, rank, labels, metrics, fmt):
    """Load traces into a database; prints events read = ingested + skipped per file.

    \b
        tracekit ingest rank0.json.gz rank1.json.gz --db run.duckdb
    """
    from tracekit.render.tables import emit_rows

    con = _open_db(db_path)
    results = _ingest(con, traces, rank, labels, metrics)
    con.close()
    cols = [
        "run_id",
        "source",
        "rank",
        "events_read",
        "events_ingested",
        "events_skipped",
        "skipped_reasons",
        "alignment",
        "seconds",
    ]
    rows = [
        (
            r.run_id,
            r.source,
            r.rank,
            r.events_read,
            r.events_ingested,
            r.events_skipped,
            ", ".join(f"{k}: {v}" for k, v in r.skipped_reasons.items()) if fmt != "json" else r.skipped_reasons,
            _alignment_text(r.alignment) if fmt != "json" else r.alignment,
            round(r.seconds, 3),
        )
        for r in results
    ]
    emit_rows(cols, rows, fmt)


def _alignment_text(alignment: dict | None) -> str:
    if not alignment:
        return ""
    offset = alignment.get("applied_offset_ns", 0)
    method = alignment.get("method") or ("shared events" if alignment.get("pairs") else "none")
    return f"{offset / 1e6:+.3f} ms ({method})"


@cli.command()
@click.argument("db_path", type=click.Path(dir_okay=False))
@click.argument("query")
@click.option("-f", "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("-p", "--param", "params", multiple=True, nargs=2, help="Named parameter: -p run_id 1 binds $run_id.")
def sql(db_path, query, fmt, params):
    """Run SQL against a trace database ("-" reads the query from stdin).

    \b
        tracekit sql run.duckdb "SELECT kind, count(*) FROM events GROUP BY 1" -f json
    """
    import duckdb

    from tracekit.render.tables import emit_rows

    if query == "-":
        query = sys.stdin.read()
    if not Path(db_path).exists():
        raise TracekitError(f"{db_path}: database not found")
    try:
        con = duckdb.connect(db_path, read_only=True)
    except duckdb.Error as e:
        raise TracekitError(f"{db_path}: cannot open as a DuckDB database ({str(e).splitlines()[0]})") from None
    try:
        cur = con.execute(query, {k: _coerce(v) for k, v in params} if params else None)
        columns = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall() if columns else []
    except duckdb.Error as e:
        raise TracekitError(f"query failed: {' '.join(str(e).split())}") from None
    emit_rows(columns, rows, fmt)


def _coerce(value: str):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


@cli.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-f", "--format", "fmt", type=click.Choice(["text", "json", "markdown", "feedback"]), default="text",
    show_default=True, help="feedback: ranked, deduplicated records for an agent (JSON, see docs/agents.md).",
)  # fmt: skip
@click.option("--rules", "rule_keys", help="Comma-separated rule codes or names (default: all).")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="Keep the database in this file.")
@click.option("--fail-on", type=click.Choice(["info", "warning", "critical"]), help="Exit 1 on a finding this severe.")
@click.option("--param", "params", multiple=True, metavar="RULE.NAME=VALUE", help="Override a rule parameter.")
@click.option("--rank", type=int, help="Rank for traces with none in distributedInfo or the file name.")
@click.option("--max-findings", type=int, default=25, show_default=True, help="Cap on findings in the report.")
@OFFSET_OPTION
@click.option(
    "--metric", "metrics", multiple=True, metavar="COLUMN",
    help="Error column of a numerics report (repeatable; default: every column whose name contains 'err').",
)  # fmt: skip
@click.option(
    "--baseline", "baselines", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
    help="Baseline trace (repeatable): add a diff of TRACES against it (see `tracekit diff`).",
)  # fmt: skip
@click.option("--step", help="With --baseline: annotation that delimits a step (see `tracekit diff`).")
@click.option(
    "--accept",
    "accepts",
    multiple=True,
    metavar="EXPR",
    help="With --baseline: acceptance criterion (see `tracekit diff`).",
)
@click.option("--budget-tokens", type=click.IntRange(min=200), help="With --format feedback: token budget.")
@click.option("--llm", is_flag=True, help="With --format feedback: a model writes the prose (checked; see docs/agents.md).")
@click.option("--base-url", envvar="OPENAI_BASE_URL", help="With --llm: OpenAI-compatible endpoint.")
@click.option("--model", help="With --llm: model id, e.g. glm-4.6.")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="With --llm: env var of the API key.")
def analyze(
    traces, fmt, rule_keys, db_path, fail_on, params, rank, max_findings, metrics, baselines, step, accepts,
    budget_tokens, llm, base_url, model, api_key_env,
):  # fmt: skip
    """Ingest traces (or open a .duckdb made by `ingest`), run the rules, print ranked findings.

    \b
        tracekit analyze run.json.gz
        tracekit analyze run.json.gz --format json --rules host-sync,G001 --param G001.min_idle_share=0.1
        tracekit analyze new.json.gz --baseline old.json.gz --accept "step_time <= +5%"
    """
    from tracekit.engine.registry import get_rule
    from tracekit.engine.runner import run_rules
    from tracekit.findings.model import SEVERITY_RANK
    from tracekit.findings.report import build_report, worst_severity
    from tracekit.findings.time_summary import top_costs
    from tracekit.render.report import render

    select = [k.strip() for k in rule_keys.split(",") if k.strip()] if rule_keys else None
    overrides = _parse_params(params)
    try:
        for key in (select or []) + list(overrides):
            get_rule(key)
    except KeyError as e:
        raise TracekitError(str(e.args[0])) from None
    overrides = {get_rule(k).code: v for k, v in overrides.items()}
    existing = [t for t in traces if t.suffix == ".duckdb"]
    if existing and len(traces) > 1:
        raise TracekitError("pass either one .duckdb database or trace files, not both")
    if (step or accepts) and not baselines:
        raise TracekitError("--step and --accept need --baseline")
    if (budget_tokens or llm) and fmt != "feedback":
        raise TracekitError("--budget-tokens and --llm need --format feedback")
    if llm and not model:
        raise TracekitError("--llm needs --model (and --base-url for a provider other than OpenAI)")
    if baselines and existing:
        raise TracekitError("--baseline compares trace files: pass the candidate's trace files, not a .duckdb")
    if accepts:
        from tracekit.compare.diff import parse_accept

        for a in accepts:
            parse_accept(a)  # a bad criterion fails before any ingest
    con = _open_db(str(existing[0]) if existing else db_path, must_exist=bool(existing))
    if not existing:
        _ingest(con, traces, rank, [], metrics)
    try:
        findings, notes = run_rules(con, select, overrides)
    except (KeyError, ValueError) as e:
        raise TracekitError(str(e.args[0] if e.args else e)) from None
    report = build_report(con, findings, notes, top_costs(con), max_findings=max_findings)
    diff_doc = None
    if baselines:
        from tracekit.compare.diff import render as render_diff
        from tracekit.findings.status import diff_with_status

        candidate = [f.as_dict() for f in findings]
        diff_doc, status_doc = diff_with_status(list(baselines), list(traces), candidate, step, accepts, select, overrides)
        if fmt == "json":
            report["diff"] = diff_doc
            report["finding_status"] = status_doc
    if fmt == "feedback":
        from tracekit.cli.agent import emit_feedback

        emit_feedback(findings, status_doc if baselines else None, budget_tokens, llm, base_url, model, api_key_env)
    else:
        render(report, fmt)
    if diff_doc is not None and fmt not in ("json", "feedback"):
        from tracekit.findings.status import to_text as status_text

        click.echo("")
        click.echo(render_diff(diff_doc, fmt), nl=False)
        click.echo(status_text(status_doc), nl=False)
    worst = worst_severity(findings)
    if fail_on and worst and SEVERITY_RANK[worst] >= SEVERITY_RANK[fail_on]:
        sys.exit(1)
    if diff_doc is not None and not diff_doc["passed"]:
        sys.exit(1)


@cli.command()
@click.argument("traces", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-b", "--baseline", "baselines", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
    help="Baseline trace; repeat for several ranks or runs.",
)  # fmt: skip
@click.option(
    "-c", "--candidate", "candidates", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
    help="Candidate trace; repeat for several ranks or runs.",
)  # fmt: skip
@click.option(
    "--step",
    help="Annotation that delimits a step (a trailing #N is ignored). Default: ProfilerStep#N, else the most "
    "frequent top-level user annotation, else the whole run.",
)
@click.option("--accept", "accepts", multiple=True, metavar="EXPR", help=_ACCEPT_HELP)
@click.option("--top", type=int, default=15, show_default=True, help="Contributors listed per scope.")
@click.option(
    "-f", "--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True
)
def diff(traces, baselines, candidates, step, accepts, top, fmt):
    """Compare a baseline with a candidate: the time delta (end to end, per step, per phase), the kernels,
    idle time, ops, threads and streams that account for it, its noise, and acceptance verdicts.

    Pass BASELINE CANDIDATE (one trace each), or -b/-c once per trace for several ranks or runs.
    Exit codes: 0 every --accept passed, 1 one failed, 2 bad input or usage.

    \b
        tracekit diff eager.json.gz graph.json.gz --accept "step_time <= +5%" --accept "idle <= 1ms"
        tracekit diff -b a_rank0.json.gz -b a_rank1.json.gz -c b_rank0.json.gz -c b_rank1.json.gz -f json
        tracekit diff old.json.gz new.json.gz --step decode_step --accept "phase:prefill <= +2%"
    """
    from tracekit.compare.diff import parse_accept, render, run_diff

    if traces and (baselines or candidates):
        raise TracekitError("pass BASELINE CANDIDATE, or --baseline/--candidate options, not both")
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
    for a in accepts:
        parse_accept(a)
    doc = run_diff(list(baselines), list(candidates), step=step, accept=accepts, top=top)
    click.echo(render(doc, fmt), nl=False)
    if not doc["passed"]:
        sys.exit(1)


def _parse_params(params) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for item in params:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise TracekitError(f"--param {item!r}: expected RULE.NAME=VALUE, e.g. G001.min_idle_share=0.1")
        key, value = item.split("=", 1)
        rule_key, name = key.split(".", 1)
        out.setdefault(rule_key, {})[name] = _coerce(value)
    return out


@cli.group(cls=Group, invoke_without_command=True, context_settings=CONTEXT)
@click.option("-f", "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.pass_context
def rules(ctx, fmt):
    """List the rules (code, name, category, parameters)."""
    if ctx.invoked_subcommand:
        return
    from tracekit.engine.registry import all_rules
    from tracekit.render.tables import emit_rows

    rows = []
    for r in all_rules():
        defaults = ", ".join(f"{k}={p.default}" for k, p in r.params.items())
        rows.append((r.code, r.name, r.category, r.title, defaults if fmt != "json" else r.describe()["params"]))
    emit_rows(["code", "name", "category", "title", "params"], rows, fmt)


@rules.command("show")
@click.argument("key")
@click.option("-f", "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def rules_show(key, fmt):
    """Print one rule's documentation (by code or name)."""
    import json

    from tracekit.engine.registry import get_rule

    try:
        r = get_rule(key)
    except KeyError as e:
        raise TracekitError(str(e.args[0])) from None
    if fmt == "json":
        click.echo(json.dumps(r.describe(), indent=2))
        return
    click.echo(f"{r.code} {r.name}: {r.title}  [{r.category}, {r.status} since {r.since}]\n")
    click.echo(r.doc)
    click.echo("\nParameters:")
    for k, p in r.params.items():
        click.echo(f"  {k} = {p.default!r} {p.unit}: {p.help}")
    click.echo(f"\nNeeds: {', '.join(r.requires)}")


@cli.command()
def schema():
    """Print the JSON Schema of the finding record."""
    import json

    from tracekit.findings.model import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


# Commands that live in their own modules; those modules import heavy packages inside the commands,
# so registering them keeps `tracekit --help` fast.
from tracekit.cli import agent as cli_agent  # noqa: E402
from tracekit.cli import report as cli_report  # noqa: E402

cli_agent.register(cli, Group, CONTEXT)
cli_report.register(cli, Group, CONTEXT)


def main():
    cli(prog_name="tracekit")


if __name__ == "__main__":
    main()
