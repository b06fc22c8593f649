"""R004 slow-link on msprof-analyze's communication matrix: quiet on the two real cluster analyses of
the corpus (an 8-rank HCCS mesh within 2% of its median link; a folder with one link per transport),
and naming the one link made slower in a copy of the real `.db`, at the severity its ratio gives."""

from __future__ import annotations

import shutil
import sqlite3
import statistics

import pytest

from tests.conftest import corpus
from tracekit.engine.runner import run_rules

CLUSTER_DB = "ascend/msinsight__full_db__cluster_analysis.db"
CLUSTER_FOLDER = "ascend/msinsight__server_test_data_gpt3/cluster_analysis_output"


def _slowed(tmp_path, src: int, dst: int, factor: float):
    """A copy of the real cluster analysis whose src -> dst link took `factor` times as long for
    every transfer (msprof-analyze's bandwidth column divided alike)."""
    path = tmp_path / f"cluster_analysis_{src}_{dst}_{factor}.db"
    shutil.copy(corpus(CLUSTER_DB), path)
    con = sqlite3.connect(path)
    with con:
        changed = con.execute(
            "UPDATE ClusterCommAnalyzerMatrix SET transit_time = transit_time * ?, bandwidth = bandwidth / ? "
            "WHERE CAST(src_rank AS INTEGER) = ? AND CAST(dst_rank AS INTEGER) = ?",
            [factor, factor, src, dst],
        ).rowcount
    con.close()
    assert changed > 0
    return path


@pytest.mark.parametrize("name", [CLUSTER_DB, CLUSTER_FOLDER])
def test_quiet_on_the_real_cluster_analyses(loaded, name):
    con = loaded(corpus(name))
    assert run_rules(con, ["R004"])[0] == []


def test_the_healthy_mesh_is_within_a_few_percent(loaded):
    # what the default max_ratio is set against: the real job's slowest HCCS link
    con = loaded(corpus(CLUSTER_DB))
    from rules.slow_link import LINKS_SQL

    gbps = [r[-1] for r in con.execute(LINKS_SQL, {"min_mb": 1.0}).fetchall()]
    assert len(gbps) == 56
    assert min(gbps) / statistics.median(gbps) > 0.98


@pytest.mark.parametrize(("factor", "severity"), [(2.5, "critical"), (1.5, "warning")])
def test_names_the_one_link_made_slower(loaded, tmp_path, factor, severity):
    con = loaded(_slowed(tmp_path, 2, 5, factor))
    (f,) = run_rules(con, ["R004"])[0]
    assert f.locality["link"] == {"src_rank": 2, "dst_rank": 5, "transport": "HCCS"}
    assert f.severity == severity
    assert f.extra["ratio"] == pytest.approx(1 / factor, rel=0.03)
    # the evidence query recomputes the observed bandwidth and the median it is compared with
    rows = con.execute(f.sql, f.sql_params).fetchall()
    link = next(r for r in rows if (r[2], r[3]) == (2, 5))
    assert f.observed.value == pytest.approx(link[-1], rel=1e-3)
    assert f.expected.value == pytest.approx(statistics.median(r[-1] for r in rows if r[1] == "HCCS"), rel=1e-3)
    assert "2 -> 5" in f.title and f.impact_ns > 0


def test_a_threshold_below_the_ratio_silences_it(loaded, tmp_path):
    con = loaded(_slowed(tmp_path, 2, 5, 1.5))
    assert run_rules(con, ["R004"], {"R004": {"max_ratio": 0.6}})[0] == []
    # too few links of a kind to compare: nothing
    assert run_rules(con, ["R004"], {"R004": {"min_links": 57}})[0] == []
