"""Blocking host calls in the steady state (H001 host-sync).

## What it does
Finds runtime calls that block the launching CPU thread until the GPU catches up, repeated at the
same call site: `cudaDeviceSynchronize`, `cudaStreamSynchronize`, `cudaEventSynchronize` (and
their `hip*`/`cu*` forms), synchronous `cudaMemcpy`/`cudaMemset`, and async copies into pageable
host memory (which the driver turns synchronous): the `host_blocking` view. A call site is the
thread, the call, the region it ran in (the innermost user annotation or `nn.Module`, e.g.
`## sparse_data_dist ##`) and the op that issued it (e.g. `aten::_local_scalar_dense`, i.e.
`tensor.item()`), so the finding names the part of the step and the line of code to change.

A site whose calls are copies, or the stream syncs that `aten::copy_` (`x.to("cuda")`, `.cpu()`)
issues after its copy when it is not `non_blocking`, is named as the copy: its direction and memory
kinds as the copy's GPU record names them (`Memcpy HtoD (Pageable -> Device)`, from Kineto or from
the nsys `copyKind`/`srcKind`/`dstKind` columns; `host_blocking.copy_direction`, `copy_src`,
`copy_dst`), bytes per call and the bandwidth it achieved, and the next experiment follows the host
side's memory: a pageable source is pinned (`pin_memory()`) and copied with `non_blocking=True`, a
pinned one only needs `non_blocking=True`, and a read back goes into a pinned buffer with
`non_blocking=True` and an event instead of `.cpu()`/`.item()`. A sync in another op
(`aten::_local_scalar_dense`) stays the implicit sync it stands for.

A site has two costs, reported apart (`host_blocking` defines both):

- GPU idle after its calls: each idle gap of the run's main device that the host ended is charged
  once, to the op invocation that was waiting when the device drained (its longest blocking call:
  the pageable copy, not the stream sync after it), from the return until the next GPU work. A gap
  that queued work or a missing launch record ended is charged to no call. A call that starts with
  the GPU already idle returns at once and costs nothing. A device-to-host copy of more than
  `host_blocking_read_bytes()` (64 KiB) is charged nothing: the host waited for data it then works
  on, and the idle after it is that work (G001 gpu-idle reports it; on the MPI SAXPY trace of the
  corpus it is the MPI exchange of each iteration's 262 MB result), whereas a read of a few bytes
  (`.item()`) is a check that can be read a step late.
- Host time stalled in its calls: the part of the calls on a critical thread (one that launches
  work on the main device: the step's thread, the autograd thread of a training step) during which
  the device ran nothing either: the step is waiting on a queue elsewhere, a pageable copy's
  staging, a sync's wake-up.

Severity and impact follow the larger of the two: each is step time lost (the device waiting for
the host after the call, or both waiting during it), and they are not added because a gap's idle
after one call can hold the next call's stall. The time the host is blocked while the device works
is shown, but is not a cost: when the device is the bottleneck that wait is harmless, and a long
transfer it waits for is the transfer's time (G004 transfer-bound reports copies that dominate).

## Why it matters
While the host waits it enqueues nothing, so the GPU drains its queue and then idles until the
host launches again: every sync in a decode loop turns the launch queue's lookahead into a bubble.
`.item()`, `.cpu()`, `.tolist()`, `torch.nonzero` and printing a CUDA tensor all sync implicitly.
Mirrors the nsys expert rules `cuda_api_sync`, `cuda_memcpy_sync` and `cuda_memcpy_async`
(pageable), which list calls but do not say who issued them.

## Example
On the H200 eager decode sample (`sample_traces/gpu_prefill_decode_eager.json.gz`):
`cudaStreamSynchronize` 32 times from `aten::_local_scalar_dense` (`tensor.item()`) in
`decode_step` on the main thread, a per-step `if (next_token == eos).all().item(): break`; after
each return the GPU waits ~0.2 ms for the host to enqueue the next step, 6.9 ms of a 305 ms window.

Use instead: check the stop condition every N steps, or on a side stream with a pinned host buffer
and `non_blocking=True`, and read it one step late.

## Checked on
Blocking copies: the H200 copy matrix (tests/data/pageable_matrix, scripts/make_pageable_copy_trace.py):
16 KiB and 64 MiB uploads from pageable memory, from pinned memory without `non_blocking`, and
pinned with `non_blocking=True`; reads back by `.cpu()` and into a pinned buffer with an event read
a step late. Each blocking cell is reported as its copy with its fix (the 16 KiB pageable upload on
the stream sync `aten::copy_` issues after it), the pinned non_blocking twins, measured 1.5-17x
faster per step, get no finding (tests/test_pageable_matrix.py). Also the project's H200 samples
(weight streaming, a conv-net's batch upload, `.cpu()` of gradients before gloo, TorchRec-style
reads), Kineto's ResNet-50 and TorchRec corpus traces, and Nsight Systems exports of CloverLeaf and
an MPI SAXPY, whose `cudaMemcpy` kinds come from the `copyKind`/`srcKind`/`dstKind` columns.

## Options
- `min_calls` (3): a site must repeat this often to count as steady state.
- `min_share` (0.005): report sites whose cost (the larger of the GPU idle after their calls and
  the critical thread's stall in them) is at least this share of the run's window.
- `small_htod_bytes` (65536): synchronous host-to-device copies up to this size are exempt (as in nsys).
- `critical_share` (0.1): severity critical when a site's cost is at least this share of the run's
  window.
- `warning_share` (0.02): severity warning from this share on; below it, info.
- `all_phases` (False): measure every phase of the run. By default a call that returns in a warm-up,
  CUDA-graph capture or profiler window (`run_phases`) is dropped, idle inside such a window is not
  charged, and shares are of the run's steady time; the finding lists the windows in
  `extra.left_out`, and a run with no steady state at all is left to P001 cold-profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.engine import advice, quality
from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _phases
from tracekit.units import bandwidth, duration, size

# Every run's steady blocking calls, computed once per analysis into CALLS_TABLE: read per run from
# the macro, each run's query evaluated it for every run of the database (64 GPU ranks: 11.8 s of
# H001's 14.6, against 0.2 s once).
CALLS_TABLE = "_h001_calls"
CALLS_SQL = """
SELECT * REPLACE (name_key(site) AS site)
FROM steady_host_blocking($small_htod_bytes, all_phases := $all_phases)
"""
# Each run's repeated blocking call sites (thread, call, region, issuing op) over the thresholds, run by
# run ($windows: each run's window, which the share is of); the op is grouped by its name key as the
# region already is, so an annotation carrying a per-run id is one site (the events keep the raw name).
# `copies` breaks a site's calls down by the copy they moved or waited for (direction, source and
# destination memory), the kind that held the host longest first.
SITES_SQL = (
    """
WITH windows AS (
    SELECT unnest($run_ids) AS run_id, unnest($windows) AS window_ns
), calls AS MATERIALIZED (
    SELECT c.*, w.window_ns FROM """
    + CALLS_TABLE
    + """ c JOIN windows w USING (run_id)
), sites AS (
    SELECT run_id, pid, tid, call, region, site, any_value(blocking) AS blocking,
           bool_or(critical_thread) AS critical_thread,
           count(*) AS calls, count(*) FILTER (WHERE charged_idle_ns > 0) AS charged_calls, sum(dur_ns) AS blocked_ns,
           sum(stalled_ns) AS stalled_ns, min(ts_ns) AS first_ns, max(end_ns) AS last_ns,
           arg_max(event_id, dur_ns) AS worst_event_id,
           list(event_id ORDER BY greatest(charged_idle_ns, stalled_ns) DESC, dur_ns DESC, event_id)[1:5]
             AS sample_event_ids,
           median(dur_ns) AS median_ns, sum(charged_idle_ns) AS gpu_idle_after_ns
    FROM calls
    GROUP BY run_id, pid, tid, call, region, site
    HAVING count(*) >= $min_calls
       AND greatest(sum(charged_idle_ns), sum(stalled_ns)) >= $min_share * any_value(window_ns)
), kinds AS (
    SELECT run_id, pid, tid, call, region, site, copy_direction AS direction, copy_src AS src, copy_dst AS dst,
           count(*) AS calls, sum(copy_bytes) AS bytes, sum(copy_gpu_ns) AS gpu_ns, sum(dur_ns) AS blocked_ns
    FROM calls WHERE copy_direction IS NOT NULL
    GROUP BY ALL
), copies AS (
    SELECT run_id, pid, tid, call, region, site,
           list({'direction': direction, 'src': src, 'dst': dst, 'calls': calls, 'bytes': bytes, 'gpu_ns': gpu_ns}
                ORDER BY blocked_ns DESC, direction, src, dst) AS copies
    FROM kinds GROUP BY ALL
)
SELECT s.*, c.copies
FROM sites s
LEFT JOIN copies c ON c.run_id = s.run_id AND c.pid IS NOT DISTINCT FROM s.pid AND c.tid IS NOT DISTINCT FROM s.tid AND c.call = s.call
  AND c.region IS NOT DISTINCT FROM s.region AND c.site = s.site
ORDER BY s.run_id, greatest(s.gpu_idle_after_ns, s.stalled_ns) DESC, s.region, s.site, s.call
"""
)

# The evidence query: one site's two costs (GPU idle after its calls, the critical thread's stall in
# them), its calls and the time they blocked the host; for a copy site, the calls that moved or waited
# for the copy kind the finding names, their bytes and the copies' GPU time (bytes / ns = GB/s).
SITE_SQL = """
SELECT sum(charged_idle_ns) AS gpu_idle_after_ns, sum(stalled_ns) AS stalled_ns, count(*) AS calls,
       count(*) FILTER (WHERE charged_idle_ns > 0) AS charged_calls, sum(dur_ns) AS host_blocked_ns,
       min(ts_ns) AS first_ns, max(end_ns) AS last_ns,
       count(*) FILTER (WHERE copy_direction = $direction AND copy_src IS NOT DISTINCT FROM $src
                        AND copy_dst IS NOT DISTINCT FROM $dst) AS copy_calls,
       sum(copy_bytes) FILTER (WHERE copy_direction = $direction AND copy_src IS NOT DISTINCT FROM $src
                               AND copy_dst IS NOT DISTINCT FROM $dst) AS copy_bytes,
       sum(copy_gpu_ns) FILTER (WHERE copy_direction = $direction AND copy_src IS NOT DISTINCT FROM $src
                                AND copy_dst IS NOT DISTINCT FROM $dst) AS copy_gpu_ns
FROM steady_host_blocking($small_htod_bytes, all_phases := $all_phases)
WHERE run_id = $run_id AND pid IS NOT DISTINCT FROM $pid AND tid IS NOT DISTINCT FROM $tid AND call = $call
  AND region IS NOT DISTINCT FROM $region AND name_key(site) = $site
"""


# What H001's numbers rest on, for data-quality checks that undermine them.
_USES = (quality.GPU_TIMELINE,)
# Blocking copies: on the launching thread their own duration is the cost when the GPU records are in doubt.
_COPIES = ("pageable async memcpy", "sync memcpy")


@rule(
    code="H001",
    name="host-sync",
    title="Blocking host call in the steady state",
    category="host",
    requires=("runtime_calls",),
    params={
        "min_calls": Param(3, "a site must repeat at least this often", "calls"),
        "min_share": Param(0.005, "smallest share of the run window worth reporting (the larger cost)", "ratio"),
        "small_htod_bytes": Param(65536, "sync HtoD copies up to this size are exempt", "bytes"),
        **share_params(
            "the site's cost (the larger of the GPU idle after its calls and the critical thread's stall in "
            "them) over the run window",
            critical=0.10,
            warning=0.02,
        ),
        "all_phases": _phases.ALL_PHASES,
    },
    example=Example(("gpu_prefill_decode_eager.json.gz",)),
)
def check(con, params, ctx):
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {CALLS_TABLE} AS {_phases.in_rule(con, ctx, CALLS_SQL)}",
        {"small_htod_bytes": params["small_htod_bytes"], "all_phases": params["all_phases"]},
    )
    try:
        yield from _findings(con, params, ctx)
    finally:
        con.execute(f"DROP TABLE IF EXISTS {CALLS_TABLE}")


def _findings(con, params, ctx):
    windows = {}
    for run in ctx.runs:
        window = _phases.window(con, ctx, run, params)
        if window > 0 and not _phases.skip_run(con, ctx, run.run_id, params):
            windows[run.run_id] = window
    if not windows:
        return
    # every run's sites in one statement: per run, its planning cost more than its work on small ranks
    by_run: dict[int, list] = {}
    for site in rows(
        con,
        SITES_SQL,
        {
            "run_ids": list(windows),
            "windows": list(windows.values()),
            "min_calls": params["min_calls"],
            "min_share": params["min_share"],
        },
    ):
        by_run.setdefault(site.run_id, []).append(site)
    for run in ctx.runs:
        if run.run_id not in windows:
            continue
        window, sites = windows[run.run_id], by_run.get(run.run_id, [])
        gpu_doubted = any(c.caps_severity and quality.GPU_TIMELINE in c.affects for c in ctx.data_quality(run.run_id))
        for site in sites:
            left_out = _phases.run_left_out(con, ctx, run, params)
            if gpu_doubted and site.critical_thread and site.blocking in _COPIES:
                # a copy's own duration on the launching thread is a host record: it holds whatever the GPU
                # records miss, so the finding is rated by it, with the GPU figures kept as context
                yield quality.qualify(ctx, _finding(ctx, run, params, site, window, left_out, by_host=True), ())
            else:
                yield quality.qualify(ctx, _finding(ctx, run, params, site, window, left_out), _USES)


# The ops whose stream sync is the sync of the copy they make: `x.to("cuda")`, `.cpu()`, `dst.copy_(src)`
# without `non_blocking=True`. Another op's sync (`.item()` in `aten::_local_scalar_dense`) is the value
# read it stands for, whatever small copy comes with it.
_COPY_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")
_DIRECTIONS = {"HtoD": "host-to-device", "DtoH": "device-to-host", "DtoD": "device-to-device", "PtoP": "peer-to-peer"}


@dataclass(frozen=True)
class _Copy:
    """The kind of copy a site's calls moved or waited for, with its totals over those calls."""

    direction: str
    src: str | None
    dst: str | None
    calls: int
    bytes: int
    gpu_ns: int

    @property
    def host_memory(self) -> str | None:
        """The host side's memory (`Pageable`, `Pinned`): what decides whether the copy can be asynchronous."""
        return {"HtoD": self.src, "DtoH": self.dst}.get(self.direction)

    def kind(self) -> str:
        """`host-to-device copies from pageable memory`."""
        host = self.host_memory
        memory = f" {'from' if self.direction == 'HtoD' else 'to'} {host.lower()} memory" if host else ""
        return f"{_DIRECTIONS.get(self.direction, self.direction)} copies{memory}"

    def phrase(self) -> str:
        """`host-to-device copies from pageable memory (Pageable -> Device, 64.0 MiB each at 6.93 GB/s)`."""
        kinds = f"{self.src} -> {self.dst}, " if self.src and self.dst else ""
        each = f"{size(self.bytes / self.calls)} each" if self.bytes else "size not recorded"
        rate = f" at {bandwidth(self.bytes, self.gpu_ns)}" if self.bytes and self.gpu_ns else ""
        return f"{self.kind()} ({kinds}{each}{rate})"

    def as_dict(self) -> dict:
        return {
            "direction": self.direction,
            "src": self.src,
            "dst": self.dst,
            "calls": self.calls,
            "bytes": self.bytes,
            "bytes_per_call": self.bytes // self.calls if self.calls else 0,
            "gpu_ns": self.gpu_ns,
            "gb_per_s": round(self.bytes / self.gpu_ns, 3) if self.gpu_ns else None,
        }


def _copies(s) -> list[_Copy]:
    """The copies a site is about: every call of a copy, a sync's only when its op is a copy op."""
    if not s.copies or (s.blocking == "sync" and s.site not in _COPY_OPS):
        return []
    return [
        _Copy(c["direction"], c["src"], c["dst"], int(c["calls"]), int(c["bytes"] or 0), int(c["gpu_ns"] or 0))
        for c in s.copies
    ]


def _finding(ctx, run, params, s, window, left_out, by_host: bool = False) -> Finding:
    idle, stalled = int(s.gpu_idle_after_ns), int(s.stalled_ns)
    cost = int(s.blocked_ns) if by_host else max(idle, stalled)
    copies = _copies(s)
    copy = copies[0] if copies else None
    implicit = s.blocking == "sync" and not copy
    calls = f"{s.charged_calls} of {s.calls}" if 0 < s.charged_calls < s.calls else f"{s.calls}"
    where = f"{s.region} / {s.site}" if s.region and s.region != s.site else s.site
    thread = "launching thread" if s.critical_thread else "thread"
    host = f"{thread} blocked {duration(s.blocked_ns)} in them" + (
        f", {duration(stalled)} of it with the GPU idle" if stalled else ""
    )
    gpu = f"GPU idle {duration(idle)} after them" if idle else ""
    costs = [host, gpu] if stalled > idle else [gpu, host]
    title = f"{s.calls} blocking {s.call}{_what(s, where, copies)}: " + "; ".join(c for c in costs if c)
    launch = {"call": s.call, **({"region": s.region} if s.region else {})}
    context = ctx.workload(run.run_id)
    advised = advice.blocking_call(
        context, s.blocking, where, direction=copy and copy.direction, host_memory=copy and copy.host_memory
    )
    return Finding(
        rule="H001",
        severity=advised.cap(by_share(cost / window, params)),
        confidence=0.9 if implicit else 0.8,
        title=title,
        locality=locality(
            run,
            **ctx.thread(run.run_id, s.pid, s.tid),
            op=s.site,
            code_path=ctx.code_path(s.worst_event_id),
            window_ns=[s.first_ns, s.last_ns],
            launch=launch,
        ),
        observed=Quantity(
            cost,
            "ns",
            (
                f"the {thread} was blocked {duration(s.blocked_ns)} in {s.calls} calls (host records; the GPU records "
                "of this run are incomplete, see the data-quality caveat), "
                if by_host
                else ""
            )
            + f"the larger of two costs: GPU idle on the main device from the return of {calls} calls (the op "
            f"invocations waiting when the GPU drained, each gap counted once) until the next GPU work, "
            f"{duration(idle)}; and the time the {thread} was blocked in the calls with the main device idle "
            f"too, {duration(stalled)}. The host was blocked {duration(s.blocked_ns)} in all "
            f"(median {duration(s.median_ns)} per call)",
        ),
        expected=Quantity(0, "ns", "no blocking call inside the steady-state loop"),
        impact_ns=cost,
        window_ns=window,
        sql=SITE_SQL,
        sql_params={
            "run_id": run.run_id,
            "pid": s.pid,
            "tid": s.tid,
            "call": s.call,
            "region": s.region,
            "site": s.site,
            "small_htod_bytes": params["small_htod_bytes"],
            "all_phases": params["all_phases"],
            "direction": copy and copy.direction,
            "src": copy and copy.src,
            "dst": copy and copy.dst,
        },
        sample_event_ids=s.sample_event_ids,
        hypothesis=_hypothesis(s, where, implicit, stalled > idle, context, copy),
        next_experiment=advised.text,
        acceptance=rerun(
            "trace",
            _fixed_copy(copy)
            + f"calls at this site drop to 0 (or below {params['min_calls']}), or both costs fall below "
            f"{params['min_share']:.1%} of the window, and rule G001 reports less idle time on the stream it fed.",
        ),
        extra={
            "region": s.region,
            "gpu_idle_after_ns": idle,
            "stalled_ns": stalled,
            "host_blocked_ns": int(s.blocked_ns),
            "critical_thread": bool(s.critical_thread),
            "cost": "host_blocked" if by_host else "host_stall" if stalled > idle else "gpu_idle",
            "copy": copy.as_dict() if copy else None,
            "copies": [c.as_dict() for c in copies],
            "left_out_ns": sum(w["dur_ns"] for w in left_out),
            "left_out": _phases.listed(left_out),
        },
        caveats=[
            note
            for note in [
                "the GPU records of this run are incomplete (see its data-quality notes): the GPU idle and stall "
                "figures are context only; the cost is the time the launching thread spent inside these copies"
                if by_host
                else None,
                _phases.caveat(left_out, "the site's calls and the run window"),
            ]
            if note
        ],
    )


def _what(s, where: str, copies: list[_Copy]) -> str:
    """Where the site's calls are and what they are: the copy they make or wait for, else the kind of
    blocking call."""
    if not copies:
        return f" ({s.blocking}) in {where}"
    named = (" after " if s.blocking == "sync" else ", ") + copies[0].phrase()
    others = ", ".join(f"{c.calls} {c.kind()}" for c in copies[1:])
    return f" in {where}{named}" + (f"; also {others}" if others else "")


def _fixed_copy(copy: _Copy | None) -> str:
    """The acceptance's first clause for a copy site: the copies no longer touch pageable memory."""
    if not copy or copy.host_memory != "Pageable":
        return ""
    pinned = "Pinned -> Device" if copy.direction == "HtoD" else "Device -> Pinned"
    return f"the copies at this site are `{pinned}` (host_blocking.copy_src/copy_dst) or gone, and "


def _hypothesis(s, where: str, implicit: bool, stalls: bool, context, copy: _Copy | None) -> str:
    if copy:
        what = copy.phrase()
        if s.blocking == "sync":
            what = (
                f"{s.call} is the stream sync {s.site} issues after its {what}, a copy made without non_blocking=True"
            )
        elif copy.host_memory == "Pageable" and copy.direction == "HtoD":
            what = (
                f"{s.call} makes {what}; the driver stages pageable memory through a pinned buffer of its own, "
                "synchronising with the stream first where it must, so the call holds the thread until the data is "
                "staged"
            )
        elif copy.host_memory == "Pageable" and copy.direction == "DtoH":
            what = (
                f"{s.call} makes {what}; a copy into pageable memory returns only once it has completed, after the "
                "work queued before it"
            )
        else:
            what = f"{s.call} makes {what}"
    elif context.framework == "native":
        what = f"{s.call} ({s.blocking})"
    else:
        what = "an implicit sync such as .item()/.cpu()/.tolist()" if implicit else s.blocking
    return f"{where} forces the host to wait for the GPU every time it runs ({what}); " + (
        "while it waits the device has nothing to run either, so the step waits on both."
        if stalls
        else "while it waits nothing is enqueued, so the GPU idles after each call."
    )
