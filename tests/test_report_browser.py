"""The HTML report in a real headless Chromium (Debian's `chromium`): no script errors, every figure drawn,
a screenshot with content. Skipped only when chromium is missing outside CI; in CI a missing browser fails."""

from __future__ import annotations

import html
import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest
from click.testing import CliRunner

from tracekit.cli.app import cli

from .conftest import sample, union_within

EAGER = sample("gpu_prefill_decode_eager.json.gz")
TP2 = [sample("gpu_tp2_rank0.json.gz"), sample("gpu_tp2_rank1.json.gz")]
BUDGET_MS = "20000"  # virtual time: plotly draws without waiting for real time


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not on PATH in CI (.ci/run installs Debian's chromium package)")
    pytest.skip("chromium is not on PATH (apt-get install chromium); CI runs this test")


def _run(browser: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--virtual-time-budget={BUDGET_MS}", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, timeout=180, check=False)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser") / "report.html"
    res = CliRunner().invoke(cli, ["report", str(EAGER), "-o", str(out)])
    assert res.exit_code == 0, res.output
    figures = int(re.search(r'data-figures="(\d+)"', out.read_text()).group(1))
    return out, figures


def _dom(browser: str, page) -> str:
    res = _run(browser, "--dump-dom", page.resolve().as_uri())
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-2000:]
    return res.stdout.decode()


def _errors(dom: str) -> str:
    m = re.search(r'<pre id="tk-errors"[^>]*>(.*?)</pre>', dom, re.S)
    assert m, "the error box is missing from the rendered page"
    return m.group(1).strip()


def test_renders_without_script_errors_and_draws_every_figure(report):
    browser = _chromium()
    page, figures = report
    dom = _dom(browser, page)
    assert _errors(dom) == ""
    assert figures >= 4
    # plotly replaces each figure's div with a plot-container holding its SVG layers
    assert len(re.findall(r'class="plot-container plotly"', dom)) == figures
    assert len(re.findall(r'class="main-svg"', dom)) >= figures
    assert "tk-fig-1" in dom and f"tk-fig-{figures}" in dom


def test_the_error_box_catches_a_broken_script(tmp_path):
    """The check above could not pass by accident: the report's hook shows a throwing script and a
    console.error, including one raised before the error box exists."""
    from tracekit.render.html import _ERROR_HOOK

    browser = _chromium()
    page = tmp_path / "broken.html"
    page.write_text(
        f"<!DOCTYPE html><html><head>{_ERROR_HOOK}<script>null.early();</script></head><body>"
        '<pre id="tk-errors"></pre><script>(window.__tkPending || []).forEach(window.__tkRecord);</script>'
        "<script>console.error('tk-canary-console'); null.boom();</script></body></html>"
    )
    errors = _errors(_dom(browser, page))
    assert "tk-canary-console" in errors and "'early'" in errors and "'boom'" in errors


def _png_rows(data: bytes):
    """(width, height, bytes per pixel, raw filtered scanlines) of an 8-bit non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0], "bad CRC"
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, color, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and color in (2, 6)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + width * bpp)
    return width, height, bpp, raw


def _colours(width, height, bpp, raw) -> set:
    """Distinct colours over the scanlines that decode on their own (filter None or Sub)."""
    stride = 1 + width * bpp
    seen = set()
    for r in range(height):
        kind, line = raw[r * stride], bytearray(raw[r * stride + 1 : (r + 1) * stride])
        if kind == 1:
            for i in range(bpp, len(line)):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind != 0:
            continue
        seen.update(bytes(line[i : i + bpp]) for i in range(0, len(line), bpp))
    return seen


def test_screenshot_has_content(report, tmp_path):
    browser = _chromium()
    page, _ = report
    shot = tmp_path / "report.png"
    res = _run(browser, f"--screenshot={shot}", "--window-size=1400,3000", page.resolve().as_uri())
    assert res.returncode == 0 and shot.exists(), res.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    width, height, bpp, raw = _png_rows(data)
    assert (width, height) == (1400, 3000)
    # a blank or unstyled page compresses to a few kB and holds a handful of colours
    assert len(data) > 100_000
    assert len(_colours(width, height, bpp, raw)) > 50


# ------------------------------------------------------------------------------ what the page shows

# Run after every figure has drawn: the geometry the browser laid out, per figure, as JSON in #tk-probe.
_PROBE = """
<script>
window.addEventListener('load', function () {
  setTimeout(function () {
    function rect(node) {
      if (!node) return null;
      var r = node.getBoundingClientRect();
      return {left: r.left, right: r.right, top: r.top, bottom: r.bottom};
    }
    var figures = [];
    document.querySelectorAll('.tk-figure').forEach(function (box) {
      var gd = box.querySelector('.js-plotly-plot'), full = gd._fullLayout, axes = {}, bars = [];
      Object.keys(full).forEach(function (k) {
        var a = full[k];
        if (/^[xy]axis\\d*$/.test(k)) axes[k] = {range: a.range, length: a._length, offset: a._offset};
      });
      gd.querySelectorAll('g.trace.bars').forEach(function (g, t) {
        var d = gd._fullData[t];
        g.querySelectorAll('g.point path').forEach(function (p, i) {
          var b = p.getBBox();
          bars.push({y: d.y[i], xaxis: d.xaxis, yaxis: d.yaxis, w: b.width, h: b.height});
        });
      });
      var labels = Array.prototype.map.call(gd.querySelectorAll('g.annotation'), function (a) {
        return Object.assign({text: a.textContent}, rect(a));
      });
      figures.push({name: box.dataset.figure, figure: rect(gd), title: rect(gd.querySelector('.gtitle')),
                    legend: rect(gd.querySelector('g.legend')), axes: axes, bars: bars, labels: labels});
    });
    var out = document.createElement('pre');
    out.id = 'tk-probe';
    out.textContent = JSON.stringify(figures);
    document.body.appendChild(out);
  }, 1000);
});
</script>
"""


def _probe(browser: str, report_page, width: int) -> tuple[str, list[dict]]:
    """(the rendered DOM, the probe's figures) of a copy of the report with the probe added."""
    import json

    probed = report_page.with_name(f"probed-{width}-{report_page.name}")
    probed.write_text(report_page.read_text().replace("</body>", _PROBE + "</body>"))
    res = _run(browser, f"--window-size={width},3000", "--dump-dom", probed.resolve().as_uri())
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-2000:]
    dom = res.stdout.decode()
    assert _errors(dom) == ""
    m = re.search(r'<pre id="tk-probe">(.*?)</pre>', dom, re.S)
    assert m, "the probe did not run"
    return dom, json.loads(html.unescape(m.group(1)))


@pytest.fixture(scope="module")
def eager_drawn(report):
    page, _ = report
    return _probe(_chromium(), page, 1400)


@pytest.fixture(scope="module")
def ranks_drawn(tmp_path_factory):
    """The two-rank report, drawn narrower than the page's widest, where labels have less room."""
    out = tmp_path_factory.mktemp("ranks") / "ranks.html"
    res = CliRunner().invoke(cli, ["report", *map(str, TP2), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return _probe(_chromium(), out, 900)


def test_a_mostly_idle_stream_is_drawn_mostly_empty(eager_drawn, loaded):
    """The eager sample's GPU stream is busy about 3% of the run (many short decode kernels with host
    gaps between them). The ink its bars put on screen, over what a fully busy lane would take, is its
    busy share: the merged blocks do not paint it solid."""
    from tracekit.render.html import BAR_THICKNESS

    con = loaded(EAGER)
    lo, hi = con.execute("SELECT start_ns, end_ns FROM runs WHERE run_id = 1").fetchone()
    _, figures = eager_drawn
    (fig,) = [f for f in figures if f["name"] == "timeline"]
    x, y = fig["axes"]["xaxis"], fig["axes"]["yaxis"]
    band = y["length"] / abs(y["range"][1] - y["range"][0])  # pixels per lane
    full = x["length"] * band * BAR_THICKNESS  # a lane busy over the whole axis
    axis_ns = (x["range"][1] - x["range"][0]) * 1e6
    drawn: dict[str, float] = {}
    for b in fig["bars"]:
        drawn[b["y"]] = drawn.get(b["y"], 0.0) + b["w"] * b["h"] / full
    streams = [lane for lane in drawn if lane.startswith("GPU ")]
    assert streams
    for lane in streams:
        device, stream = map(int, re.match(r"GPU (\d+) stream (\d+)", lane).groups())
        acts = con.execute(
            "SELECT ts_ns, end_ns FROM gpu_activities WHERE run_id = 1 AND device = ? AND stream = ? AND dur_ns > 0",
            [device, stream],
        ).fetchall()
        busy = union_within(acts, lo, hi) / axis_ns
        assert busy < 0.05
        assert drawn[lane] <= busy + 0.002, (lane, drawn[lane], busy)
        assert drawn[lane] >= busy - 0.002  # and not hidden either


def _overlap(a: dict, b: dict, slack: float = 0.5) -> bool:
    return (
        a["left"] + slack < b["right"]
        and b["left"] + slack < a["right"]
        and (a["top"] + slack < b["bottom"] and b["top"] + slack < a["bottom"])
    )


def test_finding_labels_do_not_overlap(eager_drawn, ranks_drawn):
    """In every figure, no two finding labels overlap each other, the title or the legend, and each
    lies inside its figure; at 1400 px and 900 px wide."""
    seen = 0
    for _, figures in (eager_drawn, ranks_drawn):
        for fig in figures:
            boxes = [lab for lab in fig["labels"] if lab["right"] > lab["left"]]
            seen += len(boxes)
            for i, a in enumerate(boxes):
                assert all(not _overlap(a, b) for b in boxes[i + 1 :]), (fig["name"], a, boxes)
                for other in (fig["title"], fig["legend"]):
                    assert other is None or not _overlap(a, other), (fig["name"], a, other)
                box = fig["figure"]
                assert box["left"] <= a["left"] and a["right"] <= box["right"], (fig["name"], a, box)
    assert seen >= 6


def test_ranks_are_drawn_on_one_time_axis(ranks_drawn):
    """The two ranks' subplots cover the same time range over the same pixels, one above the other."""
    _, figures = ranks_drawn
    (fig,) = [f for f in figures if f["name"] == "timeline"]
    xs = [fig["axes"][k] for k in sorted(fig["axes"]) if k.startswith("xaxis")]
    ys = [fig["axes"][k] for k in sorted(fig["axes"]) if k.startswith("yaxis")]
    assert len(xs) == len(ys) == 2
    assert xs[0]["range"] == pytest.approx(xs[1]["range"]) and xs[0]["range"][0] == 0
    assert (xs[0]["offset"], xs[0]["length"]) == pytest.approx((xs[1]["offset"], xs[1]["length"]))
    assert ys[0]["offset"] + ys[0]["length"] <= ys[1]["offset"]  # stacked, not overlaid
    lanes = {b["y"].split(": ")[0] for b in fig["bars"]}
    assert lanes == {"rank 0", "rank 1"}


def test_kernel_table_reads_as_the_cli(eager_drawn):
    """The rendered kernel table shows the same duration strings as `tracekit analyze` for the same kernels."""
    dom, _ = eager_drawn
    res = CliRunner(env={"COLUMNS": "250"}).invoke(cli, ["analyze", str(EAGER)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("top kernels"))
    cli_rows = [re.split(r"\s{2,}", line.strip()) for line in lines[at + 3 : at + 8]]
    table = dom[dom.index("<h3>Kernels:") :]
    table = table[: table.index("</table>")]
    rows = [
        [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", table[table.index("<tbody>") :], re.S)
    ]
    assert len(cli_rows) == 5 and len(rows) >= 5
    for (name, count, total, mean), row in zip(cli_rows, rows):
        assert row[0][:60] == name[:60] and (row[1], row[2], row[3]) == (count, total, mean)
