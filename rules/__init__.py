"""Rules, one module each (importable as tracekit.rules). The registry lives in tracekit.rules_api."""

from tracekit.engine.registry import DataQuality, Param, Rule, all_rules, get_rule, rule

__all__ = ["DataQuality", "Param", "Rule", "all_rules", "get_rule", "rule"]
