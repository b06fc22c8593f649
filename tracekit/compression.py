"""Compressed inputs in one place: any input read as the stream of bytes it holds.

An input is plain, gzip (several concatenated members too, as `cat a.gz b.gz` makes), xz (several
streams too) or a zip archive of one file, told apart by its first bytes, never by its name.
`head` gives a bounded prefix for recognising a format: it never inflates more than asked, so a
small file that inflates to gigabytes costs nothing to classify, and damaged data only shortens
it (`prefix` also says where it broke). `chunks` gives the whole content in pieces of bounded
size, however much one compressed byte inflates to; damaged or truncated data raises
`BrokenStream`, an InputError that names the compressed byte where it broke. Inside `keep_whole`,
a small compressed input whose prefix was all of it is not inflated again by `chunks`.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tracekit import tempfiles
from tracekit.errors import InputError

try:  # zlib-ng inflates gzip about 2.8x faster than zlib (0.4 against 1.1 ms a 0.9 MB rank), with its interface
    from zlib_ng import zlib_ng as _gzip
except ImportError:  # an install without it reads the same bytes, slower
    _gzip = zlib

GZIP, XZ, ZIP = "gzip", "xz", "zip"
MAGIC = ((b"\x1f\x8b", GZIP), (b"\xfd7zXZ\x00", XZ), (b"PK\x03\x04", ZIP))
SUFFIXES = (".gz", ".gzip", ".xz", ".zip")
CHUNK = 1 << 20  # bytes read from the file at a time (compressed bytes for a compressed input)
HEAD_READ = 1 << 16
# Compressed bytes handed to the decoder at a time: an error is placed within this many bytes of
# where the data broke.
INPUT_STEP = 1 << 16
# A compressed file up to this size is recognised from one step (see prefix).
WHOLE_STEP = 1 << 20
# A piece of inflated content is at most this many times the file bytes asked for: near what real
# traces compress by, so their pieces stay large, while a bomb (1000:1) cannot inflate into one.
MAX_EXPANSION = 8


class BrokenStream(InputError):
    """Compressed data that is corrupt or ends early; `expected` says which."""


def compression_of(first: bytes) -> str | None:
    """GZIP, XZ or ZIP from an input's first six bytes; None for anything else (read as it is)."""
    return next((kind for magic, kind in MAGIC if first.startswith(magic)), None)


def kind(path: Path) -> str | None:
    """The compression of the file at `path` (OSError when it cannot be opened)."""
    with open(path, "rb") as f:
        return compression_of(f.read(6))


def strip_suffix(name: str) -> str:
    """A file name without the suffix a compressor added (`trace.json.gz` -> `trace.json`)."""
    lower = name.lower()
    return next((name[: -len(s)] for s in SUFFIXES if lower.endswith(s) and len(name) > len(s)), name)


# --------------------------------------------------------------------------------------------- prefix


@dataclass
class Prefix:
    data: bytes
    broken: BrokenStream | None = None  # why the content ended before the length asked for, if it did


def head(path: Path, n: int) -> bytes:
    """At most `n` bytes from the start of the content, inflating no more than that.

    Corrupt or truncated compressed data ends the prefix early instead of raising, and a zip that
    cannot be opened as an archive is taken as the bytes it is: recognising a format never fails,
    reading it says what is wrong. OSError when the file cannot be opened.
    """
    return prefix(path, n).data


def prefix(path: Path, n: int) -> Prefix:
    """`head`, with the BrokenStream that cut it short (so an input nothing recognises can be
    reported as the damaged data it is rather than as an unknown format)."""
    with open(path, "rb") as f:
        first = f.read(HEAD_READ)
        compression = compression_of(first)
        if compression is None:
            return Prefix(first[:n] if len(first) >= n else first + f.read(n - len(first)))
        if compression == ZIP:
            return _zip_head(path, n, first)
        # a small file goes to the decoder in one step, so that its content comes out in one piece
        # (a rank of 0.9 MB in 100 KB of gzip took two steps, and joining them cost a quarter of its
        # inflating); where it breaks, it is read again in steps, which place the error
        size = os.fstat(f.fileno()).st_size
        head = _inflated_head(f, path, compression, n, size if size <= WHOLE_STEP else INPUT_STEP)
        if head.broken is not None and size <= WHOLE_STEP:
            head = _inflated_head(f, path, compression, n, INPUT_STEP)
        if head.broken is None and len(head.data) < n:
            _keep(path, head.data)  # the whole content: the read that follows may take it instead of inflating again
        return head


def _inflated_head(f, path: Path, compression: str, n: int, step: int) -> Prefix:
    """The first `n` bytes of a gzip or xz file's content, inflated `step` compressed bytes at a time."""
    f.seek(0)
    out = []
    try:
        for piece in _inflate(f, path, compression, n, total=n, step=step):
            out.append(piece)
    except BrokenStream as e:
        return Prefix(b"".join(out), e)
    return Prefix(b"".join(out))


def _decompressor(compression: str):
    return _gzip.decompressobj(wbits=31) if compression == GZIP else lzma.LZMADecompressor()


def _inflate(
    f, path: Path, compression: str, piece: int, total: int | None = None, step: int = INPUT_STEP
) -> Iterator[bytes]:
    """The content of a gzip or xz file (all its members or streams) in pieces of at most `piece`
    bytes, `total` bytes at most, handed `step` compressed bytes at a time; BrokenStream at the
    compressed byte the decoder had read."""
    errors = (zlib.error, _gzip.error) if compression == GZIP else (lzma.LZMAError,)
    dec = _decompressor(compression)
    data, consumed, produced, drained = b"", 0, 0, True
    while total is None or produced < total:
        if drained and not data:
            data = f.read(step)
            if not data:
                break
            consumed += len(data)
            if dec.eof:  # more after a finished member: the next member (stream)
                dec = _decompressor(compression)
        limit = piece if total is None else min(piece, total - produced)
        try:
            out = dec.decompress(data, limit)
        except errors as e:
            raise BrokenStream(path, f"compressed byte {consumed}", f"valid {compression} data ({e})") from None
        if out:
            produced += len(out)
            yield out
        if dec.eof:
            data, drained = dec.unused_data, True
            if data:
                dec = _decompressor(compression)
            continue
        data = dec.unconsumed_tail if compression == GZIP else b""
        # a full piece may leave output inside the decoder, so it is asked again before more input
        drained = dec.needs_input if compression == XZ else len(out) < limit
    else:
        return  # the total asked for: what follows is not read
    if not dec.eof:
        raise BrokenStream(path, f"compressed byte {consumed}", f"{compression} stream ends early (truncated file)")


_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError)


def _zip_head(path: Path, n: int, first: bytes) -> Prefix:
    try:
        archive = zipfile.ZipFile(path)
    except _ZIP_ERRORS:
        return Prefix(first[:n])
    with archive:
        members = _files(archive)
        if len(members) != 1:
            return Prefix(b"")  # reading it says how many files it holds
        try:
            with archive.open(members[0]) as member:
                return Prefix(member.read(n))
        except _ZIP_ERRORS as e:
            return Prefix(first[:n], BrokenStream(path, f"zip member {members[0].filename}", f"valid zip data ({e})"))


def _files(archive: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    return [info for info in archive.infolist() if not info.is_dir()]


# --------------------------------------------------------------------------------------------- stream


def chunks(path: Path, size: int = CHUNK) -> Iterator[bytes]:
    """The whole content in pieces (reading `size` file bytes at a time, a piece at most
    MAX_EXPANSION times that); BrokenStream where the compressed data is corrupt or ends early,
    InputError when the file cannot be opened."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise InputError(path, "open", "expected a file, got a directory") from None
    except FileNotFoundError:
        raise InputError(path, "open", "file not found") from None
    except OSError as e:
        raise InputError(path, "open", f"expected a readable file ({e.strerror})") from None
    with f:
        compression = compression_of(f.read(6))
        f.seek(0)
        kept = _take(path) if compression in (GZIP, XZ) else None
        if kept is not None:
            piece = size * MAX_EXPANSION
            for start in range(0, len(kept), piece):
                yield kept[start : start + piece]
            return
        if compression is None:
            while data := f.read(size):
                yield data
        elif compression == ZIP:
            yield from _zip_chunks(path, size)
        else:
            yield from _inflate(f, path, compression, size * MAX_EXPANSION)


def read_bytes(path: Path) -> bytes:
    """The whole content at once (for inputs a reader holds in memory anyway)."""
    return b"".join(chunks(path))


def decompressed_copy(path: Path, tmpdir: str | None = None) -> Path:
    """The content written to a temporary file (in `tmpdir`), for a library that reads files in
    place (SQLite, DuckDB); the caller removes it."""
    fd, name = tempfile.mkstemp(prefix=tempfiles.prefix(), suffix="-" + strip_suffix(Path(path).name), dir=tmpdir)
    try:
        with os.fdopen(fd, "wb") as out:
            for data in chunks(path):
                out.write(data)
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def _zip_chunks(path: Path, size: int) -> Iterator[bytes]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise BrokenStream(path, "zip archive", f"a readable zip archive ({e})") from None
    with archive:
        members = _files(archive)
        if len(members) != 1:
            names = ", ".join(m.filename for m in members[:5]) or "none"
            raise InputError(path, "zip archive", f"expected an archive of one file, found {len(members)} ({names})")
        try:
            with archive.open(members[0]) as member:
                while data := member.read(size):
                    yield data
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as e:
            raise BrokenStream(path, f"zip member {members[0].filename}", f"valid zip data ({e})") from None


# ----------------------------------------------------------------------------------------------- size


def inflated_size(path: Path) -> int:
    """The content's size, for sizing memory before reading: a gzip member's trailer holds it (mod
    4 GiB), a zip entry states it; otherwise (plain, xz) the file's size; a folder read as one input:
    the sum over its files. 0 for a missing file."""
    if os.path.isdir(path):
        return sum(inflated_size(Path(here) / name) for here, _, names in os.walk(path) for name in names)
    try:
        size = os.path.getsize(path)
        compression = kind(path)
        if compression == GZIP:
            with open(path, "rb") as f:
                f.seek(-4, os.SEEK_END)
                isize = int.from_bytes(f.read(4), "little")
            return isize if isize >= size else isize + (1 << 32)
        if compression == ZIP:
            with zipfile.ZipFile(path) as archive:
                return sum(m.file_size for m in _files(archive))
        return size
    except (OSError, zipfile.BadZipFile):
        return 0  # reported by the reader, with its name


# --------------------------------------------------------------------------------------------- kept whole

# Ingest recognises every input by its prefix, then reads each: a small compressed file (a rank's
# trace of about 1 MB) would be inflated twice, which is a fifth of its ingest. Inside `keep_whole`,
# the content of a compressed input whose prefix was all of it is kept, up to KEEP_BYTES in all (the
# first inputs recognised, which are read first), and `chunks` hands it out once instead of inflating
# the file again, while the file's size and mtime are those it was read at.
KEEP_BYTES = 64 << 20
_kept: dict[tuple, bytes] = {}
_kept_state = {"depth": 0, "bytes": 0}
_kept_lock = threading.Lock()


@contextlib.contextmanager
def keep_whole():
    """A scope (one ingest call) in which a small compressed input is inflated once; what it kept goes with it."""
    with _kept_lock:
        _kept_state["depth"] += 1
    try:
        yield
    finally:
        with _kept_lock:
            _kept_state["depth"] -= 1
            if not _kept_state["depth"]:
                _kept.clear()
                _kept_state["bytes"] = 0


def _identity(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _keep(path: Path, content: bytes) -> None:
    if not _kept_state["depth"]:
        return
    key = _identity(path)
    with _kept_lock:
        if key is None or key in _kept or _kept_state["bytes"] + len(content) > KEEP_BYTES:
            return
        _kept[key] = content
        _kept_state["bytes"] += len(content)


def _take(path: Path) -> bytes | None:
    if not _kept:
        return None
    key = _identity(path)
    with _kept_lock:
        content = _kept.pop(key, None)
        if content is not None:
            _kept_state["bytes"] -= len(content)
    return content
