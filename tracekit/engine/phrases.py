"""Text several rules say alike, written once so findings read the same whichever rule reports them."""

from __future__ import annotations

import re

# How to capture a repeated loop body, shared by the rules whose fix is a CUDA graph.
CUDA_GRAPH_RECIPE = (
    '`torch.compile(model, mode="reduce-overhead")`, or `torch.cuda.CUDAGraph` with static input/output '
    "buffers (warm up on a side stream, capture once, copy the new inputs in and `graph.replay()` per step)"
)


def rerun(artifact: str, outcome: str) -> str:
    """The acceptance sentence: what the evidence SQL shows on the re-profiled artifact once fixed."""
    return f"Re-run the evidence SQL on the new {artifact}: {outcome}"


def code_path_hint(where: str) -> str:
    """` (code path: X)` after an instruction, or nothing when the code path is unknown."""
    return f" (code path: {where})" if where else ""


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def thread_label(thread_name: str | None, tid) -> str:
    """`thread 4830 (kv_transfer)` -> `kv_transfer`; an unnamed thread -> `tid 4830`."""
    if not thread_name:
        return f"tid {tid}"
    m = re.fullmatch(r"thread \d+ \((.*)\)", thread_name)
    return m.group(1) if m else thread_name
