"""The agent tools read only paths under the allowed roots (`--root DIR`, default the working directory),
symlinks resolved: a model cannot make the server read a file elsewhere through a trace reader.

The case that motivates it: a JSON array of trace events planted outside the roots, whose args hold a
password, is otherwise ingested by `ingest`/`analyze` and read back through `query`.
"""

from __future__ import annotations

import json

import anyio
import jsonschema
import pytest

from tests.conftest import ROOT, sample
from tests.test_agent_loop import FakeChatServer, run_cli, tool_call
from tracekit.agent.session import Session
from tracekit.agent.tools import call, schema_document
from tracekit.findings.fence import unfence

SECRET = "hunter2-do-not-leak"
TRACE = sample("cpu_two_threads.json.gz")


@pytest.fixture
def layout(tmp_path):
    """root/ (allowed) holds a trace and links; outside/ holds the planted file."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "run").mkdir(parents=True)
    outside.mkdir()
    planted = outside / "planted.json"
    events = [{"ph": "X", "name": "login", "pid": 1, "tid": 1, "ts": 1, "dur": 5, "args": {"password": SECRET}}]
    planted.write_text(json.dumps(events))
    (root / "trace.json.gz").write_bytes(TRACE.read_bytes())
    (root / "run" / "rank0.json.gz").write_bytes(TRACE.read_bytes())
    (root / "link.json").symlink_to(planted)
    (root / "outlink").symlink_to(outside, target_is_directory=True)
    sibling = tmp_path / "root-sibling"  # a folder whose name only starts like the root's
    sibling.mkdir()
    (sibling / "planted.json").write_text(planted.read_text())
    return {"root": root, "outside": outside, "planted": planted}


def _refused(session, name, args):
    result, is_error = call(session, name, args)
    assert is_error, result
    jsonschema.validate(result, schema_document()["error"])
    assert "outside the folders this session may read" in result["error"] or "links outside" in result["error"]
    assert "--root" in result["hint"]
    return result


def _no_database_holds_the_secret(session):
    for entry in session.entries():
        rows = entry.query("SELECT count(*) FROM events WHERE CAST(args AS VARCHAR) LIKE '%hunter2%'")["rows"]
        assert rows == [[0]]


def test_paths_outside_the_roots_are_refused(layout):
    root, planted = layout["root"], layout["planted"]
    with Session(roots=[root]) as session:
        tricks = [
            str(planted),  # plainly outside
            str(layout["root"] / "link.json"),  # a symlink in a root to a file outside
            str(layout["root"] / "outlink" / "planted.json"),  # through a linked folder
            str(root / "run" / ".." / ".." / "outside" / "planted.json"),  # .. out of the root
            str(root) + "-sibling/planted.json",
        ]
        for path in tricks:
            for name, args in (
                ("ingest", {"paths": [path]}),
                ("analyze", {"paths": [path]}),
                ("diff", {"baseline": [str(root / "trace.json.gz")], "candidate": [path]}),
            ):
                _refused(session, name, args)
        assert session.entries() == []
        # a missing file outside is refused as outside: whether it exists is not told
        missing = _refused(session, "ingest", {"paths": [str(layout["outside"] / "nope.json")]})
        assert "not a file" not in missing["error"]


def test_a_folder_with_a_link_out_is_refused(layout):
    root = layout["root"]
    (root / "run" / "rank1.json").symlink_to(layout["planted"])
    with Session(roots=[root]) as session:
        result = _refused(session, "ingest", {"paths": [str(root / "run")]})
        assert "rank1.json" in result["error"]
        (root / "run" / "rank1.json").unlink()
        result, is_error = call(session, "ingest", {"paths": [str(root / "run")]})
        assert not is_error, result


def test_paths_inside_the_roots_are_read(layout, tmp_path, monkeypatch):
    root = layout["root"]
    linked_root = tmp_path / "linked-root"
    linked_root.symlink_to(root, target_is_directory=True)
    # a root given through a symlink allows what lies in its target; a relative path is the cwd's
    monkeypatch.chdir(root)
    with Session(roots=[linked_root]) as session:
        for path in (str(root / "trace.json.gz"), "trace.json.gz", str(linked_root / "run"), "run/../trace.json.gz"):
            result, is_error = call(session, "analyze", {"paths": [path]})
            assert not is_error, (path, result)
        _no_database_holds_the_secret(session)


def test_default_root_is_the_working_directory(layout, monkeypatch):
    monkeypatch.chdir(layout["root"])
    with Session() as session:
        assert session.roots == [layout["root"].resolve()]
        _refused(session, "ingest", {"paths": [str(layout["planted"])]})
        assert not call(session, "ingest", {"paths": ["trace.json.gz"]})[1]


async def _mcp_calls(args, cwd, calls):
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=str(ROOT / ".venv" / "bin" / "tracekit"), args=["mcp", *args], cwd=cwd)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as client:
            await client.initialize()
            return [await client.call_tool(name, arguments) for name, arguments in calls]


def test_mcp_server_takes_roots(layout):
    root, planted = layout["root"], layout["planted"]
    calls = [
        ("analyze", {"paths": [str(planted)]}),
        ("ingest", {"paths": [str(root / "link.json")]}),
        ("analyze", {"paths": [str(root / "trace.json.gz")]}),
        ("query", {"sql": "SELECT count(*) FROM events WHERE CAST(args AS VARCHAR) LIKE '%hunter2%'"}),
    ]
    # default root: the server's working directory (here the root folder)
    for args in ([], ["--root", str(root)]):
        refused, linked, ok, count = anyio.run(_mcp_calls, args, str(root if not args else ROOT), calls)
        for r in (refused, linked):
            assert r.is_error
            payload = unfence(r.content[0].text)
            jsonschema.validate(payload, schema_document()["error"])
            assert "outside" in payload["error"] and str(root.resolve()) in payload["hint"]
        assert not ok.is_error and ok.structured_content["database"] == "db1"
        assert count.structured_content["rows"] == [[0]]
    # two roots: the second one's files are readable too
    both = anyio.run(_mcp_calls, ["--root", str(root), "--root", str(layout["outside"])], str(ROOT), calls[:1])
    assert not both[0].is_error


def test_root_must_be_an_existing_folder(tmp_path):
    out = run_cli("mcp", "--root", str(tmp_path / "missing"))
    assert out.returncode == 2 and "--root" in out.stderr and "Traceback" not in out.stderr


def test_agent_loop_refuses_paths_outside_its_roots(layout, tmp_path):
    """`tracekit agent`: the traces named on the command line are read wherever they are; a path the model
    names must lie under --root (default the working directory) or be one of those traces."""
    script = [
        {"content": None, "tool_calls": [
            tool_call("c1", "ingest", {"paths": [str(layout["planted"])]}),
            tool_call("c2", "ingest", {"paths": [str(layout["root"] / "link.json")]}),
            tool_call("c3", "ingest", {"paths": [str(TRACE)]}),
        ]},
        {"content": "done"},
    ]  # fmt: skip
    outside_cwd = str(layout["root"] / "trace.json.gz")  # the run's cwd is the repository, not tmp_path
    with FakeChatServer(script) as server:
        out = run_cli(
            "agent", outside_cwd, "--base-url", server.base_url, "--model", "m", "--api-key-env",
            "TRACEKIT_TEST_KEY", "--prompt", "look", "--format", "json",
        )  # fmt: skip
        tool_messages = [m for m in server.requests[-1]["messages"] if m["role"] == "tool"]
    assert out.returncode == 0, out.stderr
    results = [unfence(m["content"]) for m in tool_messages]
    assert "outside" in results[0]["error"] and "outside" in results[1]["error"]
    assert results[2]["database"] == "db2"  # inside the default root (the cwd): read
    assert [c["is_error"] for c in json.loads(out.stdout)["tool_calls"]] == [True, True, False]
    assert SECRET not in "".join(m["content"] for m in tool_messages)
