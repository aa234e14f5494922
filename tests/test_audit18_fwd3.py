"""Audit 18 (fwd3): a merged forward (合并转发) the owner sends on the bot's account.

What the owner types on the bot's account from another client is stored as the bot's own words
(said.py live, recovery.py's backfill after a restart), but a merged forward among them was
stored as `[合并转发]` unless NapCat sent its `content` with it: neither path asked
`get_forward_msg`, as a member's forward is read. Now both do and store the record; the
backfill still asks no more once an ask of it timed out.

bot.py as a subprocess, the OneBot simulator over the real reverse WebSocket; what the bot
stored is read from its SQLite file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, away, back, connected, group_sid, rows, wait_rows
from tests.fakes.onebot import OneBotSim
from tests.test_audit18_fwd2 import napcat_forward_sent
from tests.test_audit18_fwdc import LAGRANGE_ANSWER, forward

pytestmark = pytest.mark.e2e

NAPCAT_RECORD = "[合并转发：\n  公告: 群规第一条 fw2a11\n]"
LAGRANGE_RECORD = "[合并转发：\n  老张: 下周三交周报，lgx5512 别忘了\n  小李: 收到[表情]\n]"


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BotProcess]:
    async with BotProcess(tmp_path_factory.mktemp("fwd3")) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        s.responders["get_forward_msg"] = lambda p: LAGRANGE_ANSWER
        yield s


async def settled(bot: BotProcess, sid: str, n: int) -> list[tuple[str, str]]:
    """The session's rows once it has `n` and nothing more came for a while."""
    await wait_rows(bot, sid, n)
    await asyncio.sleep(0.8)
    return await rows(bot, sid)


def asked(sim: OneBotSim, mark: int) -> list[str]:
    return [str(c.params.get("id")) for c in sim.calls[mark:] if c.action == "get_forward_msg"]


# NapCat with reportSelfMessage reports what the owner sends on the account from the phone as
# `message_sent` (napcat_forward_sent cites its source), the forward's `content` only with
# `parseMultMsg`; without it the content is asked with `get_forward_msg` (`id` the NT msgId).
@pytest.mark.parametrize("content", [True, False], ids=["with-content", "asked"])
async def test_a_forward_the_owner_sends_on_the_account_is_stored_as_its_record(
    bot: BotProcess, sim: OneBotSim, content: bool
) -> None:
    group = 97001 + content
    sid = group_sid(group)
    mark = len(sim.calls)
    await sim.send_event(napcat_forward_sent(1500000000 + group, group, f"napcat-{group}", content=content))
    await wait_rows(bot, sid, 1)
    await sim.group_message(group, 20001, "收到", nickname="甲")
    assert await settled(bot, sid, 2) == [
        ("assistant", NAPCAT_RECORD if content else LAGRANGE_RECORD),
        ("user", "[甲(20001)] 收到"),
    ]
    assert asked(sim, mark) == ([] if content else [f"napcat-{group}"])


# LLOneBot (and older NapCat) report the account's own message as a plain group `message`
# whose sender is the account; its forward segment is `{id}` alone (LLOneBot never sends the
# content: record.fill_forward), read with `get_forward_msg`.
async def test_a_forward_the_owner_sends_reported_as_a_plain_message_is_stored_as_its_record(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 97010
    sid = group_sid(group)
    await sim.group_message(group, SELF_ID, [forward("llonebot-res")])
    await wait_rows(bot, sid, 1)
    await sim.group_message(group, 20001, "收到", nickname="甲")
    assert await settled(bot, sid, 2) == [("assistant", LAGRANGE_RECORD), ("user", "[甲(20001)] 收到")]


# What the owner sent on the account while bot.py was down is in the group's history as a message
# whose sender is the account (NapCat GetGroupMsgHistory.ts; OneBotSim._history the same).
async def test_a_forward_the_owner_sent_while_down_is_backfilled_as_its_record_and_a_timeout_still_stops_asks(
    tmp_path: Path,
) -> None:
    group = 97101
    sid = group_sid(group)

    async def answer(params: dict[str, Any]) -> Any:
        if str(params.get("id")).startswith("hang"):
            await asyncio.sleep(120)  # never answered in time
        return LAGRANGE_ANSWER

    async with BotProcess(tmp_path / "bot") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        sim.responders["get_forward_msg"] = answer
        try:
            await back(bot, sim, restart=False, backfill=False)
            await sim.group_message(group, 20100, "我先说一句", nickname="辛")
            await wait_rows(bot, sid, 1)
            await away(bot, sim)
            await sim.group_message(group, SELF_ID, [forward("owner-0")])
            await sim.group_message(group, 20101, [forward("hang-1")], nickname="转发")
            await sim.group_message(group, SELF_ID, [forward("owner-2")])
            await back(bot, sim)
            await sim.group_message(group, 20102, "好", nickname="癸")
            stored = await settled(bot, sid, 5)
        finally:
            await sim.close()
    assert stored == [
        ("user", "[辛(20100)] 我先说一句"),
        ("assistant", LAGRANGE_RECORD),
        ("user", "[转发(20101)] [合并转发]"),
        ("assistant", "[合并转发]"),  # asked no more after the timeout
        ("user", "[癸(20102)] 好"),
    ]
    assert asked(sim, 0) == ["owner-0", "hang-1"]
