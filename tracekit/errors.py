"""Errors that reach the user as one line and an exit code, never as a traceback."""


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


def require_extra(module: str, extra: str, feature: str) -> None:
    """Fail in one line when an optional dependency of `feature` is not installed, naming the extra
    that brings it (the base install stays small: plotly, openai and mcp are extras)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise TracekitError(f"{feature} needs {module}, which is not installed: pip install 'tracekit[{extra}]'")
