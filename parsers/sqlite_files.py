"""SQLite exports, for the readers of profilers that write them (Nsight Systems, the Ascend profilers,
msprof-analyze): the header that marks one, and a read-only connection whose failures are one input
error naming the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tracekit import compression
from tracekit.errors import InputError

MAGIC = b"SQLite format 3\x00"


def connect(path: Path):
    """A read-only connection that never writes a journal beside the file (the corpus is read-only)."""
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


def open_export(path: Path, database: Path, what: str):
    """`database` (the file `path` names, or its decompressed copy) opened read-only; an InputError
    naming `path` when it is no SQLite file or cannot be read as `what`."""
    try:
        with open(database, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise InputError(path, "file", f"expected a readable file ({e.strerror})") from None
    if head != MAGIC:
        raise InputError(path, "byte 0", f"expected {what} (SQLite header)")
    try:
        return connect(database)
    except sqlite3.Error as e:
        raise InputError(path, "database", f"expected a readable SQLite database ({e})") from None


def openable(path: Path, tmpdir: str | None) -> tuple[Path, bool]:
    """(the file SQLite opens for `path`, whether it is a decompressed copy in `tmpdir` that the
    caller removes): SQLite reads a database in place, so a compressed export is copied out first."""
    try:
        compressed = compression.kind(path) is not None
    except OSError as e:
        raise InputError(path, "file", f"expected a readable file ({e.strerror})") from None
    return (compression.decompressed_copy(path, tmpdir), True) if compressed else (path, False)
