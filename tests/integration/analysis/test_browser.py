"""The report in a real headless Chromium: the Pareto image, the interactive plot, the front
table and the attack grid render; a full-page screenshot is kept as a test artifact.

Debian's ``chromium`` and ``chromium-driver`` (installed by .ci/run) are driven by selenium;
the test skips only where they are missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sweeps.cli import app
from tests.integration.analysis.store import Store

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
)


#: (a JS expression) the elements whose right edge passes the window's, outside any box that
#: scrolls or clips
_WIDER_THAN_THE_WINDOW = """(() => {
const width = document.documentElement.clientWidth, out = [];
for (const el of document.querySelectorAll('body *')) {
  const right = el.getBoundingClientRect().right;
  if (right <= width + 1) continue;
  let p = el.parentElement, boxed = false;
  while (p && !boxed) { boxed = getComputedStyle(p).overflowX !== 'visible'; p = p.parentElement; }
  if (!boxed) out.push(`${el.tagName}#${el.id} ends at ${Math.round(right)}`);
}
return out;
})()"""


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,1000")
    # Chromium's profile and its singleton-socket folder go to a temporary folder of the test's
    # own (short: a socket path has a length limit), removed afterwards: under /tmp, Chromium
    # left one org.chromium.Chromium.* folder behind per run even after quit()
    scratch = tempfile.mkdtemp(prefix="fedsweep-chromium-")
    service = Service(str(CHROMEDRIVER), env={**os.environ, "TMPDIR": scratch})
    try:
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def wait_for(driver, script: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.25)


def test_report_renders_in_chromium(
    store: Store, tmp_path: Path, artifacts_dir: Path, browser
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.html"
    made = CliRunner().invoke(
        app,
        ["report", "-e", "fl-runs", "-e", "fl-sweep", "--out", str(out)],
        env={"MLFLOW_TRACKING_URI": store.uri},
    )
    assert made.exit_code == 0, made.output

    browser.get(out.as_uri())
    assert wait_for(browser, "return document.readyState === 'complete'")
    plotted = wait_for(
        browser, "return document.querySelectorAll('#pareto-interactive svg.main-svg').length"
    )
    # nothing widens the page past a narrow window: a wide table scrolls in its own box
    browser.set_window_size(700, 1000)
    # (plotly redraws its responsive figure a moment after the resize)
    fits = wait_for(browser, f"return {_WIDER_THAN_THE_WINDOW}.length === 0", timeout=10)
    assert fits, browser.execute_script(f"return {_WIDER_THAN_THE_WINDOW}")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(int(height) + 100, 16000))
    shot = artifacts_dir / "report.png"
    browser.save_screenshot(str(shot))

    image = browser.execute_script(
        "const i = document.getElementById('pareto-png'); if (!i || !i.complete) return null;"
        "return [i.naturalWidth, i.naturalHeight, i.getBoundingClientRect().width];"
    )
    assert image is not None and image[0] > 400 and image[1] > 300 and image[2] > 300
    assert plotted >= 1  # plotly.js (inline) drew the interactive front
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#front-table tbody tr'))"
        ".map(r => [r.cells.length, r.querySelectorAll('a.run-link').length, r.innerText]);"
    )
    assert rows and all(cells >= 4 and links >= 1 for cells, links, _ in rows)
    assert any("local" in text for *_, text in rows)
    grids = browser.execute_script(
        "return Array.from(document.querySelectorAll('img.attack-grid')).map(i => i.naturalWidth);"
    )
    assert len(grids) == 1 and grids[0] > 100
    assert "tiny-sweep" in browser.find_element("id", "spec").text
    assert shot.stat().st_size > 50_000
