"""tracekit.open and Trace: relations in any order, findings stored once per analysis, sides of a diff,
copies between databases, optional extras, and the one pipeline every caller goes through."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tests.conftest import ROOT, sample
from tracekit.api import side_labels
from tracekit.errors import TracekitError

EAGER = sample("gpu_prefill_decode_eager.json.gz")
GRAPH = sample("gpu_prefill_decode_cudagraph.json.gz")
TP2 = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]


@pytest.fixture(scope="module")
def eager():
    with tracekit.open(EAGER) as trace:
        yield trace


def _table(arrow):
    """`.arrow()` is a pyarrow Table in DuckDB 1.x and a RecordBatchReader in 2.x."""
    return arrow.read_all() if hasattr(arrow, "read_all") else arrow


def test_import_is_light_and_open_is_lazy():
    code = "import sys, tracekit; assert 'duckdb' not in sys.modules; t = tracekit.open(sys.argv[1]); print(t.runs)"
    out = subprocess.run([sys.executable, "-c", code, str(EAGER)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[1]"


def test_relations_are_consumed_in_any_order(eager):
    kernels = eager.sql("SELECT name, dur_ns FROM kernels ORDER BY ts_ns, name")
    count = eager.sql("SELECT count(*) AS n FROM kernels WHERE run_id = $run", run=1)
    pending = kernels.arrow()  # a streaming reader in DuckDB 2: its result stays open on its cursor
    (n,) = count.fetchall()[0]
    assert n > 1000
    assert count.pl()["n"].to_list() == [n]
    assert eager.sql("SELECT count(DISTINCT name) FROM kernels").fetchall()[0][0] > 1
    frame = count.df()
    assert frame["n"].tolist() == [n]
    assert _table(pending).num_rows == n
    assert len(kernels.df()) == n and kernels.pl().height == n  # again, after the reader was read
    assert kernels.fetchall()[0] == tuple(kernels.df().iloc[0])


def test_sql_errors_are_one_line(eager):
    with pytest.raises(TracekitError, match="query failed: .*nope"):
        eager.sql("SELECT nope FROM kernels")


def test_findings_run_once_and_are_stored(monkeypatch, tmp_path):
    import tracekit.engine.runner as runner

    calls = []
    real = runner.run_rules
    monkeypatch.setattr(runner, "run_rules", lambda *a, **k: calls.append(a[1:]) or real(*a, **k))
    path = tmp_path / "eager.duckdb"
    with tracekit.open(EAGER, db=path) as trace:
        first = trace.findings().pl()
        records = trace.finding_records()
        assert trace.findings().df()["id"].tolist() == first["id"].to_list() == [r["id"] for r in records]
        assert len(calls) == 1  # findings(), finding_records() and findings() again: one run of the rules
        strict = trace.findings(rules="H001", params={"host-sync": {"min_share": 0.9}})
        assert len(calls) == 2 and strict.fetchall() == []
    assert first.columns == ["id", "rule", "name", "severity", "confidence", "title", "run_id", "rank", "impact_ns",
                             "share_of_window", "record"]  # fmt: skip
    assert [json.loads(r) for r in first["record"]] == records
    assert first["severity"].to_list() == sorted(first["severity"], key=["critical", "warning", "info"].index)
    # the file keeps both analyses under their keys; read back read-only
    with tracekit.open(path, read_only=True) as again:
        keys = dict(again.sql("SELECT analysis_key, count(*) FROM findings GROUP BY 1").fetchall())
        with pytest.raises(TracekitError, match="read-only"):
            again.findings()
    assert keys == {tracekit.api.analysis_key(): len(records)}  # H001 at min_share 0.9 found nothing
    assert tracekit.api.analysis_key("H001", {"H001": {"min_share": "0.9"}}) == tracekit.api.analysis_key(
        ["host-sync"], {"host-sync": {"min_share": 0.9}}
    )


def test_bad_rules_and_parameters_fail_before_running(eager):
    with pytest.raises(TracekitError, match="Z999"):
        eager.findings(rules="Z999")
    with pytest.raises(TracekitError, match="nope"):
        eager.analysis(params={"H001": {"nope": 1}})


def test_a_database_gives_the_findings_of_its_files(tmp_path):
    path = tmp_path / "tp.duckdb"
    with tracekit.open(*TP2, db=path) as made:
        from_files = made.finding_records()
        assert [r.events_ingested > 0 for r in made.ingested] == [True, True]
    renamed = tmp_path / "tp.db"  # recognised by content, not by the name
    path.rename(renamed)
    with tracekit.open(renamed) as opened:
        assert opened.runs == [1, 2] and opened.ingested == []
        assert opened.finding_records() == from_files
    with pytest.raises(TracekitError, match="not both"):
        tracekit.open(renamed, EAGER)
    with pytest.raises(TracekitError, match="not found"):
        tracekit.open(tmp_path / "missing.duckdb")


def test_select_and_add_share_one_database():
    with tracekit.open(EAGER, labels=["before"]) as base:
        cand = base.add(GRAPH, labels=["after"])
        assert (base.runs, cand.runs) == ([1], [2]) and cand.connection is base.connection
        assert base.select(labels="aft*").runs == [2] and base.select().runs == [1, 2]
        assert base.select(run_ids=[2]).runs == [2]
        with pytest.raises(TracekitError, match="no run 7"):
            base.select(run_ids=[7])
        every = {f["id"] for f in base.select().finding_records()}
        split = {f["id"] for f in base.finding_records()} | {f["id"] for f in cand.finding_records()}
        assert split == every
        assert all(f["locality"]["run_id"] == 2 for f in cand.finding_records())
        with pytest.raises(TracekitError, match="share runs"):
            base.diff(base.select())


def _without_run_ids(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc, default=str))
    for side in ("baseline", "candidate"):
        for run in doc[side]["runs"]:
            run.pop("run_id")
    return doc


def test_diff_across_databases_equals_the_diff_in_one():
    with tracekit.open(EAGER, labels=side_labels("baseline", [EAGER])) as base:
        cand = base.add(GRAPH, labels=side_labels("candidate", [GRAPH]))
        together = cand.diff(base, accept=["step_time <= -50%"])
        status_together = cand.status(base)
    with (
        tracekit.open(EAGER, labels=side_labels("baseline", [EAGER])) as a,
        tracekit.open(GRAPH, labels=side_labels("candidate", [GRAPH])) as b,
    ):
        apart = b.diff(a, accept=["step_time <= -50%"])
        assert b.status(a) == status_together
        # neither database changed: the comparison ran in a scratch copy of both
        assert (a.select().runs, b.select().runs) == ([1], [1])
    # ops self time and threads read parent_id: equal documents mean the copy kept the call tree
    assert _without_run_ids(apart) == _without_run_ids(together)
    assert apart["passed"] is True and apart["by"]["ops"]


def test_copied_events_keep_order_and_parents():
    with tracekit.open(EAGER) as a, tracekit.open(GRAPH) as b:
        mine, theirs = b._beside(a)  # the scratch database both sides were copied into
        query = (
            "SELECT e.kind, e.name, e.ts_ns, e.depth, p.name FROM events e LEFT JOIN events p "
            "ON p.event_id = e.parent_id WHERE e.run_id = $run ORDER BY e.event_id"
        )
        for original, copy in ((a, theirs), (b, mine)):
            assert copy.connection is not original.connection
            want = original.sql(query, run=original.runs[0]).fetchall()
            assert copy.sql(query, run=copy.runs[0]).fetchall() == want and len(want) > 1000


def test_each_side_keeps_the_findings_of_its_own_runs():
    """C001 matches the ranks of one job across runs: a baseline of the same two ranks must not join it."""
    with tracekit.open(*TP2) as alone:
        expected = alone.finding_records()
    with tracekit.open(*TP2) as cand, tracekit.open(*TP2, labels=side_labels("baseline", TP2)) as base:
        status = cand.status(base)
        assert cand.finding_records() == expected
        assert any("waiting for rank 1" in f["title"] for f in expected)
    assert status["counts"] == {
        "fixed": 0, "improved": 0, "regressed": 0, "unchanged": len(expected), "new": 0, "not_comparable": 0
    }  # fmt: skip


def test_report_and_annotate_write_files(eager, tmp_path):
    out = eager.report(tmp_path / "r.html", max_findings=2)
    assert out["findings"] == 2 and out["figures"] >= 3
    assert Path(out["path"]).read_text().count('class="tk-figure"') == out["figures"]
    written = eager.annotate(tmp_path / "a.json.gz")
    assert written["findings"] == len(eager.finding_records()) and written["slices"] >= written["findings"]
    with tracekit.open(*TP2) as two, pytest.raises(TracekitError, match="expected one run"):
        two.annotate(tmp_path / "b.json")


def test_feedback_and_summary(eager):
    doc = eager.feedback(budget_tokens=1000)
    assert doc["tokens_estimate"] <= 1000 and doc["records_shown"] >= 1
    assert {r["record_id"] for r in eager.feedback()["records"]} == {f["id"] for f in eager.finding_records()}
    assert [r["run_id"] for r in eager.summary(limit=3)["runs"]] == [1]
    with pytest.raises(TracekitError, match="200"):
        eager.feedback(budget_tokens=10)


def test_a_missing_extra_is_named_in_one_line(eager, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "plotly", None)  # as if `pip install tracekit` without [report]
    with pytest.raises(TracekitError, match=r"needs plotly, which is not installed: pip install 'tracekit\[report\]'"):
        eager.report(tmp_path / "r.html")


@pytest.mark.parametrize(
    "hidden, extra, feature, args",
    [
        ("plotly", "report", "tracekit report", ["report", str(EAGER), "-o", "{tmp}/r.html"]),
        ("openai", "agent", "tracekit agent", ["agent", str(EAGER), "--model", "m", "--prompt", "x"]),
        ("mcp", "agent", "tracekit mcp", ["mcp"]),
        ("openai", "agent", "analyze --llm", ["analyze", str(EAGER), "-f", "feedback", "--llm", "--model", "m"]),
    ],
)
def test_cli_names_the_missing_extra(hidden, extra, feature, args, tmp_path):
    code = f"import sys; sys.modules[{hidden!r}] = None; from tracekit.cli import main; main()"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"error: {feature} needs {hidden}, which is not installed: pip install 'tracekit[{extra}]'"
    ]
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(
    "args, inputs",
    [
        (["analyze", str(GRAPH), "--baseline", str(EAGER), "-f", "json"], [GRAPH, EAGER]),
        (["report", str(GRAPH), "--baseline", str(EAGER), "-o", "{tmp}/r.html"], [GRAPH, EAGER]),
        (["diff", str(EAGER), str(GRAPH)], [EAGER, GRAPH]),
    ],
)
def test_each_input_is_ingested_once_per_command(args, inputs, monkeypatch, tmp_path):
    from click.testing import CliRunner

    import tracekit.ingest as ingest_module
    from tracekit.cli.app import cli

    seen = []
    real = ingest_module.ingest
    monkeypatch.setattr(ingest_module, "ingest", lambda con, paths, **kw: seen.extend(paths) or real(con, paths, **kw))
    res = CliRunner().invoke(cli, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.exit_code == 0, res.output
    assert sorted(map(str, seen)) == sorted(map(str, inputs))


_PIPELINE = {"tracekit.ingest": "ingest", "tracekit.ingest.pipeline": "ingest", "tracekit.engine.runner": "run_rules"}


def test_only_the_api_ingests_or_runs_rules():
    """Every verb, tool, the agent loop and the docs generator go through tracekit.api: no other module
    imports the ingest entry point or the rule runner."""
    offenders = []
    for path in [*(ROOT / "tracekit").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tracekit/api.py" or rel.startswith(("tracekit/ingest/", "tracekit/engine/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == _PIPELINE.get(node.module) for a in node.names):
                offenders.append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(a.name in _PIPELINE for a in node.names):
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []


def test_a_list_of_paths_opens_as_its_items():
    """`tracekit.open(glob.glob(...))` is how a notebook names rank files: a list or tuple counts as
    its items, beside single paths; anything else is one clear error, not a TypeError."""
    ranks = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]
    with tracekit.open(ranks) as listed, tracekit.open(*ranks) as spread:
        assert listed.sql("SELECT rank FROM runs ORDER BY run_id").fetchall() == [(0,), (1,)]
        assert listed.summary() == spread.summary()
    with tracekit.open(tuple(ranks[:1]), Path(ranks[1])) as mixed:
        assert len(mixed.runs) == 2
    with pytest.raises(TracekitError, match="inputs are paths .*got int: 3"):
        tracekit.open([ranks[0], 3])


def test_a_read_only_database_is_analysed_as_a_writable_one(tmp_path):
    """A read-only database can attach no in-memory catalog for the analysis's shared tables: they are
    temporary tables there, read on one thread, and the findings are those of the writable file."""
    path = tmp_path / "tp2.duckdb"
    with tracekit.open(sample("gpu_tp2_rank0.json.gz"), db=path) as trace:
        written = trace.finding_records()
    with tracekit.open(path, read_only=True) as trace:
        assert trace.finding_records() == written
        assert trace.sql(
            "SELECT count(*) FROM duckdb_databases() WHERE database_name LIKE 'tk_shared%'"
        ).fetchall() == [(0,)]
    assert {r["rule"] for r in written} >= {"C001", "G001"}
