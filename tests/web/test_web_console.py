"""Web console over HTTP on a real server: authentication, roles, CSRF, four eyes (first half),
and hostile log text rendered as text."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from webutil import web_incident

from recovery_logs.errors import ConfigError, PolicyError
from recovery_logs.remediation.remediator import Remediator
from recovery_logs.web.auth import Users, hash_token


class NoSlurm:
    """Until the quorum of approvals is reached, nothing may touch Slurm."""

    def run(self, argv, timeout_s):
        raise AssertionError(f"unexpected Slurm command {argv}")


HOSTILE = "[/bold] <script>alert(1)</script> \x1b[2J\x1b]8;;http://x\x07 [error] [/dev/nvidia3] \u202eevil"


def _state(tmp_path: Path, **policy) -> Path:
    sd = tmp_path / "state"
    rem = Remediator.from_options(sd, mode="approve", runner=NoSlurm(), cluster_nodes=4, approvals_required=2,
                                  **policy)
    rem.handle([web_incident("inc-7f3a9c0d11e2", "gpu-n03", "4117", kinds=("drain", "requeue"), message=HOSTILE)])
    rem.close()
    return sd


def _pending(url: str, token: str) -> dict[str, dict]:
    r = requests.get(f"{url}/api/approvals", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    return {a["kind"]: a for a in r.json()["approvals"]}


def test_users_file_holds_hashes_never_tokens(tmp_path: Path):
    f = tmp_path / "u.toml"
    f.write_text('[[user]]\nname = "alice"\nrole = "operator"\ntoken = "secret"\n')
    with pytest.raises(ConfigError, match="never tokens"):
        Users.load(f)
    f.write_text(f'[[user]]\nname = "alice"\nrole = "root"\ntoken_sha256 = "{hash_token("x")}"\n')
    with pytest.raises(ConfigError, match="role must be one of"):
        Users.load(f)
    f.write_text(f'[[user]]\nname = "a b"\nrole = "viewer"\ntoken_sha256 = "{hash_token("x")}"\n')
    with pytest.raises(ConfigError, match="name must be"):
        Users.load(f)
    f.write_text(f'[[user]]\nname = "alice"\nrole = "viewer"\ntoken_sha256 = "{hash_token("x")}"\n')
    u = Users.load(f)
    assert u.by_token("x").name == "alice" and u.by_token("y") is None
    assert "x" not in f.read_text().split("token_sha256")[1].split("\n")[0].replace(hash_token("x"), "")


def test_no_token_401_viewer_403_operator_four_eyes(tmp_path: Path, web):
    start, _, tok = web
    srv = start(_state(tmp_path))
    url = srv.url
    r = requests.get(f"{url}/api/incidents", timeout=10)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert requests.get(f"{url}/api/incidents", headers={"Authorization": "Bearer nope"}, timeout=10).status_code == 401
    assert requests.get(f"{url}/", allow_redirects=False, timeout=10).status_code == 303   # to the login page
    assert requests.get(f"{url}/healthz", timeout=10).text == "ok"

    drain = _pending(url, tok["vera"])["drain_node"]
    assert drain["needed"] == 2 and drain["approved_by"] == []
    viewer = {"Authorization": f"Bearer {tok['vera']}"}
    r = requests.post(f"{url}/api/actions/{drain['action_id']}/approve", headers=viewer, timeout=10)
    assert r.status_code == 403 and "viewer" in r.json()["error"]
    r = requests.post(f"{url}/api/breaker/reset", headers={"Authorization": f"Bearer {tok['alice']}"}, timeout=10)
    assert r.status_code == 403 and "admin" in r.json()["error"]

    alice = {"Authorization": f"Bearer {tok['alice']}"}
    r = requests.post(f"{url}/api/actions/{drain['action_id']}/approve", headers=alice, timeout=10)
    assert r.status_code == 200, r.text
    assert (r.json()["decision"], r.json()["status"]) == ("proposed", "awaiting_approval")
    assert "approval 1 of 2 (alice)" in r.json()["reason"]
    r = requests.post(f"{url}/api/actions/{drain['action_id']}/approve", headers=alice, timeout=10)
    assert r.status_code == 409 and "alice already approved" in r.json()["error"]
    assert _pending(url, tok["vera"])["drain_node"]["approved_by"] == ["alice"]

    # every decision is audited with the user's name
    recs = requests.get(f"{url}/api/audit?kind=approval", headers=viewer, timeout=10).json()["records"]
    assert [x["payload"]["by"] for x in recs] == ["alice"]

    r = requests.post(f"{url}/api/breaker/reset", headers={"Authorization": f"Bearer {tok['root']}"}, timeout=10)
    assert r.status_code == 200 and r.json()["by"] == "root"
    req = _pending(url, tok["vera"])["requeue_job"]
    r = requests.post(f"{url}/api/actions/{req['action_id']}/reject", headers={"Authorization": f"Bearer {tok['bob']}"},
                      json={"reason": "job already restarted by the user"}, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "rejected"
    kinds = [x["kind"] for x in requests.get(f"{url}/api/audit", headers=viewer, timeout=10).json()["records"]]
    assert "rejection" in kinds and "breaker" in kinds


def test_cookie_session_needs_csrf(tmp_path: Path, web):
    start, _, tok = web
    sd = _state(tmp_path)
    default = start(sd)          # cookies are Secure unless told otherwise (Chromium accepts them on loopback)
    set_cookie = requests.get(f"{default.url}/login", timeout=10).headers["set-cookie"].lower()
    assert "secure" in set_cookie and "httponly" in set_cookie and "samesite=strict" in set_cookie
    srv = start(sd, secure_cookie=False)   # python-requests sends no Secure cookie over http
    s = requests.Session()
    page = s.get(f"{srv.url}/login", timeout=10).text
    csrf = page.split('name="csrf" value="')[1].split('"')[0]
    r = s.post(f"{srv.url}/login", data={"csrf": csrf, "name": "alice", "token": tok["bob"]}, allow_redirects=False,
               timeout=10)
    assert r.status_code == 401                             # bob's token is not alice's
    r = s.post(f"{srv.url}/login", data={"csrf": "forged", "name": "alice", "token": tok["alice"]}, timeout=10,
               allow_redirects=False)
    assert r.status_code == 400
    r = s.post(f"{srv.url}/login", data={"csrf": csrf, "name": "alice", "token": tok["alice"]}, allow_redirects=False,
               timeout=10)
    assert r.status_code == 303
    cookie = next(c for c in s.cookies if c.name == "rl_session")
    assert cookie.has_nonstandard_attr("HttpOnly")
    drain = _pending(srv.url, tok["vera"])["drain_node"]["action_id"]
    assert s.post(f"{srv.url}/api/actions/{drain}/approve", timeout=10).status_code == 403   # no X-CSRF-Token
    assert s.post(f"{srv.url}/actions/{drain}/approve", data={}, timeout=10).status_code == 403
    me = s.get(f"{srv.url}/api/me", timeout=10).json()
    assert me["name"] == "alice" and me["via"] == "session"
    r = s.post(f"{srv.url}/api/actions/{drain}/approve", headers={"X-CSRF-Token": me["csrf"]}, timeout=10)
    assert r.status_code == 200 and r.json()["by"] == "alice"


def test_trusted_proxy_header_is_off_by_default(tmp_path: Path, web):
    start, _, tok = web
    sd = _state(tmp_path)
    plain = start(sd)
    assert requests.get(f"{plain.url}/api/me", headers={"X-Forwarded-User": "alice"}, timeout=10).status_code == 401
    proxied = start(sd, trust_proxy_header="X-Forwarded-User")
    me = requests.get(f"{proxied.url}/api/me", headers={"X-Forwarded-User": "alice"}, timeout=10).json()
    assert (me["name"], me["role"], me["via"]) == ("alice", "operator", "proxy")
    r = requests.get(f"{proxied.url}/api/me", headers={"X-Forwarded-User": "mallory"}, timeout=10)
    assert r.status_code == 401                              # a name not in the users file has no role


def test_hostile_log_text_is_shown_as_text(tmp_path: Path, web):
    start, _, tok = web
    srv = start(_state(tmp_path))
    h = {"Authorization": f"Bearer {tok['vera']}"}
    for path in ("/", "/incidents/inc-7f3a9c0d11e2", "/approvals", "/audit", "/policy", "/ledger"):
        r = requests.get(srv.url + path, headers=h, timeout=20)
        assert r.status_code == 200, (path, r.text[-500:])
        assert "<script>alert" not in r.text and "\x1b" not in r.text and "\u202e" not in r.text, path
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    page = requests.get(f"{srv.url}/incidents/inc-7f3a9c0d11e2", headers=h, timeout=10).text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "\\x1b[2J" in page and "[/bold]" in page
    assert "nodes/gpu-n03/kern.log:1207" in page and "_time:[" in page and 'host:=&#34;gpu-n03&#34;' in page
    # JSON stays JSON (escaped by the encoder), the text is intact
    inc = requests.get(f"{srv.url}/api/incidents/inc-7f3a9c0d11e2", headers=h, timeout=10).json()["incident"]
    assert inc["evidence"][0]["message"] == HOSTILE


def test_expired_proposal_cannot_be_approved(tmp_path: Path):
    t = [1_800_000_000.0]
    sd = tmp_path / "s"
    rem = Remediator.from_options(sd, mode="approve", runner=NoSlurm(), cluster_nodes=4, proposal_ttl_s=600,
                                  clock=lambda: t[0])
    d = rem.handle([web_incident("inc-ttl000000001", "gpu-n02", None)])[0]
    t[0] += 601
    with pytest.raises(PolicyError, match="expired"):
        rem.approve(d.action_id, by="alice")
    assert rem.action(d.action_id)["status"] == "expired"
    rem.close()


def test_serve_and_serve_user_commands(tmp_path: Path, capsys):
    from recovery_logs.cli import main

    users = tmp_path / "users.toml"
    assert main(["serve-user", "dora", "--role", "admin", "--users", str(users)]) == 0
    token = capsys.readouterr().out.strip()
    assert len(token) >= 40 and token not in users.read_text() and hash_token(token) in users.read_text()
    assert users.stat().st_mode & 0o077 == 0                                   # 0600
    assert main(["serve-user", "dora", "--users", str(users)]) == 2            # exists already
    assert main(["serve", "--users", str(users), "--state-dir", str(tmp_path / "none")]) == 12
    assert "no audit database" in capsys.readouterr().err
    sd = _state(tmp_path)
    assert main(["serve", "--users", str(tmp_path / "missing.toml"), "--state-dir", str(sd)]) == 2
    assert "users file not found" in capsys.readouterr().err


def test_ledger_page_shows_time_to_resume(tmp_path: Path, web):
    start, _, tok = web
    srv = start(_state(tmp_path))
    page = requests.get(f"{srv.url}/ledger", headers={"Authorization": f"Bearer {tok['vera']}"}, timeout=20).text
    assert "Time to resumed training" in page
    row = page.split('<table id="resume">', 1)[1].split("</table>", 1)[0]
    assert "inc-7f3a9c0d11e2" in row and "4117" in row and "requeue_job (awaiting_approval)" in row
    lg = requests.get(f"{srv.url}/api/ledger", headers={"Authorization": f"Bearer {tok['vera']}"}, timeout=20).json()
    rec = next(r for r in lg["resume"] if r["incident_id"] == "inc-7f3a9c0d11e2")
    assert rec["job_id"] == "4117" and rec["executed_at"] is None and rec["propose_s"] is not None
