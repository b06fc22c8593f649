"""Ranks that run a different sequence of collectives than their peers (R003 collective-mismatch).

## What it does
Reads only `rank_collectives`, so it runs the same in one database of every rank and in a cluster
run's reducer. Per job (the ranked runs of one world size) and process group, it lines up each rank's
collectives in their order on that rank (`seq`) and takes, position by position, the name most ranks
ran there. A rank *diverges* at the first position where it ran another collective than that
majority. Two neighbouring collectives that a rank ran in the other order (two groups' collectives
in flight at once, whose order in time differs between ranks) are not a divergence, and neither is a
rank whose sequence matches the majority's only when shifted by a few positions (its profiler window
began a collective earlier or later). The finding names the process group, the position, what the
rank ran there and what the others ran, and how many collectives each side ran in the group.

## Why it matters
Every rank of a process group must call the same collectives in the same order: when one rank calls
an all-gather where the others call an all-reduce, or skips one (a branch on rank-local data, an
exception swallowed on one rank, a different number of micro-batches), the job hangs at the next
collective or, with matching sizes, silently reduces the wrong tensors. The first divergence in a
profile is the place to look, long before the watchdog timeout names only the collective that hung.

## Example
The healthy eight-rank gloo cell with rank 3's fifth all-gather removed from its trace (what a rank
that skips a collective records): rank 3 diverges from the other seven ranks at position 15 of
the default group, where it ran `all_reduce` and they ran `all_gather`; it ran 47 collectives in
the group, they ran 48.

## Checked on
The eight-rank gloo matrix (no divergence in any cell), the 2-rank gloo and 2xH200 tensor-parallel
samples, HTA's two sampled ranks of a 128-rank job (their all-to-all and all-reduce swap places at
positions 7 and 8: two collectives in flight at once, not a divergence), and the healthy cell with a
collective removed from one rank, or renamed (tests/test_rule_collective_mismatch.py).

## Options
- `max_shift` (3): a rank whose sequence matches the majority's shifted by up to this many positions
  has a different profiler window, not a divergence ...
- `shift_match_share` (0.95): ... when at least this share of the shifted positions match and less
  than this share of the unshifted ones. (Removing rank 3's fifth all-gather of 16 in the healthy
  matrix cell: 53% unshifted, 82% at the best shift; dropping its first collective: 34% and 100%.)
"""

from __future__ import annotations

from collections import Counter

from tracekit.engine.phrases import plural, rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _ranks

# Each rank's collectives per process group in their order on that rank. The evidence query.
SEQUENCES_SQL = """
SELECT c.run_id, c.rank, c.process_group, list(c.collective ORDER BY c.seq) AS names,
       list(c.seq ORDER BY c.seq) AS seqs, list(c.start_ns ORDER BY c.seq) AS starts
FROM rank_collectives c JOIN runs r USING (run_id)
WHERE r.world_size = $world_size
  AND c.rank IN (SELECT rank FROM runs WHERE world_size = $world_size GROUP BY rank HAVING count(*) = 1)
GROUP BY c.run_id, c.rank, c.process_group
ORDER BY c.process_group, c.rank
"""


@rule(
    code="R003",
    name="collective-mismatch",
    title="A rank runs a different sequence of collectives than its peers",
    category="cluster",
    requires=("runs",),
    params={
        "max_shift": Param(3, "a whole sequence shifted by up to this many positions is a window difference", "count"),
        "shift_match_share": Param(0.95, "... when this share of the shifted positions match", "ratio"),
    },
    example=Example(("gloo_rank0.json.gz", "gloo_rank1.json.gz")),
    scope="job",
)
def check(con, params, ctx):
    for world_size in _ranks.world_sizes(con):
        groups: dict[str, list] = {}
        for seq in rows(con, SEQUENCES_SQL, {"world_size": world_size}):
            groups.setdefault(seq.process_group, []).append(seq)
        for group, members in groups.items():
            if len(members) >= 2:
                yield from _group(ctx, params, world_size, group, members)


def _majority(members: list) -> list[str]:
    """Position by position, the collective most ranks ran there (ties to the name first in order)."""
    longest = max(len(m.names) for m in members)
    out = []
    for i in range(longest):
        votes = Counter(m.names[i] for m in members if i < len(m.names))
        out.append(max(votes.items(), key=lambda kv: (kv[1], kv[0] is not None, str(kv[0])))[0])
    return out


def _first_divergence(names: list[str], majority: list[str]) -> int | None:
    """The first position where `names` differs from the majority, past swapped neighbours; None
    when the common part agrees."""
    i, n = 0, min(len(names), len(majority))
    while i < n:
        if names[i] != majority[i]:
            swapped = i + 1 < n and names[i] == majority[i + 1] and names[i + 1] == majority[i]
            if not swapped:
                return i
            i += 2
            continue
        i += 1
    return None


def _match_share(a: list[str], b: list[str]) -> float:
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n])) / n if n else 0.0


def _shifted(names: list[str], majority: list[str], params) -> bool:
    """Whether the sequence is the majority's seen through another window: it matches shifted by a
    few positions and does not as it is. (A sequence that repeats per step matches itself shifted by
    a step's collectives, so the shifted match alone would excuse a real divergence.)"""
    share = params["shift_match_share"]
    if _match_share(names, majority) >= share:
        return False
    return any(
        _match_share(a, b) >= share
        for shift in range(1, int(params["max_shift"]) + 1)
        for a, b in ((names[shift:], majority), (names, majority[shift:]))
    )


def _group(ctx, params, world_size: int, group: str, members: list):
    majority = _majority(members)
    diverged = []
    for m in members:
        at = _first_divergence(m.names, majority)
        if at is not None and not _shifted(m.names, majority, params):
            diverged.append((at, m))
    if not diverged or 2 * len(diverged) >= len(members):
        return  # no divergence, or no majority to diverge from
    at, first = min(diverged, key=lambda d: (d[0], d[1].rank))
    agreeing = [m for m in members if all(m is not d for _, d in diverged)]
    others_count = Counter(len(m.names) for m in agreeing).most_common(1)[0][0]
    ranks = sorted(d.rank for _, d in diverged)
    label = f"group '{group}'" if group else "the default group"
    ran, expected = first.names[at], majority[at]
    run = ctx.run(first.run_id)
    title = (
        f"Rank {first.rank} diverges from {plural(len(agreeing), 'rank')} at collective {at + 1} of {label}: it ran "
        f"`{ran}` where they ran `{expected}` ({len(first.names)} collectives in the group against {others_count})"
    )
    if len(ranks) > 1:
        title += f"; ranks {', '.join(map(str, ranks))} diverge"
    yield Finding(
        rule="R003",
        severity="warning",
        confidence=0.8,
        title=title,
        locality=locality(run, window_ns=(first.starts[at], first.starts[at])),
        observed=Quantity(at + 1, "position", f"first collective of {label} where rank {first.rank} differs"),
        expected=Quantity(None, "position", "none: every rank runs the same collectives in the same order"),
        impact_ns=0,
        window_ns=0,
        sql=SEQUENCES_SQL,
        sql_params={"world_size": world_size},
        hypothesis=(
            f"Rank {first.rank} called `{ran}` as collective {at + 1} of {label}, where {plural(len(agreeing), 'rank')} "
            f"called `{expected}`: a rank-dependent branch, a skipped or extra collective (an exception caught on "
            "one rank, a different number of micro-batches or of buckets), or collectives of two groups issued in "
            "a different order. The job hangs at the next collective that cannot match, or reduces the wrong "
            "tensors when the sizes happen to agree."
        ),
        next_experiment=(
            f"Run with `TORCH_DISTRIBUTED_DEBUG=DETAIL` (checks that ranks call the same collectives with the same "
            f"shapes) and compare rank {first.rank}'s code path into collective {at + 1} with a peer's: the ops "
            f"around `{ran}` on rank {first.rank} (events near {first.starts[at]} ns) against those around "
            f"`{expected}` on rank {agreeing[0].rank}."
        ),
        acceptance=rerun(
            "traces of every rank",
            f"every rank lists the same collectives for {label} (the evidence SQL's names are equal per rank).",
        ),
        extra={
            "process_group": group,
            "position": at + 1,
            "ran": ran,
            "others_ran": expected,
            "diverging_ranks": ranks,
            "collectives": {str(m.rank): len(m.names) for m in members},
            "around": {"rank": first.names[max(0, at - 2) : at + 3], "others": majority[max(0, at - 2) : at + 3]},
        },
    )
