"""Severity from documented parameters instead of thresholds hidden in the rules.

`--fail-on` gates CI on severity, so every threshold that decides it is a rule parameter: listed
under the rule's Options, overridable with `--param CODE.critical_share=...`, with defaults equal
to the ladder each rule had before.
"""

from __future__ import annotations

from tracekit.engine.registry import Param


def share_params(measure: str, critical: float, warning: float) -> dict[str, Param]:
    """The two thresholds of a ladder on one share: `critical_share` and `warning_share`."""
    return {
        "critical_share": Param(critical, f"critical when {measure} is at least this", "ratio"),
        "warning_share": Param(warning, f"warning when {measure} is at least this, else info", "ratio"),
    }


def by_share(share: float, params: dict) -> str:
    """critical at or above `critical_share`, warning at or above `warning_share`, info below."""
    if share >= params["critical_share"]:
        return "critical"
    if share >= params["warning_share"]:
        return "warning"
    return "info"
