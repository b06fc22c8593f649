"""The `tracekit` group: every verb, one module each; errors as one line and an exit code.

Verb modules import click only at module level (heavy modules inside the commands), so
`tracekit --help` stays fast. Exit codes: 0 ok, 1 a finding at or above --fail-on or a failed
--accept, 2 bad input or usage (one line, no traceback), 130 interrupted.
"""

from __future__ import annotations

import click

from tracekit.cli import agent, analyze, annotate, diff, ingest, mcp, report, rules, schema, sql, tools
from tracekit.cli.options import CONTEXT, verbosity_options
from tracekit.errors import TracekitError, out_of_space


class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TracekitError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except Exception as e:
            full = out_of_space(e)  # a write anywhere (database, report, temporary files) found no room
            if full is None:
                raise
            click.echo(f"error: {full}", err=True)
            ctx.exit(full.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(package_name="tracekit")
@verbosity_options
def cli():
    """Profiler traces in, attributable performance findings out.

    \b
        tracekit analyze run.pt.trace.json.gz
        tracekit ingest rank*.json.gz --db run.duckdb
        tracekit sql run.duckdb "SELECT name, sum(dur_ns) FROM kernels GROUP BY 1 ORDER BY 2 DESC LIMIT 5"

    Shell completion: eval "$(_TRACEKIT_COMPLETE=bash_source tracekit)" (zsh_source, fish_source).
    """


for verb in (ingest, sql, analyze, diff, rules, schema, report, annotate, tools, mcp, agent):
    cli.add_command(verb.command)


def main():
    cli(prog_name="tracekit")
