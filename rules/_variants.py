"""Two variants of one experiment in one trace: step groups that run the same GPU work, one of them
with its transfers or collectives on more streams (overlapped), and which one is faster. What C001
exposed-comm and G004 transfer-bound read before they propose overlapping: a trace that already
holds the overlapped variant answers that question itself.

A step group is the steady steps (`step_windows_named`, `step_phases_named`: warm-up, capture and
profiler steps left out when the group has steady ones) of one top-level annotation that encloses
launches and occurs at least twice (`step_candidates`; `ProfilerStep#N` is one group, not a variant).
Two groups of a run are variants of the same work on a device when their kernel-family mixes
(`kernel_family`: launches per family as a share of the group's launches; the chunks of one matmul
are one family) overlap at least `SAME_WORK`, and they move the same bytes per step, within
`SAME_BYTES` (copied bytes, or the collectives' message bytes). The overlapped variant is the one
whose GPU work runs on more streams, or, on as many, more of it concurrently (activity time beyond
the busy union). Its steps pay when their mean time is below the serial steps' by more than two
standard errors of the difference and by at least the rule's `variant_min_change`, lose when above
by as much, and tie otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.engine.registry import Param
from tracekit.engine.toolkit import rows
from tracekit.units import duration

# Kernel-family mixes overlapping at least this much are the same work: the comparability bar of
# `tracekit diff` (docs/diff.md), where runs of one workload overlap 0.74-1.0 and of different ones
# 0.41 or less; serial and chunked-overlap steps of the same layers overlap 0.89-0.92.
SAME_WORK = 0.5
# Copied bytes per step within this share of each other: the same transfers, cut differently.
SAME_BYTES = 0.1
# On as many streams, the group running at least this much more of its GPU work concurrently (share
# of its busy time) is the overlapped one; below it, the two run one schedule.
MORE_CONCURRENT = 0.01
# Groups considered per run, those with the most launches first: variants of one experiment are few.
MAX_GROUPS = 8

MIN_CHANGE = Param(
    0.03,
    "variants of one experiment in the trace whose step times differ by less than this share are a tie",
    "ratio",
)

# The step groups a run's variants are looked for among.
GROUP_NAMES_SQL = """
SELECT name FROM step_candidates
WHERE run_id = $run_id AND choice IS NOT NULL AND launches > 0 AND source <> 'ProfilerStep#N'
ORDER BY launches DESC, name LIMIT $limit
"""

# One group's steady steps and what its GPU work on $device is inside them: step durations, busy time
# (union), activity time (clipped to the step; beyond the union it ran concurrently on several
# streams), copied bytes, communication kernel time and message bytes (NULL when a collective's size
# is unknown), streams, kernel launches per family.
GROUP_SQL = """
WITH steps AS MATERIALIZED (
    SELECT w.run_id, w.step_index, w.start_ns, w.end_ns, w.dur_ns, p.phase
    FROM step_windows_named($step) w
    JOIN step_phases_named($step) p ON p.run_id = w.run_id AND p.step_index = w.step_index
    WHERE w.run_id = $run_id AND w.dur_ns > 0
), kept AS MATERIALIZED (
    SELECT run_id, step_index, $device AS device, start_ns, end_ns, dur_ns FROM steps
    WHERE phase = 'steady' OR NOT (SELECT bool_or(phase = 'steady') FROM steps)
), busy AS (
    SELECT busy_ns FROM gpu_busy_between('kept', 'all', in_run := $run_id)
), act AS (
    SELECT a.event_id, a.kind, kernel_family(a.name) AS family, least(a.end_ns, k.end_ns) - a.ts_ns AS ns, a.bytes,
           a.stream
    FROM gpu_activities a ASOF JOIN kept k ON a.run_id = k.run_id AND a.ts_ns >= k.start_ns
    WHERE a.run_id = $run_id AND a.device = $device AND a.ts_ns < k.end_ns
), comm AS (
    SELECT kernel_event_id, bytes FROM collectives WHERE run_id = $run_id AND kernel_event_id IS NOT NULL
)
SELECT (SELECT list(dur_ns ORDER BY step_index) FROM kept) AS durations,
       (SELECT coalesce(sum(busy_ns), 0) FROM busy) AS busy_ns,
       (SELECT coalesce(sum(ns), 0) FROM act) AS activity_ns,
       (SELECT coalesce(sum(bytes) FILTER (WHERE kind = 'gpu_memcpy'), 0) FROM act) AS copy_bytes,
       (SELECT coalesce(sum(ns) FILTER (WHERE kind = 'gpu_memcpy'), 0) FROM act) AS copy_ns,
       (SELECT coalesce(sum(ns) FILTER (WHERE kind = 'kernel'), 0) FROM act) AS kernel_ns,
       (SELECT coalesce(sum(act.ns), 0) FROM act JOIN comm c ON c.kernel_event_id = act.event_id) AS comm_ns,
       (SELECT sum(c.bytes) FROM act JOIN comm c ON c.kernel_event_id = act.event_id) AS comm_bytes,
       (SELECT count(DISTINCT stream) FROM act) AS streams,
       (SELECT count(*) FROM act) AS activities,
       (SELECT map(list(family ORDER BY family), list(n ORDER BY family))
        FROM (SELECT family, count(*) AS n FROM act WHERE kind = 'kernel' GROUP BY family)) AS families
"""


@dataclass
class Group:
    """One step group's steady steps on a device: per-step means of its GPU work."""

    name: str
    durations: list[int]
    busy_ns: float
    concurrent_ns: float
    copy_bytes: float
    copy_ns: float
    kernel_ns: float
    comm_ns: float
    comm_bytes: float | None
    streams: int
    activities: float
    families: dict

    @property
    def steps(self) -> int:
        return len(self.durations)

    @property
    def mean_ns(self) -> float:
        return sum(self.durations) / len(self.durations)

    @property
    def stdev_ns(self) -> float:
        m, n = self.mean_ns, len(self.durations)
        return (sum((d - m) ** 2 for d in self.durations) / (n - 1)) ** 0.5 if n > 1 else 0.0

    def record(self) -> dict:
        return {
            "step": self.name,
            "steps": self.steps,
            "mean_ns": round(self.mean_ns),
            "per_step_ns": list(self.durations),
            "gpu_busy_ns": round(self.busy_ns),
            "copy_ns": round(self.copy_ns),
            "kernel_ns": round(self.kernel_ns),
            "comm_ns": round(self.comm_ns),
            "comm_bytes": round(self.comm_bytes) if self.comm_bytes is not None else None,
            "concurrent_ns": round(self.concurrent_ns),
            "streams": self.streams,
            "gpu_activities": round(self.activities, 2),
        }


@dataclass
class Variants:
    """A serial and an overlapped variant of the same work, and which is faster: `verdict` is `pays`
    (the overlapped steps are faster), `loses` (slower) or `tie` (within the steps' noise, or by less
    than the tie share)."""

    serial: Group
    overlapped: Group
    verdict: str
    change: float  # overlapped mean step time / serial mean - 1
    subject: str  # what both move: `copy` or `comm`

    @property
    def hideable_ns(self) -> float:
        """What overlapping can hide per step at most: the shorter of the serial steps' transfers
        (copies, communication kernels) and the compute beside them."""
        s = self.serial
        if self.subject == "copy":
            return min(s.copy_ns, s.kernel_ns)
        return min(s.comm_ns, max(s.kernel_ns - s.comm_ns, 0))

    def sentence(self) -> str:
        s, o = self.serial, self.overlapped
        return (
            f"this trace holds both variants of the same work: `{o.name}` (GPU work on {o.streams} streams, "
            f"{duration(o.concurrent_ns)} of it concurrent per step) takes {duration(o.mean_ns)} per step over "
            f"{o.steps} steps against {duration(s.mean_ns)} for `{s.name}` ({s.streams} stream"
            f"{'s' if s.streams != 1 else ''}) over {s.steps} steps, {100 * self.change:+.1f}%"
        )

    def record(self) -> dict:
        return {
            "verdict": self.verdict,
            "change": round(self.change, 4),
            "hideable_ns": round(self.hideable_ns),
            "serial": self.serial.record(),
            "overlapped": self.overlapped.record(),
        }


def _groups(con, run_id: int, device: int) -> list[Group]:
    names = [r.name for r in rows(con, GROUP_NAMES_SQL, {"run_id": run_id, "limit": MAX_GROUPS})]
    out = []
    for name in names:
        g = rows(con, GROUP_SQL, {"run_id": run_id, "device": device, "step": name})[0]
        durations = [int(d) for d in (g.durations or [])]
        if len(durations) < 2 or not g.activities:
            continue
        n = len(durations)
        out.append(
            Group(name, durations, g.busy_ns / n, max(g.activity_ns - g.busy_ns, 0) / n, g.copy_bytes / n,
                  g.copy_ns / n, g.kernel_ns / n, g.comm_ns / n,
                  g.comm_bytes / n if g.comm_bytes is not None else None, int(g.streams), g.activities / n,
                  dict(g.families or {}))
        )  # fmt: skip
    return out


def _mix_overlap(a: dict, b: dict) -> float:
    ta, tb = sum(a.values()), sum(b.values())
    if not ta or not tb:
        return 0.0
    return sum(min(a[f] / ta, b[f] / tb) for f in set(a) & set(b))


def _same_work(a: Group, b: Group, subject: str) -> bool:
    """Same kernel families and the same bytes moved per step: prefill and decode steps run the same
    kernels but move different bytes; a collective of unknown size is not matched."""
    if _mix_overlap(a.families, b.families) < SAME_WORK:
        return False
    moved = (a.copy_bytes, b.copy_bytes) if subject == "copy" else (a.comm_bytes, b.comm_bytes)
    if None in moved or not max(moved):
        return False
    return abs(moved[0] - moved[1]) <= SAME_BYTES * max(moved)


def _spread(a: Group, b: Group) -> tuple[int, float]:
    return (
        b.streams - a.streams,
        b.concurrent_ns / b.busy_ns - a.concurrent_ns / a.busy_ns if a.busy_ns and b.busy_ns else 0,
    )


def find(con, run_id: int, device: int, subject: str, min_change: float) -> Variants | None:
    """The serial and overlapped variants of the same work (`subject`: `copy` or `comm`, what both
    must move) among the run's step groups on `device`, or None. Of several pairs, the one with the
    most steps."""
    groups = _groups(con, run_id, device)
    pairs = []
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            if not _same_work(a, b, subject):
                continue
            streams, concurrency = _spread(a, b)
            if streams == 0 and abs(concurrency) < MORE_CONCURRENT:
                continue  # the same schedule twice: no overlapped variant
            serial, overlapped = (a, b) if (streams, concurrency) > (0, 0) else (b, a)
            pairs.append((serial.steps + overlapped.steps, serial, overlapped))
    if not pairs:
        return None
    _, serial, overlapped = max(pairs, key=lambda p: (p[0], p[1].name, p[2].name))
    delta = overlapped.mean_ns - serial.mean_ns
    change = delta / serial.mean_ns
    noise = 2 * (serial.stdev_ns**2 / serial.steps + overlapped.stdev_ns**2 / overlapped.steps) ** 0.5
    if abs(delta) <= noise or abs(change) < min_change:
        verdict = "tie"
    else:
        verdict = "pays" if delta < 0 else "loses"
    return Variants(serial, overlapped, verdict, change, subject)


def next_experiment(v: Variants, what: str, instead: str) -> str:
    """What to try when the trace holds both variants: not overlapping `what` (`copies`,
    `collectives`) again where overlap loses or ties, applying it where it pays; `instead`: the change
    that shortens the step when overlap does not (cut the bytes, fewer larger messages)."""
    s, o = v.serial, v.overlapped
    check = (
        f"Compare the variants again with `tracekit diff TRACE --baseline-step '{s.name}' --candidate-step "
        f"'{o.name}' --accept \"step_time <= -5%\"`."
    )
    if v.verdict == "pays":
        return (
            f"Overlap already pays here: {v.sentence()}. Apply `{o.name}`'s schedule wherever `{s.name}`'s still "
            f"runs, then {instead}. {check}"
        )
    launches = o.activities - s.activities
    if v.verdict == "loses":
        why = (
            f"each chunk adds launches and event waits ({launches:+.0f} GPU activities per step) that cost more than "
            "the overlap hides"
            if launches > 0
            else "the overlapped schedule costs more than it hides"
        )
        return (
            f"Do not overlap the {what} further: {v.sentence()}; {why}. Try fewer, larger chunks (or overlap only the "
            f"layers whose {what} take longer than their launch overhead), or keep `{s.name}`; then {instead}. {check}"
        )
    return (
        f"Overlap gains nothing measurable here: {v.sentence()}, a tie. Overlapping can hide at most "
        f"{duration(v.hideable_ns)} per step (the shorter of `{s.name}`'s {what} and its compute), so {instead}. "
        f"{check}"
    )
