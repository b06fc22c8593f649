"""`--offset FILE=DURATION`: an explicit clock shift for one input of a multi-source run.

Sources of one run rarely share a clock by construction: a server log prints local wall time, a
runtime-event log epoch ns, a trace the profiler's clock. Measured alignment covers the common cases;
an explicit offset is the escape hatch, and it always wins over a measured one.
"""

from __future__ import annotations

import re
from pathlib import Path

from tracekit.errors import TracekitError

UNITS_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
DURATION = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h)?\s*$")


def parse_duration(text: str) -> int:
    """'+1.5s', '-7h', '250ms', '120' (ns) -> signed ns."""
    m = DURATION.match(text)
    if not m:
        raise TracekitError(f"offset {text!r}: expected a signed duration such as -7h, +1.5s, 250ms or 120ns")
    return round(float(m.group(1)) * UNITS_NS[m.group(2) or "ns"])


def parse_offsets(specs, paths) -> dict[Path, int]:
    """Map each `FILE=DURATION` spec to the input it names (by path or by file name)."""
    paths = [Path(p) for p in paths]
    out: dict[Path, int] = {}
    for spec in specs or ():
        name, sep, value = spec.rpartition("=")
        if not sep or not name:
            raise TracekitError(f"--offset {spec!r}: expected FILE=DURATION, e.g. server.log=-7h")
        matches = [p for p in paths if str(p) == name or p.name == name]
        if len(matches) != 1:
            what = "matches no input" if not matches else "matches several inputs: give the path"
            raise TracekitError(f"--offset {spec!r}: {name} {what}")
        out[matches[0]] = parse_duration(value)
    return out


TZ_STEP_NS = 15 * UNITS_NS["m"]  # every UTC offset in use is a multiple of 15 minutes
TZ_MAX_NS = 14 * UNITS_NS["h"]


def measure(trace_window: tuple[int, int] | None, source_window: tuple[int, int] | None) -> dict:
    """How to put a wall-clock source (a log) on a trace's clock when no shared events pair them.

    Same clock when the source covers the trace window (or overlaps it). Otherwise a log written in
    local time is off by its UTC offset: when exactly one multiple of 15 minutes within +-14 h makes
    the source's span cover the trace window, that shift is applied and reported as a time zone.
    Anything else is reported as unaligned, with the two windows, so the user can pass --offset.
    """
    if not trace_window or not source_window or None in trace_window or None in source_window:
        return {"method": "none", "applied_offset_ns": 0, "note": "one side has no timestamps"}
    t0, t1 = trace_window
    s0, s1 = source_window
    if s0 <= t1 and t0 <= s1:
        return {"method": "same clock (windows overlap)", "applied_offset_ns": 0}
    fits = [k * TZ_STEP_NS for k in range(-TZ_MAX_NS // TZ_STEP_NS, TZ_MAX_NS // TZ_STEP_NS + 1)
            if s0 + k * TZ_STEP_NS <= t0 and t1 <= s1 + k * TZ_STEP_NS]  # fmt: skip
    windows = {"trace_window_ns": [t0, t1], "source_window_ns": [s0, s1]}
    if len(fits) == 1:
        return {"method": "time zone (the only 15-minute multiple that puts the trace inside the log)",
                "applied_offset_ns": fits[0], **windows}  # fmt: skip
    reason = "no" if not fits else f"{len(fits)} candidate"
    return {
        "method": "none",
        "applied_offset_ns": 0,
        "note": f"windows do not overlap and {reason} time-zone shifts fit: pass --offset FILE=DURATION",
        **windows,
    }
