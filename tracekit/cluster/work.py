"""The two map tasks of a cluster run, as plain functions: a backend calls them in a loop in this
process or ships them to Dask workers, and they know nothing of either.

Phase 1 (`ingest_chunk`) ingests a chunk's rank files into a database file of its own in the
worker's temporary folder and sends back only the chunk's `runs` rows and two small tables of its
collective calls: `collective_counts` (per run and process group) and `collective_extremes` (per
collective, its latest starts and earliest ends over the chunk's ranks). Phase 2 (`analyze_chunk`),
on the same worker, reopens that database, adds every chunk's two tables as `peer_collective_counts`
and `peer_collective_extremes` (so C001 matches each rank against the whole job, from rows that
grow with the chunks, not the ranks), runs the per-rank ("run" scope) rules through the Python API,
exactly as `Trace.analysis` does, and sends back finding records, notes and the per-rank summary
tables; then the database is deleted. Events never leave the worker.

Ids: the chunk database's `run_ids` sequence starts at the chunk's global position + 1, so its runs
get the ids one database of every input would give them; when they do not (a file made several
runs, or one failed), the reducer hands phase 2 a renumbering, applied to every table before the
rules run. Event ids are row numbers of `event_rows`, unique per database: a chunk's are those of
one database of every input minus the events of the chunks before it (`event_base`), added back to
every event id of what phase 2 sends (evidence parameters, samples, details keyed `*event_id`).
"""

from __future__ import annotations

import os
import resource
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.cluster.plan import Chunk
from tracekit.errors import TracekitError, one_line

# The summary tables phase 2 sends to the reducer (tracekit/db/views/72_ranks.sql, and a profiler's
# own cluster summary: 74_cluster.sql), besides `runs`.
SUMMARIES = ("rank_collectives", "rank_steps", "rank_op_times", "rank_op_inputs", "cluster_step_components")


@dataclass(frozen=True)
class EventShift:
    """A chunk's event ids -> one database's: plus the events of the chunks before it (`base`),
    less those of its own runs dropped before them (`gaps`: (first local id, count) per run whose
    trace an earlier chunk holds)."""

    base: int = 0
    gaps: tuple[tuple[int, int], ...] = ()

    def __call__(self, event_id: int) -> int:
        return event_id + self.base - sum(n for first, n in self.gaps if first + n <= event_id)

    def sql(self, column: str) -> str:
        """The same as a SQL expression over `column`."""
        gaps = "".join(f" - CASE WHEN {column} >= {int(f) + int(n)} THEN {int(n)} ELSE 0 END" for f, n in self.gaps)
        return f"{column} + {int(self.base)}{gaps}"


@dataclass
class Peers:
    """What a chunk tells the others of its ranks' collective calls: rows of `collective_counts` and
    of `collective_extremes` (tracekit/db/views/72_ranks.sql), pyarrow Tables. Per chunk these are
    its own; what phase 2 is sent is every chunk's, concatenated. They grow with the runs and with
    the chunks times the collectives, never with the ranks times the collectives."""

    counts: object
    extremes: object


@dataclass
class Ingested:
    """What phase 1 sends back: small rows only, and where the chunk's database stays."""

    chunk: Chunk
    db_path: str
    runs: object  # pyarrow.Table of the chunk's `runs` rows
    peers: Peers  # its collective counts and extremes, what the other chunks are sent of it
    events: int  # rows of its `event_rows`: how far the next chunk's event ids are shifted
    failed: list[dict] = field(default_factory=list)  # {"path", "error"} per input that could not be read
    # run id -> (content digest, source) of its trace: a trace given twice is analysed once
    digests: dict = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)  # Duplicate.describe() of inputs skipped in the chunk
    run_events: dict = field(default_factory=dict)  # run id -> (its first event id, its events)
    host: str = ""
    pid: int = 0
    worker: str | None = None  # the Dask worker's address (set by the backend), None in this process
    peak_rss_mb: float = 0.0
    seconds: float = 0.0


@dataclass
class Analyzed:
    """What phase 2 sends back: findings, notes and the summaries, with job-wide run and event ids."""

    chunk: Chunk
    records: list[dict]  # finding records (Trace.finding_records), ranked within the chunk
    notes: list[dict]  # data-quality notes (DataQuality.as_dict), in the order the rules gave them
    missing: dict  # rule code -> its required relations this chunk lacks ("kernels (no rows)")
    tables: dict  # "runs" and each of SUMMARIES -> pyarrow.Table
    report_runs: list[dict]  # the report's `runs` section of these runs
    summary: dict  # Trace.summary() of these runs
    worker: str | None = None
    host: str = ""
    pid: int = 0
    peak_rss_mb: float = 0.0
    seconds: float = 0.0


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20) if os.uname().sysname == "Darwin" else peak / 1024, 1)


def chunk_database(chunk: Chunk, folder: str | None = None) -> Path:
    """A fresh database path in the worker's temporary folder, named by tracekit.tempfiles so that
    what a killed worker leaves is swept by the next ingest on that machine."""
    from tracekit import tempfiles

    folder = folder or tempfile.gettempdir()
    return Path(folder) / f"{tempfiles.prefix()}chunk{chunk.index}-{uuid.uuid4().hex[:8]}.duckdb"


def ingest_chunk(chunk: Chunk, rank: int | None = None, metrics: tuple = (), folder: str | None = None) -> Ingested:
    """Phase 1: the chunk's files into a database file of its own; a file that cannot be read is
    named in `failed` and the others are ingested."""
    from tracekit import api

    started = time.perf_counter()
    path = chunk_database(chunk, folder)
    trace = api.open(db=path)  # a new file: a copy of the cached schema template (tracekit.db.schema_template)
    try:
        con = trace.connection
        # the ids a database of every input gives: the chunk's first input is run first + 1
        con.execute("DROP SEQUENCE IF EXISTS run_ids")
        con.execute(f"CREATE SEQUENCE run_ids START {int(chunk.first) + 1}")
        failed = []

        def fails(path, e: Exception) -> None:  # a reader's bug on one rank must not end the job either
            error = str(e) if isinstance(e, TracekitError) else one_line(e)
            failed.append({"path": str(path), "error": error})

        # one call, so that the next rank file is read (inflated) while one loads; a copy of a trace
        # of the chunk is skipped
        added = trace.add(*chunk.paths, rank=rank, metrics=metrics, on_error=fails)
        duplicates = [d.describe() for d in added.duplicates]
        order = {p: i for i, p in enumerate(chunk.paths)}
        failed.sort(key=lambda f: order.get(f["path"], len(order)))  # in input order, as one add per file gave
        runs = table(con, "SELECT * FROM runs ORDER BY run_id")
        # both views read `rank_collectives`: computed once, into a temporary table of that name,
        # which DuckDB resolves before the view (on this connection only, so read on it)
        con.execute("CREATE TEMP TABLE rank_collectives AS SELECT * FROM main.rank_collectives")
        peers = Peers(
            counts=arrow(con.sql("SELECT * FROM collective_counts ORDER BY run_id, process_group")),
            extremes=arrow(con.sql("SELECT * FROM collective_extremes ORDER BY world_size, process_group, n")),
        )
        con.execute("DROP TABLE temp.rank_collectives")
        events = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
        run_events = {
            r: (int(first), int(n))
            for r, first, n in con.execute(
                "SELECT run_id, min(rowid), count(*) FROM event_rows GROUP BY run_id ORDER BY run_id"
            ).fetchall()
        }
        digests = {
            run_id: (digest, source)
            for run_id, digest, source in con.execute(
                "SELECT l.run_id, json_extract_string(l.notes, '$.content_digest'), l.source FROM ingest_log l "
                "JOIN runs r ON r.run_id = l.run_id AND r.source = l.source ORDER BY l.run_id"
            ).fetchall()
            if digest
        }
    except BaseException:
        trace.close()
        remove_database(path)
        raise
    trace.close()
    return Ingested(chunk, str(path), runs, peers, int(events), failed, digests, duplicates, run_events,
                    socket.gethostname(), os.getpid(), peak_rss_mb=peak_rss_mb(),
                    seconds=time.perf_counter() - started)  # fmt: skip


def analyze_chunk(
    ingested: Ingested,
    peers: Peers | None,
    remap: dict[int, int],
    event_base: EventShift | int,
    rules=None,
    params=None,
    summaries: bool = True,
) -> Analyzed:
    """Phase 2: on the worker that holds the chunk's database. `peers`: every chunk's collective
    counts (job-wide run ids) and extremes, this chunk's own included (`reduce.number`); `remap`:
    the chunk's run ids as ingested -> job-wide ones; `event_base`: its event ids -> job-wide
    ones (an EventShift, or the events of the chunks before it); `summaries`: whether the reducer runs a job rule, which reads the summary tables' rows (the
    reducer decides: its rules are the ones that run). The database is deleted once its results
    are out."""
    from tracekit import api
    from tracekit.engine.registry import all_rules, get_rule
    from tracekit.engine.runner import missing_inputs
    from tracekit.engine.shared_views import computed_once
    from tracekit.findings.report import runs_section

    started = time.perf_counter()
    shift = event_base if isinstance(event_base, EventShift) else EventShift(int(event_base))
    path = Path(ingested.db_path)
    try:
        trace = api.open(db=path)
        try:
            con = trace.connection
            renumber(con, {int(k): None if v is None else int(v) for k, v in remap.items()})
            _insert_peers(con, peers)
            trace = trace.select()
            select = [get_rule(k) for k in _rule_keys(rules)] or all_rules()
            cut = "" if summaries else " LIMIT 0"  # no job rule will read their rows: their columns
            # the views most rules and the summaries read, computed once for both (the analysis
            # reuses these tables: see engine.shared_views)
            with computed_once(con, ranks=summaries or None) as shared:
                analysis = trace.analysis(rules, params, scope="run")
                # through a cursor that reads the tables computed once: a plain cursor would see only
                # the views, and compute the per-rank summaries again (0.9 s of a 32-rank chunk's 1.6)
                tables = {"runs": table(con, "SELECT * FROM runs ORDER BY run_id", shared=shared)}
                for name in SUMMARIES:
                    columns = f"* REPLACE ({shift.sql('event_id')} AS event_id)" if name == "rank_collectives" else "*"
                    tables[name] = table(con, f"SELECT {columns} FROM {name} ORDER BY ALL{cut}", shared=shared)
            records = [shift_event_ids(f.as_dict(), shift) for f in analysis.findings]
            notes = [n.as_dict() for n in analysis.notes]
            missing = {r.code: missing_inputs(con, r) for r in select if r.scope == "run"}
            report_runs = runs_section(con)
            summary = trace.summary()
        finally:
            trace.close()
    finally:
        remove_database(path)
    return Analyzed(ingested.chunk, records, notes, missing, tables, report_runs, summary,
                    host=socket.gethostname(), pid=os.getpid(), peak_rss_mb=peak_rss_mb(),
                    seconds=time.perf_counter() - started)  # fmt: skip


def renumber(con, remap: dict[int, int | None]) -> None:
    """Give the runs of this database new ids in every table that holds rows of a run (the
    reducer's job-wide numbering, when a file made several runs or one failed); a run mapped to
    None is deleted (its trace is held by an earlier chunk)."""
    from tracekit.db.connection import run_tables
    from tracekit.ingest.transaction import delete_runs

    dropped = sorted(old for old, new in remap.items() if new is None)
    if dropped:  # a trace an earlier chunk holds: one database would not have ingested it again
        delete_runs(con, dropped)
    moves = {old: new for old, new in remap.items() if new is not None and old != new}
    if not moves:
        return
    case = "CASE run_id " + " ".join(f"WHEN {int(o)} THEN {int(n)}" for o, n in moves.items()) + " ELSE run_id END"
    ids = sorted(moves)
    for table in run_tables(con):
        if table == "runs":  # its primary key: rows out and back in, not updated in place
            con.execute(f"CREATE TEMP TABLE tk_moved_runs AS SELECT * REPLACE ({case} AS run_id) FROM runs "
                        "WHERE list_contains(?, run_id)", [ids])  # fmt: skip
            con.execute("DELETE FROM runs WHERE list_contains(?, run_id)", [ids])
            con.execute("INSERT INTO runs SELECT * FROM tk_moved_runs")
            con.execute("DROP TABLE tk_moved_runs")
        else:
            con.execute(f'UPDATE "{table}" SET run_id = {case} WHERE list_contains(?, run_id)', [ids])


def _insert_peers(con, peers: Peers | None) -> None:
    """Every chunk's collective counts and extremes into `peer_collective_counts` and
    `peer_collective_extremes`, which `collective_counts` and `collective_extremes` then read."""
    if peers is None:
        return
    from tracekit.db.connection import cursor

    cur = cursor(con)
    try:
        for name, rows in (("peer_collective_counts", peers.counts), ("peer_collective_extremes", peers.extremes)):
            if rows is None or rows.num_rows == 0:
                continue
            columns = [d[0] for d in cur.execute(f"SELECT * FROM {name} LIMIT 0").description]
            names = ", ".join(f'"{c}"' for c in columns)
            cur.register("tk_peer_rows", rows)
            cur.execute(f"INSERT INTO {name} ({names}) SELECT {names} FROM tk_peer_rows")
            cur.unregister("tk_peer_rows")
    finally:
        cur.close()


def shift_event_ids(record, shift: EventShift):
    """The record with every event id put through `shift`: `sample_event_ids`, and any value keyed
    `event_id`, `*_event_id` or `*_event_ids` at any depth (evidence parameters and details)."""
    if shift == EventShift():
        return record
    if isinstance(record, dict):
        return {k: _shifted(k, v, shift) for k, v in record.items()}
    if isinstance(record, list):
        return [shift_event_ids(v, shift) for v in record]
    return record


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shifted(key: str, value, shift: EventShift):
    if key.endswith("event_id") and _is_id(value):
        return shift(value)
    if key.endswith("event_ids") and isinstance(value, list):
        return [shift(v) if _is_id(v) else v for v in value]
    return shift_event_ids(value, shift)


def _rule_keys(rules) -> list[str]:
    keys = [k.strip() for k in rules.split(",")] if isinstance(rules, str) else list(rules or [])
    return [k for k in keys if k]


def table(con, query: str, params=None, shared=None):
    """A query's rows as one pyarrow.Table, fetched whole (the connection is free afterwards);
    `shared`: the computed_once handle whose tables the query reads (engine.shared_views)."""
    from tracekit.db.connection import cursor

    cur = shared.cursor() if shared is not None else cursor(con)
    try:
        return arrow(cur.sql(query, params=params))
    finally:
        cur.close()


def arrow(relation):
    """A DuckDB relation's rows as one pyarrow.Table."""
    fetch = getattr(relation, "to_arrow_table", None) or relation.arrow  # DuckDB 2.x / 1.x (a Table there)
    return fetch()


def remove_database(path: Path) -> None:
    for leftover in (Path(path), Path(f"{path}.wal")):
        leftover.unlink(missing_ok=True)
