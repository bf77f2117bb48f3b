"""The HTML report in a real browser (headless Chromium): the page loads offline and its plots render.

Skipped only when no Chromium is installed; CI installs it (`apt-get install -y chromium`).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from onnxaccel.bench.svg import PALETTE

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


@pytest.fixture(scope="module")
def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (apt-get install -y chromium); CI installs it")


def headless(browser: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", *args],
                          check=False, capture_output=True, text=True, timeout=180)


def test_the_report_is_self_contained(cpu_sweep):
    html = cpu_sweep["paths"]["html"].read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from elsewhere
    assert html.count("<svg") >= 4 and 'id="plot-latency"' in html and 'id="plot-throughput"' in html


def test_chromium_renders_every_plot(browser, cpu_sweep, tmp_path):
    url = cpu_sweep["paths"]["html"].resolve().as_uri()
    dom = headless(browser, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for chart in ("plot-latency", "plot-throughput", "plot-throughput-bars", "plot-latency-bars", "hist-0"):
        assert f'id="{chart}"' in dom.stdout, chart
    assert len(re.findall(r"<polyline", dom.stdout)) == 8  # 4 series (precision x IO binding), 2 charts
    assert "Failed cells" in dom.stdout

    shot = tmp_path / "report.png"
    done = headless(browser, tmp_path, f"--screenshot={shot}", "--window-size=1400,2600", url)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    import numpy as np
    from PIL import Image

    image = np.asarray(Image.open(shot).convert("RGB")).astype(np.int16)
    assert image.shape == (2600, 1400, 3)

    def count(hex_color: str) -> int:
        want = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
        return int((np.abs(image - want).max(axis=2) <= 12).sum())

    # Lines, markers, bars and histogram bins of the first four series were painted.
    for color in PALETTE[:4]:
        assert count(color) > 500, color
    top = image[:300].reshape(-1, 3)
    assert len(np.unique(top, axis=0)) > 50  # text was rendered, not a blank page
