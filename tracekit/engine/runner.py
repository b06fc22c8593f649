"""Run rules over a database: missing-input checks, parameters, and the rules' findings and notes."""

from __future__ import annotations

import time

from tracekit.engine import quality
from tracekit.engine.registry import DataQuality, Rule, all_rules, get_rule
from tracekit.engine.shared_views import computed_once
from tracekit.engine.toolkit import Context
from tracekit.findings.model import Finding


def missing_inputs(con, rule: Rule, known: dict[str, str | None] | None = None) -> list[str]:
    """Required relations that are absent or empty (e.g. `kernels` in a CPU-only trace). `known`, when
    given, keeps each relation's answer for the next rule of the same analysis: most rules require
    `kernels` or `gpu_activities`, and each probe plans the view again."""
    known = {} if known is None else known
    for rel in rule.requires:
        if rel not in known:
            try:
                found = con.execute(f"SELECT EXISTS (SELECT 1 FROM {rel})").fetchone()[0]
                known[rel] = None if found else f"{rel} (no rows)"
            except Exception:
                known[rel] = f"{rel} (absent)"
    return [known[rel] for rel in rule.requires if known[rel] is not None]


SHARED = "shared views"  # the keys of `timings` that are no rule code
QUALITY = "data-quality checks"


def run_rules(
    con,
    select: list[str] | None = None,
    params: dict[str, dict] | None = None,
    scope: str | None = None,
    timings: dict[str, float] | None = None,
    then=None,
):
    """Returns (findings, data_quality notes) from the selected rules (all when select is None), of
    one scope only when `scope` is given ("run" in a cluster worker, "job" in its reducer).
    `timings`, when given, receives the wall seconds of each rule by code, of the shared views
    (SHARED) and of the data-quality checks (QUALITY). `then`, when given, is called after the rules
    while the shared views' tables still exist: other queries of the same report read them too."""
    rules = [get_rule(k) for k in select] if select else all_rules()
    if scope is not None:
        rules = [r for r in rules if r.scope == scope]
    timings = {} if timings is None else timings
    started = time.perf_counter()
    with computed_once(con):
        timings[SHARED] = time.perf_counter() - started
        out = _run(con, rules, params or {}, timings)
        if then is not None:
            then()
        return out


def _run(con, rules: list[Rule], params: dict[str, dict], timings: dict[str, float]):
    ctx = Context(con)
    findings: list[Finding] = []
    started = time.perf_counter()
    notes: list[DataQuality] = quality.notes(ctx) if any(r.scope == "run" for r in rules) else []
    timings[QUALITY] = time.perf_counter() - started
    present: dict[str, str | None] = {}
    for rule in rules:
        started = time.perf_counter()
        try:
            _run_one(con, rule, params, ctx, findings, notes, present)
        finally:
            timings[rule.code] = time.perf_counter() - started
    return findings, notes


def _run_one(con, rule: Rule, params: dict[str, dict], ctx: Context, findings: list, notes: list, present) -> None:
    import duckdb

    missing = missing_inputs(con, rule, present)
    if missing:
        notes.append(DataQuality(rule.code, f"{rule.name} not run: needs {', '.join(missing)}"))
        return
    values = rule.resolve_params(params.get(rule.code, {}))
    try:
        produced = list(rule.check(con, values, ctx))
    except duckdb.Error as e:  # e.g. out of memory on a huge trace: report it, run the other rules
        notes.append(DataQuality(rule.code, f"{rule.name} failed: {' '.join(str(e).split())[:300]}"))
        return
    for item in produced:
        (notes if isinstance(item, DataQuality) else findings).append(item)
