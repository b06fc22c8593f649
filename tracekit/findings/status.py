"""Finding status against a baseline: new, fixed, improved, regressed or unchanged, per unit of work.

Matching. A finding id hashes the rule and the location, never timings, with names keyed
(findings.model), so the same problem has the same id in the baseline and in the re-run. When each
side is one run, a finding left unmatched by id is matched by what it names (rule, kernel, op, code
path, launch, step: not the rank, device, stream, thread or input shapes) when exactly one finding on
each side names it: a capture of rank 3 compared with one of rank 1 compares the run with the run, and
a collective on NCCL stream 21 in one process is the same problem on stream 15 in another.

Cost per unit of work. A finding's cost (impact.time_ns) is summed over its run's window, and two
captures rarely cover the same length of work. The cost compared is the cost per unit of work the
diff matched on both sides (a step, a repeated annotation or a repeated kernel sequence:
`noise.units_per_run`): time_ns / units. Without a diff, one unit per run (absolute cost).

Noise tolerance (relative): the larger of 10% and the run-to-run spread the diff measured on the units
(IQR / median of the unit times on either side, and the half-width of the 95% CI of the mean unit-time
delta over the baseline median); a change must also exceed 0.5% of the baseline's median unit time.

Per finding:

- only in the re-run: `new`; only in the baseline: `fixed`;
- in both, per-unit cost fell by more than the tolerance: `improved` (smaller, still reported);
- rose by more than the tolerance: `regressed`; else `unchanged`, even when the severity label moved;
- every finding is `not_comparable` when the diff found no unit of work on both sides (or the units
  hold different work): a status between two different workloads would be a guess.

Only classification lives here; tracekit.api.Trace.status gathers both sides' findings and the noise.
"""

from __future__ import annotations

import json

from tracekit.findings.model import location_key
from tracekit.units import duration

MIN_REL_TOLERANCE = 0.10
ABS_UNIT_FLOOR = 0.005
STATUSES = ("fixed", "improved", "regressed", "unchanged", "new", "not_comparable")


def noise_tolerance(noise: dict | None) -> tuple[float, str]:
    """Relative tolerance for a finding's cost and where it came from."""
    spreads = []
    if noise:
        for side in ("baseline", "candidate"):
            s = noise.get(side) or {}
            if s.get("median_ns") and s.get("iqr_ns") is not None and s.get("n", 0) >= 2:
                spreads.append(s["iqr_ns"] / s["median_ns"])
        ci, base = noise.get("ci95_delta_ns"), (noise.get("baseline") or {}).get("median_ns")
        if ci and base:
            spreads.append((ci[1] - ci[0]) / 2 / base)
    if not spreads:
        return MIN_REL_TOLERANCE, f"no spread over units of work measured: default {MIN_REL_TOLERANCE:.0%}"
    measured = max(spreads)
    if measured <= MIN_REL_TOLERANCE:
        return MIN_REL_TOLERANCE, f"unit spread {measured:.1%} is below the {MIN_REL_TOLERANCE:.0%} floor"
    return measured, f"unit spread {measured:.1%} (IQR/median and CI95 of the unit-time delta)"


def _units(noise: dict | None) -> dict[str, float]:
    per_run = (noise or {}).get("units_per_run") or {}
    return {side: float(per_run.get(side) or 1.0) for side in ("baseline", "candidate")}


def _side(f: dict, units: float) -> dict:
    return {
        "severity": f["severity"],
        "time_ns": f["impact"]["time_ns"],
        "share_of_window": f["impact"]["share_of_window"],
        "per_unit_ns": round(f["impact"]["time_ns"] / units),
    }


# What a finding names, beside where it ran: the keys that match findings of one-run sides.
_NAMED = ("kernel", "op", "code_path", "launch", "step")


def _named(f: dict) -> str:
    return json.dumps([f["rule"], location_key(f.get("locality", {}), _NAMED)], sort_keys=True, default=str)


def _pairs(baseline: list[dict], candidate: list[dict], one_run_each: bool) -> list[tuple[dict | None, dict | None]]:
    """(baseline, candidate) findings of one problem: by id, then (one run a side) by what they name."""
    base = {f["id"]: f for f in baseline}
    cand = {f["id"]: f for f in candidate}
    pairs = [(base.get(i), cand.get(i)) for i in sorted(set(base) | set(cand))]
    if not one_run_each:
        return pairs
    lone_b = [b for b, c in pairs if c is None]
    lone_c = [c for b, c in pairs if b is None]
    named_b, named_c = {}, {}
    for f in lone_b:
        named_b.setdefault(_named(f), []).append(f)
    for f in lone_c:
        named_c.setdefault(_named(f), []).append(f)
    matched = {
        key: (fs[0], named_c[key][0]) for key, fs in named_b.items() if len(fs) == 1 and len(named_c.get(key, ())) == 1
    }
    taken = {id(f) for pair in matched.values() for f in pair}
    kept = [(b, c) for b, c in pairs if id(b or c) not in taken]
    return sorted([*kept, *matched.values()], key=lambda p: (p[1] or p[0])["id"])


def classify(baseline: list[dict], candidate: list[dict], noise: dict | None = None) -> dict:
    """{tolerance, tolerance_source, comparable, counts, findings: [{finding_id, rule, title, status, ...}]}."""
    tol, source = noise_tolerance(noise)
    units = _units(noise)
    comparable = (noise or {}).get("comparable", True)
    runs = (noise or {}).get("runs") or {}
    one_run_each = bool(runs) and all(runs.get(s) == 1 for s in ("baseline", "candidate"))
    unit_ns = ((noise or {}).get("baseline") or {}).get("median_ns")
    out = []
    for b, c in _pairs(baseline, candidate, one_run_each):
        f = c or b
        entry = {"finding_id": f["id"], "rule": f["rule"], "title": f["title"]}
        if b is not None and c is not None and b["id"] != c["id"]:
            entry["baseline_finding_id"] = b["id"]
        if not comparable:
            where = "in both" if b and c else "only in the baseline" if b else "only in the re-run"
            why = f"{where}; not compared: {noise.get('comparability') or 'no unit of work on both sides'}"
            entry.update(status="not_comparable", trend=None, reason=why)
        elif b is None:
            entry.update(status="new", trend=None, reason="not in the baseline")
        elif c is None:
            entry.update(status="fixed", trend=None, reason="not in the re-run")
        else:
            entry.update(_compare(b, c, units, tol, unit_ns))
        entry["baseline"] = _side(b, units["baseline"]) if b else None
        entry["candidate"] = _side(c, units["candidate"]) if c else None
        out.append(entry)
    counts = {s: sum(1 for e in out if e["status"] == s) for s in STATUSES}
    return {
        "tolerance": round(tol, 4),
        "tolerance_source": source,
        "comparable": bool(comparable),
        "units_per_run": units,
        "counts": counts,
        "findings": out,
    }


def _compare(b: dict, c: dict, units: dict[str, float], tol: float, unit_ns: int | None) -> dict:
    bt, ct = b["impact"]["time_ns"] / units["baseline"], c["impact"]["time_ns"] / units["candidate"]
    delta = ct - bt
    allowed = max(tol * bt, ABS_UNIT_FLOOR * (unit_ns or 0))
    per = "per unit of work" if units["baseline"] != 1 or units["candidate"] != 1 else "per run"
    change = f"cost {per} {duration(bt)} -> {duration(ct)} ({_pct(delta, bt)}; noise +/-{duration(allowed)})"
    if abs(delta) <= allowed:
        why = change + ": within noise"
        if b["severity"] != c["severity"]:
            why += f"; severity {b['severity']} -> {c['severity']} ignored"
        return {"status": "unchanged", "trend": "same", "reason": why}
    if delta > 0:
        return {"status": "regressed", "trend": "worse", "reason": change}
    return {"status": "improved", "trend": "better", "reason": change + ": smaller, still reported"}


def _pct(delta: float, base: float) -> str:
    return f"{100 * delta / base:+.0f}%" if base else "n/a"


def to_text(doc: dict) -> str:
    c = doc["counts"]
    if not doc.get("comparable", True):
        head = f"Findings versus the baseline: not compared ({c['not_comparable']} finding(s)); "
        reason = doc["findings"][0]["reason"].split("not compared: ", 1)[-1] if doc["findings"] else ""
        lines = [head + reason]
    else:
        lines = [
            f"Findings versus the baseline: {c['new']} new, {c['regressed']} regressed, {c['improved']} improved, "
            f"{c['unchanged']} unchanged, {c['fixed']} fixed (noise tolerance {doc['tolerance']:.0%}: "
            f"{doc['tolerance_source']})"
        ]
    for e in doc["findings"]:
        lines.append(f"  {e['status']:<9} {e['finding_id']}  {e['reason']}")
    return "\n".join(lines) + "\n"
