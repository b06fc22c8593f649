"""`tracekit schema`: the JSON Schema of the finding record."""

from __future__ import annotations

import click

from tracekit.cli.options import CONTEXT


@click.command("schema", context_settings=CONTEXT)
def command():
    """Print the JSON Schema of the finding record."""
    import json

    from tracekit.findings.model import json_schema

    click.echo(json.dumps(json_schema(), indent=2))
