"""`tracekit agent`: a model investigates traces with the tracekit tools (docs/agents.md)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from tracekit.cli.options import CONTEXT, INPUT, output_options, root_option
from tracekit.errors import TracekitError


@click.command("agent", context_settings=CONTEXT)
@click.argument("traces", nargs=-1, type=INPUT)
@click.option("--prompt", required=True, help="The task for the model ('-' reads it from stdin).")
@click.option("--base-url", envvar="OPENAI_BASE_URL", help="OpenAI-compatible endpoint (env OPENAI_BASE_URL).")
@click.option("--model", required=True, help="Model id, e.g. glm-4.6.")
@click.option(
    "--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Environment variable holding the API key."
)
@click.option("--max-turns", type=click.IntRange(1, 50), default=8, show_default=True, help="Model calls at most.")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds per model call.")
@root_option
@output_options(("text", "json"))
def command(traces, prompt, base_url, model, api_key_env, max_turns, timeout, roots, fmt):
    """Let a model investigate traces with the tracekit tools; print its answer and the findings it cited.

    The model's tool calls read files only under the --root folders (default: the working directory)
    and the TRACES named here.

    \b
        export ZAI_API_KEY=...
        tracekit agent run.json.gz --base-url https://api.z.ai/api/paas/v4/ --model glm-4.6 \\
            --api-key-env ZAI_API_KEY --prompt "Why is decode slow? Propose one experiment."
    """
    from tracekit.errors import require_extra

    require_extra("openai", "agent", "tracekit agent")
    import openai

    from tracekit.agent.client import openai_client
    from tracekit.agent.loop import run_agent, to_text
    from tracekit.agent.session import Session

    missing = [str(t) for t in traces if not t.exists()]
    if missing:
        raise TracekitError(f"{missing[0]}: no such file or folder")
    if prompt == "-":
        prompt = sys.stdin.read()
    key = os.environ.get(api_key_env)
    if not key:
        raise TracekitError(f"no API key: set {api_key_env} (or pass --api-key-env NAME)")
    client = openai_client(base_url, key, timeout)
    # the traces named on the command line are the user's choice: the model may read them wherever they are
    with Session(roots=[*(roots or [Path.cwd()]), *traces]) as session:
        try:
            result = run_agent(client, model, prompt, session, [str(t) for t in traces], max_turns=max_turns)
        except openai.OpenAIError as e:
            raise TracekitError(f"model API error: {' '.join(str(e).split())[:300]}") from None
    click.echo(json.dumps(result, indent=2, default=str) if fmt == "json" else to_text(result), nl=False)
