"""Outside audit 12 (rc): nothing said is ever out of reach (issue 11), recall checked by a
seeded random driver.

A seeded driver talks through the library API (`nonebot_plugin_memsum.api`) on a real SQLite
file and on a real PostgreSQL database, with the scripted OpenAI-compatible server and small
count lines so compressions archive often: random Chinese lines from several members whose
group cards change, each now and then carrying a rare token (a name, a QQ-like number, a URL
with an extraction code, a code identifier, emoji around it, mixed 中英文, full-width letters
and digits searched half-width), across compressions (background and manual), clears of the
summary and of the context, session deletion, withdrawals (as the OneBot layer marks them),
child sessions and restarts of the runtime. It keeps a model of what was said and what the
README and issue 11 say must be findable (every stored message of the session, active or
archived) and what must not (R-MEM-2/3: what a context clear or a deletion removed; the README:
what was withdrawn; issue 11: another session's words), and after each step checks that:

- `api.search` finds every findable message holding a token, with its speaker label, time and
  neighbours (the nearest conversation lines of the session either side, never a withdrawn or
  cleared one), and nothing else; results are ordered by score, then newest first;
- the `recall` tool, called by the scripted model in a real turn, hands the model those lines
  (`时间 [昵称(ID)] 正文`, times in MEMSUM_TIMEZONE) and no line of anything unfindable;
- `/回忆` (through nonebug) answers the same lines, headed as documented;
- special queries (%, _, quotes, FTS operators, backslashes, a pasted paragraph, only emoji,
  an empty query) give results or a clear Chinese message, never an error;
- a group never sees the other group's, the private chat's or its child session's words.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from nonebot_plugin_memsum import api, clock, runtime
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.onebot.sessions import group_record
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import Reply, ScriptedLLM

SELF_ID = "10000"
OWNER = "10001"
ZONE = "Asia/Shanghai"
SUMMARISER = "你是对话摘要员"
CHAT_SUMMARY = "## 最近在聊什么\n闲聊\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
WORK_SUMMARY = "## 目标\n无\n## 做过的决定\n无\n## 改过的文件\n无\n## 未完成的事\n无"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=ZoneInfo(ZONE)).timestamp()


# ---- the scripted model and a private runtime -------------------------------------------------
class Model:
    """Summaries keep a random few of the offered units; chat requests take the queued replies
    (a recall tool call, then an answer), else 「好的」. Every tool result the chat model was
    handed is kept, in order."""

    def __init__(self, llm: ScriptedLLM, rng: random.Random) -> None:
        self.rng = rng
        self.chat: deque[Reply] = deque()
        self.tool_results: list[str] = []
        llm.on_request(self.answer)

    def answer(self, body: dict[str, Any]) -> Reply:
        system = str(body["messages"][0]["content"])
        if system.startswith(SUMMARISER):
            offered = re.findall(r"^#(\d+)〔", str(body["messages"][1]["content"]), re.MULTILINE)
            keep = [n for n in offered if self.rng.random() < 0.25]
            summary = CHAT_SUMMARY if "最近在聊什么" in system else WORK_SUMMARY
            return Reply(f"【保留原文】{'、'.join(keep) or '无'}\n{summary}")
        last = body["messages"][-1]
        if last.get("role") == "tool":
            self.tool_results.append(str(last.get("content")))
        return self.chat.popleft() if self.chat else Reply("好的")


@dataclass
class Bot:
    """A private runtime on `location` (what bot.py builds), restartable."""

    location: Path | str
    llm: ScriptedLLM
    model: Model
    rt: Runtime | None = None

    def config(self) -> Config:
        entry = self.llm.model_config("test/chat", context_window=6000, max_output_tokens=1024)
        return Config.model_validate(
            {
                "memsum_models": [entry],
                "memsum_timezone": ZONE,
                "memsum_history_limit": 12,
                "memsum_persona": "你是群里的助手小记。",
            }
        )

    async def start(self) -> Runtime:
        self.rt = await runtime.build(self.config(), self.location, ["小记"], {OWNER})
        runtime._current = self.rt  # the api (and the commands) on this runtime
        return self.rt

    async def stop(self) -> None:
        if self.rt is not None:
            while tasks := set(self.rt.compression._background):
                await asyncio.gather(*tasks, return_exceptions=True)
            await runtime.close(self.rt)
            self.rt = None

    async def restart(self) -> Runtime:
        await self.stop()
        return await self.start()


class Clock:
    """The plugin's clock, moved on by the driver (messages minutes to hours apart)."""

    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def bot(location: Path | str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.setattr(runtime, "_current", runtime._current)  # restored after the test
    fake = Clock()
    monkeypatch.setattr(clock, "now", fake)
    with ScriptedLLM() as llm:
        b = Bot(location, llm, Model(llm, random.Random(0)))
        await b.start()
        try:
            yield b
        finally:
            await b.stop()


def said(name: str, qq: int, body: str, *, pid: str | None = None) -> Message:
    """A member's line as the OneBot layer stores it."""
    return Message(
        role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=clock.now(), platform_id=pid
    )


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M")


async def recall_in_turn(bot: Bot, session: SessionRecord, args: dict[str, Any]) -> str:
    """A real turn in which the scripted model calls `recall` with `args`; the tool result
    it was handed."""
    assert bot.rt is not None
    call = {"id": f"call-{len(bot.model.tool_results)}", "name": "recall", "arguments": json.dumps(args)}
    bot.model.chat.extend([Reply("", tool_calls=[call], finish_reason="tool_calls"), Reply("查到了")])
    before = len(bot.model.tool_results)
    await api.record(session, said("甲", 20001, "帮我查一下之前说的"))
    entry = api.Entry("onebot", session.kind)
    assert await api.run_turn(session.id, entry=entry) == "replied"
    assert len(bot.model.tool_results) == before + 1
    return bot.model.tool_results[-1]


# ---- defects found ----------------------------------------------------------------------------
GROUP = group_record(SELF_ID, 880001)


async def test_a_speaker_whose_card_has_no_letters_filters_the_search(bot: Bot) -> None:
    """QQ cards made only of emoji or punctuation (「🌸」「。」) are common. The speaker filter
    was dropped for such a name (it holds no term to index), so 「what did 🌸 say about 链接」
    answered everyone's lines about 链接, through the tool, /回忆 and api.search alike; and a
    search by that name alone was refused as having no keyword."""
    for name, qq, body in [
        ("🌸", 20011, "链接在这 https://pan.example.cn/s/1Qz 提取码 k2v9"),
        ("小明", 20012, "链接呢？"),
        ("。", 20013, "链接挂了"),
        ("🌸", 20011, "周末见"),
    ]:
        await api.record(GROUP, said(name, qq, body))
    hits = await api.search(GROUP.id, "链接", speaker="🌸")
    assert [h.message.content for h in hits] == [
        "[🌸(20011)] 链接在这 https://pan.example.cn/s/1Qz 提取码 k2v9"
    ]
    assert [h.message.content for h in await api.search(GROUP.id, "链接", speaker="。")] == [
        "[。(20013)] 链接挂了"
    ]
    assert await api.search(GROUP.id, "链接", speaker="🌼") == []  # nobody by that name
    alone = await api.search(GROUP.id, "", speaker="🌸")
    assert [h.message.content for h in alone] == [
        "[🌸(20011)] 周末见",
        "[🌸(20011)] 链接在这 https://pan.example.cn/s/1Qz 提取码 k2v9",
    ]
    result = await recall_in_turn(bot, GROUP, {"query": "链接", "speaker": "🌸"})
    # The hits (→) are 🌸's; the others' lines come only as its neighbours.
    assert [x.split("] ", 1)[0][19:] for x in result.splitlines() if x.startswith("→ ")] == ["[🌸(20011)"]
    assert "链接挂了" not in result  # not next to 🌸's line, and not 🌸's
    result = await recall_in_turn(bot, GROUP, {"query": "", "speaker": "🌸"})
    assert "[🌸(20011)] 周末见" in result
