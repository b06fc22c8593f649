"""Shared fixtures: corpus traces are read in place from ../shared/corpus, never copied."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracekit import db
from tracekit.ingest.pipeline import ingest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACEKIT_CORPUS", ROOT.parent / "shared" / "corpus"))
SAMPLES = ROOT / "sample_traces"


def corpus(name: str) -> Path:
    path = CORPUS / name
    if not path.exists():
        # CI always has ../shared: there a missing corpus is a broken checkout, not a reason to skip
        if os.environ.get("CI"):
            pytest.fail(f"corpus file {name} not found at {CORPUS}")
        pytest.skip(f"corpus file {name} not available at {CORPUS}")
    return path


def sample(name: str) -> Path:
    return SAMPLES / name


_CACHE: dict[tuple, object] = {}


@pytest.fixture(scope="session")
def loaded():
    """loaded(*paths) -> a read-only-by-convention connection with those traces ingested, cached per session."""

    def load(*paths: Path):
        key = tuple(str(p) for p in paths)
        if key not in _CACHE:
            con = db.connect(None)
            ingest(con, list(paths), same_content="keep")  # a path given twice is two runs here
            _CACHE[key] = con
        return _CACHE[key]

    return load


@pytest.fixture
def fresh_db():
    con = db.connect(None)
    yield con
    con.close()


def trace(name: str) -> Path:
    """A bundled sample trace (gpu_*, cpu_*) or a corpus file, by name."""
    return sample(name) if name.startswith(("gpu_", "cpu_")) else corpus(name)


def evidence(con, finding) -> dict:
    """Run a finding's evidence SQL with its parameters: the first row, as a dict."""
    cur = con.execute(finding.sql, finding.sql_params)
    return dict(zip([d[0] for d in cur.description], cur.fetchone()))


_RULE_RESULTS: dict = {}


def run_rule(con, code: str, cache: bool = True, **params):
    """(findings, that rule's data-quality notes) of one rule; memoized per connection and
    parameters, since rules only read."""
    from tracekit.engine.runner import run_rules

    key = (id(con), code, tuple(sorted(params.items())))
    if not cache or key not in _RULE_RESULTS:
        findings, notes = run_rules(con, [code], params={code: params} if params else None)
        _RULE_RESULTS[key] = (con, findings, [n for n in notes if n.rule == code])
    return _RULE_RESULTS[key][1], _RULE_RESULTS[key][2]


@pytest.fixture(scope="session")
def eager(loaded):
    """The H200 prefill + decode loop in eager mode (launch-bound, syncs every step)."""
    return loaded(sample("gpu_prefill_decode_eager.json.gz"))


@pytest.fixture(scope="session")
def graph(loaded):
    """The same loop with the decode step replayed from a CUDA graph."""
    return loaded(sample("gpu_prefill_decode_cudagraph.json.gz"))


def union_within(intervals, lo, hi) -> int:
    """Length of the union of (start, end) intervals clipped to [lo, hi): the brute-force oracle the
    busy-time tests compare the SQL against."""
    total, cur = 0, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if s < hi and e > lo):
        if cur and s <= cur[1]:
            cur[1] = max(cur[1], e)
        else:
            total += cur[1] - cur[0] if cur else 0
            cur = [s, e]
    return total + (cur[1] - cur[0] if cur else 0)
