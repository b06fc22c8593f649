"""`tracekit ingest`: inputs into a database file; one row per input file read."""

from __future__ import annotations

import click

from tracekit.cli.options import CONTEXT, INPUT, metric_option, offset_option, output_options, rank_option


@click.command("ingest", context_settings=CONTEXT)
@click.argument("traces", nargs=-1, required=True, type=INPUT)
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="DuckDB file to create or add to.")
@click.option(
    "--lake", "lake_path", type=click.Path(file_okay=False),
    help="Trace lake folder to create or add to: Parquet per run and a catalog.duckdb (docs/lake.md).",
)  # fmt: skip
@rank_option
@click.option("--label", "labels", multiple=True, help="Run label, once per run (default: file name).")
@metric_option
@offset_option
@click.option(
    "--replace", is_flag=True,
    help="Ingest a trace the database holds already (same content) again, in place of its old runs.",
)  # fmt: skip
@output_options()
def command(traces, db_path, lake_path, rank, labels, metrics, replace, fmt):
    """Load traces (files, or folders a profiler wrote) into a database or a trace lake; prints
    events read = ingested + skipped per file.

    \b
        tracekit ingest rank0.json.gz rank1.json.gz --db run.duckdb
        tracekit ingest ranks/ --lake job.lake
    """
    from tracekit.cli.console import open_inputs
    from tracekit.errors import TracekitError
    from tracekit.render.tables import emit_rows
    from tracekit.units import duration

    if (db_path is None) == (lake_path is None):
        raise TracekitError("name where the inputs go: --db FILE or --lake DIR (one of them)")
    if lake_path is not None:
        if replace:
            raise TracekitError("--replace works with --db; a lake skips a trace it holds already")
        results = _into_lake(traces, lake_path, rank=rank, labels=list(labels) or None, metrics=metrics)
    else:
        with open_inputs(
            traces,
            db=db_path,
            rank=rank,
            labels=list(labels) or None,
            metrics=metrics,
            same_content="replace" if replace else "skip",
        ) as trace:
            results = trace.ingested
    structured = fmt in ("json", "jsonl")
    cols = ["run_id", "source", "rank", "events_read", "events_ingested", "events_skipped", "skipped_reasons",
            "alignment", "seconds"]  # fmt: skip
    rows = [
        (
            r.run_id, r.source, r.rank, r.events_read, r.events_ingested, r.events_skipped,
            r.skipped_reasons if structured else ", ".join(f"{k}: {v}" for k, v in r.skipped_reasons.items()),
            r.alignment if structured else _alignment_text(r.alignment),
            round(r.seconds, 3),
        )
        for r in results
    ]  # fmt: skip
    emit_rows(cols, rows, fmt, text={"seconds": lambda s: duration(s * 1e9)})


def _alignment_text(alignment: dict | None) -> str:
    from tracekit.units import duration

    if not alignment:
        return ""
    offset = alignment.get("applied_offset_ns", 0)
    method = alignment.get("method") or ("shared events" if alignment.get("pairs") else "none")
    return f"{'+' if offset >= 0 else ''}{duration(offset)} ({method})"


def _into_lake(traces, lake_path, **options) -> list:
    import click

    from tracekit import api
    from tracekit.cli.console import detail, ingest_progress
    from tracekit.cli.options import offsets, verbosity
    from tracekit.units import duration

    with ingest_progress(len(traces)) as progress:
        done = api.ingest_lake(lake_path, *traces, offsets=offsets(), progress=progress, **options)
    for r in done.ingested:
        detail(f"ingested {r.source}: {r.events_ingested} events ({r.events_skipped} skipped) "
               f"in {duration(r.seconds * 1e9)}")  # fmt: skip
    if verbosity() >= 0:
        for d in done.duplicates:
            line = d.describe().replace("in this database", "in this lake").replace(" (--replace ingests it anew)", "")
            click.echo(f"note: {line}", err=True)
    return done.ingested
