"""DuckDB's memory cap follows the input's inflated size, which a gzip trailer states and a bomb may
overstate: the cap never passes DuckDB's own default of 80% of the machine's memory."""

from __future__ import annotations

import gzip
import os

from tracekit import compression, db


def _cap(con) -> float:
    text = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    number, unit = text.split()
    return float(number) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[unit]


def test_a_trailer_claiming_more_than_the_machine_has_does_not_lift_the_cap(tmp_path):
    bomb = tmp_path / "claims.json.gz"
    data = bytearray(gzip.compress(b'{"traceEvents": []}'))
    data[-4:] = (0xFFFFFFF0).to_bytes(4, "little")  # ISIZE: "inflates to 4 GiB"
    bomb.write_bytes(bytes(data))
    claimed = compression.inflated_size(bomb)
    assert claimed >= (4 << 30) - 16
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    con = db.connect()
    db.bound_memory(con, 100 * claimed)
    assert _cap(con) <= physical * 0.8 + (1 << 20)
    db.bound_memory(con, 3 << 30)  # an honest 3 GiB input on a machine that has it: its own size
    assert abs(_cap(con) - min(3 << 30, physical * 0.8)) < 1 << 21
    db.bound_memory(con, 10)
    assert abs(_cap(con) - (1 << 30)) < 1 << 21  # never below 1 GiB
