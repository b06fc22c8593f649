"""The one ingest path: every input recognised once, a run all or nothing, folders expanded, any
format read compressed."""

from __future__ import annotations

import gzip
import lzma
import shutil
import zipfile

import pytest

from tests.conftest import corpus, sample
from tracekit import compression, db, parsers
from tracekit.db import run_tables
from tracekit.errors import InputError, TracekitError
from tracekit.ingest import inputs, pipeline
from tracekit.ingest.pipeline import ingest

RANK0, RANK1 = sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")
DEMO_TRACE, DEMO_LOG = sample("runtime_demo.json.gz"), sample("runtime_demo.events.jsonl")


def fingerprint(con, run_id: int = 1):
    return con.execute(
        "SELECT count(*), sum(hash(event_id - (SELECT min(event_id) FROM events WHERE run_id = $r), name, ts_ns, "
        "dur_ns, kind, args, depth)) FROM events WHERE run_id = $r",
        {"r": run_id},
    ).fetchone()


def alone(*paths):
    con = db.connect(None)
    ingest(con, list(paths))
    return con


def rows_per_table(con) -> dict:
    return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in run_tables(con)}


def test_every_input_is_opened_and_recognised_once(monkeypatch):
    heads, decisions = [], []  # the prefixes read to recognise a format, and the decisions taken on them
    prefix, recognise = compression.prefix, parsers.recognise

    def counted_prefix(path, n):
        if n == parsers.HEAD_BYTES:  # a reader may read its own file's start again to read it (numerics: its layout)
            heads.append(path)
        return prefix(path, n)

    def counted_recognise(prefix, name, **options):
        decisions.append(name)
        return recognise(prefix, name, **options)

    monkeypatch.setattr(compression, "prefix", counted_prefix)
    monkeypatch.setattr(parsers, "recognise", counted_recognise)
    results = ingest(db.connect(None), [DEMO_TRACE, DEMO_LOG, sample("numerics_tf32.csv")])
    assert [r.format for r in results] == ["kineto", "runtime_events", "numerics_report"]
    # each once, in whatever order (files are recognised two at a time: inputs.classify_all)
    assert sorted(map(str, heads)) == sorted(map(str, [DEMO_TRACE, DEMO_LOG, sample("numerics_tf32.csv")]))
    assert sorted(decisions) == sorted(p.name for p in heads)


@pytest.mark.parametrize("files", [[RANK0], [DEMO_TRACE, DEMO_LOG], [corpus("energyllm__vllm_server.log")]])
def test_a_failure_after_the_rows_leaves_nothing_of_the_run(monkeypatch, files):
    con = db.connect(None)
    [kept] = ingest(con, [sample("cpu_two_threads.json.gz")])
    before = rows_per_table(con)

    def fail(con, run_id):
        assert con.execute("SELECT count(*) FROM event_rows WHERE run_id = ?", [run_id]).fetchone()[0] > 0
        raise KeyboardInterrupt  # after the rows' transaction committed

    monkeypatch.setattr(pipeline, "compute_nesting", fail)
    with pytest.raises(KeyboardInterrupt):
        ingest(con, files)
    assert rows_per_table(con) == before
    monkeypatch.undo()
    [again, *_] = ingest(con, files)
    # the failed ingest's run id is not handed out again (a sequence: see tracekit.db.pending)
    assert again.run_id == kept.run_id + 2 and fingerprint(con, again.run_id) == fingerprint(alone(*files))


def test_a_folder_is_its_trace_files_in_name_order(tmp_path):
    folder = tmp_path / "tb_logs"
    folder.mkdir()
    # tensorboard_trace_handler names: one file per rank (worker), rank10 sorts after rank2
    shutil.copyfile(RANK1, folder / "host_rank10.1700000000.pt.trace.json.gz")
    shutil.copyfile(RANK0, folder / "host_rank2.1700000000.pt.trace.json.gz")
    (folder / "README.txt").write_text("profiled with torch.profiler\n")
    (folder / "config.json").write_text('{"schedule": {"wait": 1}}')  # JSON, but no reader recognises it
    (folder / ".hidden.json.gz").write_bytes(RANK0.read_bytes())
    con = db.connect(None)
    results = ingest(con, [folder])
    assert [r.source for r in results] == [str(folder / "host_rank2.1700000000.pt.trace.json.gz"),
                                           str(folder / "host_rank10.1700000000.pt.trace.json.gz")]  # fmt: skip
    assert [r.events_read for r in results] == [ingest(db.connect(None), [p])[0].events_read for p in (RANK0, RANK1)]
    assert fingerprint(con, 1) == fingerprint(alone(RANK0)) and fingerprint(con, 2) == fingerprint(alone(RANK1))
    notes = [n for (n,) in con.execute("SELECT notes::JSON->'input' FROM ingest_log ORDER BY run_id").fetchall()]
    assert all('"skipped_in_folder":["README.txt","config.json"]' in n and str(folder) in n for n in notes)


def test_a_folder_with_nothing_to_read_is_one_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="it is empty") as err:
        ingest(db.connect(None), [empty])
    assert str(empty) in str(err.value)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("nothing")
    with pytest.raises(InputError, match="no file in it is a format tracekit reads \\(a.txt\\)"):
        ingest(db.connect(None), [notes])


def test_a_folder_keeps_a_log_with_its_trace(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copyfile(DEMO_TRACE, folder / "demo.json.gz")
    shutil.copyfile(DEMO_LOG, folder / "demo.jsonl")
    results = ingest(db.connect(None), [folder])
    assert [(r.run_id, r.format) for r in results] == [(1, "kineto"), (1, "runtime_events")]


def _compressed(kind: str, source, tmp_path):
    data = compression.read_bytes(source)
    path = tmp_path / f"input.{kind}"
    if kind == "xz":
        path.write_bytes(lzma.compress(data))
    elif kind == "gz":
        path.write_bytes(gzip.compress(data))
    else:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(compression.strip_suffix(source.name), data)
    return path


@pytest.mark.parametrize("kind", ["xz", "zip", "gz"])
@pytest.mark.parametrize(
    "source",
    [sample("cpu_two_threads.json.gz"), sample("runtime_demo.events.jsonl"), sample("numerics_tf32.csv"),
     sample("ncu_tiles_repeated_heavy.csv"), corpus("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"),
     corpus("sglsetup__sglang.log"), corpus("perfetto__nested_tracks.perfetto-trace")],
    ids=lambda p: p.name,
)  # fmt: skip
def test_every_format_reads_the_same_compressed(kind, source, tmp_path):
    path = _compressed(kind, source, tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    plain, packed = db.connect(None), db.connect(None)
    [a], [b] = ingest(plain, [source]), ingest(packed, [path], tmpdir=str(scratch))
    assert (b.format, b.events_read, b.events_ingested, b.skipped_reasons) == (
        a.format, a.events_read, a.events_ingested, a.skipped_reasons)  # fmt: skip
    assert fingerprint(packed) == fingerprint(plain)
    assert list(scratch.iterdir()) == []  # decompressed copies and staged parts are gone


def test_registry_lists_each_reader_once_and_the_error_names_them_all(tmp_path):
    formats = parsers.formats()
    assert [f for f, _ in formats] == [r.FORMAT for r in parsers.readers()]
    assert len({f for f, _ in formats}) == len(formats) == len(parsers.READERS)
    text = tmp_path / "notes.txt"
    text.write_text("GPU went brrr\n")
    with pytest.raises(InputError) as err:
        inputs.classify(text)
    message = str(err.value)
    assert message.startswith(f"{text}: byte 0: not a format tracekit reads; tried by content: ")
    assert message.endswith(", ".join(d for _, d in formats))


def test_compressed_data_that_breaks_before_anything_is_recognised_says_where(tmp_path):
    """Not "not a format": the damage that cut the prefix short, at its compressed byte."""
    whole = gzip.compress(sample("ncu_tiles_hoisted_heavy.csv").read_bytes())
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(whole[:200])  # the first lines of an Nsight Compute CSV: too few to recognise it
    with pytest.raises(compression.BrokenStream) as err:
        inputs.classify(cut)
    assert str(err.value) == f"{cut}: compressed byte 200: gzip stream ends early (truncated file)"


@pytest.mark.parametrize("head", [b"", b"\x00" * 64, bytes(range(256)) * 8, b"{", b"[", b'{"a": [1, 2', b"\n\n\r\t",
                                  b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"SQLite format 3\x00"])  # fmt: skip
def test_no_sniff_raises(head):
    for reader in parsers.readers():
        assert reader.sniff(head, "x.dat") in (True, False)
        assert reader.sniff(head, "x.jsonl", metrics=("diff",)) in (True, False)


def test_on_error_hands_over_each_bad_input_and_ingests_the_rest(tmp_path):
    """The cluster worker's mode: a missing file, one no reader takes and a truncated trace among
    good ones are each reported once, and the good ones after them are still ingested."""
    missing = tmp_path / "gone.json"
    unreadable = tmp_path / "notes.txt"
    unreadable.write_text("not a trace\n")
    truncated = tmp_path / "cut.json"
    truncated.write_bytes(gzip.decompress(RANK1.read_bytes())[:5000])
    failed = []
    con = db.connect(None)
    results = ingest(con, [RANK0, missing, unreadable, truncated, RANK1],
                     on_error=lambda path, e: failed.append((path.name, type(e).__name__)))  # fmt: skip
    # a file no reader takes is known before any is read; the others as their turn comes
    assert sorted(name for name, _ in failed) == ["cut.json", "gone.json", "notes.txt"]
    assert {r.source for r in results} == {str(RANK0), str(RANK1)}
    sources = [s for (s,) in con.execute("SELECT source FROM runs ORDER BY run_id").fetchall()]
    assert sources == [str(RANK0), str(RANK1)]
    # nothing of the truncated trace stays behind
    assert con.execute("SELECT count(*) FROM ingest_pending").fetchone()[0] == 0
    assert fingerprint(con, 1) == fingerprint(alone(RANK0), 1)


def test_without_on_error_the_first_bad_input_ends_the_call(tmp_path):
    missing = tmp_path / "gone.json"
    con = db.connect(None)
    with pytest.raises(TracekitError, match="gone.json.*ingested and kept: gpu_tp2_rank0"):
        ingest(con, [RANK0, missing, RANK1])
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_run_ids_stay_above_rows_written_without_the_sequence(tmp_path):
    """A run row written by hand (or by a tracekit before the run id sequence) above the sequence's
    next value: an ingest of several files in one call, which looks for such rows once, gives every
    new run an id above it, and none twice."""
    path = tmp_path / "held.duckdb"
    con = db.connect(str(path))
    ingest(con, [RANK0])
    con.execute("INSERT INTO runs (run_id, source) VALUES (40, 'written by hand')")
    results = ingest(con, [RANK1, DEMO_TRACE], same_content="keep")
    ids = [r.run_id for r in results]
    assert ids == sorted(ids) and min(ids) > 40 and len(set(ids)) == len(ids)
    held = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    assert held == [1, 40, *ids]
