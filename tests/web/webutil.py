"""Helpers for the web console tests: a real uvicorn server on 127.0.0.1 (free port, in a thread)
over a real state dir, users with fresh tokens, incidents with file:line evidence."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from recovery_logs.records import ActionProposal, Evidence, Incident
from recovery_logs.web.app import build_app
from recovery_logs.web.auth import Users, write_user


@dataclass
class WebServer:
    url: str
    state_dir: Path
    tokens: dict[str, str]
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_server(state_dir: Path, users_file: Path, **kw) -> WebServer:
    app = build_app(state_dir, Users.load(users_file), **kw)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("web console did not start")
        time.sleep(0.05)
    return WebServer(f"http://127.0.0.1:{port}", state_dir, {}, server, t)


def make_users(path: Path, **roles: str) -> dict[str, str]:
    return {name: write_user(path, name, role) for name, role in roles.items()}


def web_incident(inc_id: str, node: str, job: str | None, *, kinds=("drain",), cause="XID 79 GPU has fallen off the bus",
                 t_ns: int = 1_795_000_000_000_000_000, message: str | None = None) -> Incident:
    acts = []
    for k in kinds:
        if k == "drain":
            acts.append(ActionProposal("drain_node", node, "record_only", cause, inc_id))
        elif k == "requeue":
            acts.append(ActionProposal("requeue_job", job, "record_only", cause, inc_id, (node,)))
    msg = message or "NVRM: Xid (PCI:0000:cb:00): 79, pid=4242, GPU has fallen off the bus."
    ev = (Evidence(t_ns, node, msg, "xid.79", f"nodes/{node}/kern.log", 1207),
          Evidence(t_ns + 3 * 10**9, "gpu-n01", "[rank4]:[E] Watchdog caught collective operation timeout",
                   "nccl.watchdog_timeout", "job-4117/gpu-n01.out", 88))
    return Incident(id=inc_id, category="xid", cause=cause, severity="critical", node=node, gpu=3, job_id=job,
                    xid=79, confidence=0.9, first_seen=t_ns, last_seen=t_ns + 5 * 10**9,
                    detected_at=t_ns + 2 * 10**9, count=2, nodes=(node, "gpu-n01"), evidence=ev,
                    candidates=(), actions=tuple(acts))


