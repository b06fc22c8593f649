"""Errors that reach the user as one line and an exit code, never as a traceback."""


class TracekitError(Exception):
    """Bad input or usage: the CLI prints `error: <message>` and exits with code 2."""

    exit_code = 2


class InputError(TracekitError):
    """A trace file that cannot be read: names the file, the position and what was expected."""

    def __init__(self, path, position, expected):
        self.path, self.position, self.expected = str(path), position, expected
        super().__init__(f"{self.path}: {position}: {expected}")
