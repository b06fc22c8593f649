"""tracekit: profiler traces in, attributable performance findings out."""

__version__ = "0.1.0"
