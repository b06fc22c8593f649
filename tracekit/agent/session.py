"""The databases one agent session built: handles db1, db2, ...; tools default to the latest.

Every database is a DuckDB file in the session's directory, written through tracekit.api by one
short-lived connection (ingest, rules; the findings land in its `findings` table) and read through
the sandbox (sandbox.py), so a model's query never shares a connection that can write.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


class ToolError(Exception):
    """A tool failed in a way the caller can fix; `hint` says how. Never kills a server or a loop."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


@dataclass
class Database:
    handle: str
    path: Path
    sources: list[str]
    findings: list[dict] | None = None
    notes: list[dict] = field(default_factory=list)


class Session:
    def __init__(self, workdir: str | Path | None = None):
        self._own = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tracekit-session-"))
        self.databases: dict[str, Database] = {}

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def latest(self) -> Database | None:
        return next(reversed(self.databases.values()), None)

    def get(self, handle: str | None) -> Database:
        if handle:
            if handle not in self.databases:
                known = ", ".join(self.databases) or "none yet"
                raise ToolError(f"no database {handle!r} in this session", f"known databases: {known} (list_runs)")
            return self.databases[handle]
        if self.latest is None:
            raise ToolError("no trace database in this session yet", "call ingest or analyze with trace paths first")
        return self.latest

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

        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            raise ToolError(
                f"not a file or folder: {', '.join(missing)}", "pass paths of trace files readable by the server"
            )
        handle = f"db{len(self.databases) + 1}"
        path = self.workdir / f"{handle}.duckdb"
        try:
            out = fill(path)
        except TracekitError as e:
            path.unlink(missing_ok=True)
            raise ToolError(str(e), "check that the file is a supported trace (docs: README.md, Inputs)") from None
        entry = Database(handle, path, [str(p) for p in paths])
        self.databases[handle] = entry
        return entry, out

    def analyze(self, entry: Database, rules: list[str] | None = None) -> list[dict]:
        """Findings of the database (cached for the default rule set); stored in its `findings` table."""
        from tracekit import api
        from tracekit.errors import TracekitError

        if not rules and entry.findings is not None:
            return entry.findings
        try:
            with api.open(entry.path) as trace:
                analysis = trace.analysis(rules or None)
        except TracekitError as e:
            raise ToolError(str(e), "explain_rule or `tracekit rules` lists the rules") from None
        out = [f.as_dict() for f in analysis.findings]
        if not rules:
            entry.findings, entry.notes = out, [n.as_dict() for n in analysis.notes]
        return out

    def find(self, finding_id: str, handle: str | None) -> tuple[Database, dict]:
        entries = [self.get(handle)] if handle else list(reversed(self.databases.values()))
        if not entries:
            raise ToolError("no trace database in this session yet", "call ingest or analyze first")
        for entry in entries:
            for f in self.analyze(entry):
                if f["id"] == finding_id:
                    return entry, f
        raise ToolError(f"no finding {finding_id!r}", "analyze lists the finding ids (record_id, examples)")
