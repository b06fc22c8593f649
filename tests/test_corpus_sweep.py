"""Precision guard: every input of ../shared/corpus (and every bundled sample) analysed with the
default rules, its warning/critical findings compared with the reviewed expectations in
tests/data/corpus_expectations.md. An unexpected warning/critical finding fails, and so does an
expected one that is lost: a new false alarm or a lost true finding shows up here, by file.

Inputs are the corpus's top-level files and folders and the entries of its `ascend/` folder (each
a file or a folder input, as a user would pass it), and the files of sample_traces/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import tracekit
from tests.conftest import CORPUS, ROOT, SAMPLES
from tracekit.errors import TracekitError

EXPECTATIONS = ROOT / "tests" / "data" / "corpus_expectations.md"
REPORTED = ("warning", "critical")
NOT_INPUTS = {"PROVENANCE.md", "MANIFEST.json"}


@dataclass(frozen=True)
class Expected:
    input: str
    rule: str
    severity: str
    where: dict
    why: str

    def matches(self, finding: dict) -> bool:
        place = finding["locality"]
        return (
            finding["rule"] == self.rule
            and finding["severity"] == self.severity
            and all(str(place.get(key)) == value for key, value in self.where.items())
        )

    def describe(self) -> str:
        where = " ".join(f"{k}={v}" for k, v in self.where.items())
        return f"{self.rule} {self.severity} {where}".strip()


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _tables(text: str) -> dict[str, list[list[str]]]:
    """The markdown tables of the file, by the heading above them (header and rule rows dropped)."""
    tables: dict[str, list[list[str]]] = {}
    heading, rows = None, None
    for line in text.splitlines():
        if line.startswith("## "):
            heading, rows = line[3:].strip(), None
        elif line.startswith("|") and heading:
            if rows is None:
                rows = tables.setdefault(heading, [])
                continue  # the header row
            if not re.fullmatch(r"[|\s:-]+", line):
                rows.append(_cells(line))
        else:
            rows = None
    return tables


def _where(text: str) -> dict:
    """`rank=1 op=(top level)` -> {"rank": "1", "op": "(top level)"}: a value runs to the next ` key=`."""
    if text.strip() == "-":
        return {}
    return {key: value.strip().strip("`") for key, value in re.findall(r"(\w+)=(.*?)(?=\s+\w+=|$)", text)}


def load_expectations(path: Path = EXPECTATIONS) -> tuple[list[Expected], dict[str, str]]:
    tables = _tables(path.read_text())
    findings = [
        Expected(row[0].strip("`"), row[1], row[2], _where(row[3]), row[4]) for row in tables["Expected findings"]
    ]
    errors = {row[0].strip("`"): row[1].strip("`") for row in tables["Inputs that end in an error"]}
    return findings, errors


def inputs() -> list[str]:
    """Corpus inputs as `corpus/NAME` (`corpus/ascend/NAME`), samples as `sample_traces/NAME`."""
    if not CORPUS.is_dir():
        return []
    found = [f"corpus/{p.name}" for p in CORPUS.iterdir() if p.name not in NOT_INPUTS and p.name != "ascend"]
    found += [f"corpus/ascend/{p.name}" for p in (CORPUS / "ascend").iterdir() if p.name not in NOT_INPUTS]
    found += [f"sample_traces/{p.name}" for p in SAMPLES.iterdir() if p.name not in NOT_INPUTS]
    return sorted(found)


def resolve(name: str) -> Path:
    root, _, rest = name.partition("/")
    return (CORPUS if root == "corpus" else SAMPLES) / rest


EXPECTED, ERRORS = load_expectations()


def test_expectations_file_is_well_formed():
    names = set(inputs())
    if not names:
        pytest.skip(f"corpus not available at {CORPUS}")
    for e in EXPECTED:
        assert e.input in names, f"expectation for an input that does not exist: {e.input}"
        assert e.severity in REPORTED, e
        assert len(e.why) >= 40, f"{e.input} {e.describe()}: say why it is true"
    assert set(ERRORS) <= names


@pytest.mark.parametrize("name", inputs())
def test_corpus_input_gives_the_reviewed_findings(name):
    path = resolve(name)
    if name in ERRORS:
        with pytest.raises(TracekitError) as raised:
            tracekit.open(path).finding_records()
        message = str(raised.value)
        assert ERRORS[name] in message, f"{name}: error changed: {message}"
        assert "\n" not in message.strip(), "an input error is one line"
        return
    with tracekit.open(path) as trace:
        findings = [f for f in trace.finding_records() if f["severity"] in REPORTED]
    expected = [e for e in EXPECTED if e.input == name]
    unexpected = [f for f in findings if not any(e.matches(f) for e in expected)]
    lost = [e for e in expected if sum(e.matches(f) for f in findings) != 1]
    problems = [f"unexpected {f['rule']} {f['severity']} {f['locality']}: {f['title']}" for f in unexpected]
    problems += [f"expected once, found {sum(e.matches(f) for f in findings)}: {e.describe()} ({e.why})" for e in lost]
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)
