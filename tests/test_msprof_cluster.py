"""msprof-analyze cluster outputs (parsers/msprof_cluster.py) as run_metrics of one multi-rank job,
and the cluster_step_components view over them; on the corpus inputs in place."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, corpus
from tracekit import db, parsers
from tracekit.errors import InputError
from tracekit.ingest import inputs
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import msprof_cluster

FOLDER = "ascend/msinsight__server_test_data_gpt3/cluster_analysis_output"
DB = "ascend/msinsight__full_db__cluster_analysis.db"
COLUMNS = {"Computing": "computing_ns", "Communication(Not Overlapped)": "communication_not_overlapped_ns",
           "Free": "free_ns", "Stage": "stage_ns", "Bubble": "bubble_ns"}  # fmt: skip


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_cluster_folder_metrics_equal_the_csv():
    folder = corpus(FOLDER)
    con = db.connect(None)
    [result] = ingest(con, [folder])
    assert result.format == "msprof_cluster" and result.events_read == result.events_ingested + result.events_skipped
    rows = _rows(folder / "cluster_step_trace_time.csv")
    ranks = [r for r in rows if r["Type"] == "rank"]
    assert con.execute("SELECT world_size FROM runs").fetchone()[0] == len(ranks) == 16
    got = {
        r[0]: r[1:]
        for r in con.execute(
            f"SELECT rank, {', '.join(COLUMNS.values())} FROM cluster_step_components ORDER BY rank"
        ).fetchall()
    }
    assert set(got) == {int(r["Index"]) for r in ranks}
    for r in ranks:
        assert got[int(r["Index"])] == pytest.approx([float(r[c]) * 1000 for c in COLUMNS], abs=1)
    assert con.execute("SELECT DISTINCT step FROM cluster_step_components").fetchall() == [(int(rows[0]["Step"]),)]
    stages = con.execute("SELECT count(*) FROM run_metrics WHERE name = 'cluster_stage.free_ns'").fetchone()[0]
    assert stages == sum(r["Type"] == "stage" for r in rows)
    groups = json.loads(con.execute("SELECT metadata FROM runs").fetchone()[0])["communication_groups"]
    assert groups == json.loads((folder / "communication_group.json").read_text())
    matrix = json.loads((folder / "cluster_communication_matrix.json").read_text())
    links = [(link, v) for g in matrix.values() for s in g.values() for op in s.values() for link, v in op.items()]
    got = con.execute(
        "SELECT count(*), sum(value) FROM run_metrics WHERE name = 'cluster_link.bandwidth_gbps'"
    ).fetchone()
    assert got == (len(links), pytest.approx(sum(v["Bandwidth(GB/s)"] for _, v in links)))


def test_the_longest_free_rank_is_in_the_second_pipeline_stage():
    con = db.connect(None)
    ingest(con, [corpus(FOLDER)])
    rows = _rows(corpus(FOLDER) / "cluster_step_trace_time.csv")
    expected = max((r for r in rows if r["Type"] == "rank"), key=lambda r: float(r["Free"]))
    rank, bubble = con.execute(
        "SELECT rank, bubble_ns FROM cluster_step_components ORDER BY free_ns DESC LIMIT 1"
    ).fetchone()
    assert rank == int(expected["Index"]) and bubble > 0


def test_cluster_db_sniffed_before_nsys_and_its_metrics_equal_the_tables():
    path = corpus(DB)
    assert inputs.classify(path) is msprof_cluster
    msprof_db = corpus("ascend/msinsight__full_db__msprof_0.db")
    assert inputs.classify(msprof_db) is not msprof_cluster  # an msprof db is another reader's
    con = db.connect(None)
    [result] = ingest(con, [path])
    assert result.events_read == result.events_ingested + result.events_skipped
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ranks = src.execute("SELECT \"index\", free, computing FROM ClusterStepTraceTime WHERE type = 'rank'").fetchall()
    got = dict(
        (r, (f, c))
        for r, f, c in con.execute("SELECT rank, free_ns, computing_ns FROM cluster_step_components").fetchall()
    )
    assert {str(k) for k in got} == {r[0] for r in ranks}
    for rank, free, computing in ranks:
        assert got[int(rank)] == pytest.approx((free * 1000, computing * 1000), abs=1)
    assert con.execute("SELECT world_size FROM runs").fetchone()[0] == len(ranks)
    for table, metric in (("ClusterCommAnalyzerTime", "cluster_comm.elapsed_time_ns"),
                          ("ClusterCommAnalyzerMatrix", "cluster_link.bandwidth_gbps")):  # fmt: skip
        n = src.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert result.events_read >= n
        assert con.execute("SELECT count(*) FROM run_metrics WHERE name = ?", [metric]).fetchone()[0] == n
    bands = src.execute(
        "SELECT count(*) FROM (SELECT DISTINCT rank_set, step, rank_id, hccl_op_name, band_type FROM "
        "ClusterCommAnalyzerBandwidth WHERE transit_size > 0)").fetchone()[0]  # fmt: skip
    assert (
        con.execute("SELECT count(*) FROM run_metrics WHERE name = 'cluster_comm.bandwidth_gbps'").fetchone()[0]
        == bands
    )


def test_claims_the_cluster_folder_not_its_parent():
    gpt3 = corpus("ascend/msinsight__server_test_data_gpt3")
    assert msprof_cluster.claims(gpt3 / "cluster_analysis_output") and not msprof_cluster.claims(gpt3)
    assert parsers.claim(gpt3 / "cluster_analysis_output") is msprof_cluster


def test_missing_column_and_table_are_one_input_error(tmp_path):
    folder = tmp_path / "cluster_analysis_output"
    shutil.copytree(corpus(FOLDER), folder)
    for p in folder.iterdir():
        p.chmod(0o644)
    csv_file = folder / "cluster_step_trace_time.csv"
    csv_file.write_text(csv_file.read_text().replace("Free,", "Idle,", 1))
    with pytest.raises(InputError, match="column 'Free'"):
        msprof_cluster.read(folder)
    copy = tmp_path / "cluster_analysis.db"
    shutil.copyfile(corpus(DB), copy)
    copy.chmod(0o644)
    con = sqlite3.connect(copy)
    con.execute("ALTER TABLE ClusterCommAnalyzerTime RENAME COLUMN elapsed_time TO elapsed")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="column 'elapsed_time'"):
        msprof_cluster.read(copy)


def test_truncated_json_is_one_input_error(tmp_path):
    folder = tmp_path / "cluster_analysis_output"
    shutil.copytree(corpus(FOLDER), folder)
    comm = folder / "cluster_communication.json"
    comm.chmod(0o644)
    comm.write_bytes(comm.read_bytes()[:3000])
    with pytest.raises(InputError, match=r"cluster_communication\.json: byte \d+: JSON"):
        msprof_cluster.read(folder)


@pytest.mark.parametrize("name", [FOLDER, DB])
def test_analyze_cli_names_the_run(name):
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "tracekit"), "analyze", str(corpus(name))],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Path(name).name.split(".")[0][:30] in done.stdout
