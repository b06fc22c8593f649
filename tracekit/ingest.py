"""Ingest trace files into a database: stage (decompress/slice) the next file while loading this one."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson

from . import db as dbmod
from .errors import InputError
from .nesting import compute_nesting


@dataclass
class IngestResult:
    run_id: int
    source: str
    format: str
    bytes_read: int
    events_read: int
    events_ingested: int
    events_skipped: int
    skipped_reasons: dict
    seconds: float
    rank: int | None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def ingest(
    con,
    paths: list[str | Path],
    rank: int | None = None,
    labels: list[str] | None = None,
    tmpdir: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[IngestResult]:
    from tracekit.parsers import kineto
    from tracekit.parsers.json_slice import stage

    paths = [Path(p) for p in paths]
    dbmod.bound_memory(con, dbmod.current_memory_hint(con) + sum(raw_size(p) for p in paths))
    results = []
    # zlib and copy_file_range release the GIL: the next file is staged on the other core.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(stage, paths[0], tmpdir) if paths else None
        for i, path in enumerate(paths):
            started = time.perf_counter()
            staged = pending.result()
            pending = pool.submit(stage, paths[i + 1], tmpdir) if i + 1 < len(paths) else None
            try:
                if progress:
                    progress(f"loading {path.name}")
                run_id = dbmod.next_run_id(con)
                label = labels[i] if labels and i < len(labels) else None
                run = kineto.describe_run(staged, rank, label)
                counts = kineto.load(con, staged, run_id)
                kineto.fill_entities(con, run_id)
                compute_nesting(con, run_id)
                _insert_run(con, run_id, run)
                seconds = time.perf_counter() - started
                ingested = counts["events_read"] - counts["events_skipped"]
                con.execute(
                    "INSERT INTO ingest_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        run_id,
                        str(path),
                        kineto.FORMAT,
                        staged.bytes_read,
                        counts["events_read"],
                        ingested,
                        counts["events_skipped"],
                        orjson.dumps(counts["skipped_reasons"]).decode(),
                        orjson.dumps(counts["notes"]).decode(),
                        seconds,
                    ],
                )
                results.append(
                    IngestResult(
                        run_id,
                        str(path),
                        kineto.FORMAT,
                        staged.bytes_read,
                        counts["events_read"],
                        ingested,
                        counts["events_skipped"],
                        counts["skipped_reasons"],
                        seconds,
                        run["rank"],
                    )
                )
            except InputError:
                if pending is not None:
                    pending.cancel()
                raise
            finally:
                staged.cleanup()
    return results


def raw_size(path: Path) -> int:
    """Uncompressed size of a trace: a gzip member's trailer holds it (mod 4 GiB)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return size
            f.seek(-4, 2)
            isize = int.from_bytes(f.read(4), "little")
        return isize if isize >= size else isize + (1 << 32)
    except OSError:
        return 0  # a missing file is reported by staging, with its name


def _insert_run(con, run_id: int, run: dict) -> None:
    start, end = con.execute(
        "SELECT min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM event_rows "
        "WHERE run_id = ? AND kind NOT IN ('metadata', 'profiler_span')",
        [run_id],
    ).fetchone()
    con.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            run_id,
            run["source"],
            run["format"],
            run["label"],
            run["rank"],
            run["world_size"],
            run["rank_source"],
            run["device_properties"],
            run["metadata"],
            run["base_time_ns"],
            start,
            end,
        ],
    )
