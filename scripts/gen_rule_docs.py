"""Write docs/rules.md from the rules' docstrings (`make docs`); tests fail when it is stale."""

from __future__ import annotations

import sys
from pathlib import Path

from tracekit.rules_api import all_rules

OUT = Path(__file__).resolve().parent.parent / "docs" / "rules.md"


def render() -> str:
    parts = ["# Rules", "", "Generated from each rule module's docstring by `make docs`; do not edit by hand.", ""]
    for r in all_rules():
        parts += [
            f"## {r.code} {r.name}",
            "",
            f"*{r.title}* ({r.category}; {r.status} since {r.since}; needs {', '.join(r.requires)})",
            "",
        ]
        parts += ["#" + line if line.startswith("##") else line for line in r.doc.splitlines()]
        parts += ["", "| option | default | unit | meaning |", "|---|---|---|---|"]
        parts += [f"| `{k}` | {p.default!r} | {p.unit} | {p.help} |" for k, p in r.params.items()]
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == render() else "docs/rules.md is stale: run `make docs`")
    OUT.write_text(render())
