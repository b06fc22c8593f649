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
from tracekit.ingest.pipeline import ingest
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
    # each process drives a GPU of its own: one run per rank, in the order of their devices
    first, second = ingest(con, [path])
    assert first.events_read + second.events_read == 7
    assert all(r.events_read == r.events_ingested + r.events_skipped for r in (first, second))
    assert first.skipped_reasons == {"kernel without end": 1, "runtime call with unknown string id": 1}
    assert (first.rank, second.rank) == (0, 1)
    pairs = con.execute("SELECT run_id, pid, gpu_name, runtime_name FROM launches ORDER BY pid").fetchall()
    assert pairs == [(first.run_id, 100, "k_a", "cudaLaunchKernel"), (second.run_id, 200, "k_b", "cudaLaunchKernel")]
    notes = orjson.loads(con.execute("SELECT notes FROM ingest_log ORDER BY run_id").fetchone()[0])
    assert "relative" in notes["clock"] and "pid" in notes["correlation"]
    assert con.execute("SELECT name FROM threads WHERE pid = 100 AND tid = 100").fetchone()[0] == "main"


def event_table(con) -> list[tuple]:
    return con.execute(
        "SELECT kind, ph, cat, name, ts_ns, dur_ns, pid, tid, device, stream, correlation, args::VARCHAR, "
        "extra::VARCHAR FROM event_rows ORDER BY rowid"
    ).fetchall()


def load_export(path, offset=0, **options):
    con = db.connect(None)
    export = nsys_sqlite.read(path, **options)
    nsys_sqlite.load(con, export, 1, offset)
    return con, export


@pytest.mark.parametrize("name", FILES)
def test_batches_smaller_than_a_table_give_the_same_rows(name):
    """Batch boundaries (every 7 rows, then one batch per table) change nothing, not even the order."""
    small, small_export = load_export(corpus(name), batch_rows=7)
    whole, whole_export = load_export(corpus(name), batch_rows=10**9)
    counts = sqlite_counts(corpus(name))
    assert max(counts.values()) > 7
    assert event_table(small) == event_table(whole)
    assert small_export.read == whole_export.read == counts
    assert small_export.skipped == whole_export.skipped
    assert small_export.notes == whole_export.notes


def test_offset_shifts_every_timestamp_in_sql():
    path = corpus(CLOVERLEAF)
    plain, _ = load_export(path)
    shifted, _ = load_export(path, offset=1_000_003)
    pairs = [(a[4], b[4]) for a, b in zip(event_table(plain), event_table(shifted))]
    assert len(pairs) == len(event_table(plain)) > 0
    assert all(b == a + 1_000_003 if a is not None else b is None for a, b in pairs)
    con = db.connect(None)
    ingest(con, [path], offsets={path: 5})
    assert event_table(con) == event_table(load_export(path, offset=5)[0])


def synthetic_export(path):
    """Every mapped table, with rows that exercise each branch (texts with CSV-hostile characters)."""
    src = sqlite3.connect(path)
    src.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        INSERT INTO StringIds VALUES (1, 'cudaMemcpy_v3020'), (2, 'k_long(int, float)'), (3, 'k'), (4, ''),
            (5, 'my domain'), (6, 'range, "quoted" ''x''');
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT);
        INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT,
            correlationId INT, nameId INT, returnValue INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, contextId INT,
            correlationId INT, globalPid INT, demangledName INT, shortName INT, mangledName INT, gridX INT,
            staticSharedMemory INT, dynamicSharedMemory INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, streamId INT,
            correlationId INT, globalPid INT, bytes INT, copyKind INT, srcKind INT, dstKind INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT, end INT, deviceId INT, streamId INT, bytes INT,
            memKind INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INT, end INT, deviceId INT, streamId INT,
            correlationId INT, globalPid INT, syncType INT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, textId INT, globalTid INT,
            endGlobalTid INT, domainId INT);
        """
    )
    g1, g2 = (7 << 24) + 70, (8 << 24) + 80
    src.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?, 1, 0)",
        [(100, 110, 0, g1, 5), (101, 120, 1, g2, 5), (130, 120, 0, g1, 6), (140, 150, 67, g1, 7)],
    )
    src.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 3, 1, 5, ?, ?, ?, ?, 4, ?, ?)",
        [(200, 210, 7 << 24, 2, 3, 2, 48, None), (220, 230, 8 << 24, None, 3, None, None, None),
         (240, 250, 7 << 24, 4, 4, 3, None, None), (None, 260, 7 << 24, 2, 3, 2, None, None)],
    )  # fmt: skip
    src.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, 3, 5, ?, 64, ?, ?, ?)",
        [(300, 310, 7 << 24, 1, 0, 2), (320, 330, 7 << 24, 99, None, 2), (340, 350, 8 << 24, None, 1, 42)],
    )
    src.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, 0, 3, 8, ?)", [(400, 410, 2), (420, 430, None)]
    )
    src.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 3, 9, ?, ?)",
        [(500, 510, 7 << 24, 3), (520, 530, 7 << 24, None), (540, None, 7 << 24, 1)],
    )
    src.executemany(
        "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(None, None, 75, None, 5, g1, None, 9),  # domain create: the name from StringIds
         (600, 700, 59, "step, \"one\"\n'two'", None, g1, g1, 9),
         (610, 690, 60, None, 6, g1, g2, 0),
         (620, None, 34, "", None, g1, None, None),
         (630, 640, 59, None, 77, g1, None, None),
         (650, 660, 59, None, None, g1, None, None),
         (670, 660, 60, "backwards", None, g1, None, None),
         (680, 690, 33, "category", None, g1, None, None)],
    )  # fmt: skip
    src.commit()
    src.close()


def test_synthetic_export_maps_every_table_across_batches(tmp_path):
    path = tmp_path / "all_tables.sqlite"
    synthetic_export(path)
    base = 1_700_000_000_000_000_000
    con, export = load_export(path, batch_rows=2)
    rows = {(r[3], r[4] - base if r[4] is not None else None): r for r in event_table(con)}

    def args(name, ts):
        return orjson.loads(rows[(name, ts)][11])

    # runtime: suffix stripped, class 1 is the driver, correlation scoped by pid (two processes)
    assert rows[("cudaMemcpy", 100)][0] == "cuda_runtime" and rows[("cudaMemcpy", 100)][10] == (7 << 32) + 5
    assert rows[("cudaMemcpy", 101)][0] == "cuda_driver" and rows[("cudaMemcpy", 101)][10] == (8 << 32) + 5
    assert rows[("cudaMemcpy", 100)][6:8] == (7, 70)
    assert args("cudaMemcpy", 100) == {"correlation": 5, "nsys name": "cudaMemcpy_v3020", "eventClass": 0,
                                       "returnValue": 0}  # fmt: skip
    # kernels: the first name that is not empty of demangled, short, mangled
    assert args("k_long(int, float)", 200)["shared memory"] == 48 and args("k", 220)["shared memory"] is None
    assert args("k", 240)["short name"] == "" and args("k", 240)["grid"] == [4, None, None]
    assert rows[("k", 220)][10] == (8 << 32) + 5 and rows[("k", 220)][6:10] == (0, 3, 0, 3)
    assert {k[0] for k in rows if k[1] in (300, 320, 340)} == {
        "Memcpy HtoD (Pageable -> Device)", "Memcpy kind 99", "Memcpy kind None (Pinned -> 42)"}  # fmt: skip
    assert rows[("Memset (Device)", 400)][11] and ("Memset", 420) in rows
    assert rows[("Stream sync", 500)][10] is None and ("sync type None", 520) in rows
    # NVTX: text with commas, quotes and a newline survives; domains; end tid; marks keep empty text
    rng = rows[("step, \"one\"\n'two'", 600)]
    assert rng[:3] == ("user_annotation", "X", "user_annotation") and rng[5] == 100
    assert orjson.loads(rng[11])["domain"] == "my domain" and "end tid" not in orjson.loads(rng[11])
    assert args("range, \"quoted\" 'x'", 610)["end tid"] == 80 and args("range, \"quoted\" 'x'", 610)["domain"] is None
    assert rows[("", 620)][1] == "i" and rows[("", 620)][5] is None
    assert all(r[12] == orjson.dumps({"nsys_table": orjson.loads(r[12])["nsys_table"]}).decode() for r in rows.values())
    assert export.skipped == {
        "runtime call with end before start": 1,
        "runtime row of another event class (not CUDA runtime/driver)": 1,
        "kernel without start": 1,
        "synchronization without end": 1,
        "nvtx event that is not a range or mark (domain/category/thread naming)": 2,
        "nvtx event with unknown string id": 1,
        "nvtx event without text": 1,
        "nvtx range with end before start": 1,
    }
    assert export.notes["runtime_other_event_classes"] == {"67": 1}
    assert sum(export.read.values()) == 24 == len(rows) + sum(export.skipped.values())


def test_malformed_values_and_truncation_mid_table_are_input_errors(tmp_path):
    path = tmp_path / "text_in_int.sqlite"
    synthetic_export(path)
    src = sqlite3.connect(path)
    src.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 2")
    src.commit()
    src.close()
    data = corpus(CLOVERLEAF).read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) * 3 // 4])
    for bad in (path, cut):
        con = db.connect(None)
        with pytest.raises(InputError) as err:
            ingest(con, [bad])
        assert str(bad) in str(err.value) and "\n" not in str(err.value)
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == 0


def test_loader_leaves_the_connection_threads_setting_as_it_found_it():
    """The loader inserts on one DuckDB thread (its read-ahead thread takes the other core) and gives
    the caller's setting back afterwards."""
    con = db.connect(None)
    con.execute("SET threads = 3")
    nsys_sqlite.load(con, nsys_sqlite.read(corpus(CLOVERLEAF)), 1, 0)
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 3
    assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] > 0
