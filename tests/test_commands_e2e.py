"""The commands end to end: bot.py as a subprocess, the OneBot simulator, and a scripted
summary model on real HTTP that answers only when the test lets it (a slow model with
no timing in the test)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import connected, group_sid, query, until
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.onebot import OneBotSim, plain_text

SUPERUSER = 10001
SUMMARY = "【最近在聊什么】\n周末爬山\n【谁有问题没回应】\n无\n【关键原话要点】\n无\n【保留原文】\n无"


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> AsyncIterator[BotProcess]:
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config()])}
    async with BotProcess(tmp_path_factory.mktemp("bot"), env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


@pytest.fixture
def slow(llm: ScriptedLLM) -> Iterator[Gate]:
    """Holds every summary request until opened: the model is 'thinking' till then."""
    with llm.gate(Reply(SUMMARY)) as gate:
        yield gate
    llm.reset()


async def active(bot: BotProcess, sid: str) -> list[str]:
    """The session's active history, as stored."""
    sql = "SELECT content FROM messages WHERE session_id = ? AND archived = 0 ORDER BY id"
    return [row[0] for row in await query(bot.db_path, sql, sid)]


async def everything(bot: BotProcess, sid: str) -> list[str]:
    """The session's whole history, archive included."""
    sql = "SELECT content FROM messages WHERE session_id = ? ORDER BY id"
    return [row[0] for row in await query(bot.db_path, sql, sid)]


async def summary(bot: BotProcess, sid: str) -> list[tuple[Any, ...]]:
    return await query(bot.db_path, "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", sid)


async def chat(bot: BotProcess, sim: OneBotSim, group: int, n: int) -> None:
    """n members' lines in the group, waited for until stored."""
    for i in range(n):
        await sim.group_message(group, 20001 + i, f"第 {i} 句：周末去爬山吗")

    async def stored() -> bool:
        return len(await active(bot, group_sid(group))) >= n

    await until(stored, f"the group's {n} messages stored")


async def compressing(bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, group: int, then: str) -> int:
    """Four lines in the group, the owner's /压缩, and once its summary request is with the
    model the owner's command `then`; the call index from before the /压缩."""
    await chat(bot, sim, group, 4)
    mark = len(sim.calls)
    await sim.group_message(group, SUPERUSER, "/压缩")
    await llm.wait_requests_async(1)
    await sim.group_message(group, SUPERUSER, then)
    return mark


async def answers(sim: OneBotSim, after: int, n: int) -> list[str]:
    """The next n texts the bot sent (from call index `after`), in order."""
    texts: list[str] = []
    mark = after
    for _ in range(n):
        call = await sim.wait_call("send_msg", after=mark)
        mark = sim.calls.index(call) + 1
        texts.append(plain_text(call.params["message"]))
    return texts


async def test_r_mem_3_clear_cancels_a_compression_waiting_on_the_model(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, slow: Gate
) -> None:
    group = 30101
    mark = await compressing(bot, sim, llm, group, then="/清除 上下文 确认")
    got = await answers(sim, mark, 2)
    assert sorted(got) == sorted(["压缩失败：压缩期间会话被清空", "已清除本会话的上下文和摘要。"])
    sid = group_sid(group)
    assert await active(bot, sid) == []
    assert await summary(bot, sid) == []
    # No divider either; the four lines are archived, not lost; commands never recorded.
    stored = await everything(bot, sid)
    assert len(stored) == 4
    assert [line for line in stored if "对话已压缩" in line or "/" in line] == []


async def test_r_prog_3_a_second_compress_while_one_runs_is_refused(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, slow: Gate
) -> None:
    group = 30102
    mark = await compressing(bot, sim, llm, group, then="/压缩")
    assert await answers(sim, mark, 1) == ["压缩失败：这个会话正在压缩"]
    slow.open()
    second, first = await answers(sim, mark, 2)
    assert second == "压缩失败：这个会话正在压缩"
    assert first.startswith("压缩完成：")
    assert first.endswith("保留原文 0 条，归档 4 条。")
    assert len(llm.requests) == 1
    sid = group_sid(group)
    assert await active(bot, sid) == ["对话已压缩"]
    assert len(await summary(bot, sid)) == 1
