"""Data quality applied to findings: the flagged checks of the `data_quality` view, as notes for the
report and as lowered confidence (and severity held at info) for the findings built on what they
undermine. Rules call `qualify` on each finding with the measurements its numbers rest on."""

from __future__ import annotations

from tracekit.engine.registry import DataQuality

# A finding built on a measurement that a flagged check undermines keeps at most this confidence
# when the check caps severity (its number may describe the missing data, not the workload) ...
CAPPED_CONFIDENCE = 0.3
# ... and is scaled by this otherwise (the measurement is partly incomplete).
DOUBTED_CONFIDENCE_FACTOR = 0.8

# What a finding's numbers may rest on, as the view's `affects` names them.
GPU_TIMELINE = "gpu_timeline"
LAUNCH_ATTRIBUTION = "launch_attribution"


def flagged_checks(con) -> tuple[list, str | None]:
    """The flagged rows of `data_quality`, every run, in (run, check) order, and why they could not
    be computed (e.g. out of memory on a huge trace), else None."""
    import duckdb

    from tracekit.engine.toolkit import rows

    try:
        found = rows(
            con,
            "SELECT run_id, check_name, value, threshold, detail, affects, caps_severity FROM data_quality "
            "WHERE flagged ORDER BY run_id, check_name",
        )
    except duckdb.Error as e:
        return [], " ".join(str(e).split())[:300]
    return found, None


def notes(ctx) -> list[DataQuality]:
    """One data-quality note per flagged check, with its numbers (or one saying the checks failed)."""
    if ctx.data_quality_error:
        return [DataQuality("data-quality", f"data-quality checks failed: {ctx.data_quality_error}")]
    return [
        DataQuality(c.check_name, c.detail, c.run_id, check=c.check_name, value=c.value, threshold=c.threshold)
        for c in ctx.data_quality()
    ]


def qualify(ctx, finding, uses: tuple[str, ...]):
    """The finding, with lowered confidence and a caveat per flagged check of its run that undermines
    one of `uses`; held at info when such a check caps severity. Returns the same finding."""
    run_id = finding.locality.get("run_id")
    against = [c for c in ctx.data_quality(run_id) if set(c.affects) & set(uses)]
    if not against:
        return finding
    if any(c.caps_severity for c in against):
        finding.severity = "info"
        finding.confidence = min(finding.confidence, CAPPED_CONFIDENCE)
    else:
        finding.confidence = finding.confidence * DOUBTED_CONFIDENCE_FACTOR
    finding.caveats = [*finding.caveats, *(f"Data quality ({c.check_name}): {c.detail}." for c in against)]
    finding.extra = {
        **finding.extra,
        "data_quality": [
            {
                "check": c.check_name,
                "value": round(c.value, 4),
                "threshold": c.threshold,
                "caps_severity": c.caps_severity,
            }
            for c in against
        ],
    }
    return finding
