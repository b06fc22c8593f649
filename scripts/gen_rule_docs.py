"""Write docs/rules.md from the rules' docstrings and a real finding of each (`make docs`).

Every rule's page has one form: the code/name/status line, what it does, why it matters, example,
options (the docstring), the options table, then the evidence query and the finding the rule gives
on the real input its module names (`Example`), so the example cannot drift: tests fail when this
file is stale. Where the defaults report nothing on any bundled input, the rule names the options
that show its nearest real output, and the page says so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tracekit.engine.registry import Rule, all_rules

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "rules.md"
MATRICES = ROOT / "tests" / "data"
CORPUS = Path(os.environ.get("TRACEKIT_CORPUS", ROOT.parent / "shared" / "corpus"))
CORPUS_PREFIX = "corpus/"

# Fields of the example finding shown in the docs (the full record is in docs/findings.md).
SHOWN = (
    "id",
    "severity",
    "title",
    "locality",
    "observed",
    "expected",
    "impact",
    "hypothesis",
    "next_experiment",
    "acceptance",
)


class MissingInput(Exception):
    """An example input is not on this machine (the corpus lives outside the repository)."""


def _path(name: str) -> Path:
    path = (
        CORPUS / name.removeprefix(CORPUS_PREFIX) if name.startswith(CORPUS_PREFIX) else ROOT / "sample_traces" / name
    )
    if not path.exists():
        raise MissingInput(f"example input {name} not found at {path}")
    return path


def _shown_name(name: str) -> str:
    return name if name.startswith(CORPUS_PREFIX) else f"sample_traces/{name}"


def example(rule: Rule) -> dict | None:
    """The top finding of the rule on its example input, with the example's options; None when it reports nothing."""
    import tracekit

    params = {rule.code: rule.example.params} if rule.example.params else None
    with tracekit.open(*[_path(n) for n in rule.example.inputs]) as trace:
        findings = trace.finding_records([rule.code], params)  # ranked, as in the report
    if not findings:
        return None
    top = findings[0]
    top["locality"] = {k: v for k, v in top["locality"].items() if k != "run_id"}
    return top


def _example_section(rule: Rule) -> list[str]:
    ex = rule.example
    inputs = ", ".join(f"`{_shown_name(n)}`" for n in ex.inputs)
    options = ", ".join(f"`{k}={v!r}`" for k, v in ex.params.items())
    found = example(rule)
    if found is None:
        return [
            "### Example finding",
            "",
            f"None: {rule.code} reports nothing on any bundled input ({ex.note}). Its output on {inputs}"
            + (f" with {options}" if options else "")
            + " is empty.",
        ]
    parts = []
    if ex.params:
        parts += [
            f"The defaults report nothing on any bundled input ({ex.note}); the nearest real output, with {options}:",
            "",
        ]
    shown = {k: found[k] for k in SHOWN}
    return [
        "### Evidence query (run with `tracekit sql DB QUERY -p name value` for each parameter)",
        "",
        "```sql",
        found["evidence"]["sql"],
        "```",
        "",
        f"### Example finding (from {inputs})",
        "",
        *parts,
        "```json",
        json.dumps(shown, indent=2, default=str),
        "```",
        "",
        f"Evidence parameters: `{json.dumps(found['evidence']['params'], default=str)}`",
    ]


def _sweep():
    sys.path.insert(0, str(ROOT))
    from tests import test_corpus_sweep

    return test_corpus_sweep


def _sweep_intro() -> list[str]:
    """What every rule is checked on: the corpus sweep's inputs, said once."""
    sweep = _sweep()
    names = sweep.inputs()
    _, errors = sweep.load_expectations()
    ascend = sum(n.startswith(CORPUS_PREFIX + "ascend/") for n in names)
    public = sum(n.startswith(CORPUS_PREFIX) for n in names) - ascend
    return [
        "Every rule runs with its defaults over the corpus sweep (`tests/test_corpus_sweep.py`): "
        f"{len(names)} inputs, {public} public traces and reports of other people's workloads in ../shared/corpus "
        "(training and inference; Kineto, Nsight Systems, Perfetto, Nsight Compute, serving logs), "
        f"{ascend} Ascend outputs there and {len(names) - public - ascend} of the project's own runs in "
        f"sample_traces/ ({len(errors)} of them end in the error their row names). Each warning or critical "
        "finding must match a reviewed row of `tests/data/corpus_expectations.md`, which says why it is true; "
        'any other one fails the suite. A rule\'s "Held to by the suite" lists where it fires and the device-made '
        "variation matrices its tests hold it to.",
        "",
    ]


def _sweep_lines(rule: Rule) -> list[str]:
    """Where the corpus sweep expects the rule's warning/critical findings (every other input: none)."""
    sweep = _sweep()
    names = sweep.inputs()
    expected, _ = sweep.load_expectations()
    mine = [e for e in expected if e.rule == rule.code]
    if not mine:
        return [f"- Corpus sweep: no warning or critical finding on any of the {len(names)} inputs."]
    found = "; ".join(f"`{e.input}` ({e.severity})" for e in mine)
    quiet = len(names) - len({e.input for e in mine})
    return [f"- Corpus sweep: warning/critical on {found}; none on the other {quiet} inputs."]


def _values(cells: list, key: str) -> str:
    values = {c.get(key) for c in cells}
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return "/".join(str(v) for v in sorted(values, key=(lambda v: v) if numeric else str))


def _matrix_lines(rule: Rule) -> list[str]:
    """The device-made variation matrices whose cells.json names the rule, with their dimensions."""
    out = []
    for cells_file in sorted(MATRICES.glob("*/cells.json")):
        doc = json.loads(cells_file.read_text())
        if rule.code not in doc.get("rules", ()):
            continue
        folder = cells_file.parent.relative_to(ROOT)
        tests = sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if cells_file.parent.name in p.read_text())
        made = f"`{doc['command'].split()[1]}`" + (f" on an {doc['device']}" if doc.get("device") else "")
        if "cells" in doc:
            cells = doc["cells"]
            dims = " x ".join(f"{d} {_values(cells, d)}" for d in doc.get("dimensions", ()))
            devices = sorted({c["device"] for c in cells if c.get("device")})
            made += f" on an {devices[0]}" if devices and not doc.get("device") else ""
            verdicts = {}
            for c in cells:
                key = c.get("expected", "overlap pays" if c.get("overlap_pays") else "overlap loses"
                            if "overlap_pays" in c else None)  # fmt: skip
                if key is not None:
                    verdicts[key] = verdicts.get(key, 0) + 1
            told = ", ".join(f"{v} {k}" for k, v in sorted(verdicts.items()))
            out.append(f"- `{folder}` ({len(cells)} cells made by {made}{_tested_by(tests)}): {dims}"
                       + (f"; expected verdicts: {told}." if told else "."))  # fmt: skip
        else:
            reports = doc.get("reports", {})
            desc = "; ".join(
                f"`{name}` (conditions {', '.join(r['conditions'])}; TF32 signature "
                f"{'expected' if r.get('tf32_signature') else 'absent'})"
                for name, r in reports.items()
            )
            out.append(f"- `{folder}` ({len(reports)} reports made by {made}{_tested_by(tests)}): {desc}.")
    return out


def _tested_by(tests: list[str]) -> str:
    return f"; {', '.join(tests)}" if tests else ""


def _checked_on_section(rule: Rule) -> list[str]:
    return ["### Held to by the suite", "", *_sweep_lines(rule), *_matrix_lines(rule)]


def render() -> str:
    parts = [
        "# Rules",
        "",
        "Generated by `make docs` from each rule module's docstring and a real finding; do not edit by hand.",
        "",
        *_sweep_intro(),
    ]
    for r in all_rules():
        parts += [
            f"## {r.code} {r.name}",
            "",
            f"*{r.title}* ({r.category}; {r.status} since {r.since}; needs {', '.join(r.requires)}; "
            f"`rules/{r.module.rsplit('.', 1)[1]}.py`)",
            "",
        ]
        parts += ["#" + line if line.startswith("##") else line for line in r.doc.splitlines()]
        parts += ["", "| option | default | unit | meaning |", "|---|---|---|---|"]
        parts += [f"| `{k}` | {p.default!r} | {p.unit} | {p.help} |" for k, p in r.params.items()]
        parts += ["", *_checked_on_section(r), "", *_example_section(r), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    try:
        text = render()
    except MissingInput as e:
        sys.exit(f"cannot render docs/rules.md: {e} (set TRACEKIT_CORPUS)")
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == text else "docs/rules.md is stale: run `make docs`")
    OUT.write_text(text)
