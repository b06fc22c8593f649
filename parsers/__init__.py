"""Input formats: one module per format (importable as tracekit.parsers)."""
