"""tracekit: profiler traces in, attributable performance findings out.

    import tracekit
    trace = tracekit.open("run.pt.trace.json.gz")
    trace.findings().df()

`open` is tracekit.api.open (see there and docs/python.md), imported on first use so that
`import tracekit` (and `tracekit --help`) loads neither DuckDB nor the readers.
"""

__version__ = "0.1.0"


def open(*inputs, **options):  # the package's entry point, like io.open; shadows the builtin here only
    """Open traces, logs, profiler folders or a .duckdb database as a tracekit.api.Trace."""
    from tracekit.api import open as open_trace

    return open_trace(*inputs, **options)


def analyze_job(inputs, **options):
    """Analyse a job's rank traces by map/reduce, in this process or on Dask (tracekit.cluster,
    docs/cluster.md); returns a tracekit.cluster.JobResult."""
    from tracekit.cluster import analyze_job as analyze

    return analyze(inputs, **options)


def __getattr__(name: str):
    if name == "Trace":
        from tracekit.api import Trace

        return Trace
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
