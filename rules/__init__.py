"""Rules, one module each, named after the rule (importable as tracekit.rules).

tracekit.engine.registry finds them by walking this package; modules whose name starts with `_`
hold what several rules share (measurements, helpers) and define no rule.
"""
