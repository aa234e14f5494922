"""The fast path (onebot/fastpath.py, issue 15 item 6) through bot.py and the real
WebSocket: with only this plugin, ordinary messages and notices skip NoneBot's
per-event tasks and everything behaves as through NoneBot (order, answers, commands and
their permissions, echoes, empty events); another plugin's message matcher turns it off
for messages; a failure inside it is logged and holds nothing up."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, connected, group_sid, query, until, wait_log
from tests.fakes.llm_server import ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, OneBotSim, at, plain_text, text

SUPERUSER = 10001
MEMBERS = (20001, 20002, 20003)
NOTICE = "(notice)"
ALL_FAST = "memsum: event dispatch: messages fast path; notices fast path"
PYPROJECT = """[tool.nonebot]
plugin_dirs = ["plugins"]

[tool.nonebot.plugins]
nonebot-plugin-memsum = ["nonebot_plugin_memsum"]
"""


def with_plugin(workdir: Path, name: str, source: str) -> Path:
    """`workdir` as a bot folder whose pyproject.toml loads plugins/`name`.py beside ours."""
    (workdir / "plugins").mkdir(parents=True)
    (workdir / "plugins" / f"{name}.py").write_text(source, "utf-8")
    (workdir / "pyproject.toml").write_text(PYPROJECT, "utf-8")
    return workdir


async def stored(bot: BotProcess, sid: str) -> list[str]:
    """The session's lines as stored, in order: chat without its "[time name] " head,
    notices as NOTICE."""
    sql = "SELECT role, content FROM messages WHERE session_id = ? ORDER BY id"
    rows = await query(bot.db_path, sql, sid)
    return [NOTICE if role == "notice" else str(content).split("] ", 1)[-1] for role, content in rows]


async def wait_stored(bot: BotProcess, sid: str, last: str) -> list[str]:
    """The session's lines once `last` is among them."""
    lines: list[str] = []

    async def there() -> bool:
        lines[:] = await stored(bot, sid)
        return any(line.endswith(last) for line in lines)

    await until(there, f"{last!r} stored in {sid}")
    return lines


async def answer(sim: OneBotSim, group: int, user: int, message: str | list, **kw: object) -> str:
    """Say `message` in `group`; the text of the bot's next message there."""
    mark = len(sim.calls)
    await sim.group_message(group, user, message, **kw)  # type: ignore[arg-type]
    call = await sim.wait_call(
        set(SEND_ACTIONS), predicate=lambda c: c.params.get("group_id") == group, after=mark
    )
    return plain_text(call.params["message"])


async def burst(sim: OneBotSim, group: int, n: int, tag: str) -> list[str]:
    """n lines from the members pushed back to back (nothing awaited between them), a
    member-joins notice in the middle; the lines in the order they were said."""
    said = []
    for i in range(n):
        said.append(f"{tag}{i}")
        await sim.group_message(group, MEMBERS[i % len(MEMBERS)], f"{tag}{i}")
        if i == n // 2:
            await sim.notice("group_increase", group_id=group, user_id=20009)
    return said


# ---- only this plugin: the fast path --------------------------------------------------------
@pytest.fixture(scope="module")
async def fast(
    tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM
) -> AsyncIterator[tuple[BotProcess, OneBotSim]]:
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config()])}
    async with BotProcess(tmp_path_factory.mktemp("fast"), env=env) as bot, connected(bot) as sim:
        await wait_log(bot, ALL_FAST)
        yield bot, sim


async def test_ordinary_messages_and_notices_are_recorded_in_arrival_order(
    fast: tuple[BotProcess, OneBotSim],
) -> None:
    bot, sim = fast
    group = 40001
    said = await burst(sim, group, 30, "第")
    await sim.group_message(group, SELF_ID, "机器人自己的话")  # the account's own, typed elsewhere
    await sim.group_message(group, MEMBERS[0], [])  # a malformed event with nothing in it
    await sim.group_message(group, MEMBERS[0], "收尾")
    lines = await wait_stored(bot, sid := group_sid(group), "收尾")
    # In order, the notice where it came, the account's own words as the bot's (audit 8);
    # the empty event not recorded.
    half = len(said) // 2 + 1
    assert lines == [*said[:half], NOTICE, *said[half:], "机器人自己的话", "收尾"]
    assert bot.log().count(ALL_FAST) == 1
    assert "Event will be handled by" not in bot.log()  # NoneBot's dispatch saw none of them
    assert await stored(bot, sid) == lines


async def test_addressed_messages_are_answered_by_at_and_by_nickname(
    fast: tuple[BotProcess, OneBotSim],
) -> None:
    _, sim = fast
    assert await answer(sim, 40002, MEMBERS[0], [at(SELF_ID), text(" 在吗")]) == "好的"
    assert await answer(sim, 40003, MEMBERS[1], "小记，明天几点开会") == "好的"


async def test_commands_keep_their_permissions_and_are_never_recorded(
    fast: tuple[BotProcess, OneBotSim],
) -> None:
    bot, sim = fast
    group = 40004
    sid = group_sid(group)
    # A member may not change the mode: no answer, not recorded, the mode unchanged.
    await sim.group_message(group, MEMBERS[0], "/记忆模式 关")
    assert await answer(sim, group, MEMBERS[1], [at(SELF_ID), text(" 还在吗")]) == "好的"
    # The superuser may; then the place records nothing.
    assert (await answer(sim, group, SUPERUSER, "/记忆模式 关")).startswith("已将本群模式设为 关。")
    await sim.group_message(group, MEMBERS[0], "关着时说的")
    await wait_log(bot, f"memsum: not recording a message of {sid}: mode off")
    assert (await answer(sim, group, SUPERUSER, "/记忆模式 开")).startswith("已将本群模式设为 开。")
    # /清除 and its 「确认」 (a plain word only the commands' rule knows) still reach the commands.
    assert (await answer(sim, group, SUPERUSER, "/清除")).endswith("60 秒内回复「确认」继续。")
    assert await answer(sim, group, SUPERUSER, "确认") == "已清除本会话的上下文和摘要。"
    await sim.group_message(group, MEMBERS[2], "收尾")
    lines = await wait_stored(bot, sid, "收尾")
    assert [line for line in lines if "好的" not in line] == ["@小记(10000) 还在吗", "收尾"]


# ---- another plugin with a message matcher: NoneBot's dispatch for messages -------------------
WATCHER = """
from pathlib import Path

from nonebot import on_message
from nonebot.adapters.onebot.v11 import MessageEvent

@on_message(priority=10, block=False).handle()
async def _(event: MessageEvent) -> None:
    with Path("seen.txt").open("a", encoding="utf-8") as seen:
        seen.write(event.get_plaintext() + "\\n")
"""


async def test_another_plugins_message_matcher_turns_the_fast_path_off_for_messages(tmp_path: Path) -> None:
    workdir = with_plugin(tmp_path, "watcher", WATCHER)
    async with BotProcess(workdir) as bot, connected(bot) as sim:
        await wait_log(
            bot,
            "memsum: event dispatch: messages through NoneBot, also handled by watcher; notices fast path",
        )
        group = 40005
        said = await burst(sim, group, 20, "看")
        await sim.group_message(group, MEMBERS[0], "收尾")
        lines = await wait_stored(bot, group_sid(group), "收尾")
        half = len(said) // 2 + 1
        assert lines == [*said[:half], NOTICE, *said[half:], "收尾"]

        async def all_seen() -> bool:
            seen = workdir / "seen.txt"
            return seen.exists() and len(seen.read_text("utf-8").splitlines()) == len(said) + 1

        await until(all_seen, "every message seen by the other plugin")
        assert sorted((workdir / "seen.txt").read_text("utf-8").splitlines()) == sorted([*said, "收尾"])


# ---- a failure inside the fast path -----------------------------------------------------------
# A fault injected into the real process (the store cannot be made to fail for one message
# from outside): a plugin with no matcher, so the fast path stays on, makes recording raise
# for the text 「炸」.
FAULT = """
from nonebot import require

require("nonebot_plugin_memsum")
from nonebot_plugin_memsum.onebot import matchers

_record = matchers.record_message


async def _failing(bot, event, arrival=None, **kw):
    if event.get_plaintext() == "炸":
        raise RuntimeError("注入的故障")
    return await _record(bot, event, arrival, **kw)


matchers.record_message = _failing
"""


async def test_a_failure_in_the_fast_path_is_logged_and_releases_the_arrival_ticket(tmp_path: Path) -> None:
    async with BotProcess(with_plugin(tmp_path, "fault", FAULT)) as bot, connected(bot) as sim:
        await wait_log(bot, ALL_FAST)
        group = 40006
        await sim.group_message(group, MEMBERS[0], "之前")
        await sim.group_message(group, MEMBERS[1], "炸")
        said = await burst(sim, group, 10, "后")
        log = await wait_log(bot, "memsum: handling a message event failed")
        assert "RuntimeError: 注入的故障" in log
        # Later messages of the session were not held behind the failed one's ticket.
        lines = await wait_stored(bot, group_sid(group), said[-1])
        half = len(said) // 2 + 1
        assert lines == ["之前", *said[:half], NOTICE, *said[half:]]
        assert bot.running  # the connection and the process go on
