"""Web page benchmark: the overview (and a session's page, the usage page) against a big file.

    python bench/bench_web.py [--sessions 1000 --messages 1000000]

A database of `sessions` sessions (nine groups in ten, the rest private chats) holding
`messages` messages (most archived, as after many compressions), a ledger of chat and
summary calls and a compression history is filled directly with sqlite3 (not through the
Store API, which would take minutes), then the page's app is served by uvicorn on
127.0.0.1 and read over HTTP with httpx after signing in, as the browser does. Target:
the overview in under a second. Figures depend on the machine; they are printed, not
asserted. Everything goes to a temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nonebot

# Importing the package wires the plugin into NoneBot, which needs a driver.
nonebot.init()

import httpx
from fastapi import FastAPI

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.web.app import create_app
from tests.fakes.web import serving

TOKEN = "bench-web-token-0123456789"
SELF_ID = 10000


def _report(name: str, value: str) -> None:
    print(f"{name:<52} {value}")  # noqa: T201


def _fill(path: Path, sessions: int, messages: int) -> None:
    """Sessions, messages (archived up to each session's last compression), ledger, runs."""
    rng = random.Random(1)
    per = messages // sessions
    now = time.time()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    for s in range(sessions):
        group = s % 10 != 9
        number = 100000 + s
        sid = f"onebot:{SELF_ID}:{'group' if group else 'private'}:{number}"
        conn.execute(
            "INSERT INTO sessions (id, platform, kind, place, peer, room_class, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                sid,
                "onebot",
                "group" if group else "private",
                f"group:{number}" if group else None,
                None if group else str(number),
                "room" if group else "direct",
                now - 86400 * 30,
            ),
        )
        active = rng.randint(20, 200)
        start = now - 86400 * 30
        rows = []
        for i in range(per):
            ts = start + i * (86400 * 30 / per)
            archived = int(i < per - active)
            marker = int(i % 100 == 99)
            role = "system" if marker else ("assistant" if i % 7 == 0 else "user")
            content = "对话已压缩" if marker else f"[成员{i % 50}(2{i % 50:04d})] 第{i}句：周末去爬山吗"
            rows.append((sid, role, content, ts, marker, archived, 20))
        conn.executemany(
            "INSERT INTO messages (session_id, role, content, ts, event_marker, archived, tokens)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.executemany(
            "INSERT INTO ledger (session_id, purpose, model, tokens_in, tokens_out, ts)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    sid,
                    "对话" if i % 5 else "摘要",
                    "bench/chat",
                    rng.randint(1000, 50000),
                    200,
                    start + i * 20000,
                )
                for i in range(100)
            ],
        )
        conn.executemany(
            "INSERT INTO compressions (session_id, ts, outcome, reason, tokens_before, tokens_after, kept,"
            " archived, requests, line) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (sid, start + i * 200000, "done" if i % 4 else "error", None, 50000, 5000, 3, 95, 1, 52000)
                for i in range(10)
            ],
        )
        if s % 20 == 0:
            conn.execute(
                "INSERT INTO settings (scope, scope_key, name, value)"
                " VALUES ('session', ?, 'compress_at', ?)",
                (sid, json.dumps(0.5)),
            )
    conn.execute("COMMIT")
    conn.close()


async def _timed(client: httpx.AsyncClient, path: str, n: int) -> tuple[list[float], int]:
    times: list[float] = []
    size = 0
    for _ in range(n):
        start = time.perf_counter()
        resp = await client.get(path)
        times.append(time.perf_counter() - start)
        resp.raise_for_status()
        size = len(resp.content)
    return times, size


async def main(sessions: int, messages: int, runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="memsum-bench-web-") as tmp:
        path = Path(tmp) / "web.db"
        store = Store(path)
        await store.open()  # the schema
        await store.close()
        start = time.perf_counter()
        await asyncio.to_thread(_fill, path, sessions, messages)
        _report(
            f"fill {sessions:,} sessions, {messages:,} messages",
            f"{time.perf_counter() - start:.1f} s (sqlite3 direct), {path.stat().st_size / 2**20:.0f} MiB",
        )
        model = {"id": "bench/chat", "base_url": "http://127.0.0.1:9/v1", "context_window": 65536}
        config = Config.model_validate({"memsum_models": [model], "memsum_web_token": TOKEN})
        rt = await runtime.build(config, path, [], set())
        app = FastAPI()
        app.mount("/memsum", create_app(lambda: rt, TOKEN))
        try:
            async with serving(app) as base, httpx.AsyncClient(base_url=base + "/memsum/", timeout=60) as c:
                (await c.post("api/login", json={"token": TOKEN})).raise_for_status()
                for name, path_ in (
                    ("overview", "api/overview"),
                    ("a session's page", f"api/sessions/onebot%3A{SELF_ID}%3Agroup%3A100000"),
                    ("usage page, 30 days", "api/usage?days=30"),
                ):
                    first, size = await _timed(c, path_, 1)
                    warm, _ = await _timed(c, path_, runs)
                    median = statistics.median(warm) * 1000
                    _report(
                        f"{name} (HTTP, {size / 1024:,.0f} KiB)",
                        f"first {first[0] * 1000:.0f} ms, then median {median:.0f} ms,"
                        f" max {max(warm) * 1000:.0f} ms (n={runs})",
                    )
                    if name == "overview":
                        verdict = "yes" if max(first + warm) < 1 else "NO"
                        _report("overview under a second (every run)", verdict)
        finally:
            await runtime.close(rt)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="web page benchmark")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.messages, args.runs))
