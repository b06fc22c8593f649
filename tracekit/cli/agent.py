"""Agent-facing commands (issue 5): tools, mcp, agent. See docs/agents.md.

openai and mcp are imported inside the commands so that `tracekit --help` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from tracekit.errors import TracekitError


def register(cli, group_cls, context) -> None:
    """Add this module's commands to the top-level click group."""

    @cli.command("tools")
    @click.option(
        "-f", "--format", "fmt", type=click.Choice(["openai", "mcp", "schemas"]), default="openai", show_default=True,
        help="openai: Chat Completions `tools`; mcp: MCP tools/list entries; schemas: the result JSON Schemas.",
    )  # fmt: skip
    def tools_cmd(fmt):
        """Print the agent tools as OpenAI function-calling schemas, MCP tool definitions or result schemas.

        \b
            tracekit tools --format openai > tools.json
        """
        from tracekit.agent.tools import TOOLS, openai_tools, schema_document

        if fmt == "openai":
            doc = openai_tools()
        elif fmt == "mcp":
            doc = [
                {
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": t.parameters,
                    "outputSchema": t.result_schema,
                }
                for t in TOOLS.values()
            ]
        else:
            doc = schema_document()
        click.echo(json.dumps(doc, indent=2))

    @cli.command("mcp")
    def mcp_cmd():
        """Serve the agent tools over MCP on stdio (for Claude Desktop, Cursor, any MCP client).

        \b
            {"mcpServers": {"tracekit": {"command": "tracekit", "args": ["mcp"]}}}
        """
        from tracekit.agent.mcp_server import serve

        serve()

    @cli.command("agent")
    @click.argument("traces", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--prompt", required=True, help="The task for the model ('-' reads it from stdin).")
    @click.option("--base-url", envvar="OPENAI_BASE_URL", help="OpenAI-compatible endpoint (env OPENAI_BASE_URL).")
    @click.option("--model", required=True, help="Model id, e.g. glm-4.6.")
    @click.option(
        "--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Environment variable holding the API key."
    )
    @click.option("--max-turns", type=click.IntRange(1, 50), default=8, show_default=True, help="Model calls at most.")
    @click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds per model call.")
    @click.option("-f", "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
    def agent_cmd(traces, prompt, base_url, model, api_key_env, max_turns, timeout, fmt):
        """Let a model investigate traces with the tracekit tools; print its answer and the findings it cited.

        \b
            export ZAI_API_KEY=...
            tracekit agent run.json.gz --base-url https://api.z.ai/api/paas/v4/ --model glm-4.6 \\
                --api-key-env ZAI_API_KEY --prompt "Why is decode slow? Propose one experiment."
        """
        from tracekit.agent.loop import run_agent, to_text
        from tracekit.agent.session import Session

        if prompt == "-":
            prompt = sys.stdin.read()
        key = os.environ.get(api_key_env)
        if not key:
            raise TracekitError(f"no API key: set {api_key_env} (or pass --api-key-env NAME)")
        client = _client(base_url, key, timeout)
        import openai

        with Session() as session:
            try:
                result = run_agent(client, model, prompt, session, [str(t) for t in traces], max_turns=max_turns)
            except openai.OpenAIError as e:
                raise TracekitError(f"model API error: {' '.join(str(e).split())[:300]}") from None
        click.echo(json.dumps(result, indent=2, default=str) if fmt == "json" else to_text(result), nl=False)


def _client(base_url: str | None, key: str, timeout: float = 120.0):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=1)


def emit_feedback(findings, status_doc, budget_tokens, llm, base_url, model, api_key_env) -> None:
    """`tracekit analyze --format feedback`: the feedback document (schemas.json `feedback`) as JSON."""
    from tracekit.findings.feedback import build_feedback, llm_prose

    doc = build_feedback([f.as_dict() for f in findings], budget_tokens, status_doc)
    if llm:
        key = os.environ.get(api_key_env)
        if not key:
            raise TracekitError(f"--llm: no API key: set {api_key_env} (or pass --api-key-env NAME)")
        doc = llm_prose(doc, _client(base_url, key), model)
    click.echo(json.dumps(doc, indent=2, default=str))
