"""Agent-facing commands (issue 5): tools, mcp, agent."""

from __future__ import annotations


def register(cli, group_cls, context) -> None:
    """Add this module's commands to the top-level click group."""
