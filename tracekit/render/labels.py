"""Rows for text labels pinned to positions on a time axis, so that no two labels overlap.

A label is pinned at its window's start (or, when it would run past the plot's right edge, ends at
its window's end) and keeps its width in pixels while the axis stretches with the page. Placing them
for the narrowest plot the page is meant for (`PLOT_PX`) keeps them apart at every wider one: the
distance between two pins only grows with the width, their text does not.
"""

from __future__ import annotations

from dataclasses import dataclass

PLOT_PX = 640  # narrowest plot area the rows are computed for
CHAR_PX = 7.0  # upper bound of one character's width at the labels' 10 px font
PAD_PX = 8.0  # space kept between two labels of a row


@dataclass(frozen=True)
class Placed:
    row: int  # 0 is the row next to the plot
    anchor: str  # "left": the text starts at the window's start; "right": it ends at the window's end


def width_px(text: str) -> float:
    return len(text) * CHAR_PX + PAD_PX


def place(labels: list[tuple[float, float, str]], lo: float, hi: float) -> list[Placed]:
    """For each (window start, window end, text) on an axis from lo to hi, its row and anchor: the
    first row in which it overlaps no label placed before it (labels are taken in window order)."""
    span = max(hi - lo, 1e-12)
    order = sorted(range(len(labels)), key=lambda i: (labels[i][0], labels[i][1]))
    rows: list[list[tuple[float, float]]] = []
    out: dict[int, Placed] = {}
    for i in order:
        start, end, text = labels[i]
        w = width_px(text)
        left = (start - lo) / span * PLOT_PX
        anchor = "left"
        if left + w > PLOT_PX:
            anchor, left = "right", (end - lo) / span * PLOT_PX - w
        extent = (left, left + w)
        row = next((r for r, taken in enumerate(rows) if all(_apart(extent, t) for t in taken)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append(extent)
        out[i] = Placed(row, anchor)
    return [out[i] for i in range(len(labels))]


def _apart(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[1] <= b[0] or b[1] <= a[0]
