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
from tests.fakes.e2e import connected, group_sid, query, until
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


async def test_a_members_line_that_merely_starts_like_a_command_is_recorded(
    bot: BotProcess, sim: OneBotSim
) -> None:
    """「/压缩包怎么解压」 is a member asking about a zip file, not /压缩: it is recorded like
    any line (before: NoneBot's command parser read it as /压缩, so the line was dropped as
    someone else's command and never reached the memory). The owner's glued line is chat
    too, not 「用法：/压缩（不带参数）」. A real command of ours by a member stays unrecorded
    (README: 其他人发的命令本插件完全不处理)."""
    group = 72001
    sid = group_sid(group)
    assert await said(sim, group, MEMBER, "/压缩包怎么解压", quiet=0.8) == []
    assert await said(sim, group, MEMBER, "/摘要 帮我看看", quiet=0.8) == []  # ours: not recorded
    assert await said(sim, group, MEMBER, "/ 斜杠开头的话", quiet=0.8) == []
    assert await said(sim, group, SUPERUSER, "/回忆录那本书不错", quiet=0.8) == []

    async def three() -> bool:
        return len(await stored(bot, sid)) >= 3

    await until(three, "the three chat lines stored")
    assert await stored(bot, sid) == [
        f"[用户{MEMBER}({MEMBER})] /压缩包怎么解压",
        f"[用户{MEMBER}({MEMBER})] / 斜杠开头的话",
        f"[用户{SUPERUSER}({SUPERUSER})] /回忆录那本书不错",
    ]
    # The command itself, glued to nothing or to a sentence's end, is still the command.
    assert (await said(sim, group, SUPERUSER, "/压缩线"))[0].startswith("压缩线 0.8（全局配置）")


@pytest.mark.parametrize(
    ("rest", "goes_on"),
    [
        ("", False),
        (" 今天", False),
        ("\u3000群 30", False),
        ("。", False),
        ("！？", False),
        ("包怎么解压", True),
    ],
)
def test_what_follows_a_command_name_decides_whether_it_is_the_command(rest: str, goes_on: bool) -> None:
    """The same rule for a live message (commands.py) and a fetched one (the backfill skips
    commands, recovery.is_command): 「/压缩包…」 is stored after a restart too."""
    from nonebot_plugin_memsum.onebot.render import word_goes_on

    assert word_goes_on(rest) is goes_on
