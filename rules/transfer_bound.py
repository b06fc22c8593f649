"""GPU time dominated by memory copies (G004 transfer-bound).

## What it does
Per device, measures the time the device is busy with copies and memsets while no kernel runs
(`gpu_busy_layers`: the `all` layer minus the `kernel` layer) and reports a device where that is at
least `min_busy_share` of its busy time. The finding breaks the copies down by direction (`HtoD`,
`DtoH`, `DtoD`, `PtoP`) and host memory (`pageable`, `pinned`, as the copy names say), with their
count, bytes, time and achieved bandwidth (bytes over the copies' summed GPU time), and compares
host-device copies against the rate of the device's host link:

| device (name contains) | host link | GB/s per direction |
|---|---|---|
| GH200, GB200, GB300 | NVLink-C2C | 450 |
| H100, H200, H800, H20, B100, B200, MI300, MI325 | PCIe Gen5 x16 | 63 |
| A100, A800, A30, A10, A40, A16, A2, L40, L4, RTX A, RTX 30, RTX 40, MI250, MI210, MI100 | PCIe Gen4 x16 | 31.5 |
| V100, P100, T4, RTX 20, TITAN V | PCIe Gen3 x16 | 15.75 |

PCIe rates are the PCI-SIG line rates (8, 16, 32 GT/s per lane, 128b/130b coding, 16 lanes); the
device-to-link mapping and NVLink-C2C's 900 GB/s (both directions) are the interconnect rows of the
NVIDIA and AMD datasheets. Pinned copies reach 80-90% of the line rate: 55.2 GB/s, 88% of Gen5
x16, on the project's H200 (`sample_traces/transfer_bound_pinned.json.gz`). A copy direction
below `link_efficiency` of its link's rate is slower than the link. When the device is not in the
table (or a PCIe card sits in a slower slot, or a V100 is attached to POWER9 by NVLink), the
finding compares pageable against pinned copies of the same direction where the run has both, and
says that the link is unknown.

## Why it matters
A device that spends most of its busy time copying is bound by the link, not by compute: faster
kernels change nothing. Typical causes: weights or KV blocks streamed from the host every step
(offloading), inputs copied synchronously from pageable memory, results copied back every step.
Pageable copies are staged by the driver through a pinned bounce buffer, run at a fraction of the
link's rate and block the calling thread (H001 host-sync reports the blocking).

## Example
The H200 weight-streaming sample (`sample_traces/transfer_bound_pageable.json.gz`): every forward
copies 12 fp32 4096x4096 weights host-to-device from pageable memory; the copies are 99.7% of the
GPU's busy time (465 ms, 72% of the window), 3.00 GiB at 6.9 GB/s, 11% of PCIe Gen5 x16; the
kernels take 1.3 ms. The same loop from pinned memory (`transfer_bound_pinned.json.gz`) copies at
55.2 GB/s and its window shrinks from 645 ms to 71 ms, still transfer-bound.

## Reading the trace's own evidence
Before proposing to overlap the copies, the rule looks for the overlapped variant in the trace
itself (rules/_variants.py): step groups of one run on the device that run the same kernel
families and copy the same bytes per step, one of them on more streams. When the overlapped steps
are slower, the next experiment is not overlap but fewer, larger chunks or the serial schedule,
with both groups' step times and step counts; when they are faster, it says overlap already pays
here and points at applying it; a tie says what overlap could hide at most and to cut the bytes.
`extra.variants` holds both groups. On the overlap matrix: copies overlapped in 4 chunks lose 6x at
the small size (0.72 vs 4.51 ms per step), tie at the medium one (5.53 vs 5.68 ms) and pay 7.6% at
the large one (49.7 vs 45.9 ms).

## Checked on
The corpus sweep (tests/test_corpus_sweep.py: every corpus input and sample, warning/critical
findings against reviewed expectations), the project's H200 weight-streaming samples (pageable and
pinned) and the H200 overlap matrix (tests/data/overlap_matrix, scripts/make_overlap_matrix.py: 4
layers, serial vs 4-chunk overlap steps, copies or a second stream's matmul, matmul edge 256 / 2048
/ 6144): each copy cell's verdict matches the schedules' step times measured without the profiler
(tests/test_overlap_matrix.py); the matmul cells copy nothing and get no G004 finding.

## Options
- `min_busy_share` (0.5): report a device whose copy-only time is at least this share of its busy time.
- `min_share` (0.01): and at least this share of the run's window.
- `link_efficiency` (0.7): a host-device direction achieving less than this share of the link's
  rate is slower than the link.
- `critical_share` (0.25): severity critical when the copy-only time is at least this share of the
  run's window.
- `warning_share` (0.05): severity warning from this share on; below it, info.
- `variant_min_change` (0.03): when the trace holds both a serial and an overlapped variant of the
  same copies (step groups with the same kernels and copied bytes, one running them on more
  streams), step times differing by less than this share (or within the steps' noise) are a tie.
  The overlap matrix (`tests/data/overlap_matrix`) sets it: profiled differences of 4.9% and more
  keep their sign without the profiler, the 2.7% of the medium copy cell flips (-1.7% unprofiled).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tracekit.engine import quality
from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _variants
from tracekit.units import bandwidth, duration, share, size

# What the copy share rests on, for data-quality checks that undermine it.
_USES = (quality.GPU_TIMELINE,)


@dataclass(frozen=True)
class Link:
    name: str
    gb_per_s: float  # per direction, 1e9 bytes/s


PCIE_GEN3, PCIE_GEN4, PCIE_GEN5 = Link("PCIe Gen3 x16", 15.75), Link("PCIe Gen4 x16", 31.5), Link("PCIe Gen5 x16", 63.0)
NVLINK_C2C = Link("NVLink-C2C", 450.0)

# First match wins: the Grace superchips before the GPUs their names contain.
HOST_LINKS: tuple[tuple[tuple[str, ...], Link], ...] = (
    (("GH200", "GB200", "GB300"), NVLINK_C2C),
    (("H100", "H200", "H800", "H20", "B100", "B200", "MI300", "MI325"), PCIE_GEN5),
    (
        ("A100", "A800", "A30", "A10", "A40", "A16", "A2", "L40", "L4", "RTX A", "RTX 30", "RTX 40")
        + ("MI250", "MI210", "MI100"),
        PCIE_GEN4,
    ),
    (("V100", "P100", "T4", "RTX 20", "TITAN V"), PCIE_GEN3),
)

# The run's devices whose copy-only time passes the thresholds.
DEVICES_SQL = """
SELECT device, busy_ns, kernel_ns, busy_ns - kernel_ns AS copy_only_ns
FROM (SELECT device, sum(dur_ns) FILTER (WHERE layer = 'all') AS busy_ns,
             coalesce(sum(dur_ns) FILTER (WHERE layer = 'kernel'), 0) AS kernel_ns
      FROM gpu_busy_layers WHERE run_id = $run_id AND layer IN ('all', 'kernel') GROUP BY device)
WHERE busy_ns > 0 AND busy_ns - kernel_ns >= $min_busy_share * busy_ns AND busy_ns - kernel_ns >= $min_share * $window
ORDER BY copy_only_ns DESC, device
"""

# One device's copies by direction and host memory, the largest first.
DIRECTIONS_SQL = """
SELECT coalesce(regexp_extract(name, 'Memcpy (HtoD|DtoH|DtoD|PtoP)', 1), '') AS direction,
       CASE WHEN contains(name, 'Pageable') THEN 'pageable' WHEN contains(name, 'Pinned') THEN 'pinned'
            WHEN contains(name, 'Host') THEN 'host' ELSE 'device' END AS memory,
       count(*) AS copies, sum(bytes) AS bytes, sum(dur_ns) AS copy_ns,
       list(event_id ORDER BY dur_ns DESC, event_id)[1:5] AS sample_event_ids
FROM gpu_activities WHERE run_id = $run_id AND device = $device AND kind = 'gpu_memcpy'
GROUP BY ALL ORDER BY copy_ns DESC, direction, memory
"""

# The evidence query: the device's busy time, its kernel time and the copy-only time between them.
DEVICE_SQL = """
SELECT sum(dur_ns) FILTER (WHERE layer = 'all') AS busy_ns,
       coalesce(sum(dur_ns) FILTER (WHERE layer = 'kernel'), 0) AS kernel_ns,
       sum(dur_ns) FILTER (WHERE layer = 'all') - coalesce(sum(dur_ns) FILTER (WHERE layer = 'kernel'), 0)
         AS copy_only_ns
FROM gpu_busy_layers WHERE run_id = $run_id AND device = $device AND layer IN ('all', 'kernel')
"""

# The call that launched the device's longest copy: its Python frames locate the copying code.
LONGEST_COPY_LAUNCH_SQL = """
SELECT l.runtime_event_id FROM first_launches l
WHERE l.run_id = $run_id AND l.device = $device AND l.gpu_kind = 'gpu_memcpy'
ORDER BY l.gpu_dur_ns DESC, l.gpu_event_id LIMIT 1
"""


@rule(
    code="G004",
    name="transfer-bound",
    title="GPU time dominated by memory copies",
    category="gpu",
    requires=("gpu_activities",),
    params={
        "min_busy_share": Param(0.5, "copy-only share of the device's busy time to report", "ratio"),
        "min_share": Param(0.01, "smallest share of the run window worth reporting", "ratio"),
        "link_efficiency": Param(0.7, "host-device copies below this share of the link's rate are slow", "ratio"),
        **share_params("the device's copy-only time over the run window", critical=0.25, warning=0.05),
        "variant_min_change": _variants.MIN_CHANGE,
    },
    example=Example(("transfer_bound_pageable.json.gz",)),
)
def check(con, params, ctx):
    for run in ctx.runs:
        window = run.window_ns
        if window <= 0:
            continue
        names = _device_names(con, run.run_id)
        found = rows(
            con,
            DEVICES_SQL,
            {
                "run_id": run.run_id,
                "min_busy_share": params["min_busy_share"],
                "min_share": params["min_share"],
                "window": window,
            },
        )
        for device in found:
            directions = rows(con, DIRECTIONS_SQL, {"run_id": run.run_id, "device": device.device})
            yield quality.qualify(
                ctx, _finding(con, ctx, run, params, device, directions, names.get(device.device)), _USES
            )


def host_link(device_name: str | None) -> Link | None:
    """The host link of a device by its name (table above), None when not known."""
    for patterns, link in HOST_LINKS:
        if device_name and any(p in device_name for p in patterns):
            return link
    return None


def _device_names(con, run_id: int) -> dict[int, str]:
    raw = con.execute("SELECT device_properties FROM runs WHERE run_id = ?", [run_id]).fetchone()
    props = json.loads(raw[0]) if raw and raw[0] else []
    return {int(p["id"]): p["name"] for p in props if isinstance(p, dict) and "id" in p and p.get("name")}


def _gbps(bytes_: int | None, ns: int) -> float | None:
    return bytes_ / ns if bytes_ and ns else None  # bytes per ns = GB/s


def _memory_words(d) -> str:
    if d.memory in ("pageable", "pinned"):
        return f" from {d.memory} memory" if d.direction == "HtoD" else f" to {d.memory} memory"
    return ""


def _describe(d, link: Link | None, params, pinned_gbps: dict) -> tuple[str, dict]:
    """One direction's sentence and its record for `extra`."""
    gbps = _gbps(d.bytes, d.copy_ns)
    host_side = d.direction in ("HtoD", "DtoH")
    record = {
        "direction": d.direction or "other",
        "memory": d.memory,
        "copies": int(d.copies),
        "bytes": int(d.bytes) if d.bytes is not None else None,
        "copy_ns": int(d.copy_ns),
        "achieved_gbps": round(gbps, 2) if gbps else None,
        "link": link.name if link and host_side else None,
        "link_gbps": link.gb_per_s if link and host_side else None,
        "below_link": bool(gbps and link and host_side and gbps < params["link_efficiency"] * link.gb_per_s),
    }
    amount = size(d.bytes) if d.bytes else "unknown bytes"
    text = f"{amount} {d.direction or 'copied'}{_memory_words(d)} in {int(d.copies)} copies ({duration(d.copy_ns)})"
    if gbps:
        text += f" at {bandwidth(d.bytes, d.copy_ns)}"
        if link and host_side:
            text += f", {share(gbps / link.gb_per_s)} of {link.name} ({link.gb_per_s:g} GB/s)"
        elif host_side and d.memory == "pageable" and pinned_gbps.get(d.direction):
            text += f" (pinned copies of this run: {pinned_gbps[d.direction]:.1f} GB/s; host link unknown)"
    return text, record


def _finding(con, ctx, run, params, device, directions, device_name) -> Finding:
    copy_only = int(device.copy_only_ns)
    link = host_link(device_name)
    pinned_gbps = {
        d.direction: _gbps(d.bytes, d.copy_ns) for d in directions if d.memory == "pinned" and _gbps(d.bytes, d.copy_ns)
    }
    described = [_describe(d, link, params, pinned_gbps) for d in directions]
    records = [r for _, r in described]
    # a direction with a sliver of the copy time (a 4-byte `.item()` read) stays in `extra`, not in the text
    sentences = [text for text, r in described if r["copy_ns"] >= 0.01 * copy_only] or [t for t, _ in described[:1]]
    main = directions[0] if directions else None
    share_of_busy = copy_only / device.busy_ns
    expected_ns = sum(
        int(r["bytes"] / r["link_gbps"]) if r["link_gbps"] and r["bytes"] else r["copy_ns"] for r in records
    )
    launch_event = rows(con, LONGEST_COPY_LAUNCH_SQL, {"run_id": run.run_id, "device": device.device})
    caveats = []
    if link is None:
        caveats.append(
            f"host link of {device_name or 'this device'} unknown: bandwidth is compared between pageable and "
            "pinned copies only"
        )
    variants = _variants.find(con, run.run_id, device.device, "copy", params["variant_min_change"])
    if any(r["direction"] == "PtoP" for r in records):
        caveats.append("peer-to-peer copies go over NVLink only where `nvidia-smi topo -m` shows NV# between the GPUs")
    return Finding(
        rule="G004",
        severity=by_share(copy_only / run.window_ns, params),
        confidence=0.9 if main is not None and main.bytes else 0.7,
        title=(
            f"{ctx.device_word(run.run_id)} {device.device} busy {share(share_of_busy)} of its time with copies ({duration(copy_only)}, "
            f"{share(copy_only / run.window_ns)} of the window): {sentences[0] if sentences else 'memsets'}"
        ),
        locality=locality(
            run,
            device=device.device,
            code_path=ctx.code_path(launch_event[0].runtime_event_id if launch_event else None),
        ),
        observed=Quantity(
            copy_only,
            "ns",
            f"time GPU {device.device} is busy with copies and memsets while no kernel runs, of "
            f"{duration(device.busy_ns)} busy ({duration(device.kernel_ns)} with kernels); by direction: "
            + "; ".join(sentences),
        ),
        expected=Quantity(
            expected_ns,
            "ns",
            "the same bytes at the host link's rate (pinned copies); 0 for data kept resident on the device",
        ),
        impact_ns=copy_only,
        window_ns=run.window_ns,
        sql=DEVICE_SQL,
        sql_params={"run_id": run.run_id, "device": device.device},
        sample_event_ids=list(main.sample_event_ids) if main is not None else [],
        hypothesis=(
            f"GPU {device.device} spends its busy time moving data, not computing "
            f"({share(device.kernel_ns / device.busy_ns)} of it runs kernels): the step is bound by the transfers"
            + (
                ", and pageable copies are staged by the driver through a bounce buffer at a fraction of the link's rate"
                if any(r["memory"] == "pageable" and r["copy_ns"] >= 0.5 * copy_only for r in records)
                else ""
            )
            + "."
            + (f" Overlap was tried: {variants.sentence()}." if variants else "")
        ),
        next_experiment=(
            _variants.next_experiment(variants, "copies", CUT_BYTES)
            if variants
            else next_experiment(main.direction if main else "", main.memory if main else "")
        ),
        acceptance=rerun(
            "trace",
            f"copy_only_ns falls below {params['min_busy_share']:.0%} of busy_ns (copies no longer dominate GPU "
            "time), or the copies reach the link's rate.",
        ),
        caveats=caveats,
        extra={
            "device_name": device_name,
            "busy_ns": int(device.busy_ns),
            "kernel_ns": int(device.kernel_ns),
            "copy_only_ns": copy_only,
            "copy_share_of_busy": round(share_of_busy, 4),
            "link": link.name if link else None,
            "link_gbps": link.gb_per_s if link else None,
            "directions": records,
            **({"variants": variants.record()} if variants else {}),
        },
    )


# What shortens a copy-bound step when overlapping the copies does not.
CUT_BYTES = (
    "cut the bytes copied per step: keep data reused across steps resident on the device or cache it there, "
    "copy only what changed, or copy it in a narrower dtype"
)


def next_experiment(direction: str, memory: str) -> str:
    """What to try, by the direction and host memory of the copies that take the most time."""
    if direction == "DtoD":
        return (
            "Find the ops that copy on the device (`.contiguous()`, `torch.cat`, `clone`, dtype casts) in the step and "
            "remove or fuse them; re-profile and compare the copy-only time."
        )
    if direction == "PtoP":
        return (
            "Check the GPUs' connection (`nvidia-smi topo -m`: NV# is NVLink, PIX/PHB/SYS go over PCIe) and overlap "
            "the peer copies with compute on a side stream; re-profile."
        )
    pin = (
        "pin the host memory (`pin_memory()` / `cudaMallocHost`) and copy with `non_blocking=True` "
        "(`cudaMemcpyAsync`) on a side stream so the copies overlap compute"
    )
    first = f"First {pin}. " if memory == "pageable" else ""
    stream = "prefetch the next chunk on a side stream while this one computes" if memory == "pageable" else pin
    return (
        f"{first}If the data is reused across steps (weights, embeddings, a KV cache), keep it resident on the "
        f"device or cache it there instead of copying it every step; if it must stream, {stream}. If pinned copies "
        "stay well below the link's rate, check the link: `nvidia-smi topo -m`, `nvidia-smi -q` (PCIe generation "
        "and link width, current vs max) and the process's NUMA node."
    )
