"""Decode throughput drops while the request queue grows, from server logs (S001 serving-throughput-drop).

## What it does
Reads the batch statistics a serving log reader stores as counters (SGLang `sglang.decode_batch`:
`gen_throughput_tok_s`, `queue_req`, `running_req`, `token_usage`; vLLM `vllm.engine_stats`:
`avg_generation_throughput_tok_s`, `waiting` (`pending` before V1), `running`, `gpu_kv_cache_usage_pct`), one series per
(run, process, engine), in log order. A range starts at a sample whose generation throughput is at
least `min_drop` below the mean of the `baseline_samples` samples before it while its queue is
longer than their mean queue and at least `min_queue`; it goes on while both still hold against
that same baseline. For each range it reports the throughput, queue, running requests and KV token
usage before versus inside, and the time from the range's first sample to the first sample after it.

## Why it matters
Throughput that falls while requests wait is the server falling behind its load, not a lull in
traffic: every queued request's time to first token grows for as long as the range lasts. The
batch statistics say why: running requests down with token usage near 1 means the KV cache is full
(retractions, preemption); running steady with throughput down means slower steps (longer
contexts, prefill chunks interleaved with decode, a host stall); a first decode batch after an idle
period also reads low, because the server averages over the idle time.

## Example
An SGLang Llama-3.2-3B server (sglsetup corpus log, lines reordered into one sequence, see
tests/test_rule_serving_throughput_drop.py): three decode batches at 75.6 tok/s with a mean queue of
0.33, then a batch at 0.09 tok/s with 1 request queued and token usage 0.97: the first request's 24k
tokens fill the KV cache while the second request's 22.7k-token prompt waits (as in the original log).

## Options
- `baseline_samples` (3): how many samples before a range make its baseline.
- `min_drop` (0.3): the throughput inside must be at least this share below the baseline mean.
- `min_queue` (1): and the queue at least this long (and longer than the baseline mean).
- `max_findings` (5): ranges reported per series, the longest first.
- `warning_drop` (0.5): severity warning when the throughput inside is at least this share below
  the baseline mean (and the range lasts); smaller drops are info.
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, one, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.units import duration

# Per source: (counter name, throughput, queue, running and usage series (comma-separated), usage scale);
# vLLM before V1 calls its queue `Pending`.
SOURCES = (
    ("sglang.decode_batch", "gen_throughput_tok_s", "queue_req", "running_req", "token_usage", 1.0),
    (
        "vllm.engine_stats",
        "avg_generation_throughput_tok_s",
        "waiting,pending",
        "running",
        "gpu_kv_cache_usage_pct",
        0.01,
    ),
)

# One row per stats sample of one series of run $run_id: the four quantities side by side.
SAMPLES_SQL = """
SELECT event_id, ts_ns,
       max(value) FILTER (WHERE list_contains(string_split($tp, ','), series)) AS throughput,
       max(value) FILTER (WHERE list_contains(string_split($queue, ','), series)) AS queue,
       max(value) FILTER (WHERE list_contains(string_split($running, ','), series)) AS running,
       max(value) FILTER (WHERE list_contains(string_split($usage, ','), series)) * $usage_scale AS token_usage
FROM counters
WHERE run_id = $run_id AND name = $name AND pid = $pid AND tid = $tid
GROUP BY event_id, ts_ns
"""

# The evidence query: the batch statistics before (the baseline samples) and inside one range,
# samples chosen by event id (log order); throughput_inside is the observed value.
EVIDENCE_SQL = (
    "SELECT avg(throughput) FILTER (WHERE inside) AS throughput_inside,\n"
    "       avg(throughput) FILTER (WHERE NOT inside) AS throughput_before,\n"
    "       avg(queue) FILTER (WHERE inside) AS queue_inside, max(queue) FILTER (WHERE inside) AS queue_max_inside,\n"
    "       avg(queue) FILTER (WHERE NOT inside) AS queue_before,\n"
    "       avg(running) FILTER (WHERE inside) AS running_inside, avg(running) FILTER (WHERE NOT inside) AS running_before,\n"
    "       avg(token_usage) FILTER (WHERE inside) AS token_usage_inside,\n"
    "       avg(token_usage) FILTER (WHERE NOT inside) AS token_usage_before,\n"
    "       count(*) FILTER (WHERE inside) AS samples_inside, count(*) FILTER (WHERE NOT inside) AS samples_before\n"
    "FROM (SELECT *, event_id >= $first_event_id AS inside FROM (" + SAMPLES_SQL + ") s\n"
    "      WHERE event_id BETWEEN $baseline_first_event_id AND $last_event_id) w"
)

SERIES_SQL = "SELECT DISTINCT run_id, pid, tid FROM counters WHERE name = ? ORDER BY run_id, pid, tid"


@rule(
    code="S001",
    name="serving-throughput-drop",
    title="Decode throughput drops while the request queue grows (serving log batch statistics)",
    category="serving",
    requires=("counters",),
    params={
        "baseline_samples": Param(3, "samples before a range that make its baseline", "samples"),
        "min_drop": Param(0.3, "smallest throughput drop below the baseline mean", "ratio"),
        "min_queue": Param(1, "smallest queue length inside a range", "requests"),
        "max_findings": Param(5, "ranges reported per series, longest first", "count"),
        "warning_drop": Param(0.5, "severity warning from this throughput drop on (else info)", "ratio"),
    },
    example=Example(
        ("corpus/sglsetup__sglang.log", "corpus/energyllm__vllm_server.log"),
        note="no queue grows while throughput falls in the corpus's SGLang and vLLM logs; "
        "tests/test_rule_serving_throughput_drop.py reorders the SGLang log's own decode lines into the "
        "positive case the Example above describes",
    ),
)
def check(con, params, ctx):
    for name, tp, queue, running, usage, scale in SOURCES:
        for series in rows(con, SERIES_SQL, [name]):
            where = {"run_id": series.run_id, "name": name, "pid": series.pid, "tid": series.tid, "tp": tp,
                     "queue": queue, "running": running, "usage": usage, "usage_scale": scale}  # fmt: skip
            samples = [s for s in rows(con, SAMPLES_SQL + " ORDER BY event_id", where) if _complete(s)]
            ranges = _ranges(samples, params)
            ranges.sort(key=lambda r: (-(r["end_ns"] - r["start_ns"]), r["first"]))
            for number, found in enumerate(sorted(ranges[: params["max_findings"]], key=lambda r: r["first"]), 1):
                yield _finding(con, ctx.run(series.run_id), params, where, samples, found, number)


def _complete(sample) -> bool:
    return sample.throughput is not None and sample.queue is not None


def _ranges(samples: list, params: dict) -> list[dict]:
    """Index ranges [first, last] of samples in a drop, each with its baseline start."""
    n_base, keep = params["baseline_samples"], 1 - params["min_drop"]
    out, i = [], n_base
    while i < len(samples):
        base = samples[i - n_base : i]
        base_tp = sum(s.throughput for s in base) / n_base
        base_q = sum(s.queue for s in base) / n_base

        def dropped(s):
            return (
                base_tp > 0 and s.throughput <= keep * base_tp and s.queue > base_q and s.queue >= params["min_queue"]
            )

        if not dropped(samples[i]):
            i += 1
            continue
        j = i
        while j + 1 < len(samples) and dropped(samples[j + 1]):
            j += 1
        end_ns = samples[j + 1].ts_ns if j + 1 < len(samples) else samples[j].ts_ns
        out.append({"base": i - n_base, "first": i, "last": j, "start_ns": samples[i].ts_ns, "end_ns": end_ns})
        i = j + 1
    return out


def _cause(ev) -> tuple[str, str]:
    """(why the server fell behind, what to try) from the batch statistics inside the range."""
    full = (ev.token_usage_inside or 0) >= 0.9
    fewer_running = (ev.running_inside or 0) < (ev.running_before or 0)
    if full or fewer_running:
        return (
            f"KV token usage {_f(ev.token_usage_inside)} and {_f(ev.running_inside)} running requests "
            f"(before: {_f(ev.running_before)}): the KV cache limits the batch, so queued requests cannot join it",
            "Re-run the same load with more KV cache room (SGLang `--mem-fraction-static` up, vLLM "
            "`--gpu-memory-utilization` up, or a smaller `--max-model-len`/context) and compare the "
            "throughput and queue inside this range.",
        )
    return (
        f"{_f(ev.running_inside)} running requests (before: {_f(ev.running_before)}) at lower "
        "throughput: each step got slower (longer contexts, prefill interleaved with decode, or a host stall)",
        "Profile the server over this window (SGLang `/start_profile`, vLLM `--profiler-config`/"
        "`VLLM_TORCH_PROFILER_DIR`) and check what the decode steps wait on; or cap prefill per step "
        "(`--chunked-prefill-size`, `--max-num-batched-tokens`) and compare.",
    )


def _finding(con, run, params, where, samples, found, number) -> Finding:
    ids = {
        "baseline_first_event_id": samples[found["base"]].event_id,
        "first_event_id": samples[found["first"]].event_id,
        "last_event_id": samples[found["last"]].event_id,
    }
    ev = one(con, EVIDENCE_SQL, {**where, **ids})
    before, inside = ev.throughput_before, ev.throughput_inside
    drop = 1 - inside / before
    length = int(found["end_ns"] - found["start_ns"])
    server = where["name"].split(".")[0]
    cause, experiment = _cause(ev)
    stats = ev._asdict()
    return Finding(
        rule="S001",
        severity="warning" if drop >= params["warning_drop"] and length > 0 else "info",
        confidence=0.6 if ev.samples_inside == 1 else 0.75,
        title=(
            f"{server} decode throughput {_f(inside)} tok/s, {drop:.0%} below the {_f(before)} tok/s before, "
            f"while the queue grew from {_f(ev.queue_before)} to {_f(ev.queue_max_inside)} for {duration(length)}"
        ),
        locality=locality(
            run,
            pid=where["pid"],
            tid=where["tid"],
            thread_name=f"{server} engine {where['tid']}",
            op=where["name"],
            step=number,
            window_ns=[found["start_ns"], found["end_ns"]],
        ),
        observed=Quantity(
            round(inside, 3),
            "tok/s",
            f"mean generation throughput over {ev.samples_inside} stats lines; queue "
            f"{_f(ev.queue_inside)}, running {_f(ev.running_inside)}, token usage {_f(ev.token_usage_inside)}",
        ),
        expected=Quantity(
            round(before, 3),
            "tok/s",
            f"mean over the {ev.samples_before} lines before; queue {_f(ev.queue_before)}, running "
            f"{_f(ev.running_before)}, token usage {_f(ev.token_usage_before)}",
        ),
        impact_ns=length,
        window_ns=run.window_ns,
        sql=EVIDENCE_SQL,
        sql_params={**where, **ids},
        sample_event_ids=[int(samples[k].event_id) for k in range(found["first"], found["last"] + 1)][:10],
        hypothesis=f"The server fell behind its load: {cause}.",
        next_experiment=experiment,
        acceptance=rerun(
            "log of the same load (the same range of stats lines)",
            f"throughput_inside stays within {params['min_drop']:.0%} of throughput_before, or queue_max_inside "
            "stays at or below queue_before; S001 no longer reports this range.",
        ),
        caveats=[
            "log statistics are averages over each logging interval and timestamps have one-second resolution",
        ],
        extra={
            "drop_share": round(drop, 4),
            "before": {k.removesuffix("_before"): v for k, v in stats.items() if k.endswith("_before")},
            "inside": {k.removesuffix("_inside"): v for k, v in stats.items() if k.endswith("_inside")},
            "queue_max_inside": ev.queue_max_inside,
        },
    )


def _f(value) -> str:
    return "n/a" if value is None else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
