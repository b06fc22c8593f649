"""Compressed inputs: every container gives the bytes it holds, a prefix never inflates more than asked,
and broken data is one InputError at its compressed byte."""

from __future__ import annotations

import gzip
import lzma
import tracemalloc
import zipfile
import zlib

import pytest

from tests.conftest import sample
from tracekit import compression
from tracekit.errors import InputError

CONTENT = gzip.decompress(sample("cpu_two_threads.json.gz").read_bytes())


def containers(tmp_path, data: bytes = CONTENT) -> dict:
    """The same content as plain, gzip (two members), xz (two streams) and a one-file zip."""
    half = len(data) // 2
    paths = {name: tmp_path / f"trace.{name}" for name in ("plain", "gzip", "xz", "zip")}
    paths["plain"].write_bytes(data)
    paths["gzip"].write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    paths["xz"].write_bytes(lzma.compress(data[:half]) + lzma.compress(data[half:]))
    with zipfile.ZipFile(paths["zip"], "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("trace.json", data)
    return paths


def test_every_container_gives_the_content(tmp_path):
    for name, path in containers(tmp_path).items():
        assert compression.kind(path) == (None if name == "plain" else name)
        assert compression.read_bytes(path) == CONTENT, name
        assert b"".join(compression.chunks(path, size=4096)) == CONTENT, name
        for n in (1, 1000, len(CONTENT) // 2 + 7, len(CONTENT) + 10):
            assert compression.head(path, n) == CONTENT[:n], (name, n)
        copy = compression.decompressed_copy(path, str(tmp_path))
        try:
            assert copy.read_bytes() == CONTENT and copy.parent == tmp_path
        finally:
            copy.unlink()


def test_a_prefix_never_inflates_the_whole_content(tmp_path):
    """256 MiB of zeros in a ~256 KiB gzip: classifying it must not cost the 256 MiB."""
    path = tmp_path / "bomb.gz"
    block = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        for _ in range(256):
            f.write(deflate.compress(block))
        f.write(deflate.flush())
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        prefix = compression.head(path, 1 << 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert prefix == bytes(1 << 16)
    assert peak < 4 << 20


def test_broken_data_shortens_a_prefix_and_fails_a_read(tmp_path):
    whole = gzip.compress(CONTENT)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    prefix = compression.head(cut, len(CONTENT))
    assert 0 < len(prefix) < len(CONTENT) and CONTENT.startswith(prefix)
    with pytest.raises(compression.BrokenStream) as err:
        compression.read_bytes(cut)
    assert err.value.position == f"compressed byte {len(whole) // 2}" and "truncated" in err.value.expected
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(whole[:40] + bytes(len(whole) - 40))
    assert CONTENT.startswith(compression.head(corrupt, len(CONTENT)))
    with pytest.raises(InputError, match="valid gzip data"):
        compression.read_bytes(corrupt)


def test_zip_archives_of_several_files_and_not_zips(tmp_path):
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as archive:
        archive.writestr("a.json", b"{}")
        archive.writestr("b.json", b"{}")
    assert compression.head(two, 100) == b""  # nothing to recognise: reading it says why
    with pytest.raises(InputError, match="one file, found 2"):
        compression.read_bytes(two)
    fake = tmp_path / "fake.bin"
    fake.write_bytes(b"PK\x03\x04 not an archive")
    assert compression.head(fake, 100) == fake.read_bytes()  # recognised (or not) as what it is


def test_missing_files_and_sizes(tmp_path):
    with pytest.raises(OSError):
        compression.head(tmp_path / "missing", 10)
    with pytest.raises(InputError, match="file not found"):
        compression.read_bytes(tmp_path / "missing")
    paths = containers(tmp_path)
    assert compression.inflated_size(paths["plain"]) == len(CONTENT)
    assert compression.inflated_size(paths["zip"]) == len(CONTENT)
    single = tmp_path / "one.gz"
    single.write_bytes(gzip.compress(CONTENT))
    assert compression.inflated_size(single) == len(CONTENT)  # the member's trailer
    assert compression.inflated_size(tmp_path / "missing") == 0
    assert compression.strip_suffix("rank0.pt.trace.json.gz") == "rank0.pt.trace.json"
    assert compression.strip_suffix("server.log") == "server.log"


def _bomb(path, inflated_mib: int, prefix: bytes = b"", unit: bytes = b"\0", xz: bool = False):
    """`prefix` then `inflated_mib` MiB of `unit` repeated, gzip (or xz) at its strongest: ~1000:1."""
    block = unit * ((1 << 20) // len(unit))
    packer = lzma.LZMACompressor() if xz else zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(packer.compress(prefix))
        for _ in range(inflated_mib):
            f.write(packer.compress(block))
        f.write(packer.flush())
    return path


@pytest.mark.parametrize("xz", [False, True], ids=["gzip", "xz"])
def test_reading_a_bomb_holds_a_bounded_piece_at_a_time(tmp_path, xz):
    """256 MiB in a file of ~256 KiB (or less): one file read must not inflate into one 256 MiB piece."""
    path = _bomb(tmp_path / "bomb", 256, xz=xz)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        total = largest = 0
        for piece in compression.chunks(path):
            total += len(piece)
            largest = max(largest, len(piece))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    most = compression.CHUNK * compression.MAX_EXPANSION
    assert total == 256 << 20
    assert largest <= most and peak < 5 * most  # a piece, the decoder's buffers and their copies


def test_a_corrupt_member_is_placed_near_where_it_breaks(tmp_path):
    """The position names the compressed bytes the decoder stopped at, not the end of the file."""
    whole = gzip.compress(CONTENT * 20, compresslevel=1)
    assert len(whole) > 4 * compression.INPUT_STEP
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(whole[:40] + bytes(64) + whole[104:])
    with pytest.raises(compression.BrokenStream) as err:
        compression.read_bytes(corrupt)
    assert err.value.position == f"compressed byte {compression.INPUT_STEP}"


def test_a_small_file_recognised_in_one_step_breaks_where_a_stepped_read_says(tmp_path, monkeypatch):
    """A compressed file under WHOLE_STEP goes to the decoder at once; where it is corrupt, the
    prefix is read again in steps, so the error and the content before it are those of the steps."""
    whole = gzip.compress(CONTENT * 6, compresslevel=1)
    assert 2 * compression.INPUT_STEP < len(whole) <= compression.WHOLE_STEP
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(whole[:40] + bytes(64) + whole[104:])
    at_once = compression.prefix(corrupt, 1 << 30)
    monkeypatch.setattr(compression, "WHOLE_STEP", 0)
    stepped = compression.prefix(corrupt, 1 << 30)
    assert at_once.broken is not None and at_once.broken.position == stepped.broken.position
    assert at_once.broken.position != f"compressed byte {len(whole)}"  # placed, not the whole file
    assert at_once.data == stepped.data and (CONTENT * 6).startswith(at_once.data)
    good = tmp_path / "good.json.gz"
    good.write_bytes(whole)
    assert compression.prefix(good, 1 << 30).data == CONTENT * 6


def test_the_prefix_says_where_the_stream_broke(tmp_path):
    whole = gzip.compress(CONTENT)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[:200])
    prefix = compression.prefix(cut, len(CONTENT))
    assert CONTENT.startswith(prefix.data) and len(prefix.data) < len(CONTENT)
    assert isinstance(prefix.broken, compression.BrokenStream) and "truncated" in prefix.broken.expected
    assert compression.prefix(tmp_path / "cut.json.gz", 10).broken is None  # broken after the prefix asked for
    whole_path = tmp_path / "whole.json.gz"
    whole_path.write_bytes(whole)
    assert compression.prefix(whole_path, len(CONTENT) + 10).broken is None


def test_a_json_bomb_fails_in_bounded_memory(tmp_path):
    """A trace prefix and 128 MiB of whitespace in a ~128 KiB gzip: the error comes at its end, and
    the reader never holds more than a few pieces of it (it used to hold all of it, twice)."""
    from tracekit import db
    from tracekit.ingest.pipeline import ingest

    path = _bomb(tmp_path / "bomb.json.gz", 128, prefix=b'{"traceEvents":[', unit=b" ")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    con = db.connect(None)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="closing the trace object"):
            ingest(con, [path], tmpdir=str(scratch))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # pieces and their copies, half the content at most (270 MB before)
    assert list(scratch.iterdir()) == []  # the staged parts are gone


def _inflations(monkeypatch) -> list:
    """Counts the decoders made: one per gzip member or xz stream inflated."""
    made = []
    real = compression._decompressor
    monkeypatch.setattr(compression, "_decompressor", lambda kind: made.append(kind) or real(kind))
    return made


def test_inside_keep_whole_a_small_input_recognised_whole_is_not_inflated_again(tmp_path, monkeypatch):
    paths = containers(tmp_path)
    made = _inflations(monkeypatch)
    with compression.keep_whole():
        for name in ("gzip", "xz"):
            assert compression.head(paths[name], len(CONTENT) + 1) == CONTENT
            before = len(made)
            assert b"".join(compression.chunks(paths[name], size=4096)) == CONTENT, name
            assert len(made) == before, f"{name} inflated again"
            # handed out once: a second read inflates
            assert b"".join(compression.chunks(paths[name], size=4096)) == CONTENT, name
            assert len(made) > before
    assert not compression._kept


def test_keep_whole_keeps_only_whole_content_of_an_unchanged_file_in_its_scope(tmp_path, monkeypatch):
    paths = containers(tmp_path)
    made = _inflations(monkeypatch)
    # outside the scope, and a prefix shorter than the content: nothing kept
    compression.head(paths["gzip"], len(CONTENT) + 1)
    with compression.keep_whole():
        compression.head(paths["xz"], 100)
        assert not compression._kept
        # a file rewritten between recognition and read is read as it is now
        compression.head(paths["gzip"], len(CONTENT) + 1)
        other = CONTENT.replace(b"cpu_op", b"CPU_OP") + b"\n"  # a new size, whatever the clock's grain
        paths["gzip"].write_bytes(gzip.compress(other))
        before = len(made)
        assert b"".join(compression.chunks(paths["gzip"])) == other
        assert len(made) > before
    assert not compression._kept and compression._kept_state == {"depth": 0, "bytes": 0}


def test_keep_whole_holds_at_most_keep_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(compression, "KEEP_BYTES", len(CONTENT) + len(CONTENT) // 2)
    first, second = tmp_path / "a.gz", tmp_path / "b.gz"
    first.write_bytes(gzip.compress(CONTENT))
    second.write_bytes(gzip.compress(CONTENT))
    with compression.keep_whole():
        compression.head(first, len(CONTENT) + 1)
        compression.head(second, len(CONTENT) + 1)
        assert len(compression._kept) == 1 and compression._kept_state["bytes"] == len(CONTENT)
        assert b"".join(compression.chunks(second)) == CONTENT
        assert b"".join(compression.chunks(first)) == CONTENT
        assert compression._kept_state["bytes"] == 0


def test_gzip_reads_the_same_with_the_standard_library_inflater(tmp_path, monkeypatch):
    """zlib-ng when installed, zlib otherwise: the same bytes, and the same error where data breaks."""
    paths = containers(tmp_path)
    broken = tmp_path / "broken.gz"
    data = gzip.compress(CONTENT)
    broken.write_bytes(data[: len(data) // 2] + bytes(64) + data[len(data) // 2 + 64 :])
    seen = {}
    for inflater in {compression._gzip, zlib}:
        monkeypatch.setattr(compression, "_gzip", inflater)
        assert b"".join(compression.chunks(paths["gzip"], size=4096)) == CONTENT
        with pytest.raises(compression.BrokenStream) as e:
            b"".join(compression.chunks(broken))
        seen[inflater.__name__] = str(e.value).split("(")[0]
    assert len(set(seen.values())) == 1, seen
