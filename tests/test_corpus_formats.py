"""Every non-Kineto file of the corpus, through the real console script: it ingests with
events read = ingested + skipped and a reason for every skip, and `analyze` runs every rule on it; or,
for a binary report only its vendor's tool reads, it gets one line saying how to export it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import corpus

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))

# file -> the format tracekit must recognise it as, by content
NON_KINETO = {
    "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite": "nsys_sqlite",
    "pipit__cloverleaf-nsys__perlmutter-cloverleaf-cuda.sqlite": "nsys_sqlite",
    "pipit__nbody-nvtx__trace.csv": "nsys_stats_csv",
    "esmm__metrics.csv": "ncu_csv",
    "perfetto__nested_tracks.perfetto-trace": "perfetto_proto",
    "pftx__example.pftrace": "perfetto_proto",
    "sglsetup__sglang.log": "serving_log",
    "energyllm__vllm_server.log": "serving_log",
}


def test_the_list_covers_the_corpus():
    """A new non-Kineto corpus file must be added here (and so be tested)."""
    provenance = (corpus("PROVENANCE.md")).read_text()
    named = {line.split("|")[1].strip() for line in provenance.splitlines() if line.startswith("| ") and "__" in line}
    kineto = {n for n in named if n.endswith((".json", ".json.gz"))}
    native = {n for n in named if n.endswith(".ncu-rep")}
    assert named - kineto - native == set(NON_KINETO)


@pytest.mark.parametrize("name", sorted(NON_KINETO))
def test_ingests_reconciled_and_analyzes(name, tmp_path):
    path = corpus(name)
    db = tmp_path / "c.duckdb"
    proc = subprocess.run([TRACEKIT, "ingest", str(path), "--db", str(db), "-f", "json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout)
    assert result["events_read"] == result["events_ingested"] + result["events_skipped"] > 0
    assert sum(result["skipped_reasons"].values()) == result["events_skipped"]
    assert all(isinstance(k, str) and len(k) > 5 for k in result["skipped_reasons"])
    fmt = subprocess.run([TRACEKIT, "sql", str(db), "SELECT format FROM runs", "-f", "json"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert json.loads(fmt.stdout) == [{"format": NON_KINETO[name]}]
    analyzed = subprocess.run([TRACEKIT, "analyze", str(db), "--format", "json"],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr
    report = json.loads(analyzed.stdout)
    assert report["runs"][0]["events_read"] == result["events_read"]
