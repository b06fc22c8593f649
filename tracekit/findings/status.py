"""Finding status across re-runs: fixed, regressed, unchanged or new, by stable finding id.

A finding id hashes the rule and the location, never timings (see findings.py), so the same problem
has the same id in the baseline and in the re-run. Per id:

- only in the re-run: `new`; only in the baseline: `fixed`;
- in both: compare the time the problem costs (impact.time_ns; a re-run of the same workload, so
  absolute time, not the share of a window that the fix itself may have shrunk). A change within the
  noise tolerance is `unchanged` even when the severity label moved; a growth beyond it is
  `regressed`; a drop beyond it stays `unchanged` with `trend: "better"` (the problem is still there).

Only classification lives here; tracekit.api.Trace.status gathers both sides' findings and the noise.

Noise tolerance (relative): the larger of 10% and the run-to-run spread the diff measured on steps
(IQR / median on either side, and the half-width of the 95% CI of the step-time delta over the
baseline median); at least 0.5% of the baseline finding's window.
"""

from __future__ import annotations

from tracekit.findings.model import SEVERITY_RANK
from tracekit.units import duration

MIN_REL_TOLERANCE = 0.10
ABS_WINDOW_FLOOR = 0.005
STATUSES = ("fixed", "regressed", "unchanged", "new")


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
        return MIN_REL_TOLERANCE, f"no step spread measured: default {MIN_REL_TOLERANCE:.0%}"
    measured = max(spreads)
    if measured <= MIN_REL_TOLERANCE:
        return MIN_REL_TOLERANCE, f"step spread {measured:.1%} is below the {MIN_REL_TOLERANCE:.0%} floor"
    return measured, f"step spread {measured:.1%} (IQR/median and CI95 of the step delta)"


def _side(f: dict) -> dict:
    return {
        "severity": f["severity"],
        "time_ns": f["impact"]["time_ns"],
        "share_of_window": f["impact"]["share_of_window"],
    }


def classify(baseline: list[dict], candidate: list[dict], noise: dict | None = None) -> dict:
    """{tolerance, tolerance_source, counts, findings: [{finding_id, rule, title, status, ...}]}."""
    tol, source = noise_tolerance(noise)
    base = {f["id"]: f for f in baseline}
    cand = {f["id"]: f for f in candidate}
    out = []
    for fid in sorted(set(base) | set(cand)):
        b, c = base.get(fid), cand.get(fid)
        f = c or b
        entry = {"finding_id": fid, "rule": f["rule"], "title": f["title"]}
        if b is None:
            entry.update(status="new", trend=None, reason="not in the baseline")
        elif c is None:
            entry.update(status="fixed", trend=None, reason="not in the re-run")
        else:
            bt, ct = b["impact"]["time_ns"], c["impact"]["time_ns"]
            delta = ct - bt
            allowed = max(tol * bt, ABS_WINDOW_FLOOR * (b["impact"]["window_ns"] or 0))
            moved = SEVERITY_RANK[c["severity"]] - SEVERITY_RANK[b["severity"]]
            change = f"cost {duration(bt)} -> {duration(ct)} (noise +/-{duration(allowed)})"
            if abs(delta) <= allowed:
                why = change + ": within noise"
                if moved:
                    why += f"; severity {b['severity']} -> {c['severity']} ignored"
                entry.update(status="unchanged", trend="same", reason=why)
            elif delta > 0:
                entry.update(status="regressed", trend="worse", reason=change)
            else:
                entry.update(status="unchanged", trend="better", reason=change + ": smaller but still present")
        entry["baseline"] = _side(b) if b else None
        entry["candidate"] = _side(c) if c else None
        out.append(entry)
    counts = {s: sum(1 for e in out if e["status"] == s) for s in STATUSES}
    return {"tolerance": round(tol, 4), "tolerance_source": source, "counts": counts, "findings": out}


def to_text(doc: dict) -> str:
    c = doc["counts"]
    lines = [
        f"Findings versus the baseline: {c['new']} new, {c['regressed']} regressed, {c['unchanged']} unchanged, "
        f"{c['fixed']} fixed (noise tolerance {doc['tolerance']:.0%}: {doc['tolerance_source']})"
    ]
    for e in doc["findings"]:
        lines.append(f"  {e['status']:<9} {e['finding_id']}  {e['reason']}")
    return "\n".join(lines) + "\n"
