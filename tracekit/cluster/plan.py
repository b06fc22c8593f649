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
# inputs each. On 256 one-megabyte ranks with 2 workers, chunks of 4 took 80 s, of 16 51 s.
MAX_AUTO_CHUNK = 32
# ... and at most CHUNK_BYTES of inflated trace content each, a larger rank file making a chunk of
# its own: a worker's memory follows the content of the chunk it holds (DuckDB's while it ingests,
# then the database's pages), so it is bounded by max(the largest rank file, CHUNK_BYTES) however
# many ranks the job has. Measured with 2 workers (benchmarks/RESULTS.md): 16 ranks of 45 MB in
# chunks of one, 348 MB per worker (a one-rank analyze: 338 MB) in 19.0 s; in chunks of four, as the
# count alone made them, 508 MB in 16.5 s. 32 one-megabyte ranks (29 MB) stay one chunk.
CHUNK_BYTES = 64 << 20


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


def plan(inputs, chunk_size: int = DEFAULT_CHUNK_SIZE, chunk_bytes: int | None = None) -> list[Chunk]:
    """The chunks of a job: consecutive inputs, `chunk_size` of them each (the last may hold fewer);
    with `chunk_bytes`, a chunk also ends before the input that would take its inflated content
    (compression.inflated_size) past that, so an input larger than it is a chunk alone. A file this
    process cannot see counts 0 bytes: its chunk is cut by count, on the workers that read it."""
    if chunk_size < 1:
        raise TracekitError("chunk size must be at least 1")
    return _cut(_trace_files(inputs), chunk_size, chunk_bytes)


def auto_plan(inputs, workers: int) -> tuple[list[Chunk], int]:
    """The default plan, and its count: chunks of at most auto_chunk_size inputs and CHUNK_BYTES."""
    files = _trace_files(inputs)
    count = auto_chunk_size(len(files), workers)
    return _cut(files, count, CHUNK_BYTES), count


def _cut(files: list[Path], chunk_size: int, chunk_bytes: int | None) -> list[Chunk]:
    if chunk_bytes is None:
        starts = list(range(0, len(files), chunk_size))
    else:
        from tracekit import compression

        starts, held = [0], 0
        for position, path in enumerate(files):
            size = compression.inflated_size(path)
            if position > starts[-1] and (position - starts[-1] == chunk_size or held + size > chunk_bytes):
                starts.append(position)
                held = 0
            held += size
    ends = starts[1:] + [len(files)]
    return [
        Chunk(i, start, tuple(str(p) for p in files[start:end])) for i, (start, end) in enumerate(zip(starts, ends))
    ]


def _trace_files(inputs) -> list[Path]:
    from tracekit.api import is_database

    files = expand_inputs(inputs)
    if not files:
        raise TracekitError("no inputs to analyse")
    if any(is_database(p) for p in files):
        raise TracekitError("the map/reduce path reads trace files, not a .duckdb database")
    return files
