"""A report of many ranks reads as one job: runs folded per device, one top-kernels table over the
ranks, and the same finding on several ranks shown once with the ranks it holds on, so the findings
shown are distinct and the cross-rank one is among them (on real NCCL ranks of the TP=2 sample)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, sample
from tracekit.findings.report import MANY_RUNS, fold, report_of_records

sys.path.insert(0, str(ROOT / "benchmarks"))

import make_rank_set  # noqa: E402

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
RANKS = MANY_RUNS + 2


def _record(rule, rank, stream=7, severity="warning", share=0.1, tid=None):
    return {
        "id": f"{rule}-{rank:03d}{stream:09d}",
        "rule": rule,
        "severity": severity,
        "locality": {"run_id": rank + 1, "rank": rank, "device": rank % 8, "stream": stream, "tid": tid or rank},
        "impact": {"time_ns": int(share * 1e6), "share_of_window": share},
    }


def test_fold_keeps_the_highest_ranked_and_names_the_other_ranks():
    records = [_record("G001", r, share=0.1 + r / 100) for r in range(RANKS)]
    records += [_record("G001", 3, stream=9, share=0.5), _record("R001", 4, severity="critical", share=0.05)]
    runs = [{"run_id": r + 1} for r in range(RANKS)]
    doc = report_of_records(runs, records, [], {}, max_findings=25)
    shown = [(f["rule"], f["locality"]["rank"], f["locality"]["stream"]) for f in doc["findings"]]
    # critical first, then by share: stream 9 on rank 3 is a finding of its own, not rank 3's stream 7
    assert shown == [("R001", 4, 7), ("G001", 3, 9), ("G001", RANKS - 1, 7)]
    same = doc["same_on_ranks"]
    assert list(same) == [f"G001-{RANKS - 1:03d}{7:09d}"]
    assert same[f"G001-{RANKS - 1:03d}{7:09d}"]["ranks"] == list(range(RANKS))
    assert len(same[f"G001-{RANKS - 1:03d}{7:09d}"]["ids"]) == RANKS - 1
    assert same[f"G001-{RANKS - 1:03d}{7:09d}"]["impact_ns"] == [100_000, int((0.1 + (RANKS - 1) / 100) * 1e6)]
    assert doc["findings_total"] == len(records) and doc["findings_folded"] == RANKS - 1
    assert doc["findings_omitted"] == 0
    # every record is shown or named: nothing is lost
    named = {f["id"] for f in doc["findings"]} | {i for s in same.values() for i in s["ids"]}
    assert named == {r["id"] for r in records}
    # the cap counts what is shown
    capped = report_of_records(runs, records, [], {}, max_findings=1)
    assert capped["findings_omitted"] == 2 and list(capped["same_on_ranks"]) == []
    # a report of a few runs lists every record
    few = report_of_records(runs[:MANY_RUNS], records, [], {}, max_findings=25)
    assert len(few["findings"]) == len(records) and few["findings_folded"] == 0 and few["same_on_ranks"] == {}
    assert fold([]) == ([], {})
    # findings located by their rank alone (outlier ranks) are each about their rank
    outliers = [{**_record("R002", r), "locality": {"run_id": r + 1, "rank": r}} for r in (2, 5)]
    assert fold(outliers) == (outliers, {})


@pytest.fixture(scope="module")
def gpu_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "ranks"
    sources = [str(sample(f"gpu_tp2_rank{r}.json.gz")) for r in (0, 1)]
    desc = make_rank_set.build_copies(sources, RANKS, str(out), max_offset_ms=0.0, jobs=2)
    return [str(out / f) for f in desc["files"]]


def test_the_report_of_many_gpu_ranks_reads_as_one_job(gpu_ranks):
    doc = json.loads(subprocess.run([TRACEKIT, "analyze", *gpu_ranks, "--format", "json"], capture_output=True,
                                    text=True, timeout=600, check=True).stdout)  # fmt: skip
    keys = [
        (
            f["rule"],
            json.dumps(
                {
                    k: v
                    for k, v in f["locality"].items()
                    if k not in ("run_id", "run_label", "rank", "device", "pid", "tid", "thread_name", "window_ns")
                },
                sort_keys=True,
            ),
        )  # fmt: skip
        for f in doc["findings"]
    ]
    assert len(keys) == len(set(keys))  # no finding shown twice
    r001 = next(f for f in doc["findings"] if f["rule"] == "R001")  # the cross-rank finding is not cut
    # the copies of the TP=2 pair's late rank 1 arrive last together: named as a group, measured
    # against the ranks that wait for them
    late = list(range(1, RANKS, 2))
    assert [r001["locality"]["rank"], *r001["evidence"]["details"]["late_together"]] == late
    assert f"({len(late)} of {RANKS}, late together)" in r001["title"]
    assert f"the other {RANKS - len(late)} ranks wait" in r001["title"]
    assert doc["findings_folded"] > 0 and doc["findings_total"] == (
        len(doc["findings"]) + doc["findings_omitted"] + doc["findings_folded"]
    )
    text = subprocess.run([TRACEKIT, "analyze", *gpu_ranks], capture_output=True, text=True, timeout=600,
                          check=True, env={**os.environ, "COLUMNS": "200"}).stdout  # fmt: skip
    lines = text.splitlines()
    runs_at = lines.index("runs")
    assert lines[runs_at + 3].split()[:3] == [str(RANKS), f"0-{RANKS - 1}", "NVIDIA"]  # one row for the job
    assert not any(line.startswith("top kernels: ") for line in lines)  # no table per rank
    header = next(i for i, line in enumerate(lines) if line.startswith(f"top kernels over {RANKS} runs"))
    nccl = next(line for line in lines[header:] if line.startswith("ncclDevKernel_AllReduce"))
    # the all-reduce's time on one rank spans the waiting ranks (ms) and the late ones (us)
    assert " us-" in nccl and nccl.rstrip().endswith(" ms")
    assert sum(1 for line in lines if line.strip().startswith("also:")) == len(doc["same_on_ranks"]) > 0
