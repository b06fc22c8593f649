"""Concurrent tool calls: `tracekit mcp` driven by several MCP SDK client calls at once, and the session
shared by worker threads (the MCP server runs each call on one; the agent loop uses the same session).

Every call must succeed with its own result: its own database, the runs of its own trace, the findings
of its own trace; and calls that name a database (or take the latest) afterwards must answer for it.
"""

from __future__ import annotations

import threading

import anyio
import pytest

from tests.conftest import CORPUS, ROOT, corpus, sample
from tracekit.agent.session import Session
from tracekit.agent.tools import call
from tracekit.findings.fence import unfence

BUDGET = 3000
ROUNDS = 3


@pytest.fixture(scope="module")
def traces():
    pinned = str(sample("transfer_bound_pinned.json.gz"))
    # two formats, corpus traces and bundled ones, and one file given twice in the same round
    return [
        pinned,
        str(sample("cpu_two_threads.json.gz")),
        str(corpus("hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz")),
        str(corpus("perfetto__nested_tracks.perfetto-trace")),
        pinned,
    ]


@pytest.fixture(scope="module")
def expected(traces):
    """Per trace, computed alone: event rows, events ingested per file, the feedback record ids at the
    budget the calls use."""
    import tracekit

    out = {}
    for path in set(traces):
        with tracekit.open(path) as trace:
            events = trace.connection.execute("SELECT count(*) FROM events").fetchone()[0]
            ingested = [r.as_dict()["events_ingested"] for r in trace.ingested]
            doc = trace.feedback(BUDGET)
        out[path] = {
            "events": events,
            "ingested": ingested,
            "records": [r["record_id"] for r in doc["records"]],
            "findings_total": doc["findings_total"],
        }
    return out


async def _concurrent_rounds(traces):
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=str(ROOT / ".venv" / "bin" / "tracekit"),
        args=["mcp", "--root", str(ROOT), "--root", str(CORPUS)],
        cwd=str(ROOT),
    )
    rounds, queries = [], []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as client:
            await client.initialize()
            first = await client.call_tool("ingest", {"paths": [traces[0]]})
            assert not first.is_error, first.content[0].text
            for _ in range(ROUNDS):
                results = [None] * len(traces)
                ingesting = anyio.Event()

                async def analyze(i):
                    results[i] = await client.call_tool("analyze", {"paths": [traces[i]], "budget_tokens": BUDGET})

                async def query_meanwhile():
                    # reads of db1 and of the latest database while the others ingest and analyse
                    while not ingesting.is_set():
                        for args in ({"database": "db1"}, {}):
                            sql = "SELECT count(*) FROM events"
                            queries.append(await client.call_tool("query", {"sql": sql, **args}))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(query_meanwhile)
                    async with anyio.create_task_group() as calls:
                        for i in range(len(traces)):
                            calls.start_soon(analyze, i)
                    ingesting.set()
                rounds.append(results)
            # after all rounds: every database answers for its own trace, by name
            listed = await client.call_tool("list_runs", {})
            drill = []
            for results in rounds:
                for r in results:
                    doc = r.structured_content
                    count = await client.call_tool(
                        "query", {"sql": "SELECT count(*) FROM events", "database": doc["database"]}
                    )
                    finding = None
                    if doc["feedback"]["records"]:
                        fid = doc["feedback"]["records"][0]["record_id"]
                        finding = await client.call_tool(
                            "get_finding", {"finding_id": fid, "database": doc["database"]}
                        )
                    drill.append((doc["database"], count, finding))
    return {"rounds": rounds, "queries": queries, "list_runs": listed, "drill": drill}


@pytest.fixture(scope="module")
def concurrent(traces):
    return anyio.run(_concurrent_rounds, traces)


def _handles_to_sources(listed) -> dict[str, list[str]]:
    doc = listed.structured_content
    return {d["database"]: d["sources"] for d in doc["databases"]}


def test_every_concurrent_analyze_succeeds_with_its_own_results(concurrent, traces, expected):
    handles = []
    for results in concurrent["rounds"]:
        for path, r in zip(traces, results):
            assert not r.is_error, unfence(r.content[0].text)
            doc = r.structured_content
            assert [rec["record_id"] for rec in doc["feedback"]["records"]] == expected[path]["records"]
            assert doc["feedback"]["findings_total"] == expected[path]["findings_total"]
            handles.append((doc["database"], path))
    # one database per call, none shared, none lost: db1 was the first ingest
    names = [h for h, _ in handles]
    assert len(set(names)) == len(names) == ROUNDS * len(traces)
    sources = _handles_to_sources(concurrent["list_runs"])
    assert set(sources) == {"db1", *names}
    assert all(sources[h] == [path] for h, path in handles)


def test_databases_answer_for_their_own_trace_afterwards(concurrent, traces, expected):
    sources = _handles_to_sources(concurrent["list_runs"])
    for handle, count, finding in concurrent["drill"]:
        path = sources[handle][0]
        assert not count.is_error and count.structured_content["rows"] == [[expected[path]["events"]]]
        if finding is not None:
            assert not finding.is_error, unfence(finding.content[0].text)
            assert finding.structured_content["database"] == handle
            assert finding.structured_content["finding"]["id"] in expected[path]["records"]
    runs = {d["database"]: d["runs"] for d in concurrent["list_runs"].structured_content["databases"]}
    assert all([run["events_ingested"] for run in r] == expected[sources[h][0]]["ingested"] for h, r in runs.items())


def test_queries_during_ingests_succeed_and_answer_for_the_database_they_name(concurrent, expected):
    assert len(concurrent["queries"]) >= 2 * ROUNDS
    sources = _handles_to_sources(concurrent["list_runs"])
    for r in concurrent["queries"]:
        assert not r.is_error, unfence(r.content[0].text)
        doc = r.structured_content
        assert doc["rows"] == [[expected[sources[doc["database"]][0]]["events"]]]


def test_session_shared_by_threads(traces, expected, tmp_path):
    """The entry point both adapters call (tools.call), from several threads on one session: analyses of
    new traces, re-analyses of one database with other rules, and queries of it, all at once."""
    with Session(workdir=tmp_path, roots=[ROOT, CORPUS]) as session:
        base, is_error = call(session, "ingest", {"paths": [traces[1]]})
        assert not is_error, base
        results: dict[str, list] = {"analyze": [], "rules": [], "query": []}
        failures: list = []

        def run(kind, name, args):
            try:
                result, is_error = call(session, name, args)
                (failures if is_error else results[kind]).append((args, result))
            except BaseException as e:  # call never raises; if it did, the test must say so
                failures.append((args, repr(e)))

        jobs = [("analyze", "analyze", {"paths": [p], "budget_tokens": BUDGET}) for p in traces]
        jobs += [("rules", "analyze", {"database": "db1", "rules": [r]}) for r in ("G001", "H001", "H002")]
        jobs += [("query", "query", {"sql": "SELECT count(*) FROM events", "database": "db1"})] * 6
        threads = [threading.Thread(target=run, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not failures, failures
        for args, result in results["analyze"]:
            path = args["paths"][0]
            assert [r["record_id"] for r in result["feedback"]["records"]] == expected[path]["records"]
            assert session.get(result["database"]).sources == [path]
        assert len({result["database"] for _, result in results["analyze"]}) == len(traces)
        assert all(result["rows"] == [[expected[traces[1]]["events"]]] for _, result in results["query"])
        assert len(results["rules"]) == 3
