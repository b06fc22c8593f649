"""`tracekit mcp`: the agent tools as an MCP server on stdio."""

from __future__ import annotations

import click

from tracekit.cli.options import CONTEXT


@click.command("mcp", context_settings=CONTEXT)
def command():
    """Serve the agent tools over MCP on stdio (for Claude Desktop, Cursor, any MCP client).

    \b
        {"mcpServers": {"tracekit": {"command": "tracekit", "args": ["mcp"]}}}
    """
    from tracekit.errors import require_extra

    require_extra("mcp", "agent", "tracekit mcp")
    from tracekit.agent.mcp_server import serve

    serve()
