"""Real implementations' events through the real path (issue 8 items 7-9): bot.py as a
subprocess, the OneBot simulator over reverse WebSocket pushing the payloads of
tests/fixtures/onebot/<impl>/*.json (each citing its source), answering
`get_group_member_info`, `get_stranger_info` and `get_msg` as the implementations do; what
the bot remembered is read from its SQLite file. No model is configured: nothing here is
addressed to the bot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, connected, group_sid, private_sid, query, until
from tests.fakes.onebot import OneBotSim, at, text
from tests.test_onebot_render import load

GROUP = 736368697  # the group of the fixtures
ADMIN, MEMBER, GONE = 663748426, 2973907990, 2973907991


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BotProcess]:
    async with BotProcess(tmp_path_factory.mktemp("onebot-events")) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


async def stored(bot: BotProcess, sid: str) -> list[tuple[str, str]]:
    sql = "SELECT role, content FROM messages WHERE session_id = ? ORDER BY id"
    rows = await query(bot.db_path, sql, sid)
    return [(str(r[0]), str(r[1])) for r in rows]


async def wait_stored(bot: BotProcess, sid: str, n: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []

    async def enough() -> bool:
        rows[:] = await stored(bot, sid)
        return len(rows) >= n

    await until(enough, f"{n} messages stored in {sid}")
    return rows


async def push(sim: OneBotSim, name: str, **changes: Any) -> None:
    await sim.send_event({**load(name), **changes})


async def test_r_tpl_4_notices_name_people_as_the_group_sees_them_and_noise_is_not_kept(
    bot: BotProcess, sim: OneBotSim
) -> None:
    sim.add_member(GROUP, ADMIN, "令狐二中", role="owner")
    sim.add_member(GROUP, MEMBER, "王小明", card="小王")
    # The message an essence notice is about, so `get_msg` can find it.
    await sim.group_message(GROUP, ADMIN, "明天下午三点开会", message_id=1793170822)
    sequence = [
        "napcat/group_increase_invite.json",  # names looked up: the card, else the nickname
        "napcat/emoji_like.json",  # noise from here …
        "napcat/input_status.json",
        "lagrange/reaction.json",
        "llonebot/poke_recall.json",
        "gocqhttp/lucky_king.json",
        "napcat/group_upload.json",  # … to here
        "napcat/poke.json",
        "napcat/group_recall_by_admin.json",
        "napcat/group_card.json",  # silently renames MEMBER …
        "napcat/title.json",  # … as this line shows
        "napcat/group_ban_member.json",
        "napcat/group_ban_whole.json",
        "napcat/group_lift_ban_whole.json",
        "napcat/essence_add.json",
        "lagrange/group_name_change.json",
        "napcat/group_name.json",
        "gocqhttp/group_card_cleared.json",  # the card is gone: the nickname shows again
        "gocqhttp/honor.json",
        "napcat/group_decrease_leave.json",  # GONE left: never a member the sim knows, named by nickname
        "napcat/message_sticker_image.json",
        "napcat/message_miniapp.json",
        "lagrange/message_mface_file.json",
    ]
    for name in sequence:
        if name == "gocqhttp/group_card_cleared.json":
            await wait_stored(bot, group_sid(GROUP), 11)  # every look-up so far is done
            sim.members[(GROUP, MEMBER)].card = ""
        await push(sim, name)
    rows = await wait_stored(bot, group_sid(GROUP), 16)
    assert rows == [
        ("user", "[令狐二中(663748426)] 明天下午三点开会"),
        ("notice", "令狐二中(663748426) 邀请 小王(2973907990) 加入了本群"),
        ("notice", "令狐二中(663748426) 拍了拍 小王(2973907990)的手说是闲得慌"),
        ("notice", "令狐二中(663748426) 撤回了 小王(2973907990) 的一条消息"),
        ("notice", "侦探小王(2973907990) 获得了头衔「首席侦探」"),
        ("notice", "侦探小王(2973907990) 被 令狐二中(663748426) 禁言 10 分钟"),
        ("notice", "令狐二中(663748426) 开启了全员禁言"),
        ("notice", "令狐二中(663748426) 关闭了全员禁言"),
        ("notice", "令狐二中(663748426) 把 令狐二中(663748426) 的一条消息设为精华：「明天下午三点开会」"),
        ("notice", "群名改为「周末桌游」"),
        ("notice", "令狐二中(663748426) 把群名改为「周末剧本杀」"),
        ("notice", "王小明(2973907990) 获得了群荣誉「龙王」"),
        ("notice", f"用户{GONE}({GONE}) 退出了本群"),
        ("user", "[令狐二中(663748426)] [动画表情][棒]🔥123"),
        ("user", '[令狐二中(663748426)] [卡片: 哔哩哔哩：知更鸟"嚯嗬嗬嗬"一分三十秒]'),
        ("user", "[令狐二中(663748426)] [吃瓜][文件: 报告.pdf]"),
    ]
    # Names are asked once and then cached: one member look-up per person at most.
    asked = [c.params["user_id"] for c in sim.calls if c.action == "get_group_member_info"]
    assert asked.count(ADMIN) <= 1
    assert asked.count(MEMBER) == 2  # once at first, once after the card was cleared


async def test_a_poke_at_the_bot_and_an_unknown_mention_are_named(bot: BotProcess, sim: OneBotSim) -> None:
    group = GROUP + 1
    sim.add_member(group, ADMIN, "令狐二中")
    sim.add_member(group, 30003, "路人甲", card="甲")
    await push(sim, "lagrange/poke.json", group_id=group)
    await sim.group_message(group, ADMIN, [text("问问 "), at(30003)])
    rows = await wait_stored(bot, group_sid(group), 2)
    assert rows == [
        ("notice", f"令狐二中(663748426) 戳了戳 小记({SELF_ID})的脑袋"),
        ("user", "[令狐二中(663748426)] 问问 @甲(30003)"),
    ]


async def test_a_private_poke_is_a_notice_of_the_private_chat_naming_the_poker(
    bot: BotProcess, sim: OneBotSim
) -> None:
    sim.add_member(GROUP + 2, ADMIN, "令狐二中")  # the sim's get_stranger_info knows the nickname
    await push(sim, "napcat/friend_poke.json")
    rows = await wait_stored(bot, private_sid(ADMIN), 1)
    assert rows == [("notice", f"小记({SELF_ID}) 戳了戳 令狐二中(663748426)")]
