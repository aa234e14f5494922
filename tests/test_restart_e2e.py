"""What a session's memory keeps across a restart of bot.py, end to end: the OneBot
simulator over the real reverse WebSocket, a scripted model on real HTTP, the bot's SQLite
file read directly. Also what /清除 上下文 says it does, against what the file then holds."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, query, restart, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, OneBotSim, at, plain_text, text

SUPERUSER = 10001
SUMMARISER = "你是对话摘要员"


def is_summary(body: dict[str, Any]) -> bool:
    return str(body["messages"][0].get("content") or "").startswith(SUMMARISER)


@dataclass
class Env:
    bot: BotProcess
    sim: OneBotSim
    llm: ScriptedLLM

    def summary_requests(self) -> int:
        return sum(is_summary(b) for b in list(self.llm.requests))


@pytest.fixture(scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    with ScriptedLLM() as llm:
        # Every summary fails at once (an empty summary, R-FAIL-1); the chat answers with a
        # reported prompt size, so the line /摘要 shows is the provider's figure.
        def answer(body: dict[str, Any]) -> Reply:
            if is_summary(body):
                return Reply("【保留原文】无")
            return Reply("收到", usage={"prompt_tokens": 1234, "completion_tokens": 2, "total_tokens": 1236})

        llm.on_request(answer)
        models = [llm.model_config("test/chat", context_window=10000)]
        dotenv = {
            "MEMSUM_MODELS": json.dumps(models),
            "MEMSUM_HISTORY_LIMIT": "4",  # every turn below reaches the count line
            "MEMSUM_COMPRESS_AT": "0.5",  # E = min(0.5 × 10 000, 10 000 − 1 024) = 5 000
        }
        async with running_bot(tmp_path_factory.mktemp("bot"), dotenv) as (bot, sim):
            yield Env(bot, sim, llm)


async def said(sim: OneBotSim, after: int, match: str) -> str:
    call = await sim.wait_call(
        set(SEND_ACTIONS),
        after=after,
        predicate=lambda c: match in plain_text(c.params["message"]),
        timeout=20,
    )
    return plain_text(call.params["message"])


async def ask(env: Env, group: int, words: str) -> None:
    """One @-message (one turn), waited for until the bot answers."""
    mark = len(env.sim.calls)
    await env.sim.group_message(group, 20002, [at(SELF_ID), text(f" {words}")], nickname="成员2")
    await said(env.sim, mark, "收到")


async def command(env: Env, group: int, words: str, expect: str) -> str:
    mark = len(env.sim.calls)
    await env.sim.group_message(group, SUPERUSER, words, nickname="主人")
    return await said(env.sim, mark, expect)


async def status_showing(env: Env, group: int, needle: str) -> str:
    """/摘要, asked again until it shows `needle` (a background run ends after the answer)."""
    seen: list[str] = []

    async def shows() -> bool:
        seen.append(await command(env, group, "/摘要", "条数线"))
        return needle in seen[-1] and "正在压缩中" not in seen[-1]

    await until(shows, f"/摘要 to show {needle!r}; last: {seen[-1:]}")
    return seen[-1]


async def test_r_back_3_back_off_and_latest_usage_survive_a_restart(env: Env) -> None:
    group = 33001
    line = "用量 1234 / 压缩线 5000 token（窗口 10000）"
    for i in range(3):
        await env.sim.group_message(group, 20001 + i, f"第{i}句：周末去爬山吗", nickname=f"成员{i + 1}")
    await ask(env, group, "大家怎么看")  # judged: due by count, and the summary fails
    before = await status_showing(env, group, "已连续失败 1 次，再过 2 轮对话才会重试")
    assert line in before
    assert env.summary_requests() == 1

    await restart(env.bot, env.sim)

    after = await command(env, group, "/摘要", "条数线")
    assert line in after  # not 「还没有用量记录」
    assert "已连续失败 1 次，再过 2 轮对话才会重试" in after
    # R-BACK-3: the first judged turn after the restart still waits; the second retries.
    await ask(env, group, "还在吗")
    await status_showing(env, group, "已连续失败 1 次，再过 1 轮对话才会重试")
    assert env.summary_requests() == 1
    await ask(env, group, "再问一次")
    await status_showing(env, group, "已连续失败 2 次，再过 4 轮对话才会重试")
    assert env.summary_requests() == 2


async def test_r_mem_2_clear_context_says_the_messages_stay_archived_and_they_do(env: Env) -> None:
    group = 33002
    sid = group_sid(group)
    for i in range(3):
        await env.sim.group_message(group, 20001 + i, f"第{i}句：下雨怎么办", nickname=f"成员{i + 1}")

    async def stored() -> bool:
        return len(await _rows(env, sid)) >= 3

    await until(stored, "the group's lines stored")
    question = await command(env, group, "/清除", "确认")
    assert "无法恢复" not in question
    assert re.search("存档", question), question
    assert "不会再发给模型" in question
    await command(env, group, "确认", "已清除")
    # What the question said: nothing active any more, the lines kept in the archive.
    assert [(content, archived) for content, archived in await _rows(env, sid)] == [
        (f"[成员{i + 1}({20001 + i})] 第{i}句：下雨怎么办", 1) for i in range(3)
    ]


async def _rows(env: Env, sid: str) -> list[tuple[Any, ...]]:
    sql = "SELECT content, archived FROM messages WHERE session_id = ? ORDER BY id"
    return await query(env.bot.db_path, sql, sid)
