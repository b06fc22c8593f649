"""H001 host-sync on real traces: the per-step .item() sync of the H200 decode loop, and silence
where no blocking call repeats."""

from __future__ import annotations

import jsonschema
import pytest

from tests.conftest import corpus, evidence, sample
from tracekit.engine.runner import run_rules
from tracekit.findings.model import json_schema


def findings(con, **params):
    found, notes = run_rules(con, ["H001"], {"H001": params} if params else None)
    return found, notes


def test_item_sync_in_decode_loop_is_found_and_localized(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    found, _ = findings(con)
    sync = [f for f in found if f.locality["op"] == "aten::_local_scalar_dense"]
    assert len(sync) == 1
    f = sync[0]
    assert f.locality["launch"]["call"] == "cudaStreamSynchronize"
    assert any("item" in frame for frame in f.locality["code_path"])
    row = evidence(con, f)
    # the evidence query recomputes the observed cost exactly: GPU idle after the calls
    assert row["gpu_idle_after_ns"] == f.observed.value
    assert 0 < row["host_blocked_ns"] < row["last_ns"] - row["first_ns"]
    assert row["calls"] >= 3
    assert f.window_ns > 0 and 0 < f.impact_share < 1
    jsonschema.validate(f.as_dict(), json_schema())
    assert set(f.sample_event_ids) <= {
        r[0] for r in con.execute("SELECT event_id FROM runtime_calls WHERE name = 'cudaStreamSynchronize'").fetchall()
    }


def test_same_site_same_id_in_graph_and_eager_runs(loaded):
    eager, _ = findings(loaded(sample("gpu_prefill_decode_eager.json.gz")), min_share=0.0)
    graph, _ = findings(loaded(sample("gpu_prefill_decode_cudagraph.json.gz")), min_share=0.0)
    ids = lambda fs: {f.id for f in fs if f.locality["op"] == "aten::_local_scalar_dense"}  # noqa: E731
    # the same line of code syncs in both runs: one id, so a fix can be tracked across runs
    assert ids(eager) and ids(eager) == ids(graph)


def test_thresholds_are_respected(loaded):
    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    found, _ = findings(con)
    calls = min(evidence(con, f)["calls"] for f in found)
    assert findings(con, min_calls=calls + 1000)[0] == []


@pytest.mark.parametrize(
    "path",
    [
        lambda: sample("cpu_two_threads.json.gz"),
        lambda: corpus("kineto__docs_traces__before_fix_trace.json"),  # one cudaDeviceSynchronize: not steady state
    ],
)
def test_quiet_without_repeated_blocking_calls(path, loaded):
    found, _ = findings(loaded(path()))
    assert found == []
