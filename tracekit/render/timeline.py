"""A timeline small enough for a web page: one lane per GPU stream and host thread, slices merged.

A browser draws a few tens of thousands of rectangles smoothly, not millions. Slices of one lane whose
gap is below `gap_ns` (about one pixel of the figure) are merged into a block that remembers how many
slices it holds, its busy time (the union of its slices, never more than the block's extent: a
mostly idle stream is not drawn as solid) and its longest slice's name and category. When the blocks of all lanes
still exceed `max_blocks`, the gap grows (x4) until they fit, so the page's size is bounded whatever
the trace's. Host lanes are the top-level (depth 0) events of each thread; GPU lanes hold kernels,
memcpys and memsets per (device, stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("compute", "communication", "memcpy/memset", "runtime", "host")

_BLOCKS_SQL = """
WITH src AS (
    SELECT 0 AS grp, device::VARCHAR || '/' || stream::VARCHAR AS lane, ts_ns, end_ns, name,
           CASE WHEN is_communication THEN 'communication' ELSE 'compute' END AS cat
    FROM kernels WHERE run_id = $run AND dur_ns > 0 AND ts_ns < $hi AND end_ns > $lo
    UNION ALL
    SELECT 0, device::VARCHAR || '/' || stream::VARCHAR, ts_ns, end_ns, name, 'memcpy/memset'
    FROM gpu_activities WHERE run_id = $run AND kind <> 'kernel' AND dur_ns > 0 AND ts_ns < $hi AND end_ns > $lo
    UNION ALL
    SELECT 1, coalesce(track, pid::VARCHAR || '/' || tid::VARCHAR), ts_ns, end_ns, name,
           CASE WHEN kind IN ('cuda_runtime', 'cuda_driver') THEN 'runtime' ELSE 'host' END
    FROM events WHERE run_id = $run AND ph = 'X' AND depth = 0 AND dur_ns > 0
      -- the profiler's own span and bookkeeping are not work on a thread
      AND NOT is_device_kind(kind) AND kind NOT IN ('profiler_span', 'overhead')
      AND ts_ns < $hi AND end_ns > $lo
), clipped AS (
    SELECT grp, lane, greatest(ts_ns, $lo) AS ts, least(end_ns, $hi) AS e, name, cat FROM src
), reach AS (
    SELECT *, max(e) OVER (PARTITION BY grp, lane ORDER BY ts, e
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM clipped
), marked AS (
    -- a slice adds to the busy union only the part past everything before it on its lane
    SELECT *, CASE WHEN ts <= reached + $gap THEN 0 ELSE 1 END AS starts,
           greatest(0, e - greatest(ts, coalesce(reached, ts))) AS adds
    FROM reach
), numbered AS (
    SELECT *, sum(starts) OVER (PARTITION BY grp, lane ORDER BY ts, e ROWS UNBOUNDED PRECEDING) AS blk FROM marked
)
SELECT grp, lane, min(ts) AS ts, max(e) AS e, count(*) AS n, arg_max(name, e - ts) AS name,
       arg_max(cat, e - ts) AS cat, sum(adds) AS busy_ns
FROM numbered GROUP BY grp, lane, blk ORDER BY grp, lane, ts
"""


@dataclass
class Block:
    start_ns: int
    end_ns: int
    slices: int  # how many trace slices it merges
    name: str  # the longest slice's name
    category: str  # the longest slice's category
    busy_ns: int  # the union of its slices: at most end - start, less where they leave gaps

    @property
    def busy_share(self) -> float:
        return self.busy_ns / max(1, self.end_ns - self.start_ns)


@dataclass
class Lane:
    key: str
    label: str
    kind: str  # "gpu" or "host"
    blocks: list[Block] = field(default_factory=list)

    @property
    def slices(self) -> int:
        return sum(b.slices for b in self.blocks)

    @property
    def busy_ns(self) -> int:
        return sum(b.busy_ns for b in self.blocks)


@dataclass
class Timeline:
    run_id: int
    lo_ns: int
    hi_ns: int
    gap_ns: int
    lanes: list[Lane]
    lanes_omitted: int
    slices: int

    @property
    def blocks(self) -> int:
        return sum(len(lane.blocks) for lane in self.lanes)


def build(con, run_id: int, lo_ns: int, hi_ns: int, max_blocks: int = 10_000, pixels: int = 1500,
          max_lanes: int = 40) -> Timeline:  # fmt: skip
    """The lanes of one run between lo_ns and hi_ns, merged to at most max_blocks blocks in all."""
    span = max(1, int(hi_ns) - int(lo_ns))
    gap = max(0, span // max(1, pixels))
    sql = _BLOCKS_SQL
    while True:
        rows = con.execute(sql, {"run": run_id, "lo": int(lo_ns), "hi": int(hi_ns), "gap": gap}).fetchall()
        lanes = _lanes(con, run_id, rows)
        lanes.sort(key=lambda lane: (lane.kind != "gpu", -lane.busy_ns if lane.kind == "host" else 0, lane.key))
        gpu = [lane for lane in lanes if lane.kind == "gpu"]
        host = [lane for lane in lanes if lane.kind == "host"]
        kept = gpu[:max_lanes] + host[: max(0, max_lanes - len(gpu[:max_lanes]))]
        total = sum(len(lane.blocks) for lane in kept)
        if total <= max_blocks or gap >= span:
            break
        gap = max(gap * 4, 1)
    kept.sort(key=lambda lane: (lane.kind != "gpu", _natural(lane.key) if lane.kind == "gpu" else -lane.busy_ns))
    return Timeline(run_id, int(lo_ns), int(hi_ns), gap, kept, len(lanes) - len(kept), sum(int(r[4]) for r in rows))


def _natural(key: str) -> tuple:
    return tuple(int(p) if p.lstrip("-").isdigit() else 0 for p in key.split("/"))


def _lanes(con, run_id: int, rows) -> list[Lane]:
    threads = {
        f"{pid}/{tid}": name
        for pid, tid, name in con.execute("SELECT pid, tid, name FROM threads WHERE run_id = ?", [run_id]).fetchall()
    }
    streams = {
        f"{d}/{s}": name
        for d, s, name in con.execute("SELECT device, stream, name FROM streams WHERE run_id = ?", [run_id]).fetchall()
    }
    lanes: dict[tuple, Lane] = {}
    for grp, key, ts, e, n, name, cat, busy_ns in rows:
        key = key or "?"
        lane = lanes.get((grp, key))
        if lane is None:
            if grp == 0:
                device, _, stream = key.partition("/")
                named = (streams.get(key) or "").strip()
                label = f"GPU {device} stream {stream}" + (
                    f" ({named})" if named and not named.startswith("stream") else ""
                )
            else:
                label = (threads.get(key) or "").strip() or f"thread {key}"
                if label.startswith("thread") is False and "/" not in label:
                    label = f"{label} [{key}]"
            lane = lanes[(grp, key)] = Lane(key, label, "gpu" if grp == 0 else "host")
        lane.blocks.append(Block(int(ts), int(e), int(n), name or "", cat, int(busy_ns)))
    return list(lanes.values())
