"""Units of work and comparability: what one step of a diff is when the runs mark none, and whether the
two sides hold the same work at all.

A unit of work is what both sides repeat: a step annotation or a repeated top-level annotation
(tracekit.compare.diff.find_steps), else a kernel launched at a steady period (`ANCHOR_KERNEL_SQL`:
one unit from one launch to the next); or, given a name glob per side, the steps each glob selects
(`step_groups`: two variants of one experiment in one trace, or a group of steps in each of two). Sides are comparable when a unit matches on both, on the same
ranks, and the GPU work inside the units is alike (`WORK_OVERLAP_SQL`); when not, the diff says why
instead of giving a verdict (docs/diff.md, Comparability).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from tracekit.compare.sides import SIDES, Side
from tracekit.errors import TracekitError

# Every annotation of the given runs that can delimit steps (the names `step_candidates` chose from),
# as written and by name key: what a step glob is matched against.
STEP_ANNOTATIONS_SQL = """
SELECT DISTINCT e.run_id, c.name AS step, e.name AS annotation, c.choice
FROM events e JOIN step_candidates c ON c.run_id = e.run_id AND c.name = name_key(e.name)
WHERE list_contains($runs, e.run_id) AND e.dur_ns > 0
  AND ((e.kind IN ('user_annotation', 'cpu_op') AND e.name LIKE 'ProfilerStep#%')
       OR (e.kind = 'user_annotation' AND e.depth = 0))
"""

# Names listed when a glob selects nothing.
LISTED_STEP_NAMES = 12

# A kernel that paces the work: on the main device of every run it starts at least 4 times (3 units),
# at a steady period (the coefficient of variation of its start-to-start intervals at most $cv in every
# run). Of those, the one with the fewest launches (the longest unit: an iteration rather than a
# layer); ties by name.
ANCHOR_KERNEL_SQL = """
WITH k AS (
    SELECT a.run_id, a.name, a.ts_ns - lag(a.ts_ns) OVER (PARTITION BY a.run_id, a.name ORDER BY a.ts_ns) AS period
    FROM gpu_activities a JOIN diff_sides s ON s.run_id = a.run_id AND s.device = a.device
    WHERE a.kind = 'kernel'
), per_run AS (
    SELECT run_id, name, count(*) + 1 AS launches, stddev_pop(period) / avg(period) AS cv
    FROM k WHERE period IS NOT NULL GROUP BY ALL
)
SELECT name FROM per_run GROUP BY name
HAVING count(*) = $runs AND min(launches) >= 4 AND max(cv) <= $cv
ORDER BY sum(launches), name LIMIT 1
"""

# Start-to-start intervals of an anchor kernel whose spread (stdev / mean) stays within this are a
# steady period: iterations of one loop. On the corpus (ResNet-50, HTA's trace-diff pair, CloverLeaf)
# and the project's H200 decode runs, kernels launched once per iteration sit at 0.003-0.15; kernels
# launched several times per iteration (per layer, forward and backward) at 0.25 and above.
STEADY_PERIOD_CV = 0.2


# A kernel's family (SQL over gpu_activities `a`): the stdlib's `kernel_family` (architecture tokens
# and tile configurations masked), so volta_sgemm and ampere_sgemm, sm80 and sm90 variants of one
# kernel, and the same matmul run whole or in chunks, are one family.
KERNEL_FAMILY = "kernel_family(a.name)"

# How alike the work in the two sides' windows is: each side's kernel launches per family as a share of
# its launches, and the overlap of the two mixes (sum of the smaller share per family): 1 when both run
# the same families as often, 0 when they share none. Launches, not time: the same code made faster or
# slower launches the same kernels, and one long kernel (a collective waiting for a peer) must not make
# the work look different. NULL when a side ran no kernel.
WORK_OVERLAP_SQL = f"""
WITH fam AS (
    SELECT h.side, {KERNEL_FAMILY} AS family, count(*) AS n
    FROM diff_activity_hits h JOIN gpu_activities a ON a.event_id = h.id
    WHERE a.kind = 'kernel' GROUP BY ALL
), mix AS (SELECT side, family, n / sum(n) OVER (PARTITION BY side) AS share FROM fam)
SELECT CASE WHEN count(DISTINCT side) = 2 THEN (
    SELECT coalesce(sum(least(b.share, c.share)), 0) FROM mix b JOIN mix c
    ON b.family = c.family AND b.side = 'baseline' AND c.side = 'candidate'
) END FROM mix
"""


def step_groups(con, sides: dict[str, Side], globs: dict[str, str]) -> dict[str, list[dict]]:
    """Per side, the steps its glob selects: [{run_id, step, annotations}], one entry per step name
    (name key) of each run of the side. A glob selects a step when it matches (fnmatch, case
    sensitive) the step's name key (`serial_step`, `ProfilerStep`) or its annotation as written
    (`ProfilerStep#12`); `annotations` is None when the name key matched (every occurrence), else the
    written names that did. Every run of a side must hold a selected step."""
    runs = [r for side in sides.values() for r in side.run_ids]
    found = con.execute(STEP_ANNOTATIONS_SQL, {"runs": runs}).fetchall()
    out: dict[str, list[dict]] = {}
    for name in SIDES:
        glob = globs[name]
        selected: list[dict] = []
        for run_id in sides[name].run_ids:
            of_run = [(step, annotation, choice) for r, step, annotation, choice in found if r == run_id]
            picked: dict[str, set[str] | None] = {}
            for step, annotation, _ in of_run:
                if fnmatch.fnmatchcase(step, glob):
                    picked[step] = None
                elif fnmatch.fnmatchcase(annotation, glob) and picked.get(step, set()) is not None:
                    picked.setdefault(step, set()).add(annotation)
            if not picked:
                raise TracekitError(f"--{name}-step {glob!r}: no step matches in {_label(con, run_id)}; "
                                    f"its steps: {_listed(of_run)}")  # fmt: skip
            selected += [{"run_id": run_id, "step": step, "annotations": sorted(a) if a is not None else None}
                         for step, a in sorted(picked.items())]  # fmt: skip
        out[name] = selected
    return out


def _listed(of_run: list[tuple]) -> str:
    """A run's step names, the step rule's order first (eligible names by `choice`, then the rest)."""
    ranked = sorted({(choice if choice is not None else 1 << 30, step) for step, _, choice in of_run})
    names = list(dict.fromkeys(step for _, step in ranked))
    if not names:
        return "none (no step annotation)"
    more = f", ... ({len(names) - LISTED_STEP_NAMES} more)" if len(names) > LISTED_STEP_NAMES else ""
    return ", ".join(names[:LISTED_STEP_NAMES]) + more


def _label(con, run_id: int) -> str:
    return con.execute("SELECT label FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]


# Units whose kernel mixes overlap less than this hold different work (docs/diff.md). Over pairs of the
# corpus and the project's runs (steady steps), runs of one workload overlap 0.74 or more (eager vs
# CUDA-graph decode 0.96, two runs with volatile ids 1.0, cold vs warm conv-net 0.99, ResNet-50 samples
# 0.95-0.98, HTA's control vs test on A100 vs V100 0.74, serial vs chunked-overlap steps of the same
# layers 0.89-0.92) and runs of different workloads 0.41 or less (ResNet-50 vs LLM decode 0.25, AlexNet
# vs ResNet-50 0.20, two DDP jobs 0.41, CloverLeaf vs SAXPY 0).
MIN_WORK_OVERLAP = 0.5


@dataclass
class RankMatch:
    """The sides to compare, rank against rank: `left_out` says which ranks only one side holds (left
    out), `mismatch` why none is on both sides (the sides are then kept as they are)."""

    sides: dict[str, Side]
    left_out: str | None = None
    mismatch: str | None = None


def same_ranks(con, sides: dict[str, Side]) -> RankMatch:
    """Sides of several ranks are compared rank against rank; one run per side is compared as it is
    (a capture of rank 3 against one of rank 1), as are runs without ranks."""
    rank = dict(con.execute("SELECT run_id, rank FROM runs").fetchall())
    per_side = {name: {rank.get(r) for r in side.run_ids} for name, side in sides.items()}
    if all(len(side.run_ids) == 1 for side in sides.values()) or None in set.union(*per_side.values()):
        return RankMatch(sides)
    common = per_side["baseline"] & per_side["candidate"]
    if not common:
        held = " vs ".join(f"{name} ranks {sorted(per_side[name])}" for name in SIDES)
        return RankMatch(sides, mismatch=f"no rank is on both sides ({held})")
    kept = {name: Side(name, [r for r in side.run_ids if rank.get(r) in common]) for name, side in sides.items()}
    left = sorted(rank[r] for name in SIDES for r in sides[name].run_ids if rank.get(r) not in common)
    return RankMatch(kept, left_out=f"ranks {left} are on one side only and are left out" if left else None)


def comparability(step: dict, overlap: float | None, ranks: RankMatch) -> dict:
    """Whether the two sides hold the same unit of work, and why: a unit matched on both sides
    (a step annotation, a repeated top-level annotation or a steadily repeating kernel), on the same
    ranks, whose GPU work is alike (kernel-family mix overlap of at least MIN_WORK_OVERLAP)."""
    if ranks.mismatch:
        return {"comparable": False, "reason": ranks.mismatch}
    if step["name"] is None and not step.get("anchor_kernel"):
        return {
            "comparable": False,
            "reason": "no unit of work matches on both sides (no common step or repeated top-level annotation, "
            "no kernel repeating at a steady period in every run): totals over two capture windows do not say "
            "whether the same work got faster; pass --step NAME for an annotation both sides repeat",
        }
    if overlap is not None and overlap < MIN_WORK_OVERLAP:
        return {
            "comparable": False,
            "reason": f"the units hold different GPU work: the kernel-family mixes overlap {overlap:.0%} "
            f"(below {MIN_WORK_OVERLAP:.0%}); these look like different workloads",
        }
    unit = step["name"] or step.get("anchor_kernel")
    reason = f"unit of work: {unit} ({step['source']})"
    if overlap is not None:
        reason += f"; kernel-family mixes overlap {overlap:.0%}"
    return {"comparable": True, "reason": "; ".join(r for r in (reason, ranks.left_out) if r)}
