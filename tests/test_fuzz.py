"""The fault campaign (scripts/fault_campaign.py) on a fixed seed and budget: mutated inputs of every
format tracekit reads end in a run that reconciles or in one line naming the file, never in a
traceback or a hang, in process and through the console script."""

from __future__ import annotations

import io
import random
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import fault_campaign  # noqa: E402  (a script, importable from its folder)

CASES_PER_FORMAT = 8  # about 55 s on two cores; scripts/fault_campaign.py runs bigger budgets
SEED = 20261201
FORMATS = {"kineto", "kineto_gz", "nsys_sqlite", "nsys_stats_csv", "perfetto_proto", "ncu_csv", "numerics_report",
           "runtime_events", "serving_log", "otlp_json", "bench_serving"}  # fmt: skip


def test_mutated_inputs_of_every_format_never_crash_or_hang(tmp_path):
    """One test, not several sharing a fixture: a module fixture would run once per xdist worker."""
    if not CORPUS.exists():
        pytest.skip(f"corpus not available at {CORPUS}")
    figures = fault_campaign.campaign(CASES_PER_FORMAT, SEED, tmp_path, workers=2, limit=60)
    assert set(figures) == FORMATS
    assert all(f.cases == CASES_PER_FORMAT for f in figures.values())
    printed = io.StringIO()
    fault_campaign.report(figures, printed)
    assert [o for f in figures.values() for o in f.failures] == [], printed.getvalue()
    results = [o for f in figures.values() for o in f.results]
    # the mutations reach past the sniff and the first check: some inputs still ingest, some are refused
    assert {"ok", "error"} <= {o.kind for o in results}

    # the console script says the same: exit 2 with one line naming the file, or exit 0
    binary = shutil.which("tracekit") or str(Path(sys.executable).with_name("tracekit"))
    rng = random.Random(SEED)
    sampled = rng.sample([o for o in results if o.kind == "error"], 3) + rng.sample(
        [o for o in results if o.kind == "ok"], 2
    )
    checked = [fault_campaign.cli_outcome(o.case, binary, tmp_path, 60) for o in sampled]
    assert [(c.case.path.name, c.kind, c.detail) for c in checked] == [(o.case.path.name, o.kind, "") for o in sampled]
