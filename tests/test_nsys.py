"""Nsight Systems SQLite exports land in the same tables as Kineto traces: every row of the tables read
is ingested or counted as skipped, kernels join their launches, threads are named, and the
foundation rules run on them unchanged. Broken or foreign SQLite files are an InputError."""

from __future__ import annotations

import sqlite3

import orjson
import pytest

from tests.conftest import corpus, run_rule
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest import ingest
from tracekit.parsers import nsys_sqlite

SAXPY = "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"  # nsys 2022.2, runtime table altered by pipit
CLOVERLEAF = "pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite"  # nsys 2024.5
FILES = (SAXPY, CLOVERLEAF)


def sqlite_counts(path) -> dict:
    """Rows of each event table, counted independently of the parser."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {
            t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in nsys_sqlite.EVENT_TABLES if t in tables
        }
    finally:
        con.close()


@pytest.mark.parametrize("name", FILES)
def test_reconciles_with_sqlite_counts(loaded, name):
    path = corpus(name)
    con = loaded(path)
    counts = sqlite_counts(path)
    read, ingested, skipped, reasons, notes, fmt = con.execute(
        "SELECT events_read, events_ingested, events_skipped, skipped_reasons, notes, format FROM ingest_log"
    ).fetchone()
    assert fmt == "nsys_sqlite"
    assert read == sum(counts.values()) == ingested + skipped
    assert skipped == sum(orjson.loads(reasons).values())
    assert orjson.loads(notes)["rows_read"] == counts
    assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == ingested
    n_kernels = con.execute("SELECT count(*) FROM kernels").fetchone()[0]
    assert n_kernels == counts["CUPTI_ACTIVITY_KIND_KERNEL"]  # no kernel of the corpus is skipped
    assert con.execute("SELECT format FROM runs").fetchone()[0] == "nsys_sqlite"


@pytest.mark.parametrize("name", FILES)
def test_kernels_join_launches_and_columns_fill(loaded, name):
    con = loaded(corpus(name))
    total, launched = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM launches l WHERE l.gpu_event_id = k.event_id)) "
        "FROM kernels k"
    ).fetchone()
    assert total > 0 and launched * 2 > total
    # one runtime call per kernel: the join does not multiply kernels
    assert con.execute("SELECT count(*) = count(DISTINCT gpu_event_id) FROM launches").fetchone()[0]
    assert con.execute("SELECT bool_and(runtime_name NOT SIMILAR TO '.*_v[0-9]+') FROM launches").fetchone()[0]
    row = con.execute(
        "SELECT count(*) FILTER (WHERE grid IS NULL OR block IS NULL OR registers_per_thread IS NULL "
        "OR device IS NULL OR stream IS NULL OR dur_ns < 0) FROM kernels"
    ).fetchone()
    assert row[0] == 0
    # times are epoch ns (session start + relative ns), and the window covers every kernel
    start, end = con.execute("SELECT start_ns, end_ns FROM runs").fetchone()
    assert start > 1_600_000_000 * 10**9
    assert con.execute("SELECT bool_and(ts_ns >= ? AND end_ns <= ?) FROM kernels", [start, end]).fetchone()[0]
    assert con.execute("SELECT json_extract_string(device_properties, '$[0].name') FROM runs").fetchone()[0]


@pytest.mark.parametrize("name", FILES)
def test_thread_names_and_streams(loaded, name):
    con = loaded(corpus(name))
    named = con.execute("SELECT count(*) FROM threads WHERE name IS NOT NULL").fetchone()[0]
    assert named > 0
    # the thread that makes the runtime calls is in threads
    assert con.execute(
        "SELECT bool_and(EXISTS (SELECT 1 FROM threads t WHERE t.pid = r.pid AND t.tid = r.tid)) FROM runtime_calls r"
    ).fetchone()[0]
    assert con.execute("SELECT count(*) FROM streams").fetchone()[0] > 0


def test_memcpy_names_and_bytes(loaded):
    con = loaded(corpus(CLOVERLEAF))
    rows = con.execute("SELECT name, bytes FROM gpu_activities WHERE kind = 'gpu_memcpy'").fetchall()
    assert rows and all(b is not None and b > 0 for _, b in rows)
    assert {n.split(" (")[0] for n, _ in rows} <= {"Memcpy HtoD", "Memcpy DtoH", "Memcpy DtoD"}
    assert all(" -> " in n for n, _ in rows)


def test_nvtx_ranges_are_user_annotations(loaded):
    path = corpus(SAXPY)
    con = loaded(path)
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ranges = src.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL").fetchone()[
        0
    ]
    src.close()
    assert ranges > 0
    assert (
        con.execute("SELECT count(*) FROM events WHERE kind = 'user_annotation' AND ph = 'X'").fetchone()[0] == ranges
    )
    # runtime calls nest under the NVTX ranges of their thread
    assert (
        con.execute(
            "SELECT count(*) FROM runtime_calls r JOIN events p ON p.event_id = r.parent_id WHERE p.kind = 'user_annotation'"
        ).fetchone()[0]
        > 0
    )


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("code", ["G001", "G002", "H001"])
def test_foundation_rules_run(loaded, name, code):
    con = loaded(corpus(name))
    findings, notes = run_rule(con, code)
    assert all(f.rule == code for f in findings)
    assert all(n.rule == code for n in notes)


def test_cloverleaf_idle_is_attributed(loaded):
    con = loaded(corpus(CLOVERLEAF))
    assert con.execute("SELECT count(*) FROM launches").fetchone()[0] > 0
    findings, _ = run_rule(con, "G001", min_idle_share=0.05)
    assert findings and "host" in findings[0].title
    syncs, _ = run_rule(con, "H001")
    assert syncs  # every step ends in cudaDeviceSynchronize


def test_truncated_export_is_input_error(tmp_path):
    path = tmp_path / "truncated.sqlite"
    path.write_bytes(corpus(CLOVERLEAF).read_bytes()[: 100 * 1024])
    con = db.connect(None)
    with pytest.raises(InputError) as err:
        ingest(con, [path])
    assert str(path) in str(err.value)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_foreign_sqlite_is_input_error(tmp_path):
    path = tmp_path / "other.sqlite"
    src = sqlite3.connect(path)
    src.execute("CREATE TABLE things (a INTEGER, b TEXT)")
    src.execute("INSERT INTO things VALUES (1, 'x')")
    src.commit()
    src.close()
    con = db.connect(None)
    with pytest.raises(InputError) as err:
        ingest(con, [path])
    assert str(path) in str(err.value) and "Nsight Systems" in str(err.value)


def test_synthetic_export_scopes_correlation_by_process_and_counts_skips(tmp_path):
    """Two processes reuse correlation id 1; a kernel without end and an unknown string id are skipped."""
    path = tmp_path / "two_procs.sqlite"
    src = sqlite3.connect(path)
    src.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000'), (2, 'k_a'), (3, 'k_b'), (4, 'main');
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT,
            correlationId INT, nameId INT, returnValue INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT,
            correlationId INT, globalPid INT, demangledName INT, shortName INT, gridX INT, gridY INT, gridZ INT,
            blockX INT, blockY INT, blockZ INT, registersPerThread INT);
        CREATE TABLE ThreadNames (nameId INT, priority INT, globalTid INT);
        """
    )
    gtid = {pid: (pid << 24) + pid for pid in (100, 200)}
    src.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, 1, ?, 0)",
        [(10, 20, gtid[100], 1), (15, 25, gtid[200], 1), (30, 40, gtid[100], 99)],
    )
    src.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 7, 1, ?, ?, ?, 1, 1, 1, 32, 1, 1, 16)",
        [(50, 60, 0, 100 << 24, 2, 2), (55, 70, 1, 200 << 24, 3, 3), (80, None, 0, 100 << 24, 2, 2)],
    )
    src.execute("INSERT INTO ThreadNames VALUES (4, 0, ?)", [gtid[100]])
    src.commit()
    src.close()
    con = db.connect(None)
    (result,) = ingest(con, [path])
    assert result.events_read == 7 == result.events_ingested + result.events_skipped
    assert result.skipped_reasons == {"kernel without end": 1, "runtime call with unknown string id": 1}
    pairs = con.execute("SELECT pid, gpu_name, runtime_name FROM launches ORDER BY pid").fetchall()
    assert pairs == [(100, "k_a", "cudaLaunchKernel"), (200, "k_b", "cudaLaunchKernel")]
    notes = orjson.loads(con.execute("SELECT notes FROM ingest_log").fetchone()[0])
    assert "relative" in notes["clock"] and "pid" in notes["correlation"]
    assert con.execute("SELECT name FROM threads WHERE pid = 100 AND tid = 100").fetchone()[0] == "main"
