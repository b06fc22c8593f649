"""`tracekit tools`: the agent tools as OpenAI function-calling schemas, MCP tool entries or result schemas."""

from __future__ import annotations

import json

import click

from tracekit.cli.options import CONTEXT, output_options


@click.command("tools", context_settings=CONTEXT)
@output_options(("openai", "mcp", "schemas"),
                help="openai: Chat Completions `tools`; mcp: MCP tools/list entries; schemas: the result JSON Schemas.")  # fmt: skip
def command(fmt):
    """Print the agent tools as OpenAI function-calling schemas, MCP tool definitions or result schemas.

    \b
        tracekit tools --format openai > tools.json
    """
    from tracekit.agent.tools import TOOLS, openai_tools, schema_document

    if fmt == "openai":
        doc = openai_tools()
    elif fmt == "mcp":
        doc = [
            {"name": t.name, "description": t.description, "inputSchema": t.parameters, "outputSchema": t.result_schema}
            for t in TOOLS.values()
        ]
    else:
        doc = schema_document()
    click.echo(json.dumps(doc, indent=2))
