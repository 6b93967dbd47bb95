"""Four eyes through the web console in a real browser against the real test Slurm cluster:
alice approves a drain, alice cannot approve it again, bob approves, slurmctld drains the node
with our reason, the audit view shows the drain and the incident is closed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web console needs the [web] extra")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "web"))
from browser import chromium, click_and_wait, missing  # noqa: E402
from webutil import make_users, start_server, web_incident  # noqa: E402

from recovery_logs.remediation.remediator import Remediator  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(missing() is not None, reason=str(missing()))]


def _wait(what, pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not (v := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)
    return v


def _login(b, url, name, token):
    from selenium.webdriver.common.by import By

    b.delete_all_cookies()
    b.get(url + "/login")
    b.find_element(By.ID, "name").send_keys(name)
    b.find_element(By.ID, "token").send_keys(token)
    assert click_and_wait(b, b.find_element(By.ID, "login"), "#whoami").text.startswith(name)


def _approve_on_approvals_page(b, url, action_id) -> str:
    from selenium.webdriver.common.by import By

    b.get(url + "/approvals")
    return click_and_wait(b, b.find_element(By.CSS_SELECTOR, f"button.approve[data-action='{action_id}']"),
                          ".flash").text


def test_four_eyes_drain_in_a_real_browser(tmp_path: Path, cluster):
    from selenium.webdriver.common.by import By

    sd = tmp_path / "state"
    users = tmp_path / "users.toml"
    tok = make_users(users, alice="operator", bob="operator")
    watcher = Remediator.from_options(sd, mode="approve", runner=cluster.runner(), cluster_nodes=4,
                                      approvals_required=2)
    srv = start_server(sd, users, runner=cluster.runner())
    b = chromium()
    try:
        _login(b, srv.url, "alice", tok["alice"])
        watcher.handle([web_incident("inc-web4eyes0001", "gpu-n03", None, kinds=("drain",))])   # as `watch` would
        row = _wait("the live incident", lambda: b.find_elements(By.CSS_SELECTOR, "tr[data-id='inc-web4eyes0001']"))
        act = click_and_wait(b, row[0].find_element(By.LINK_TEXT, "inc-web4eyes0001"),
                             "#actions tr[data-action]").get_attribute("data-action")

        msg = _approve_on_approvals_page(b, srv.url, act)
        assert "approval 1 of 2 (alice)" in msg, msg
        assert "DRAIN" not in cluster.node("gpu-n03").get("State", "")
        msg = _approve_on_approvals_page(b, srv.url, act)                     # the same operator again
        assert "refused" in msg and "alice already approved" in msg, msg
        assert "1/2 (alice)" in b.find_element(By.CSS_SELECTOR, f"tr[data-action='{act}'] .count").text

        _login(b, srv.url, "bob", tok["bob"])
        msg = _approve_on_approvals_page(b, srv.url, act)
        assert "approved/done" in msg, msg
        node = cluster.node("gpu-n03")
        assert "DRAIN" in node["State"] and node["Reason"].startswith("recovery-logs:inc-web4eyes0001"), node

        b.get(srv.url + "/audit")
        text = b.find_element(By.CSS_SELECTOR, "table.records").text
        assert "result" in text and "drain_node gpu-n03 done" in text
        assert "approval" in text and "by alice" in text and "by bob" in text
        assert click_and_wait(b, b.find_element(By.ID, "verify"), "#verify-result").text.startswith("audit chain OK")
        b.get(srv.url + "/")
        st = b.find_element(By.CSS_SELECTOR, "tr[data-id='inc-web4eyes0001']").text
        assert "closed (drain_node gpu-n03 done)" in st
    finally:
        b.quit()
        srv.stop()
        watcher.close()
