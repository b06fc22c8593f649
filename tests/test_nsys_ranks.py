"""A Nsight Systems file holding several ranks (one process per GPU) becomes one run per rank.

No public multi-process export is in the corpus, so the two-rank file is made from the real saxpy
export (MPI rank 0 of a Perlmutter job): its process is copied as a second process on device 1,
named `MPI Rank 1` as nsys names an MPI process's threads, with rank 1's runtime calls shifted.
"""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from tests.conftest import corpus
from tracekit import db
from tracekit.ingest.pipeline import ingest

SAXPY = "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
PID_STEP = 1 << 24  # globalPid/globalTid hold the pid from bit 24


def _second_process(path, shift_ns: int = 1000) -> None:
    """Copy every event row of the file's one MPI process as another process on device 1."""
    con = sqlite3.connect(path)
    pid = con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    name_id = con.execute("SELECT max(id) + 1 FROM StringIds").fetchone()[0]
    con.execute("INSERT INTO StringIds VALUES (?, 'MPI Rank 1')", [name_id])
    rank0 = con.execute("SELECT id FROM StringIds WHERE value = 'MPI Rank 0'").fetchone()[0]
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        select = ", ".join(
            {"globalPid": f"globalPid + {PID_STEP}", "deviceId": "1", "start": f"start + {shift_ns}",
             "end": f'"end" + {shift_ns}'}.get(c, f'"{c}"')
            for c in cols
        )  # fmt: skip
        con.execute(f"INSERT INTO {table} SELECT {select} FROM {table} WHERE globalPid = ?", [pid])
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "ThreadNames"):
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        moved = {"globalTid": f"globalTid + {PID_STEP}", "endGlobalTid": f"endGlobalTid + {PID_STEP}",
                 "start": f"start + {shift_ns}", "end": f'"end" + {shift_ns}',
                 "nameId": f"CASE WHEN nameId = {rank0} THEN {name_id} ELSE nameId END"}  # fmt: skip
        if table != "ThreadNames":
            moved.pop("nameId")
        select = ", ".join(moved.get(c, f'"{c}"') for c in cols)
        con.execute(f"INSERT INTO {table} SELECT {select} FROM {table} WHERE globalTid >> 24 = ?", [pid >> 24])
    con.commit()
    con.close()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    path = tmp_path_factory.mktemp("nsys") / "saxpy_two_ranks.sqlite"
    shutil.copy(corpus(SAXPY), path)
    _second_process(path)
    con = db.connect(None)
    results = ingest(con, [path])
    yield con, results
    con.close()


def test_each_process_with_gpu_work_is_a_run_with_its_rank(two_ranks):
    con, results = two_ranks
    runs = con.execute("SELECT run_id, rank, world_size, rank_source, label FROM runs ORDER BY rank").fetchall()
    assert [(r[1], r[2]) for r in runs] == [(0, 2), (1, 2)]
    assert all(r[3] == "nsys thread name (MPI Rank N)" for r in runs)
    assert runs[0][4] != runs[1][4]
    devices = con.execute(
        "SELECT r.rank, list(DISTINCT k.device) FROM kernels k JOIN runs r USING (run_id) GROUP BY 1 ORDER BY 1"
    )
    assert devices.fetchall() == [(0, [0]), (1, [1])]
    assert len(results) == 2


def test_the_split_keeps_every_row_and_each_run_reconciles(two_ranks):
    con, _ = two_ranks
    total = sum(
        sqlite3.connect(con.execute("SELECT source FROM runs LIMIT 1").fetchone()[0])
        .execute(f"SELECT count(*) FROM {t}")
        .fetchone()[0]
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME",
                  "NVTX_EVENTS", "ThreadNames")
    )  # fmt: skip
    log = con.execute(
        "SELECT run_id, events_read, events_ingested, events_skipped FROM ingest_log ORDER BY run_id"
    ).fetchall()
    assert sum(r[1] for r in log) == total
    for run_id, read, ingested, skipped in log:
        assert read == ingested + skipped
        assert con.execute("SELECT count(*) FROM events WHERE run_id = ?", [run_id]).fetchone()[0] == ingested


def test_each_rank_has_its_own_launches_and_the_same_work(two_ranks):
    con, _ = two_ranks
    per_rank = con.execute(
        "SELECT r.rank, count(*), count(DISTINCT l.pid) FROM launches l JOIN runs r USING (run_id) GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert per_rank[0][1] == per_rank[1][1] > 0
    assert [p for _, _, p in per_rank] == [1, 1]


def test_a_file_of_one_process_stays_one_run(loaded):
    con = loaded(corpus(SAXPY))
    assert con.execute("SELECT count(*), any_value(rank_source) FROM runs").fetchone() == (1, None)
