"""A scripted OpenAI-compatible chat server: real HTTP on 127.0.0.1, in a background thread.

Tests script what the "model" answers (`push`, `default`, `on_request`, `gate`) and read back
every request it got (`requests`). A subprocess bot reaches it like any API:

    with ScriptedLLM() as llm:
        llm.push(Reply("你好"), Reply(status=429, headers={"Retry-After": "1"}))
        env = {"MEMSUM_MODELS": json.dumps([llm.model_config()])}

Streams are SSE in HTTP/1.1 chunked encoding, one chunk per event, so `cut_after` drops
the connection mid-body exactly as a failing API would. Connections are kept alive, as a
real API keeps them (`keep_alive=False`: each response closes its connection), and
`connections` counts the TCP connections accepted.

A provider's recorded reply is replayed byte for byte with `Reply(raw=transcript(name))`:
the files under tests/fixtures/providers/ start with `#` lines that cite where the
transcript comes from; the bytes after them are the body.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, Self

API_KEY = "sk-scripted-test-key-5f0c2a9d"
"""The key `model_config` configures; tests look for it where it must not appear."""

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "providers"


def transcript(name: str) -> bytes:
    """The body recorded in tests/fixtures/providers/`name`, without its leading `#` citation lines."""
    data = (FIXTURES / name).read_bytes()
    while data.startswith(b"#"):
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return data


@dataclass
class Reply:
    """What the server answers to one request."""

    content: str = "好的"
    tool_calls: list[dict[str, str]] | None = None
    """[{"id", "name", "arguments"}]"""
    finish_reason: str | None = "stop"
    """None: a stream sends no finish reason at all."""
    usage: dict[str, Any] | Literal["auto"] | None = "auto"
    """The default "auto": a plausible count (prompt ≈ message characters / 2 + 4 per message,
    completion ≈ output characters / 2 + 1); a dict: sent as given; None: omitted.
    Streams carry it in a last chunk only when the request asks (`include_usage`)."""
    status: int = 200
    """Non-200: an OpenAI-style error body `{"error": {"message": error, ...}}`."""
    error: str = "scripted error"
    delay: float = 0.0
    """Seconds before the response starts (a slow model)."""
    chunk_delay: float = 0.0
    """Seconds between stream events (a slow stream)."""
    cut_after: int | None = None
    """Stream: drop the connection after this many content chunks (with `raw`: SSE events),
    no terminating chunk. Plain JSON: drop it after sending half of the body."""
    done: bool = True
    """Stream: end with `data: [DONE]` (False: end the body cleanly without it)."""
    chunk_chars: int = 4
    """Characters of content (and of tool arguments) per stream event."""
    reasoning: str = ""
    """Sent as `reasoning_content`, as DeepSeek does."""
    raw: str | bytes | None = None
    """Sent verbatim as the body instead of a completion (a recorded transcript, a broken API);
    with `status`, as the error body. A streamed request gets it in chunked encoding, one HTTP
    chunk per SSE event."""
    headers: dict[str, str] = field(default_factory=dict)
    raw_chunk_bytes: int | None = None
    """With `raw`, streamed: HTTP chunks of this many bytes instead of one per SSE event (a
    network that splits lines, CRLFs and UTF-8 characters anywhere)."""
    raw_segments: list[tuple[float, bytes]] | None = None
    """With `raw`, streamed: these HTTP chunks instead, each as (seconds to wait before it, its
    bytes); they must add up to `raw` (a seeded random segmentation, tests/test_audit12_sse.py).
    With `cut_after` (any value): the connection is dropped after the last one, no end of body."""


Responder = Callable[[dict[str, Any]], Reply | None]


class Gate:
    """A model that is still thinking: holds the requests `holds` picks until `open()`, then
    answers `reply` (None: the next responder, the queue or the default answers).

    `with gate:` opens it on the way out, so a failing test never leaves a request hanging;
    the wait is bounded all the same, for a test that forgets.
    """

    def __init__(
        self,
        reply: Reply | Callable[[dict[str, Any]], Reply] | None = None,
        *,
        holds: Callable[[dict[str, Any]], bool] = lambda _: True,
    ) -> None:
        self.reply = reply
        self.holds = holds
        self.arrived = threading.Event()
        self._open = threading.Event()

    def __call__(self, body: dict[str, Any]) -> Reply | None:
        if not self.holds(body):
            return None
        self.arrived.set()
        self._open.wait(30)
        return self.reply if self.reply is None or isinstance(self.reply, Reply) else self.reply(body)

    async def reached(self) -> None:
        """Wait until a held request arrived."""
        if not await asyncio.to_thread(self.arrived.wait, 10):
            raise AssertionError("the gated request never arrived")

    def open(self) -> None:
        self._open.set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()


class ScriptedLLM:
    """The server. `start()` (or `with`) binds a free port on 127.0.0.1; `stop()` closes it."""

    def __init__(self, *, keep_alive: bool = True) -> None:
        self.keep_alive = keep_alive
        self.connections = 0
        """TCP connections accepted so far."""
        self.default = Reply()
        self.requests: list[dict[str, Any]] = []
        """Every request body (parsed JSON), in arrival order."""
        self.request_headers: list[dict[str, str]] = []
        """The headers of each request (names lower-cased), same order as `requests`."""
        self.request_paths: list[str] = []
        """The path of each request with its query string, same order as `requests`."""
        self._queue: deque[Reply] = deque()
        self._responders: list[Responder] = []
        self._cond = threading.Condition()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("ScriptedLLM is not started")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> Self:
        handler = type("_BoundHandler", (_Handler,), {"llm": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        # A short poll interval keeps stop() quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="scripted-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def push(self, *replies: Reply) -> None:
        """Queue replies, answered in order; when the queue is empty `default` answers."""
        with self._cond:
            self._queue.extend(replies)

    def on_request(self, fn: Responder) -> None:
        """Add a responder tried (in the order added) before the queue; None falls through."""
        with self._cond:
            self._responders.append(fn)

    def gate(
        self,
        reply: Reply | Callable[[dict[str, Any]], Reply] | None = None,
        *,
        holds: Callable[[dict[str, Any]], bool] = lambda _: True,
    ) -> Gate:
        """A `Gate` added as a responder (after those already there)."""
        gate = Gate(reply, holds=holds)
        self.on_request(gate)
        return gate

    def reset(self) -> None:
        """Forget requests, queued replies and responders; `default` back to `Reply()`."""
        with self._cond:
            self.connections = 0
            self.requests.clear()
            self.request_headers.clear()
            self.request_paths.clear()
            self._queue.clear()
            self._responders.clear()
            self.default = Reply()

    def wait_requests(self, n: int, timeout: float = 10) -> list[dict[str, Any]]:
        """Block until at least `n` requests arrived; all of them so far."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.requests) >= n, timeout):
                raise TimeoutError(f"{len(self.requests)} of {n} requests arrived in {timeout} s")
            return list(self.requests)

    async def wait_requests_async(self, n: int, within: float = 10) -> list[dict[str, Any]]:
        """`wait_requests` without blocking the event loop."""
        return await asyncio.to_thread(self.wait_requests, n, within)

    def model_config(self, id: str = "test/model", **kw: Any) -> dict[str, Any]:
        """One `MEMSUM_MODELS` entry pointing here; `kw` overrides or adds fields."""
        return {"id": id, "base_url": self.base_url, "api_key": API_KEY, "context_window": 32000, **kw}

    def _accepted(self) -> None:
        with self._cond:
            self.connections += 1

    def _take(self, body: dict[str, Any], headers: dict[str, str], path: str = "") -> Reply:
        with self._cond:
            self.requests.append(body)
            self.request_headers.append(headers)
            self.request_paths.append(path)
            self._cond.notify_all()
            responders = list(self._responders)
        for fn in responders:
            reply = fn(body)
            if reply is not None:
                return reply
        with self._cond:
            return self._queue.popleft() if self._queue else self.default


class _Handler(BaseHTTPRequestHandler):
    llm: ScriptedLLM
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as real API servers set it: on a kept-alive connection Nagle's algorithm
    # would hold each small SSE chunk until the previous one is acknowledged (~40 ms each).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.llm._accepted()

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.close_connection = not self.llm.keep_alive
        if not self.path.partition("?")[0].rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return
        reply = self.llm._take(body, {k.lower(): v for k, v in self.headers.items()}, self.path)
        try:
            self._answer(body, reply)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def _answer(self, body: dict[str, Any], reply: Reply) -> None:
        if reply.delay:
            time.sleep(reply.delay)
        if reply.raw is not None:
            raw = reply.raw.encode() if isinstance(reply.raw, str) else reply.raw
            if body.get("stream") and reply.status == 200:
                n = reply.raw_chunk_bytes
                pieces = _split_events(raw) if n is None else [raw[i : i + n] for i in range(0, len(raw), n)]
                if reply.raw_segments is not None:
                    assert b"".join(p for _, p in reply.raw_segments) == raw, "segments must add up to raw"
                    self._stream_segments(reply.raw_segments, reply)
                    return
                self._stream_events(pieces, reply)
            else:
                ctype = "text/event-stream" if body.get("stream") else "application/json"
                self._send(reply.status, raw, ctype, reply.headers)
        elif reply.status != 200:
            error = {"message": reply.error, "type": "scripted", "code": reply.status}
            self._json(reply.status, {"error": error}, reply.headers)
        elif body.get("stream"):
            self._stream(body, reply)
        else:
            data = json.dumps(_completion(body, reply), ensure_ascii=False).encode()
            if reply.cut_after is not None:
                self.close_connection = True
                self._head(200, "application/json", {**reply.headers, "Content-Length": str(len(data))})
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                return
            self._send(200, data, "application/json", reply.headers)

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        events = _events(body, reply)
        self._stream_events((None if e is None else f"data: {e}\n\n".encode() for e in events), reply)

    def _stream_events(self, events: Iterable[bytes | None], reply: Reply) -> None:
        """Each event as one HTTP chunk; None, or `reply.cut_after` events: drop the connection."""
        if reply.cut_after is not None and reply.raw is not None:
            events = [*list(events)[: reply.cut_after], None]
        self._head(200, "text/event-stream", {**reply.headers, "Transfer-Encoding": "chunked"})
        for data in events:
            if data is None:
                self.close_connection = True
                return  # cut: no terminating chunk, the connection just closes
            if reply.chunk_delay:
                time.sleep(reply.chunk_delay)
            self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream_segments(self, segments: list[tuple[float, bytes]], reply: Reply) -> None:
        """Each segment as one HTTP chunk after its wait, then the end of the body."""
        self._head(200, "text/event-stream", {**reply.headers, "Transfer-Encoding": "chunked"})
        for wait, data in segments:
            if wait:
                time.sleep(wait)
            if data:  # an empty chunk would end the body
                self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
        if reply.cut_after is not None:
            self.close_connection = True
            return  # cut: no terminating chunk, the connection just closes
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._send(
            status, json.dumps(payload, ensure_ascii=False).encode(), "application/json", headers or {}
        )

    def _send(self, status: int, data: bytes, ctype: str, headers: dict[str, str]) -> None:
        self._head(status, ctype, {**headers, "Content-Length": str(len(data))})
        self.wfile.write(data)
        self.wfile.flush()

    def _head(self, status: int, ctype: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        if not any(name.lower() == "content-type" for name in headers):  # a reply may name its own
            self.send_header("Content-Type", ctype)
        if self.close_connection:
            self.send_header("Connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()


def _split_events(raw: bytes) -> list[bytes]:
    """A recorded SSE body cut after each blank line (LF or CRLF), nothing added or lost."""
    return re.findall(rb".*?(?:\r\n\r\n|\n\n)|.+", raw, re.DOTALL)


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, Any] | None:
    if reply.usage != "auto":
        return reply.usage
    messages = body.get("messages") or []
    prompt = sum(len(str(m.get("content") or "")) for m in messages) // 2 + 4 * len(messages)
    output = reply.content + reply.reasoning + "".join(c["arguments"] for c in reply.tool_calls or ())
    completion = len(output) // 2 + 1
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def _chunk(body: dict[str, Any], choices: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": choices,
            **extra,
        },
        ensure_ascii=False,
    )


def _events(body: dict[str, Any], reply: Reply) -> Iterator[str | None]:
    """The SSE payloads of one streamed reply; None means: drop the connection here."""

    def delta(d: dict[str, Any], finish: str | None = None) -> str:
        return _chunk(body, [{"index": 0, "delta": d, "finish_reason": finish}])

    yield delta({"role": "assistant", "content": ""})
    for piece in _pieces(reply.reasoning, reply.chunk_chars):
        yield delta({"reasoning_content": piece})
    for n, piece in enumerate(_pieces(reply.content, reply.chunk_chars)):
        if reply.cut_after is not None and n >= reply.cut_after:
            yield None
            return
        yield delta({"content": piece})
    if reply.cut_after is not None and reply.cut_after >= len(_pieces(reply.content, reply.chunk_chars)):
        yield None
        return
    for i, call in enumerate(reply.tool_calls or ()):
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": ""},
        }
        yield delta({"tool_calls": [head]})
        for piece in _pieces(call["arguments"], reply.chunk_chars):
            yield delta({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    if reply.finish_reason is not None:
        yield delta({}, reply.finish_reason)
    usage = _usage(body, reply)
    if usage is not None and (body.get("stream_options") or {}).get("include_usage"):
        yield _chunk(body, [], usage=usage)
    if reply.done:
        yield "[DONE]"


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in reply.tool_calls
        ]
    out: dict[str, Any] = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
    }
    usage = _usage(body, reply)
    if usage is not None:
        out["usage"] = usage
    return out
