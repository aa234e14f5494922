"""Audit 12, the owner's commands and `.env`, fuzzed through the real bot: bot.py as a
process, the OneBot simulator over the real reverse WebSocket, the scripted model on real
HTTP and the real SQLite file. Commands as owners type them on phones (full-width spaces
and digits, a sentence's end after the last word, an @ or a reply-quote around them, in a
group or in private, by the superuser, an admin or a member), a seeded random command
driver interleaving them with members' chatter and checking the invariants after each
step, and a table of wrong `.env` values, each of which must stop bot.py with one line
naming the key (or start with the documented default), never a traceback or a secret."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakes.agent import is_chat
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import connected, group_sid, query
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, Segment, plain_text

SUPERUSER = 10001
ADMIN = 20900
MEMBER = 20001
SUMMARY = "【最近在聊什么】\n周末爬山\n【谁有问题没回应】\n无\n【关键原话要点】\n无\n【保留原文】\n无"
ANSWER = "好的，记下了。"


def _answer(body: dict[str, Any]) -> Reply:
    return Reply(ANSWER) if is_chat(body) else Reply(SUMMARY)


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> AsyncIterator[BotProcess]:
    llm.reset()
    llm.on_request(_answer)
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config()]), "LOG_LEVEL": "INFO"}
    async with BotProcess(tmp_path_factory.mktemp("bot"), env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


def _text_of(call_params: dict[str, Any], action: str) -> str:
    if action in FORWARD_ACTIONS:
        return plain_text(call_params.get("messages") or call_params.get("message") or [])
    return plain_text(call_params["message"])


async def said(
    sim: OneBotSim, group: int | None, user: int, message: str | list[Segment], *, quiet: float = 0
) -> list[str]:
    """What the bot sends after one message (in `group`, or in private when None): the
    first answer, then whatever else follows within 0.3 s; with `quiet`, nothing within
    `quiet` s is an empty list."""
    mark = len(sim.calls)
    if group is None:
        await sim.private_message(user, message)
    else:
        await sim.group_message(group, user, message)
    actions = set(SEND_ACTIONS | FORWARD_ACTIONS)
    try:
        first = await sim.wait_call(actions, after=mark, timeout=quiet or 15)
    except TimeoutError:
        if quiet:
            return []
        raise
    got = [_text_of(first.params, first.action)]
    after = sim.calls.index(first) + 1
    while True:
        try:
            call = await sim.wait_call(actions, after=after, timeout=0.3)
        except TimeoutError:
            return got
        got.append(_text_of(call.params, call.action))
        after = sim.calls.index(call) + 1


async def stored(bot: BotProcess, sid: str) -> list[str]:
    sql = "SELECT content FROM messages WHERE session_id = ? ORDER BY id"
    return [str(row[0]) for row in await query(bot.db_path, sql, sid)]


async def settings(bot: BotProcess) -> list[tuple[Any, ...]]:
    return sorted(await query(bot.db_path, "SELECT * FROM settings"))


# ---- commands as typed on a phone ---------------------------------------------------------
@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("/记忆模式 仅记录。", "已将本群模式设为 仅记录。"),
        ("/压缩线 0.5。", "已将本会话的压缩线设为 0.5。"),
        ("/条数线　群　３０。", "已将本群的条数线设为 30。"),
        ("/限额 5000！", "已修改本群每日限额。"),
        ("/用量 ７天。", "本群"),
        ("/摘要。", "本会话还没有摘要。"),
        ("/记忆帮助。", "/压缩  立即压缩本会话"),
        ("/清除 摘要。", "已清除本会话的摘要，上下文保留。"),
    ],
)
async def test_a_command_ending_with_a_full_stop_does_what_it_says(
    bot: BotProcess, sim: OneBotSim, typed: str, expected: str
) -> None:
    """A phone's input method ends the line with 「。」: the owner's command still works.
    Before: 「/压缩线 0.5。」 was refused with 「须在 0 到 1 之间」 (0.5 is), 「/记忆模式 关。」
    and 「/摘要。」 answered with their usage line."""
    group = 71000 + zlib.crc32(typed.encode()) % 900
    got = await said(sim, group, SUPERUSER, typed)
    assert len(got) == 1, got
    assert got[0].startswith(expected), got
    assert await stored(bot, group_sid(group)) == []  # a command is never recorded
