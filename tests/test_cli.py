"""The CLI through the real console script: exit codes, one-line errors, formats."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from tests.conftest import corpus, sample
from tracekit.findings.model import json_schema

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))


def run(*args, check_rc=None):
    proc = subprocess.run([TRACEKIT, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for frag in fragments:
        assert frag in lines[0]


def test_ingest_then_sql_reconciles(tmp_path):
    dbf = tmp_path / "run.duckdb"
    out = run(
        "ingest",
        sample("gpu_tp2_rank0.json.gz"),
        sample("gpu_tp2_rank1.json.gz"),
        "--db",
        dbf,
        "-f",
        "json",
        check_rc=0,
    )
    rows = json.loads(out.stdout)
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["events_read"] == r["events_ingested"] + r["events_skipped"] for r in rows)
    q = run("sql", dbf, "SELECT run_id, count(*) AS n FROM events GROUP BY 1 ORDER BY 1", "-f", "json", check_rc=0)
    assert [r["n"] for r in json.loads(q.stdout)] == [r["events_ingested"] for r in rows]
    csv_out = run(
        "sql", dbf, "SELECT count(*) AS n FROM kernels WHERE run_id = $r", "-p", "r", "1", "-f", "csv", check_rc=0
    )
    assert csv_out.stdout.splitlines()[0] == "n" and int(csv_out.stdout.splitlines()[1]) > 0


def test_analyze_json_document_validates(tmp_path):
    out = run("analyze", sample("gpu_prefill_decode_eager.json.gz"), "--format", "json", check_rc=0)
    doc = json.loads(out.stdout)
    assert {"schema_version", "runs", "summary", "findings", "data_quality"} <= set(doc)
    assert doc["findings"], "the eager decode loop is launch-bound and syncs every step"
    for finding in doc["findings"]:
        jsonschema.validate(finding, json_schema())
    assert [f["severity"] for f in doc["findings"]] == sorted(
        (f["severity"] for f in doc["findings"]), key=["critical", "warning", "info"].index
    )


def test_analyze_text_and_markdown_and_fail_on(tmp_path):
    text = run("analyze", sample("gpu_prefill_decode_eager.json.gz"), check_rc=0)
    assert "findings" in text.stdout and "H001" in text.stdout
    md = run(
        "analyze",
        sample("gpu_prefill_decode_eager.json.gz"),
        "--format",
        "markdown",
        "--rules",
        "host-sync",
        check_rc=0,
    )
    assert md.stdout.startswith("# tracekit report") and "```sql" in md.stdout
    failing = run("analyze", sample("gpu_prefill_decode_eager.json.gz"), "--rules", "H001", "--fail-on", "info")
    assert failing.returncode == 1
    quiet = run("analyze", sample("cpu_two_threads.json.gz"), "--rules", "H001", "--fail-on", "info", "-f", "json")
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["findings"] == []


def test_param_override_changes_outcome():
    strict = run(
        "analyze",
        sample("gpu_prefill_decode_eager.json.gz"),
        "--rules",
        "H001",
        "-f",
        "json",
        "--param",
        "H001.min_share=0.9",
        check_rc=0,
    )
    assert json.loads(strict.stdout)["findings"] == []
    bad = run("analyze", sample("gpu_prefill_decode_eager.json.gz"), "--param", "H001.nope=1")
    assert_one_line_error(bad, "nope")


def test_rules_and_schema_commands():
    listing = json.loads(run("rules", "-f", "json", check_rc=0).stdout)
    assert any(r["code"] == "H001" for r in listing)
    show = run("rules", "show", "host-sync", check_rc=0).stdout
    assert "## What it does" in show and "min_calls" in show
    assert json.loads(run("schema", check_rc=0).stdout)["title"] == "tracekit finding"
    assert_one_line_error(run("rules", "show", "Z999"), "Z999")


def test_bad_inputs_give_one_line_and_exit_2(tmp_path):
    truncated_gz = tmp_path / "t.json.gz"
    truncated_gz.write_bytes(corpus("hta__trace_diff__test.json.gz").read_bytes()[:200_000])
    assert_one_line_error(run("ingest", truncated_gz, "--db", tmp_path / "a.duckdb"), str(truncated_gz), "truncated")

    truncated = tmp_path / "t.json"
    truncated.write_bytes(gzip.decompress(corpus("hta__triton_example.json.gz").read_bytes())[:5000])
    assert_one_line_error(run("ingest", truncated, "--db", tmp_path / "b.duckdb"), str(truncated), "byte")

    malformed = tmp_path / "m.json"
    text = '{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, {"ph": "X" "ts": 2}]}'
    malformed.write_text(text)
    position = text.index('"ts": 2')
    assert_one_line_error(run("analyze", malformed), str(malformed), f"byte {position}:")

    wrong = tmp_path / "w.bin"  # (an nsys SQLite export is an input since tests/test_nsys.py)
    wrong.write_bytes(b"PK\x03\x04 not a trace\x00\x01")
    assert_one_line_error(
        run("analyze", wrong),
        str(wrong),
        "not a format tracekit reads; tried by content: Ascend",
        "Chrome/Kineto trace JSON",
    )

    no_events = tmp_path / "n.json"
    no_events.write_text('{"schemaVersion": 1}')
    assert_one_line_error(run("analyze", no_events), "traceEvents")

    assert_one_line_error(run("sql", tmp_path / "missing.duckdb", "SELECT 1"), "not found")
    bad_sql_db = tmp_path / "c.duckdb"
    run("ingest", sample("cpu_two_threads.json.gz"), "--db", bad_sql_db, check_rc=0)
    assert_one_line_error(run("sql", bad_sql_db, "SELECT nope FROM events"), "query failed")


def test_skipped_events_are_counted_with_reasons(tmp_path):
    trace = tmp_path / "s.json"
    trace.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {"ph": "X", "ts": 1, "dur": 2, "name": "ok", "pid": 1, "tid": 1},
                    {"ts": 1, "dur": 2, "name": "no phase"},
                    {"ph": "X", "ts": 3, "name": "no dur"},
                    7,
                ]
            }
        )
    )
    rows = json.loads(run("ingest", trace, "--db", tmp_path / "s.duckdb", "-f", "json", check_rc=0).stdout)
    assert rows[0]["events_read"] == 4 and rows[0]["events_ingested"] == 1
    assert rows[0]["skipped_reasons"] == {"missing ph": 1, "complete event without dur": 1, "not a JSON object": 1}


def test_help_is_fast_and_does_not_import_duckdb():
    code = "import sys, tracekit.cli; sys.exit('duckdb' in sys.modules or 'rich' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert run("--help", check_rc=0).stdout.startswith("Usage: tracekit")


def test_a_failing_file_leaves_nothing_behind(tmp_path):
    dbf = tmp_path / "a.duckdb"
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "name": "x", "pid": 1, "tid": 1}, {"ph": ]}')
    proc = run("ingest", sample("cpu_two_threads.json.gz"), bad, "--db", dbf)
    assert_one_line_error(proc, str(bad))
    rows = json.loads(
        run("sql", dbf, "SELECT run_id, count(*) AS n FROM events GROUP BY 1", "-f", "json", check_rc=0).stdout
    )
    assert [r["run_id"] for r in rows] == [1]
    runs = json.loads(run("sql", dbf, "SELECT count(*) AS n FROM runs", "-f", "json", check_rc=0).stdout)
    assert runs[0]["n"] == 1


def test_analyze_a_database_made_by_ingest_and_two_ranks(tmp_path):
    dbf = tmp_path / "tp.duckdb"
    run("ingest", sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz"), "--db", dbf, check_rc=0)
    from_db = json.loads(run("analyze", dbf, "-f", "json", check_rc=0).stdout)
    from_files = json.loads(
        run(
            "analyze", sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz"), "-f", "json", check_rc=0
        ).stdout
    )
    assert [r["rank"] for r in from_db["runs"]] == [0, 1]
    # the same findings whether the traces come from files or from the database
    assert [f["id"] for f in from_db["findings"]] == [f["id"] for f in from_files["findings"]]
    assert {f["locality"]["rank"] for f in from_db["findings"]} == {0, 1}
    # communication on rank 0 is exposed: the all-reduce waits for rank 1
    assert any(f["rule"] == "C001" and f["locality"]["rank"] == 0 for f in from_db["findings"])
    # evidence SQL runs through `tracekit sql` with its params
    f = next(f for f in from_db["findings"] if f["rule"] == "C001")
    params = [
        arg
        for k, v in f["evidence"]["params"].items()
        for arg in ("-p", k, str(v).lower() if isinstance(v, bool) else str(v))
    ]
    rows = json.loads(run("sql", dbf, f["evidence"]["sql"], *params, "-f", "json", check_rc=0).stdout)
    assert rows and rows[0]["exposed_ns"] == f["observed"]["value"]


def run_env(*args, env=None, check_rc=None):
    import os

    proc = subprocess.run([TRACEKIT, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})  # fmt: skip
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


def test_row_formats_and_a_table_that_fits_the_terminal(tmp_path):
    dbf = tmp_path / "e.duckdb"
    run("ingest", sample("gpu_prefill_decode_eager.json.gz"), "--db", dbf, "-q", check_rc=0)
    query = "SELECT name, count(*) AS n FROM kernels GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 3"
    rows = json.loads(run("sql", dbf, query, "-f", "json", check_rc=0).stdout)
    jsonl = [json.loads(line) for line in run("sql", dbf, query, "-f", "jsonl", check_rc=0).stdout.splitlines()]
    assert jsonl == rows and len(rows) == 3
    tsv = run("sql", dbf, query, "-f", "tsv", check_rc=0).stdout.splitlines()
    assert tsv[0] == "name\tn" and [line.split("\t") for line in tsv[1:]] == [[r["name"], str(r["n"])] for r in rows]
    table = run_env("sql", dbf, query, env={"COLUMNS": "40"}, check_rc=0).stdout.splitlines()
    assert table[0].split() == ["name", "n"] and all(len(line) <= 40 for line in table)
    for line, r in zip(table[2:], rows):
        assert line.endswith(f" {r['n']}")  # numbers are never cut
        name = line[: -len(str(r["n"]))].rstrip()
        assert name == r["name"] or (name.endswith("…") and r["name"].startswith(name[:-1]))
    assert any(line.rstrip().split("  ")[0].endswith("…") for line in table[2:])
    wide = run_env("sql", dbf, query, env={"COLUMNS": "400"}, check_rc=0).stdout
    assert "…" not in wide and all(r["name"] in wide for r in rows)


def test_output_file_quiet_and_verbose(tmp_path):
    eager = sample("gpu_prefill_decode_eager.json.gz")
    out = tmp_path / "report.json"
    written = run("analyze", eager, "-f", "json", "-o", out, check_rc=0)
    assert written.stdout == f"{out}: written\n" and json.loads(out.read_text())["findings"]
    assert run("analyze", eager, "-f", "json", "-o", out, "-q", check_rc=0).stdout == ""
    assert run("-q", "diff", eager, eager, "-o", tmp_path / "d.md", "-f", "markdown", check_rc=0).stdout == ""
    assert (tmp_path / "d.md").read_text().startswith("# tracekit diff")
    loud = run("analyze", eager, "--rules", "H001", "-f", "json", "-v", check_rc=0)
    lines = loud.stderr.splitlines()
    assert lines[0] == f"loading {eager.name}"  # ingest's progress messages, one line each
    ingested = [line for line in lines if line.startswith(f"ingested {eager}: ")]
    assert len(ingested) == 1 and " events (0 skipped) in " in ingested[0]
    assert any(line.startswith("rules and summary: ") for line in lines)
    # where the rule run's time went: the selected rule, the shared views and the quality checks,
    # slowest first, and nothing else
    timed = [line.strip() for line in lines if line.startswith("  ")]
    assert {t.split(":")[0] for t in timed} == {"H001 host-sync", "shared views", "data-quality checks"}
    shares = [int(t.rsplit("(", 1)[1].rstrip("%)")) for t in timed]
    assert shares == sorted(shares, reverse=True) and 97 <= sum(shares) <= 103
    assert json.loads(loud.stdout)["findings"]  # the output itself is unchanged


def test_analyze_db_stores_the_findings(tmp_path):
    dbf = tmp_path / "a.duckdb"
    doc = json.loads(run("analyze", sample("gpu_prefill_decode_eager.json.gz"), "--db", dbf, "-f", "json",
                         check_rc=0).stdout)  # fmt: skip
    rows = json.loads(
        run("sql", dbf, "SELECT id, rule, severity, record FROM findings", "-f", "json", check_rc=0).stdout
    )
    assert [r["id"] for r in rows] == [f["id"] for f in doc["findings"]]
    assert [json.loads(r["record"]) for r in rows] == doc["findings"]


def test_text_outputs_print_durations_by_magnitude():
    from tracekit.units import duration

    eager = sample("gpu_prefill_decode_eager.json.gz")
    doc = json.loads(run("analyze", eager, "-f", "json", check_rc=0).stdout)
    top = doc["summary"]["runs"][0]["top_kernels"][0]
    assert top["mean_ns"] < 10_000  # a few microseconds: the report used to print 0.005 ms
    text = run_env("analyze", eager, env={"COLUMNS": "200"}, check_rc=0).stdout
    kernel_line = next(line for line in text.splitlines() if line.startswith(top["name"]))
    assert kernel_line.split("  ")[-1].strip() == duration(top["mean_ns"]) and duration(top["mean_ns"]).endswith(" us")
    md = run("analyze", eager, "-f", "markdown", check_rc=0).stdout
    assert f"| {duration(top['total_ns'])} | {duration(top['mean_ns'])} |" in md


def test_shell_completion_script():
    out = run_env(env={"_TRACEKIT_COMPLETE": "bash_source"}, check_rc=0).stdout
    assert "_TRACEKIT_COMPLETE=bash_complete" in out and "complete " in out
