"""`tracekit agent`: a bounded tool-calling loop over the tools of tools.py with the openai client.

Written for OpenAI-compatible providers with the strictest common denominator (GLM's API): tools
without `strict`, `tool_choice="auto"` only, reasoning that arrives in a separate `reasoning_content`
field (passed back with the assistant turn, since interleaved-thinking models expect it), assistant
turns that carry text and tool calls at once. Every tool result goes back fenced as data (fence.py).
The loop ends when the model answers without tool calls, or after `max_turns` model calls.
"""

from __future__ import annotations

import json
import re

from tracekit.agent.session import Session
from tracekit.agent.tools import call, openai_tools
from tracekit.findings.fence import SYSTEM_RULE, fence

FINDING_ID = re.compile(r"\b[A-Z]+[0-9]+-[0-9a-f]{12}\b")

SYSTEM = (
    "You are a performance engineer working on an LLM inference stack. You have tracekit tools over "
    "profiler traces: analyze returns ranked feedback records, get_finding drills into one, query runs "
    "read-only SQL (describe_schema lists tables), explain_rule documents a rule, diff compares a re-run. "
    "Base every claim on tool results, cite finding ids (like G001-0123456789ab) for the findings you use, "
    "and propose the cheapest next experiment. " + SYSTEM_RULE
)


def _field(message, name: str):
    value = getattr(message, name, None)
    if value is None:
        extra = getattr(message, "model_extra", None) or {}
        value = extra.get(name)
    return value


def run_agent(client, model: str, prompt: str, session: Session, traces: list[str] = (), max_turns: int = 8) -> dict:
    """Returns {answer, cited_findings, turns, stopped, tool_calls, model} (schema `agent` in schemas.json)."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    intro = prompt
    if traces:
        entry, runs = session.ingest(list(traces))
        intro += "\n\n" + fence(
            {"database": entry.handle, "traces": list(traces), "runs": runs},
            "the traces of this task, already ingested (tools default to this database)",
        )
    messages.append({"role": "user", "content": intro})
    tools = openai_tools()
    log: list[dict] = []
    answer, stopped, turns = "", "max_turns", 0
    for turn in range(1, max_turns + 1):
        turns = turn
        resp = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="auto")
        msg = resp.choices[0].message
        calls = list(msg.tool_calls or [])
        # null content beside tool calls, as OpenAI sends it; some compatible servers reject "" there
        assistant: dict = {"role": "assistant", "content": msg.content if msg.content or calls else ""}
        reasoning = _field(msg, "reasoning_content")
        if reasoning:
            assistant["reasoning_content"] = reasoning
        if calls:
            assistant["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
        messages.append(assistant)
        if msg.content:
            answer = msg.content
        if not calls:
            stopped = "answer"
            break
        for c in calls:
            try:
                args = json.loads(c.function.arguments or "{}")
                if not isinstance(args, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as e:
                result, is_error = {"error": f"arguments are not a JSON object: {e}", "hint": "send JSON"}, True
                args = c.function.arguments
            else:
                result, is_error = call(session, c.function.name, args)
            log.append({"turn": turn, "name": c.function.name, "arguments": args, "is_error": is_error})
            label = f"{c.function.name} {'error' if is_error else 'result'}"
            messages.append({"role": "tool", "tool_call_id": c.id, "content": fence(result, label)})
    return {
        "answer": answer,
        "cited_findings": cited(answer, session),
        "turns": turns,
        "stopped": stopped,
        "tool_calls": log,
        "model": model,
    }


def cited(answer: str, session: Session) -> list[dict]:
    """Finding ids the answer mentions that exist in this session's databases (in order of mention)."""
    mentioned = FINDING_ID.findall(answer or "")
    known: dict[str, tuple[str, dict]] = {}
    for entry in session.entries():
        # a database the model never analysed is analysed now, so that an id it cites can be checked
        findings = session.analyze(entry) if mentioned else entry.findings or []
        for f in findings:
            known.setdefault(f["id"], (entry.handle, f))
    out, seen = [], set()
    for fid in mentioned:
        if fid in known and fid not in seen:
            seen.add(fid)
            handle, f = known[fid]
            out.append({"finding_id": fid, "rule": f["rule"], "title": f["title"], "database": handle})
    return out


def to_text(result: dict) -> str:
    lines = [result["answer"].rstrip() or "(the model gave no answer)", ""]
    if result["stopped"] == "max_turns":
        lines.append(f"[stopped after {result['turns']} turns without a final answer]")
    lines.append("Cited findings:" if result["cited_findings"] else "Cited findings: none")
    for c in result["cited_findings"]:
        lines.append(f"  {c['finding_id']}  {c['title']}")
    return "\n".join(lines) + "\n"
