"""Compressed inputs in one place: any input read as the stream of bytes it holds.

An input is plain, gzip (several concatenated members too, as `cat a.gz b.gz` makes), xz (several
streams too) or a zip archive of one file, told apart by its first bytes, never by its name.
`head` gives a bounded prefix for recognising a format: it never inflates more than asked, so a
small file that inflates to gigabytes costs nothing to classify, and damaged data only shortens
it. `chunks` gives the whole content; damaged or truncated data raises `BrokenStream`, an
InputError that names the compressed byte where it broke.
"""

from __future__ import annotations

import lzma
import os
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from tracekit import tempfiles
from tracekit.errors import InputError

GZIP, XZ, ZIP = "gzip", "xz", "zip"
MAGIC = ((b"\x1f\x8b", GZIP), (b"\xfd7zXZ\x00", XZ), (b"PK\x03\x04", ZIP))
SUFFIXES = (".gz", ".gzip", ".xz", ".zip")
CHUNK = 1 << 20  # bytes read from the file at a time (compressed bytes for a compressed input)
HEAD_READ = 1 << 16


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


def head(path: Path, n: int) -> bytes:
    """At most `n` bytes from the start of the content, inflating no more than that.

    Corrupt or truncated compressed data ends the prefix early instead of raising, and a zip that
    cannot be opened as an archive is taken as the bytes it is: recognising a format never fails,
    reading it says what is wrong. OSError when the file cannot be opened.
    """
    with open(path, "rb") as f:
        first = f.read(HEAD_READ)
        compression = compression_of(first)
        if compression is None:
            return first[:n] if len(first) >= n else first + f.read(n - len(first))
        if compression == ZIP:
            return _zip_head(path, n, first)
        return _stream_head(f, first, n, compression)


def _decompressor(compression: str):
    return zlib.decompressobj(wbits=31) if compression == GZIP else lzma.LZMADecompressor()


def _stream_head(f, data: bytes, n: int, compression: str) -> bytes:
    errors = (zlib.error,) if compression == GZIP else (lzma.LZMAError, EOFError)
    out, have = [], 0
    dec = _decompressor(compression)
    while have < n:
        try:
            piece = dec.decompress(data, n - have)
        except errors:
            break
        out.append(piece)
        have += len(piece)
        if dec.eof:  # the next member or stream, if any
            data = dec.unused_data or f.read(HEAD_READ)
            if not data:
                break
            dec = _decompressor(compression)
            continue
        data = dec.unconsumed_tail if compression == GZIP else b""
        if compression == XZ and not dec.needs_input:
            continue  # output is waiting inside the decompressor: ask again with no new input
        if not data:
            data = f.read(HEAD_READ)
            if not data:
                break
    return b"".join(out)


def _zip_head(path: Path, n: int, first: bytes) -> bytes:
    try:
        with zipfile.ZipFile(path) as archive:
            members = _files(archive)
            if len(members) != 1:
                return b""  # reading it says how many files it holds
            with archive.open(members[0]) as member:
                return member.read(n)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError):
        return first[:n]


def _files(archive: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    return [info for info in archive.infolist() if not info.is_dir()]


# --------------------------------------------------------------------------------------------- stream


def chunks(path: Path, size: int = CHUNK) -> Iterator[bytes]:
    """The whole content in pieces (reading `size` file bytes at a time); BrokenStream where the
    compressed data is corrupt or ends early, InputError when the file cannot be opened."""
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
        if compression is None:
            while data := f.read(size):
                yield data
        elif compression == ZIP:
            yield from _zip_chunks(path, size)
        else:
            yield from _stream_chunks(f, path, size, compression)


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


def _stream_chunks(f, path: Path, size: int, compression: str) -> Iterator[bytes]:
    errors = (zlib.error,) if compression == GZIP else (lzma.LZMAError,)
    dec = _decompressor(compression)
    read = 0
    while raw := f.read(size):
        read += len(raw)
        try:
            data = dec.decompress(raw)
            while dec.eof and dec.unused_data:  # concatenated members (streams)
                rest = dec.unused_data
                dec = _decompressor(compression)
                data += dec.decompress(rest)
        except errors as e:
            raise BrokenStream(path, f"compressed byte {read}", f"valid {compression} data ({e})") from None
        if data:
            yield data
    if not dec.eof:
        raise BrokenStream(path, f"compressed byte {read}", f"{compression} stream ends early (truncated file)")


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
    4 GiB), a zip entry states it; otherwise (plain, xz) the file's size. 0 for a missing file."""
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
