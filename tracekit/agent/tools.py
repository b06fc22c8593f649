"""The agent tools, implemented once: name, description, argument schema, result schema, handler.

`tracekit tools --format openai`, the MCP server (mcp_server.py) and the agent loop (loop.py) are
adapters over `TOOLS` and `call`. Every result is a JSON object that validates against its schema in
schemas.json, carries `truncated` (and a `note` when something was cut), and stays under
MAX_RESULT_CHARS. Failures come back as `{"error", "hint"}` (ToolError), never as an exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from tracekit.agent.session import Session, ToolError
from tracekit.findings.fence import encode

MAX_RESULT_CHARS = 40_000
_STR = {"type": "string"}
_PATHS = {"type": "array", "items": _STR, "minItems": 1}
_DB = {"type": "string", "description": "database handle from list_runs (db1, db2, ...); default: the latest"}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    handler: Callable[..., dict]

    @property
    def result_schema(self) -> dict:
        return result_schemas()[self.name]


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_SCHEMAS: dict | None = None


def result_schemas() -> dict:
    global _SCHEMAS
    if _SCHEMAS is None:
        _SCHEMAS = json.loads(resources.files("tracekit.agent").joinpath("schemas.json").read_text())["tools"]
    return _SCHEMAS


def schema_document() -> dict:
    return json.loads(resources.files("tracekit.agent").joinpath("schemas.json").read_text())


# ------------------------------------------------------------------------------------------ handlers


def _sandbox_rows(entry, sql: str, params: dict | None = None, max_rows: int = 1000) -> list[dict]:
    res = entry.query(sql, max_rows=max_rows, params=params)
    return [dict(zip(res["columns"], r)) for r in res["rows"]]


def list_runs(session: Session, database: str | None = None) -> dict:
    entries = [session.get(database)] if database else session.entries()
    out = []
    for e in entries:
        runs = _sandbox_rows(
            e,
            "SELECT r.run_id, r.label, r.source, r.format, r.rank, r.end_ns - r.start_ns AS window_ns, "
            "l.events_read, l.events_ingested, l.events_skipped "
            "FROM runs r LEFT JOIN ingest_log l ON l.run_id = r.run_id AND l.source = r.source ORDER BY r.run_id",
        )
        out.append(
            {
                "database": e.handle,
                "sources": e.sources,
                "runs": runs,
                "analyzed": e.findings is not None,
                "findings_total": len(e.findings) if e.findings is not None else None,
            }
        )
    latest = session.latest
    return {"latest": latest.handle if latest else None, "databases": out, "truncated": False}


def ingest(session: Session, paths: list[str], labels: list[str] | None = None) -> dict:
    entry, results = session.ingest(paths, labels)
    keep = ("run_id", "source", "format", "rank", "events_read", "events_ingested", "events_skipped", "skipped_reasons")
    return {
        "database": entry.handle,
        "runs": [{k: r[k] for k in keep} for r in results],
        "truncated": False,
    }


def analyze(
    session: Session,
    paths: list[str] | None = None,
    database: str | None = None,
    rules: list[str] | None = None,
    run_id: int | None = None,
    budget_tokens: int = 2000,
) -> dict:
    from tracekit.findings.feedback import build_feedback

    if paths and database:
        raise ToolError("pass either paths or database, not both", "paths ingest a new database; database reuses one")
    if budget_tokens < 200:
        raise ToolError("budget_tokens must be at least 200", "the default 2000 fits the top few records")
    entry = session.ingest(paths)[0] if paths else session.get(database)
    findings = session.analyze(entry, rules)
    if run_id is not None:
        findings = [f for f in findings if f["locality"].get("run_id") == run_id]
    doc = build_feedback(findings, budget_tokens=budget_tokens)
    return {
        "database": entry.handle,
        "feedback": doc,
        "data_quality": entry.notes if not rules else [],
        "truncated": doc["records_omitted"] > 0,
        **({"note": doc["note"]} if doc.get("note") else {}),
    }


def get_finding(session: Session, finding_id: str, database: str | None = None) -> dict:
    from tracekit.agent.sandbox import QueryRefused

    entry, finding = session.find(finding_id, database)
    out = {"database": entry.handle, "finding": finding, "truncated": False}
    try:
        res = entry.query(finding["evidence"]["sql"], max_rows=5, params=finding["evidence"]["params"])
        out["evidence_rows"] = {"columns": res["columns"], "rows": res["rows"]}
    except QueryRefused as e:
        out["note"] = f"evidence SQL not recomputed: {e}"
    return out


def explain_rule(session: Session, rule: str) -> dict:
    from tracekit.engine.registry import all_rules, get_rule

    try:
        r = get_rule(rule)
    except KeyError as e:
        codes = " ".join(known.code for known in all_rules())
        raise ToolError(str(e.args[0]), f"codes: {codes}, or their names") from None
    info = r.describe()
    truncated = len(info["doc"]) > 6000
    if truncated:
        info["doc"] = info["doc"][:6000]
    return {"rule": info, "truncated": truncated, **({"note": "doc cut at 6000 characters"} if truncated else {})}


def query(session: Session, sql: str, database: str | None = None, max_rows: int = 50) -> dict:
    from tracekit.agent.sandbox import QueryRefused

    entry = session.get(database)
    if not 1 <= max_rows <= 500:
        raise ToolError("max_rows must be between 1 and 500", "aggregate in SQL instead of fetching many rows")
    try:
        res = entry.query(sql, max_rows=max_rows)
    except QueryRefused as e:
        raise ToolError(str(e), e.hint) from None
    res["database"] = entry.handle
    if res["truncated"]:
        res["note"] = f"only the first {max_rows} rows; add ORDER BY/LIMIT or aggregate"
    return res


def describe_schema(session: Session, database: str | None = None, relation: str | None = None) -> dict:
    entry = session.get(database)
    only = "AND table_name = $relation" if relation else ""
    params = {"relation": relation} if relation else None
    objs = _sandbox_rows(
        entry,
        "SELECT * FROM (SELECT table_name, 'table' AS kind, comment FROM duckdb_tables() "
        "WHERE database_name = 'trace' AND schema_name = 'main' AND NOT internal "
        "UNION ALL SELECT view_name, 'view', comment FROM duckdb_views() "
        f"WHERE database_name = 'trace' AND schema_name = 'main' AND NOT internal) WHERE true {only} ORDER BY 2, 1",
        params,
    )
    if relation and not objs:
        raise ToolError(f"no table or view {relation!r}", "describe_schema without `relation` lists them")
    cols = _sandbox_rows(
        entry,
        "SELECT table_name, column_name, data_type, comment FROM duckdb_columns() "
        f"WHERE database_name = 'trace' AND schema_name = 'main' {only} ORDER BY table_name, column_index",
        params,
        max_rows=5000,
    )
    by_table: dict[str, list] = {}
    for c in cols:
        item = {"name": c["column_name"], "type": c["data_type"]}
        if c["comment"]:
            item["comment"] = c["comment"]
        by_table.setdefault(c["table_name"], []).append(item)
    relations = []
    for o in objs:
        item = {"name": o["table_name"], "kind": o["kind"], "columns": by_table.get(o["table_name"], [])}
        if o["comment"]:
            item["comment"] = o["comment"]
        relations.append(item)
    result = {
        "database": entry.handle,
        "relations": relations,
        "units": "times and durations are integer nanoseconds (columns ending in _ns)",
        "docs": "docs/schema.md",
        "truncated": False,
    }
    if len(encode(result)) > MAX_RESULT_CHARS:
        # every relation stays listed; the column texts of all of them together do not fit
        for item in relations:
            for c in item["columns"]:
                c.pop("comment", None)
        result["note"] = "column descriptions left out to fit; describe_schema with `relation` gives one relation's"
        if len(encode(result)) > MAX_RESULT_CHARS:  # still too long: each relation's text cut to its first sentence
            for item in relations:
                if "comment" in item:
                    item["comment"] = item["comment"].split(". ")[0][:160]
            result["note"] = (
                "column descriptions left out and relation descriptions cut to fit; describe_schema "
                "with `relation` gives one relation's"
            )
    return result


def diff(
    session: Session,
    baseline: list[str],
    candidate: list[str],
    step: str | None = None,
    accept: list[str] | None = None,
    top: int = 8,
) -> dict:
    from tracekit import api
    from tracekit.compare.diff import parse_accept

    for a in accept or []:
        try:
            parse_accept(a)
        except Exception as e:
            raise ToolError(str(e), 'an acceptance criterion reads METRIC OP VALUE, e.g. "step_time <= +5%"') from None

    def fill(path):
        # one database holds both sides (run labels baseline/... and candidate/...), as `tracekit diff` builds it
        with api.open(*baseline, db=path, labels=api.side_labels("baseline", baseline)) as base:
            cand = base.add(*candidate, labels=api.side_labels("candidate", candidate), same_content="keep")
            doc = cand.diff(base, step=step, accept=list(accept or ()), top=top)
            status = cand.status(base, step=step)
            every = base.select()
            return doc, status, base.runs, cand.runs, every.finding_records(), every.analysis().notes

    entry, (doc, status, base_runs, cand_runs, findings, notes) = session.build([*baseline, *candidate], fill)
    entry.notes = [n.as_dict() for n in notes]  # before findings, which tell other calls that both are set
    entry.findings = findings
    noise = {k: v for k, v in doc["noise"].items() if k != "phases"}
    phases = {p: {k: v for k, v in d.items() if k != "contributors"} for p, d in doc["delta"]["phases"].items()}
    return {
        "database": entry.handle,
        "baseline_run_ids": base_runs,
        "candidate_run_ids": cand_runs,
        "steps": {k: doc["steps"][k] for k in ("name", "source", "comparable", "comparability")},
        "delta": {"end_to_end": doc["delta"]["end_to_end"], "step": doc["delta"]["step"], "phases": phases},
        "contributors": doc["contributors"][:top],
        "unexplained_ns": doc["unexplained_ns"],
        "noise": noise,
        "acceptance": doc["acceptance"],
        "passed": doc["passed"],
        "finding_status": status,
        "truncated": False,
    }


# ------------------------------------------------------------------------------------------ registry

TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "list_runs",
            "List the trace databases of this session (handles db1, db2, ...) and their runs: run id, label, "
            "source file, rank, window and events ingested/skipped.",
            _object({"database": _DB}),
            list_runs,
        ),
        Tool(
            "ingest",
            "Load trace files (PyTorch/Kineto or any Chrome trace JSON, Nsight Systems SQLite or nsys stats CSV, "
            "Perfetto protobuf, Nsight Compute CSV, runtime-event JSONL, SGLang/vLLM server logs, OTLP/JSON spans, "
            "serving benchmark JSON; recognised by content) into a new session database; a log given after a trace "
            "joins its run. Paths must lie under the folders the server may read (its --root). Returns the "
            "handle and per-file event counts.",
            _object({"paths": _PATHS, "labels": {"type": "array", "items": _STR}}, ("paths",)),
            ingest,
        ),
        Tool(
            "analyze",
            "Run the rules and return ranked, deduplicated feedback records within a token budget. Pass `paths` "
            "to ingest traces first, or `database` to reuse one (default: the latest). Each record has a "
            "drill_down.finding_id for get_finding.",
            _object(
                {
                    "paths": _PATHS,
                    "database": _DB,
                    "rules": {"type": "array", "items": _STR, "description": "rule codes or names; default all"},
                    "run_id": {"type": "integer", "description": "only findings of this run"},
                    "budget_tokens": {"type": "integer", "minimum": 200, "default": 2000},
                }
            ),
            analyze,
        ),
        Tool(
            "get_finding",
            "The full finding record for an id (locality, observed/expected, impact, evidence SQL, hypothesis, "
            "next experiment, acceptance) plus the evidence SQL re-run on the database.",
            _object(
                {"finding_id": {"type": "string", "pattern": "^[A-Z]+[0-9]+-[0-9a-f]{12}$"}, "database": _DB},
                ("finding_id",),
            ),  # fmt: skip
            get_finding,
        ),
        Tool(
            "explain_rule",
            "A rule's documentation: what it finds, why it matters, its parameters and the tables it needs.",
            _object({"rule": {"type": "string", "description": "code (G001) or name (gpu-idle)"}}, ("rule",)),
            explain_rule,
        ),
        Tool(
            "query",
            "Run one read-only SQL SELECT (DuckDB dialect) on a trace database. No writes, files, network, "
            "extensions or ATTACH; at most max_rows rows, 10 s. Times are integer ns. See describe_schema.",
            _object(
                {
                    "sql": {"type": "string"},
                    "database": _DB,
                    "max_rows": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                },
                ("sql",),
            ),
            query,
        ),
        Tool(
            "describe_schema",
            "Tables and views of a trace database with their columns, types and descriptions (for all of them "
            "together the column descriptions do not fit: pass `relation` for one relation's).",
            _object({"database": _DB, "relation": {"type": "string", "description": "one table or view"}}),
            describe_schema,
        ),
        Tool(
            "diff",
            "Compare baseline traces with candidate traces (e.g. a re-run after a change): time delta per step "
            "and phase, its contributors, noise, acceptance criteria, and each finding's status (new, fixed, "
            "improved, regressed, unchanged; not_comparable without a common unit of work) by stable id.",
            _object(
                {
                    "baseline": _PATHS,
                    "candidate": _PATHS,
                    "step": {"type": "string", "description": "annotation that delimits a step"},
                    "accept": {"type": "array", "items": _STR, "description": 'e.g. "step_time <= +5%"'},
                    "top": {"type": "integer", "minimum": 1, "maximum": 30, "default": 8},
                },
                ("baseline", "candidate"),
            ),
            diff,
        ),
    )
}


def call(session: Session, name: str, arguments: dict | None) -> tuple[dict, bool]:
    """(result, is_error). Never raises: a model's bad call is answered with an error and a hint."""
    tool = TOOLS.get(name)
    try:
        if tool is None:
            raise ToolError(f"no tool {name!r}", f"tools: {', '.join(TOOLS)}")
        args = dict(arguments or {})
        _check_args(tool, args)
        return cap(tool.handler(session, **args)), False
    except ToolError as e:
        return {"error": str(e), "hint": e.hint or "see the tool's description"}, True
    except Exception as e:  # a bug or an unexpected input must not end the session
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", "hint": "internal error; try "
                "another call or report it"}, True  # fmt: skip


def openai_tools() -> list[dict]:
    """Chat Completions `tools`: no `strict` (GLM and others strip or reject it)."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in TOOLS.values()
    ]


def _check_args(tool: Tool, args: dict) -> None:
    props = tool.parameters["properties"]
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise ToolError(f"unknown argument(s) {unknown} for {tool.name}", f"arguments: {sorted(props)}")
    missing = [k for k in tool.parameters["required"] if k not in args]
    if missing:
        raise ToolError(f"missing argument(s) {missing} for {tool.name}", f"required: {tool.parameters['required']}")
    for key, value in args.items():
        want = props[key].get("type")
        ok = {
            "string": isinstance(value, str),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "array": isinstance(value, list) and all(isinstance(v, str) for v in value),
        }.get(want, True)
        if not ok:
            raise ToolError(f"argument {key!r} of {tool.name} must be of type {want}", f"got {type(value).__name__}")


def cap(result: dict, max_chars: int = MAX_RESULT_CHARS) -> dict:
    """Halve the longest list until the encoded result fits; say so in `truncated` and `note`."""
    cut = 0
    while len(encode(result)) > max_chars:
        found = _longest_list(result)
        if found is None or len(found) <= 1:
            break
        del found[len(found) // 2 :]
        cut += 1
    if cut:
        result["truncated"] = True
        note = f"result cut to about {max_chars} characters by halving its longest lists {cut} time(s)"
        result["note"] = f"{result['note']}; {note}" if result.get("note") else note
    return result


def _longest_list(value):
    best, best_len = None, 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            size = len(encode(v))
            if size > best_len and len(v) > 1:
                best, best_len = v, size
            stack.extend(v)
    return best
