"""Run rules over a database: missing-input checks, parameters, and the rules' findings and notes."""

from __future__ import annotations

from tracekit.engine import quality
from tracekit.engine.registry import DataQuality, Rule, all_rules, get_rule
from tracekit.engine.shared_views import computed_once
from tracekit.engine.toolkit import Context
from tracekit.findings.model import Finding


def missing_inputs(con, rule: Rule) -> list[str]:
    """Required relations that are absent or empty (e.g. `kernels` in a CPU-only trace)."""
    missing = []
    for rel in rule.requires:
        try:
            if not con.execute(f"SELECT EXISTS (SELECT 1 FROM {rel})").fetchone()[0]:
                missing.append(f"{rel} (no rows)")
        except Exception:
            missing.append(f"{rel} (absent)")
    return missing


def run_rules(con, select: list[str] | None = None, params: dict[str, dict] | None = None, scope: str | None = None):
    """Returns (findings, data_quality notes) from the selected rules (all when select is None), of
    one scope only when `scope` is given ("run" in a cluster worker, "job" in its reducer)."""
    rules = [get_rule(k) for k in select] if select else all_rules()
    if scope is not None:
        rules = [r for r in rules if r.scope == scope]
    with computed_once(con):
        return _run(con, rules, params or {})


def _run(con, rules: list[Rule], params: dict[str, dict]):
    import duckdb

    ctx = Context(con)
    findings: list[Finding] = []
    notes: list[DataQuality] = quality.notes(ctx) if any(r.scope == "run" for r in rules) else []
    for rule in rules:
        missing = missing_inputs(con, rule)
        if missing:
            notes.append(DataQuality(rule.code, f"{rule.name} not run: needs {', '.join(missing)}"))
            continue
        values = rule.resolve_params(params.get(rule.code, {}))
        produced: list = []
        try:
            produced.extend(rule.check(con, values, ctx))
        except duckdb.Error as e:  # e.g. out of memory on a huge trace: report it, run the other rules
            notes.append(DataQuality(rule.code, f"{rule.name} failed: {' '.join(str(e).split())[:300]}"))
            continue
        for item in produced:
            (notes if isinstance(item, DataQuality) else findings).append(item)
    return findings, notes
