import pytest

from tracekit import units


@pytest.mark.parametrize(
    "ns, text",
    [(0, "0 ns"), (850, "850 ns"), (4_700, "4.70 us"), (12_345_678, "12.3 ms"), (1_520_000_000, "1.52 s"),
     (999, "999 ns"), (999_999, "1.00 ms"), (1_000, "1.00 us"), (-2_500_000, "-2.50 ms"), (None, "-")],
)  # fmt: skip
def test_duration_by_magnitude(ns, text):
    assert units.duration(ns) == text


def test_size_bandwidth_share():
    assert units.size(512) == "512 B"
    assert units.size(int(24.8 * (1 << 30))) == "24.8 GiB"
    assert units.bandwidth(28_000_000_000, 1_000_000_000) == "28.0 GB/s"
    assert units.bandwidth(0, 10) == "-"
    assert units.share(0.1234) == "12.3%"
