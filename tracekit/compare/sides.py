"""The two sides of a comparison."""

from __future__ import annotations

from dataclasses import dataclass

SIDES = ("baseline", "candidate")


@dataclass
class Side:
    """One side of a comparison: its name and its runs in the database being compared."""

    name: str
    run_ids: list[int]
