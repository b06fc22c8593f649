"""Rows -> table / csv / json: the one printer every row-returning command uses (like sqlite-utils)."""

from __future__ import annotations

import csv
import io
import sys
from decimal import Decimal

import orjson

ROW_FORMATS = ("table", "csv", "json")


def _plain(value):
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return value


def emit_rows(columns: list[str], rows: list[tuple], fmt: str, out=None, title: str | None = None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        data = [{c: _plain(v) for c, v in zip(columns, row)} for row in rows]
        out.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_plain(v) for v in row] for row in rows])
        out.write(buf.getvalue())
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_lines=False, header_style="bold")
        for c in columns:
            table.add_column(str(c), overflow="fold")
        for row in rows:
            table.add_row(*["" if v is None else str(_plain(v)) for v in row])
        Console(file=out, width=_width(out)).print(table)


def _width(out) -> int | None:
    return None if getattr(out, "isatty", lambda: False)() else 160
