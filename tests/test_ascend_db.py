"""Ascend db exports (torch_npu `ascend_pytorch_profiler_N.db` folders, msprof `msprof_N.db`) land in the
Kineto kinds: every row of the tables read is ingested or counted as skipped, kernels, HCCL ops,
runtime calls and ops match what sqlite3 counts in the source, launches pair, ranks come from the
folders, and the steps view agrees with the profiler's own step breakdown (analysis.db StepTraceTime)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import tracekit
from tests.conftest import corpus
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import ascend_db, nsys_sqlite, recognise

LEVEL1 = "ascend/msinsight__pytorch_db_level1"
LEVEL2 = "ascend/msinsight__pytorch_db_level2"
MSPROF = "ascend/msinsight__full_db__msprof_0.db"
RANK_FOLDERS = [f"{level}/rank{r}_ascend_pt" for level in (LEVEL1, LEVEL2) for r in (0, 1)]
TRACEKIT = str(Path(sys.executable).with_name("tracekit"))


def db_of(folder: Path) -> Path:
    [path] = (folder / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler_*.db")
    return path


def source(path: Path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def scalar(path: Path, query: str):
    con = source(path)
    try:
        return con.execute(query).fetchone()[0]
    finally:
        con.close()


def ingested(path: Path):
    con = db.connect(None)
    ingest(con, [path])
    return con


@pytest.fixture(scope="module")
def runs():
    """Each input ingested once for the module: name -> connection."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = ingested(corpus(name))
        return cache[name]

    return get


# --- recognising the input ---


def test_sniff_takes_ascend_dbs_and_leaves_nsys_and_analysis_dbs():
    def head(path):
        return path.read_bytes()[: 1 << 20]

    for name in RANK_FOLDERS:
        assert ascend_db.sniff(head(db_of(corpus(name))), "x.db")
        assert not ascend_db.sniff(head(corpus(name) / "ASCEND_PROFILER_OUTPUT" / "analysis.db"), "analysis.db")
    assert ascend_db.sniff(head(corpus(MSPROF)), "msprof_0.db")
    nsys = corpus("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    assert not ascend_db.sniff(head(nsys), nsys.name)
    assert recognise(head(nsys), nsys.name) is nsys_sqlite  # the Nsight reader still takes its exports


def test_claims_a_rank_folder_by_its_db_not_by_its_name(tmp_path):
    assert all(ascend_db.claims(corpus(name)) for name in RANK_FOLDERS)
    assert not ascend_db.claims(corpus(LEVEL1))
    text_only = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    text_only.mkdir(parents=True)
    (text_only / "trace_view.json").write_text("[]")
    assert not ascend_db.claims(text_only.parent)
    renamed = tmp_path / "job_output" / "ASCEND_PROFILER_OUTPUT"
    renamed.mkdir(parents=True)
    (renamed / "ascend_pytorch_profiler_3.db").write_bytes(b"")
    assert ascend_db.claims(renamed.parent)
    assert not ascend_db.claims(tmp_path / "missing")


# --- reconciliation and mapping counts ---


def table_counts(path: Path) -> dict:
    con = source(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
    finally:
        con.close()


@pytest.mark.parametrize("name", RANK_FOLDERS + [MSPROF])
def test_every_row_is_ingested_or_skipped_per_table(runs, name):
    con = runs(name)
    path = corpus(name)
    database = db_of(path) if path.is_dir() else path
    read, n_in, n_skip, reasons, notes, fmt = con.execute(
        "SELECT events_read, events_ingested, events_skipped, skipped_reasons, notes, format FROM ingest_log"
    ).fetchone()
    notes, reasons = orjson.loads(notes), orjson.loads(reasons)
    assert fmt == "ascend_db"
    assert read == n_in + n_skip and n_skip == sum(reasons.values())
    assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == n_in
    counts = table_counts(database)
    rows_read = {t: n for t, n in notes["rows_read"].items() if t != "files in the folder not read"}
    assert rows_read == {t: counts[t] for t in rows_read}
    # every table of the db is read as events or joined into them as attributes
    assert set(rows_read) | set(notes["attribute_tables"]) == set(counts)
    assert sum(rows_read.values()) + notes["rows_read"].get("files in the folder not read", 0) == read


@pytest.mark.parametrize("name", RANK_FOLDERS)
def test_kernels_hccl_ops_runtime_calls_and_ops_match_the_source(runs, name):
    con = runs(name)
    path = db_of(corpus(name))
    compute = con.execute("SELECT count(*) FROM kernels WHERE args->>'op type' IS NOT NULL").fetchone()[0]
    assert compute == scalar(path, "SELECT count(*) FROM COMPUTE_TASK_INFO")
    hccl = con.execute("SELECT count(*), count(DISTINCT name) FROM kernels WHERE is_communication").fetchone()
    assert hccl == (scalar(path, "SELECT count(*) FROM COMMUNICATION_OP"),) * 2
    assert con.execute("SELECT count(*) FROM runtime_calls").fetchone()[0] == scalar(
        path, "SELECT count(*) FROM CANN_API"
    )
    kinds = "SELECT count(*) FROM PYTORCH_API p JOIN ENUM_API_TYPE e ON e.id = p.type WHERE e.name IN ({})"
    assert con.execute("SELECT count(*) FROM cpu_ops").fetchone()[0] == scalar(path, kinds.format("'op', 'queue'"))
    assert con.execute("SELECT count(*) FROM python_functions").fetchone()[0] == scalar(path, kinds.format("'trace'"))
    reasons = orjson.loads(con.execute("SELECT skipped_reasons FROM ingest_log").fetchone()[0])
    assert reasons[ascend_db.HCCL_TASK_REASON] == scalar(path, "SELECT count(*) FROM COMMUNICATION_TASK_INFO")
    # every TASK row is a device event or a skipped task, none lost
    device = con.execute("SELECT count(*) FROM events WHERE kind IN ('kernel', 'gpu_memcpy', 'cuda_sync')").fetchone()[
        0
    ]
    task_skips = sum(reasons.get(r, 0) for r in (ascend_db.HCCL_TASK_REASON, ascend_db.CONTAINER_REASON,
                                                   ascend_db.MARKER_REASON))  # fmt: skip
    assert device - hccl[0] + task_skips == scalar(path, "SELECT count(*) FROM TASK")
    # the HCCL op's parameters reach the collectives view
    coll = con.execute("SELECT DISTINCT collective, dtype, process_group FROM collectives").fetchall()
    assert coll == [("allreduce", "Float", scalar(path, "SELECT value FROM STRING_IDS WHERE id = "
                                                        "(SELECT groupName FROM COMMUNICATION_OP LIMIT 1)"))]  # fmt: skip
    nelems = con.execute("SELECT sum(in_nelems) FROM collectives").fetchone()[0]
    assert nelems == scalar(path, "SELECT sum(count) FROM COMMUNICATION_OP")


def test_ops_carry_kineto_args_so_cpu_ops_reads_them(runs):
    con = runs(RANK_FOLDERS[0])
    dims, types, seq = con.execute(
        "SELECT input_dims, input_types, sequence_number FROM cpu_ops WHERE name = 'aten::convolution' ORDER BY ts_ns LIMIT 1"
    ).fetchone()
    # the db writes `32,3,224,224;\r\n64,3,11,11;...` (in its inputDtypes column, which holds the shapes)
    assert orjson.loads(dims)[:3] == [[32, 3, 224, 224], [64, 3, 11, 11], [64]]
    assert orjson.loads(types)[:3] == ["float", "float", "float"]
    assert seq is None or seq >= 0
    with_seq = con.execute("SELECT count(*) FROM cpu_ops WHERE sequence_number IS NOT NULL").fetchone()[0]
    path = db_of(corpus(RANK_FOLDERS[0]))
    assert with_seq == scalar(path, "SELECT count(*) FROM PYTORCH_API WHERE type = 50001 AND sequenceNumber >= 0")


def test_pmu_metrics_are_kept_in_kernel_args(runs):
    con = runs(RANK_FOLDERS[0])
    path = db_of(corpus(RANK_FOLDERS[0]))
    with_pmu = con.execute("SELECT count(*) FROM kernels WHERE args->>'aic_mac_ratio' IS NOT NULL").fetchone()[0]
    assert with_pmu == scalar(
        path, "SELECT count(DISTINCT globalTaskId) FROM TASK_PMU_INFO WHERE name = "
        "(SELECT id FROM STRING_IDS WHERE value = 'aic_mac_ratio')"
    )  # fmt: skip


# --- launches ---


@pytest.mark.parametrize("name", RANK_FOLDERS)
def test_tasks_pair_with_their_launch_calls(runs, name):
    """In these dbs every TASK row but the two PROFILING_ENABLE/DISABLE markers carries a connectionId
    that CANN_API holds (checked below), so every kernel and copy must find its launch call."""
    con = runs(name)
    path = db_of(corpus(name))
    orphans = scalar(path, "SELECT count(*) FROM TASK WHERE connectionId NOT IN (SELECT connectionId FROM CANN_API)")
    assert orphans <= 2
    total, paired = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE event_id IN (SELECT gpu_event_id FROM first_launches)) "
        "FROM gpu_activities"
    ).fetchone()
    assert total > 0 and paired / total >= 0.99
    launcher = con.execute(
        "SELECT DISTINCT l.runtime_name FROM first_launches l JOIN kernels k ON k.event_id = l.gpu_event_id "
        "WHERE k.is_communication"
    ).fetchall()
    assert launcher == [("launch",)]
    # the op -> launch link: most launch calls carry the External id of the op that made them
    ops = con.execute(
        "SELECT count(*) FILTER (WHERE external_id IN (SELECT external_id FROM cpu_ops)), count(*) "
        "FROM runtime_calls WHERE name = 'launch'"
    ).fetchone()
    assert ops[0] / ops[1] >= 0.9


# --- ranks, jobs and lone files ---


@pytest.mark.parametrize("name", RANK_FOLDERS)
def test_rank_from_profiler_info(runs, name):
    con = runs(name)
    [info] = corpus(name).glob("profiler_info_*.json")
    rank = orjson.loads(info.read_bytes())["rank_id"]
    assert con.execute("SELECT rank, rank_source FROM runs").fetchone() == (rank, f"profiler_info_{rank}.json")


def test_a_parent_folder_is_one_job_of_two_ranks():
    with tracekit.open(corpus(LEVEL1)) as trace:
        assert len(trace.runs) == 2
        ranks = trace.sql("SELECT rank, format, label FROM runs ORDER BY rank").fetchall()
    assert ranks == [(0, "ascend_db", "rank0_ascend_pt"), (1, "ascend_db", "rank1_ascend_pt")]


def test_text_exports_beside_the_db_are_counted_not_read(tmp_path):
    folder = tmp_path / "rank0_ascend_pt"
    shutil.copytree(corpus(RANK_FOLDERS[0]), folder)
    (folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text("[]")
    con = ingested(folder)
    reasons = orjson.loads(con.execute("SELECT skipped_reasons FROM ingest_log").fetchone()[0])
    assert reasons["file not read: ASCEND_PROFILER_OUTPUT/trace_view.json (the db holds the same events)"] == 1


def test_a_lone_db_file_reads_without_analysis_db(runs):
    path = db_of(corpus(RANK_FOLDERS[1]))
    con = ingested(path)
    assert con.execute("SELECT format, rank, rank_source FROM runs").fetchone() == ("ascend_db", 1, "RANK_DEVICE_MAP")
    assert con.execute("SELECT count(*) FROM run_metrics").fetchone()[0] == 0
    folder = runs(RANK_FOLDERS[1])
    same = "SELECT kind, count(*) FROM events GROUP BY ALL ORDER BY ALL"
    assert con.execute(same).fetchall() == folder.execute(same).fetchall()


def test_msprof_db_maps_tasks_and_api_calls(runs):
    con = runs(MSPROF)
    path = corpus(MSPROF)
    compute = con.execute("SELECT count(*) FROM kernels WHERE args->>'op type' IS NOT NULL").fetchone()[0]
    assert compute == scalar(path, "SELECT count(*) FROM COMPUTE_TASK_INFO")
    assert con.execute("SELECT count(*) FROM runtime_calls").fetchone()[0] == scalar(path, 'SELECT count(*) FROM "API"')
    # its COMMUNICATION_OP is empty (trimmed): the HCCL tasks are the only record of the collective
    assert scalar(path, "SELECT count(*) FROM COMMUNICATION_OP") == 0
    hccl_tasks = "SELECT count(*) FROM TASK WHERE globalTaskId IN (SELECT globalTaskId FROM COMMUNICATION_TASK_INFO)"
    assert con.execute("SELECT count(*) FROM kernels WHERE args->>'hccl task type' IS NOT NULL").fetchone()[0] == (
        scalar(path, hccl_tasks)
    )
    props = orjson.loads(con.execute("SELECT device_properties FROM runs").fetchone()[0])
    assert len(props) == scalar(path, "SELECT count(*) FROM NPU_INFO")


# --- bad input ---


def test_a_truncated_db_is_one_input_error(tmp_path):
    raw = db_of(corpus(RANK_FOLDERS[0])).read_bytes()
    for share in (0.1, 0.5, 0.9):
        path = tmp_path / f"ascend_pytorch_profiler_{int(share * 10)}.db"
        path.write_bytes(raw[: int(len(raw) * share)])
        with pytest.raises(InputError) as e:
            ingest(db.connect(None), [path])
        assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_task_table_without_its_times_is_one_input_error(tmp_path):
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    shutil.copy(db_of(corpus(RANK_FOLDERS[0])), path)
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE TASK DROP COLUMN endNs")
    con.commit()
    con.close()
    with pytest.raises(InputError) as e:
        ingest(db.connect(None), [path])
    assert "table TASK" in str(e.value) and "endNs" in str(e.value) and "\n" not in str(e.value)


def test_times_and_ids_of_the_wrong_type_are_skipped_not_a_crash(tmp_path):
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    shutil.copy(db_of(corpus(RANK_FOLDERS[0])), path)
    con = sqlite3.connect(path)
    con.execute("UPDATE TASK SET startNs = 'soon' WHERE rowid = 5")
    con.execute("UPDATE CANN_API SET globalTid = X'00ff' WHERE rowid = 3")
    con.commit()
    con.close()
    [result] = ingest(out := db.connect(None), [path])
    assert result.events_read == result.events_ingested + result.events_skipped
    assert out.execute("SELECT count(*) FROM event_rows").fetchone()[0] == result.events_ingested


# --- the step cross-check against the profiler's own breakdown ---


def step_trace(folder: Path) -> dict:
    con = source(folder / "ASCEND_PROFILER_OUTPUT" / "analysis.db")
    try:
        cur = con.execute("SELECT * FROM StepTraceTime")
        [row] = cur.fetchall()
        return {d[0]: v for d, v in zip(cur.description, row)}
    finally:
        con.close()


def near(ours: float, theirs: float, share: float = 0.05) -> bool:
    return abs(ours - theirs) <= share * abs(theirs)


@pytest.mark.parametrize("name", RANK_FOLDERS)
def test_steps_agree_with_step_trace_time(runs, name):
    """analysis.db StepTraceTime (us) against tracekit's steps view (ns), within 5%.

    computing and communication_not_overlapped are compared as they are. msprof's `free` is not the
    steps view's idle time: msprof measures it over the step's device span (`stage`: first to last
    compute task of the step) and puts the time before the first task in `preparing`, while the steps
    view idles over the whole ProfilerStep window. So free is compared with tracekit's idle time over
    that same span, and the span and preparing are checked against the kernels of the step."""
    con = runs(name)
    theirs = {k: v * 1000 for k, v in step_trace(corpus(name)).items() if k != "step"}
    [step] = con.execute("SELECT * FROM steps").fetchdf().to_dict("records")
    assert step["annotation"] == f"ProfilerStep#{step_trace(corpus(name))['step']}"
    assert near(step["compute_ns"], theirs["computing"])
    assert near(step["comm_exposed_ns"], theirs["communication_not_overlapped"])
    assert near(step["comm_ns"], theirs["communication"])
    first, last = con.execute(
        "SELECT min(ts_ns), max(end_ns) FROM kernels WHERE NOT is_communication AND ts_ns >= $1 AND end_ns <= $2",
        [step["start_ns"], step["end_ns"]],
    ).fetchone()
    assert near(last - first, theirs["stage"])
    assert near(first - step["start_ns"], theirs["preparing"])
    con.execute(f"CREATE OR REPLACE TEMP TABLE stage AS SELECT {step['device']} AS device, 1 AS run_id, "
                f"{first}::BIGINT AS start_ns, {last}::BIGINT AS end_ns")  # fmt: skip
    busy = con.execute("SELECT busy_ns FROM gpu_busy_between('stage', 'all')").fetchone()[0]
    assert near((last - first) - busy, theirs["free"])
    # and the whole step's idle time is that free time plus the span outside the device's work
    outside = (first - step["start_ns"]) + (step["end_ns"] - last)
    assert abs(step["idle_ns"] - ((last - first) - busy) - outside) <= 0.05 * theirs["free"]


def test_step_trace_time_is_in_run_metrics(runs):
    con = runs(RANK_FOLDERS[0])
    value, args = con.execute(
        "SELECT value, args FROM run_metrics WHERE name = 'profiler_step_computing_ns'"
    ).fetchone()
    assert value == pytest.approx(step_trace(corpus(RANK_FOLDERS[0]))["computing"] * 1000)
    assert orjson.loads(args) | {} == {"source": "analysis.db StepTraceTime", "step": "50", "unit as written": "us"}


def test_gpu_busy_counts_an_hccl_op_once(runs):
    """Busy time on the communication stream is the HCCL ops' spans: their tasks are not events too."""
    con = runs(RANK_FOLDERS[0])
    path = db_of(corpus(RANK_FOLDERS[0]))
    comm = con.execute("SELECT sum(dur_ns) FROM gpu_busy_layers WHERE layer = 'communication'").fetchone()[0]
    assert comm == scalar(path, "SELECT sum(endNs - startNs) FROM COMMUNICATION_OP")  # the 4 ops do not overlap


# --- the CLI ---


@pytest.mark.parametrize("name", [LEVEL1, LEVEL2, MSPROF])
def test_analyze_cli_names_the_runs(name):
    proc = subprocess.run([TRACEKIT, "analyze", str(corpus(name))], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    expected = ["rank0_ascend_pt", "rank1_ascend_pt"] if name != MSPROF else ["msinsight__full_db__msprof_0"]
    assert all(label in proc.stdout for label in expected)
