"""The records of CSV text, for the CSV readers: the csv module's errors (a field over its size limit,
a NUL byte) become an InputError naming the line, not a traceback."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from tracekit.errors import InputError


def records(path: Path, text: str, as_dicts: bool = False, lines: list[int] | None = None) -> list:
    """Every record of `text` (a list of fields, or with `as_dicts` a dict keyed by the header);
    `lines`: the file's line number of each line of `text`, when it holds only some of them."""
    stream = io.StringIO(text, newline=None)
    reader = csv.DictReader(stream) if as_dicts else csv.reader(stream)
    out = []
    try:
        for record in reader:
            out.append(record)
    except csv.Error as e:
        line = reader.line_num if not as_dicts else reader.reader.line_num
        line = lines[min(line, len(lines)) - 1] if lines else line
        raise InputError(path, f"line {line}", f"a CSV record ({e})") from None
    return out
