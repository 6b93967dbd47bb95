"""Who may do what in the web console: users file, roles, browser sessions, CSRF.

Users file (TOML), one table per user; it holds the sha256 of each token, never a token::

    [[user]]
    name = "alice"
    role = "operator"            # viewer | operator | admin
    token_sha256 = "9f86d081..." # recovery-logs serve-user alice --role operator --users FILE

Tokens are 256-bit random strings (``secrets.token_urlsafe(32)``) printed once when the user is
created, so an unsalted sha256 is enough to make the file useless to a reader (the same scheme
as API-token stores; a password would need a slow hash, a random token does not). Comparison
is constant-time.

Roles are ordered: a **viewer** reads every page and the JSON API; an **operator** also approves
and rejects proposals; an **admin** also resets the circuit breaker.

Authentication, in this order: ``Authorization: Bearer TOKEN`` (the JSON API and scripts); the
trusted reverse-proxy header when ``--trust-proxy-header`` names one (off by default: the proxy
must authenticate the user and strip the header from client requests; the name must be in the
users file, which gives the role); the session cookie set by the login form. Sessions live in
the server's memory (a restart logs everyone out), expire after ``SESSION_TTL_S`` and carry a
CSRF token that every form post and every cookie-authenticated API post must echo.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recovery_logs.errors import ConfigError

__all__ = ["ROLES", "SESSION_TTL_S", "Session", "SessionStore", "User", "Users", "hash_token", "new_token",
           "write_user"]

ROLES = ("viewer", "operator", "admin")
SESSION_TTL_S = 8 * 3600.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class User:
    name: str
    role: str
    token_sha256: str = field(repr=False)

    def can(self, role: str) -> bool:
        """At least ``role`` (viewer < operator < admin)."""
        return ROLES.index(self.role) >= ROLES.index(role)


class Users:
    """The validated users file."""

    def __init__(self, users: list[User], path: str = "") -> None:
        self.path = path
        self._by_name = {u.name: u for u in users}
        self._by_hash = {u.token_sha256: u for u in users}

    @classmethod
    def load(cls, path: Path) -> Users:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError("users file not found", path=str(p)) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"users file is not readable UTF-8 text: {exc}", path=str(p)) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"users file is not valid TOML: {exc}", path=str(p)) from exc
        unknown = set(data) - {"user"}
        if unknown:
            raise ConfigError("users file: unknown top-level keys (use [[user]] tables)", path=str(p),
                              keys=sorted(unknown))
        rows = data.get("user", [])
        if not isinstance(rows, list) or not rows:
            raise ConfigError("users file: no [[user]] entries", path=str(p))
        users: list[User] = []
        for n, row in enumerate(rows, 1):
            where = {"path": str(p), "entry": n}
            if not isinstance(row, dict):
                raise ConfigError("users file: each [[user]] must be a table", **where)
            if "token" in row or "password" in row:
                raise ConfigError("users file must hold token hashes (token_sha256), never tokens or passwords",
                                  **where)
            extra = set(row) - {"name", "role", "token_sha256"}
            if extra:
                raise ConfigError("users file: unknown keys", keys=sorted(extra), **where)
            name, role, h = row.get("name"), row.get("role"), row.get("token_sha256")
            if not isinstance(name, str) or not _NAME.match(name):
                raise ConfigError("users file: name must be 1-64 of A-Z a-z 0-9 . _ @ -", name=name, **where)
            if role not in ROLES:
                raise ConfigError(f"users file: role must be one of {', '.join(ROLES)}", role=role, name=name,
                                  **where)
            if not isinstance(h, str) or not _HEX64.match(h):
                raise ConfigError("users file: token_sha256 must be 64 lowercase hex digits", name=name, **where)
            users.append(User(name, role, h))
        names = [u.name for u in users]
        if len(set(names)) != len(names):
            raise ConfigError("users file: a name appears twice", path=str(p))
        if len({u.token_sha256 for u in users}) != len(users):
            raise ConfigError("users file: two users share a token", path=str(p))
        return cls(users, str(p))

    def by_token(self, token: str) -> User | None:
        h = hash_token(token)
        for known, user in self._by_hash.items():   # constant-time per comparison
            if hmac.compare_digest(known, h):
                return user
        return None

    def by_name(self, name: str) -> User | None:
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_name)


def write_user(path: Path, name: str, role: str) -> str:
    """Add a user to the users file (created if missing) and return the new token (shown once)."""
    if not _NAME.match(name):
        raise ConfigError("user name must be 1-64 of A-Z a-z 0-9 . _ @ -", name=name)
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}", role=role)
    p = Path(path)
    if p.exists():
        existing = Users.load(p)
        if existing.by_name(name) is not None:
            raise ConfigError("user already exists in the users file", name=name, path=str(p))
    token = new_token()
    entry = f'\n[[user]]\nname = "{name}"\nrole = "{role}"\ntoken_sha256 = "{hash_token(token)}"\n'
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(entry)
    p.chmod(0o600)
    return token


@dataclass
class Session:
    sid: str
    user: str
    csrf: str
    expires: float
    flash: list[str] = field(default_factory=list)


class SessionStore:
    """Browser sessions in memory: random 256-bit ids, expiry, a CSRF token each."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._s: dict[str, Session] = {}

    def create(self, user: str) -> Session:
        now = self.clock()
        for sid in [k for k, v in self._s.items() if v.expires <= now]:
            del self._s[sid]
        s = Session(secrets.token_urlsafe(32), user, secrets.token_urlsafe(32), now + self.ttl_s)
        self._s[s.sid] = s
        return s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        s = self._s.get(sid)
        if s is None or s.expires <= self.clock():
            self._s.pop(sid, None)
            return None
        return s

    def drop(self, sid: str | None) -> None:
        if sid:
            self._s.pop(sid, None)
