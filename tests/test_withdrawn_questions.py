"""A question withdrawn (撤回) before its answer goes out is not answered.

A member @s the bot, sees a typo or the wrong group, and withdraws the message; QQ's own
clients then show 「撤回了一条消息」. Before, the bot still answered it a few seconds later,
into a group where the question was gone (and a restart answered it too). Now:

- a turn queued behind another one does not start when every message that asked it was
  withdrawn meanwhile;
- a turn whose answer is ready when every question it read was withdrawn sends nothing and
  stores 「（提问已撤回，助手未回复）」 as its event marker instead of the answer;
- a withdrawn question is no longer pending: a restart does not answer it.

bot.py runs as a real process with the OneBot simulator over the real reverse WebSocket and
the scripted model on real HTTP (a `Gate` holds the model while the member withdraws); the
store's part runs on a real SQLite file and on PostgreSQL (the `location` fixture). The
notices are OneBot v11's (event/notice.md 群消息撤回 / 好友消息撤回), as NapCat sends them
(OB11GroupRecallNoticeEvent.ts; tests/fixtures/onebot/napcat/group_recall_*.json).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nonebot_plugin_memsum.agent.turn import WITHDRAWN_RECORD
from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.types import Message
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, private_sid, running_bot, until
from tests.fakes.e2e import wait_rows as rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, OneBotSim, as_segments, at, plain_text, text

PERSONA = "你是撤回提问测试群的助手小记。"


def chats(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [b for b in llm.requests if b["messages"][0].get("content") == PERSONA]


def sends(sim: OneBotSim, after: int) -> list[str]:
    return [
        plain_text(as_segments(c.params.get("message") or []))
        for c in sim.calls[after:]
        if c.action in SEND_ACTIONS
    ]


@pytest.fixture(scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[BotProcess, OneBotSim, ScriptedLLM]]:
    with ScriptedLLM() as llm:
        settings = {"MEMSUM_MODELS": json.dumps([llm.model_config()]), "MEMSUM_PERSONA": PERSONA}
        async with running_bot(tmp_path_factory.mktemp("withdrawn-q"), settings) as (bot, sim):
            yield bot, sim, llm


async def test_a_question_withdrawn_while_the_model_thinks_gets_no_answer(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    bot, sim, llm = env
    llm.reset()
    group = 98101
    sid = group_sid(group)
    mark = len(sim.calls)
    with llm.gate(Reply("明天下午三点，在东门集合")) as gate:
        asked = await sim.group_message(group, 20001, [at(SELF_ID), text(" 明天几点几合？")], nickname="小林")
        await gate.reached()
        await sim.notice("group_recall", group_id=group, user_id=20001, operator_id=20001, message_id=asked)
        await rows(bot, sid, 2)  # the notice is stored before the model answers
    stored = await rows(bot, sid, 3)
    assert stored[1:] == [("notice", "小林(20001) 撤回了一条消息"), ("system", WITHDRAWN_RECORD)]
    await asyncio.sleep(0.5)
    assert sends(sim, mark) == []

    # The corrected question is answered as usual, and only it.
    llm.reset()
    llm.push(Reply("明天下午三点"))
    mark = len(sim.calls)
    await sim.group_message(group, 20001, [at(SELF_ID), text(" 明天几点集合？")], nickname="小林")
    await until(lambda: _sent(sim, mark), "the corrected question answered")
    assert sends(sim, mark) == ["明天下午三点"]
    assert len(chats(llm)) == 1


async def _sent(sim: OneBotSim, mark: int) -> bool:
    return bool(sends(sim, mark))


async def test_a_queued_question_withdrawn_before_its_turn_starts_costs_no_model_call(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    """The bot is busy answering 小林 when 小周 asks and withdraws: 小林 gets the answer;
    no second request is made for 小周's withdrawn question."""
    bot, sim, llm = env
    llm.reset()
    group = 98102
    sid = group_sid(group)
    mark = len(sim.calls)
    with llm.gate(Reply("周六见")) as gate:
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 周六去吗")], nickname="小林")
        await gate.reached()
        queued = await sim.group_message(
            group, 20002, [at(SELF_ID), text(" 我的快递到了吗")], nickname="小周"
        )
        await rows(bot, sid, 2)
        await sim.notice("group_recall", group_id=group, user_id=20002, operator_id=20002, message_id=queued)
        await rows(bot, sid, 3)
    stored = await rows(bot, sid, 4)
    assert stored[3] == ("assistant", "周六见")
    await asyncio.sleep(1)
    assert sends(sim, mark) == ["周六见"]
    assert len(chats(llm)) == 1


async def test_a_private_question_withdrawn_while_the_model_thinks_gets_no_answer(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    bot, sim, llm = env
    llm.reset()
    user = 10088
    sid = private_sid(user)
    mark = len(sim.calls)
    with llm.gate(Reply("好的")) as gate:
        asked = await sim.private_message(user, "帮我记一下银行卡密码 0420", nickname="老王")
        await gate.reached()
        # OneBot v11 event/notice.md 好友消息撤回: {notice_type: friend_recall, user_id, message_id}.
        await sim.notice("friend_recall", user_id=user, message_id=asked)
        await rows(bot, sid, 2)
    stored = await rows(bot, sid, 3)
    assert stored[2] == ("system", WITHDRAWN_RECORD)
    await asyncio.sleep(0.5)
    assert sends(sim, mark) == []


async def test_an_answer_to_questions_not_all_withdrawn_still_goes_out(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    """Two members asked before the turn read the history; one withdraws: the other's
    question is still open, so the answer goes out."""
    bot, sim, llm = env
    llm.reset()
    group = 98103
    sid = group_sid(group)
    with llm.gate(Reply("第一个问题先放着"), holds=lambda b: len(b["messages"]) == 2) as first:
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 在吗")], nickname="小林")
        await first.reached()
        mark = len(sim.calls)
        with llm.gate(
            Reply("都在，下午两点开会"), holds=lambda b: "会议室在哪" in json.dumps(b, ensure_ascii=False)
        ) as second:
            a = await sim.group_message(group, 20002, [at(SELF_ID), text(" 几点开会")], nickname="小周")
            await sim.group_message(group, 20003, [at(SELF_ID), text(" 会议室在哪")], nickname="小吴")
            await rows(bot, sid, 3)
            first.open()
            await second.reached()  # the queued turn read both questions
            await sim.notice("group_recall", group_id=group, user_id=20002, operator_id=20002, message_id=a)
            await rows(bot, sid, 5)
    stored = await rows(bot, sid, 6)
    assert stored[-1] == ("assistant", "都在，下午两点开会")
    await until(lambda: _has(sim, mark, "都在，下午两点开会"), "the second answer sent")


async def _has(sim: OneBotSim, mark: int, said: str) -> bool:
    return said in sends(sim, mark)


# ---- the store: what is still pending, on both engines ---------------------------------
async def test_a_withdrawn_question_is_no_longer_pending(store: Store) -> None:
    sid = "qq:1:group:5"
    assert not await store.questions_withdrawn(sid)  # nothing asked: nothing withdrawn either
    first = await store.append(sid, asking("[甲(1)] @小记 在吗", "71"))
    second = await store.append(sid, asking("[乙(2)] @小记 几点", "72"))
    assert [m.id for _, m in await store.pending_questions(0, sid)] == [first.id, second.id]
    await store.mark_withdrawn(sid, "72")
    assert [m.id for _, m in await store.pending_questions(0, sid)] == [first.id]
    assert not await store.questions_withdrawn(sid)  # 甲's question is still open
    await store.mark_withdrawn(sid, "71")
    assert await store.pending_questions(0, sid) == []
    assert await store.questions_withdrawn(sid)
    later = await store.append(sid, asking("[甲(1)] @小记 改一下", "73"))
    assert not await store.questions_withdrawn(sid)
    assert await store.questions_withdrawn(sid, second.id)  # only what a turn read counts
    await store.mark_reply(sid, later.id or 0, "sent")
    assert not await store.questions_withdrawn(sid)  # answered: nothing left to ask


def asking(content: str, platform_id: str) -> Message:
    name = content[content.index("(") + 1 : content.index(")")]
    return Message(
        role="user", content=content, name=name, platform_id=platform_id, addressed=True, ts=1000.0
    )


def _quoted(sim: OneBotSim, after: int) -> list[str | None]:
    """The message id each answer sent after `after` quotes (None: no quote)."""
    quotes: list[str | None] = []
    for c in sim.calls[after:]:
        if c.action in SEND_ACTIONS:
            segs = as_segments(c.params.get("message") or [])
            quotes.append(next((str(s["data"]["id"]) for s in segs if s["type"] == "reply"), None))
    return quotes


async def test_an_answer_does_not_quote_a_question_withdrawn_while_it_waited(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    """The bot is busy answering 小林; 小周 asks, then 小王 asks and withdraws. The queued turn
    answers 小周's question, and its answer does not quote 小王's withdrawn message (in QQ a
    quote of a withdrawn message shows an empty box above an answer to someone else)."""
    bot, sim, llm = env
    llm.reset()
    group = 98103
    sid = group_sid(group)
    mark = len(sim.calls)
    llm.push(Reply("周六见"), Reply("快递今天到"))
    with llm.gate() as gate:  # holds the first request; the queue answers
        first = await sim.group_message(group, 20001, [at(SELF_ID), text(" 周六去吗")], nickname="小林")
        await gate.reached()
        await sim.group_message(group, 20002, [at(SELF_ID), text(" 我的快递到了吗")], nickname="小周")
        withdrawn = await sim.group_message(group, 20003, [at(SELF_ID), text(" 打错了")], nickname="小王")
        await rows(bot, sid, 3)
        await sim.notice(
            "group_recall", group_id=group, user_id=20003, operator_id=20003, message_id=withdrawn
        )
        await rows(bot, sid, 4)
    await until(lambda: _answers(sim, mark, 2), "both answers sent")
    assert sends(sim, mark) == ["周六见", "快递今天到"]
    quotes = _quoted(sim, mark)
    assert quotes[0] == str(first)
    assert quotes[1] != str(withdrawn)


async def _answers(sim: OneBotSim, mark: int, n: int) -> bool:
    return len(sends(sim, mark)) >= n
