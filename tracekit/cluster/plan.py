"""The plan of a cluster run: the inputs in the order one database of them all would ingest them,
cut into chunks of consecutive inputs, so a worker holds a few rank files at a time.

Folders are expanded here, as `tracekit.open` expands them (a profiler's folder: the files a
reader takes, in natural name order), so each chunk knows the global position of its first input:
a database of every input numbers its runs 1, 2, ... in that order, and a chunk's database starts
its `run_ids` sequence at that position + 1 to give the same ids. Files are not read here beyond
what recognising a folder's files takes: the client need not read the traces the workers read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

# Ranks per chunk by default: a worker's memory is bounded by a few rank files (each one costs
# about its inflated JSON in DuckDB while it is ingested), and a chunk's fixed cost (a database
# file, the schema, the rules' start-up) is paid by few enough chunks.
DEFAULT_CHUNK_SIZE = 4
# With no chunk size given: about two chunks per worker, so that the fixed cost of a chunk (its
# database, the rules' shared views, one task each phase) is paid rarely, and at most MAX_AUTO_CHUNK
# inputs each, which bounds a worker's memory to that many rank files. On 256 one-megabyte ranks
# with 2 workers, chunks of 4 took 80 s, of 16 51 s.
MAX_AUTO_CHUNK = 32


def auto_chunk_size(inputs: int, workers: int) -> int:
    return max(1, min(MAX_AUTO_CHUNK, -(-inputs // (2 * max(1, workers)))))


@dataclass(frozen=True)
class Chunk:
    """Consecutive inputs of the job: `first` is the global position (0-based) of its first one."""

    index: int
    first: int
    paths: tuple[str, ...]


def expand_inputs(inputs) -> list[Path]:
    """Every input file in ingest order, folders replaced by their trace files."""
    from tracekit.ingest.inputs import expand

    files: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        files += [item.path for item in expand([path])] if path.is_dir() else [path]
    return files


def plan(inputs, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[Chunk]:
    """The chunks of a job: consecutive inputs, `chunk_size` of them each (the last may hold fewer)."""
    if chunk_size < 1:
        raise TracekitError("chunk size must be at least 1")
    from tracekit.api import is_database

    files = expand_inputs(inputs)
    if not files:
        raise TracekitError("no inputs to analyse")
    if any(is_database(p) for p in files):
        raise TracekitError("the map/reduce path reads trace files, not a .duckdb database")
    return [
        Chunk(i, start, tuple(str(p) for p in files[start : start + chunk_size]))
        for i, start in enumerate(range(0, len(files), chunk_size))
    ]
