"""`tracekit mcp` driven by the MCP SDK's own client over stdio: list and call every tool on real traces."""

from __future__ import annotations

import anyio
import jsonschema
import pytest

from tests.conftest import ROOT, sample
from tracekit.agent.tools import TOOLS, schema_document
from tracekit.findings.fence import unfence

EAGER = str(sample("gpu_prefill_decode_eager.json.gz"))
GRAPH = str(sample("gpu_prefill_decode_cudagraph.json.gz"))


async def _session_calls(calls):
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=str(ROOT / ".venv" / "bin" / "tracekit"), args=["mcp"], cwd=str(ROOT))
    out = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            out["init"] = await session.initialize()
            out["tools"] = (await session.list_tools()).tools
            out["calls"] = []
            for name, args in calls:
                out["calls"].append((name, args, await session.call_tool(name, args)))
    return out


@pytest.fixture(scope="module")
def eager_findings(eager):
    from tracekit.engine.runner import run_rules

    return run_rules(eager)[0]


@pytest.fixture(scope="module")
def mcp_run(eager_findings):
    worst = max(eager_findings, key=lambda f: f.impact_ns)
    calls = [
        ("list_runs", {}),
        ("analyze", {"paths": [EAGER], "budget_tokens": 4000}),
        ("list_runs", {}),
        ("describe_schema", {}),
        ("query", {"sql": "SELECT count(*) AS n, count(DISTINCT name) AS names FROM kernels"}),
        ("explain_rule", {"rule": "host-sync"}),
        ("ingest", {"paths": [str(sample("gil_hold.json.gz"))]}),
        ("query", {"sql": "DELETE FROM events"}),  # refused, and the server keeps serving
        ("query", {"sql": "SELECT * FROM read_csv('/etc/passwd')", "database": "db1"}),
        ("get_finding", {"finding_id": "G001-000000000000"}),
        ("get_finding", {"finding_id": worst.id, "database": "db1"}),
        ("no_such_tool", {}),
        ("diff", {"baseline": [EAGER], "candidate": [GRAPH], "top": 5}),
    ]
    return anyio.run(_session_calls, calls)


def test_lists_every_tool_with_schemas(mcp_run):
    tools = {t.name: t for t in mcp_run["tools"]}
    assert list(tools) == list(TOOLS)
    for name, t in tools.items():
        assert t.input_schema == TOOLS[name].parameters
        assert t.output_schema == TOOLS[name].result_schema
        jsonschema.Draft202012Validator.check_schema(t.output_schema)
    assert mcp_run["init"].server_info.name == "tracekit"


def test_every_tool_answers_on_a_real_trace(mcp_run):
    from tracekit import db
    from tracekit.engine.runner import run_rules
    from tracekit.ingest.pipeline import ingest

    ok = {name: (args, r) for name, args, r in mcp_run["calls"] if not r.is_error}
    assert set(ok) == set(TOOLS)
    for name, args, r in mcp_run["calls"]:
        if r.is_error:
            continue
        jsonschema.validate(r.structured_content, TOOLS[name].result_schema)
        assert unfence(r.content[0].text) == r.structured_content  # the text block is the same data, fenced

    # independent recomputation on a separate in-memory database
    con = db.connect(None)
    ingest(con, [EAGER])
    findings, _ = run_rules(con)
    kernels = con.execute("SELECT count(*), count(DISTINCT name) FROM kernels").fetchone()
    con.close()
    analyzed = ok["analyze"][1].structured_content
    assert analyzed["database"] == "db1"
    records = analyzed["feedback"]["records"]
    assert {r["record_id"] for r in records} == {f.id for f in findings}
    assert ok["query"][1].structured_content["rows"] == [list(kernels)]
    runs = [r.structured_content for n, _, r in mcp_run["calls"] if n == "list_runs"]
    assert runs[0]["databases"] == [] and runs[1]["latest"] == "db1"
    assert runs[1]["databases"][0]["runs"][0]["source"] == EAGER
    tables = {r["name"] for r in ok["describe_schema"][1].structured_content["relations"]}
    assert {"kernels", "events", "runs"} <= tables
    assert ok["explain_rule"][1].structured_content["rule"]["code"] == "H001"
    assert ok["ingest"][1].structured_content["database"] == "db2"


def test_get_finding_drills_down(mcp_run, eager_findings):
    from tracekit.findings.model import json_schema

    worst = max(eager_findings, key=lambda f: f.impact_ns)
    r = next(r for name, args, r in mcp_run["calls"] if name == "get_finding" and not r.is_error)
    jsonschema.validate(r.structured_content, TOOLS["get_finding"].result_schema)
    finding = r.structured_content["finding"]
    jsonschema.validate(finding, json_schema())
    assert finding == worst.as_dict()
    # the evidence SQL re-run in the sandbox recomputes the finding's observed value
    rows = r.structured_content["evidence_rows"]
    assert rows["rows"], r.structured_content.get("note")
    assert finding["observed"]["value"] in rows["rows"][0]


def test_errors_are_tool_results_with_hints(mcp_run):
    errors = [(name, args, r) for name, args, r in mcp_run["calls"] if r.is_error]
    assert [name for name, _, _ in errors] == ["query", "query", "get_finding", "no_such_tool"]
    for name, _, r in errors:
        payload = unfence(r.content[0].text)
        jsonschema.validate(payload, schema_document()["error"])
        assert payload["hint"]
    assert "DELETE" in unfence(errors[0][2].content[0].text)["error"]
    assert "read_csv is not available" in unfence(errors[1][2].content[0].text)["error"]


def test_diff_marks_finding_status(mcp_run):
    from tracekit.findings.status import STATUSES

    r = next(r for name, _, r in mcp_run["calls"] if name == "diff")
    doc = r.structured_content
    status = doc["finding_status"]
    assert sum(status["counts"].values()) == len(status["findings"]) > 0
    assert all(e["status"] in STATUSES for e in status["findings"])
    for e in status["findings"]:
        assert (e["baseline"] is None) == (e["status"] == "new")
        assert (e["candidate"] is None) == (e["status"] == "fixed")
    assert len(doc["contributors"]) <= 5
