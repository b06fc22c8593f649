"""A trace lake (tracekit ingest --lake DIR, docs/lake.md): Parquet per run and a DuckDB catalog of
views over it. Whatever tracekit computes on a lake equals what it computes on a database file of
the same inputs; appends, duplicates, a bad input and the duckdb CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tests.conftest import corpus, sample
from tracekit import api, db
from tracekit.db import lake, stdlib
from tracekit.errors import TracekitError

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
DUCKDB_CLI = shutil.which("duckdb", path=str(Path(sys.executable).parent)) or shutil.which("duckdb")
HEALTHY = Path(__file__).parent / "data" / "rank_matrix" / "healthy"


def _inputs(name: str) -> list[Path]:
    if name == "hta_corpus":
        return [corpus("hta__trace_filter__sampled_rank-0.json.gz")]
    return [sample(f"{name}_rank{r}.json.gz") for r in (0, 1)]


def _outcome(trace) -> dict:
    """What analyze computes, and the rows it reads: finding records (ids included), the report,
    and a digest of every event with its id, parent and run."""
    events = trace.sql(
        "SELECT count(*), sum(hash(event_id, parent_id, run_id, name, ts_ns, dur_ns, depth)) FROM events"
    ).fetchall()[0]
    runs = trace.sql("SELECT * EXCLUDE (source) FROM runs ORDER BY run_id").fetchall()
    report = trace.report_document(max_findings=None)
    return {"records": trace.finding_records(), "report": json.dumps(report, sort_keys=True, default=str),
            "events": events, "runs": runs}  # fmt: skip


@pytest.mark.parametrize("name", ["gloo", "gpu_tp2", "hta_corpus"])
def test_analyze_on_a_lake_equals_analyze_on_a_database_file(tmp_path, name):
    paths = _inputs(name)
    api.ingest_lake(tmp_path / "lake", *paths)
    with tracekit.open(*paths, db=tmp_path / "plain.duckdb") as plain:
        expected = _outcome(plain)
    with tracekit.open(tmp_path / "lake") as trace:
        got = _outcome(trace)
        assert trace.runs == list(range(1, len(paths) + 1))
        stored = trace.sql("SELECT count(*) FROM findings").fetchall()[0][0]  # findings are a real table there
    assert got["records"] == expected["records"]
    assert [r["id"] for r in got["records"]] == [r["id"] for r in expected["records"]]
    assert got == expected
    assert stored == len(expected["records"])


def test_layout_and_types(tmp_path):
    root = tmp_path / "lake"
    api.ingest_lake(root, *_inputs("gloo"))
    plain = db.connect(None)
    for table in lake.run_tables():
        for run_id in (1, 2):
            assert (root / table / f"run_id={run_id}" / "part-0.parquet").is_file()
        want = plain.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? AND database_name = current_database() "
            "ORDER BY column_index",
            [table],
        ).fetchall()
        want += [("event_id", "BIGINT")] if table == "event_rows" else []
        for run_id in (1, 2):  # every file, empty tables and all-NULL columns too, keeps the table's types
            got = plain.execute(
                f"DESCRIBE SELECT * FROM read_parquet('{root / table / f'run_id={run_id}' / 'part-0.parquet'}', hive_partitioning = false)"
            )
            assert [(c, t) for c, t, *_ in got.fetchall()] == want, table
    # straight from the files, as Polars or pandas would read them
    n = plain.execute(f"SELECT count(*) FROM read_parquet('{root}/event_rows/*/*.parquet')").fetchone()[0]
    assert n == 2 * 1161
    assert set(p.name for p in root.iterdir()) == {*lake.run_tables(), "catalog.duckdb", "lake.json", ".lock"}


def test_appending_a_rank_later_equals_ingesting_both_at_once(tmp_path):
    paths = _inputs("gpu_tp2")
    api.ingest_lake(tmp_path / "both", *paths)
    api.ingest_lake(tmp_path / "later", paths[0])
    again = api.ingest_lake(tmp_path / "later", paths[0])  # same content: skipped, as tracekit ingest does
    assert again.ingested == [] and again.duplicates and again.duplicates[0].runs == [1]
    api.ingest_lake(tmp_path / "later", paths[1])
    outcomes = []
    for name in ("both", "later"):
        with tracekit.open(tmp_path / name) as trace:
            outcomes.append(_outcome(trace))
    assert outcomes[0] == outcomes[1]
    assert sorted(p.name for p in (tmp_path / "later" / "runs").iterdir()) == ["run_id=1", "run_id=2"]


def test_a_folder_of_rank_traces(tmp_path):
    done = api.ingest_lake(tmp_path / "lake", HEALTHY)
    assert [r.rank for r in done.ingested] == list(range(8))
    with tracekit.open(HEALTHY, db=tmp_path / "plain.duckdb") as plain:
        expected = plain.finding_records()
    with tracekit.open(tmp_path / "lake") as trace:
        assert trace.finding_records() == expected
        assert trace.sql("SELECT list(rank ORDER BY run_id) FROM runs").fetchall()[0][0] == list(range(8))


def test_cli_sql_analyze_and_the_duckdb_cli(tmp_path):
    root = tmp_path / "lake"
    run = subprocess.run([TRACEKIT, "ingest", *map(str, _inputs("gloo")), "--lake", str(root)], capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = subprocess.run([TRACEKIT, "sql", str(root), "SELECT count(*) AS n FROM kernels", "-f", "json"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    kernels = json.loads(out.stdout)[0]["n"]
    out = subprocess.run([TRACEKIT, "analyze", str(root), "-f", "json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["findings"]
    if DUCKDB_CLI is None:
        pytest.skip("the duckdb CLI is not installed (pip install duckdb-cli)")
    # moved: the first tracekit open re-points the views, then the duckdb CLI reads it where it is
    moved = tmp_path / "moved"
    root.rename(moved)
    out = subprocess.run([TRACEKIT, "sql", str(moved), "SELECT count(*) AS n FROM kernels", "-f", "json"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["n"] == kernels
    out = subprocess.run(
        [DUCKDB_CLI, "-readonly", "-csv", "-noheader", str(moved / "catalog.duckdb"),
         "-c", "SELECT count(*) FROM kernels; SELECT count(*) FROM events; SELECT count(*) FROM runs;"],
        capture_output=True, text=True, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(kernels), str(2 * 1161), "2"]
    # every public table and view binds there, as in a database file (tests/test_duckdb_cli.py)
    queries = [f"SELECT count(*) FROM {rel};" for rel in stdlib.public("table") + stdlib.public("view")]
    out = subprocess.run([DUCKDB_CLI, "-readonly", "-csv", "-noheader", str(moved / "catalog.duckdb"), "-c",
                          "".join(queries)], capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == len(queries)


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(root.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("bad", ["truncated", "garbage"])
def test_a_bad_input_among_good_ones_leaves_the_lake_as_it_was(tmp_path, bad):
    root = tmp_path / "lake"
    api.ingest_lake(root, sample("gloo_rank0.json.gz"))
    before = _snapshot(root)
    broken = tmp_path / "broken.json.gz"
    if bad == "truncated":
        broken.write_bytes(sample("gpu_tp2_rank0.json.gz").read_bytes()[:5000])
    else:
        broken = tmp_path / "broken.json"
        broken.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": ')
    good = [str(sample("gloo_rank1.json.gz")), str(sample("gpu_tp2_rank1.json.gz"))]
    out = subprocess.run([TRACEKIT, "ingest", good[0], str(broken), good[1], "--lake", str(root)],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and broken.name in lines[0], out.stderr
    assert "nothing was added to the lake" in lines[0]
    assert _snapshot(root) == before
    # and into a new lake: no lake at all
    out = subprocess.run([TRACEKIT, "ingest", good[0], str(broken), "--lake", str(tmp_path / "new")],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert not lake.is_lake(tmp_path / "new")
    assert not any(p.suffix == ".parquet" for p in (tmp_path / "new").rglob("*"))


def test_a_killed_ingest_leaves_nothing_the_next_one_sees(tmp_path, capsys):
    root = tmp_path / "lake"
    api.ingest_lake(root, sample("gloo_rank0.json.gz"))
    # what a kill between the renames leaves: partitions of a run whose runs partition never came
    half = root / "event_rows" / "run_id=2"
    shutil.copytree(root / "event_rows" / "run_id=1", half)
    (root / lake.STAGING / "12345" / "runs" / "run_id=3").mkdir(parents=True)
    api.ingest_lake(root, sample("gloo_rank1.json.gz"))
    assert "removed the partitions of run 2" in capsys.readouterr().err
    assert not (root / lake.STAGING).exists()
    with tracekit.open(root, read_only=True) as trace:
        # (a real kill comes after lake.json took the ids: the next run would be 3 then)
        assert trace.sql("SELECT list(run_id ORDER BY run_id) FROM runs").fetchall()[0][0] == [1, 2]
        assert trace.sql("SELECT run_id, count(*), min(event_id) FROM events GROUP BY 1 ORDER BY 1").fetchall() == [
            (1, 1161, 0),
            (2, 1161, 1161),
        ]  # event ids go on after the first run's, as in a database file


def test_a_lake_is_opened_not_added_to(tmp_path):
    root = tmp_path / "lake"
    api.ingest_lake(root, sample("gloo_rank0.json.gz"))
    assert api.is_database(root) and not api.is_database(HEALTHY)
    with tracekit.open(root) as trace:
        with pytest.raises(TracekitError, match="ingest --lake"):
            trace.add(sample("gloo_rank1.json.gz"))
    with pytest.raises(TracekitError, match="not a tracekit lake"):
        api.ingest_lake(HEALTHY, sample("gloo_rank1.json.gz"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(TracekitError, match="not a tracekit lake"):
        tracekit.open(db=tmp_path / "plain")


def _cli_ingest(root: Path, *paths: Path, kill_at: str | None = None, wait: bool = True):
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRACEKIT_KILL_AT"} | (
        {"TRACEKIT_KILL_AT": kill_at} if kill_at else {}
    )
    proc = subprocess.Popen([TRACEKIT, "-q", "ingest", *map(str, paths), "--lake", str(root)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    if not wait:
        return proc
    out, err = proc.communicate()
    return proc.returncode, err


@pytest.mark.parametrize("point", ["committed", "lake_staged", "lake_renamed"])
def test_an_ingest_killed_at_each_step(tmp_path, point):
    """SIGKILL inside a real lake ingest: after the first input's commit into the scratch database,
    once every run is staged, and between the renames; the next ingest finds a consistent lake."""
    import signal

    root = tmp_path / "lake"
    assert _cli_ingest(root, sample("gloo_rank0.json.gz"))[0] == 0
    before = _snapshot(root)
    code, _ = _cli_ingest(root, sample("gloo_rank1.json.gz"), sample("gpu_tp2_rank0.json.gz"), kill_at=point)
    assert code == -signal.SIGKILL
    with tracekit.open(root, read_only=True) as trace:  # what the killed call added is not a run
        assert trace.sql("SELECT list(run_id) FROM runs").fetchall()[0][0] == [1]
    if point != "lake_renamed":  # before the renames, only the staging folder and lake.json's ids changed

        def data(snapshot):
            return {k: v for k, v in snapshot.items() if not k.startswith((lake.STAGING, lake.STATE))}

        assert data(_snapshot(root)) == data(before)
    code, err = _cli_ingest(root, sample("gloo_rank1.json.gz"), sample("gpu_tp2_rank0.json.gz"))
    assert code == 0, err
    assert not (root / lake.STAGING).exists()
    with tracekit.open(root, read_only=True) as trace:
        runs = trace.sql("SELECT list(run_id ORDER BY run_id) FROM runs").fetchall()[0][0]
        assert len(runs) == 3 and runs[0] == 1
        counts = trace.sql("SELECT list(n ORDER BY run_id) FROM (SELECT run_id, count(*) AS n FROM events GROUP BY 1)")
        assert counts.fetchall()[0][0] == [1161, 1161, 16156]  # no rows of the killed call's runs
        ids = trace.sql("SELECT count(DISTINCT event_id) = count(*) FROM events").fetchall()[0][0]
        assert ids
        for table in lake.run_tables():
            assert sorted(lake.partitions(root, table)) == runs, table


def test_two_ingests_at_once_take_turns(tmp_path):
    root = tmp_path / "lake"
    procs = [_cli_ingest(root, sample(name), wait=False) for name in ("gpu_tp2_rank0.json.gz", "gpu_tp2_rank1.json.gz")]
    for proc in procs:
        out, err = proc.communicate()
        assert proc.returncode == 0, err
    with tracekit.open(root, read_only=True) as trace:
        assert trace.sql("SELECT list(run_id ORDER BY run_id) FROM runs").fetchall()[0][0] == [1, 2]
        assert trace.sql("SELECT count(DISTINCT event_id) = count(*), count(DISTINCT run_id) FROM events").fetchall()[
            0
        ] == (True, 2)


def test_the_files_read_with_polars_and_pandas_as_docs_lake_md_says(tmp_path):
    pl = pytest.importorskip("polars")
    pd = pytest.importorskip("pandas")
    root = tmp_path / "lake"
    api.ingest_lake(root, *_inputs("gloo"))
    events = pl.scan_parquet(f"{root}/event_rows/*/*.parquet")
    assert events.select(pl.len()).collect().item() == 2 * 1161
    assert pl.read_parquet(f"{root}/runs/*/*.parquet")["run_id"].sort().to_list() == [1, 2]
    assert sorted(pd.read_parquet(root / "ingest_log", partitioning=None)["run_id"]) == [1, 2]


def test_a_lake_diffs_against_a_database_file(tmp_path):
    """Trace.diff copies a lake's runs into its scratch database as it copies a database file's."""
    paths = _inputs("gloo")
    api.ingest_lake(tmp_path / "lake", *paths)
    with tracekit.open(*paths, db=tmp_path / "plain.duckdb") as plain, tracekit.open(tmp_path / "lake") as lk:
        with tracekit.open(*paths) as other:
            expected = plain.diff(other)
        assert lk.diff(plain) == expected
        assert plain.diff(lk) == expected


def test_a_catalog_of_an_older_tracekit_is_brought_up_to_date(tmp_path):
    """A new tracekit (another stdlib digest) re-creates the stdlib and the views over the same files,
    on a read-only open too."""
    import duckdb

    root = tmp_path / "lake"
    api.ingest_lake(root, *_inputs("gloo"))
    with tracekit.open(root) as trace:
        expected = trace.finding_records()
    con = duckdb.connect(str(root / lake.CATALOG))
    con.execute("UPDATE tracekit_meta SET value = 'older' WHERE key = 'stdlib_digest'")
    con.execute("DROP VIEW kernels")  # a view the older stdlib did not have
    con.close()
    with tracekit.open(root, read_only=True) as trace:
        assert trace.sql("SELECT count(*) FROM kernels").fetchall()[0][0] > 0
    with tracekit.open(root) as trace:
        assert trace.finding_records() == expected
