"""What reaches the terminal besides a verb's output: status lines, progress and timings, by verbosity.

Default: the output asked for, a progress bar while ingesting (when stderr is a terminal) and a
status line for what was written to a file. -q: the output and errors only. -v: also one line per
step on stderr (each input ingested, the rules, the report) with its time.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path

import click

from tracekit.cli.options import verbosity


def status(message: str) -> None:
    """A line saying what was done (e.g. the file written); not with -q."""
    if verbosity() >= 0:
        click.echo(message)


def detail(message: str) -> None:
    """A progress or timing line on stderr, with -v only."""
    if verbosity() > 0:
        click.echo(message, err=True)


@contextmanager
def timed(what: str):
    """With -v, say how long the block took: `rules: 0.42 s`."""
    from tracekit.units import duration

    started = time.perf_counter()
    yield
    detail(f"{what}: {duration((time.perf_counter() - started) * 1e9)}")


def rule_timings(timings: dict[str, float]) -> None:
    """With -v, each rule's share of the rule run, slowest first: where analyze time goes."""
    if verbosity() <= 0 or not timings:
        return
    from tracekit.engine.registry import get_rule
    from tracekit.units import duration

    total = sum(timings.values()) or 1.0
    for key, seconds in sorted(timings.items(), key=lambda kv: -kv[1]):
        try:
            label = f"{key} {get_rule(key).name}"
        except KeyError:  # the shared views and the data-quality checks are no rule
            label = key
        detail(f"  {label}: {duration(seconds * 1e9)} ({seconds / total:.0%})")


@contextmanager
def output(path: Path | None):
    """The stream a verb writes its output to: the -o file, else stdout."""
    if path is None:
        yield sys.stdout
        return
    with path.open("w", encoding="utf-8") as f:
        yield f
    status(f"{path}: written")


@contextmanager
def ingest_progress(total: int):
    """A progress callback for ingest: a bar on stderr (a terminal, not -q), or lines with -v."""
    if verbosity() > 0:
        yield lambda message: detail(message)
        return
    if verbosity() < 0 or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )  # fmt: skip
    task = bar.add_task("ingesting", total=total)
    done = {"n": -1}

    def update(message: str) -> None:
        done["n"] += 1  # a message announces the next file, so the previous one is done
        bar.update(task, description=message, completed=done["n"])

    bar.start()
    try:
        yield update
    finally:
        bar.stop()


def open_inputs(inputs, shifted: bool = True, into=None, **options):
    """tracekit.open (or `into.add`: more inputs into that Trace's database) with the verb's progress
    display and, when `shifted`, the clock shifts of its --offset specs; -v lists each input."""
    from tracekit import api
    from tracekit.cli.options import offsets
    from tracekit.units import duration

    shifts = offsets() if shifted else ()
    with ingest_progress(len(inputs)) as progress:
        if into is None:
            trace = api.open(*inputs, offsets=shifts, progress=progress, **options)
        else:
            trace = into.add(*inputs, offsets=shifts, progress=progress, **options)
    for r in trace.ingested:
        detail(f"ingested {r.source}: {r.events_ingested} events ({r.events_skipped} skipped) "
               f"in {duration(r.seconds * 1e9)}")  # fmt: skip
    if verbosity() >= 0:
        for d in trace.duplicates:
            click.echo(f"note: {d.describe()}", err=True)
    return trace
