"""The web console: ``recovery-logs serve --state-dir D [--bind 127.0.0.1:8080] --users FILE``.

Starlette (ASGI) served by uvicorn; pages are rendered on the server with Jinja2 (autoescape on,
every value through ``textsafe.clean`` first), one small script keeps the incident list live
(it polls ``/api/incidents`` and writes text nodes, never HTML). No build step.

Pages (any role): ``/`` incidents ranked and live · ``/incidents/ID`` evidence (file:line, the
LogsQL query back to VictoriaLogs), candidates, per-node timeline, actions with approvers and the
incident's audit history · ``/approvals`` · ``/policy`` (mode, budget, breaker, promotion per
rule) · ``/ledger`` · ``/audit`` (and ``/audit?verify=1``).

Decisions: ``POST /actions/ID/approve`` and ``/reject`` (operator, admin), ``POST /breaker/reset``
(admin), each with the form's CSRF token; the JSON API mirrors them under ``/api/...`` with
``Authorization: Bearer``. Every decision is written to the audit trail under the user's name by
the same ``Remediator`` the CLI uses (four eyes, approve-time re-checks, TTL live there).

Errors: no credentials → 401 (API) or the login page; a role too low → 403; a decision the
remediator refuses → 409 with its reason.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from recovery_logs import __version__
from recovery_logs.errors import RecoveryLogsError, SlurmUnavailable
from recovery_logs.remediation.remediator import Remediator
from recovery_logs.report.console import Snapshot
from recovery_logs.sources.slurm import CommandRunner, SlurmClient
from recovery_logs.textsafe import clean
from recovery_logs.timeutil import ns_to_iso
from recovery_logs.web import views
from recovery_logs.web.auth import Session, SessionStore, User, Users

__all__ = ["COOKIE", "build_app"]

COOKIE = "rl_session"
LOGIN_CSRF = "rl_login_csrf"
_HERE = Path(str(resources.files("recovery_logs") / "web"))
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def _finalize(v: Any) -> Any:
    return clean(v) if isinstance(v, str) else v


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(_HERE / "templates")), autoescape=select_autoescape(default=True),
                      finalize=_finalize, trim_blocks=True, lstrip_blocks=True)
    env.filters["t"] = lambda ns: (ns_to_iso(int(ns)) or "-").replace("T", " ")[:19] if ns else "-"
    env.filters["ts"] = lambda s: (ns_to_iso(int(s * 1e9)) or "-").replace("T", " ")[:19] if s else "-"
    env.filters["iso"] = lambda s: (s or "-").replace("T", " ")[:23]
    env.filters["url"] = lambda s: quote(str(s), safe="")
    return env


class Console:
    """State shared by the routes of one ``serve``."""

    def __init__(self, state_dir: Path, users: Users, *, trust_proxy_header: str | None = None,
                 secure_cookie: bool = True, runner: CommandRunner | None = None,
                 clock: Callable[[], float] | None = None, victorialogs: str | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.users = users
        self.proxy_header = trust_proxy_header.lower() if trust_proxy_header else None
        self.secure_cookie = secure_cookie
        self.runner = runner
        self.clock = clock or time.time
        self.victorialogs = victorialogs
        self.sessions = SessionStore(clock=self.clock)
        self.env = _env()
        self.lock = threading.Lock()    # one decision at a time (SQLite serialises too; this keeps order)

    # ---------------------------------------------------------------- who is asking
    def user(self, request: Request) -> tuple[User | None, Session | None, str]:
        """(user, session, how): how is "bearer", "proxy", "session" or ""."""
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return self.users.by_token(auth[7:].strip()), None, "bearer"
        if self.proxy_header:
            name = request.headers.get(self.proxy_header)
            if name:
                return self.users.by_name(name.strip()), None, "proxy"
        s = self.sessions.get(request.cookies.get(COOKIE))
        if s is not None:
            return self.users.by_name(s.user), s, "session"
        return None, None, ""

    def remediator(self) -> Remediator:
        return Remediator.open_existing(self.state_dir, mode="approve", runner=self.runner, clock=self.clock)

    # ---------------------------------------------------------------- rendering
    def page(self, request: Request, name: str, user: User, session: Session | None, status: int = 200,
             **ctx: Any) -> HTMLResponse:
        flash = []
        if session is not None:
            flash, session.flash = session.flash, []
        body = self.env.get_template(name).render(user=user, csrf=session.csrf if session else "", flash=flash,
                                                 version=__version__, path=request.url.path, **ctx)
        return HTMLResponse(body, status_code=status, headers=_SECURITY_HEADERS)


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers=_SECURITY_HEADERS)


def _view_dict(v: Any) -> dict[str, Any]:
    return {k: getattr(v, k) for k in v.__dataclass_fields__}


def build_app(state_dir: Path, users: Users, **kw: Any) -> Starlette:
    """The ASGI app (``uvicorn.run(build_app(...))``); ``kw`` as ``Console``."""
    c = Console(state_dir, users, **kw)

    # ------------------------------------------------------------ guards
    def need(request: Request, role: str = "viewer", api: bool = False, post: bool = False
             ) -> tuple[User, Session | None] | Response:
        user, session, how = c.user(request)
        if user is None:
            if api or how == "bearer":
                return _json({"error": "authentication required (Authorization: Bearer TOKEN)"}, 401)
            return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
        if not user.can(role):
            msg = f"{user.name} is a {user.role}; this needs the {role} role"
            if api:
                return _json({"error": msg}, 403)
            return c.page(request, "error.html", user, session, status=403, message=msg)
        return user, session

    async def csrf_ok(request: Request, session: Session | None, how_api: bool) -> bool:
        if session is None:         # bearer or proxy: no ambient cookie, nothing to forge
            return True
        if how_api:
            return request.headers.get("x-csrf-token", "") == session.csrf
        form = await request.form()
        return str(form.get("csrf", "")) == session.csrf

    def with_401(resp: Response) -> Response:
        if resp.status_code == 401:
            resp.headers["WWW-Authenticate"] = 'Bearer realm="recovery-logs"'
        return resp

    # ------------------------------------------------------------ login
    async def login(request: Request) -> Response:
        nxt = request.query_params.get("next", "/")
        nxt = nxt if nxt.startswith("/") and not nxt.startswith("//") else "/"
        if request.method == "GET":
            token = secrets.token_urlsafe(24)
            body = c.env.get_template("login.html").render(csrf=token, next=nxt, error=None, user=None, flash=[],
                                                          version=__version__, path="/login")
            resp = HTMLResponse(body, headers=_SECURITY_HEADERS)
            resp.set_cookie(LOGIN_CSRF, token, httponly=True, samesite="strict", secure=c.secure_cookie)
            return resp
        form = await request.form()
        if not request.cookies.get(LOGIN_CSRF) or str(form.get("csrf", "")) != request.cookies.get(LOGIN_CSRF):
            return PlainTextResponse("login form expired; reload the page", status_code=400)
        name, token = str(form.get("name", "")).strip(), str(form.get("token", "")).strip()
        user = c.users.by_token(token) if token else None
        if user is None or user.name != name:
            body = c.env.get_template("login.html").render(csrf=request.cookies[LOGIN_CSRF], next=nxt, user=None,
                                                          error="unknown user or wrong token", flash=[],
                                                          version=__version__, path="/login")
            return HTMLResponse(body, status_code=401, headers=_SECURITY_HEADERS)
        s = c.sessions.create(user.name)
        dest = str(form.get("next") or nxt)
        ok = dest.startswith("/") and not dest.startswith("//")
        done = RedirectResponse(dest if ok else "/", status_code=303)
        done.set_cookie(COOKIE, s.sid, httponly=True, samesite="strict", secure=c.secure_cookie,
                        max_age=int(c.sessions.ttl_s))
        done.delete_cookie(LOGIN_CSRF)
        return done

    async def logout(request: Request) -> Response:
        _, session, _ = c.user(request)
        if session is not None and await csrf_ok(request, session, False):
            c.sessions.drop(session.sid)
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(COOKIE)
        return resp

    # ------------------------------------------------------------ pages
    def incidents_page(request: Request) -> Response:
        g = need(request)
        if isinstance(g, Response):
            return g
        snap = Snapshot.load(c.state_dir)
        return c.page(request, "incidents.html", *g, snap=snap)

    def incident_page(request: Request) -> Response:
        g = need(request)
        if isinstance(g, Response):
            return g
        d = views.incident_detail(c.state_dir, request.path_params["id"], c.victorialogs)
        if d is None:
            return c.page(request, "error.html", g[0], g[1], status=404, message="no such incident")
        return c.page(request, "incident.html", *g, d=d, pending={a.action_id: a for a in views.approvals(
            c.state_dir, c.clock())})

    def approvals_page(request: Request) -> Response:
        g = need(request)
        if isinstance(g, Response):
            return g
        return c.page(request, "approvals.html", *g, items=views.approvals(c.state_dir, c.clock()))

    def policy_page(request: Request) -> Response:
        g = need(request)
        if isinstance(g, Response):
            return g
        return c.page(request, "policy.html", *g, p=views.policy_view(c.state_dir))

    def ledger_page(request: Request) -> Response:
        g = need(request)
        if isinstance(g, Response):
            return g
        client = SlurmClient(c.runner) if c.runner is not None else SlurmClient()
        return c.page(request, "ledger.html", *g, lg=views.ledger_view(c.state_dir, client))

    def audit_pg(request: Request) -> Response:
        g = need(request)
        if isinstance(g, Response):
            return g
        q = request.query_params
        recs, total = views.audit_page(c.state_dir, q.get("kind"), q.get("incident"))
        verified = views.verify_chain(c.state_dir) if q.get("verify") else None
        return c.page(request, "audit.html", *g, records=recs, total=total, verified=verified,
                      kind=q.get("kind", ""), incident=q.get("incident", ""))

    # ------------------------------------------------------------ decisions
    def decide(what: str, user: User, action_id: str, reason: str = "") -> tuple[int, dict[str, Any]]:
        with c.lock:
            try:
                rem = c.remediator()
            except RecoveryLogsError as exc:
                return 409, {"error": str(exc)}
            try:
                if what == "approve":
                    d = rem.approve(action_id, by=user.name)
                elif what == "reject":
                    d = rem.reject(action_id, by=user.name, reason=reason)
                else:
                    was = rem.breaker()
                    rem.breaker_reset(by=user.name)
                    return 200, {"breaker": "reset", "was": was, "by": user.name}
            except SlurmUnavailable as exc:
                return 503, {"error": f"Slurm is unreachable, nothing was recorded; try again: {exc}"}
            except RecoveryLogsError as exc:
                return 409, {"error": str(exc)}
            finally:
                rem.close()
        return 200, {"action_id": d.action_id, "decision": d.decision, "status": d.status, "reason": d.reason,
                     "by": user.name, "result": d.result}

    def _message(what: str, code: int, out: dict[str, Any]) -> str:
        if code != 200:
            return f"{what} refused: {out.get('error')}"
        if what == "breaker-reset":
            return f"breaker reset by {out['by']}"
        msg = out.get("result", {}).get("message") or out["reason"]
        return f"{out['action_id']}: {out['decision']}/{out['status']} — {msg}"

    async def form_decide(request: Request) -> Response:
        what = request.path_params.get("what", "breaker-reset")
        if what not in ("approve", "reject", "breaker-reset"):
            return PlainTextResponse("unknown decision", status_code=404)
        g = need(request, "admin" if what == "breaker-reset" else "operator")
        if isinstance(g, Response):
            return g
        user, session = g
        if not await csrf_ok(request, session, False):
            return PlainTextResponse("CSRF token missing or wrong; reload the page", status_code=403)
        form = await request.form()
        code, out = await _in_thread(decide, what, user, request.path_params.get("id", ""), str(form.get("reason", "")))
        if session is not None:
            session.flash.append(_message(what, code, out))
        back = str(form.get("next", "/approvals"))
        return RedirectResponse(back if back.startswith("/") and not back.startswith("//") else "/approvals",
                                status_code=303)

    async def api_decide(request: Request) -> Response:
        what = request.path_params.get("what", "breaker-reset")
        if what not in ("approve", "reject", "breaker-reset"):
            return _json({"error": "unknown decision (approve or reject)"}, 404)
        g = need(request, "admin" if what == "breaker-reset" else "operator", api=True)
        if isinstance(g, Response):
            return with_401(g)
        user, session = g
        if not await csrf_ok(request, session, True):
            return _json({"error": "X-CSRF-Token header missing or wrong"}, 403)
        reason = ""
        if what == "reject":
            try:
                body = await request.json()
                reason = str(body.get("reason", "")) if isinstance(body, dict) else ""
            except ValueError:
                reason = ""
        code, out = await _in_thread(decide, what, user, request.path_params.get("id", ""), reason)
        return _json(out, code)

    # ------------------------------------------------------------ JSON API (reads)
    def api_read(fn: Callable[[Request], Any]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            g = need(request, api=True)
            if isinstance(g, Response):
                return with_401(g)
            try:
                return _json(fn(request))
            except RecoveryLogsError as exc:
                return _json({"error": str(exc)}, 500)
        return endpoint

    def _incidents(_r: Request) -> Any:
        snap = Snapshot.load(c.state_dir)
        return {"now": snap.now, "mode": snap.mode, "incidents": [_view_dict(v) for v in snap.incidents],
                "pending": len(snap.pending), "breaker": snap.breaker}

    def _incident(r: Request) -> Any:
        d = views.incident_detail(c.state_dir, r.path_params["id"], c.victorialogs)
        if d is None:
            return {"error": "no such incident"}
        return {"incident": d["incident"], "actions": d["actions"], "history": [h.to_dict() for h in d["history"]]}

    def _approvals(_r: Request) -> Any:
        return {"approvals": [_view_dict(a) for a in views.approvals(c.state_dir, c.clock())]}

    def _policy(_r: Request) -> Any:
        p = views.policy_view(c.state_dir)
        s = p["snap"]
        return {"mode": s.mode, "policy": p["policy"], "breaker": s.breaker, "budget_used_hour": s.budget_used,
                "budget_per_hour": s.budget_per_hour, "drained_in_window": list(s.drained),
                "cluster_nodes": s.cluster_nodes, "promotion": p["promotion"]}

    def _ledger(_r: Request) -> Any:
        return views.ledger_view(c.state_dir, SlurmClient(c.runner) if c.runner is not None else SlurmClient())

    def _audit(r: Request) -> Any:
        recs, total = views.audit_page(c.state_dir, r.query_params.get("kind"), r.query_params.get("incident"),
                                       limit=min(1000, int(r.query_params.get("limit", "200") or 200)))
        return {"total": total, "records": [x.to_dict() for x in recs]}

    def _verify(_r: Request) -> Any:
        ok, msg = views.verify_chain(c.state_dir)
        return {"ok": ok, "message": msg}

    def _me(r: Request) -> Any:
        user, session, how = c.user(r)
        return {"name": user.name if user else None, "role": user.role if user else None, "via": how,
                "csrf": session.csrf if session else None}

    def healthz(_r: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/", incidents_page), Route("/incidents/{id}", incident_page), Route("/approvals", approvals_page),
        Route("/policy", policy_page), Route("/ledger", ledger_page), Route("/audit", audit_pg),
        Route("/login", login, methods=["GET", "POST"]), Route("/logout", logout, methods=["POST"]),
        Route("/actions/{id}/{what:str}", form_decide, methods=["POST"]),
        Route("/breaker/reset", form_decide, methods=["POST"]),
        Route("/api/incidents", api_read(_incidents)), Route("/api/incidents/{id}", api_read(_incident)),
        Route("/api/approvals", api_read(_approvals)), Route("/api/policy", api_read(_policy)),
        Route("/api/ledger", api_read(_ledger)), Route("/api/audit", api_read(_audit)),
        Route("/api/audit/verify", api_read(_verify)), Route("/api/me", api_read(_me)),
        Route("/api/actions/{id}/{what:str}", api_decide, methods=["POST"]),
        Route("/api/breaker/reset", api_decide, methods=["POST"]),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.console = c
    return app


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await run_in_threadpool(fn, *args)
