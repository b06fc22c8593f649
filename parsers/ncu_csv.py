"""Nsight Compute CSV (`ncu --csv`) -> ncu_metrics rows: one row per (launch, metric).

Two layouts exist. `--page details` (and `--metrics ...` runs) are *long*: one row per launch and
metric, with `Section Name`, `Metric Name`, `Metric Unit`, `Metric Value` and, in recent versions,
rule columns (left off a metric row when empty; a rule row has empty metric columns). `--page raw` is *wide*: one column per metric, a second row with the units, then one
row per launch. Both may be preceded or interleaved by `==PROF==` / `==WARNING==` lines from the
profiler itself. Values are locale-formatted strings ("1,073,741,824"); they are kept as written
and parsed to a double where they are numbers.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tracekit import compression
from tracekit.errors import InputError
from tracekit.parsers.csv_records import records
from tracekit.parsers.rows import Export

FORMAT = "ncu_csv"
DESCRIPTION = "Nsight Compute CSV"

# Launch-identifying columns, as ncu writes them; everything else in a wide file is a metric.
LAUNCH_COLUMNS = {
    "ID": "launch_id",
    "Process ID": "pid",
    "Process Name": "process",
    "Host Name": "host",
    "Kernel Name": "kernel",
    "Context": "context",
    "Stream": "stream",
    "Block Size": "block",
    "Grid Size": "grid",
    "Device": "device",
    "CC": "cc",
}
LONG_COLUMNS = ("Metric Name", "Metric Unit", "Metric Value")
RULE_COLUMNS = {
    "Rule Name": "rule_name",
    "Rule Type": "rule_type",
    "Rule Description": "rule_description",
    "Estimated Speedup Type": "speedup_type",
    "Estimated Speedup": "speedup",
}

ROW_FIELDS = (
    "launch_id",
    "pid",
    "process",
    "host",
    "kernel",
    "context",
    "stream",
    "block",
    "grid",
    "device",
    "cc",
    "section",
    "metric",
    "unit",
    "value_text",
    "value",
    "rule_name",
    "rule_type",
    "rule_description",
    "speedup_type",
    "speedup",
)

_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][+-]?\d+)?$")


@dataclass
class NcuTable:
    rows: list[dict] = field(default_factory=list)
    lines_read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    layout: str = ""
    bytes_read: int = 0


def sniff(head: bytes, name: str, **_) -> bool:
    """An ncu --csv file, judged by its header."""
    text = head[: 1 << 16].decode("utf-8", "ignore")
    return '"Kernel Name"' in text and ('"Metric Name"' in text or '"ID"' in text)


def parse_number(text: str) -> float | None:
    """ncu's locale-formatted numbers: "1,073,741,824" -> 1073741824.0; "n/a" -> None."""
    t = text.strip()
    if not t or not _NUMBER.match(t):
        return None
    return float(t.replace(",", ""))


def read(path: Path, **_) -> Export:
    """The metric rows, inserted into `ncu_metrics` when loaded: each metric value is an item read."""
    table = parse(path)
    out = Export(source=Path(path), format=FORMAT, bytes_read=table.bytes_read, skipped=Counter(table.skipped),
                 notes={"layout": table.layout, "unit": "one metric value of one launch"},
                 metadata={"layout": table.layout})  # fmt: skip
    out.read["metric value"] = len(table.rows) + sum(table.skipped.values())
    out.loader = lambda con, run_id, offset=0: load(con, table, run_id)
    return out


def parse(path: Path) -> NcuTable:
    path = Path(path)
    raw = compression.read_bytes(path)
    text = raw.decode("utf-8", "replace")
    lines = text.splitlines()
    table = NcuTable(bytes_read=len(raw))
    # profiler chatter (==PROF==, ==WARNING==, blank) is not data
    data_lines, numbers = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("=="):
            continue
        data_lines.append(line)
        numbers.append(number)
    if not data_lines:
        raise InputError(path, "line 1", 'expected an ncu --csv header starting with "ID"')
    rows = records(path, "\n".join(data_lines), lines=numbers)
    header = rows[0]
    if "Kernel Name" not in header:
        raise InputError(path, "line 1", 'expected an ncu --csv header with a "Kernel Name" column')
    body = rows[1:]
    if all(c in header for c in LONG_COLUMNS):
        table.layout = "long"
        _read_long(header, body, table)
    else:
        table.layout = "wide"
        _read_wide(header, body, table)
    return table


def _launch_fields(header: list[str], row: list[str]) -> dict:
    out = {}
    for col, key in LAUNCH_COLUMNS.items():
        if col in header:
            out[key] = row[header.index(col)]
    return out


def _empty_row() -> dict:
    return dict.fromkeys(ROW_FIELDS)


def _read_long(header: list[str], body: list[list[str]], table: NcuTable) -> None:
    idx = {c: i for i, c in enumerate(header)}
    # Current ncu versions end a metric row after its value when the rule columns that follow are
    # empty: such a row is complete, its rule fields empty.
    shortest = max(idx[c] for c in LONG_COLUMNS) + 1
    for row in body:
        table.lines_read += 1
        if not shortest <= len(row) <= len(header):
            table.skipped["wrong number of columns"] = table.skipped.get("wrong number of columns", 0) + 1
            continue
        row = row + [""] * (len(header) - len(row))
        item = _empty_row()
        item.update(_launch_fields(header, row))
        item["section"] = row[idx["Section Name"]] if "Section Name" in idx else None
        item["metric"] = row[idx["Metric Name"]]
        item["unit"] = row[idx["Metric Unit"]]
        item["value_text"] = row[idx["Metric Value"]]
        item["value"] = parse_number(item["value_text"])
        for col, key in RULE_COLUMNS.items():
            if col in idx:
                item[key] = row[idx[col]] or None
        table.rows.append(item)


def _read_wide(header: list[str], body: list[list[str]], table: NcuTable) -> None:
    metric_cols = [i for i, c in enumerate(header) if c not in LAUNCH_COLUMNS]
    units: list[str] = [""] * len(header)
    if body and not parse_number(body[0][0] if body[0] else "") and body[0][0] == "":
        units = body[0]  # the units row: empty under the launch columns
        body = body[1:]
    for row in body:
        table.lines_read += 1
        if len(row) != len(header):
            table.skipped["wrong number of columns"] = table.skipped.get("wrong number of columns", 0) + 1
            continue
        launch = _launch_fields(header, row)
        for i in metric_cols:
            item = _empty_row()
            item.update(launch)
            item["metric"] = header[i]
            item["unit"] = units[i] or None
            item["value_text"] = row[i]
            item["value"] = parse_number(row[i])
            table.rows.append(item)


def load(con, table: NcuTable, run_id: int) -> None:
    """Insert parsed rows as run `run_id`."""
    from tracekit.db.connection import insert_rows

    insert_rows(con, "ncu_metrics", run_id, ROW_FIELDS, [[_typed(k, r[k]) for k in ROW_FIELDS] for r in table.rows])


_INT_FIELDS = {"launch_id", "pid", "context", "stream", "device"}


def _typed(key: str, value):
    if key in _INT_FIELDS:
        number = parse_number(value) if isinstance(value, str) else value
        # an id beyond 64 bits (or infinite: 400 digits) is no launch, stream or device id
        return int(number) if number is not None and abs(number) < 2**63 else None
    return value
