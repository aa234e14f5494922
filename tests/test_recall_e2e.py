"""Recall end to end (issue 11): bot.py as a subprocess, the OneBot simulator over the real
reverse WebSocket, and a scripted OpenAI-compatible model on real HTTP.

A group talks, a link with its extraction code among the talk; `/压缩` archives it and the
summary (as the scripted summariser writes it) drops the code; a member asks the bot for
the code; the model calls `recall`; the tool result the model is given holds the code.
Then `/回忆` shows the same line to a superuser, and a second group never sees it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, query, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, at, plain_text, text

SUPERUSER = 10001
GROUP, OTHER_GROUP = 881, 882
CODE = "x7k9"
LINK = "https://pan.baidu.com/s/1AbCdEfG"
SUMMARY = (
    "## 最近在聊什么\n阿强(20002) 把期末复习资料传到了网盘，大家在约周末自习。\n"
    "## 谁有问题没回应\n无\n## 关键原话要点\n无"
)
TALK = [
    (20001, "小明", "期末复习资料谁有啊"),
    (20002, "阿强", f"我传网盘了，链接 {LINK} 提取码：{CODE}"),
    (20003, "莉莉", "谢谢强哥！"),
    (20001, "小明", "周末一起去图书馆自习吧"),
    (20003, "莉莉", "好呀，周六上午九点"),
]


def is_summary(body: dict[str, Any]) -> bool:
    return str(body["messages"][0].get("content") or "").startswith("你是对话摘要员")


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def model(body: dict[str, Any]) -> Reply:
    """The summariser drops the code; the chat model looks it up, then answers from what it got."""
    if is_summary(body):
        return Reply("【保留原文】无\n" + SUMMARY)
    results = tool_results(body)
    if not results:
        call = {"id": "call_recall_1", "name": "recall", "arguments": json.dumps({"query": "提取码"})}
        return Reply("", tool_calls=[call], finish_reason="tool_calls")
    found = CODE if CODE in results[-1] else "没找到"
    return Reply(f"提取码是 {found}")


@pytest.fixture(scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[BotProcess, OneBotSim, ScriptedLLM]]:
    with ScriptedLLM() as llm:
        llm.on_request(model)
        models = json.dumps([llm.model_config()])
        async with running_bot(tmp_path_factory.mktemp("recall"), {"MEMSUM_MODELS": models}) as (bot, sim):
            yield bot, sim, llm


async def answer_to(sim: OneBotSim, after: int) -> str:
    call = await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=after, timeout=30)
    params = call.params
    return plain_text(params.get("messages") or params.get("message") or [])


async def test_recall_finds_a_code_the_summary_dropped(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    bot, sim, llm = env
    sid = group_sid(GROUP)
    for qq, name, words in TALK:
        await sim.group_message(GROUP, qq, words, nickname=name)
    await sim.group_message(OTHER_GROUP, 20009, "别的群：我的提取码是 zz99", nickname="路人")

    async def stored() -> bool:
        return len(await query(bot.db_path, "SELECT id FROM messages WHERE session_id = ?", sid)) == len(TALK)

    await until(stored, "the talk stored")

    mark = len(sim.calls)
    await sim.group_message(GROUP, SUPERUSER, "/压缩", nickname="群主")
    assert (await answer_to(sim, mark)).startswith("压缩完成")
    # The code's message is archived, and the summary does not hold the code.
    [(archived,)] = await query(
        bot.db_path, "SELECT archived FROM messages WHERE content LIKE ?", f"%{CODE}%"
    )
    assert archived == 1
    [(summary,)] = await query(
        bot.db_path, "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", sid
    )
    assert CODE not in summary
    assert "复习资料" in summary

    mark, asked = len(sim.calls), len(llm.requests)
    await sim.group_message(
        GROUP, 20001, [at(SELF_ID), text(" 上次那个网盘的提取码是多少来着")], nickname="小明"
    )
    assert await answer_to(sim, mark) == f"提取码是 {CODE}"

    chat = [b for b in llm.requests[asked:] if not is_summary(b)]
    assert len(chat) == 2  # the call, then the answer given the tool's result
    assert any(t["function"]["name"] == "recall" for t in chat[0]["tools"])
    assert "recall" in str(chat[0]["messages"][0]["content"])  # the persona says it can look up
    [result] = tool_results(chat[1])
    assert CODE in result
    assert f"[阿强(20002)] 我传网盘了，链接 {LINK} 提取码：{CODE}" in result
    assert "zz99" not in result  # another group's code is never seen

    # The call and its result are stored as a tool group like any other (R-RUN-2).
    rows = await query(
        bot.db_path,
        "SELECT role, tool_calls, tool_call_id FROM messages WHERE session_id = ? ORDER BY id",
        sid,
    )
    roles = [r[0] for r in rows]
    assert roles[-3:] == ["assistant", "tool", "assistant"]
    assert json.loads(rows[-3][1])[0]["id"] == rows[-2][2] == "call_recall_1"

    mark = len(sim.calls)
    await sim.group_message(GROUP, SUPERUSER, "/回忆 提取码", nickname="群主")
    shown = (await answer_to(sim, mark)).splitlines()
    # The question and the bot's answer hold the word too; the message with the link first.
    assert shown[0] == "找到 3 条（按相关程度排列）："
    assert shown[1].endswith(f"[阿强(20002)] 我传网盘了，链接 {LINK} 提取码：{CODE}")
    assert shown[3].endswith(f"[助手] 提取码是 {CODE}")

    mark = len(sim.calls)
    await sim.group_message(OTHER_GROUP, SUPERUSER, f"/回忆 {CODE}", nickname="群主")
    assert await answer_to(sim, mark) == "没有找到相关的聊天记录。"
