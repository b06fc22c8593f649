"""The `tracekit` command line: verbs over one trace database, all through the Python API."""

from tracekit.cli.app import cli, main

__all__ = ["cli", "main"]
