"""Durations, sizes and rates as people read them: by magnitude, with the unit that keeps 3 significant digits.

One place for this, so the CLI, the reports, the rules' titles and the feedback records print
4.7 us / 12.3 ms / 1.52 s alike, instead of 0.005 ms in one view and 4.7 us in another.
"""

from __future__ import annotations

import math

_DURATION_UNITS = ((1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us"), (1, "ns"))
_BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


def _significant(value: float, digits: int = 3) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    return f"{value:#.{digits}g}".rstrip(".")


def duration(ns: float | int | None) -> str:
    """ns -> '850 ns', '4.70 us', '12.3 ms', '1.52 s'; None -> '-'. Negative values keep their sign."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    magnitude = abs(ns)
    for scale, unit in _DURATION_UNITS:
        # 999.9996 us rounds to 1000 us at 3 digits: take the next unit up from just below it
        if magnitude >= scale * 0.9995 or scale == 1:
            return f"{_significant(ns / scale)} {unit}"
    raise AssertionError("unreachable")


def size(nbytes: float | int | None) -> str:
    """bytes -> '512 B', '1.50 KiB', '24.8 GiB'; None -> '-'."""
    if nbytes is None:
        return "-"
    for scale, unit in _BYTE_UNITS:
        if abs(nbytes) >= scale or scale == 1:
            return f"{_significant(nbytes / scale)} {unit}"
    raise AssertionError("unreachable")


def bandwidth(nbytes: float | int | None, ns: float | int | None) -> str:
    """bytes over ns -> '28.1 GB/s' (decimal GB, as link speeds are quoted); '-' when either is missing."""
    if not nbytes or not ns:
        return "-"
    return f"{_significant(nbytes / ns)} GB/s"


def share(fraction: float | None) -> str:
    """0.1234 -> '12.3%'; None -> '-'."""
    return "-" if fraction is None else f"{_significant(fraction * 100)}%"
