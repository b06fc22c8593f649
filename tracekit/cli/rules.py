"""`tracekit rules` and `tracekit rules show`: the rules, their parameters and documentation."""

from __future__ import annotations

import click

from tracekit.cli.options import CONTEXT, output_options
from tracekit.errors import TracekitError


@click.group("rules", invoke_without_command=True, context_settings=CONTEXT)
@output_options()
@click.pass_context
def command(ctx, fmt):
    """List the rules (code, name, category, parameters)."""
    if ctx.invoked_subcommand:
        return
    from tracekit.engine.registry import all_rules
    from tracekit.render.tables import emit_rows

    rows = []
    for r in all_rules():
        defaults = ", ".join(f"{k}={p.default}" for k, p in r.params.items())
        rows.append(
            (r.code, r.name, r.category, r.title, r.describe()["params"] if fmt in ("json", "jsonl") else defaults)
        )
    emit_rows(["code", "name", "category", "title", "params"], rows, fmt)


@command.command("show", context_settings=CONTEXT)
@click.argument("key")
@output_options(("text", "json"))
def show(key, fmt):
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
