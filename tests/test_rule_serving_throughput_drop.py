"""S001 serving-throughput-drop: quiet on the real SGLang and vLLM logs (no queue grows while
throughput falls there), reports a range built from the SGLang log's own decode lines reordered,
and its evidence SQL recomputes the numbers."""

from __future__ import annotations

import re

from tests.conftest import corpus, evidence, run_rule
from tracekit import db
from tracekit.ingest.pipeline import ingest

SGLANG = "sglsetup__sglang.log"
VLLM = "energyllm__vllm_server.log"


def test_quiet_on_the_real_logs(loaded):
    for name in (SGLANG, VLLM):
        found, notes = run_rule(loaded(corpus(name)), "S001")
        assert found == [] and notes == []


def _reordered(tmp_path):
    """The corpus's six SGLang decode lines, five of them reordered (two at 76 tok/s with no queue, one at
    74.5 with one queued, then the 0.09 tok/s line, then 74.5 again) with their timestamps renumbered one
    second apart: a constructed positive case from real lines, not a real incident."""
    decode = [line for line in corpus(SGLANG).read_text().splitlines() if "Decode batch" in line]
    order = [decode[4], decode[5], decode[1], decode[0], decode[2]]
    lines = [re.sub(r"^\[[^\]]+\]", f"[2026-02-09 14:50:{10 + i:02d}]", line) for i, line in enumerate(order)]
    path = tmp_path / "sglang_reordered_decode.log"
    path.write_text("\n".join(lines) + "\n")
    return path, order


def _num(line, key):
    return float(re.search(re.escape(key) + r": ([\d.]+)", line).group(1))


def test_reports_the_drop_with_recomputable_batch_statistics(tmp_path):
    path, order = _reordered(tmp_path)
    con = db.connect(None)
    ingest(con, [path])
    found, _ = run_rule(con, "S001", cache=False)
    assert len(found) == 1
    f = found[0]
    tp = [_num(line, "gen throughput (token/s)") for line in order]
    queue = [_num(line, "#queue-req") for line in order]
    before = sum(tp[:3]) / 3
    assert f.observed.value == tp[3] and abs(f.expected.value - before) < 1e-3
    ev = evidence(con, f)
    assert ev["throughput_inside"] == tp[3] and abs(ev["throughput_before"] - before) < 1e-9
    assert abs(ev["queue_before"] - sum(queue[:3]) / 3) < 1e-9 and ev["queue_max_inside"] == queue[3]
    assert ev["token_usage_inside"] == _num(order[3], "token usage")
    assert ev["samples_inside"] == 1 and ev["samples_before"] == 3
    # the range runs from the dropped line to the next one (one second later)
    assert f.locality["window_ns"][1] - f.locality["window_ns"][0] == 1_000_000_000 == f.impact_ns
    assert f.locality["op"] == "sglang.decode_batch" and f.severity == "warning"
    assert "KV" in f.hypothesis  # token usage 0.97: the cache limits the batch
    # a stricter drop threshold than the observed drop silences it
    drop = 1 - tp[3] / before
    assert run_rule(con, "S001", cache=False, min_drop=min(0.9999, drop + 1e-4))[0] == []


def test_a_drop_without_a_growing_queue_is_not_reported(tmp_path):
    path, order = _reordered(tmp_path)
    text = re.sub(r"#queue-req: \d+", "#queue-req: 0", path.read_text())
    path.write_text(text)
    con = db.connect(None)
    ingest(con, [path])
    assert run_rule(con, "S001", cache=False)[0] == []


def test_vllm_series_synthetic_case(tmp_path):
    """Synthetic: the real vLLM log's stats line with its numbers replaced, four steady lines then two with
    throughput down and requests waiting (vLLM V1 `Waiting`) and one with the older `Pending` name."""
    template = next(
        re.sub(r"\x1b\[[0-9;]*m", "", line)
        for line in corpus(VLLM).read_text().splitlines()
        if "Avg generation throughput" in line
    )

    def line(second, gen, running, waiting, usage, queue_word="Waiting"):
        text = re.sub(r"11:27:\d\d", f"11:30:{second:02d}", template)
        text = re.sub(r"Avg generation throughput: [\d.]+", f"Avg generation throughput: {gen}", text)
        text = re.sub(r"Running: \d+", f"Running: {running}", text)
        text = re.sub(r"Waiting: \d+", f"{queue_word}: {waiting}", text)
        return re.sub(r"GPU KV cache usage: [\d.]+", f"GPU KV cache usage: {usage}", text)

    rows = [line(0, 400.0, 8, 0, 40.0), line(10, 410.0, 8, 0, 42.0), line(20, 390.0, 8, 0, 44.0)]
    rows += [line(30, 120.0, 4, 6, 98.0), line(40, 100.0, 4, 9, 99.0, "Pending"), line(50, 380.0, 8, 0, 50.0)]
    path = tmp_path / "vllm_synthetic.log"
    path.write_text("\n".join(rows) + "\n")
    con = db.connect(None)
    ingest(con, [path])
    (f,), _ = run_rule(con, "S001", cache=False)
    ev = evidence(con, f)
    assert ev["samples_inside"] == 2 and ev["throughput_inside"] == 110.0 and ev["queue_max_inside"] == 9
    assert abs(ev["token_usage_inside"] - 0.985) < 1e-9 and ev["running_before"] == 8
    assert f.locality["window_ns"][1] - f.locality["window_ns"][0] == 20_000_000_000
