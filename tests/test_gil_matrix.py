"""H002 thread-starvation over the GIL-in-a-native-wait matrix (tests/data/gil_matrix, real H200 runs
made by scripts/make_gil_matrix.py; cells.json holds each cell's dimensions and the verdict it must get).

`starved`: one warning naming the starved thread `kv_transfer`, every native op of the cell
(`deepep_like::intranode_dispatch`, and `..._combine` when the layer has two) and the GIL. `quiet`:
no H002 finding at all, in either direction between the threads.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, evidence, run_rule

MATRIX = ROOT / "tests" / "data" / "gil_matrix"
CELLS = json.loads((MATRIX / "cells.json").read_text())["cells"]
DISPATCH, COMBINE = "deepep_like::intranode_dispatch", "deepep_like::intranode_combine"


def _files(cell: dict, with_log: bool = False) -> list:
    return [MATRIX / f for f in cell["files"] if with_log or f.endswith(".json.gz")]


def _thread_tid(con, name: str) -> int:
    return con.execute("SELECT tid FROM threads WHERE name LIKE ?", [f"%{name}%"]).fetchone()[0]


def _assert_starved(con, cell: dict, found: list):
    assert len(found) == 1, [f.title for f in found]
    f = found[0]
    assert f.severity == "warning"
    assert "kv_transfer" in f.locality["thread_name"] and "kv_transfer" in f.title
    assert f.locality["tid"] == _thread_tid(con, "kv_transfer")
    ops = [DISPATCH, COMBINE] if cell["ops"] == 2 else [DISPATCH]
    assert sorted(f.extra["ops"]) == sorted(ops)
    assert all(op in f.title and op in f.hypothesis for op in ops)
    # the op is the record_function around the call, the pybind11 frame only its native call
    assert not any(op.startswith("<built-in") for op in f.extra["ops"])
    assert all("wait_" in n and "_hold" in n for n in f.extra["native_calls"])
    assert "GIL" in f.hypothesis
    assert "py-spy" in f.next_experiment and "gil_scoped_release" in f.next_experiment
    row = evidence(con, f)
    assert row["rate_ratio"] == f.observed.value < 0.5
    assert row["windows"] >= 10 and row["windows_silent"] > row["windows_silent_expected"]
    # every window the cell ran (one per op per layer) is tested, not only the longest ones; event
    # polling starts its wait after the kernel launch, so some of its shortest calls drop out
    assert row["windows"] >= (0.6 if cell["poll"] == "event" else 1.0) * cell["layers"] * cell["ops"]
    return f


@pytest.mark.parametrize("cell", CELLS, ids=[c["name"] for c in CELLS])
def test_verdict(cell, loaded):
    con = loaded(*_files(cell))
    found, notes = run_rule(con, "H002")
    assert notes == []
    if cell["expected"] == "starved":
        _assert_starved(con, cell, found)
    else:
        assert found == [], [f.title for f in found]


@pytest.mark.parametrize("cell", [c for c in CELLS if c["other"] != "none"], ids=lambda c: c["name"])
def test_the_transfer_thread_never_starves_the_main_thread(cell, loaded):
    # the transfer thread's own Python work holds the GIL too; it is never a window, and the calls
    # it makes release the GIL: nothing blames it, even among the cleared pairs
    con = loaded(*_files(cell))
    transfer = _thread_tid(con, "kv_transfer")
    clear, _ = run_rule(con, "H002", report_clear=True)
    reverse = [f for f in clear if f.extra["window_thread"]["tid"] == transfer]
    assert all(f.severity == "info" for f in reverse)


@pytest.mark.parametrize("cell", [c for c in CELLS if len(c["files"]) > 1], ids=lambda c: c["name"])
def test_verdict_with_the_runtime_event_log_attached(cell, loaded):
    con = loaded(*_files(cell, with_log=True))
    logged = con.execute("SELECT count(*) FROM runtime_events WHERE name = 'kv_transfer_chunk'").fetchone()[0]
    assert logged > 100
    found, _ = run_rule(con, "H002")
    if cell["expected"] == "starved":
        f = _assert_starved(con, cell, found)
        # the log's lines are not activity of their own: the numbers are those of the trace alone
        alone, _ = run_rule(loaded(*_files(cell)), "H002")
        assert f.observed.value == alone[0].observed.value and f.id == alone[0].id
    else:
        assert found == []


def test_released_twin_keeps_the_finding_id_as_a_cleared_pair(loaded):
    # the fix can be tracked: the released run of the same workload reports the same pair (info)
    held = next(c for c in CELLS if c["name"] == "gil_held_flag_300us_1op_transfer")
    released = next(c for c in CELLS if c["name"] == "gil_released_flag_300us_1op_transfer")
    (f,) = run_rule(loaded(*_files(held)), "H002")[0]
    clear, _ = run_rule(loaded(*_files(released)), "H002", report_clear=True)
    forward = [c for c in clear if "kv_transfer" in c.locality["thread_name"]]
    assert [c.severity for c in forward] == ["info"]
    assert forward[0].id == f.id
    assert evidence(loaded(*_files(released)), forward[0])["rate_ratio"] >= 0.8  # the acceptance check holds
