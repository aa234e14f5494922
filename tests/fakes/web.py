"""What the web page's tests share: a private runtime on a real SQLite file and a scripted
model server, the page's app mounted at /memsum on a real uvicorn server on 127.0.0.1,
and a group whose memory holds a summary, a compression, usage and a member's HTML."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from nonebot_plugin_memsum import clock, onebot, runtime
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message
from nonebot_plugin_memsum.web.app import Names, create_app
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.ports import free_port

TOKEN = "web-test-token-0123456789abcdef"
SELF_ID = 10000
GROUP = onebot.group_record(SELF_ID, 123456)
PRIVATE = onebot.private_record(SELF_ID, 20002)
GROUP_NAME = "爬山小队<b>粗体</b>"
HTML = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
"""A member's message that would run if the page ever put chat text in as HTML."""
SUMMARY = (
    "【保留原文】3\n## 最近在聊什么\n### 爬山\n周末去爬山，" + HTML + "\n## 谁有问题没回应\n无\n"
    "## 关键原话要点\n集合时间周六八点，#3 说的"
)
"""Written as the summary prompt asks (R-TPL-4): the keep line first, then the chat
template's sections as Markdown second-level headings, a topic as a sub-heading."""
WINDOW = 8000
T0 = time.time() - 3 * 3600
"""The seeded conversation starts three hours ago."""
COMPRESS_AT = 0.08
LINE = int(COMPRESS_AT * 8000)
"""The line 640 tokens: above every usage of the seeded talk, so only the manual
compressions of the seed run, and close enough that the chart shows the saw-tooth."""
COMPRESSIONS = 3
CHAT_TURNS = 4 * COMPRESSIONS + 1
NAMES = {GROUP.place or "": GROUP_NAME, "private:20002": "小明"}


def summary_reply(body: dict[str, Any]) -> Reply | None:
    """The summary model answers with SUMMARY; the chat model falls through to the default."""
    return Reply(SUMMARY) if body.get("model") == "summary" else None


@dataclass
class WebEnv:
    rt: Runtime
    llm: ScriptedLLM
    base: str
    """The page's address, ending in /memsum."""
    app: FastAPI


@asynccontextmanager
async def serving(app: FastAPI, port: int | None = None) -> AsyncIterator[str]:
    """`app` on a real uvicorn server on 127.0.0.1 (on `port`, or a free one), in this event
    loop; its base URL."""
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def say(rt: Runtime, text: str, n: int, ts: float) -> None:
    await rt.agent.record(GROUP, Message(role="user", content=f"[成员{n}(3{n:04d})] {text}", ts=ts))


async def chat_turn(rt: Runtime, text: str, n: int, ts: float) -> str:
    """A member's line and the bot's turn on it (a call to the chat model, in the ledger)."""
    await say(rt, text, n, ts)
    replies: list[str] = []

    async def send(reply: str) -> None:
        replies.append(reply)

    return await rt.agent.run_turn(GROUP.id, send, onebot.entry_of(GROUP))


async def settle(rt: Runtime) -> None:
    """Wait for the background compressions that turn ends started."""
    while tasks := set(rt.compression._background):
        await asyncio.gather(*tasks, return_exceptions=True)


async def seeded_runtime(tmp: Path, llm: ScriptedLLM) -> Runtime:
    """A group that talked for three hours and was compressed three times (usage rising
    towards the line and falling after each compression), then talked on with a member's
    HTML; and a private chat of two lines. Times are virtual: the clock steps through
    those hours, so the chart has its saw-tooth."""
    llm.on_request(summary_reply)
    cfg = Config.model_validate(
        {
            "memsum_models": [
                llm.model_config(
                    "test/chat",
                    model="chat",
                    context_window=WINDOW,
                    priority=1,
                    price_in=2,
                    price_out=8,
                    currency="元",
                ),
                llm.model_config("test/summary", model="summary", context_window=WINDOW),
            ],
            "memsum_summary_model": "test/summary",
            "memsum_compress_at": COMPRESS_AT,
            "memsum_web_token": TOKEN,
        }
    )
    rt = await runtime.build(cfg, tmp / "web.db", ["小记"], {"10001"})
    now = [T0]
    real_now, clock.now = clock.now, lambda: now[0]
    try:
        n = 0
        for _ in range(COMPRESSIONS):
            for _ in range(4):
                for _ in range(3):
                    n += 1
                    now[0] += 60
                    await say(rt, f"第{n}句：周末去爬山吗，带上水和干粮，顺便拍照", n, now[0])
                now[0] += 60
                await chat_turn(rt, f"小记，第{n}个问题：周末天气怎么样", n, now[0])
            now[0] += 60
            await rt.compression.compress(GROUP.id)
        now[0] += 60
        await say(rt, HTML, 7, now[0])
        now[0] += 60
        await chat_turn(rt, "小记，集合时间是几点", 2, now[0])
        now[0] += 60
        await rt.agent.record(PRIVATE, Message(role="user", content="[小明(20002)] 你好", ts=now[0]))
        await rt.agent.record(PRIVATE, Message(role="assistant", content="你好呀", ts=now[0] + 1))
    finally:
        clock.now = real_now
    return rt


@asynccontextmanager
async def mounted(rt: Runtime, names: Names, port: int | None = None) -> AsyncIterator[tuple[str, FastAPI]]:
    """The page of `rt` at /memsum on a real server (`serving`): its address (ending in
    /memsum) and its app; on the way out, the compressions it started have ended."""
    app = create_app(lambda: rt, TOKEN, names)
    root = FastAPI()
    root.mount("/memsum", app)
    try:
        async with serving(root, port) as base:
            yield base + "/memsum", app
    finally:
        await app.state.live.wait()


@asynccontextmanager
async def web_env(tmp: Path) -> AsyncIterator[WebEnv]:
    with ScriptedLLM() as llm:
        rt = await seeded_runtime(tmp, llm)

        async def names() -> dict[str, str]:
            return NAMES

        try:
            async with mounted(rt, names) as (base, app):
                yield WebEnv(rt, llm, base, app)
        finally:
            await settle(rt)
            await runtime.close(rt)
