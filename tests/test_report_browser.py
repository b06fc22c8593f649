"""The HTML report in a real headless Chromium (Debian's `chromium`): no script errors, every figure drawn,
a screenshot with content. Skipped only when chromium is missing outside CI; in CI a missing browser fails."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest
from click.testing import CliRunner

from tracekit.cli.app import cli

from .conftest import sample

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
    res = CliRunner().invoke(cli, ["report", str(sample("gpu_prefill_decode_eager.json.gz")), "-o", str(out)])
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
