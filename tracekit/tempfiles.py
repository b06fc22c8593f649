"""Temporary files named after the process that made them, so that what a killed process left is
found and removed: `tracekit-<pid>-...` in the temp directory, removed by `sweep` once that process
is gone (a staged 1 GB trace outlives a SIGKILL otherwise)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

# also the older `tracekit-duckdb-<pid>` / `tracekit-sandbox-<pid>` spill folders
_OWNED = re.compile(r"^tracekit-(?:(?:duckdb|sandbox)-)?(\d+)(?:-|$)")


def prefix() -> str:
    """The start of a temporary file's or folder's name that marks it as this process's."""
    return f"tracekit-{os.getpid()}-"


def sweep(*folders: str | None) -> int:
    """Remove what processes that no longer run left in these folders (and the system temp folder);
    returns the bytes freed."""
    freed = 0
    for folder in dict.fromkeys([tempfile.gettempdir(), *(f for f in folders if f)]):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            m = _OWNED.match(entry.name)
            if not m or _alive(int(m.group(1))):
                continue
            freed += _remove(entry)
    return freed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or not a pid: not ours to judge
    return True


def _remove(entry: os.DirEntry) -> int:
    try:
        if entry.is_dir(follow_symlinks=False):
            size = sum(f.stat().st_size for f in os.scandir(entry.path) if f.is_file(follow_symlinks=False))
            shutil.rmtree(entry.path, ignore_errors=True)
            return size
        size = entry.stat(follow_symlinks=False).st_size
        os.unlink(entry.path)
        return size
    except OSError:  # gone already, or not ours after all
        return 0
