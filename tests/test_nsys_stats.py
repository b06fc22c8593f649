"""`nsys stats` CSV trace reports: NVTX ranges land as annotations whose computed call tree is the
one nsys reports, and summary reports are refused with a line saying what is supported."""

from __future__ import annotations

import pytest

from tests.conftest import corpus
from tracekit import db
from tracekit.errors import InputError
from tracekit.ingest.pipeline import ingest

NBODY = "pipit__nbody-nvtx__trace.csv"  # nvtx_pushpop_trace of the CUDA n-body sample


def test_nvtx_ranges_reconcile_and_nest_as_nsys_says(loaded):
    path = corpus(NBODY)
    con = loaded(path)
    lines = [line for line in path.read_text().splitlines()[1:] if line.strip()]
    read, ingested, skipped, fmt = con.execute(
        "SELECT events_read, events_ingested, events_skipped, format FROM ingest_log"
    ).fetchone()
    assert (read, ingested, skipped, fmt) == (len(lines), len(lines), 0, "nsys_stats_csv")
    # tracekit's nesting, computed from times alone, reproduces the RangeId/ParentId tree nsys wrote
    mismatched = con.execute(
        """
        SELECT count(*) FROM events c LEFT JOIN events p ON p.event_id = c.parent_id
        WHERE c.kind = 'user_annotation'
          AND coalesce(p.args->>'RangeId', '') <> coalesce(c.args->>'ParentId', '')
        """
    ).fetchone()[0]
    assert mismatched == 0
    assert con.execute("SELECT count(DISTINCT tid) FROM threads").fetchone()[0] >= 1


def test_summary_report_is_refused_with_one_line(tmp_path):
    path = tmp_path / "cuda_gpu_kern_sum.csv"
    path.write_text("Start (ns),Time (%),Total Time (ns),Instances,Name\n1,50.0,100,2,k\n")
    with pytest.raises(InputError, match="nsys stats trace report"):
        ingest(db.connect(None), [path])
