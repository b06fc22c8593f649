"""A write that finds no room (a full device, or the file-size limit of the process) ends in one line
naming the path, the space free and the space needed, exit 2; the database survives, and once there is
room the same ingest goes in exactly, with nothing of the failed one left."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import corpus, sample
from .test_kill_ingest import _check_exact, _events_of_a_clean_ingest, _staged

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
FIRST = sample("gloo_rank0.json.gz")
BIG = corpus("hta__negative_queue_length_values_check__rank0.json.gz")  # 26 MB of JSON, a 7 MB database


@pytest.fixture(scope="module")
def clean_counts():
    return {p: _events_of_a_clean_ingest(p) for p in (FIRST, BIG)}


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MB tmpfs (needs root to mount)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root); test_file_size_limit covers the same path")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave_bytes: int) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        free = shutil.disk_usage(disk).free - leave_bytes
        chunk = b"\0" * (1 << 20)
        while free > 0:
            f.write(chunk[: min(len(chunk), free)])
            free -= len(chunk)
    return filler


def _ingest(trace: Path, db: Path, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([TRACEKIT, "ingest", "-q", str(trace), "--db", str(db)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300, **kw)  # fmt: skip


def _one_line_error(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_full_device_under_the_database(small_disk, clean_counts, tmp_path):
    db = small_disk / "t.duckdb"
    assert _ingest(FIRST, db).returncode == 0
    filler = _fill(small_disk, leave_bytes=1 << 20)
    line = _one_line_error(_ingest(BIG, db), str(db), "no space left on the device", "MB free there", "needs about")
    assert "needs about 8 MB" in line  # 0.3 of the 26 MB of JSON: the database takes 0.12-0.27 of it
    filler.unlink()
    assert _ingest(BIG, db).returncode == 0
    runs = _check_exact(db, clean_counts)
    assert sorted(runs.values()) == sorted([str(FIRST), str(BIG)])


def test_a_full_temporary_folder(small_disk, clean_counts, tmp_path):
    db = tmp_path / "t.duckdb"
    filler = _fill(small_disk, leave_bytes=2 << 20)
    result = _ingest(BIG, db, env={"TMPDIR": str(small_disk)})
    _one_line_error(result, str(small_disk), "no space left on the device", "needs about 26 MB")
    assert _staged(small_disk) == []
    filler.unlink()
    assert _ingest(BIG, db, env={"TMPDIR": str(small_disk)}).returncode == 0
    assert sorted(_check_exact(db, clean_counts).values()) == [str(BIG)]


def test_file_size_limit(clean_counts, tmp_path):
    """The same path without root: RLIMIT_FSIZE makes a write past 3 MB fail with EFBIG (Python
    ignores SIGXFSZ), in the database file and in staged temporary files alike."""
    db = tmp_path / "t.duckdb"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))

    assert _ingest(FIRST, db).returncode == 0
    _one_line_error(_ingest(BIG, db, preexec_fn=limit), "file size limit reached")
    assert _ingest(BIG, db).returncode == 0
    assert sorted(_check_exact(db, clean_counts).values()) == sorted([str(FIRST), str(BIG)])
