"""A tracekit database is an ordinary DuckDB file: the DuckDB CLI from PyPI (duckdb-cli) opens it,
and every public table and view binds there, although tracekit itself may run a newer DuckDB."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import sample
from tracekit import db
from tracekit.db import stdlib

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
DUCKDB_CLI = shutil.which("duckdb", path=str(Path(sys.executable).parent)) or shutil.which("duckdb")


@pytest.mark.skipif(DUCKDB_CLI is None, reason="the duckdb CLI is not installed (pip install duckdb-cli)")
def test_duckdb_cli_reads_a_tracekit_database(tmp_path):
    path = tmp_path / "run.duckdb"
    subprocess.run([TRACEKIT, "ingest", sample("gpu_prefill_decode_eager.json.gz"), "--db", str(path)], check=True,
                   capture_output=True)  # fmt: skip
    con = db.connect(str(path), read_only=True)
    expected = con.execute("SELECT count(*) FROM kernels").fetchone()[0]
    con.close()
    assert expected > 0
    queries = [f"SELECT count(*) FROM {rel};" for rel in stdlib.public("table") + stdlib.public("view")]
    out = subprocess.run(
        [DUCKDB_CLI, "-readonly", "-csv", "-noheader", str(path), "-c", "SELECT count(*) FROM kernels;" + "".join(queries)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == str(expected)
    assert len(lines) == 1 + len(queries)
    version = subprocess.run([DUCKDB_CLI, "-version"], capture_output=True, text=True).stdout
    assert version.strip(), "the CLI reports its version"
