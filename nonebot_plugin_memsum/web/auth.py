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


def same_origin(origin: str | None, host: str | None, fetch_site: str | None = None) -> bool:
    """Whether a request comes from the page itself, not from another site.

    `Sec-Fetch-Site` first: the browser sets it (a page's script cannot), and it does not
    depend on the Host header, which a reverse proxy rewrites (nginx sends its upstream's
    own `127.0.0.1:8080` unless told otherwise): `same-origin`, or `none` (typed by the
    owner), passes; anything else is another site. Browsers that send no `Sec-Fetch-Site`
    (older ones; plain http to a LAN address is not a secure context) are judged by Origin
    (or Referer) against Host, the rule of Go's `http.CrossOriginProtection`; a Host without
    a port (nginx's `$host`) matches the origin's host name on any port. No header at all
    passes: browsers send Origin with every cross-site POST, and the SameSite cookie and
    the CSRF header stop the rest."""
    if fetch_site:
        return fetch_site.strip().lower() in ("same-origin", "none")
    if not origin:
        return True
    if origin == "null" or not host:
        return False
    given = urlsplit(origin)
    if given.netloc.lower() == host.lower():
        return True
    bare = urlsplit("//" + host)
    try:
        portless = bare.port is None
    except ValueError:
        return False
    return portless and bool(bare.hostname) and bare.hostname == given.hostname


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
