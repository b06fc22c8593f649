"""The fault campaign (scripts/fault_campaign.py) on a fixed seed and budget: mutated inputs of every
format tracekit reads end in a run that reconciles or in one line naming the file, never in a
traceback or a hang, in process and through the console script."""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import fault_campaign  # noqa: E402  (a script, importable from its folder)

CASES_PER_FORMAT = 9  # about a minute on two cores
SEED = 20261201
FORMATS = {"kineto", "kineto_gz", "nsys_sqlite", "nsys_stats_csv", "perfetto_proto", "ncu_csv", "numerics_report",
           "runtime_events", "serving_log", "otlp_json", "bench_serving"}  # fmt: skip


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    if not CORPUS.exists():
        pytest.skip(f"corpus not available at {CORPUS}")
    workdir = tmp_path_factory.mktemp("faults")
    return fault_campaign.campaign(CASES_PER_FORMAT, SEED, workdir, workers=2, limit=60)


def test_every_format_is_fuzzed(figures):
    assert set(figures) == FORMATS
    assert all(f.cases == CASES_PER_FORMAT for f in figures.values())


def test_no_traceback_no_hang_no_unnamed_error(figures):
    out = __import__("io").StringIO()
    fault_campaign.report(figures, out)
    failures = [o for f in figures.values() for o in f.failures]
    assert failures == [], out.getvalue()
    # the mutations reach past the sniff and the first check: some inputs still ingest, some are refused
    outcomes = {kind for f in figures.values() for kind in f.outcomes}
    assert {"ok", "error"} <= outcomes


def test_the_console_script_exits_0_or_2_with_one_line(figures, tmp_path):
    binary = shutil.which("tracekit") or str(Path(sys.executable).with_name("tracekit"))
    rng = random.Random(SEED)
    results = [o for f in figures.values() for o in f.results]
    refused = [o.case for o in results if o.kind == "error"]
    ingested = [o.case for o in results if o.kind == "ok"]
    checked = [fault_campaign.cli_outcome(case, binary, tmp_path, 60)
               for case in rng.sample(refused, 3) + rng.sample(ingested, 2)]  # fmt: skip
    assert [(r.case.path.name, r.kind, r.detail) for r in checked] == [
        (c.path.name, "error", "") for c in [r.case for r in checked[:3]]] + [
        (c.path.name, "ok", "") for c in [r.case for r in checked[3:]]]  # fmt: skip
