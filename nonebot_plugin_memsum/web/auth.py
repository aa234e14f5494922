"""Sign-in, sessions and cross-site protection of the web page; no FastAPI here.

The owner signs in with `MEMSUM_WEB_TOKEN` and gets a random session id in an HttpOnly,
SameSite=Strict cookie, plus a CSRF token the page sends back in a header with every
change. Sessions live in memory: a restart signs everyone out, which is fine for one owner.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from nonebot_plugin_memsum import clock

SESSION_SECONDS = 7 * 24 * 3600
FREE_FAILURES = 3
"""Wrong tokens an address may send before it has to wait."""
MAX_WAIT = 300
MAX_TRACKED = 10_000
"""Bounds on the sessions and on the addresses with failures remembered."""


def same_token(given: str, expected: str) -> bool:
    """Constant time, whatever the lengths: both sides are hashed to one length first."""
    return hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(expected.encode()).digest()
    )


def failure_wait(failures: int) -> float:
    """Seconds an address waits after its n-th wrong token in a row: 0 for the first few,
    then doubling, at most MAX_WAIT."""
    if failures < FREE_FAILURES:
        return 0.0
    return float(min(2 ** (failures - FREE_FAILURES), MAX_WAIT))


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether an Origin (or Referer) header names the host the request was sent to.
    No header at all passes: browsers send Origin with every cross-site POST, and the
    SameSite cookie and the CSRF header stop the rest."""
    if not origin:
        return True
    if origin == "null" or not host:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


@dataclass(frozen=True, slots=True)
class WebSession:
    csrf: str
    expires: float


@dataclass(slots=True)
class _Failures:
    count: int
    last: float


class Auth:
    """The token, the signed-in sessions and the failed sign-ins per address."""

    def __init__(self, token: str) -> None:
        self._token = token
        self._sessions: OrderedDict[str, WebSession] = OrderedDict()
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def retry_after(self, address: str) -> float:
        """Seconds until `address` may try a token again (0: now)."""
        seen = self._failures.get(address)
        if seen is None:
            return 0.0
        return max(0.0, seen.last + failure_wait(seen.count) - clock.now())

    def sign_in(self, address: str, token: str) -> tuple[str, WebSession] | None:
        """A new session for the right token; None (and one more failure) for a wrong one.
        Call only when `retry_after` is 0."""
        if not same_token(token, self._token):
            seen = self._failures.pop(address, None) or _Failures(0, 0.0)
            self._failures[address] = _Failures(seen.count + 1, clock.now())
            _bound(self._failures)
            return None
        self._failures.pop(address, None)
        sid = secrets.token_urlsafe(32)
        session = WebSession(csrf=secrets.token_urlsafe(32), expires=clock.now() + SESSION_SECONDS)
        self._sessions[sid] = session
        _bound(self._sessions)
        return sid, session

    def session(self, sid: str | None) -> WebSession | None:
        if not sid:
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        if session.expires <= clock.now():
            del self._sessions[sid]
            return None
        return session

    def sign_out(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)


def _bound(items: OrderedDict[str, Any]) -> None:
    while len(items) > MAX_TRACKED:
        items.popitem(last=False)
