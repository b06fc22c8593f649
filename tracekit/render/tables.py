"""Rows -> table / csv / tsv / json / jsonl: the one printer of every row-returning command (like sqlite-utils).

The table fits the terminal (`shutil.get_terminal_size`, which honours COLUMNS when the output is
piped): when the columns are too wide, the widest text columns are narrowed first, each cut value
ending in `…`; headers and numbers are never cut, and numbers are right-aligned.
"""

from __future__ import annotations

import csv
import io
import shutil
import sys
from decimal import Decimal

import orjson

ROW_FORMATS = ("table", "csv", "tsv", "json", "jsonl")
ELLIPSIS = "…"
GAP = "  "
MIN_CUT_WIDTH = 8  # no text column is cut narrower than this (or its header)


def _plain(value):
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return value


def emit_rows(columns: list[str], rows: list[tuple], fmt: str, out=None, text: dict | None = None) -> None:
    """Print rows in `fmt`. `text` maps a column to how the table shows its values (e.g. a duration
    by magnitude); the other formats keep the values as they are."""
    out = out or sys.stdout
    if fmt in ("json", "jsonl"):
        data = [{c: _plain(v) for c, v in zip(columns, row)} for row in rows]
        if fmt == "json":
            out.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")
        else:
            out.write("".join(orjson.dumps(d, default=str).decode() + "\n" for d in data))
    elif fmt in ("csv", "tsv"):
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n", **({"delimiter": "\t"} if fmt == "tsv" else {}))
        writer.writerow(columns)
        writer.writerows([[_plain(v) for v in row] for row in rows])
        out.write(buf.getvalue())
    else:
        out.write(table(columns, rows, shutil.get_terminal_size().columns, text or {}))


def table(columns: list[str], rows: list[tuple], width: int, text: dict | None = None) -> str:
    """Aligned columns within `width` characters (see the module doc)."""
    text = text or {}
    shown = [[_cell(v, text.get(c)) for c, v in zip(columns, row)] for row in rows]
    numeric = [bool(rows) and all(_is_number(r[i]) for r in rows if r[i] is not None) for i in range(len(columns))]
    longest = [max([0] + [len(r[i]) for r in shown]) for i in range(len(columns))]
    widths = [max(len(str(c)), n) for c, n in zip(columns, longest)]
    # headers and numbers are never cut; text values go down to MIN_CUT_WIDTH
    floors = [w if num else max(len(str(c)), min(w, MIN_CUT_WIDTH)) for c, w, num in zip(columns, widths, numeric)]
    _fit(widths, floors, width)
    lines = [_line([str(c) for c in columns], widths, numeric), _line(["-" * w for w in widths], widths, numeric)]
    lines += [_line(r, widths, numeric) for r in shown]
    return "\n".join(lines) + "\n"


def _fit(widths: list[int], floors: list[int], width: int) -> None:
    """Narrow the widest column above its floor, one character at a time, until the row fits."""
    while sum(widths) + len(GAP) * (len(widths) - 1) > width:
        cuttable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not cuttable:
            return
        widest = max(cuttable, key=lambda i: (widths[i], -i))
        widths[widest] -= 1


def _line(cells: list[str], widths: list[int], numeric: list[bool]) -> str:
    parts = []
    for cell, w, num in zip(cells, widths, numeric):
        cell = cell if len(cell) <= w else cell[: w - 1] + ELLIPSIS
        parts.append(cell.rjust(w) if num else cell.ljust(w))
    return GAP.join(parts).rstrip()


def _cell(value, show) -> str:
    if value is None:
        return ""
    value = _plain(value)
    text = show(value) if show else str(value)
    return " ".join(text.split()) if "\n" in text or "\t" in text else text


def _is_number(value) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)
