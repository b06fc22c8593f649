"""The rows every run gets whatever its format: `runs` (label, rank, window) and `ingest_log`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.db.run_set import OF_RUNS, of_runs

RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


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
    alignment: dict | None = None  # how a log joined its trace's clock (method, applied_offset_ns)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Duplicate:
    """An input not ingested because its content is there already: in `runs` of this database, or
    (`earlier`) in an input given before it in the same call."""

    source: str
    runs: list[int]
    earlier: str | None = None

    def describe(self) -> str:
        where = f"given earlier as {self.earlier}" if self.earlier else (
            f"already in this database as run{'s' if len(self.runs) > 1 else ''} {', '.join(map(str, self.runs))}"
        )  # fmt: skip
        return f"{self.source}: same content {where}; not ingested again (--replace ingests it anew)"


def default_label(path: Path) -> str:
    """The file name without its compression suffix and its format's (`rank0.pt.trace.json.gz` ->
    `rank0.pt.trace`)."""
    return Path(compression.strip_suffix(Path(path).name)).stem


def run_rank(export, rank: int | None) -> tuple[int | None, str | None]:
    """(rank, where it came from): as the source states it, else `rank<N>` in the file name, else --rank."""
    if export.rank is not None:
        return export.rank, export.rank_source
    m = RANK_IN_NAME.search(Path(export.source).name)
    if m:
        return int(m.group(1)), "file name"
    return rank, "--rank" if rank is not None else None


def _json(value, **options) -> str | None:
    return None if value is None else orjson.dumps(value, **options).decode()


def run_row(export, label: str | None, rank: int | None) -> dict:
    number, source = run_rank(export, rank)
    return {
        "source": str(export.source),
        "format": export.format,
        "label": label or default_label(export.source),
        "rank": number,
        "world_size": export.world_size,
        "rank_source": source,
        "device_properties": _json(export.device_properties),
        "metadata": _json(export.metadata, default=str),
        "base_time_ns": export.base_time_ns,
    }


def window(con, run_id: int, fmt: str) -> tuple[int | None, int | None]:
    """(first start, last end) of the run's events: the analysed window."""
    return windows(con, [run_id], fmt)[run_id]


def windows(con, run_ids: list[int], fmt: str) -> dict[int, tuple[int | None, int | None]]:
    """window() of several runs of one format, in one query."""
    found = {
        run_id: (start, end)
        for run_id, start, end in con.execute(
            "SELECT run_id, min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM event_rows "
            f"WHERE {OF_RUNS} AND kind NOT IN ('metadata', 'profiler_span') "
            # a trace's window is the profiler's: runtime events it is given may reach far beyond it
            "AND (kind <> 'runtime_event' OR $fmt = 'runtime_events') GROUP BY run_id",
            {**of_runs(run_ids), "fmt": fmt},
        ).fetchall()
    }
    return {run_id: found.get(run_id, (None, None)) for run_id in run_ids}


class Rows:
    """`runs` and `ingest_log` rows, inserted with one statement per table (a batch of small files:
    one INSERT a row cost about 0.5 ms each)."""

    def __init__(self) -> None:
        self.runs: list[list] = []
        self.log: list[list] = []

    def insert(self, con) -> None:
        _insert_values(con, "runs", self.runs)
        _insert_values(con, "ingest_log", self.log)

    def add_run(self, run_id: int, run: dict, span: tuple[int | None, int | None]) -> None:
        self.runs.append([run_id, run["source"], run["format"], run["label"], run["rank"], run["world_size"],
                          run["rank_source"], run["device_properties"], run["metadata"], run["base_time_ns"],
                          *span])  # fmt: skip

    def add_log_row(self, result: IngestResult, notes: dict) -> None:
        self.log.append([result.run_id, result.source, result.format, result.bytes_read, result.events_read,
                         result.events_ingested, result.events_skipped,
                         orjson.dumps(result.skipped_reasons).decode(), orjson.dumps(notes).decode(),
                         result.seconds])  # fmt: skip


def _insert_values(con, table: str, values: list[list]) -> None:
    if values:
        row = "(" + ", ".join("?" * len(values[0])) + ")"
        con.execute(f"INSERT INTO {table} VALUES " + ", ".join([row] * len(values)), [v for r in values for v in r])


def result(
    export,
    run_id: int,
    rank: int | None,
    seconds: float,
    alignment: dict | None = None,
    counts: int | None = None,
    moved_out: int = 0,
) -> IngestResult:
    """A file's reconciliation: every item read was ingested or skipped with a reason. For a run split
    from its file by process, `counts` is the rows moved into it (its share of what was read; no
    skips, no bytes), and the file's first run keeps the rest (`moved_out` fewer)."""
    if counts is not None:
        return IngestResult(
            run_id=run_id, source=str(export.source), format=export.format, bytes_read=0, events_read=counts,
            events_ingested=counts, events_skipped=0, skipped_reasons={}, seconds=seconds, rank=rank, alignment=alignment,
        )  # fmt: skip
    read, skipped = sum(export.read.values()) - moved_out, sum(export.skipped.values())
    size = export.bytes_read
    if size is None:  # a folder read as one input: its files' sizes
        source = Path(export.source)
        size = compression.inflated_size(source) if source.is_dir() else source.stat().st_size
    return IngestResult(
        run_id=run_id, source=str(export.source), format=export.format, bytes_read=size, events_read=read,
        events_ingested=read - skipped, events_skipped=skipped, skipped_reasons=dict(export.skipped),
        seconds=seconds, rank=rank, alignment=alignment,
    )  # fmt: skip
