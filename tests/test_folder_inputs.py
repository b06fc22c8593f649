"""A folder a reader claims as a whole is one input: one run of its files, found at any depth, with
one digest and size over its files (parsers.claim, tracekit/ingest/inputs.py)."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest

from tests.conftest import sample
from tracekit import db, parsers
from tracekit.ingest import inputs
from tracekit.ingest.digest import content_digest
from tracekit.ingest.pipeline import ingest
from tracekit.parsers import rows

TRACE = sample("gpu_tp2_rank0.json.gz")


def _read(path, **options):
    """One event per line of every `*.events` file in the folder; any other file counted as skipped."""
    export = rows.Export(source=Path(path), format="folder_fixture")
    for file in sorted(Path(path).rglob("*")):
        if file.suffix == ".events":
            for i, line in enumerate(file.read_text().splitlines()):
                export.rows.append(("cpu_op", "X", "op", line, 1000 * i, 500, 1, 1) + (None,) * 8)
                export.read["events"] += 1
        elif file.is_file() and file.name != "marker":
            export.read["files"] += 1
            export.skipped["file not read"] += 1
    return export


FOLDER_READER = types.ModuleType("folder_fixture")  # a reader is a module (hashable, as ingest keys them)
FOLDER_READER.__dict__.update(
    FORMAT="folder_fixture", DESCRIPTION="a test's folder format",
    sniff=lambda head, name, **options: False, read=_read,
    claims=lambda folder: (Path(folder) / "marker").is_file(),
)  # fmt: skip


@pytest.fixture
def folder_reader(monkeypatch):
    real = parsers.readers()
    monkeypatch.setattr(parsers, "readers", lambda: (FOLDER_READER, *real))


def _rank_folder(parent: Path, name: str, ops: list[str]) -> Path:
    folder = parent / name / "OUTPUT"
    folder.mkdir(parents=True)
    (parent / name / "marker").write_text("")
    (folder / "ops.events").write_text("\n".join(ops))
    (folder / "notes.txt").write_text("not read")
    return parent / name


def test_a_claimed_folder_is_one_run_of_its_files(tmp_path, folder_reader):
    rank = _rank_folder(tmp_path, "rank0_out", ["aten::mm", "aten::add"])
    con = db.connect(None)
    [result] = ingest(con, [rank])
    assert result.source == str(rank) and result.format == "folder_fixture"
    assert (result.events_read, result.events_ingested, result.events_skipped) == (3, 2, 1)
    assert result.bytes_read == sum(f.stat().st_size for f in rank.rglob("*") if f.is_file())
    assert con.execute("SELECT list(name ORDER BY ts_ns) FROM events").fetchone()[0] == ["aten::mm", "aten::add"]
    assert con.execute("SELECT rank FROM runs").fetchone()[0] == 0  # `rank0` in the folder's name


def test_a_parent_of_claimed_folders_is_one_input_each_beside_its_files(tmp_path, folder_reader):
    job = tmp_path / "job"
    job.mkdir()
    ranks = [_rank_folder(job / "nodes", f"rank{r}_out", [f"op{r}"]) for r in (10, 2)]
    shutil.copyfile(TRACE, job / "gpu.json.gz")
    (job / "README").write_text("a stray file")
    found = inputs.expand([job])
    assert [i.path for i in found] == [job / "gpu.json.gz", ranks[1], ranks[0]]  # natural order: rank2 first
    assert [i.reader.FORMAT for i in found] == ["kineto", "folder_fixture", "folder_fixture"]
    assert all(i.notes["input"]["skipped_in_folder"] == ["README"] for i in found)
    con = db.connect(None)
    results = ingest(con, [job])
    assert [r.rank for r in results] == [0, 2, 10]


def test_a_folder_nobody_claims_is_still_its_files(tmp_path, folder_reader):
    folder = tmp_path / "plain"
    folder.mkdir()
    shutil.copyfile(TRACE, folder / "t.json.gz")
    assert [(i.path, i.reader.FORMAT) for i in inputs.expand([folder])] == [(folder / "t.json.gz", "kineto")]


def test_a_folder_digest_follows_its_files(tmp_path, folder_reader):
    rank = _rank_folder(tmp_path, "rank0_out", ["a"])
    before = content_digest(rank)
    assert before.startswith("folder-sha256:") and content_digest(rank) == before
    (rank / "OUTPUT" / "ops.events").write_text("b")
    assert content_digest(rank) != before
    con = db.connect(None)
    ingest(con, [rank])
    assert ingest(con, [rank], same_content="skip") == []  # the same folder again is recognised


def test_files_recognised_two_at_a_time_are_what_one_at_a_time_gives(tmp_path):
    """classify_all: each file's reader as classify gives it (on this thread and the pool's), an
    unreadable one's error raised by expand when its turn comes, and an ingest of good and bad files
    with on_error as before."""
    from concurrent.futures import ThreadPoolExecutor

    from tracekit.errors import InputError

    bad = tmp_path / "notes.txt"
    bad.write_text("not a trace\n")
    good = [sample("gloo_rank0.json.gz"), sample("cpu_two_threads.json.gz")]
    assert inputs.classify_all([good[0], bad, good[1]], None) == {}  # without a pool: each in its turn
    with ThreadPoolExecutor(max_workers=1) as pool:
        known = inputs.classify_all([good[0], bad, good[1]], pool)
    assert known[good[0]] is inputs.classify(good[0]) and known[good[1]] is inputs.classify(good[1])
    assert isinstance(known[bad], InputError) and str(bad) in str(known[bad])
    assert [i.reader for i in inputs.expand(good, dict(known))] == [known[good[0]], known[good[1]]]
    with pytest.raises(InputError, match="not a format tracekit reads"):
        inputs.expand([bad], dict(known))
    con = db.connect(str(tmp_path / "t.duckdb"))
    failed = []
    done = ingest(con, [good[0], bad, good[1]], on_error=lambda path, e: failed.append((path, e)))
    assert [r.source for r in done] == [str(good[0]), str(good[1])]
    assert [str(path) for path, _ in failed] == [str(bad)]
