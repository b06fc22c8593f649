"""`tracekit mcp`: the agent tools as an MCP server on stdio."""

from __future__ import annotations

import click

from tracekit.cli.options import CONTEXT, root_option


@click.command("mcp", context_settings=CONTEXT)
@root_option
def command(roots):
    """Serve the agent tools over MCP on stdio (for Claude Desktop, Cursor, any MCP client).

    The tools read trace files only under the --root folders (default: the working directory).

    \b
        {"mcpServers": {"tracekit": {"command": "tracekit", "args": ["mcp", "--root", "/data/traces"]}}}
    """
    from tracekit.errors import require_extra

    require_extra("mcp", "agent", "tracekit mcp")
    from tracekit.agent.mcp_server import serve

    serve(roots or None)
