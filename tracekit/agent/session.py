"""The databases one agent session built: handles db1, db2, ...; tools default to the latest.

Every database is a DuckDB file in the session's directory, written through tracekit.api by one
short-lived connection (ingest, rules; the findings land in its `findings` table) and read through
the sandbox (sandbox.py), so a model's query never shares a connection that can write.

Tool calls may run at once (the MCP server runs each on a worker thread). Each ingest builds its own
file and gets its handle only when it succeeded; on one database, an analysis that stores findings
waits for the queries reading it, and they for it.

A session reads only paths inside its allowed roots (folders, or single files), symlinks resolved:
a model must not be able to read an arbitrary file of the server's through a trace reader.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


class ToolError(Exception):
    """A tool failed in a way the caller can fix; `hint` says how. Never kills a server or a loop."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


class ReadWriteLock:
    """Many readers or one writer; a waiting writer holds back new readers, so it cannot starve."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writing and not self._readers)
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


@dataclass
class Database:
    handle: str
    path: Path
    sources: list[str]
    findings: list[dict] | None = None
    notes: list[dict] = field(default_factory=list)
    lock: ReadWriteLock = field(default_factory=ReadWriteLock, repr=False, compare=False)

    def query(self, sql: str, max_rows: int = 100, params: dict | None = None) -> dict:
        """sandbox.run_query on this database, never while an analysis writes to it."""
        from tracekit.agent.sandbox import run_query

        with self.lock.reading():
            return run_query(self.path, sql, max_rows=max_rows, params=params)


class Session:
    def __init__(self, workdir: str | Path | None = None, roots: Iterable[str | Path] | None = None):
        """`roots`: the folders (or files) whose paths the tools may read; default the working directory."""
        self._own = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tracekit-session-"))
        self.roots = [Path(r).resolve() for r in (roots if roots is not None else [Path.cwd()])]
        self.databases: dict[str, Database] = {}
        self._lock = threading.Lock()  # guards `databases` and the build counter
        self._builds = itertools.count(1)

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def latest(self) -> Database | None:
        with self._lock:
            return next(reversed(self.databases.values()), None)

    def entries(self) -> list[Database]:
        """The databases built so far, in order (a copy: other calls may add one meanwhile)."""
        with self._lock:
            return list(self.databases.values())

    def get(self, handle: str | None) -> Database:
        if handle:
            with self._lock:
                entry = self.databases.get(handle)
                known = ", ".join(self.databases) or "none yet"
            if entry is None:
                raise ToolError(f"no database {handle!r} in this session", f"known databases: {known} (list_runs)")
            return entry
        latest = self.latest
        if latest is None:
            raise ToolError("no trace database in this session yet", "call ingest or analyze with trace paths first")
        return latest

    def check_path(self, path: str) -> None:
        """ToolError unless the path, and every file in it when it is a folder, resolves inside a root."""
        real = Path(path).resolve()
        if not self._inside(real):
            raise ToolError(f"{path}: outside the folders this session may read", self._roots_hint())
        if real.is_dir():
            for file in real.rglob("*"):  # the walk inputs.expand does: a link in a folder must not lead out
                if file.is_file() and not self._inside(file.resolve()):
                    raise ToolError(
                        f"{path}: {file.relative_to(real)} links outside the folders this session may read",
                        self._roots_hint(),
                    )

    def _inside(self, real: Path) -> bool:
        return any(real.is_relative_to(root) for root in self.roots)

    def _roots_hint(self) -> str:
        roots = ", ".join(map(str, self.roots))
        return f"paths must lie under the allowed roots: {roots} (tracekit started with --root DIR allows more)"

    def ingest(self, paths: list[str], labels: list[str] | None = None) -> tuple[Database, list[dict]]:
        """A new database of these inputs; returns it and one ingest result per input file."""

        def fill(path: Path):
            from tracekit import api

            with api.open(*paths, db=path, labels=labels) as trace:
                return [r.as_dict() for r in trace.ingested]

        return self.build(paths, fill)

    def build(self, paths: list[str], fill) -> tuple[Database, object]:
        """A new database file made by `fill(path)` (an ingest, or a diff's two sides), registered
        only if it succeeds; `fill` closes what it opened, so the sandbox can read the file."""
        from tracekit.errors import TracekitError

        for p in paths:  # before anything else, so that even whether a file exists stays inside the roots
            self.check_path(p)
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            raise ToolError(
                f"not a file or folder: {', '.join(missing)}", "pass paths of trace files readable by the server"
            )
        with self._lock:
            path = self.workdir / f"build{next(self._builds)}.duckdb"
        try:
            out = fill(path)
        except TracekitError as e:
            path.unlink(missing_ok=True)
            raise ToolError(str(e), "check that the file is a supported trace (docs: README.md, Inputs)") from None
        with self._lock:  # handles in the order the builds finished, with no gaps for failed ones
            handle = f"db{len(self.databases) + 1}"
            entry = Database(handle, path, [str(p) for p in paths])
            self.databases[handle] = entry
        return entry, out

    def analyze(self, entry: Database, rules: list[str] | None = None) -> list[dict]:
        """Findings of the database (cached for the default rule set); stored in its `findings` table."""
        from tracekit import api
        from tracekit.errors import TracekitError

        if not rules and entry.findings is not None:
            return entry.findings
        with entry.lock.writing():
            if not rules and entry.findings is not None:  # another call analysed it while this one waited
                return entry.findings
            try:
                with api.open(entry.path) as trace:
                    analysis = trace.analysis(rules or None)
            except TracekitError as e:
                raise ToolError(str(e), "explain_rule or `tracekit rules` lists the rules") from None
            out = [f.as_dict() for f in analysis.findings]
            if not rules:  # notes first: findings that are set tell other calls that both are
                entry.notes = [n.as_dict() for n in analysis.notes]
                entry.findings = out
        return out

    def find(self, finding_id: str, handle: str | None) -> tuple[Database, dict]:
        entries = [self.get(handle)] if handle else self.entries()[::-1]
        if not entries:
            raise ToolError("no trace database in this session yet", "call ingest or analyze first")
        for entry in entries:
            for f in self.analyze(entry):
                if f["id"] == finding_id:
                    return entry, f
        raise ToolError(f"no finding {finding_id!r}", "analyze lists the finding ids (record_id, examples)")
