"""A OneBot v11 implementation simulator for end-to-end tests.

It plays the part NapCat, Lagrange or LLOneBot play in production: it connects to the
bot over reverse WebSocket as a Universal client, pushes events, and answers every API
call the bot makes, remembering each call so tests can assert on what the bot did.
Field names follow the OneBot v11 spec (botuniverse/onebot, v11/specs) and what
nonebot-adapter-onebot's v11 event models require.
"""

# The harness API takes plain `timeout=` seconds, as the tests read better that way.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import inspect
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Self

import httpx
import uvicorn
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse

Segment = dict[str, Any]
Responder = Callable[[dict[str, Any]], Any]

SEND_ACTIONS = frozenset({"send_msg", "send_group_msg", "send_private_msg"})
FORWARD_ACTIONS = frozenset({"send_group_forward_msg", "send_private_forward_msg", "send_forward_msg"})
# The retcode go-cqhttp, NapCat and Lagrange give for an action they do not know.
RETCODE_UNKNOWN_ACTION = 1404
RETCODE_BAD_PARAMS = 100
RETCODE_INTERNAL = 102


# --- message segments (OneBot v11 array format) ---------------------------------------


def text(content: str) -> Segment:
    return {"type": "text", "data": {"text": content}}


def at(qq: int | str) -> Segment:
    return {"type": "at", "data": {"qq": str(qq)}}


def reply(message_id: int) -> Segment:
    return {"type": "reply", "data": {"id": str(message_id)}}


def face(face_id: int) -> Segment:
    return {"type": "face", "data": {"id": str(face_id)}}


def image(file: str = "0B38145AA44505000B38145AA4450500.jpg", *, url: str = "", summary: str = "") -> Segment:
    # As received, an image carries the implementation's file name and a download url.
    data: dict[str, Any] = {"file": file, "url": url or f"https://gchat.qpic.cn/gchatpic_new/0/0-0-{file}/0"}
    if summary:
        data["summary"] = summary
    return {"type": "image", "data": data}


_CQ_CODE = re.compile(r"\[CQ:([\w.-]+)((?:,[^,\]]*)*)\]")


def _cq_unescape(s: str) -> str:
    return s.replace("&#44;", ",").replace("&#91;", "[").replace("&#93;", "]").replace("&amp;", "&")


def _cq_escape(s: str, *, comma: bool = False) -> str:
    s = s.replace("&", "&amp;").replace("[", "&#91;").replace("]", "&#93;")
    return s.replace(",", "&#44;") if comma else s


def parse_cq(message: str) -> list[Segment]:
    """A CQ-code string as the array format."""
    segments: list[Segment] = []
    pos = 0
    for m in _CQ_CODE.finditer(message):
        if m.start() > pos:
            segments.append(text(_cq_unescape(message[pos : m.start()])))
        data: dict[str, Any] = {}
        for pair in filter(None, m.group(2).split(",")):
            key, _, value = pair.partition("=")
            data[key] = _cq_unescape(value)
        segments.append({"type": m.group(1), "data": data})
        pos = m.end()
    if pos < len(message):
        segments.append(text(_cq_unescape(message[pos:])))
    return segments


def to_cq(segments: Iterable[Segment]) -> str:
    """The `raw_message` form of a message: text escaped, other segments as CQ codes."""
    out: list[str] = []
    for seg in segments:
        data = seg.get("data") or {}
        if seg["type"] == "text":
            out.append(_cq_escape(str(data.get("text", ""))))
        else:
            params = "".join(
                f",{k}={_cq_escape(str(v), comma=True)}" for k, v in data.items() if v is not None
            )
            out.append(f"[CQ:{seg['type']}{params}]")
    return "".join(out)


def as_segments(message: Any, *, auto_escape: bool = False) -> list[Segment]:
    """Any shape a `message` field may take (string, one segment, a list) as a list of segments."""
    if isinstance(message, str):
        return [text(message)] if auto_escape else parse_cq(message)
    if isinstance(message, Mapping):
        return [dict(message)]
    if isinstance(message, list):
        return [dict(seg) for seg in message]
    return []


def plain_text(message: Any) -> str:
    """The text segments of a message; forward nodes contribute their content, one per line."""
    parts: list[str] = []
    for seg in as_segments(message):
        data = seg.get("data") or {}
        if seg.get("type") == "text":
            parts.append(str(data.get("text", "")))
        elif seg.get("type") == "node" and "content" in data:
            parts.append(plain_text(data["content"]) + "\n")
    return "".join(parts).strip("\n")


# --- the simulator ---------------------------------------------------------------------


@dataclass(frozen=True)
class ApiCall:
    """One API call the bot made."""

    action: str
    params: dict[str, Any]
    echo: Any
    time: float


@dataclass
class StoredMessage:
    """A message the sim knows by id: one it pushed, or one the bot sent through it."""

    message_id: int
    message_type: str
    sender: dict[str, Any]
    message: list[Segment]
    time: int
    group_id: int | None = None
    user_id: int | None = None


@dataclass
class Member:
    group_id: int
    user_id: int
    nickname: str
    card: str = ""
    role: str = "member"


class ActionFailedError(Exception):
    """Raise from a responder to answer a call with `status: failed`."""

    def __init__(self, retcode: int, message: str) -> None:
        super().__init__(message)
        self.retcode = retcode
        self.message = message


class ConnectionRejectedError(Exception):
    """The bot refused the WebSocket handshake (bad token, duplicate self id)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the bot refused the connection with HTTP {status}")
        self.status = status


@dataclass
class _Waiter:
    match: Callable[[int, ApiCall], bool]
    future: asyncio.Future[ApiCall] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class OneBotSim:
    """A OneBot v11 implementation: connects to the bot over reverse WS, sends events, answers API calls."""

    def __init__(
        self, url: str, *, self_id: int = 10000, access_token: str | None = None, nickname: str = "bot"
    ) -> None:
        self.url = url
        self.self_id = self_id
        self.access_token = access_token
        self.nickname = nickname
        self.calls: list[ApiCall] = []
        self.messages: dict[int, StoredMessage] = {}
        self.forgotten: set[int] = set()  # `forget`
        self._places: dict[tuple[str, int], list[int]] = {}
        """A group's or a private peer's message ids in the order they came: a history action
        answers from its own place's list, in a few µs as a real implementation does (a
        scan of every message took ~4 ms at 12,000 messages, and at a thousand groups the
        bench's own client was then what the bot's backfill waited for)."""
        self.members: dict[tuple[int, int], Member] = {}
        self.group_names: dict[int, str] = {}
        self.responders: dict[str, Responder] = {
            "get_login_info": lambda _: {"user_id": self.self_id, "nickname": self.nickname},
            "get_status": lambda _: {"online": True, "good": True},
            "get_version_info": lambda _: {
                "app_name": "onebot-sim",
                "app_version": "0.1.0",
                "protocol_version": "v11",
            },
            "get_msg": self._get_msg,
            "get_group_member_info": self._get_group_member_info,
            "get_group_member_list": self._get_group_member_list,
            "get_stranger_info": self._get_stranger_info,
            "get_group_info": self._get_group_info,
            "send_msg": self._send_msg,
            "send_group_msg": lambda p: self._send_msg({**p, "message_type": "group"}),
            "send_private_msg": lambda p: self._send_msg({**p, "message_type": "private"}),
            "send_forward_msg": self._send_forward,
            "send_group_forward_msg": lambda p: self._send_forward({**p, "message_type": "group"}),
            "send_private_forward_msg": lambda p: self._send_forward({**p, "message_type": "private"}),
            "delete_msg": lambda _: None,
            "get_group_msg_history": self._get_group_msg_history,
            "get_friend_msg_history": self._get_friend_msg_history,
        }
        self.disconnected = asyncio.Event()
        self._ids = itertools.count(1001)
        self._ws: ClientConnection | ServerConnection | None = None
        self._receiver: asyncio.Task[None] | None = None
        self._server: Server | None = None
        self._http_server: uvicorn.Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._post: tuple[httpx.AsyncClient, str, str | None] | None = None
        """HTTP POST mode: the client, the bot's event URL and the HMAC secret (None: unsigned)."""
        self.connected = asyncio.Event()
        """Set while a forward-WebSocket connection from the bot is open."""
        self.auth_seen: list[str | None] = []
        """The Authorization header of every forward-WebSocket handshake and HTTP API call."""
        self._handlers: set[asyncio.Task[None]] = set()
        self._waiters: list[_Waiter] = []

    # --- connection --------------------------------------------------------------------

    async def connect(self, timeout: float = 15) -> None:
        """Connect, retrying while the bot is not listening yet; then announce the connection."""
        if self._ws is not None:
            raise RuntimeError("already connected")
        headers = {"X-Self-ID": str(self.self_id), "X-Client-Role": "Universal"}
        if self.access_token is not None:
            headers["Authorization"] = f"Bearer {self.access_token}"
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                self._ws = await connect(
                    self.url, additional_headers=headers, max_size=None, open_timeout=timeout
                )
                break
            except InvalidStatus as err:
                raise ConnectionRejectedError(err.response.status_code) from None
            except (OSError, InvalidMessage):
                # Not listening yet, or going down mid-handshake: a real client retries.
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                await asyncio.sleep(0.1)
        self.disconnected.clear()
        self._receiver = asyncio.create_task(self._receive(self._ws))
        # Real implementations announce a reverse-WS connection with a lifecycle event.
        await self.send_event(
            {"post_type": "meta_event", "meta_event_type": "lifecycle", "sub_type": "connect"}
        )

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._http_server is not None and self._http_task is not None:
            self._http_server.should_exit = True
            await self._http_task
            self._http_server = self._http_task = None
        if self._post is not None:
            await self._post[0].aclose()
            self._post = None
        if self._receiver is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiver
            self._receiver = None
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _receive(self, ws: ClientConnection | ServerConnection) -> None:
        try:
            async for raw in ws:
                data = json.loads(raw)
                if isinstance(data, dict) and "action" in data:
                    task = asyncio.create_task(self._answer(ws, data))
                    self._handlers.add(task)
                    task.add_done_callback(self._handlers.discard)
        except ConnectionClosed:
            pass
        finally:
            if self._ws is ws:
                self._ws = None
            self.disconnected.set()

    async def _answer(self, ws: ClientConnection | ServerConnection, request: dict[str, Any]) -> None:
        reply_ = await self._reply(request)
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps(reply_, ensure_ascii=False))

    async def _reply(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to one API call (`action`, `params`, `echo`), however it came."""
        action = str(request["action"])
        params = request.get("params") or {}
        call = ApiCall(action, params, request.get("echo"), time.time())
        self.calls.append(call)
        self._wake(len(self.calls) - 1, call)
        reply_: dict[str, Any]
        responder = self.responders.get(action)
        if responder is None:
            reply_ = _failed(RETCODE_UNKNOWN_ACTION, f"unknown action {action}")
        else:
            try:
                data = responder(params)
                if inspect.isawaitable(data):
                    data = await data
                reply_ = {"status": "ok", "retcode": 0, "data": data}
            except ActionFailedError as err:
                reply_ = _failed(err.retcode, err.message)
            except Exception as err:
                # A broken responder must fail the call now, not leave the bot waiting for
                # its API timeout; the bot logs the message.
                reply_ = _failed(RETCODE_INTERNAL, f"responder for {action} raised {err!r}")
        if "echo" in request:
            reply_["echo"] = request["echo"]
        return reply_

    # --- the other connection modes ----------------------------------------------------
    # Forward WebSocket: the implementation listens and the bot connects (NoneBot's
    # ONEBOT_WS_URLS; NapCat's "WebSocket 服务器" / websocketServers, Lagrange's
    # "ForwardWebSocket"). The OneBot v11 spec (botuniverse/onebot-11
    # communication/ws.md): the client sends `Authorization: Bearer <access_token>` and a
    # wrong or missing token is refused with 401 (missing) / 403 (wrong) at the handshake.
    # nonebot-adapter-onebot (v11/adapter.py `_forward_ws`) creates the bot only from a
    # `meta_event` lifecycle `connect` carrying `self_id`, which NapCat
    # (src/onebot/network/websocket-server.ts) and Lagrange send on every new connection.
    async def serve_forward(self, port: int) -> None:
        """Listen on 127.0.0.1:`port` as a forward-WebSocket implementation, one connection at a time."""

        def check(_: ServerConnection, request: WsRequest) -> WsResponse | None:
            auth = request.headers.get("Authorization")
            self.auth_seen.append(auth)
            if self.access_token is None or auth == f"Bearer {self.access_token}":
                return None
            status = 401 if auth is None else 403
            return WsResponse(status, "Unauthorized", Headers(), b"token refused\n")

        async def handler(conn: ServerConnection) -> None:
            if self._ws is not None:
                await conn.close(1008, "one connection at a time")
                return
            self._ws = conn
            self.disconnected.clear()
            self._receiver = asyncio.create_task(self._receive(conn))
            await self.send_event(
                {"post_type": "meta_event", "meta_event_type": "lifecycle", "sub_type": "connect"}
            )
            self.connected.set()
            await conn.wait_closed()
            self.connected.clear()
            if self._receiver is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._receiver

        self._server = await serve(handler, "127.0.0.1", port, process_request=check, max_size=None)

    async def drop_forward(self) -> None:
        """Close the bot's forward connection (the implementation restarting); keep listening."""
        ws = self._ws
        if ws is not None:
            await ws.close()
            await asyncio.wait_for(self.disconnected.wait(), 10)

    # HTTP: events POSTed to the bot's /onebot/v11/http, API calls POSTed by the bot to
    # <api root>/<action> (NoneBot's ONEBOT_API_ROOTS). The OneBot v11 spec
    # (communication/http-post.md, communication/http.md) and NapCat
    # (src/onebot/network/http-client.ts: `Content-Type: application/json`, `x-self-id`,
    # and with a token `x-signature: sha1=<HMAC-SHA1 of the raw body, keyed by it>`;
    # src/onebot/network/http-server.ts: POST /<action> with the params as the JSON body,
    # `Authorization: Bearer <token>` checked, the result as `{status, retcode, data}`).
    async def serve_http(self, port: int) -> None:
        """Answer API calls over HTTP on 127.0.0.1:`port` (the bot's ONEBOT_API_ROOTS)."""

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            body = b""
            while True:
                chunk = await receive()
                body += chunk.get("body", b"")
                if not chunk.get("more_body"):
                    break
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            auth = headers.get("authorization")
            self.auth_seen.append(auth)
            if self.access_token is not None and auth != f"Bearer {self.access_token}":
                status, answer = 403, {"status": "failed", "retcode": 403, "data": None}
            else:
                params = json.loads(body or b"{}")
                status, answer = (
                    200,
                    await self._reply({"action": scope["path"].strip("/"), "params": params}),
                )
            data = json.dumps(answer, ensure_ascii=False).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(data)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": data})

        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
        )
        self._http_server = server
        self._http_task = asyncio.create_task(server.serve())
        while not server.started:
            if self._http_task.done():
                await self._http_task
            await asyncio.sleep(0.02)

    def post_events_to(self, url: str, *, secret: str | None = None) -> None:
        """Push every event as an HTTP POST to `url` (signed with `secret` when given)."""
        self._post = (httpx.AsyncClient(timeout=10), url, secret)
        self.disconnected.clear()

    last_post_status: int | None = None

    async def _post_event(self, body: bytes) -> None:
        assert self._post is not None
        client, url, secret = self._post
        headers = {"Content-Type": "application/json", "X-Self-ID": str(self.self_id)}
        if secret is not None:
            headers["X-Signature"] = "sha1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
        try:
            response = await client.post(url, content=body, headers=headers)
        except httpx.TransportError:
            # The bot is not listening (restarting): NapCat logs it and the event is gone,
            # kept only in its history. As a closed WebSocket does, for `_push_message`.
            raise RuntimeError("not connected") from None
        self.last_post_status = response.status_code

    # --- events ------------------------------------------------------------------------

    async def send_event(self, event: Mapping[str, Any]) -> None:
        """Push one event; `time` and `self_id` are filled in when absent."""
        if self._ws is None and self._post is None:
            raise RuntimeError("not connected")
        payload = {"time": int(time.time()), "self_id": self.self_id, **event}
        if payload.get("post_type") == "message" and "message_id" in payload:
            self._remember(payload)  # so `get_msg` finds it, as the implementations do
        if self._post is not None:
            await self._post_event(json.dumps(payload, ensure_ascii=False).encode())
            return
        assert self._ws is not None
        await self._ws.send(json.dumps(payload, ensure_ascii=False))

    async def send_raw(self, payload: Mapping[str, Any]) -> None:
        """Push a payload exactly as given, however malformed (a buggy implementation's)."""
        if self._ws is None:
            raise RuntimeError("not connected")
        await self._ws.send(json.dumps(payload, ensure_ascii=False))

    def _remember(self, payload: Mapping[str, Any]) -> None:
        mid = int(payload["message_id"])
        if mid not in self.messages:
            self._keep(
                StoredMessage(
                    mid,
                    str(payload.get("message_type", "group")),
                    dict(payload.get("sender") or {}),
                    as_segments(payload.get("message")),
                    int(payload["time"]),
                    group_id=_opt_int(payload.get("group_id")),
                    user_id=_opt_int(payload.get("user_id")),
                )
            )

    def _keep(self, stored: StoredMessage) -> None:
        """`stored` by its id, and in its place's list when the id is new."""
        if stored.message_id not in self.messages:
            if stored.message_type == "group":
                places = [stored.group_id]
            else:  # a private chat is the peer's, whoever spoke
                places = [stored.user_id, _opt_int(stored.sender.get("user_id"))]
            for place in {p for p in places if p is not None}:
                self._places.setdefault((stored.message_type, place), []).append(stored.message_id)
        self.messages[stored.message_id] = stored

    async def group_message(
        self,
        group_id: int,
        user_id: int,
        message: str | list[Segment],
        *,
        nickname: str = "",
        card: str = "",
        role: str = "",
        message_id: int | None = None,
    ) -> int:
        """Push a group message; sender fields left empty come from `add_member` (or defaults)."""
        member = self.members.get((group_id, user_id))
        if member is None:
            member = self.add_member(group_id, user_id, nickname, card=card, role=role or "member")
        else:
            member.nickname = nickname or member.nickname
            member.card = card or member.card
            member.role = role or member.role
        sender = {
            "user_id": user_id,
            "nickname": member.nickname,
            "card": member.card,
            "sex": "unknown",
            "age": 0,
            "area": "",
            "level": "1",
            "role": member.role,
            "title": "",
        }
        stored = self._store("group", sender, message, message_id, group_id=group_id)
        await self._push_message(stored, sub_type="normal", extra={"group_id": group_id, "anonymous": None})
        return stored.message_id

    async def private_message(self, user_id: int, message: str | list[Segment], *, nickname: str = "") -> int:
        sender = {
            "user_id": user_id,
            "nickname": nickname or _default_nickname(user_id),
            "sex": "unknown",
            "age": 0,
        }
        stored = self._store("private", sender, message, None, user_id=user_id)
        await self._push_message(stored, sub_type="friend", extra={})
        return stored.message_id

    async def notice(self, notice_type: str, **fields: Any) -> None:
        """Push a notice; `sub_type` and `operator_id` get the spec's usual values when absent."""
        defaults: dict[str, Any] = {
            "group_increase": {"sub_type": "approve"},
            "group_decrease": {"sub_type": "leave"},
            "group_admin": {"sub_type": "set"},
            "group_ban": {"sub_type": "ban", "duration": 600},
            "notify": {"sub_type": "poke", "target_id": self.self_id},
        }.get(notice_type, {})
        event: dict[str, Any] = {"post_type": "notice", "notice_type": notice_type, **defaults, **fields}
        if notice_type in {"group_increase", "group_decrease", "group_recall", "group_ban"}:
            event.setdefault("operator_id", event.get("user_id"))
        await self.send_event(event)

    async def _push_message(self, stored: StoredMessage, *, sub_type: str, extra: dict[str, Any]) -> None:
        try:
            await self.send_event(self._event_of(stored, sub_type=sub_type, extra=extra))
        except (RuntimeError, ConnectionClosed):
            # Not connected, or the bot died as it was sent (a kill test's SIGKILL landing on
            # this very push): said while the bot was away, kept for the history actions.
            pass

    def _event_of(self, stored: StoredMessage, *, sub_type: str, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "time": stored.time,
            "self_id": self.self_id,
            "post_type": "message",
            "message_type": stored.message_type,
            "sub_type": sub_type,
            "message_id": stored.message_id,
            "user_id": stored.sender["user_id"],
            **extra,
            "message": stored.message,
            "raw_message": to_cq(stored.message),
            "font": 0,
            "sender": stored.sender,
        }

    def _store(
        self,
        message_type: str,
        sender: dict[str, Any],
        message: Any,
        message_id: int | None,
        *,
        group_id: int | None = None,
        user_id: int | None = None,
    ) -> StoredMessage:
        mid = next(self._ids) if message_id is None else message_id
        stored = StoredMessage(
            mid,
            message_type,
            sender,
            as_segments(message),
            int(time.time()),
            group_id=group_id,
            user_id=user_id,
        )
        self._keep(stored)
        return stored

    # --- people and places -------------------------------------------------------------

    def add_member(
        self, group_id: int, user_id: int, nickname: str = "", card: str = "", role: str = "member"
    ) -> Member:
        member = Member(group_id, user_id, nickname or _default_nickname(user_id), card, role)
        self.members[(group_id, user_id)] = member
        return member

    def add_group(self, group_id: int, name: str) -> None:
        self.group_names[group_id] = name

    # --- what the bot did --------------------------------------------------------------

    async def wait_call(
        self,
        action: str | set[str],
        *,
        timeout: float = 15,
        predicate: Callable[[ApiCall], bool] | None = None,
        after: int = 0,
    ) -> ApiCall:
        """The first call (index >= `after`) to `action` that satisfies `predicate`, waiting for it."""
        actions = {action} if isinstance(action, str) else set(action)

        def match(index: int, call: ApiCall) -> bool:
            return index >= after and call.action in actions and (predicate is None or predicate(call))

        for index, call in enumerate(self.calls):
            if match(index, call):
                return call
        waiter = _Waiter(match)
        self._waiters.append(waiter)
        try:
            return await asyncio.wait_for(waiter.future, timeout)
        except TimeoutError:
            seen = ", ".join(c.action for c in self.calls[after:]) or "none"
            raise TimeoutError(
                f"no {sorted(actions)} call within {timeout}s; calls since {after}: {seen}"
            ) from None
        finally:
            self._waiters.remove(waiter)

    def _wake(self, index: int, call: ApiCall) -> None:
        for waiter in self._waiters:
            if not waiter.future.done() and waiter.match(index, call):
                waiter.future.set_result(call)

    def sent_texts(self) -> list[str]:
        """Plain text of every message the bot sent so far (forwards as one text), in order."""
        texts: list[str] = []
        for call in self.calls:
            if call.action in SEND_ACTIONS:
                texts.append(plain_text(_message_param(call.params)))
            elif call.action in FORWARD_ACTIONS:
                texts.append(plain_text(call.params.get("messages") or call.params.get("message") or []))
        return texts

    # --- default responders ------------------------------------------------------------

    def _self_sender(self) -> dict[str, Any]:
        return {"user_id": self.self_id, "nickname": self.nickname, "card": "", "role": "member"}

    def _send_msg(self, params: dict[str, Any]) -> dict[str, Any]:
        message_type = params.get("message_type") or ("group" if "group_id" in params else "private")
        stored = self._store(
            message_type,
            self._self_sender(),
            _message_param(params),
            None,
            group_id=_opt_int(params.get("group_id")),
            user_id=_opt_int(params.get("user_id")),
        )
        return {"message_id": stored.message_id}

    def _send_forward(self, params: dict[str, Any]) -> dict[str, Any]:
        message_type = params.get("message_type") or ("group" if "group_id" in params else "private")
        nodes = as_segments(params.get("messages") or params.get("message") or [])
        if not nodes or any(seg.get("type") != "node" for seg in nodes):
            raise ActionFailedError(RETCODE_BAD_PARAMS, "messages must be a non-empty list of node segments")
        stored = self._store(
            message_type,
            self._self_sender(),
            [{"type": "forward", "data": {"id": f"fwd-{len(self.messages)}"}}],
            None,
            group_id=_opt_int(params.get("group_id")),
            user_id=_opt_int(params.get("user_id")),
        )
        return {"message_id": stored.message_id, "forward_id": stored.message[0]["data"]["id"]}

    def forget(self, message_id: int) -> None:
        """`get_msg` no longer finds the message, as NapCat answers once its cache let it go
        (NapNeko/NapCatQQ issue #1777: 「消息不存在或已被撤回」); the history still has it."""
        self.forgotten.add(message_id)

    def _get_msg(self, params: dict[str, Any]) -> dict[str, Any]:
        message_id = int(params.get("message_id", 0))
        stored = None if message_id in self.forgotten else self.messages.get(message_id)
        if stored is None:
            raise ActionFailedError(RETCODE_BAD_PARAMS, "message not found")
        data: dict[str, Any] = {
            "time": stored.time,
            "message_type": stored.message_type,
            "message_id": stored.message_id,
            "real_id": stored.message_id,
            "sender": stored.sender,
            "message": stored.message,
        }
        if stored.group_id is not None:
            data["group_id"] = stored.group_id
        return data

    # The history actions as NapCat answers them (NapNeko/NapCatQQ
    # src/onebot/action/go-cqhttp/GetGroupMsgHistory.ts, GetFriendMsgHistory.ts): `count`
    # (default 20) of the latest messages, or of those up to `message_seq` when given;
    # `{"messages": [...]}`, each message as its event, oldest first, the bot's own messages
    # included, as `parseMessage` makes them (packages/napcat-onebot/api/msg.ts
    # `initializeMessage`): `post_type: "message_sent"`, and no `target_id` in a private chat.
    # NapCat reverses the list whatever `reverseOrder` says, so `reverse_history` answers
    # newest first. `history_like` answers as another implementation does (below).
    reverse_history: bool = False

    def _history(
        self,
        kind: str,
        place: int,
        count: int,
        anchor: Any = None,
        *,
        newest_first: bool = False,
        post_type: bool = True,
        own_sent: bool = True,
    ) -> dict[str, Any]:
        ids = self._places.get((kind, place), [])
        if anchor:
            ids = [mid for mid in ids if mid <= int(anchor)]
        items = []
        for m in (self.messages[mid] for mid in ids[-count:]):
            extra = {"group_id": m.group_id, "anonymous": None} if kind == "group" else {}
            item = self._event_of(m, sub_type="normal" if kind == "group" else "friend", extra=extra)
            if own_sent and item["user_id"] == self.self_id:
                item.update(post_type="message_sent", message_sent_type="self")
            if not post_type:
                del item["post_type"]
            items.append({**item, "message_seq": m.message_id, "real_id": m.message_id})
        return {"messages": items[::-1] if newest_first else items}

    def _get_group_msg_history(self, params: dict[str, Any]) -> dict[str, Any]:
        count, anchor = int(params.get("count") or 20), params.get("message_seq")
        return self._history(
            "group", int(params["group_id"]), count, anchor, newest_first=self.reverse_history
        )

    def _get_friend_msg_history(self, params: dict[str, Any]) -> dict[str, Any]:
        count, anchor = int(params.get("count") or 20), params.get("message_seq")
        return self._history(
            "private", int(params["user_id"]), count, anchor, newest_first=self.reverse_history
        )

    def history_like(self, implementation: str) -> None:
        """Answer the history actions with the parameters and limits of `implementation`:
        "napcat" (the default above), "llonebot", "lagrange" or "gocq"."""
        group, friend = _HISTORY_DIALECTS[implementation]
        for action, answer in (("get_group_msg_history", group), ("get_friend_msg_history", friend)):
            if answer is None:
                self.responders.pop(action, None)  # answered with retcode 1404, unknown action
            else:
                self.responders[action] = partial(answer, self)

    def _member_info(self, m: Member) -> dict[str, Any]:
        return {
            "group_id": m.group_id,
            "user_id": m.user_id,
            "nickname": m.nickname,
            "card": m.card,
            "sex": "unknown",
            "age": 0,
            "area": "",
            "join_time": 0,
            "last_sent_time": 0,
            "level": "1",
            "role": m.role,
            "unfriendly": False,
            "title": "",
            "title_expire_time": 0,
            "card_changeable": True,
        }

    def _get_group_member_info(self, params: dict[str, Any]) -> dict[str, Any]:
        member = self.members.get((int(params["group_id"]), int(params["user_id"])))
        if member is None:
            raise ActionFailedError(RETCODE_BAD_PARAMS, "not a member of the group")
        return self._member_info(member)

    def _get_group_member_list(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        gid = int(params["group_id"])
        return [self._member_info(m) for (g, _), m in self.members.items() if g == gid]

    def _get_stranger_info(self, params: dict[str, Any]) -> dict[str, Any]:
        uid = int(params["user_id"])
        known = next((m.nickname for (_, u), m in self.members.items() if u == uid), "")
        return {"user_id": uid, "nickname": known or _default_nickname(uid), "sex": "unknown", "age": 0}

    def _get_group_info(self, params: dict[str, Any]) -> dict[str, Any]:
        gid = int(params["group_id"])
        return {
            "group_id": gid,
            "group_name": self.group_names.get(gid, f"群{gid}"),
            "member_count": sum(1 for g, _ in self.members if g == gid),
            "max_member_count": 500,
        }


def _failed(retcode: int, message: str) -> dict[str, Any]:
    return {"status": "failed", "retcode": retcode, "data": None, "message": message, "wording": message}


def _message_param(params: Mapping[str, Any]) -> list[Segment]:
    return as_segments(params.get("message", ""), auto_escape=bool(params.get("auto_escape", False)))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _default_nickname(user_id: int) -> str:
    return f"用户{user_id}"


# ---- the history actions of the other implementations ------------------------------------
# LLOneBot (LLOneBot/LLOneBot src/onebot11/action/go-cqhttp/GetGroupMsgHistory.ts,
# src/onebot11/action/llonebot/GetFriendMsgHistory.ts): `group_id` / `user_id`, the anchor
# `message_seq` (the friend action also takes `message_id`), absent or "0" = the latest,
# `count` (default 20), `reverseOrder` (default false: oldest first); no message at all
# fails with 「未找到消息」. The account's own messages are `message_sent` as in NapCat
# (src/onebot11/entities.ts).
def _llonebot_history(sim: OneBotSim, params: dict[str, Any], *, kind: str) -> dict[str, Any]:
    place = int(params["group_id"] if kind == "group" else params["user_id"])
    anchor = (
        params.get("message_seq") if kind == "group" else params.get("message_seq", params.get("message_id"))
    )
    found = sim._history(
        kind, place, int(params.get("count") or 20), anchor, newest_first=bool(params.get("reverseOrder"))
    )
    if not found["messages"]:
        raise ActionFailedError(RETCODE_INTERNAL, "未找到消息")
    return found


# Lagrange.OneBot (LagrangeDev/Lagrange.Core Lagrange.OneBot/Core/Entity/Message/
# OneBotGroupMsgHistory.cs, Core/Operation/Message/GetGroupMessageHistoryOperation.cs,
# GetFriendMessageHistoryOperation.cs): `group_id` / `user_id`, the anchor `message_id`
# (0 = the latest), `count` (default 20) for a group; a friend's history is always the
# last 20 (`GetRoamMessage(chain, 20)`), whatever `count` says. Every message is a
# `post_type: "message"` (OneBotPrivateMsg.cs, OneBotGroupMsg.cs), the account's own too.
def _lagrange_history(sim: OneBotSim, params: dict[str, Any], *, kind: str) -> dict[str, Any]:
    if kind == "group":
        return sim._history(
            kind,
            int(params["group_id"]),
            int(params.get("count") or 20),
            params.get("message_id"),
            own_sent=False,
        )
    return sim._history(kind, int(params["user_id"]), 20, params.get("message_id"), own_sent=False)


# go-cqhttp (Mrs4s/go-cqhttp coolq/api.go CQGetGroupMessageHistory): `group_id` and
# `message_seq` (0 = the group's last), always the 20 messages up to it, no `count`; its
# events carry no `post_type`. It has no get_friend_msg_history.
def _gocq_history(sim: OneBotSim, params: dict[str, Any], *, kind: str) -> dict[str, Any]:
    return sim._history(kind, int(params["group_id"]), 20, params.get("message_seq"), post_type=False)


_HISTORY_DIALECTS: dict[str, tuple[Any, Any]] = {
    "napcat": (OneBotSim._get_group_msg_history, OneBotSim._get_friend_msg_history),
    "llonebot": (partial(_llonebot_history, kind="group"), partial(_llonebot_history, kind="private")),
    "lagrange": (partial(_lagrange_history, kind="group"), partial(_lagrange_history, kind="private")),
    "gocq": (partial(_gocq_history, kind="group"), None),
}
