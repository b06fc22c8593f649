"""The rules' shared lookups (tracekit.engine.toolkit) on real traces."""

from __future__ import annotations

import tracekit
from tracekit.engine.toolkit import Context

from .conftest import sample


def test_lookups_of_many_events_together_equal_each_alone():
    """code_paths, ancestors_of and enclosing_ops answer for events of several runs and threads in a
    few queries; each event's answer is the one asked for it alone, also where chains share ancestors."""
    ranks = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]
    with tracekit.open(*ranks) as trace:
        con = trace.connection
        launches = [
            r[0]
            for r in con.execute(
                "SELECT event_id FROM runtime_calls WHERE name ILIKE '%LaunchKernel%' "
                "QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY ts_ns) % 97 IN (1, 2) ORDER BY event_id"
            ).fetchall()
        ]
        assert (
            len({con.execute("SELECT run_id FROM events WHERE event_id = ?", [e]).fetchone()[0] for e in launches}) == 2
        )
        ctx = Context(con)
        paths, chains = ctx.code_paths(launches + [None]), ctx.ancestors_of(launches)
        inner, outer = ctx.enclosing_ops(launches), ctx.enclosing_ops(launches, outermost=True)
        alone = Context(con)
        for e in launches:
            assert paths[e] == alone.code_paths([e])[e]
            assert chains[e] == alone.ancestors_of([e])[e]
            assert inner[e] == alone.enclosing_ops([e])[e] and outer[e] == alone.enclosing_ops([e], outermost=True)[e]
        # the answers say something: launches sit under ops and Python frames, and the chains of
        # consecutive launches meet
        assert all(paths[e] for e in launches) and all(inner[e] for e in launches)
        assert any(inner[e] != outer[e] for e in launches)
        nodes = [a.event_id for e in launches for a in chains[e]]
        assert len(nodes) > len(set(nodes))
        # a chain is the parent links: each ancestor is the parent of the one before it
        for e in launches:
            child = e
            for a in chains[e]:
                assert (
                    con.execute("SELECT parent_id FROM event_rows WHERE rowid = ?", [child]).fetchone()[0] == a.event_id
                )
                child = a.event_id
        assert None not in paths and ctx.code_paths([]) == {} and ctx.code_path(None) == []
