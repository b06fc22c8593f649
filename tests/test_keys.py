"""Name keys: per-run ids in names never move a finding id or split a grouping key, on two real runs of
one workload (the project's H200 runs `volatile_ids_run1` / `_run2`), and ids of traces without
volatile parts stay what they were."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tests.conftest import corpus, sample
from tracekit.db.names import name_key
from tracekit.findings import model

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
RUN1, RUN2 = sample("volatile_ids_run1.json.gz"), sample("volatile_ids_run2.json.gz")
ANNOTATIONS = "SELECT name FROM events WHERE kind = 'user_annotation' AND depth = 0 ORDER BY ts_ns"


def _annotations(path) -> list[str]:
    with tracekit.open(path) as t:
        return [n for (n,) in t.sql(ANNOTATIONS).fetchall()]


@pytest.mark.parametrize(
    "raw, key",
    [
        ("nccl:all_to_all, op_id = 999469", "nccl:all_to_all, op_id = #"),
        ("nccl:all_reduce, op_id = 150891, seq = 452673", "nccl:all_reduce, op_id = #, seq = #"),
        ("record_param_comms seq=47485", "record_param_comms seq=#"),
        ("<lambda> object at 0x7efbdb777b20", "<lambda> object"),
        ("buffer 0x7f3a12bc4400 ready", "buffer 0x# ready"),
        ("ProfilerStep#5", "ProfilerStep"),
        ("worker0.1623143089861", "worker0.#"),
        # not volatile: module paths, flags, shapes, template arguments, short suffixes, labels inside words
        ("model.layers.3.self_attn", "model.layers.3.self_attn"),
        ("x & 0x1f", "x & 0x1f"),
        ("aten::mm [2048, 2048]", "aten::mm [2048, 2048]"),
        ("void gemm<128, 64, 65536>(float*)", "void gemm<128, 64, 65536>(float*)"),
        ("batch_2048", "batch_2048"),
        ("layer_id=3", "layer_id=3"),
    ],
)
def test_name_key_masks_per_run_parts_only(raw, key):
    assert name_key(raw) == key


def test_layers_stay_apart():
    assert name_key("model.layers.3.mlp") != name_key("model.layers.4.mlp")


def test_sql_macro_agrees_with_python_on_every_name():
    paths = [RUN1, RUN2, sample("cpu_two_threads.json.gz"), corpus("hta__trace_diff__control.json.gz")]
    for path in paths:
        with tracekit.open(path) as t:
            rows = t.sql("SELECT DISTINCT name, name_key(name) FROM events WHERE name IS NOT NULL").fetchall()
        assert rows
        assert [(n, k) for n, k in rows if k != name_key(n)] == [], path


def test_the_two_runs_carry_different_ids_in_one_annotation():
    # the premise: raw names differ between the runs, their keys do not
    one, two = _annotations(RUN1), _annotations(RUN2)
    assert len(one) == len(two) == 12
    assert not set(one) & {n for n in two if "op_id" in n}
    assert [name_key(n) for n in one] == [name_key(n) for n in two]
    # ... and a finding located at either is one problem
    ids = {model.finding_id("H001", {"op": n, "rank": None}) for n in (one[0], two[0])}
    assert len(ids) == 1


def test_steps_group_the_annotation_across_its_ids():
    for path in (RUN1, RUN2):
        with tracekit.open(path) as t:
            got = dict(t.sql("SELECT name, occurrences FROM step_candidates").fetchall())
        assert got == {"nccl:all_reduce, op_id = #, seq = #": 6, "<lambda> object": 6}


def test_same_findings_same_ids_across_the_runs():
    # thresholds off: which findings pass a share threshold depends on each run's window, their ids must not
    everything = {"H001": {"min_share": 0}, "G001": {"min_idle_share": 0, "min_idle_ns": 0}}
    with tracekit.open(RUN1) as a, tracekit.open(RUN2) as b:
        one, two = a.finding_records(params=everything), b.finding_records(params=everything)
    by_rule = {}
    for side, found in (("run1", one), ("run2", two)):
        for f in found:
            by_rule.setdefault(f["rule"], {}).setdefault(side, set()).add(f["id"])
    both = {rule: sides for rule, sides in by_rule.items() if len(sides) == 2}
    assert "H001" in both  # the .item() sync of every iteration, in both runs
    for rule, sides in both.items():
        assert sides["run1"] == sides["run2"], rule


def test_baseline_and_diff_match_the_runs_as_one_problem():
    out = subprocess.run(
        [TRACEKIT, "analyze", str(RUN2), "--baseline", str(RUN1), "--format", "json", "--param", "H001.min_share=0"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    status = {e["finding_id"]: e for e in doc["finding_status"]["findings"]}
    h001 = [e for e in status.values() if e["rule"] == "H001"]
    assert len(h001) == 1 and h001[0]["baseline"] and h001[0]["candidate"]
    assert h001[0]["status"] not in ("new", "fixed", "not_comparable")
    steps = doc["diff"]["steps"]
    assert steps["comparable"] and steps["name"] in ("nccl:all_reduce, op_id = #, seq = #", "<lambda> object")
    assert doc["diff"]["noise"]["within_noise"] is True  # same workload: the step time did not move


@pytest.mark.parametrize(
    "path",
    [
        corpus("hta__trace_diff__control.json.gz"),
        corpus("kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"),
        sample("gpu_prefill_decode_eager.json.gz"),
    ],
)
def test_ids_without_volatile_parts_are_unchanged(path, monkeypatch):
    with tracekit.open(path) as t:
        found = t.finding_records()
    assert found
    keyed = {f["id"] for f in found}
    monkeypatch.setattr(model, "name_key", lambda name: name)
    raw = {model.finding_id(f["rule"], f["locality"]) for f in found}
    assert keyed == raw


def _loop_with_ids_in_annotations(path: Path, iterations: int = 5) -> Path:
    """A hand-made decode-like loop: each iteration launches a kernel inside `<lambda> object at 0x...`
    and waits for it with cudaStreamSynchronize inside `nccl:all_reduce, op_id = N`, both names with a
    new id every iteration; after each sync the GPU idles 600 us until the next launch."""
    events = []
    for i in range(iterations):
        t0 = 1000.0 * i
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"<lambda> object at 0x7f3a{i:08x}", "pid": 1, "tid": 1,
             "ts": t0, "dur": 8.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 1,
             "dur": 5.0, "args": {"correlation": i + 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": t0 + 10, "dur": 390.0,
             "args": {"device": 0, "stream": 7, "correlation": i + 1}},
            {"ph": "X", "cat": "user_annotation", "name": f"nccl:all_reduce, op_id = {915035 + i}, seq = {i}",
             "pid": 1, "tid": 1, "ts": t0 + 20, "dur": 480.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": t0 + 30,
             "dur": 380.0, "args": {}},
        ]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_site_named_by_an_annotation_with_ids_is_one_site(tmp_path):
    with tracekit.open(_loop_with_ids_in_annotations(tmp_path / "loop.json")) as t:
        found = t.finding_records()
        sites = t.sql("SELECT count(DISTINCT site) AS raw, count(DISTINCT name_key(site)) AS keyed FROM host_blocking")
        raw, keyed = sites.fetchall()[0]
    assert (raw, keyed) == (5, 1)  # one line of code, five names
    # H001 needs a site to repeat (min_calls 3): split by id, no site would; keyed, the five calls are one
    h001 = [f for f in found if f["rule"] == "H001"]
    assert len(h001) == 1 and h001[0]["locality"]["op"] == "nccl:all_reduce, op_id = #, seq = #"
    assert "5 blocking cudaStreamSynchronize" in h001[0]["title"] or "of 5 blocking" in h001[0]["title"]
    # G001's host-gap sites: the launches after the gaps come from one annotation, not four
    g001 = next(f for f in found if f["rule"] == "G001")
    sites = g001["evidence"]["details"]["host_gap_sites"]
    assert sites[0]["site"] == "<lambda> object" and sites[0]["gaps"] == 4
