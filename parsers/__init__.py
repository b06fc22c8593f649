"""Readers: one module per input format, and the registry that ingest, its errors and the docs use.

Adding a format is adding a module here and its name to READERS (and its notes to docs/schema.md).
A reader module defines:

- `FORMAT`: the `runs.format` (and `ingest_log.format`) of what it reads.
- `DESCRIPTION`: its human name, as listed in "not a format tracekit reads; tried by content: ...".
- `sniff(head, name, **options) -> bool`: whether `head`, the first bytes of the content (at most
  HEAD_BYTES, already decompressed: tracekit.compression), is this format; `name` is the file's
  name, for formats a suffix tells. No file I/O; never raises.
- `read(path, **options) -> rows.Export`: the whole input, for ingest to load (see parsers/rows.py):
  rows it built in Python, or a `loader` that inserts them itself (DuckDB SQL over the file for
  Chrome/Kineto JSON, Arrow batches for Nsight Systems) and may raise `rows.Reload` to be called
  again in a fresh transaction. Bad input is an InputError naming the file, the position and
  what was expected; compressed input is opened through tracekit.compression.

`options` are ingest's (`metrics`: error columns the user named; `tmpdir`: where temporary files
go): a reader takes the ones it uses by name and ignores the rest. Optional:

- `ATTACHABLE = True`: a log that joins the run of a trace given with it, on the trace's clock;
  `align(con, run_id, export, trace) -> dict` measures that clock offset from events both share
  (else ingest compares their time windows).
- `TAKES_LOGS = True`: the trace that attachable logs join.
- `READ_AHEAD = True`: `read` is file I/O and decompression that release the GIL, so ingest reads
  the next such input on a thread while it loads the current one.
- `RANKS_BY_PROCESS = True`: a file may hold several ranks, one process each, with correlation ids
  scoped by process (pid * 2**32 + id); ingest splits it into one run per rank (tracekit/ingest/processes.py).
- `derive(con, run_id)`: a step of the reader's own after ingest's shared ones (processes, threads,
  streams, nesting), run for every run its rows are part of.
- `fallback(head) -> bool`: takes what no reader recognised (the Chrome reader takes any JSON, so
  that its error says what the trace lacks).
- `claims(folder: Path) -> bool`: the reader reads a whole folder as one input (a profiler's output
  folder of one rank, such as torch_npu's `*_ascend_pt`, whose files together make one run): from
  the names of the files in it, no content read; never raises. `read` is then given the folder,
  reads the files it knows and counts the others in `Export.skipped` or its notes; a folder holding
  such folders (one per rank) is one input per claimed folder (tracekit/ingest/inputs.py).

What every format shares (entities, nesting, rank from the file name, the runs and ingest_log
rows, transactions) is ingest's: tracekit/ingest/.
"""

from __future__ import annotations

import importlib
from functools import cache

# The order a file's content is tried in: the first reader whose sniff says yes reads it, so a
# broad sniff goes after the narrower ones it would take from.
READERS = (
    "ascend_text",  # before kineto, whose Chrome reader would take trace_view.json as generic JSON
    "kineto",
    "ascend_db",  # before nsys_sqlite, whose sniff takes any SQLite file
    "msprof_cluster",  # before nsys_sqlite, which takes any SQLite file
    "nsys_sqlite",
    "nsys_stats_csv",
    "perfetto_proto",
    "otlp_json",
    "bench_serving",
    "serving_log",
    "numerics_report",
    "runtime_events",
    "ncu_csv",
    "msprof_folder",
)
HEAD_BYTES = 1 << 20  # the longest prefix any sniff reads (server logs, Perfetto packets)


@cache
def readers() -> tuple:
    """The reader modules, in READERS order."""
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in READERS)


def recognise(head: bytes, name: str, fallback: bool = True, **options):
    """The reader that takes this content (see READERS for the order), or None; with `fallback`
    False, only one whose sniff recognises it (a folder's stray files are skipped, not misread)."""
    for reader in readers():
        if reader.sniff(head, name, **options):
            return reader
    if not fallback:
        return None
    return next((r for r in readers() if hasattr(r, "fallback") and r.fallback(head)), None)


def claim(folder) -> object | None:
    """The reader that reads this folder as one input (its `claims`), or None."""
    return next((r for r in readers() if hasattr(r, "claims") and r.claims(folder)), None)


def formats() -> list[tuple[str, str]]:
    """(runs.format, description) of every reader, in the order they are tried."""
    return [(r.FORMAT, r.DESCRIPTION) for r in readers()]
