"""docs/python.md runs: every ```python block executes in order, and prints what the ```text block under it shows."""

from __future__ import annotations

import contextlib
import io
import re

from tests.conftest import ROOT

DOC = ROOT / "docs" / "python.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def blocks() -> list[tuple[str, str | None]]:
    """(code, the output shown under it or None), in page order."""
    fenced = [(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text())]
    out = []
    for i, (kind, body) in enumerate(fenced):
        if kind == "python":
            shown = fenced[i + 1][1] if i + 1 < len(fenced) and fenced[i + 1][0] == "text" else None
            out.append((body, shown))
    return out


def test_the_page_has_code_and_outputs():
    found = blocks()
    assert len(found) >= 8 and sum(shown is not None for _, shown in found) == len(found)


def test_every_block_prints_what_the_page_shows(tmp_path, monkeypatch):
    (tmp_path / "sample_traces").symlink_to(ROOT / "sample_traces")
    monkeypatch.chdir(tmp_path)  # the page's relative paths; what it writes lands here
    namespace: dict = {}
    for n, (code, shown) in enumerate(blocks(), 1):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"docs/python.md block {n}", "exec"), namespace)
        assert printed.getvalue() == shown, f"block {n}:\n{code}"
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert (tmp_path / "eager.duckdb").exists() and (tmp_path / "annotated.json.gz").exists()
