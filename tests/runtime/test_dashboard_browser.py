"""The job page in a real browser during a real job: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which ``make test`` installs) driven by Selenium opens the page of
``secureflhv run JOB --dashboard`` while server, guest and host processes train a vertical LR over
gRPC with mutual TLS; it sees the three parties, the guest's loss curve gain points while the job runs,
then the finished job (final metrics and the loss plot), and takes a screenshot.

``SECUREFLHV_DOCS_IMG=docs/img/dashboard.png`` (``make docs-img``) also copies the screenshot there.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from secureflhv.runtime.job.demo import breast_cancer_tables, write_vertical_lr_job

pytestmark = pytest.mark.slow

EPOCHS = 8
# small batches make each epoch take a second or more: slow enough to watch the curve grow
PARAMS = {"epochs": EPOCHS, "batch_size": 32, "learning_rate": 0.15, "lr_schedule": "constant", "key_bits": 1024,
          "early_stopping_rounds": None, "test_fraction": 0.25, "split_seed": 5, "seed": 7}


def _chromium() -> tuple[str, str] | None:
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
    driver = shutil.which("chromedriver") or next((p for p in ("/usr/lib/chromium/chromedriver",) if os.path.exists(p)),
                                                  None)
    return (browser, driver) if browser and driver else None


def _browser(binary: str, driver: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900",
                "--no-proxy-server"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)  # this driver: nothing downloaded


def _wait(what: str, predicate, timeout: float, out: list[str]):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; job output:\n" + "\n".join(out[-40:]))


@pytest.mark.skipif(_chromium() is None, reason="chromium and chromedriver not found (Debian: apt-get install "
                                                "chromium chromium-driver; `make test` does it)")
def test_job_page_in_a_browser_during_a_real_run(tmp_path):
    from selenium.webdriver.common.by import By

    browser_bin, driver_bin = _chromium()
    guest_csv, host_csvs = breast_cancer_tables(tmp_path / "data", 1, seed=3, scheme="random")
    job = write_vertical_lr_job(tmp_path / "job", guest_csv, host_csvs, PARAMS, deadline_s=120,
                                insecure_test_keys=True)
    browser = _browser(browser_bin, driver_bin)  # started first: the job must not finish before it looks
    proc = subprocess.Popen([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "300",
                             "--dashboard", "0", "--dashboard-wait", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(line.rstrip("\n") for line in proc.stdout), daemon=True)
    reader.start()
    try:
        url = _wait("the job page's address", lambda: next(
            (m.group(1) for line in list(out) if (m := re.match(r"job page: (http://127\.0\.0\.1:\d+/)$", line))),
            None), 60, out)
        browser.get(url)

        def rows():
            return {r.get_attribute("data-party"): r.find_element(By.CSS_SELECTOR, ".state").text
                    for r in browser.find_elements(By.CSS_SELECTOR, "#parties tbody tr")}

        _wait("the three parties on the page", lambda: set(rows()) == {"server", "guest", "host-1"}, 60, out)

        def points() -> int:
            return len(browser.find_elements(By.CSS_SELECTOR, 'svg.curve[data-party="guest"][data-curve="loss"] '
                                                              'circle.pt'))

        first = _wait("the guest's loss curve", points, 180, out)
        assert first < EPOCHS, "the job ended before the page saw it running"
        assert rows()["guest"] == "running"
        grown = _wait("the loss curve to gain a point", lambda: points() > first and points(), 120, out)
        assert first < grown <= EPOCHS

        _wait("the finished job", lambda: browser.find_element(By.ID, "job-state").text == "done", 240, out)
        assert points() == EPOCHS and set(rows().values()) == {"done"}
        wire = browser.find_element(By.CSS_SELECTOR, '#parties tr[data-party="guest"] td.wire').text
        assert re.search(r"server: [\d.]+ [kM]?B / [\d.]+ [kM]?B", wire) and "host-1: " in wire  # bytes per peer
        final = browser.find_element(By.ID, "final-table").text
        assert "test.auc" in final and "test.accuracy" in final
        img = _wait("the loss plot", lambda: browser.execute_script(
            "const i = document.querySelector('#plots img[src*=loss]'); return i && i.complete && i.naturalWidth > 0 && i.src;"),
            30, out)
        assert "/files/guest/loss.png" in img
        logs = browser.find_element(By.ID, "logs").text
        assert "guest finished in" in logs and "BEGIN" not in browser.page_source  # no key or certificate

        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1280, min(max(900, height + 20), 2400))
        time.sleep(1.2)  # one more poll, redrawn at the new size
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if os.environ.get("SECUREFLHV_DOCS_IMG"):
            shutil.copyfile(shot, os.environ["SECUREFLHV_DOCS_IMG"])

        _wait("the launcher to see every party exit", lambda: any("job page stays up" in line for line in out), 60, out)
        assert browser.find_element(By.ID, "job-state").text == "done"  # still served after the job
        proc.send_signal(signal.SIGINT)  # ends --dashboard-wait early; the job's own exit code stays
        assert proc.wait(timeout=30) == 0, "\n".join(out[-40:])
    finally:
        browser.quit()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
