"""The commands end to end: bot.py as a subprocess, the OneBot simulator, and a scripted
summary model on real HTTP that answers only when the test lets it (a slow model with
no timing in the test); and every command × role × the admin option over OneBot, beside
another plugin with commands of the same names."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.controls import CAP_NOTICE
from tests.fakes.botproc import BotProcess
from tests.fakes.commands import ALLOWED_ANSWER, ROLES, Role, may_use
from tests.fakes.e2e import (
    SELF_ID,
    connected,
    group_sid,
    private_sid,
    query,
    restart,
    running_bot,
    until,
    wait_log,
)
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, ApiCall, OneBotSim, at, plain_text
from tests.fakes.onebot import text as seg

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


# ---- who may use what, through bot.py and the OneBot simulator -------------------------
# Another plugin the bot runs, with commands of the same names as ours, loaded from the
# bot folder's pyproject.toml as `nb plugin install` would list it. It sits between our
# commands (priority 5) and our recording (50) and does not block, so an event it gets
# also reaches our recording matcher, which must leave it alone.
OTHER_PLUGIN = """
from nonebot import on_command
from nonebot.adapters.onebot.v11 import Bot, MessageEvent

for name in {names!r}:
    matcher = on_command(name, priority=10, block=False)

    @matcher.handle()
    async def _(bot: Bot, event: MessageEvent) -> None:
        await bot.send(event, "其他插件收到：" + event.get_plaintext())
"""
PYPROJECT = """[tool.nonebot]
plugin_dirs = ["plugins"]

[tool.nonebot.plugins]
nonebot-plugin-memsum = ["nonebot_plugin_memsum"]
"""


def other_plugin_folder(workdir: Path) -> Path:
    names = sorted({text.split()[0].lstrip("/") for text in ALLOWED_ANSWER})
    (workdir / "plugins").mkdir(parents=True)
    (workdir / "plugins" / "other_plugin.py").write_text(OTHER_PLUGIN.format(names=names), "utf-8")
    (workdir / "pyproject.toml").write_text(PYPROJECT, "utf-8")
    return workdir


@pytest.fixture(scope="module", params=[False, True], ids=["option-off", "option-on"])
async def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[BotProcess, OneBotSim, bool]]:
    """bot.py with the other plugin and MEMSUM_GROUP_ADMIN_COMMANDS off or on; no model."""
    option: bool = request.param
    workdir = other_plugin_folder(tmp_path_factory.mktemp("matrix"))
    env = {"MEMSUM_GROUP_ADMIN_COMMANDS": str(option).lower()}
    async with running_bot(workdir, env=env) as (bot, sim):
        yield bot, sim, option


_cases = itertools.count(810_001)
MEMBERS = {"owner": 20001, "admin": 20002, "member": 20003}


async def say(sim: OneBotSim, role: Role, place: int, text: str) -> tuple[str, str]:
    """`text` from someone of `role` in a group (or, for the private roles, a private chat)
    of its own; the text of the next message the bot sends there, and that chat's session."""
    mark = len(sim.calls)
    if role in ("private peer", "superuser private"):
        user = SUPERUSER if role == "superuser private" else place
        await sim.private_message(user, text)
        sid = private_sid(user)

        def there(call: ApiCall) -> bool:
            return call.params.get("user_id") == user and call.params.get("group_id") is None
    else:
        user = SUPERUSER if role == "superuser" else MEMBERS[role]
        await sim.group_message(place, user, text, role="member" if role == "superuser" else role)
        sid = group_sid(place)

        def there(call: ApiCall) -> bool:
            return call.params.get("group_id") == place

    call = await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), predicate=there, after=mark)
    return plain_text(call.params.get("message") or call.params.get("messages")), sid


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("text", list(ALLOWED_ANSWER))
async def test_every_command_role_and_option_over_onebot(
    matrix: tuple[BotProcess, OneBotSim, bool], role: Role, text: str
) -> None:
    bot, sim, option = matrix
    place = next(_cases)
    answer, sid = await say(sim, role, place, text)
    if may_use(role, text, option):
        expected = ALLOWED_ANSWER[text]
        assert answer == (expected(role) if callable(expected) else expected)
        return
    # Not ours to handle: the other plugin got the message untouched, we said nothing …
    assert answer == f"其他插件收到：{text}"
    # … and recorded nothing of the command: a later line of the same chat is stored after
    # the command was stored or dropped (arrival order), so once it is there the command's
    # fate is known. The other plugin's answer is the bot's own words (audit 8, onebot/said.py).
    if role == "private peer":
        await sim.private_message(place, "收尾")
    else:
        await sim.group_message(place, MEMBERS[role], "收尾")

    async def stored() -> bool:
        lines = await everything(bot, sid)
        return len(lines) >= 2 and any(line.endswith("] 收尾") for line in lines)

    await until(stored, "the closing line and the other plugin's answer stored")
    lines = await everything(bot, sid)
    assert len(lines) == 2
    assert f"其他插件收到：{text}" in lines


# ---- the owner's controls survive a restart ----------------------------------------------
async def test_modes_personas_caps_and_cooldowns_persist_across_a_restart(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    off, persona, capped, cooling = 30201, 30202, 30203, 30204
    member = 20001
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config()]), "MEMSUM_USER_COOLDOWN": "3600"}
    llm.reset()
    async with running_bot(tmp_path, env=env) as (bot, sim):

        async def answer(group: int, text: str, user: int = SUPERUSER) -> str:
            mark = len(sim.calls)
            await sim.group_message(
                group, user, text if user == SUPERUSER else [at(SELF_ID), seg(f" {text}")]
            )
            call = await sim.wait_call(
                set(SEND_ACTIONS), predicate=lambda c: c.params.get("group_id") == group, after=mark
            )
            return plain_text(call.params["message"])

        assert (await answer(off, "/记忆模式 关")).startswith("已将本群模式设为 关。")
        assert (await answer(persona, "/人设 你是测试猫。")).startswith("已设置本群人设（6 字）")
        assert (await answer(capped, "/限额 10")).startswith("已修改本群每日限额。")
        llm.push(Reply("在的"), Reply("好的"))
        assert await answer(cooling, "你好", member) == "在的"  # the member's cooldown starts
        assert await answer(capped, "问题", member) == "好的"  # more than 10 tokens today
        assert await answer(capped, "还在吗", member) == CAP_NOTICE  # the one notice of the day

        await restart(bot, sim)
        chat_before = len(llm.requests)

        # 关: still off, nothing recorded.
        assert (await answer(off, "/记忆模式")).startswith("本群模式：关（本群）")
        await sim.group_message(off, member, "有人吗")
        await wait_log(bot, f"not recording a message of {group_sid(off)}: mode off")
        assert await everything(bot, group_sid(off)) == []
        # The persona is the system prompt of the group's turns.
        llm.push(Reply("喵"))
        assert await answer(persona, "你是谁", member) == "喵"
        assert llm.requests[-1]["messages"][0] == {"role": "system", "content": "你是测试猫。"}
        # Capped, notice given: silent until tomorrow, still recording.
        mark = len(sim.calls)
        await sim.group_message(capped, member, [at(SELF_ID), seg(" 真的不行吗")])
        await wait_log(bot, f"of {group_sid(capped)}: capped")
        # Cooling down: the member's next question is recorded, not answered.
        await sim.group_message(cooling, member, [at(SELF_ID), seg(" 又来了")])
        await wait_log(bot, f"of {group_sid(cooling)}: cooling")
        assert [c for c in sim.calls[mark:] if c.action in SEND_ACTIONS] == []
        assert len(llm.requests) == chat_before + 1  # only the persona group's turn
        assert (await everything(bot, group_sid(capped)))[-1].endswith("真的不行吗")
        assert (await everything(bot, group_sid(cooling)))[-1].endswith("又来了")


async def test_a_record_only_group_records_and_compresses_but_never_answers(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM
) -> None:
    group, sid = 30301, group_sid(30301)
    llm.reset()
    llm.default = Reply(SUMMARY)
    try:
        mark = len(sim.calls)
        await sim.group_message(group, SUPERUSER, "/记忆模式 仅记录")
        await sim.group_message(group, SUPERUSER, "/条数线 4")
        assert len(await answers(sim, mark, 2)) == 2
        mark = len(sim.calls)
        await sim.group_message(group, 20001, [at(SELF_ID), seg(" 小记你在吗")])
        for i in range(3):  # the fourth message reaches the count line
            await sim.group_message(group, 20002 + i, f"第 {i} 句：周末去爬山吗")

        async def compressed() -> bool:
            return await active(bot, sid) == ["对话已压缩"]

        await until(compressed, "the record-only group compressed")

        async def all_decided() -> bool:  # each of the four handlers chose not to answer
            return bot.log().count(f"of {sid}: record-only") == 4

        await until(all_decided, "the four messages judged")
        assert len(await summary(bot, sid)) == 1
        assert len(await everything(bot, sid)) == 5  # four lines archived, the divider
        # Only the summariser was asked; the group heard nothing.
        assert len(llm.requests) == 1
        assert "小记你在吗" in json.dumps(llm.requests[0], ensure_ascii=False)
        assert [c for c in sim.calls[mark:] if c.action in SEND_ACTIONS | FORWARD_ACTIONS] == []
    finally:
        llm.reset()
