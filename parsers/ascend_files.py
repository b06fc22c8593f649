"""Text helpers the Ascend folder readers share: CSV tables with their columns probed, JSON files,
and microsecond/millisecond decimals made exact ns (msprof writes epoch microseconds with three
decimals, more digits than a float holds)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

import orjson

from tracekit.errors import InputError
from tracekit.parsers.csv_records import records


def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"byte {exc.start}", "UTF-8 text") from None
    except OSError as exc:
        raise InputError(path, "byte 0", f"a readable file ({exc.strerror})") from None


def table(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(line number, row) of every data row, values stripped (msprof pads times with a tab); an
    InputError for a missing column or a row whose field count is not the header's (a cut file)."""
    lines = records(path, read_text(path))
    if not lines or not any(cell.strip() for cell in lines[0]):
        raise InputError(path, "line 1", f"a CSV header with columns {', '.join(required)}")
    header = [cell.strip() for cell in lines[0]]
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(path, "line 1", f"column {missing[0]!r} in the header (has: {', '.join(header)})")
    rows = []
    for number, cells in enumerate(lines[1:], start=2):
        if not cells:
            continue
        if len(cells) != len(header):
            raise InputError(path, f"line {number}", f"{len(header)} fields as in the header, got {len(cells)}")
        rows.append((number, {k: v.strip() for k, v in zip(header, cells)}))
    return rows


def json_file(path: Path):
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(path, f"byte {exc.pos}", f"JSON ({exc.msg})") from None
    except OSError as exc:
        raise InputError(path, "byte 0", f"a readable file ({exc.strerror})") from None


def ns(value, scale: int = 1000) -> int | None:
    """`value` (us by default; ms with scale 10**6) as integer ns, exact for decimal text; None
    when it is not a finite number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = Decimal(value.strip()) if isinstance(value, str) else Decimal(repr(value))
    except (InvalidOperation, ValueError):
        return None
    if not number.is_finite():
        return None
    return int((number * scale).to_integral_value())


def number(text: str):
    """A CSV cell as int or float when it is one, else the text (shapes, names, `N/A`)."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return text
    return value if value == value and abs(value) != float("inf") else text


def metric_name(prefix: str, column: str) -> tuple[str, float, str] | None:
    """(name, scale, unit) of a summary column: times in us become ns, `(%)` a percentage."""
    base = re.sub(r"[^a-z0-9]+", "_", re.sub(r"\(.*?\)", "", column).lower()).strip("_")
    if "(us)" in column:
        return f"{prefix}.{base}_ns", 1000.0, "ns"
    if "(ms)" in column:
        return f"{prefix}.{base}_ns", 1e6, "ns"
    if "(%)" in column:
        return f"{prefix}.{base}_pct", 1.0, "%"
    if base == "count":
        return f"{prefix}.count", 1.0, "count"
    if base == "variance":
        return f"{prefix}.variance_us2", 1.0, "us^2"
    return None
