"""collective_arrivals: each rank's arrival at each collective on one clock, the clock taken from the
collectives themselves. On the project's gloo run, rank 1 sleeps 8 ms of host work before every
all-reduce (scripts/make_gloo_traces.py, STRAGGLER_HOST_MS): it must arrive last by about that, and
rank 0 must wait about that; shifting rank 1's clock by a second must change nothing but its offset."""

from __future__ import annotations

import tracekit

from .conftest import sample

RANKS = [sample("gloo_rank0.json.gz"), sample("gloo_rank1.json.gz")]
TP2 = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]
INJECTED_NS = 8_000_000


def _arrivals(trace, where: str = "TRUE") -> dict:
    rows = trace.sql(
        f"SELECT collective, seq, rank, last_rank, arrival_lag_ns, wait_ns, clock_offset_ns, end_spread_ns "
        f"FROM collective_arrivals WHERE {where} ORDER BY seq, rank"
    ).fetchall()
    return {(c, seq, rank): (last, lag, wait, offset, spread) for c, seq, rank, last, lag, wait, offset, spread in rows}


def test_the_rank_that_sleeps_before_each_all_reduce_arrives_last_by_that_much():
    with tracekit.open(*RANKS) as trace:
        arrivals = _arrivals(trace, "collective = 'all_reduce' AND seq > 1")  # seq 1: rank 1 starts 0.6 s late
    assert arrivals and {rank for _, _, rank in arrivals} == {0, 1}
    for (_, seq, rank), (last, lag, wait, _, spread) in arrivals.items():
        assert last == 1, (seq, rank)
        assert spread < 500_000  # the ends agree to well under the lag: the alignment holds
        if rank == 1:
            assert 0.6 * INJECTED_NS < lag < 1.05 * INJECTED_NS and wait == 0, (seq, lag, wait)
        else:
            assert lag == 0 and 0.6 * INJECTED_NS < wait < 1.05 * INJECTED_NS, (seq, wait)


def test_the_clock_comes_from_the_collectives_not_the_timestamps():
    with tracekit.open(*RANKS) as trace:
        plain = _arrivals(trace)
    with tracekit.open(*RANKS, offsets={str(RANKS[1]): "+1s"}) as trace:
        shifted = _arrivals(trace)
    assert plain.keys() == shifted.keys()
    for key, (last, lag, wait, offset, _) in plain.items():
        s_last, s_lag, s_wait, s_offset, _ = shifted[key]
        assert (s_last, s_lag, s_wait) == (last, lag, wait), key
    moved = {rank: shifted[k][3] - plain[k][3] for k in plain for rank in [k[2]]}
    assert abs((moved[1] - moved[0]) - 1_000_000_000) < 1_000, moved


def test_a_rank_held_by_two_runs_takes_no_part():
    with tracekit.open(*RANKS, RANKS[0], same_content="keep") as trace:
        assert trace.sql("SELECT count(*) FROM collective_arrivals").fetchall()[0][0] == 0
        assert trace.sql("SELECT count(*) FROM collectives").fetchall()[0][0] > 0


def test_nccl_kernels_of_one_collective_end_together_on_the_common_clock():
    with tracekit.open(*TP2) as trace:
        ranks, spread, n = trace.sql(
            "SELECT min(ranks), max(end_spread_ns), count(DISTINCT seq) FROM collective_arrivals"
        ).fetchall()[0]
    assert ranks == 2 and n > 10
    assert spread < 10_000  # the ranks' all-reduce kernels end within 10 us of each other
