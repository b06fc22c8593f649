"""Errors that reach the user as one line and an exit code, never as a traceback."""

import errno as errnos
import os


def one_line(e: BaseException, typed: bool = True) -> str:
    """An exception as one line: its type (unless not `typed`) and its message, whitespace folded, at
    most 300 characters."""
    text = " ".join(str(e).split())[:300]
    if not typed:
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def crash_line(e: BaseException) -> str:
    """An unexpected exception (a bug, not bad input) as one line, with the frame that raised it."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return one_line(e) + where


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


# a write that found no room: a full device, a user's quota, a file-size limit (what the error says,
# and how DuckDB quotes the OS's message)
_NO_ROOM_ERRNOS = {errnos.ENOSPC: "no space left on the device", errnos.EDQUOT: "disk quota exceeded",
                   errnos.EFBIG: "file size limit reached"}  # fmt: skip
_NO_ROOM_TEXT = {"No space left on device": errnos.ENOSPC, "Disk quota exceeded": errnos.EDQUOT,
                 "File too large": errnos.EFBIG}  # fmt: skip


def out_of_space(exc: BaseException, default_path: str | None = None, needs: dict[str, int] | None = None):
    """The one-line TracekitError for an exception that says a write found no room (an OSError, or a
    DuckDB error quoting one), naming the path, the space free there and the space needed (`needs`:
    folder or file -> bytes a write under it needs); None for any other exception."""
    import re  # here, not at the top: the CLI imports this module at start-up
    import shutil

    code = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    path = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if code not in _NO_ROOM_ERRNOS:
        text = str(exc)
        code = next((c for phrase, c in _NO_ROOM_TEXT.items() if phrase in text), None)
        if code is None:
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
        f"{path}: {_NO_ROOM_ERRNOS[code]} ({free}{needed}): free space, or write the database (--db) or "
        "temporary files (TMPDIR) elsewhere"
    )


def require_extra(module: str, extra: str, feature: str) -> None:
    """Fail in one line when an optional dependency of `feature` is not installed, naming the extra
    that brings it (the base install stays small: plotly, openai and mcp are extras)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise TracekitError(f"{feature} needs {module}, which is not installed: pip install 'tracekit[{extra}]'")
