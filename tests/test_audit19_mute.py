"""Audit 19 (mute): the QQ side refuses or fails the bot.

- Muted in a group (its own group_ban, or the whole group's), a member asks: the send fails.
  One attempt, one log line, no traceback; the answer that never reached the group is not
  remembered as said (the model reads it as withdrawn); the turn's usage is counted; once
  the mute is lifted the bot answers as before.
- Kicked (group_decrease kick_me) or the group disbanded: later connects do not ask that
  group's history (nor count it against the backfill's probes), nor answer its questions;
  its memory stays.
- A failed send and then the connection dropped: the reconnect does not answer again.
- send_group_msg never answered: the turn ends at the adapter's API timeout, the next
  question is answered, nothing is stored twice; a merged forward that timed out is not sent
  again as plain text.

bot.py as a subprocess, the OneBot simulator over the real reverse WebSocket, the scripted
model on real HTTP; what the bot stored is read from its SQLite file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from nonebot_plugin_memsum.errors import NotDelivered
from nonebot_plugin_memsum.onebot.notices import left_group
from nonebot_plugin_memsum.store import SearchQuery, Store
from nonebot_plugin_memsum.types import WITHDRAWN_TEXT, Message, shown_content
from tests.fakes.agent import GROUP, GROUP_ENTRY, MakeRuntime, fill, user
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, back, connected, group_sid, query, restart, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import (
    FORWARD_ACTIONS,
    SEND_ACTIONS,
    ActionFailedError,
    OneBotSim,
    at,
    plain_text,
    text,
)

pytestmark = pytest.mark.e2e

PERSONA = "你是禁言测试群里的助手小记。"
API_TIMEOUT = 2.0
"""NoneBot's API_TIMEOUT: how long the adapter waits for an API call's answer."""

# What a send into a group the account cannot speak in answers, by implementation:
# - NapCat (src/onebot/action/OneBotAction.ts `websocketHandle`: status "failed", retcode 1200,
#   `message` and `wording` the error's text). The error is the NT kernel's sendMsg result, as
#   NapNeko/NapCatQQ issue #600 shows it for a group the account was removed from (result 110,
#   「发送失败，你已被移出该群，请重新加群。」) and issue #199 for a muted account; QQ's result
#   for a muted sender is 120 (mamoe/mirai issue #168, takayama-lily/node-onebot issue #33).
NAPCAT_MUTED = (
    "EventChecker Failed: NTEvent serviceAndMethod:NodeIKernelMsgService/sendMsg"
    ' ListenerName:NodeIKernelMsgListener/onMsgInfoListUpdate EventRet:\n{\n    "result": 120,\n'
    '    "errMsg": ""\n}\n'
)
NAPCAT_KICKED = NAPCAT_MUTED.replace('"result": 120', '"result": 110').replace(
    '"errMsg": ""', '"errMsg": "发送失败，你已被移出该群，请重新加群。"'
)
# - Lagrange (Lagrange.OneBot/Core/Operation/Message/SendGroupMessageOperation.cs): no sequence
#   back → `new OneBotResult(null, (int)result.Result, "failed")`, the retcode QQ's result (120).
LAGRANGE_MUTED = (120, "")
# - go-cqhttp (coolq/api.go `CQSendGroupMessage`): `Failed(100, "SEND_MSG_API_ERROR",
#   "请参考 go-cqhttp 端输出")` when the message id comes back -1 (muted, or risk control).
GOCQ_FAILED = (100, "请参考 go-cqhttp 端输出")


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> AsyncIterator[BotProcess]:
    env = {
        "MEMSUM_MODELS": json.dumps([llm.model_config()]),
        "MEMSUM_PERSONA": PERSONA,
        "API_TIMEOUT": str(API_TIMEOUT),
    }
    async with BotProcess(tmp_path_factory.mktemp("mute"), env=env, log_level="INFO") as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


@pytest.fixture(autouse=True)
def fresh_model(llm: ScriptedLLM) -> Iterator[None]:
    llm.reset()
    llm.on_request(lambda body: None if is_chat(body) else Reply("【最近在聊什么】\n闲聊"))
    try:
        yield
    finally:
        llm.reset()


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0] == {"role": "system", "content": PERSONA}


class Muted:
    """Send actions into the muted groups fail as `failure` (retcode, message) says; the
    rest go through the simulator's own responders."""

    def __init__(self, sim: OneBotSim, failure: tuple[int, str]) -> None:
        self.groups: set[int] = set()
        self.failure = failure
        for action in (*SEND_ACTIONS, *FORWARD_ACTIONS):
            sim.responders[action] = self._wrap(sim.responders[action])

    def _wrap(self, inner: Any) -> Any:
        def respond(params: dict[str, Any]) -> Any:
            if int(params.get("group_id") or 0) in self.groups:
                raise ActionFailedError(*self.failure)
            return inner(params)

        return respond


@pytest.fixture
def muted(sim: OneBotSim) -> Iterator[Muted]:
    saved = dict(sim.responders)
    try:
        yield Muted(sim, (1200, NAPCAT_MUTED))
    finally:
        sim.responders.clear()
        sim.responders.update(saved)


def sends_to(sim: OneBotSim, group: int, mark: int) -> list[str]:
    """What the bot tried to send into the group since call `mark` (forwards as one text)."""
    return [
        plain_text(c.params.get("message") or c.params.get("messages") or "")
        for c in sim.calls[mark:]
        if c.action in SEND_ACTIONS | FORWARD_ACTIONS and int(c.params.get("group_id") or 0) == group
    ]


async def sends_of_a_long_answer(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, group: int, long: str
) -> list[str]:
    """The send actions the bot called for a member's question the model answers with `long`
    (over MEMSUM_FORWARD_THRESHOLD: a merged forward first), once its turn ended."""
    llm.push(Reply(long))
    mark = len(sim.calls)
    await sim.group_message(group, 20002, [at(SELF_ID), text(" 详细说说")])
    await turn_ended(bot, group_sid(group), 1)
    await asyncio.sleep(1.0)  # a copy would come now
    return [c.action for c in sim.calls[mark:] if c.action in SEND_ACTIONS | FORWARD_ACTIONS]


async def turn_ended(bot: BotProcess, sid: str, n: int) -> None:
    """Until the session's `n`-th turn logged its line."""

    async def ended() -> bool:
        return bot.log(all_runs=True).count(f"memsum: turn {sid} ") >= n

    await until(ended, f"turn {n} of {sid}", 30)


async def messages(bot: BotProcess, sid: str) -> list[tuple[str, str, int]]:
    sql = "SELECT role, content, withdrawn FROM messages WHERE session_id = ? ORDER BY id"
    return [(str(r[0]), str(r[1]), int(r[2])) for r in await query(bot.db_path, sql, sid)]


async def chat_usage(bot: BotProcess, sid: str) -> int:
    """The session's chat rows in the ledger, once there is one (written within a second)."""
    count = 0

    async def written() -> bool:
        nonlocal count
        sql = "SELECT COUNT(*) FROM ledger WHERE session_id = ? AND purpose = '对话'"
        count = int((await query(bot.db_path, sql, sid))[0][0])
        return count > 0

    await until(written, f"the ledger of {sid}")
    return count


def chat_requests(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [b for b in list(llm.requests) if is_chat(b)]


# ---- 1. muted --------------------------------------------------------------------------


async def test_muted_bot_answer_fails_once_is_not_remembered_as_said_and_it_answers_after_the_lift(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, muted: Muted
) -> None:
    group, sid = 61001, group_sid(61001)
    sim.add_member(group, 20001, "甲")
    await sim.notice("group_ban", group_id=group, user_id=SELF_ID, operator_id=20009, duration=600)
    muted.groups.add(group)
    llm.push(Reply("禁言中的回答 mq1x"))
    log_before = bot.log(all_runs=True).count("memsum: could not send")
    mark = len(sim.calls)
    await sim.group_message(group, 20001, [at(SELF_ID), text(" 第一个问题")])
    await turn_ended(bot, sid, 1)
    await asyncio.sleep(1.0)  # a retry would come now

    assert sends_to(sim, group, mark) == ["禁言中的回答 mq1x"]  # one attempt, no retry
    log = bot.log(all_runs=True)
    assert log.count("memsum: could not send") == log_before + 1
    assert "Traceback" not in log
    # Counted against the place's usage (and so its daily cap), though nothing went out.
    assert await chat_usage(bot, sid) == 1
    # Kept (the owner sees what the model said), but read back as withdrawn: the group never saw it.
    assert ("assistant", "禁言中的回答 mq1x", 1) in await messages(bot, sid)

    await sim.notice(
        "group_ban", group_id=group, user_id=SELF_ID, operator_id=20009, sub_type="lift_ban", duration=0
    )
    muted.groups.clear()
    llm.push(Reply("解禁后的回答"))
    mark = len(sim.calls)
    await sim.group_message(group, 20001, [at(SELF_ID), text(" 第二个问题")])
    call = await sim.wait_call(set(SEND_ACTIONS), after=mark)
    assert plain_text(call.params["message"]) == "解禁后的回答"
    history = [m.get("content") for m in chat_requests(llm)[-1]["messages"][1:]]
    assert "禁言中的回答 mq1x" not in history
    assert history[history.index("[甲(20001)] @小记(10000) 第一个问题") + 1] == WITHDRAWN_TEXT


async def test_whole_group_mute_long_answer_tries_forward_and_plain_once_each(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, muted: Muted
) -> None:
    # 全员禁言 (user_id 0) on Lagrange: the merged forward fails, the plain text too, once each.
    group, sid = 61002, group_sid(61002)
    muted.failure = LAGRANGE_MUTED
    await sim.notice("group_ban", group_id=group, user_id=0, operator_id=20009, duration=-1)
    muted.groups.add(group)
    long = "很长的回答。" * 80
    assert await sends_of_a_long_answer(bot, sim, llm, group, long) == ["send_group_forward_msg", "send_msg"]
    assert ("assistant", long, 1) in await messages(bot, sid)
    assert "Traceback" not in bot.log(all_runs=True)


async def test_muted_bot_over_its_daily_cap_tries_the_notice_once_without_a_traceback(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, muted: Muted
) -> None:
    group, sid = 61003, group_sid(61003)
    await owner_says(sim, group, "/限额 1")
    await sim.notice("group_ban", group_id=group, user_id=SELF_ID, operator_id=10001, duration=3600)
    muted.groups.add(group)
    llm.push(Reply("超额前的回答"))
    await sim.group_message(group, 20003, [at(SELF_ID), text(" 问一")])
    await turn_ended(bot, sid, 1)
    assert await chat_usage(bot, sid) == 1  # the failed answer's tokens count for the cap

    mark = len(sim.calls)
    await sim.group_message(group, 20003, [at(SELF_ID), text(" 问二")])  # over the cap: the notice
    await sim.wait_call(set(SEND_ACTIONS), after=mark)
    await sim.group_message(group, 20003, [at(SELF_ID), text(" 问三")])  # noticed already: quiet
    await until(lambda: _stored(bot, sid, "问三"), "the third question stored")
    await asyncio.sleep(1.0)
    assert sends_to(sim, group, mark) == ["今天的额度已经用完了，明天再聊吧。"]
    assert len(chat_requests(llm)) == 1
    log = bot.log(all_runs=True)
    assert "Traceback" not in log
    assert log.count(f"memsum: could not send the cap notice to {sid}") == 1


async def _stored(bot: BotProcess, sid: str, words: str) -> bool:
    return any(words in content for _, content, _ in await messages(bot, sid))


async def test_an_unsent_answer_reads_as_withdrawn_and_is_not_found_by_a_search(store: Store) -> None:
    sid = "onebot:10000:group:61010"
    await store.append(sid, Message(role="user", content="[甲(20001)] 密码是多少", ts=1.0))
    answer = await store.append(sid, Message(role="assistant", content="密码是 swordfish", ts=2.0))
    assert answer.id is not None
    await store.mark_unsent(sid, answer.id)
    last = (await store.get_history(sid))[-1]
    assert (last.withdrawn, shown_content(last)) == (True, WITHDRAWN_TEXT)
    assert await store.search(SearchQuery(sid, "swordfish")) == []


async def test_a_plugin_reply_that_raises_not_delivered_leaves_the_answer_withdrawn(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    # api.run_turn's `reply` from another plugin: NotDelivered is how it says nothing went out.
    rt = await make_rt()
    await fill(rt, GROUP, [user("@小记(10000) 在吗")])
    llm.push(Reply("在的"))

    async def muted(text: str) -> None:
        raise NotDelivered("muted")

    assert await rt.agent.run_turn(GROUP.id, muted, GROUP_ENTRY) == "replied"
    last = (await rt.store.get_history(GROUP.id))[-1]
    assert (last.role, last.content, last.withdrawn) == ("assistant", "在的", True)


# ---- 2. kicked, or the group disbanded ---------------------------------------------------

# go-cqhttp (coolq/api.go `CQGetGroupMessageHistory`): a group the account is not in answers
# `Failed(100, "GROUP_NOT_FOUND", "群聊不存在")`; NapCat answers retcode 1200 (CHANGELOG, audit 5).
GOCQ_NO_GROUP = (100, "群聊不存在")


@pytest.mark.parametrize(
    ("group", "gone"),
    [
        (
            61007,
            {
                "notice_type": "group_decrease",
                "sub_type": "kick_me",
                "user_id": SELF_ID,
                "operator_id": 20007,
            },
        ),
        (
            61008,
            {"notice_type": "group_decrease", "sub_type": "disband", "user_id": 20008, "operator_id": 20008},
        ),
    ],
)
async def test_a_group_the_bot_left_is_neither_backfilled_nor_answered_on_later_connects(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, group: int, gone: dict[str, Any]
) -> None:
    sid = group_sid(group)
    saved = dict(sim.responders)
    # A question left unanswered (over the day's cap, lifted since): a reconnect's resume answers such.
    await owner_says(sim, group, "/限额 1")
    llm.push(Reply("被踢前的回答"))
    await sim.group_message(group, 20007, [at(SELF_ID), text(" 被踢前")])
    await turn_ended(bot, sid, 1)
    await chat_usage(bot, sid)
    mark = len(sim.calls)
    await sim.group_message(group, 20007, [at(SELF_ID), text(" 还在吗")])
    await sim.wait_call(set(SEND_ACTIONS), after=mark)  # the cap notice
    await owner_says(sim, group, "/限额 无")
    kept, chats = await messages(bot, sid), len(chat_requests(llm))
    notice_type = gone.pop("notice_type")
    await sim.notice(notice_type, group_id=group, **gone)
    await until(lambda: _count(bot, sid, len(kept) + 1), "the notice stored")

    def history(params: dict[str, Any]) -> Any:
        if int(params.get("group_id") or 0) == group:
            raise ActionFailedError(*GOCQ_NO_GROUP)
        return saved["get_group_msg_history"](params)

    sim.responders["get_group_msg_history"] = history
    try:
        for _ in range(2):
            mark = len(sim.calls)
            await sim.close()
            await back(bot, sim, restart=False)
            await asyncio.sleep(1.0)  # the resume's answer would come now
            asked = [c for c in sim.calls[mark:] if c.action == "get_group_msg_history"]
            assert asked  # the other groups are still fetched
            assert all(int(c.params["group_id"]) != group for c in asked)
            assert sends_to(sim, group, mark) == []
        assert len(chat_requests(llm)) == chats
    finally:
        sim.responders.clear()
        sim.responders.update(saved)
    # Its memory stays until the owner clears it.
    assert (await messages(bot, sid))[: len(kept)] == kept


@pytest.mark.parametrize(
    ("payload", "left"),
    [
        ({"notice_type": "group_decrease", "sub_type": "kick_me", "user_id": SELF_ID}, True),
        ({"notice_type": "group_decrease", "sub_type": "leave", "user_id": SELF_ID}, True),
        ({"notice_type": "group_decrease", "sub_type": "disband", "user_id": 20001}, True),
        ({"notice_type": "group_dismiss", "user_id": 20001}, True),  # LLOneBot
        ({"notice_type": "group_decrease", "sub_type": "kick", "user_id": 20001}, False),
        ({"notice_type": "group_ban", "sub_type": "ban", "user_id": SELF_ID}, False),
    ],
)
def test_which_notices_say_the_account_left_its_group(payload: dict[str, Any], left: bool) -> None:
    assert left_group({"group_id": 61009, **payload}, str(SELF_ID)) is left


async def owner_says(sim: OneBotSim, group: int, command: str) -> None:
    """A command of the owner (SUPERUSERS) in the group, once its answer went out."""
    mark = len(sim.calls)
    await sim.group_message(group, 10001, command)
    await sim.wait_call(set(SEND_ACTIONS), after=mark)


async def _count(bot: BotProcess, sid: str, n: int) -> bool:
    return len(await messages(bot, sid)) >= n


# ---- 3. a failed send, then the connection gone ---------------------------------------


async def test_a_question_whose_answer_failed_is_not_answered_again_on_reconnect_or_restart(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, muted: Muted
) -> None:
    # go-cqhttp's failure, and the implementation drops the connection right after it.
    group, sid = 61004, group_sid(61004)
    muted.failure = GOCQ_FAILED
    muted.groups.add(group)
    dropped: list[asyncio.Task[None]] = []
    refuse = sim.responders["send_msg"]

    def refuse_and_drop(params: dict[str, Any]) -> Any:
        if not dropped:
            dropped.append(asyncio.get_running_loop().create_task(_drop_soon(sim)))
        return refuse(params)

    sim.responders["send_msg"] = refuse_and_drop
    llm.push(Reply("发不出去的回答"))
    mark = len(sim.calls)
    await sim.group_message(group, 20004, [at(SELF_ID), text(" 在吗")])
    await asyncio.wait_for(sim.disconnected.wait(), 15)
    await turn_ended(bot, sid, 1)

    await back(bot, sim, restart=False)  # reconnected, the backfill and the resume done
    await asyncio.sleep(1.0)  # a second answer would come now
    await restart(bot, sim)
    await until(lambda: _backfilled(bot), "the backfill after the restart")
    await asyncio.sleep(1.0)

    assert sends_to(sim, group, mark) == ["发不出去的回答"]
    assert len(chat_requests(llm)) == 1
    assert [m for m in await messages(bot, sid) if m[0] == "assistant"] == [
        ("assistant", "发不出去的回答", 1)
    ]


async def _drop_soon(sim: OneBotSim) -> None:
    await asyncio.sleep(0.2)  # after the failure went back
    await sim.close()


async def _backfilled(bot: BotProcess) -> bool:
    return "memsum: backfill of" in bot.log()


# ---- 4. a send the implementation never answers ---------------------------------------


@pytest.fixture
def hanging(sim: OneBotSim) -> Iterator[set[str]]:
    """The send actions named in the set never answer, until the test ends."""
    saved = dict(sim.responders)
    actions: set[str] = set()
    released = asyncio.Event()

    def wrap(action: str, inner: Any) -> Any:
        async def respond(params: dict[str, Any]) -> Any:
            if action in actions:
                await released.wait()
            return inner(params)

        return respond

    for action in (*SEND_ACTIONS, *FORWARD_ACTIONS):
        sim.responders[action] = wrap(action, sim.responders[action])
    try:
        yield actions
    finally:
        released.set()
        sim.responders.clear()
        sim.responders.update(saved)


async def test_a_send_never_answered_ends_the_turn_at_the_api_timeout_and_the_next_question_is_answered(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, hanging: set[str]
) -> None:
    group, sid = 61005, group_sid(61005)
    hanging.add("send_msg")
    llm.push(Reply("没有回音的回答"))
    await sim.group_message(group, 20005, [at(SELF_ID), text(" 问题甲")])
    await turn_ended(bot, sid, 1)  # bounded by API_TIMEOUT
    assert f"memsum: could not send a reply to {sid}: NetworkError" in bot.log()

    hanging.clear()
    llm.push(Reply("第二个回答"))
    mark = len(sim.calls)
    await sim.group_message(group, 20005, [at(SELF_ID), text(" 问题乙")])
    call = await sim.wait_call(set(SEND_ACTIONS), after=mark)
    assert plain_text(call.params["message"]) == "第二个回答"
    await turn_ended(bot, sid, 2)
    # Each once; the first answer stays as said: it may have gone out, the implementation never said.
    assert [m for m in await messages(bot, sid) if m[0] != "notice"] == [
        ("user", "[用户20005(20005)] @小记(10000) 问题甲", 0),
        ("assistant", "没有回音的回答", 0),
        ("user", "[用户20005(20005)] @小记(10000) 问题乙", 0),
        ("assistant", "第二个回答", 0),
    ]
    assert "Traceback" not in bot.log(all_runs=True)


async def test_a_merged_forward_never_answered_is_not_sent_again_as_plain_text(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, hanging: set[str]
) -> None:
    # NapCat answered late for a send that went out (NapNeko/NapCatQQ issue #932): a plain
    # copy after the timeout would say it twice.
    group, sid = 61006, group_sid(61006)
    hanging.add("send_group_forward_msg")
    long = "一段很长的回答。" * 60
    assert await sends_of_a_long_answer(bot, sim, llm, group, long) == ["send_group_forward_msg"]
    assert ("assistant", long, 0) in await messages(bot, sid)
