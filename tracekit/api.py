"""The Python API: one pipeline from profiler output to findings, reports and diffs.

    import tracekit

    trace = tracekit.open("run.pt.trace.json.gz")           # ingest once, into an in-memory database
    trace.sql("SELECT name, sum(dur_ns) AS ns FROM kernels GROUP BY 1 ORDER BY 2 DESC").df()
    trace.findings().pl()                                     # run the rules once; a relation over `findings`

Every CLI verb, the agent tools, the MCP server, the agent loop and the docs generator go through
this module: nothing else ingests inputs or runs rules.

A `Trace` is a set of runs of one trace database. The database is one DuckDB connection, in memory
unless `db=` names a file or the input is a database file; Traces that share it (`Trace.add`,
`Trace.select`) share its connection and what was computed on it.

The rules see every run of a database at once and run once per (rules, parameters); a Trace's
findings are the rows of its runs. Rules may relate runs to each other (C001 matches the
collectives of the ranks of one job), so the runs of one database should be one job: open a
baseline and a candidate separately (`tracekit analyze --baseline` does), and `Trace.diff` /
`Trace.status` compare them in a scratch database that both are copied into, without parsing
either again. Both sides in one database (`Trace.add`, as `tracekit diff` builds it) are compared
in place.

Relations (`Trace.sql`, `Trace.findings`) are plain DuckDB relations, each on its own cursor of the
connection, so `.df()`, `.pl()` (with polars installed), `.arrow()` and `.fetchall()` can be called
in any order, with other queries in between. A relation runs its query again on every call.
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import json
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import TracekitError

# Bytes 8-11 of every DuckDB database file.
_DUCKDB_MAGIC = b"DUCK"
_SEVERITY_ORDER = "list_position(['critical', 'warning', 'info'], severity)"


def _paths(inputs) -> list[Path]:
    """The inputs as paths, a list or tuple given as one input counting as its items."""
    paths = []
    for given in inputs:
        for item in given if isinstance(given, (list, tuple)) else (given,):
            if not isinstance(item, (str, os.PathLike)):
                raise TracekitError(f"inputs are paths (str or os.PathLike), got {type(item).__name__}: {item!r:.80}")
            paths.append(Path(item))
    return paths


def open(
    *inputs,
    db: str | Path | None = None,
    labels: list[str] | None = None,
    offsets=None,
    rank: int | None = None,
    metrics: tuple[str, ...] = (),
    progress=None,
    read_only: bool = False,
    same_content: str = "skip",
) -> Trace:
    """Open profiler output as a Trace.

    `inputs`: trace and log files, folders a profiler wrote (e.g. a `tensorboard_trace_handler`
    directory), or one existing tracekit database (a .duckdb file, recognised by content too); a
    list or tuple of them counts as its items (`tracekit.open(glob.glob("rank*.json.gz"))`).
    Without inputs, `db` is opened as it is (created when missing, unless `read_only`).

    `db`: keep the database in this file (ingested inputs are added to it); default: in memory.
    `labels`: one run label per run (default: the file name). `offsets`: clock shifts, as a dict
    {file: duration} (ns, or text such as "-7h", "+250us") or "FILE=DURATION" strings, matched by
    path or file name. `rank`: rank for traces that name none. `metrics`: error columns of a
    numerics report. `progress`: called with a message before each input. `read_only`: open an
    existing database without writing to it (no findings can be stored then). `same_content`: what
    to do with a trace the database holds already (same content): `skip` it (`Trace.duplicates`
    says which), `replace` its old runs, or `keep` both.
    """
    paths = _paths(inputs)
    databases = [p for p in paths if is_database(p)]
    if databases and len(paths) > 1:
        raise TracekitError("pass either one .duckdb database or trace files, not both")
    if databases and db is not None:
        raise TracekitError(f"{databases[0]} is opened as it is: name no other database to ingest into (db, --db)")
    if databases:
        db = databases[0]
        paths = []
    if read_only and paths:
        raise TracekitError("read_only opens an existing database; ingesting trace files needs a writable one")
    created = db is not None and not Path(db).exists()
    database = _Database.connect(db, must_exist=bool(databases) or read_only, read_only=read_only)
    if not paths:
        return Trace(database, database.run_ids())
    try:
        return Trace(database, ()).add(
            *paths,
            labels=labels,
            offsets=offsets,
            rank=rank,
            metrics=metrics,
            progress=progress,
            same_content=same_content,
        )
    except BaseException:
        try:
            empty = created and not database.run_ids()
        except Exception:  # the failure invalidated the connection (a full disk): keep what is on disk
            empty = False
        database.close()
        if empty:  # a database file this call made and nothing went into: not left behind
            for leftover in (Path(db), Path(f"{db}.wal")):
                leftover.unlink(missing_ok=True)
        raise


@dataclass
class LakeIngest:
    """What `ingest_lake` did: an IngestResult per file ingested, a Duplicate per trace skipped."""

    lake: Path
    ingested: list = field(default_factory=list)
    duplicates: list = field(default_factory=list)


def ingest_lake(lake, *inputs, labels=None, offsets=None, rank=None, metrics=(), progress=None) -> LakeIngest:
    """Ingest inputs into the trace lake at `lake` (a folder, created when missing; docs/lake.md):
    each run as Parquet files, all of them or, when one input fails, none. A trace the lake holds
    already is skipped. `tracekit.open(lake)` then opens it as a database."""
    from tracekit.ingest.lake import ingest_lake as into_lake
    from tracekit.ingest.offsets import parse_offsets

    paths = [Path(p) for p in inputs]
    if any(is_database(p) for p in paths):
        raise TracekitError("a lake ingests trace files and folders, not a database")
    if isinstance(offsets, dict):
        offsets = [f"{name}={value}" for name, value in offsets.items()]
    if isinstance(labels, str):
        labels = [labels]
    duplicates: list = []
    results = into_lake(
        lake, paths, duplicates=duplicates, rank=rank, labels=list(labels) if labels else None, progress=progress,
        metrics=tuple(metrics), offsets=parse_offsets(offsets or (), paths),
    )  # fmt: skip
    return LakeIngest(Path(lake), results, duplicates)


def side_labels(side: str, paths) -> list[str]:
    """Run labels `side/<file name without .json/.gz>`, as `tracekit diff` names the two sides."""
    out = []
    for p in paths:
        name = Path(p).name
        for suffix in (".gz", ".json"):
            name = name.removesuffix(suffix)
        out.append(f"{side}/{name}")
    return out


@dataclass
class Analysis:
    """What one run of the rules found: findings ranked as in the report, and data-quality notes."""

    key: str
    findings: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    # wall seconds per rule code, plus the shared views and data-quality checks (engine.runner); not
    # part of any document: two analyses of one trace give the same documents
    timings: dict = field(default_factory=dict, compare=False, repr=False)


class Trace:
    """Runs of one trace database, and everything tracekit computes from them. See the module doc."""

    def __init__(self, database: _Database, run_ids, ingested=(), duplicates=()):
        self._db = database
        self._run_ids = tuple(run_ids)
        self.ingested = list(ingested)  # IngestResult per input file, for a Trace made by open/add
        self.duplicates = list(duplicates)  # ingest.runs.Duplicate per input not ingested twice

    def __repr__(self) -> str:
        where = self._db.path or ":memory:"
        return f"<tracekit.Trace runs={list(self._run_ids)} db={where}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Close the database, for every Trace that shares it."""
        self._db.close()

    # ------------------------------------------------------------------------------------ the runs

    @property
    def connection(self):
        """The database's DuckDB connection (shared by the Traces of this database)."""
        return self._db.con

    @property
    def path(self) -> Path | None:
        """The database file, or None for an in-memory database."""
        return self._db.path

    @property
    def runs(self) -> list[int]:
        """Run ids of this Trace (`runs` table), in order."""
        return list(self._run_ids)

    def select(self, run_ids=None, labels=None) -> Trace:
        """A Trace of some runs of the same database: by id, and/or by label (glob patterns such as
        "baseline/*"). With neither, every run the database holds now."""
        known = self._db.con.execute("SELECT run_id, label FROM runs ORDER BY run_id").fetchall()
        chosen = [rid for rid, _ in known]
        if run_ids is not None:
            wanted = [int(r) for r in ([run_ids] if isinstance(run_ids, int) else run_ids)]
            missing = sorted(set(wanted) - set(chosen))
            if missing:
                raise TracekitError(f"no run {missing[0]} in this database; runs: {chosen}")
            chosen = [r for r in chosen if r in wanted]
        if labels is not None:
            patterns = [labels] if isinstance(labels, str) else list(labels)
            by_label = {rid: label for rid, label in known}
            chosen = [r for r in chosen if any(fnmatch.fnmatchcase(str(by_label[r]), p) for p in patterns)]
            if not chosen:
                raise TracekitError(
                    f"no run labelled {' or '.join(patterns)}; labels: {sorted(map(str, by_label.values()))}"
                )
        return Trace(self._db, chosen)

    def add(
        self,
        *inputs,
        labels=None,
        offsets=None,
        rank=None,
        metrics=(),
        progress=None,
        same_content="skip",
        on_error=None,
    ) -> Trace:
        """Ingest more inputs into this database (each once); returns the Trace of the new runs (and of the runs already holding an input).
        Findings computed before are computed again, over every run, when next asked for. A trace
        the database holds already is not ingested again (the returned Trace's `duplicates` names
        it); `same_content="replace"` puts its new run in place of the old ones, `"keep"` keeps both
        (two sides of a comparison). `on_error(path, exception)`, when given, receives each input
        that cannot be ingested, and the others are (without it the first such input raises)."""
        from tracekit.ingest import ingest
        from tracekit.ingest.offsets import parse_offsets

        if self._db.read_only:
            raise TracekitError(f"{self._db.path}: opened read-only; cannot add inputs")
        if self._db.path is not None and self._db.path.is_dir():
            raise TracekitError(f"{self._db.path}: a lake takes inputs through tracekit ingest --lake (ingest_lake)")
        paths = [Path(p) for p in inputs]
        if any(is_database(p) for p in paths):
            raise TracekitError("add takes trace files and folders; a database is compared with Trace.diff")
        if isinstance(offsets, dict):
            offsets = [f"{name}={value}" for name, value in offsets.items()]
        shifts = parse_offsets(offsets or (), paths)
        if isinstance(labels, str):
            labels = [labels]
        duplicates: list = []
        try:
            results = ingest(
                self._db.con, paths, rank=rank, labels=list(labels) if labels else None, progress=progress,
                metrics=tuple(metrics), offsets=shifts, same_content=same_content, duplicates=duplicates,
                on_error=on_error,
            )  # fmt: skip
        except BaseException:
            with contextlib.suppress(Exception):  # the failure may have invalidated the connection
                self._db.changed()
            raise
        self._db.changed()
        # a trace not ingested twice is still one of these inputs: its Trace holds the runs it is in
        held = {run for d in duplicates for run in d.runs}
        return Trace(self._db, sorted({r.run_id for r in results} | held), results, duplicates)

    # ------------------------------------------------------------------------------------ queries

    def sql(self, query: str, **params):
        """A DuckDB relation over the whole database (`list_contains($runs, run_id)` with
        runs=trace.runs keeps this Trace's runs); `$name` placeholders bind `params`. A statement
        that returns no rows (CREATE, INSERT, ...) runs at once and gives None."""
        import duckdb

        try:
            return self._db.relation(query, params or None)
        except duckdb.Error as e:
            raise TracekitError(f"query failed: {' '.join(str(e).split())}") from None

    def summary(self, limit: int = 10) -> dict:
        """Where the time went, per run, before any rule speaks (the report's `summary`)."""
        from tracekit.findings.time_summary import top_costs

        doc = top_costs(self._db.con, limit=limit)
        doc["runs"] = [r for r in doc["runs"] if r["run_id"] in self._run_ids]
        return doc

    # ----------------------------------------------------------------------------------- findings

    def analysis(self, rules=None, params=None, scope: str | None = None, _then=None) -> Analysis:
        """The findings (Finding objects, ranked) and data-quality notes of this Trace's runs.

        `rules`: codes or names, a list or one comma-separated string (default: every rule).
        `params`: {rule: {parameter: value}}. The rules run once per (rules, params) over every run
        of the database, and again only after inputs were added. `scope`: only the rules of that
        scope ("run": per-rank rules, as a cluster worker runs them; "job": cross-rank rules, as the
        reducer of a cluster run does, see tracekit.cluster); default every rule."""
        if scope is not None and scope not in ("run", "job"):
            raise TracekitError(f"scope: run or job, not {scope!r}")
        full = self._db.analysis(*_request(rules, params), scope=scope, then=_then)
        everything = set(self._run_ids) >= set(self._db.run_ids())
        return Analysis(
            full.key,
            [f for f in full.findings if self._holds(f.locality.get("run_id"), everything)],
            [n for n in full.notes if n.run_id is None or n.run_id in self._run_ids],
            full.timings,
        )

    def finding_records(self, rules=None, params=None) -> list[dict]:
        """The findings as finding records (dicts of the shipped JSON Schema), ranked."""
        return [f.as_dict() for f in self.analysis(rules, params).findings]

    def findings(self, rules=None, params=None):
        """A relation over the `findings` table: this analysis's rows for this Trace's runs, ranked.

        Columns: id, rule, name, severity, confidence, title, run_id, rank, impact_ns,
        share_of_window, record (the finding record as JSON); the table's `analysis_key` says which
        rules and parameters produced a row (`Analysis.key`)."""
        if self._db.read_only:
            raise TracekitError(f"{self._db.path}: opened read-only; findings are stored in the database")
        key = self.analysis(rules, params).key
        everything = set(self._run_ids) >= set(self._db.run_ids())
        return self._db.relation(
            "SELECT * EXCLUDE (analysis_key) FROM findings WHERE analysis_key = $key "
            "AND (list_contains($runs, run_id) OR (run_id IS NULL AND $everything)) "
            f"ORDER BY {_SEVERITY_ORDER}, share_of_window DESC, rule, id, run_id",
            {"key": key, "runs": list(self._run_ids), "everything": everything},
        )

    def report_document(self, rules=None, params=None, max_findings: int | None = 25) -> dict:
        """The analyze report (`tracekit analyze --format json`) of this Trace's runs; `max_findings`
        None keeps every finding."""
        from tracekit.findings.report import build_report

        if max_findings is not None and max_findings < 0:
            raise TracekitError("max_findings must be at least 0")
        made: dict = {}
        # the summary reads busy time and launches too: from the tables the rules compute anyway, when
        # they run now
        a = self.analysis(rules, params, _then=lambda: made.update(summary=self.summary()))
        summary = made["summary"] if "summary" in made else self.summary()
        cap = len(a.findings) if max_findings is None else max_findings
        return build_report(self._db.con, a.findings, a.notes, summary, max_findings=cap, run_ids=self._run_ids)

    def feedback(self, budget_tokens: int | None = None, rules=None, params=None, baseline: Trace | None = None,
                 step: str | None = None, llm=None, model: str | None = None) -> dict:  # fmt: skip
        """Ranked, deduplicated feedback records for an agent (docs/agents.md), within `budget_tokens`;
        with `baseline`, each record says whether it is new, regressed, improved or unchanged. `llm` (an
        OpenAI-compatible client) and `model` let a model write the prose, checked number by number."""
        from tracekit.findings.feedback import build_feedback, llm_prose

        if budget_tokens is not None and budget_tokens < 200:
            raise TracekitError("budget_tokens must be at least 200")
        status = self.status(baseline, step=step, rules=rules, params=params) if baseline is not None else None
        doc = build_feedback(self.finding_records(rules, params), budget_tokens, status)
        if llm is not None:
            if not model:
                raise TracekitError("a model writes the prose only with `model` named")
            doc = llm_prose(doc, llm, model)
        return doc

    # ------------------------------------------------------------------------------ against a baseline

    def diff(
        self,
        baseline: Trace,
        step: str | None = None,
        accept=(),
        top: int = 15,
        baseline_steps: str | None = None,
        candidate_steps: str | None = None,
    ) -> dict:
        """This Trace (the candidate) against `baseline`: the diff document of docs/diff.md.

        Both sides in one database (`Trace.add`, `Trace.select`) are compared in place. A baseline
        in another database is compared in a scratch in-memory database that both sides' runs are
        copied into (rows streamed through Arrow, never parsed again), so neither database changes
        and the findings of each side stay those of its own runs.

        `baseline_steps` / `candidate_steps`: step name globs (fnmatch over the step's name key or
        its annotation as written) that select the steps compared on each side, instead of `step`.
        With them, `baseline` may be this very Trace: two step groups of one trace (serial and
        overlapped steps of the same layers) are compared, each side a copy of its runs."""
        from tracekit.compare.diff import Side, compare, parse_accept

        for a in accept:
            parse_accept(a)  # a bad criterion fails before any copy
        if top < 1:
            raise TracekitError("top must be at least 1")
        globs = None
        if baseline_steps is not None or candidate_steps is not None:
            if baseline_steps is None or candidate_steps is None or step is not None:
                raise TracekitError("step groups need both baseline_steps and candidate_steps, and no step")
            globs = {"baseline": baseline_steps, "candidate": candidate_steps}
        if globs and baseline._db is self._db and baseline._run_ids == self._run_ids:
            cand, base = self._twice()
        else:
            cand, base = self._beside(baseline)
        sides = {"baseline": Side("baseline", base.runs), "candidate": Side("candidate", cand.runs)}
        doc = compare(cand._db.con, sides, step, list(accept), top, step_globs=globs)
        if globs is None:
            self._db.noise[self._pair_key(baseline) + (step,)] = doc["noise"]
        return doc

    def status(self, baseline: Trace, step: str | None = None, rules=None, params=None) -> dict:
        """Each finding new, fixed, improved, regressed or unchanged against `baseline`, by stable id,
        its cost per unit of work within the noise the diff measured on the units (not_comparable when
        the diff finds no common unit; docs/agents.md, finding status). Each side's findings are those
        of its own Trace."""
        from tracekit.findings.status import classify

        noise = self._db.noise.get(self._pair_key(baseline) + (step,))
        if noise is None:
            noise = self.diff(baseline, step=step)["noise"]
        return classify(baseline.finding_records(rules, params), self.finding_records(rules, params), noise)

    def _pair_key(self, other: Trace) -> tuple:
        return (id(other._db), other._run_ids, self._run_ids)

    def _twice(self) -> tuple[Trace, Trace]:
        """This Trace's runs copied twice into a scratch database, as two Traces: one trace's step
        groups compared with each other by the diff, which takes each run on one side only."""
        key = self._pair_key(self)
        if key not in self._db.companions:
            scratch = _Database.connect(None)
            try:
                pair = tuple(Trace(scratch, scratch.copy_from(self._db, self._run_ids)) for _ in range(2))
            except BaseException:
                scratch.close()
                raise
            self._db.companions[key] = (self._db, *pair)
        _, cand, base = self._db.companions[key]
        return cand, base

    def _beside(self, other: Trace) -> tuple[Trace, Trace]:
        """(self, other) as Traces of one database, copied into a scratch one when they live apart."""
        if not isinstance(other, Trace):
            raise TracekitError(f"a baseline is a tracekit Trace, not {type(other).__name__}")
        if other._db is self._db:
            if set(other._run_ids) & set(self._run_ids):
                raise TracekitError("the baseline and the candidate share runs: open or select them apart")
            if not other._run_ids or not self._run_ids:
                raise TracekitError("a diff needs at least one baseline run and one candidate run")
            return self, other
        key = self._pair_key(other)
        if key not in self._db.companions:
            scratch = _Database.connect(None)
            try:
                pair = (Trace(scratch, scratch.copy_from(self._db, self._run_ids)),
                        Trace(scratch, scratch.copy_from(other._db, other._run_ids)))  # fmt: skip
            except BaseException:
                scratch.close()
                raise
            self._db.companions[key] = (other._db, *pair)  # holding other._db keeps its id unique
        _, cand, base = self._db.companions[key]
        return cand._beside(base)

    # ------------------------------------------------------------------------------------ outputs

    def report(self, path, rules=None, params=None, max_findings: int | None = 25, baseline: Trace | None = None,
               step: str | None = None, title: str | None = None) -> dict:  # fmt: skip
        """Write the self-contained HTML report (docs/report.md) to `path`; with `baseline`, the
        waterfall of the step-time delta too. Returns {path, figures, findings, bytes}."""
        from tracekit.errors import require_extra

        require_extra("plotly", "report", "the HTML report")
        from tracekit.render.html import build

        doc = self.report_document(rules, params, max_findings)
        diff_doc = self.diff(baseline, step=step) if baseline is not None else None
        name = title or "tracekit report: " + ", ".join(Path(r["source"]).name for r in doc["runs"])
        page, figures = build(self._db.con, doc, diff_doc, title=name)
        Path(path).write_text(page, encoding="utf-8")
        return {"path": str(path), "figures": figures, "findings": len(doc["findings"]), "bytes": len(page)}

    def annotate(self, path, rules=None, params=None, max_findings: int | None = None) -> dict:
        """Write this Trace's one run as Chrome-trace JSON with a "tracekit findings" track (the
        `max_findings` top-ranked findings; default all). See docs/report.md."""
        from tracekit.render.annotate import annotate

        rows = self._db.con.execute(
            "SELECT run_id, source, format, base_time_ns FROM runs WHERE list_contains(?, run_id) ORDER BY run_id",
            [list(self._run_ids)],
        ).fetchall()
        if len(rows) != 1:
            sources = sorted({str(r[1]) for r in rows}) or ["this trace"]
            raise TracekitError(f"{', '.join(sources)}: expected one run, the input made {len(rows)}")
        run = dict(zip(("run_id", "source", "format", "base_time_ns"), rows[0]))
        if run["format"] in ("ncu_csv", "numerics_report"):
            raise TracekitError(f"{run['source']}: {run['format']} has no timeline to annotate; pass a trace")
        doc = self.report_document(rules, params, max_findings)
        return annotate(self._db.con, run, doc["findings"], Path(path))

    def _holds(self, run_id, everything: bool) -> bool:
        return run_id in self._run_ids if run_id is not None else everything


# ----------------------------------------------------------------------------------------- database


class _Database:
    """One connection, and what was computed on it: shared by every Trace of the database."""

    def __init__(self, con, path: Path | None, read_only: bool):
        self.con = con
        self.path = path
        self.read_only = read_only
        self.analyses: dict[str, Analysis] = {}  # analysis key -> findings over every run
        self.noise: dict[tuple, dict] = {}  # (baseline runs, candidate runs, step) -> the diff's noise
        self.companions: dict[tuple, tuple] = {}  # (other database, its runs, ours) -> both in a scratch one
        self._cursors: dict[int, object] = {}  # cursor of each live relation, by a serial number
        self._serial = itertools.count()

    @classmethod
    def connect(cls, path, must_exist: bool = False, read_only: bool = False) -> _Database:
        from tracekit import db

        path = Path(path) if path is not None else None
        if path is not None and must_exist and not path.exists():
            raise TracekitError(f"{path}: database not found")
        if path is not None and path.is_dir() and not is_database(path):
            raise TracekitError(f"{path}: a folder that is not a tracekit lake (no catalog.duckdb in it)")
        if path is not None and path.is_file() and path.stat().st_size and not is_database(path):
            raise TracekitError(
                f"{path}: not a tracekit database (no DuckDB header); to query a trace, ingest it first: "
                f"tracekit ingest {path} --db run.duckdb"
            )
        try:
            con = db.connect(str(path) if path is not None else None, read_only=read_only)
        except Exception as e:  # duckdb.IOException etc.: a locked or non-DuckDB file
            raise TracekitError(f"{path}: cannot open as a DuckDB database ({str(e).splitlines()[0]})") from None
        return cls(con, path, read_only)

    def relation(self, query: str, params: dict | None = None):
        """A relation on a cursor of its own, so that its pending result never blocks another query;
        the cursor lives as long as the relation (DuckDB 1.x relations do not keep it alive)."""
        from tracekit.db.connection import cursor

        cur = cursor(self.con)
        try:
            rel = cur.sql(query, params=params)
        except BaseException:
            cur.close()
            raise
        if rel is None:  # a statement without rows: it ran already
            cur.close()
            return None
        serial = next(self._serial)
        self._cursors[serial] = cur
        weakref.finalize(rel, self._release, serial)
        return rel

    def _release(self, serial: int) -> None:
        cur = self._cursors.pop(serial, None)
        if cur is not None:
            cur.close()

    def close(self) -> None:
        for _, cand, _ in self.companions.values():
            cand._db.close()
        self.companions.clear()
        for serial in list(self._cursors):
            self._release(serial)
        if self.path is not None and not self.read_only:
            self._checkpoint()
        self.con.close()

    def _checkpoint(self) -> None:
        """Write the session's changes into the database file now, where a failure can be said: at
        close DuckDB drops a failed checkpoint silently and leaves the changes in the `.wal` file
        beside it, which a copy or a rename of the database file does not take along."""
        import duckdb

        try:
            self.con.execute("CHECKPOINT")
        except duckdb.ConnectionException:  # closed already
            return
        except duckdb.Error as e:
            if "invalidated" in str(e):  # an earlier fatal error (a full disk): that one is being said
                return
            raise TracekitError(
                f"{self.path}: could not write the database file ({' '.join(str(e).split())[:300]}); "
                f"this session's changes are in {self.path}.wal, which must stay beside it"
            ) from None

    def run_ids(self) -> list[int]:
        return [r[0] for r in self.con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]

    def changed(self) -> None:
        """Runs were added: findings of the runs before are stale, here and in the `findings` table."""
        self.analyses.clear()
        self.noise.clear()
        if not self.read_only:
            self.con.execute("DELETE FROM findings")

    def analysis(self, select, overrides, key, scope: str | None = None, then=None) -> Analysis:
        """The analysis of `key`, run now unless it is known; `then`, when the rules run now, is called
        while their shared tables still exist (see run_rules)."""
        from tracekit.engine.runner import run_rules
        from tracekit.findings.report import rank

        if scope is not None:
            key = f"{key};scope={scope}"
        if key not in self.analyses:
            timings: dict[str, float] = {}
            findings, notes = run_rules(self.con, select, overrides, scope=scope, timings=timings, then=then)
            self.analyses[key] = Analysis(key, rank(findings), notes, timings)
            if not self.read_only:
                self._store(key, findings)
        return self.analyses[key]

    def _store(self, key: str, findings) -> None:
        """Replace the `findings` rows of this analysis key (typed columns and the whole record)."""
        from tracekit.engine.registry import get_rule

        # plain parameter rows: findings are few, and handing DuckDB an Arrow table or DataFrame
        # makes it import pandas when installed (0.6 s, more than all the rules of a small trace)
        rows = []
        for f in findings:
            r = f.as_dict()
            loc, impact = r["locality"], r["impact"]
            rows.append([
                key, r["id"], r["rule"], get_rule(r["rule"]).name, r["severity"], r["confidence"], r["title"],
                loc.get("run_id"), loc.get("rank"), impact["time_ns"], impact["share_of_window"],
                json.dumps(r, default=str),
            ])  # fmt: skip
        self.con.execute("DELETE FROM findings WHERE analysis_key = ?", [key])
        if rows:
            # on a cursor of its own: the main connection may hold a rule's pending result
            from tracekit.db.connection import cursor

            cur = cursor(self.con)
            cur.executemany(
                "INSERT INTO findings (analysis_key, id, rule, name, severity, confidence, title, run_id, rank, "
                "impact_ns, share_of_window, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            cur.close()

    def copy_from(self, source: _Database, run_ids) -> list[int]:
        """Copy runs of another tracekit database in, under new run ids; returns them.

        Rows stream through Arrow (so an in-memory source works too; ATTACH would need a file), table
        by table over every table with a run_id column except `findings`, which is recomputed.
        event_rows keeps file order, and parent_id (a rowid) is renumbered to the copied rows'
        rowids; a checksum over (position, ts_ns, dur_ns, kind, name) proves the order held."""
        from tracekit.db import pending

        if self.read_only:
            raise TracekitError(f"{self.path}: opened read-only; cannot copy runs in")
        old = sorted(run_ids)
        # pending until every table is copied: a copy killed halfway is removed on the next open
        new = pending.begin(self.con, f"runs {old} of {source.path or 'an in-memory database'}", len(old))
        remap = "CASE run_id " + " ".join(f"WHEN {o} THEN {n}" for o, n in zip(old, new)) + " END"
        try:
            for table, columns in _run_tables(self, source):
                select = ", ".join(f"{remap} AS run_id" if c == "run_id" else f'"{c}"' for c in columns)
                if table == "event_rows":
                    self._copy_events(source, old, new, columns, remap)
                    continue
                rows = source.relation(
                    f'SELECT {select} FROM "{table}" WHERE list_contains($ids, run_id)', {"ids": old}
                )
                self._append(table, columns, rows)
            pending.finish(self.con, new)
        except BaseException:
            for table, _ in _run_tables(self, self):
                self.con.execute(f'DELETE FROM "{table}" WHERE list_contains(?, run_id)', [new])
            pending.finish(self.con, new)
            raise
        finally:
            pending.forget(self.con, new)
            self.changed()
        return new

    def _append(self, table: str, columns: list[str], relation) -> None:
        reader = getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader
        names = ", ".join(f'"{c}"' for c in columns)
        from tracekit.db.connection import cursor

        cur = cursor(self.con)
        cur.register("tk_copied_rows", reader(100_000))
        cur.execute(f'INSERT INTO "{table}" ({names}) SELECT {names} FROM tk_copied_rows')
        cur.close()

    def _copy_events(self, source: _Database, old: list[int], new: list[int], columns: list[str], remap: str):
        shape = "hash(tk_pos, ts_ns, dur_ns, kind, name)"
        picked = ", ".join(
            f"{remap} AS run_id" if c == "run_id" else "p.tk_pos AS parent_id" if c == "parent_id" else f's."{c}"'
            for c in columns
        ).replace("CASE run_id", "CASE s.run_id")
        numbered = (
            "WITH s AS (SELECT rowid AS tk_rowid, row_number() OVER (ORDER BY rowid) - 1 AS tk_pos, * "
            "FROM event_rows WHERE list_contains($ids, run_id)) "
        )
        rows = source.relation(
            numbered + f"SELECT {picked} FROM s LEFT JOIN s p ON p.tk_rowid = s.parent_id ORDER BY s.tk_pos",
            {"ids": old},
        )
        self._append("event_rows", columns, rows)
        checksum = source.relation(numbered + f"SELECT bit_xor({shape}), count(*) FROM s", {"ids": old})
        expected, count = checksum.fetchall()[0]
        lo, hi, n = self.con.execute(
            "SELECT min(rowid), max(rowid), count(*) FROM event_rows WHERE list_contains(?, run_id)", [new]
        ).fetchone()
        if n != count or (n and hi - lo + 1 != n):
            raise TracekitError(f"copying runs {old}: the copied events are not contiguous ({n} of {count} rows)")
        if n:
            self.con.execute(
                "UPDATE event_rows SET parent_id = parent_id + ? WHERE list_contains(?, run_id) AND parent_id IS NOT NULL",
                [lo, new],
            )
            got = self.con.execute(
                f"SELECT bit_xor({shape}) FROM (SELECT rowid - ? AS tk_pos, * FROM event_rows "
                "WHERE list_contains(?, run_id))",
                [lo, new],
            ).fetchone()[0]
            if got != expected:
                raise TracekitError(f"copying runs {old}: the copied events lost their order")


def _run_tables(target, source) -> list[tuple[str, list[str]]]:
    """(table, columns both databases have) for every table of `target` with a run_id column."""
    from tracekit.db.connection import table_columns

    theirs = table_columns(source.con)
    out = []
    for table, columns in table_columns(target.con).items():
        shared = [c for c in columns if c in set(theirs.get(table, ()))]
        if "run_id" in shared and table not in ("findings", "ingest_pending"):
            out.append((table, shared))
    return out


def analysis_key(rules=None, params=None) -> str:
    """The `findings.analysis_key` of a rule selection and its parameters; unknown rules and
    parameters fail here (TracekitError), before anything is ingested."""
    return _request(rules, params)[2]


def _request(rules, params) -> tuple[list[str] | None, dict[str, dict], str]:
    """(rule codes or None for all, parameters by rule code, the analysis key naming both)."""
    from tracekit.engine.registry import get_rule

    keys = [k.strip() for k in rules.split(",")] if isinstance(rules, str) else list(rules or [])
    try:
        select = [get_rule(k).code for k in keys if k] or None
        overrides: dict[str, dict] = {}
        for key, values in (params or {}).items():
            rule = get_rule(key)
            resolved = rule.resolve_params(values)
            overrides.setdefault(rule.code, {}).update({k: resolved[k] for k in values})
    except (KeyError, ValueError) as e:
        raise TracekitError(str(e.args[0] if e.args else e)) from None
    key = f"rules={','.join(select) if select else 'all'};params={json.dumps(overrides, sort_keys=True, default=str)}"
    return select, overrides, key


def is_database(path) -> bool:
    """A DuckDB database file, by its .duckdb suffix or its header, or a trace lake (a folder holding
    its catalog.duckdb, see tracekit.db.lake)."""
    path = Path(path)
    if path.is_dir():
        from tracekit.db.lake import is_lake

        return is_lake(path)
    if path.suffix == ".duckdb":
        return True
    try:
        with path.open("rb") as f:
            return f.read(12)[8:12] == _DUCKDB_MAGIC
    except OSError:
        return False
