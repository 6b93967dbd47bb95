#!/usr/bin/env python3
"""Screenshots of the web console's main pages, for a person to look at.

    python scripts/console_screenshots.py [--out screenshots/]

Builds a state dir from the bundled XID 79 incident (approve mode, four eyes, one approval already
given, one rejected requeue), starts the web console on a free loopback port and takes a PNG of
each page in headless Debian Chromium (`apt-get install chromium chromium-driver`) as an
operator: incidents, one incident, approvals, policy, ledger, audit (verified), and the login
page. Nothing touches a cluster: the state is built with a runner that refuses every command.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "web"))

from browser import chromium, click_and_wait, missing  # noqa: E402
from webutil import make_users, start_server  # noqa: E402

import recovery_logs as rl  # noqa: E402
from recovery_logs.remediation.remediator import Remediator  # noqa: E402


class NoSlurm:
    def run(self, argv, timeout_s):
        raise RuntimeError(f"screenshots never run Slurm commands ({argv[0]})")


def build_state(sd: Path) -> str:
    res = rl.replay_incident("xid79_nccl_cascade")
    rem = Remediator.from_options(sd, mode="approve", runner=NoSlurm(), cluster_nodes=16, approvals_required=2,
                                  proposal_ttl_s=3600)
    rem.handle(res.incidents)
    pend = rem.actions("awaiting_approval")
    drain = next(a for a in pend if a["kind"] == "drain_node")
    rem.approve(drain["id"], by="alice")
    req = next((a for a in pend if a["kind"] == "requeue_job"), None)
    if req is not None:
        rem.reject(req["id"], by="bob", reason="the user restarted the job already")
    rem.close()
    return res.incidents[0].id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("screenshots"))
    args = ap.parse_args(argv)
    why = missing()
    if why:
        print(f"console_screenshots: {why}", file=sys.stderr)
        return 2
    from selenium.webdriver.common.by import By

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sd = Path(tmp) / "state"
        inc = build_state(sd)
        tok = make_users(Path(tmp) / "users.toml", carol="operator")
        srv = start_server(sd, Path(tmp) / "users.toml")
        b = chromium()
        try:
            b.get(srv.url + "/login")
            b.save_screenshot(str(args.out / "0-login.png"))
            b.find_element(By.ID, "name").send_keys("carol")
            b.find_element(By.ID, "token").send_keys(tok["carol"])
            click_and_wait(b, b.find_element(By.ID, "login"), "#whoami")
            pages = [("1-incidents", "/"), ("2-incident", f"/incidents/{inc}"), ("3-approvals", "/approvals"),
                     ("4-policy", "/policy"), ("5-ledger", "/ledger"), ("6-audit", "/audit?verify=1")]
            for name, path in pages:
                b.get(srv.url + path)
                height = b.execute_script("return document.documentElement.scrollHeight")
                b.set_window_size(1400, min(max(900, int(height) + 40), 4000))
                b.save_screenshot(str(args.out / f"{name}.png"))
                print(args.out / f"{name}.png")
        finally:
            b.quit()
            srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
