"""Rule registry: each module in tracekit.rules registers one rule with @rule.

A rule module's docstring is its documentation, under fixed headings (## What it does, ## Why it
matters, ## Example, ## Options); `tracekit rules show CODE` prints it and a test checks the form.
A rule reads tables, never files; when its inputs are missing it returns a DataQuality note, not a finding.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

RULE_MODULES = (
    "comm_overlap",
    "duplicate_launches",
    "gpu_idle",
    "host_sync",
    "launch_bound",
    "numerics_drift",
    "repeated_tile_work",
    "serving_throughput",
    "thread_starvation",
)


@dataclass(frozen=True)
class Param:
    default: Any
    help: str
    unit: str = ""


@dataclass
class DataQuality:
    """Why a rule could not (fully) run on this input: missing tables, views or events."""

    rule: str
    message: str
    run_id: int | None = None

    def as_dict(self) -> dict:
        return {"rule": self.rule, "run_id": self.run_id, "message": self.message}


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
    extra: dict = field(default_factory=dict)

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


_REGISTRY: dict[str, Rule] = {}


def rule(code: str, name: str, title: str, category: str, requires: tuple[str, ...], params: dict[str, Param]):
    """Register the decorated `check(con, params, ctx)` as a rule; the module docstring is its doc."""

    def register(fn):
        module = importlib.import_module(fn.__module__)
        if code in _REGISTRY and _REGISTRY[code].check is not fn:
            raise ValueError(f"rule code {code} registered twice")
        _REGISTRY[code] = Rule(
            code=code,
            name=name,
            title=title,
            category=category,
            requires=tuple(requires),
            params=dict(params),
            check=fn,
            doc=(module.__doc__ or "").strip(),
            module=fn.__module__,
        )
        return fn

    return register


def all_rules() -> list[Rule]:
    for mod in RULE_MODULES:
        importlib.import_module(f"tracekit.rules.{mod}")
    return [_REGISTRY[c] for c in sorted(_REGISTRY)]


def get_rule(key: str) -> Rule:
    """Look a rule up by code (G001) or name (gpu-idle)."""
    for r in all_rules():
        if key.upper() == r.code or key.lower() == r.name:
            return r
    raise KeyError(f"unknown rule {key!r}; see `tracekit rules`")


def discovered_modules() -> list[str]:
    """Rule modules present in the package, to check RULE_MODULES lists them all."""
    import tracekit.rules as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
