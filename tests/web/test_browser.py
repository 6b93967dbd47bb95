"""The web console in a real browser (headless Debian Chromium via Selenium and Debian's
chromedriver): log in, a live incident appears without a reload, a viewer sees no approve
button. The four-eyes drain through Slurm is tests/slurm/test_web_browser.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from browser import chromium, click_and_wait, missing
from webutil import web_incident

from recovery_logs.remediation.remediator import Remediator

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


class NoSlurm:
    def run(self, argv, timeout_s):
        raise AssertionError(f"unexpected Slurm command {argv}")


def login(b, url: str, name: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    b.get(url + "/")
    assert "/login" in b.current_url
    b.find_element(By.ID, "name").send_keys(name)
    b.find_element(By.ID, "token").send_keys(token)
    assert click_and_wait(b, b.find_element(By.ID, "login"), "#whoami").text.startswith(name)


def wait_for(what: str, pred, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def test_live_incident_appears_and_viewer_gets_no_approve_button(tmp_path: Path, web):
    from selenium.webdriver.common.by import By

    start, _, tok = web
    sd = tmp_path / "state"
    rem = Remediator.from_options(sd, mode="approve", runner=NoSlurm(), cluster_nodes=4, approvals_required=2)
    srv = start(sd)
    b = chromium()
    try:
        login(b, srv.url, "vera", tok["vera"])
        assert b.find_element(By.CSS_SELECTOR, "#incidents tbody").text == "No incidents."
        b.execute_script("window.__sameDocument = 42;")
        rem.handle([web_incident("inc-live00000001", "gpu-n02", "4117", kinds=("drain", "requeue"))])
        row = wait_for("the incident row", lambda: b.find_elements(By.CSS_SELECTOR, "tr[data-id='inc-live00000001']"))
        assert "gpu-n02" in row[0].text and "XID 79" in row[0].text
        assert b.execute_script("return window.__sameDocument") == 42          # it came live, no reload
        assert "XID 79" in click_and_wait(b, row[0].find_element(By.LINK_TEXT, "inc-live00000001"),
                                          "#incident-title").text
        assert "nodes/gpu-n02/kern.log:1207" in b.find_element(By.ID, "evidence").text
        assert b.find_elements(By.CSS_SELECTOR, "svg.timeline circle")
        assert not b.find_elements(By.CSS_SELECTOR, "button.approve")          # viewer: no approve button
        b.get(srv.url + "/approvals")
        assert len(b.find_elements(By.CSS_SELECTOR, "#approvals tbody tr")) == 2
        assert not b.find_elements(By.CSS_SELECTOR, "button.approve, button.reject")
        assert "operators decide" in b.find_element(By.ID, "approvals").text
        b.get(srv.url + "/policy")
        assert not b.find_elements(By.ID, "breaker-reset")                    # admins only
    finally:
        b.quit()
        rem.close()
