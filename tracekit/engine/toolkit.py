"""What rules share beyond SQL: the runs and their windows, thread names, Python code paths and
enclosing ops of an event, unit formatting."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


@dataclass
class RunInfo:
    run_id: int
    label: str
    rank: int | None
    start_ns: int | None
    end_ns: int | None

    @property
    def window_ns(self) -> int:
        return int((self.end_ns or 0) - (self.start_ns or 0))

    def locality(self) -> dict:
        return {"run_id": self.run_id, "run_label": self.label, "rank": self.rank}


class Context:
    """What a rule may ask beyond SQL: the runs, their windows, and shared lookups."""

    def __init__(self, con):
        self.con = con
        rows = con.execute("SELECT run_id, label, rank, start_ns, end_ns FROM runs ORDER BY run_id").fetchall()
        self.runs = [RunInfo(*r) for r in rows]

    def run(self, run_id: int) -> RunInfo:
        return next(r for r in self.runs if r.run_id == run_id)

    def thread_name(self, run_id: int, pid: int, tid: int) -> str | None:
        row = self.con.execute(
            "SELECT name FROM threads WHERE run_id = ? AND pid = ? AND tid = ?", [run_id, pid, tid]
        ).fetchone()
        return row[0] if row else None

    def code_path(self, event_id: int | None, limit: int = 6) -> list[str]:
        """Python frames around an event, innermost first: the frames on its thread that contain it."""
        if event_id is None:
            return []
        rows = self.con.execute(
            """
            SELECT f.name FROM events e JOIN python_functions f
              ON f.run_id = e.run_id AND f.pid = e.pid AND f.tid = e.tid
             AND f.ts_ns <= e.ts_ns AND f.end_ns >= e.end_ns
            WHERE e.event_id = ? ORDER BY f.depth DESC LIMIT ?
            """,
            [event_id, limit],
        ).fetchall()
        # builtin frames name a live object ("... object at 0x7f..."): drop the address so locality,
        # and with it the finding id, is the same in every run
        return [_ADDRESS.sub("", r[0]) for r in rows]

    def ancestors(self, event_id: int, limit: int = 64) -> list[tuple[int, str, str]]:
        """(event_id, kind, name) of the event's ancestors, nearest first, by rowid point lookups
        (a recursive CTE would join the whole table once per level)."""
        out = []
        parent = self.con.execute("SELECT parent_id FROM event_rows WHERE rowid = ?", [event_id]).fetchone()
        current = parent[0] if parent else None
        while current is not None and len(out) < limit:
            row = self.con.execute("SELECT kind, name, parent_id FROM event_rows WHERE rowid = ?", [current]).fetchone()
            if row is None:
                break
            out.append((current, row[0], row[1]))
            current = row[2]
        return out

    def enclosing_op(self, event_id: int, outermost: bool = False) -> tuple[int, str, str | None] | None:
        """The nearest (or outermost) cpu_op above an event, as (event_id, name, input dims).
        ProfilerStep#N, a cpu_op in old traces, is a step, not an op."""
        ops = [(i, n) for i, k, n in self.ancestors(event_id) if k == "cpu_op" and not n.startswith("ProfilerStep#")]
        if not ops:
            return None
        op_id, name = ops[-1] if outermost else ops[0]
        dims = self.con.execute(
            "SELECT CAST(coalesce(args->'Input Dims', args->'Input dims') AS VARCHAR) FROM event_rows WHERE rowid = ?",
            [op_id],
        ).fetchone()[0]
        return op_id, name, dims


def user_frame(code_path: list[str]) -> str:
    """The innermost nn.Module and user frame of a code path (innermost first), e.g.
    `nn.Module: Linear_3 in model.py(241): decode`; torch internals and builtins are skipped."""
    module = next((f for f in code_path if f.startswith("nn.Module")), None)
    user = next((f for f in code_path if not f.startswith(("torch/", "<built-in", "nn.Module", "<"))), None)
    parts = [p for p in (module, user) if p]
    return " in ".join(parts) if parts else (code_path[0] if code_path else "")


def ms(ns) -> str:
    return f"{(ns or 0) / 1e6:.2f} ms"


def us(ns) -> str:
    return f"{(ns or 0) / 1e3:.0f} us"
