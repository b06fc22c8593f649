"""Options the verbs share, declared once: output format and file, verbosity, inputs, rules.

Format names are the same wherever they apply: rows print as table, csv, tsv, json or jsonl;
documents (reports, diffs) as text, json or markdown.
"""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.errors import TracekitError
from tracekit.render.tables import ROW_FORMATS

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_VERBOSITY = "tracekit.verbosity"

# Inputs: files, or folders a profiler wrote (ingest looks inside); a missing path is ingest's one-line error.
INPUT = click.Path(path_type=Path)
OUTPUT = click.Path(dir_okay=False, writable=True, path_type=Path)


def _verbosity(level: int):
    def remember(ctx, _param, value):
        if value:
            ctx.meta[_VERBOSITY] = level
        return value

    return remember


def verbosity_options(f):
    """-q/--quiet and -v/--verbose, on the group and on every verb (`tracekit -q analyze` = `analyze -q`)."""
    f = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_verbosity(1),
                     help="Progress and timings on stderr.")(f)  # fmt: skip
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_verbosity(-1),
                        help="No progress or status lines: only the output asked for, and errors.")(f)  # fmt: skip


def verbosity() -> int:
    """-1 quiet, 0 default, 1 verbose."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_VERBOSITY, 0) if ctx else 0


def output_options(formats=ROW_FORMATS, default: str | None = None, output: bool = False, help: str | None = None):
    """The shared output options: -f/--format from `formats`, -o/--output FILE when the verb writes a
    document (default stdout), and the verbosity flags."""

    def decorate(f):
        if output:
            f = click.option("-o", "--output", type=OUTPUT, help="Write the output to FILE instead of stdout.")(f)
        f = click.option("-f", "--format", "fmt", type=click.Choice(formats), default=default or formats[0],
                         show_default=True, help=help)(f)  # fmt: skip
        return verbosity_options(f)

    return decorate


def root_option(f):
    """--root DIR (repeatable): the folders whose files the agent tools may read (default: the working directory)."""
    return click.option(
        "--root",
        "roots",
        multiple=True,
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="A folder the tools may read traces from (repeatable; default: the working directory). "
        "Paths outside every root are refused, symlinks resolved.",
    )(f)


def _keep_offsets(ctx, _param, value):
    ctx.meta["tracekit.offsets"] = value
    return value


# expose_value=False: the specs reach the verb through the click context, not every signature
offset_option = click.option(
    "--offset", "offsets", multiple=True, metavar="FILE=DURATION", expose_value=False, callback=_keep_offsets,
    help="Shift one input onto the run's clock (e.g. server.log=-7h, events.jsonl=+250us); overrides the "
    "measured alignment. Repeatable.",
)  # fmt: skip


def offsets() -> tuple[str, ...]:
    return click.get_current_context().meta.get("tracekit.offsets", ())


metric_option = click.option(
    "--metric", "metrics", multiple=True, metavar="COLUMN",
    help="Error column of a numerics report (repeatable; default: every column whose name says error: err, rms, fro, abs).",
)  # fmt: skip
rank_option = click.option("--rank", type=int, help="Rank for traces with none in distributedInfo or the file name.")
rules_option = click.option("--rules", "rule_keys", help="Comma-separated rule codes or names (default: all).")
param_option = click.option(
    "--param", "params", multiple=True, metavar="RULE.NAME=VALUE", help="Override a rule parameter (repeatable)."
)
step_option = click.option("--step", help="With --baseline: annotation that delimits a step (see `tracekit diff`).")

ACCEPT_HELP = (
    "Acceptance criterion METRIC OP VALUE, repeatable; exit 1 when one fails. OP: <= < >= > ==. VALUE: "
    "+5% / -10% (relative change), +2ms / -500us (signed: absolute change), 80ms / 0.9 (unsigned: the "
    "candidate's value); units ns us ms s. Metrics: step_time (mean step), step_p50 (median step), wall "
    "(run window), gpu_busy, gpu_util (0..1), idle (GPU idle per step), launches (GPU activities per step), "
    "kernel:TEXT (GPU time per step of kernels whose name contains TEXT), phase:NAME (prefill/decode time "
    "per run)."
)


def coerce(value: str):
    """A command-line value as int, else float, else the text."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_params(items) -> dict[str, dict]:
    """`--param RULE.NAME=VALUE` items -> {rule: {name: value}}."""
    out: dict[str, dict] = {}
    for item in items:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise TracekitError(f"--param {item!r}: expected RULE.NAME=VALUE, e.g. G001.min_idle_share=0.1")
        key, value = item.split("=", 1)
        rule_key, name = key.split(".", 1)
        out.setdefault(rule_key, {})[name] = coerce(value)
    return out


def check_accepts(accepts) -> None:
    """A bad --accept criterion fails before anything is ingested."""
    from tracekit.compare.diff import parse_accept

    for a in accepts:
        parse_accept(a)


def check_output(out: Path | None, suffixes: tuple[str, ...] = ()) -> None:
    if out is None:
        return
    if suffixes and not out.name.endswith(suffixes):
        raise TracekitError(f"{out}: the output name should end in {' or '.join(suffixes)}")
    if not out.parent.exists():
        raise TracekitError(f"{out}: directory {out.parent} does not exist")


def cluster_options(f):
    """--workers N, --scheduler ADDRESS and --chunk-size N: the map/reduce path over ranks
    (tracekit.cluster, docs/cluster.md) instead of one database of every input."""
    f = click.option(
        "--chunk-size", type=click.IntRange(min=1), default=None,
        help="With --workers/--scheduler: consecutive inputs per chunk (one database on a worker at a time); "
        "default: about two chunks per worker, at most 32 inputs and 64 MiB of inflated trace each "
        "(a larger rank file is a chunk alone).",
    )(f)  # fmt: skip
    f = click.option(
        "--scheduler", metavar="ADDRESS",
        help="Map/reduce over the ranks on an existing Dask cluster (tcp://host:8786); its workers must see the inputs.",
    )(f)  # fmt: skip
    return click.option(
        "--workers", type=click.IntRange(min=0), metavar="N",
        help="Map/reduce over the ranks on a local Dask cluster of N worker processes; 0: the same map/reduce "
        "in this process, without Dask.",
    )(f)  # fmt: skip
