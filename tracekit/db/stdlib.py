"""The SQL stdlib: the tables, views and macros of tracekit/db/views/*.sql, and their inline docs.

Files load in name order. The doc form is Perfetto's: the `--` block directly above a `CREATE`
documents the relation (its first paragraph becomes the DuckDB COMMENT, the whole block goes to
docs/schema.md), and the `--` lines directly above a column name inside the column list document
that column. A file's leading block, separated from the first statement by a blank line, is the
prose of its section in docs/schema.md. `@internal` in a block keeps a relation out of the public
lists. `{DEVICE_KINDS}` in the SQL is filled from tracekit.db.schema, the list readers use.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from tracekit.db.schema import DEVICE_KINDS

_CREATE = re.compile(
    r"^CREATE\s+(?:OR\s+REPLACE\s+)?(TABLE|VIEW|MACRO)\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s*(\(.*)?$", re.IGNORECASE
)
_COLUMN = re.compile(r"^\s*(\w+)")
_INTERNAL = "@internal"


@dataclass(frozen=True)
class Column:
    name: str
    doc: str


@dataclass(frozen=True)
class Relation:
    name: str
    kind: str  # "table", "view", "macro" or "table macro"
    doc: str  # the whole doc block, paragraphs separated by blank lines
    columns: tuple[Column, ...]
    params: tuple[str, ...]  # a macro's parameters
    internal: bool
    file: str

    @property
    def comment(self) -> str:
        """The first paragraph: what DuckDB's comment (and describe_schema) shows."""
        return self.doc.split("\n\n", 1)[0].replace("\n", " ")


@dataclass(frozen=True)
class SqlFile:
    name: str
    header: str
    sql: str
    relations: tuple[Relation, ...]


def _text(block: list[str]) -> str:
    """Comment lines -> text: lines of a paragraph keep their breaks (code blocks survive), blank
    comment lines separate paragraphs."""
    return "\n".join(block).strip()


def _strip(line: str) -> str:
    body = line.strip()[2:]
    return body[1:] if body.startswith(" ") else body


def parse(name: str, sql: str) -> SqlFile:
    lines = sql.splitlines()
    header: list[str] = []
    i = 0
    block: list[str] = []
    while i < len(lines) and lines[i].strip().startswith("--"):
        block.append(_strip(lines[i]))
        i += 1
    if i < len(lines) and not lines[i].strip():
        header, block = block, []
    relations = []
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if stripped.startswith("--"):
            block.append(_strip(line))
            continue
        m = _CREATE.match(stripped)
        if not m:
            block = []
            continue
        kind, rel, rest = m.group(1).lower(), m.group(2), m.group(3) or ""
        doc_lines = [b for b in block if b.strip() != _INTERNAL]
        internal = len(doc_lines) != len(block)
        block = []
        columns: list[Column] = []
        params: tuple[str, ...] = ()
        if kind == "macro":
            params = tuple(p.strip() for p in rest[1 : rest.index(")")].split(",") if p.strip())
            kind = "table macro" if re.search(r"\)\s*AS\s+TABLE\b", rest, re.IGNORECASE) else "macro"
        elif rest.strip() == "(":
            col_doc: list[str] = []
            while i < len(lines) and not lines[i].strip().startswith(")"):
                item = lines[i].strip()
                i += 1
                if item.startswith("--"):
                    col_doc.append(_strip(item))
                elif item:
                    columns.append(Column(_COLUMN.match(item).group(1), " ".join(col_doc).strip()))
                    col_doc = []
        relations.append(Relation(rel, kind, _text(doc_lines), tuple(columns), params, internal, name))
    return SqlFile(name, _text(header), sql.replace("{DEVICE_KINDS}", ", ".join(f"'{k}'" for k in DEVICE_KINDS)),
                   tuple(relations))  # fmt: skip


@cache
def files() -> tuple[SqlFile, ...]:
    folder = resources.files("tracekit.db").joinpath("views")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return tuple(parse(n, folder.joinpath(n).read_text()) for n in names)


def relations() -> tuple[Relation, ...]:
    return tuple(r for f in files() for r in f.relations)


def public(kind: str) -> tuple[str, ...]:
    """Names of the public relations of one kind (`table`, `view`, `macro`, `table macro`), in file order."""
    return tuple(r.name for r in relations() if r.kind == kind and not r.internal)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def comments_sql() -> str:
    """COMMENT ON statements for every documented relation and column (CREATE OR REPLACE drops them)."""
    out = []
    for r in relations():
        target = {"table": "TABLE", "view": "VIEW", "macro": "MACRO", "table macro": "MACRO TABLE"}[r.kind]
        if r.doc:
            out.append(f"COMMENT ON {target} {r.name} IS {_quote(r.comment)};")
        for c in r.columns:
            if c.doc:
                out.append(f"COMMENT ON COLUMN {r.name}.{c.name} IS {_quote(c.doc)};")
    return "\n".join(out)


@cache
def install_script(comments: bool = True) -> str:
    """Every file's SQL in order, then (with `comments`) the comments: what a database needs to hold the stdlib.

    Views are created unbound where DuckDB can (`WITH (DEFER_BINDING)`, DuckDB 2): binding the views
    that expand the busy and step macros costs more than the rest of the schema, and a view is bound
    when a query first reads it anyway."""
    sql = "\n".join(f.sql for f in files())
    if _defer_binding_supported():
        sql = re.sub(r"(?m)^\) AS$", ") WITH (DEFER_BINDING) AS", sql)
    return sql + ("\n" + comments_sql() if comments else "")


@cache
def _defer_binding_supported() -> bool:
    import duckdb

    try:
        duckdb.connect().execute("CREATE VIEW probe WITH (DEFER_BINDING) AS SELECT 1")
    except duckdb.Error:
        return False
    return True


@cache
def digest() -> str:
    """Names the stdlib's version: a database holding this digest needs no DDL.

    Hashed from what the install script is made of (the SQL files, this module, the device kinds
    and the DuckDB version that decides DEFER_BINDING), not from the script itself: opening an
    up-to-date database then costs neither the parse of every file nor a probe connection."""
    import duckdb

    h = hashlib.sha256()
    folder = resources.files("tracekit.db").joinpath("views")
    for name in sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql")):
        h.update(name.encode() + b"\0" + folder.joinpath(name).read_bytes() + b"\0")
    h.update(Path(__file__).read_bytes())
    h.update(repr((DEVICE_KINDS, duckdb.__version__)).encode())
    return h.hexdigest()[:16]
