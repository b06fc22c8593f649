"""Rule registry: every module of the rules package defines one rule with @rule, found by walking the package.

A rule module is named after its rule (`gpu-idle` lives in gpu_idle.py); modules whose name starts
with `_` hold what several rules share and define none. The module docstring is the rule's
documentation, under fixed headings (## What it does, ## Why it matters, ## Example, ## Options);
`tracekit rules show CODE` prints it and a test checks the form. A rule reads tables, never files;
when its inputs are missing it returns a DataQuality note, not a finding.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# Named, not imported: the rules sit above the engine, which must not depend on them.
RULES_PACKAGE = "tracekit.rules"
_RULE_ATTRIBUTE = "__tracekit_rule__"


@dataclass(frozen=True)
class Param:
    default: Any
    help: str
    unit: str = ""


@dataclass(frozen=True)
class Example:
    """The real input whose finding docs/rules.md shows for a rule: files in sample_traces/, or in the
    corpus when named `corpus/<file>`. `params` are set where the defaults report nothing on any
    bundled input, so the page shows the nearest real output; `note` says why."""

    inputs: tuple[str, ...]
    params: dict = field(default_factory=dict)
    note: str = ""


@dataclass
class DataQuality:
    """Why a rule could not (fully) run on this input (missing tables, views or events), or a flagged
    check of the `data_quality` view (`check`, with its value and threshold)."""

    rule: str
    message: str
    run_id: int | None = None
    check: str | None = None
    value: float | None = None
    threshold: float | None = None

    def as_dict(self) -> dict:
        measured = {"check": self.check, "value": self.value, "threshold": self.threshold} if self.check else {}
        return {"rule": self.rule, "run_id": self.run_id, "message": self.message, **measured}


@dataclass
class Rule:
    code: str
    name: str
    title: str
    category: str
    requires: tuple[str, ...]
    params: dict[str, Param]
    check: Callable[..., Iterable]
    doc: str = ""
    module: str = ""
    status: str = "preview"
    since: str = "0.1.0"
    example: Example | None = None
    # "run": reads one rank's tables and views, run where that rank's events are (a cluster worker);
    # "job": a cross-rank rule that reads only the per-rank summaries (JOB_INPUTS), run once per job
    scope: str = "run"

    def resolve_params(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        values = {k: p.default for k, p in self.params.items()}
        for key, raw in (overrides or {}).items():
            if key not in self.params:
                raise KeyError(f"rule {self.code} ({self.name}) has no parameter {key!r}; it has {sorted(self.params)}")
            values[key] = _coerce(self.params[key].default, raw, f"{self.code}.{key}")
        return values

    def describe(self) -> dict:
        return {
            "code": self.code,
            "name": self.name,
            "title": self.title,
            "category": self.category,
            "requires": list(self.requires),
            "status": self.status,
            "since": self.since,
            "scope": self.scope,
            "params": {k: {"default": p.default, "unit": p.unit, "help": p.help} for k, p in self.params.items()},
            "doc": self.doc,
        }


def _coerce(default: Any, raw: Any, where: str) -> Any:
    """A CLI value to the type of the parameter's default ("false" is False, not bool("false"))."""
    if default is None:
        return raw
    if isinstance(default, bool):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{where}: expected true or false, got {raw!r}")
    if isinstance(default, int) and isinstance(raw, float) and not raw.is_integer():
        raise ValueError(f"{where}: expected an integer, got {raw!r}")
    try:
        return type(default)(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected a {type(default).__name__}, got {raw!r}") from None


def rule(
    code: str,
    name: str,
    title: str,
    category: str,
    requires: tuple[str, ...],
    params: dict[str, Param],
    example: Example | None = None,
    scope: str = "run",
):
    """Mark the decorated `check(con, params, ctx)` as its module's rule; the module docstring is its doc."""

    if scope not in SCOPES:
        raise ValueError(f"rule {code}: scope must be one of {SCOPES}, not {scope!r}")

    def mark(fn):
        module = importlib.import_module(fn.__module__)  # still executing: its docstring is already set
        setattr(
            fn,
            _RULE_ATTRIBUTE,
            Rule(
                code=code,
                name=name,
                title=title,
                category=category,
                requires=tuple(requires),
                params=dict(params),
                check=fn,
                doc=(module.__doc__ or "").strip(),
                module=fn.__module__,
                example=example,
                scope=scope,
            ),
        )
        return fn

    return mark


# What a "job"-scope rule may read: the per-rank summaries (views over every rank's events in one
# database, tables in a cluster run's reducer) and the views computed from them alone.
JOB_INPUTS = ("runs", "rank_collectives", "rank_steps", "rank_op_times", "rank_op_inputs", "rank_measured_steps", "collective_arrivals", "rank_step_waits",
              "cluster_step_components", "rank_components")  # fmt: skip
SCOPES = ("run", "job")


def rules_of(module) -> list[Rule]:
    """The rules a module defines itself (a check imported from elsewhere is not one of them)."""
    found = (getattr(v, _RULE_ATTRIBUTE, None) for v in vars(module).values() if callable(v))
    return [r for r in found if isinstance(r, Rule) and r.module == module.__name__]


def discover(package: str = RULES_PACKAGE) -> dict[str, Rule]:
    """Every rule of the package's public modules by code; two modules claiming one code is an error."""
    found: dict[str, Rule] = {}
    for info in sorted(pkgutil.iter_modules(importlib.import_module(package).__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        for r in rules_of(importlib.import_module(f"{package}.{info.name}")):
            if r.code in found:
                raise ValueError(f"rule code {r.code} is defined twice: in {found[r.code].module} and {r.module}")
            found[r.code] = r
    return found


@functools.cache
def _registry() -> dict[str, Rule]:
    return discover()


def all_rules() -> list[Rule]:
    rules = _registry()
    return [rules[c] for c in sorted(rules)]


def get_rule(key: str) -> Rule:
    """Look a rule up by code (G001) or name (gpu-idle)."""
    for r in all_rules():
        if key.upper() == r.code or key.lower() == r.name:
            return r
    raise KeyError(f"unknown rule {key!r}; see `tracekit rules`")
