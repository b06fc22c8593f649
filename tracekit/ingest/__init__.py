"""Input files -> rows of the trace database: recognise each input, read it, derive what every format shares."""

from tracekit.ingest.pipeline import IngestResult, ingest, plan

__all__ = ["IngestResult", "ingest", "plan"]
