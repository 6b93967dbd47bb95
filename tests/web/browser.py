"""Headless Debian Chromium driven by Selenium through Debian's chromedriver (no browser download)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CHROMIUM = os.environ.get("RECOVERY_LOGS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("RECOVERY_LOGS_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--window-size=1400,1000")


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    for p in (CHROMIUM, CHROMEDRIVER):
        if not Path(p).exists():
            return f"{p} not found (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401  (optional test dependency)
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def chromium():
    """A new WebDriver with a fresh profile; call ``.quit()`` (the profile dir goes with it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")       # never let Selenium Manager reach out
    os.environ.setdefault("SE_AVOID_STATS", "true")
    profile = tempfile.mkdtemp(prefix="rl-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={profile}")
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    quit_ = drv.quit

    def quit_and_clean() -> None:
        try:
            quit_()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    drv.quit = quit_and_clean
    return drv


def wait_css(b, css: str, timeout: float = 15.0):
    """The first element matching ``css`` once it is there (after a click that navigates)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(b, timeout, poll_frequency=0.1).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def click_and_wait(b, element, css: str, timeout: float = 15.0):
    """Click ``element`` (a submit button), wait for the next page to replace this one and for ``css`` on it."""
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    element.click()
    WebDriverWait(b, timeout, poll_frequency=0.1).until(ec.staleness_of(element))
    return wait_css(b, css, timeout)
