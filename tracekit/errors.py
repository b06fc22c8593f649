"""Errors that reach the user as one line and an exit code, never as a traceback."""

import os
import re
import shutil


class TracekitError(Exception):
    """Bad input or usage: the CLI prints `error: <message>` and exits with code 2."""

    exit_code = 2


class InputError(TracekitError):
    """A trace file that cannot be read: names the file, the position and what was expected."""

    def __init__(self, path, position, expected):
        # one line whatever the cause quoted (a decoder's message may hold the text it choked on)
        expected = " ".join(str(expected).split())
        self.path, self.position, self.expected = str(path), position, expected
        super().__init__(f"{self.path}: {position}: {expected}")


# errno values of a write that found no room: a full device, a user's quota, a file-size limit
_NO_ROOM_ERRNOS = {28: "no space left on the device", 122: "disk quota exceeded", 27: "file size limit reached"}
_NO_ROOM_TEXT = {"No space left on device": 28, "Disk quota exceeded": 122, "File too large": 27}


def out_of_space(exc: BaseException, default_path: str | None = None, needs: dict[str, int] | None = None):
    """The one-line TracekitError for an exception that says a write found no room (an OSError, or a
    DuckDB error quoting one), naming the path, the space free there and the space needed (`needs`:
    folder or file -> bytes a write under it needs); None for any other exception."""
    errno = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    path = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if errno not in _NO_ROOM_ERRNOS:
        text = str(exc)
        errno = next((code for phrase, code in _NO_ROOM_TEXT.items() if phrase in text), None)
        if errno is None:
            return None
        quoted = re.search(r'file "([^"]+)"', text)
        path = quoted.group(1) if quoted else None
    path = str(path or default_path or ".")
    where = path
    while where and not os.path.exists(where):
        where = os.path.dirname(where)
    try:
        free = f"{shutil.disk_usage(where or '.').free / 1e6:.0f} MB free there"
    except OSError:
        free = "free space unknown"
    places = [p for p in (needs or {}) if os.path.abspath(path).startswith(os.path.abspath(p))]
    need = (needs or {})[max(places, key=len)] if places else None  # the file itself before its folder
    needed = f"; this needs about {need / 1e6:.0f} MB" if need else ""
    return TracekitError(
        f"{path}: {_NO_ROOM_ERRNOS[errno]} ({free}{needed}): free space, or write the database (--db) or "
        "temporary files (TMPDIR) elsewhere"
    )


def require_extra(module: str, extra: str, feature: str) -> None:
    """Fail in one line when an optional dependency of `feature` is not installed, naming the extra
    that brings it (the base install stays small: plotly, openai and mcp are extras)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise TracekitError(f"{feature} needs {module}, which is not installed: pip install 'tracekit[{extra}]'")
