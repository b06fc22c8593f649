"""`tracekit sql`: one query against a trace database, rows in any row format."""

from __future__ import annotations

import sys

import click

from tracekit.cli.options import CONTEXT, coerce, output_options


@click.command("sql", context_settings=CONTEXT)
@click.argument("db_path", type=click.Path())
@click.argument("query")
@click.option("-p", "--param", "params", multiple=True, nargs=2, help="Named parameter: -p run_id 1 binds $run_id.")
@output_options(output=True)
def command(db_path, query, params, fmt, output):
    """Run SQL against a trace database or lake, read-only ("-" reads the query from stdin).

    \b
        tracekit sql run.duckdb "SELECT kind, count(*) FROM events GROUP BY 1" -f json
    """
    import duckdb

    from tracekit import api
    from tracekit.cli.console import output as output_stream
    from tracekit.errors import TracekitError
    from tracekit.render.tables import emit_rows

    if query == "-":
        query = sys.stdin.read()
    with api.open(db=db_path, read_only=True) as trace:
        relation = trace.sql(query, **{k: coerce(v) for k, v in params})
        try:
            columns = list(relation.columns) if relation is not None else []
            rows = relation.fetchall() if relation is not None else []
        except duckdb.Error as e:
            raise TracekitError(f"query failed: {' '.join(str(e).split())}") from None
    with output_stream(output) as out:
        emit_rows(columns, rows, fmt, out)
