"""Ingest inputs into a database: recognise each once, group them into runs, load each run's rows, then
derive what every format shares. The next input that reads ahead is read while this one loads."""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tracekit import compression, tempfiles
from tracekit import db as dbmod
from tracekit.db import pending
from tracekit.errors import TracekitError, crash_line, one_line, out_of_space
from tracekit.ingest import kill_points, processes, runs
from tracekit.ingest.digest import content_digest
from tracekit.ingest.entities import fill_entities
from tracekit.ingest.inputs import Input, classify, classify_all, expand
from tracekit.ingest.native import export_native, is_native
from tracekit.ingest.nesting import compute_nesting
from tracekit.ingest.offsets import measure
from tracekit.ingest.runs import Duplicate, IngestResult
from tracekit.ingest.transaction import delete_rows, run_or_nothing, transaction
from tracekit.parsers import rows

__all__ = ["IngestResult", "ingest", "plan"]


def plan(paths: list[Path], metrics: tuple[str, ...] = (), readers: list | None = None) -> list[tuple[int, list[int]]]:
    """Group the inputs of one call into runs: (index of the run's first file, indexes of the logs that join it).

    Logs are the inputs whose reader is ATTACHABLE (runtime-event logs, server logs, OTLP spans); they
    join traces whose reader TAKES_LOGS. A log joins the run of the nearest trace before it in the
    call; a log that comes before every trace joins the only trace of the call when there is exactly
    one; otherwise it is a run of its own. So `analyze trace.json.gz events.jsonl server.log`,
    `analyze events.jsonl trace.json.gz` and `ingest r0.json.gz r0.jsonl r1.json.gz r1.jsonl` all do
    what they say.
    """
    readers = readers if readers is not None else [classify(Path(p), metrics=metrics) for p in paths]
    is_log = [getattr(r, "ATTACHABLE", False) for r in readers]
    takes_logs = [getattr(r, "TAKES_LOGS", False) for r in readers]
    hosts = [i for i, r in enumerate(readers) if takes_logs[i]]
    units: list[tuple[int, list[int]]] = []
    leading: list[int] = []
    for i, log in enumerate(is_log):
        if not log:
            units.append((i, []))
        elif units and takes_logs[units[-1][0]]:
            units[-1][1].append(i)
        elif len(hosts) == 1:
            leading.append(i)
        else:
            units.append((i, []))  # no trace to join: a run of its own
    if leading:
        next(logs for first, logs in units if first == hosts[0])[:0] = leading
    return units


def ingest(
    con,
    paths: list[str | Path],
    rank: int | None = None,
    labels: list[str] | None = None,
    tmpdir: str | None = None,
    progress: Callable[[str], None] | None = None,
    align: bool = True,
    metrics: tuple[str, ...] = (),
    offsets: dict | None = None,
    same_content: str = "skip",
    duplicates: list | None = None,
    after_run: Callable[[list[IngestResult]], None] | None = None,
    on_error: Callable[[Path, Exception], None] | None = None,
) -> list[IngestResult]:
    """Ingest files and folders (see inputs.expand) in order, the logs that join a trace with it (see
    plan); one IngestResult per file.

    `same_content`, for a trace whose content this database already holds (`content_digest` in its
    ingest_log notes) or that an earlier input of the call has: `skip` it (a runs.Duplicate goes into
    `duplicates`), `replace` the runs holding it (deleted once the new run is in), or `keep` both
    (the two sides of a diff in one database).

    `align`: shift a log attached to a trace onto the trace's clock by the offset measured on the
    events both share (runtime-event logs) or on their windows (server logs); `offsets` (path -> ns)
    overrides that for the files it names and shifts any other input as a whole.

    `after_run`: called with the IngestResults of each run (of a file split by process: its runs)
    once they are committed, before the next input loads (tracekit.ingest.lake moves them out).

    `on_error`: when given, an input that cannot be read or loaded is handed to it with its error
    (its run rolled back) and the next input goes on, still read ahead while one loads (a cluster
    worker ingests its chunk in one call this way: one bad rank must not end the chunk); without
    it the first such input ends the call.

    Consecutive small traces whose reader can (`load_batch`, `batchable`: Kineto/Chrome JSON up to
    8 MiB) load in batches of up to BATCH_FILES files or BATCH_BYTES: one transaction and a few
    statements for the batch, each file still its own run with its own rows (see _Batch).
    """
    tempfiles.sweep(tmpdir)  # what killed ingests staged
    # asked now: a write that finds the disk full invalidates the connection
    database = pending.database_file(con)
    try:
        return _ingest(con, [Path(p) for p in paths], rank, labels, tmpdir, progress, align, metrics, offsets,
                       same_content, duplicates, after_run, on_error)  # fmt: skip
    except Exception as e:
        temporary = tmpdir or tempfile.gettempdir()
        full = out_of_space(e, temporary, _room_needed(paths, temporary, database))
        if full is None:
            raise
        raise full from None


# The database files of the corpus traces are 0.12-0.27 of their inflated JSON (with findings)
DATABASE_BYTES_PER_INPUT_BYTE = 0.3


def _room_needed(paths, temporary: str, database: str | None) -> dict[str, int]:
    """What an ingest of `paths` writes: a staged copy of the largest input in the temporary folder,
    and about DATABASE_BYTES_PER_INPUT_BYTE of all of them into the database file."""
    sizes = [compression.inflated_size(Path(p)) for p in paths if Path(p).exists()]
    if not sizes:
        return {}
    needs = {temporary: max(sizes)}
    if database:
        needs[database] = int(sum(sizes) * DATABASE_BYTES_PER_INPUT_BYTE)
    return needs


@compression.keep_whole()  # a small compressed input is inflated once: to be recognised, and read from that
def _ingest(
    con,
    paths,
    rank,
    labels,
    tmpdir,
    progress,
    align,
    metrics,
    offsets,
    same_content,
    duplicates,
    after_run=None,
    on_error=None,
):
    offsets = {Path(k): v for k, v in (offsets or {}).items()}
    exported: dict[Path, Path] = {}  # export -> the native report it came from
    # the user's path of an input exported from a vendor's native report, not the export's
    failed = None if on_error is None else (lambda path, e: on_error(exported.get(path, path), e))
    # One thread beside this one recognises files, then reads ahead. On one DuckDB thread a statement
    # runs on this thread and takes the GIL back often; a read ahead holding it (a reader's sampling)
    # would stall the load many times over: there, every file is recognised and read in turn.
    beside = con.execute("SELECT current_setting('threads')").fetchone()[0] > 1
    pool = ThreadPoolExecutor(max_workers=1) if beside else None
    try:
        options = {"metrics": tuple(metrics), "tmpdir": tmpdir}
        files = [Path(p) for p in paths if not Path(p).is_dir() and not is_native(p)]
        known = classify_all(files, pool, **options)
        inputs = []
        for p in paths:
            try:
                if is_native(p):
                    export = export_native(p, tmpdir)  # the vendor tool reads its own format; tracekit the export
                    exported[export] = p
                    offsets.setdefault(export, offsets.get(p, 0))
                    p = export
                inputs += expand([p], known, **options)
            except Exception as e:
                if failed is None:
                    raise
                failed(p, e)
        done: list[IngestResult] = []
        try:
            _ingest_all(
                con,
                pool,
                inputs,
                options,
                rank,
                labels,
                progress,
                align,
                offsets,
                same_content,
                duplicates,
                done,
                after_run,
                failed,
            )
        except TracekitError as e:
            if not done:
                raise
            kept = ", ".join(f"{Path(r.source).name} as run {r.run_id}" for r in done)
            raise TracekitError(f"{e} (the inputs before it were ingested and kept: {kept})") from None
        results = done
    finally:
        if pool is not None:
            pool.shutdown()
        for export in exported:
            shutil.rmtree(export.parent, ignore_errors=True)
    for export, native in exported.items():
        # the run is the report the user gave; the export was a means
        for table in ("runs", "ingest_log"):
            con.execute(f"UPDATE {table} SET source = ? WHERE source = ?", [str(native), str(export)])
        for r in results:
            if r.source == str(export):
                r.source = str(native)
    return results


@dataclass
class Part:
    """One file of a run, read and waiting to be loaded."""

    input: Input
    export: rows.Export
    read_seconds: float

    @property
    def reader(self):
        return self.input.reader


def _ingest_all(
    con, pool, inputs: list[Input], options: dict, rank, labels, progress, align, offsets, same_content, duplicates, results,
    after_run=None, on_error=None,
) -> None:  # fmt: skip
    dbmod.bound_memory(con, dbmod.current_memory_hint(con) + sum(compression.inflated_size(i.path) for i in inputs))
    units = plan([i.path for i in inputs], readers=[i.reader for i in inputs])
    units, replaced = _without_duplicates(con, inputs, units, same_content, duplicates)
    # rows written without the run id sequence are looked for once per call (tracekit.db.pending)
    ids = _RunIds(pending.database_file(con))
    reads = _Reads(pool, inputs, [first for first, _ in units], options, progress)
    batch = _Batch(con, ids, results, after_run, on_error, rank)
    try:
        for unit, (first, log_indexes) in enumerate(units):
            label = labels[unit] if labels and unit < len(labels) else None  # one label per run
            may_batch = _may_batch(inputs[first], log_indexes, offsets, replaced.get(first))
            if not may_batch:
                batch.flush()  # the files before this one go in first, as they would one by one
            parts: list[Part] = []
            try:
                # logs are read first, so that one that cannot be read stops the run before any of it is loaded
                parts += [reads.get(i) for i in log_indexes]
                started = time.perf_counter()  # the logs' own time is theirs
                parts.append(reads.get(first))
            except Exception as e:
                _cleanup(*parts)
                if on_error is None:
                    batch.flush()
                    raise
                on_error(inputs[first].path, e)
                continue
            if may_batch and parts[-1].export.batch is not None:
                batch.add(parts[-1], label, started)
                continue
            batch.flush()
            _one_run(con, parts, started, rank, label, align, offsets, replaced.get(first, []), ids, results,
                     after_run, on_error)  # fmt: skip
        batch.flush()
    except BaseException:
        batch.discard()
        reads.discard()
        raise


def _one_run(con, parts: list, started, rank, label, align, offsets, replaces, ids, results, after_run,
             on_error) -> None:  # fmt: skip
    """One run from its parts (the trace last, its logs before it), read and not yet loaded."""
    try:
        run_results = _ingest_run(con, parts[-1], parts[:-1], rank, label, started, align, offsets, replaces, ids)
    except Exception as e:
        if on_error is None:
            raise
        on_error(parts[-1].input.path, e)
        return
    finally:
        _cleanup(*parts)
    results += run_results
    if after_run is not None:
        after_run(run_results)


def _may_batch(item: Input, log_indexes: list[int], offsets: dict, replaces) -> bool:
    """Whether this unit's trace may load in a batch with others (its reader decides, once read, by
    setting export.batch): a file alone in its run, shifted by nothing, replacing nothing, whose reader
    derives nothing of its own and splits no file by process."""
    reader = item.reader
    return (
        hasattr(reader, "load_batch")
        and hasattr(reader, "batchable")
        and not log_indexes
        and not offsets.get(item.path, 0)
        and not replaces
        and not hasattr(reader, "derive")
        and not getattr(reader, "RANKS_BY_PROCESS", False)
    )


# A batch loads together up to this many files or inflated bytes: the fixed cost of a batch's dozen
# statements is then spread thin, and its one read-and-insert statement parses no more than this.
BATCH_FILES = 128
BATCH_BYTES = 64 << 20


class _Batch:
    """Consecutive small traces of one reader waiting to load in one statement (reader.load_batch), each
    still its own run with its own ingest_log row; a batch the reader cannot load together is rolled
    back and its files load one by one, as they would have anyway."""

    def __init__(self, con, ids, results: list, after_run, on_error, rank) -> None:
        self.con, self.ids, self.results, self.after_run, self.on_error, self.rank = (
            con, ids, results, after_run, on_error, rank,
        )  # fmt: skip
        self.items: list[tuple[Part, str | None, float]] = []

    def add(self, part: Part, label: str | None, started: float) -> None:
        if self.items and (
            part.reader is not self.items[0][0].reader
            or part.export.batch_key != self.items[0][0].export.batch_key
            or len(self.items) >= BATCH_FILES
            or self._bytes() + (part.export.bytes_read or 0) > BATCH_BYTES
        ):
            self.flush()
        self.items.append((part, label, started))

    def _bytes(self) -> int:
        return sum(part.export.bytes_read or 0 for part, _, _ in self.items)

    def flush(self) -> None:
        items, self.items = self.items, []
        if not items:
            return
        try:
            flags = items[0][0].reader.batchable(self.con, [part.export for part, _, _ in items])
        except Exception as e:  # the reader's look failed: each file's own load says why, if it fails too
            _loaded_alone(items, e)
            flags = [False] * len(items)
        # consecutive files that may load together do; the others alone, in input order
        done = 0
        try:
            for together, group in itertools.groupby(zip(items, flags), key=lambda pair: pair[1]):
                group = [item for item, _ in group]
                self._load(group, together)
                done += len(group)
        except BaseException:
            _cleanup(*(part for part, _, _ in items[done + 1 :]))  # what _load did not reach
            raise

    def _load(self, items: list, together: bool) -> None:
        if together and len(items) > 1:
            try:
                out = _ingest_batch(self.con, items, self.rank, self.ids)
            except Exception as e:
                # rolled back (the reader's Unbatched, a full disk, a reader's bug): each file alone says
                # what it needs or which file failed, and with on_error the others still go in; each
                # says why it loaded alone, so that a bug is seen, not only the time it costs
                _loaded_alone(items, e)
                out = None
            if out is not None:
                _cleanup(*(part for part, _, _ in items))
                for run_results in out:
                    self.results += run_results
                    if self.after_run is not None:
                        self.after_run(run_results)
                return
        for k, (part, label, started) in enumerate(items):
            try:
                _one_run(self.con, [part], started, self.rank, label, True, {}, [], self.ids, self.results,
                         self.after_run, self.on_error)  # fmt: skip
            except BaseException:
                _cleanup(*(later for later, _, _ in items[k + 1 :]))
                raise

    def discard(self) -> None:
        _cleanup(*(part for part, _, _ in self.items))
        self.items = []


def _loaded_alone(items: list, e: Exception) -> None:
    """Each file's ingest_log note of why it loaded alone though it was to load in a batch: the
    reader's reason (rows.Unbatched), else the failure, which is a bug, with where it was raised."""
    why = one_line(e, typed=False) if isinstance(e, rows.Unbatched) else crash_line(e)
    for part, _, _ in items:
        part.input.notes["loaded_alone_after_batch"] = why


def _ingest_batch(con, items: list, rank, ids: _RunIds) -> list[list[IngestResult]]:
    """The runs of a batch, as _ingest_run makes one: rows in one transaction, what is derived from them
    in a second, none of it left behind on failure (then the caller loads each file alone)."""
    kill_points.reached("read")
    parts = [part for part, _, _ in items]
    run_ids: list[int] = []
    try:
        run_ids += ids.begin(con, [str(part.export.source) for part in parts])
        with run_or_nothing(con, run_ids):
            with transaction(con):
                parts[0].reader.load_batch(con, [(part.export, run_id) for part, run_id in zip(parts, run_ids)])
                kill_points.reached("rows")
            kill_points.reached("rows_committed")
            with transaction(con):
                fill_entities(con, run_ids)
                compute_nesting(con, run_ids)
                spans = runs.windows(con, run_ids, parts[0].export.format)
                seconds = time.perf_counter() - min(started for _, _, started in items)
                total = sum(part.export.bytes_read or 0 for part in parts) or 1
                out, rows = [], runs.Rows()
                for (part, label, _), run_id in zip(items, run_ids):
                    share = seconds * (part.export.bytes_read or 0) / total  # the batch's time, by size
                    out.append(_record(con, run_id, part, [], spans[run_id], rank, label, share, rows=rows))
                rows.insert(con)
                pending.finish(con, run_ids)
                kill_points.reached("derived")
        kill_points.reached("committed")
        return out
    except BaseException:
        if run_ids:
            try:  # its files load again, alone, under the same run ids: not left pending meanwhile
                with transaction(con):
                    pending.finish(con, run_ids)
                ids.unused = run_ids
            except Exception:
                pass  # the next open removes them (tracekit.db.pending)
        raise
    finally:
        pending.forget(con, run_ids)


def _without_duplicates(con, inputs: list[Input], units: list, same_content: str, duplicates: list | None):
    """The units to ingest (each trace's digest noted for its ingest_log row: see ingest), and with
    `replace`, for each unit index the runs its new run replaces."""
    if same_content not in ("skip", "replace", "keep"):
        raise ValueError(f"same_content: skip, replace or keep, not {same_content!r}")
    kept, replaced, seen = [], {}, {}
    for first, _ in units:
        if inputs[first].path.exists():
            inputs[first].notes["content_digest"] = content_digest(inputs[first].path)
    digests = [inputs[first].notes["content_digest"] for first, _ in units if "content_digest" in inputs[first].notes]
    holders = {}  # digest -> the runs holding it, one look for every input of the call
    if digests and same_content != "keep":
        holders = dict(
            con.execute(
                "SELECT json_extract_string(notes, '$.content_digest') AS digest, list(DISTINCT run_id ORDER BY run_id) "
                "FROM ingest_log WHERE list_contains($digests, json_extract_string(notes, '$.content_digest')) "
                "GROUP BY digest",
                {"digests": digests},
            ).fetchall()
        )
    for first, log_indexes in units:
        item = inputs[first]
        if "content_digest" not in item.notes:  # a missing file: its read says so
            kept.append((first, log_indexes))
            continue
        digest = item.notes["content_digest"]
        if same_content == "keep":
            kept.append((first, log_indexes))
            continue
        replace = same_content == "replace"
        held = holders.get(digest, [])
        found = None
        if digest in seen and not replace:
            found = Duplicate(str(item.path), [], str(seen[digest]))
        elif held and not replace:
            found = Duplicate(str(item.path), held, None)
        if found is not None:
            if duplicates is not None:
                duplicates.append(found)
            continue
        seen.setdefault(digest, item.path)
        if held:
            replaced[first] = held
        kept.append((first, log_indexes))
    return kept, replaced


class _Reads:
    """Inputs read in turn; the next one whose reader has READ_AHEAD is read on the pool's thread while the
    current one loads (its reader releases the GIL: file copies, zlib). Where this thread would only
    wait for it (small files, gathered into a batch one after another), it reads the small one after
    it meanwhile."""

    def __init__(self, pool, inputs: list[Input], firsts: list[int], options: dict, progress) -> None:
        self.pool, self.inputs, self.options, self.progress = pool, inputs, options, progress
        self.ahead = [i for i in firsts if pool is not None and getattr(inputs[i].reader, "READ_AHEAD", False)]
        self.position = {i: k for k, i in enumerate(self.ahead)}  # not ahead.index: a call of thousands of files
        self.pending: dict = {}
        self.here: dict[int, tuple[Part | None, BaseException | None]] = {}  # read by this thread, not yet taken
        self._submit(0)

    def _submit(self, k: int) -> None:
        while k < len(self.ahead) and self.ahead[k] in self.here:
            k += 1
        if k < len(self.ahead) and self.ahead[k] not in self.pending:
            self.pending[self.ahead[k]] = self.pool.submit(_read, self.inputs[self.ahead[k]], self.options)

    def get(self, i: int) -> Part:
        if self.progress:
            self.progress(f"loading {self.inputs[i].path.name}")
        if i in self.here:
            part, error = self.here.pop(i)
            self._submit(self.position[i] + 1)
            if error is not None:
                raise error
            return part
        if i not in self.pending:
            return _read(self.inputs[i], self.options)
        future = self.pending.pop(i)
        if not future.done():
            self._read_next_here(self.position[i] + 1)
        self._submit(self.position[i] + 1)
        return future.result()

    def _read_next_here(self, k: int) -> None:
        """Read the input after the one the pool is reading, if it is small, on this thread."""
        if k >= len(self.ahead) or self.ahead[k] in self.pending or self.ahead[k] in self.here:
            return
        item = self.inputs[self.ahead[k]]
        if compression.inflated_size(item.path) > READ_HERE_BYTES:
            return
        try:
            self.here[self.ahead[k]] = (_read(item, self.options), None)
        except Exception as e:  # raised when its turn comes, as a read then would have raised it
            self.here[self.ahead[k]] = (None, e)

    def discard(self) -> None:
        """Remove the temporary files of inputs read ahead whose turn will not come."""
        for part, _ in self.here.values():
            if part is not None:
                _cleanup(part)
        self.here.clear()
        for future in self.pending.values():
            if future.cancel():
                continue
            try:
                _cleanup(future.result())
            except Exception:  # its own error does not matter once another file failed
                pass


# An input up to this size (inflated) is read on the loading thread while the read-ahead thread reads
# the one before it: a batch's files are only gathered, so that thread would otherwise wait (64 ranks
# of 0.9 MB: 52 ms after recognition, all of it waiting)
READ_HERE_BYTES = 8 << 20


def _read(item: Input, options: dict) -> Part:
    started = time.perf_counter()
    export = item.reader.read(item.path, **options)
    export.format = export.format or item.reader.FORMAT
    return Part(item, export, time.perf_counter() - started)


@dataclass
class _RunIds:
    """How one ingest call takes its run ids: the database's path, and the largest run id in it once
    known (the tables are read for it before the first run only: see pending.take_run_ids)."""

    database: str
    floor: int | None = None
    # the ids of the run begun last: the list itself, to which a file split by process (an Nsight
    # Systems export of several ranks) adds the ids of its other runs
    last: list[int] = field(default_factory=list)

    # ids a batch took and gave back when it was rolled back: its files take them again, in order
    unused: list[int] = field(default_factory=list)

    def begin(self, con, source: str | list[str]) -> list[int]:
        """The run ids of one file's run (more when it splits by process), or of each file of a
        list (a batch), in one statement when none is to be taken again."""
        if isinstance(source, list) and self.unused:
            return [run_id for one in source for run_id in self.begin(con, one)]
        if self.floor is not None and self.last:
            self.floor = max(self.floor, *self.last)
        reuse = [self.unused.pop(0)] if self.unused else None
        run_ids = pending.begin(con, source, floor=self.floor, database=self.database, reuse=reuse)
        if self.floor is None:
            self.floor = max(run_ids)
        self.last = run_ids
        return run_ids


def _ingest_run(
    con, main: Part, logs: list[Part], rank, label, started, align, offsets, replaces: list[int], ids: _RunIds
) -> list[IngestResult]:
    """One run: its files' rows in one transaction, then what is derived from them in another (see
    transaction.py), which also deletes the runs it `replaces` (`--replace`); a failure anywhere leaves
    none of it behind, and a kill leaves an `ingest_pending` row by which the next open removes the rest
    (tracekit.db.pending)."""
    kill_points.reached("read")
    run_ids = ids.begin(con, str(main.export.source))
    try:
        with run_or_nothing(con, run_ids):
            offset = offsets.get(main.input.path, 0)
            while True:
                try:
                    with transaction(con):
                        span, attached = _load(con, run_ids[0], main, logs, offset, align, offsets)
                        kill_points.reached("rows")
                    break
                except rows.Reload:
                    continue  # the loader learnt what it needs to read the file right: again, from scratch
            kill_points.reached("rows_committed")
            if offset:
                main.export.notes["applied_offset_ns"] = offset
            with transaction(con):
                ranked = (
                    processes.rank_processes(con, run_ids[0]) if getattr(main.reader, "RANKS_BY_PROCESS", False) else []
                )
                if ranked:
                    run_ids[1:] = processes.split(con, run_ids[0], ranked)[1:]
                    out = _derive_ranks(con, run_ids, ranked, main, attached, span, label, started)
                else:
                    out = _derive(con, run_ids[0], main, attached, span, rank, label, started)
                if replaces:
                    delete_rows(con, replaces)
                pending.finish(con, run_ids[:1])
                kill_points.reached("derived")
        kill_points.reached("committed")
        return out
    finally:
        pending.forget(con, run_ids[:1])


def _load(con, run_id: int, main: Part, logs: list[Part], offset: int, align: bool, offsets: dict):
    """Insert the rows of the run's files; returns the run's window when logs joined it (the
    profiler's, measured before them: they may reach far beyond it) and (log, its notes, seconds)
    for each of them."""
    _insert(con, main.export, run_id, offset)
    if not logs:
        return None, []
    span = runs.window(con, run_id, main.export.format)
    attached = []
    for log in logs:
        log_started = time.perf_counter() - log.read_seconds
        alignment = _alignment(con, run_id, log, main, span, align, offsets.get(log.input.path))
        note = {**log.export.notes, "run": f"attached to the run of {main.export.source}", "alignment": alignment}
        _insert(con, log.export, run_id, alignment["applied_offset_ns"])
        attached.append((log, note, time.perf_counter() - log_started))
    return span, attached


def _alignment(con, run_id: int, log: Part, trace: Part, span, align: bool, explicit: int | None) -> dict:
    """How a log goes onto its trace's clock: the offset its reader measures from events both share,
    else by comparing the two windows; an explicit offset wins, and turning alignment off keeps the
    log's own clock (both still report a shared-event measurement next to them)."""
    measured = log.reader.align(con, run_id, log.export, trace.export) if hasattr(log.reader, "align") else None
    if explicit is not None:
        return {**(measured or {}), "method": "--offset", "applied_offset_ns": explicit}
    if not align:
        return {**(measured or {}), "method": "none (alignment off)", "applied_offset_ns": 0}
    return measured if measured is not None else measure(span, log.export.window())


def _insert(con, export: rows.Export, run_id: int, offset: int) -> None:
    """A file's rows and stated metrics, shifted by `offset` ns onto the run's clock."""
    rows.load(con, export, run_id, offset)
    if export.metrics:
        dbmod.insert_rows(con, "run_metrics", run_id, ("name", "value", "unit", "args"), export.metrics)


def _derive(
    con, run_id: int, main: Part, attached: list, span, rank, label, started: float, **recorded
) -> list[IngestResult]:
    """Entities, each reader's own step, nesting, then the run's rows (_record, which `recorded` goes to)."""
    fill_entities(con, run_id)
    for reader in dict.fromkeys([main.reader, *(log.reader for log, _, _ in attached)]):
        if hasattr(reader, "derive"):
            reader.derive(con, run_id)
    compute_nesting(con, run_id)
    return _record(con, run_id, main, attached, span, rank, label, time.perf_counter() - started, **recorded)


def _record(
    con,
    run_id: int,
    main: Part,
    attached: list,
    span,
    rank,
    label,
    seconds: float,
    counts: int | None = None,
    notes: dict | None = None,
    moved_out: int = 0,
    rows: runs.Rows | None = None,
) -> list[IngestResult]:
    """The runs row and one ingest_log row per file of the run (per rank of a file split by process:
    `counts` rows moved into this run, `moved_out` rows moved from it); into `rows` when given (a
    batch inserts its runs' rows together), else inserted now."""
    inserted_here = rows is None
    rows = runs.Rows() if rows is None else rows
    run = runs.run_row(main.export, label, rank)
    rows.add_run(run_id, run, span or runs.window(con, run_id, run["format"]))
    notes = {**main.export.notes, **main.input.notes, **(notes or {})}
    if getattr(main.reader, "ATTACHABLE", False):
        notes["run"] = "a run of its own (no trace in the call to join)"
    out = [runs.result(main.export, run_id, run["rank"], seconds, counts=counts, moved_out=moved_out)]
    rows.add_log_row(out[0], notes)
    for log, note, log_seconds in attached:
        out.append(runs.result(log.export, run_id, run["rank"], log_seconds, note.get("alignment")))
        rows.add_log_row(out[-1], {**note, **log.input.notes})
    if inserted_here:
        rows.insert(con)
    return out


def _derive_ranks(con, run_ids: list[int], ranked: list, main: Part, attached: list, span, label, started: float):
    """A file split into one run per rank (tracekit.ingest.processes): each run derived as a file of its
    own; the file's counts of what was read and skipped stay with the first run, which keeps the rows
    of processes without GPU work, and the others count the rows moved into them."""
    base = label or runs.default_label(main.export.source)
    moved = {run_id: processes.rows_in(con, run_id) for run_id in run_ids[1:]}
    out = []
    for index, (run_id, process) in enumerate(zip(run_ids, ranked)):
        main.export.rank, main.export.rank_source, main.export.world_size = (
            process.rank,
            process.rank_source,
            len(ranked),
        )
        notes = {"process": {"pid": process.pid, "devices": list(process.devices), "runs of the file": run_ids}}
        results = _derive(con, run_id, main, attached if index == 0 else [], span, None, f"{base}[rank {process.rank}]",
                          started, counts=None if index == 0 else moved[run_id], notes=notes,
                          moved_out=sum(moved.values()) if index == 0 else 0)  # fmt: skip
        out += results
    return out


def _cleanup(*parts: Part) -> None:
    for part in parts:
        if part.export.cleanup is not None:
            part.export.cleanup()
