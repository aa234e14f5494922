"""Audit 20: other bots in the owner's groups (MEMSUM_IGNORED_USERS).

QQ groups often hold several bots. Two that answer an @ or a reply to their own message
answer each other for as long as the models are paid: this bot quotes the message it
answers, and the other bot reads the quote as a reply to itself (as nonebot-adapter-onebot's
own `_check_reply` does), and so on. Owners of other frameworks ask for exactly this switch
(AstrBot's plugin list: astrbot_plugin_ignore_user, 「用户忽视其他机器人发言，以防两个机器人一直
聊天」, AstrBotDevs/AstrBot_Plugins_Collection#924). Accounts of this NoneBot were already
never answered (tests/test_audit8_v.py); a bot run elsewhere is named by its QQ number.

bot.py as a real process, the OneBot simulator over the reverse WebSocket, the scripted
model server over HTTP, the bot's SQLite file read directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, away, back, group_sid, private_sid, query, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, OneBotSim, at, plain_text, reply, text

PERSONA = "你是审计二十群里的助手小记。"
OTHER_BOT = 2854196311  # another group's bot, run by someone else
SECOND_BOT = 3889000000
MEMBER = 20001
OWNER = 10001  # a SUPERUSER of BotProcess


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


@dataclass
class Env:
    bot: BotProcess
    sim: OneBotSim
    llm: ScriptedLLM

    def chats(self) -> int:
        return sum(is_chat(b) for b in list(self.llm.requests))

    def sends(self, after: int = 0) -> list[str]:
        return [
            plain_text(c.params.get("message")) for c in self.sim.calls[after:] if c.action in SEND_ACTIONS
        ]


@pytest.fixture(scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    with ScriptedLLM() as llm:
        llm.on_request(lambda body: Reply("小记在呢。") if is_chat(body) else None)
        dotenv = {
            "MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]),
            "MEMSUM_PERSONA": PERSONA,
            # a number and a string, as JSON allows both
            "MEMSUM_IGNORED_USERS": json.dumps([OTHER_BOT, str(SECOND_BOT)]),
            "MEMSUM_GROUP_ADMIN_COMMANDS": "true",
        }
        async with running_bot(tmp_path_factory.mktemp("ignore"), dotenv) as (bot, sim):
            yield Env(bot, sim, llm)


async def rows(bot: BotProcess, sid: str) -> list[tuple[str, str, int]]:
    sql = "SELECT role, content, addressed FROM messages WHERE session_id = ? ORDER BY id"
    return [(str(r[0]), str(r[1]), int(r[2])) for r in await query(bot.db_path, sql, sid)]


async def stored(env: Env, sid: str, needle: str) -> list[tuple[str, str, int]]:
    found: list[tuple[str, str, int]] = []

    async def there() -> bool:
        found[:] = await rows(env.bot, sid)
        return any(needle in content for _, content, _ in found)

    await until(there, f"{needle!r} stored in {sid}")
    return found


async def test_an_ignored_bot_that_quotes_the_answer_and_ats_the_bot_is_recorded_and_never_answered(
    env: Env,
) -> None:
    group = 91001
    sid = group_sid(group)
    # A member asks; the bot answers, quoting the question.
    start, chats = len(env.sim.calls), env.chats()
    await env.sim.group_message(group, MEMBER, [at(SELF_ID), text(" 周末去哪玩")], nickname="小明")
    await env.sim.wait_call(set(SEND_ACTIONS), after=start)
    assert env.chats() == chats + 1
    # The other bot answers that answer: it quotes it and @s the bot, as bots that answer
    # replies to themselves do. The loop would start here.
    calls = len(env.sim.calls)
    sql = "SELECT platform_id FROM messages WHERE session_id = ? AND role = 'assistant'"
    ids: list[Any] = []

    async def sent() -> bool:  # noted once the implementation answered the send
        ids[:] = [r[0] for r in await query(env.bot.db_path, sql, sid)]
        return ids[:1] != [None] and bool(ids)

    await until(sent, "the answer's message id")
    answer_id = int(ids[0])
    await env.sim.group_message(
        group, OTHER_BOT, [reply(answer_id), at(SELF_ID), text(" 小记你也去吗")], nickname="别的机器人"
    )
    await env.sim.group_message(group, SECOND_BOT, "小记 你怎么看", nickname="第三个机器人")
    found = await stored(env, sid, "你怎么看")
    await asyncio.sleep(1.5)  # room for a turn, had one started
    assert env.chats() == chats + 1
    assert env.sends(calls) == []
    # Who said what is kept: the other bots are members of the group, never questions.
    assert [(c, a) for _, c, a in found if "别的机器人" in c or "第三个机器人" in c] == [
        (f"[别的机器人({OTHER_BOT})] [回复 小记(10000)：小记在呢。] @小记(10000) 小记你也去吗", 0),
        (f"[第三个机器人({SECOND_BOT})] 小记 你怎么看", 0),
    ]
    # The member is still answered.
    await env.sim.group_message(group, MEMBER, [at(SELF_ID), text(" 那你呢")], nickname="小明")
    await until(lambda: _answered(env, calls), "the member's second answer")
    assert env.chats() == chats + 2


async def _answered(env: Env, after: int) -> bool:
    return len(env.sends(after)) == 1


async def test_an_ignored_bot_in_private_is_recorded_and_not_answered(env: Env) -> None:
    calls, chats = len(env.sim.calls), env.chats()
    await env.sim.private_message(OTHER_BOT, "你好，我是别的机器人", nickname="别的机器人")
    found = await stored(env, private_sid(OTHER_BOT), "我是别的机器人")
    await asyncio.sleep(1.5)
    assert [(r, a) for r, _, a in found] == [("user", 0)]
    assert env.chats() == chats
    assert env.sends(calls) == []


async def test_an_ignored_bot_that_is_a_group_admin_runs_no_command(env: Env) -> None:
    """With MEMSUM_GROUP_ADMIN_COMMANDS on, an admin's /摘要 is a command; a bot that is an
    admin says what its model says, which any member can steer: like anyone's command they
    may not use, not ours to handle (README 「在 QQ 里使用」): no answer, not recorded."""
    group = 91002
    start = len(env.sim.calls)
    await env.sim.group_message(group, MEMBER, "/摘要", nickname="小明", role="admin")
    await env.sim.wait_call(set(SEND_ACTIONS), after=start)  # a human admin's command is answered
    calls = len(env.sim.calls)
    await env.sim.group_message(group, OTHER_BOT, "/摘要", nickname="别的机器人", role="admin")
    await env.sim.group_message(group, OTHER_BOT, "好的", nickname="别的机器人", role="admin")
    found = await stored(env, group_sid(group), "好的")
    await asyncio.sleep(1)
    assert env.sends(calls) == []
    assert [c for _, c, _ in found] == [f"[别的机器人({OTHER_BOT})] 好的"]


async def test_an_ignored_bots_question_fetched_after_a_restart_is_not_resumed(env: Env) -> None:
    """While bot.py is down the other bot @s it; the backfill stores that, and the resume
    (MEMSUM_RESUME_WINDOW) answers a member's question said meanwhile, not the bot's."""
    group = 91003
    sid = group_sid(group)
    await env.sim.group_message(group, MEMBER, "早", nickname="小明")
    await stored(env, sid, "早")
    await away(env.bot, env.sim)
    await env.sim.group_message(group, OTHER_BOT, [at(SELF_ID), text(" 在吗")], nickname="别的机器人")
    chats = env.chats()
    calls = len(env.sim.calls)
    await back(env.bot, env.sim)
    found = await stored(env, sid, "在吗")
    await asyncio.sleep(1.5)
    assert [(c, a) for _, c, a in found if "在吗" in c] == [
        (f"[别的机器人({OTHER_BOT})] @小记(10000) 在吗", 0)
    ]
    assert env.chats() == chats
    assert env.sends(calls) == []
    # A member's question said while it was away is resumed as before.
    await away(env.bot, env.sim)
    await env.sim.group_message(group, MEMBER, [at(SELF_ID), text(" 在吗")], nickname="小明")
    await back(env.bot, env.sim)
    await until(lambda: _answered(env, calls), "the member's question resumed")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (["小明"], "'小明' is not a QQ number"),
        ([True], "True is not a QQ number"),
        ("2854196311", "a JSON list of QQ numbers"),
        (["２８５４"], "'２８５４' is not a QQ number"),
        ([-5], "-5 is not a QQ number"),
    ],
)
def test_r_cfg_1_a_wrong_ignored_users_value_is_refused_in_one_line_naming_the_key(
    value: object, says: str
) -> None:
    """As NoneBot's .env reader passes them (JSON-decoded); bot.py stops on the same line
    (tests/test_audit12_cmd.py runs that path). A name or a typo would match no sender, and
    that bot would go on being answered."""
    from nonebot_plugin_memsum.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as info:
        parse_config({"memsum_ignored_users": value})
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith("invalid MEMSUM_IGNORED_USERS:"), line
    assert says in line, line
