"""Audit 20 (down): loose ends of the recovery after bot.py was down.

- A group the account left while bot.py was down (kicked, the group disbanded: no notice
  reached the bot) is found missing from `get_group_list` on connect: its history is not
  asked for (three such failures used to stop the backfill of every group), its questions
  are not answered; a group the account is in again comes back; a failed or empty list
  changes nothing.
- A temporary session's answer resumed after a restart names the group the chat came
  from, as the live answer does; NapCat's placeholder group 284840486 is never sent back.

bot.py runs as a real process with the OneBot simulator on its reverse WebSocket; what the
bot stored is read from its SQLite file, what it sent from the simulator's calls. Each
payload cites the implementation source it is built from.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.onebot.recovery import groups_in
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, away, back, group_sid, private_sid, rows, until, wait_rows
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, ActionFailedError, ApiCall, OneBotSim, at, text

pytestmark = pytest.mark.e2e

PERSONA = "你是审计二十断线测试里的助手小记。"
ANSWER = "小记回来了"


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def env(llm: ScriptedLLM) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}


def answer(body: dict[str, Any]) -> Reply | None:
    return Reply(ANSWER) if is_chat(body) else None


@pytest.fixture
async def answering(llm: ScriptedLLM) -> AsyncIterator[ScriptedLLM]:
    llm.reset()
    llm.on_request(answer)
    yield llm
    llm.reset()


@contextmanager
def thinking(llm: ScriptedLLM) -> Iterator[Gate]:
    """The model holds the next chat request (the bot is killed meanwhile), then answers again."""
    llm.reset()
    with llm.gate(Reply("来不及说的回答"), holds=is_chat) as gate:
        yield gate
    llm.reset()
    llm.on_request(answer)


@pytest.fixture
async def running(tmp_path: Path, answering: ScriptedLLM) -> AsyncIterator[tuple[BotProcess, OneBotSim]]:
    async with BotProcess(tmp_path / "bot", env=env(answering)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        try:
            await back(bot, sim, restart=False, backfill=False)
            yield bot, sim
        finally:
            await sim.close()


def sends(sim: OneBotSim, after: int, **where: Any) -> list[ApiCall]:
    """The send calls since call `after` to the place `where` names."""
    return [
        c
        for c in sim.calls[after:]
        if c.action in SEND_ACTIONS and all(str(c.params.get(k)) == str(v) for k, v in where.items())
    ]


def history_asked(sim: OneBotSim, after: int) -> list[int]:
    """The groups whose history the bot asked for since call `after`."""
    return [int(c.params["group_id"]) for c in sim.calls[after:] if c.action == "get_group_msg_history"]


async def _true(value: bool) -> bool:
    return value


# ---- 1. a group left while bot.py was down ------------------------------------------------
# `get_group_list` (botuniverse/onebot-11 api/public.md: a list of group_id, group_name,
# member_count, max_member_count; `no_cache`), as each implementation answers it:
# - NapCat (NapNeko/NapCatQQ af07479 packages/napcat-onebot/action/group/GetGroupList.ts,
#   `no_cache` forces the NT kernel's getGroupList; helper/data.ts `OB11Construct.group`):
#   group_id a number, with group_all_shut and group_remark.
def napcat_groups(groups: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "group_all_shut": 0,
            "group_remark": "",
            "group_id": g,
            "group_name": f"群{g}",
            "member_count": 30,
            "max_member_count": 500,
        }
        for g in groups
    ]


# - LuckyLilliaBot, LLOneBot's successor (LLOneBot/LuckyLilliaBot d2b7ee9
#   src/onebot11/action/group/GetGroupList.ts): `group_id: group.groupCode`, a string.
def llonebot_groups(groups: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "group_id": str(g),
            "group_name": f"群{g}",
            "group_memo": "",
            "member_count": 30,
            "max_member_count": 500,
            "remark_name": "",
            "owner_id": 20000,
            "is_top": False,
        }
        for g in groups
    ]


# - Lagrange.OneBot (LagrangeDev/Lagrange.Core 4da7d2f Lagrange.OneBot/Core/Operation/Info/
#   GetGroupListOperation.cs: `new OneBotGroup(x.GroupUin, x.GroupName)`).
def lagrange_groups(groups: list[int]) -> list[dict[str, Any]]:
    return [{"group_id": g, "group_name": f"群{g}"} for g in groups]


# NapCat's history of a group it holds no message of (go-cqhttp/GetGroupMsgHistory.ts
# `throw new Error(`消息${payload.message_seq}不存在`)`), answered by OneBotAction.ts with
# retcode 1200 and the error's text: what a group the account was kicked from answers.
NAPCAT_NO_HISTORY = (1200, "消息undefined不存在")


@pytest.mark.parametrize("dialect", [napcat_groups, llonebot_groups, lagrange_groups])
async def test_groups_left_while_down_are_not_asked_nor_answered_and_the_rest_are_backfilled(
    running: tuple[BotProcess, OneBotSim],
    answering: ScriptedLLM,
    dialect: Callable[[list[int]], list[dict[str, Any]]],
) -> None:
    bot, sim = running
    kicked = [62001, 62002, 62003]
    stayed = 62004
    # Each group talked; the ones the bot is kicked from first, so their fetches come first.
    for group in [*kicked, stayed]:
        await sim.group_message(group, 20001, f"{group} 的闲聊", nickname="甲")
        await wait_rows(bot, group_sid(group), 1)
    # A question in one of them the kill left unanswered (the model still thinking).
    with thinking(answering) as gate:
        await sim.group_message(kicked[0], 20002, [at(SELF_ID), text(" 还在吗")], nickname="乙")
        await gate.reached()
        await away(bot, sim)
    # Kicked from three groups while down (no notice reached the bot); the one it stayed
    # in talked on.
    missed = "你不在的时候我们定了周六爬山"
    await sim.group_message(stayed, 20003, missed, nickname="丙")
    history = sim.responders["get_group_msg_history"]

    def without_kicked(params: dict[str, Any]) -> Any:
        if int(params["group_id"]) in kicked:
            raise ActionFailedError(*NAPCAT_NO_HISTORY)
        return history(params)

    sim.responders["get_group_msg_history"] = without_kicked
    sim.responders["get_group_list"] = lambda _: dialect([stayed, 62999])
    mark = len(sim.calls)
    await back(bot, sim)
    await asyncio.sleep(1.0)  # a resumed answer would come now
    assert sends(sim, mark, group_id=kicked[0]) == []
    assert (await rows(bot, group_sid(stayed)))[-1] == ("user", f"[丙(20003)] {missed}")
    assert history_asked(sim, mark) == [stayed]
    (listed,) = [c for c in sim.calls[mark:] if c.action == "get_group_list"]
    assert listed.params.get("no_cache") is True
    # The next connect asks no more, the list or not.
    del sim.responders["get_group_list"]
    await sim.close()
    mark = len(sim.calls)
    await back(bot, sim, restart=False)
    assert history_asked(sim, mark) == [stayed]
    # Invited back while down: the list names the group again, its history is fetched.
    await away(bot, sim)
    back_in = kicked[0]
    again = await sim.group_message(back_in, 20004, "欢迎回来", nickname="丁")
    sim.responders["get_group_list"] = lambda _: dialect([back_in, stayed])
    sim.responders["get_group_msg_history"] = history
    mark = len(sim.calls)
    await back(bot, sim)
    assert sorted(history_asked(sim, mark)) == [back_in, stayed]
    # Stored; the question 「还在吗」, younger than MEMSUM_RESUME_WINDOW and unanswered, may
    # be answered after it now that the group is back (as any resumed question).
    assert ("user", "[丁(20004)] 欢迎回来") in await rows(bot, group_sid(back_in)), again


@pytest.mark.parametrize(
    "answer",
    [
        # A refusal: OneBotAction.ts's retcode 1200 with the kernel's error.
        ActionFailedError(1200, "getGroupList timeout"),
        # LLOneBot 3.x (LLOneBot/LLOneBot 1105dac src/onebot11/action/group/GetGroupList.ts):
        # when the forced refresh throws it answers its cache, empty until the list loaded.
        [],
    ],
)
async def test_a_failed_or_empty_group_list_changes_nothing(
    running: tuple[BotProcess, OneBotSim], answer: Any
) -> None:
    bot, sim = running
    group = 62101
    await sim.group_message(group, 20001, "在吗各位", nickname="甲")
    await wait_rows(bot, group_sid(group), 1)
    await away(bot, sim)
    await sim.group_message(group, 20002, "周末见", nickname="乙")

    def group_list(_: dict[str, Any]) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    sim.responders["get_group_list"] = group_list
    for restart in (True, False):  # nor on the next connect
        mark = len(sim.calls)
        await back(bot, sim, restart=restart)
        assert history_asked(sim, mark) == [group]
        await sim.close()
    assert (await rows(bot, group_sid(group)))[-1] == ("user", "[乙(20002)] 周末见")


@pytest.mark.parametrize(
    ("answer", "groups"),
    [
        ([{"group_id": 1}, {"group_id": "2"}], {1, 2}),
        ([], None),  # no group at all: an empty cache, not kicked from every group
        ({"groups": []}, None),
        ([{"group_id": 1}, {"group_name": "无号"}], None),
        ([{"group_id": 1}, "2"], None),
    ],
)
def test_what_a_group_list_says(answer: Any, groups: set[int] | None) -> None:
    assert groups_in(answer) == groups


# ---- 2. a temporary session's answer, live and resumed --------------------------------------
# NapCat (NapNeko/NapCatQQ af07479 packages/napcat-onebot/api/msg.ts `handleTempGroupMessage`):
# a private message of a group temporary session has `sub_type: "group"`, `temp_source: 0` and
# the group in `group_id`, or, when `getTempChatInfo` fails, the placeholder 284840486 and the
# nickname 「临时会话」; index.ts `handleMsg` sets `target_id = peerUin`.
NAPCAT_NO_GROUP = 284840486


def napcat_temp(message_id: int, user: int, group: int, words: str) -> dict[str, Any]:
    found = group != NAPCAT_NO_GROUP
    return {
        "post_type": "message",
        "message_type": "private",
        "sub_type": "group",
        "message_id": message_id,
        "message_seq": message_id,
        "real_id": message_id,
        "user_id": user,
        "target_id": user,
        "group_id": group,
        "temp_source": 0,
        "message": [text(words)],
        "message_format": "array",
        "raw_message": words,
        "font": 14,
        "sender": {"user_id": user, "nickname": "临时甲" if found else "临时会话", "card": ""},
    }


# NapCat's send (packages/napcat-onebot/action/msg/SendMsg.ts `createContext`, since PR #1963
# "将显式 group_id 优先级提升至 getTempChatInfo 缓存之前"): to a non-friend with a `group_id` it
# sends a temp message from that group, whatever QQ remembers of the chat; without one, from
# the group QQ remembers (`getTempChatInfo`). The placeholder is no group the account is in.
async def test_a_temp_chat_answer_never_names_napcats_placeholder_group(
    running: tuple[BotProcess, OneBotSim],
) -> None:
    bot, sim = running
    user = 20501
    mark = len(sim.calls)
    await sim.send_event(napcat_temp(89501, user, NAPCAT_NO_GROUP, "群里看到你，问个问题"))
    await until(lambda: _true(bool(sends(sim, mark, user_id=user))), "the answer")
    (sent,) = sends(sim, mark, user_id=user)
    assert sent.params.get("message_type") == "private"
    assert "group_id" not in sent.params
    assert await rows(bot, private_sid(user)) == [
        ("user", f"[临时会话({user})] 群里看到你，问个问题"),
        ("assistant", ANSWER),
    ]


async def test_a_temp_chat_question_resumed_after_a_restart_is_answered_from_its_group(
    running: tuple[BotProcess, OneBotSim], answering: ScriptedLLM
) -> None:
    bot, sim = running
    group, user = 79501, 20502
    # The kill cut the model's answer off.
    with thinking(answering) as gate:
        await sim.send_event(napcat_temp(89502, user, group, "群里说的资料能发我吗"))
        await gate.reached()
        await bot.kill()
    await asyncio.wait_for(sim.disconnected.wait(), 15)
    mark = len(sim.calls)
    await back(bot, sim)
    await until(lambda: _true(bool(sends(sim, mark, user_id=user))), "the resumed answer")
    (sent,) = sends(sim, mark, user_id=user)
    assert sent.params.get("message_type") == "private"
    assert sent.params.get("group_id") == group  # as the live answer names it
    assert sends(sim, mark, group_id=group, message_type="group") == []
