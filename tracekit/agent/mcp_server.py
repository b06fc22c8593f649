"""`tracekit mcp`: the tools of tools.py as an MCP server over stdio (official MCP Python SDK, low-level Server).

The server holds one Session: the databases it built stay available for the whole connection, and
tools default to the latest. It reads only paths under its allowed roots (`tracekit mcp --root DIR`). A tool failure is a result with `is_error: true` and `{error, hint}`,
never a protocol error or a dead server. Successful results carry `structured_content` (validated by
clients against the tool's output schema) and the same JSON, fenced as trace data, as text.
"""

from __future__ import annotations

import json

from tracekit import __version__
from tracekit.agent.session import Session
from tracekit.agent.tools import TOOLS, call
from tracekit.findings.fence import SYSTEM_RULE, fence

INSTRUCTIONS = (
    "tracekit turns profiler traces into ranked performance findings. Start with analyze (paths of trace "
    "files), drill into a record with get_finding, check numbers with query (read-only SQL; describe_schema "
    "lists tables), and compare a re-run with diff. " + SYSTEM_RULE
)


def build_server(session: Session):
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    tool_list = [
        types.Tool(
            name=t.name,
            description=t.description,
            input_schema=t.parameters,
            output_schema=t.result_schema,
            annotations=types.ToolAnnotations(read_only_hint=t.name not in ("ingest", "analyze", "diff")),
        )
        for t in TOOLS.values()
    ]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=tool_list)

    async def call_tool(ctx, params):
        # tool handlers block (ingest, rules): a worker thread keeps the server answering pings
        result, is_error = await anyio.to_thread.run_sync(call, session, params.name, params.arguments)
        text = fence(result, f"{params.name} {'error' if is_error else 'result'}")
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content=None if is_error else json.loads(json.dumps(result, default=str)),
            is_error=is_error,
        )

    return Server(
        "tracekit",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def serve(roots=None) -> None:
    """Serve on stdio; the tools read paths under `roots` only (default: the working directory)."""
    import anyio
    from mcp.server.stdio import stdio_server

    async def main():
        with Session(roots=roots) as session:
            server = build_server(session)
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
