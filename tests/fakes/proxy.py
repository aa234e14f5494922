"""A reverse proxy in front of the web page, as nginx forwards by default.

Built from nginx's own documentation of `proxy_pass` and `proxy_set_header`
(https://nginx.org/en/docs/http/ngx_http_proxy_module.html): with
`location /bot/ { proxy_pass http://127.0.0.1:8080/; }` the part of the path that matched
the location is replaced by the URI of `proxy_pass` (`/bot/memsum/` reaches the bot as
`/memsum/`); "By default, only two fields are redefined: proxy_set_header Host
$proxy_host; proxy_set_header Connection close;" (the upstream's own host and port, not
the browser's); every other request header (Cookie, Origin, Sec-Fetch-*, the page's CSRF
header) and every response header (Set-Cookie unchanged: `proxy_cookie_path` is off by
default) passes through. `host` = "$host" or "$http_host" imitates the configurations
that do set the header: `$host` drops the port the browser used.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

import httpx

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class NginxLikeProxy:
    """ASGI app: `location {location} {{ proxy_pass {upstream}{upstream_path}; }}`."""

    def __init__(
        self,
        upstream: str,
        location: str = "/bot/",
        upstream_path: str = "/",
        host: Literal["$proxy_host", "$host", "$http_host"] = "$proxy_host",
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.location = location
        self.upstream_path = upstream_path
        self.host = host
        self.seen: list[tuple[str, dict[str, str]]] = []
        """Each forwarded request: its upstream path and the headers sent upstream."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if not path.startswith(self.location):
            await _reply(send, 404, b"not under the location")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers: dict[str, str] = {}
        for raw_key, raw_value in scope["headers"]:
            key = raw_key.decode("latin-1").lower()
            if key in ("host", "connection", "content-length"):
                continue
            headers[key] = raw_value.decode("latin-1")
        browser_host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        headers["host"] = {
            "$proxy_host": self.upstream.split("://", 1)[1],
            "$host": browser_host.split(":", 1)[0],
            "$http_host": browser_host,
        }[self.host]
        headers["connection"] = "close"
        target = self.upstream_path + path[len(self.location) :]
        query = scope.get("query_string", b"").decode("latin-1")
        self.seen.append((target, headers))
        async with httpx.AsyncClient() as client:
            resp = await client.request(
                scope["method"],
                self.upstream + target + ("?" + query if query else ""),
                headers=headers,
                content=body,
            )
        out = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers.multi_items()
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding")
        ]
        out.append((b"content-length", str(len(resp.content)).encode()))
        await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
        await send({"type": "http.response.body", "body": resp.content})


async def _reply(send: Send, status: int, body: bytes) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})
