"""Outside audit 10 (lo): three gaps the last audit noticed and left open.

1. Lagrange's message id 0: a send answered `message_id: 0` is a send with no id, so its echo
   (the same words under their real id) is known by its text, and nothing else (two members'
   messages, a withdrawal, a quote, the backfill's dedup) takes 0 for a message's id.
2. Gemini's retry delay: its 429 names how long to wait in a `google.rpc.RetryInfo`; the
   client waits that long (within the bound it gives `Retry-After`) instead of its back-off.
3. The backfill stores what the bot account said while bot.py was down (the owner typing on
   it from a phone) as the bot's own words, in order, once, never twice with what the plugin
   itself sent, nothing in a 关 place, starting no turn; a restart in the middle adds nothing.

Through bot.py as a real process with the OneBot simulator over the real WebSocket, the
scripted OpenAI-compatible server and the bot's SQLite file; the provider scenario through the
real HTTP client. Each fixture that imitates another system cites its source above it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm.client import LLMClient, RetryPolicy
from nonebot_plugin_memsum.llm.errors import LLMRateLimited
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, away, back, connected, group_sid, query, rows, until, wait_log, wait_rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import OneBotSim, at, text
from tests.test_audit8_y import OTHER_PLUGIN, PYPROJECT

PERSONA = "你是审计十群里的助手小记。"
ANSWER = "这是小记的回答"
OWNER = 10001


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def chats(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [r for r in llm.requests if is_chat(r)]


async def settled(bot: BotProcess, sid: str, n: int, quiet: float = 0.8) -> list[tuple[str, str]]:
    """The session's rows once it has `n` and nothing more came for a while."""
    await wait_rows(bot, sid, n)
    await asyncio.sleep(quiet)
    return await rows(bot, sid)


async def _true(value: bool) -> bool:
    return value


@pytest.fixture(scope="module")
async def llm_answers(llm: ScriptedLLM) -> AsyncIterator[ScriptedLLM]:
    llm.reset()
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    yield llm
    llm.reset()


def bot_env(llm: ScriptedLLM, **extra: str) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA, **extra}


@pytest.fixture(scope="module")
async def bot(
    tmp_path_factory: pytest.TempPathFactory, llm_answers: ScriptedLLM
) -> AsyncIterator[BotProcess]:
    workdir = tmp_path_factory.mktemp("audit10lo")
    (workdir / "plugins").mkdir()
    (workdir / "plugins" / "signin.py").write_text(OTHER_PLUGIN, "utf-8")
    (workdir / "pyproject.toml").write_text(PYPROJECT, "utf-8")
    async with BotProcess(workdir, env=bot_env(llm_answers)) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        await wait_log(bot, "memsum: event dispatch:")
        yield s


# ---- 1. Lagrange's message id 0 -----------------------------------------------------------------
# Lagrange.OneBot answered every send action with `message_id: 0` from its first send operations
# (LagrangeDev/Lagrange.Core 881bbfdc, 2023-10-25) until beca0917 (2024-02-16, "Fixed Message Id
# for message related operations"): Lagrange.OneBot/Core/Operation/Message/SendMessageOperation.cs,
# SendGroupMessageOperation.cs, SendPrivateMessageOperation.cs ended in
# `return new OneBotResult(new OneBotMessageResponse(0), 0, "ok")`. The same builds reported the
# account's own group messages, the echo of its sends among them, unless `Message:IgnoreSelf`
# (Lagrange.OneBot/Message/MessageService.cs OnGroupMessageReceived) as a plain group `message`
# (Core/Entity/Message/OneBotGroupMsg.cs) under the message's real id, `MessageRecord.MessageHash`.
# Since then an id is `CalcMessageHash(msgId, seq)` = `(ushort)seq << 16 | (ushort)msgId`
# (Database/MessageRecord.cs), 0 when both low halves are 0; a send with no sequence fails with
# retcode 9000 (c79f814b, #696).
def lagrange_echo(message_id: int, group_id: int, message: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "post_type": "message",
        "message_type": "group",
        "sub_type": "normal",
        "message_id": message_id,
        "group_id": group_id,
        "user_id": SELF_ID,
        "anonymous": None,
        "message": message,
        "raw_message": "",
        "font": 0,
        "sender": {"user_id": SELF_ID, "nickname": "小记", "card": "", "level": "0", "role": "member"},
    }


Responder = Callable[[dict[str, Any]], Any]


@contextmanager
def lagrange_sends(sim: OneBotSim, *, echo: bool = True) -> Iterator[list[int]]:
    """Every send answered as Lagrange.OneBot before beca0917: `message_id: 0`, and (with
    IgnoreSelf off) the echo of a group message just after the response, under its real id.
    Yields the real ids echoed."""
    echoed: list[int] = []
    saved = {a: sim.responders[a] for a in ("send_msg", "send_group_msg", "send_private_msg")}

    def lagrange(base: Responder) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        async def respond(params: dict[str, Any]) -> Any:
            data = base(params)
            sent = sim.messages[int(data["message_id"])]
            if echo and sent.message_type == "group" and sent.group_id is not None:
                payload = lagrange_echo(sent.message_id, sent.group_id, sent.message)
                echoed.append(sent.message_id)
                asyncio.get_running_loop().call_later(
                    0.05, lambda: asyncio.ensure_future(sim.send_event(payload))
                )
            return {**data, "message_id": 0}

        return respond

    for action, base in saved.items():
        sim.responders[action] = lagrange(base)
    try:
        yield echoed
    finally:
        sim.responders.update(saved)


async def test_an_answer_sent_under_message_id_0_is_stored_once_when_its_echo_comes_under_its_real_id(
    bot: BotProcess, sim: OneBotSim, llm_answers: ScriptedLLM
) -> None:
    group = 10101
    with lagrange_sends(sim) as echoed:
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 在吗")], nickname="甲")
        await until(lambda: _true(len(echoed) == 1), "the answer echoed")
        await sim.group_message(group, 20001, "签到", nickname="甲")  # another plugin's send: id 0 too
        await until(lambda: _true(len(echoed) == 2), "the other plugin's send echoed")
        await sim.group_message(group, 20001, "好的", nickname="甲")
        stored = await settled(bot, group_sid(group), 5)
    assert stored == [
        ("user", f"[甲(20001)] @小记({SELF_ID}) 在吗"),
        ("assistant", ANSWER),
        ("user", "[甲(20001)] 签到"),
        ("assistant", "@甲(20001) 签到成功，积分 +10[图片]"),
        ("user", "[甲(20001)] 好的"),
    ]
    ids = await query(
        bot.db_path, "SELECT platform_id FROM messages WHERE session_id = ? ORDER BY id", group_sid(group)
    )
    assert "0" not in [r[0] for r in ids]


# Members' messages under id 0: `CalcMessageHash` above is 0 for a message whose sequence and
# random id both end in 0x0000 (one in 2^32), and a group_recall notice then names 0 too
# (Lagrange.OneBot/Core/Notify/NotifyService.cs OnGroupRecallEvent: `MessageRecord.CalcMessageHash
# (e.Random, e.Sequence)`). Two such messages are two messages, and a withdrawal of 0 marks none.
async def test_two_members_messages_under_id_0_are_both_stored_and_a_recall_of_0_marks_neither(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 10102
    await sim.group_message(group, 20001, "第一句，编号零", nickname="甲", message_id=0)
    await sim.group_message(group, 20002, "第二句，也是零", nickname="乙", message_id=0)
    await sim.notice("group_recall", group_id=group, user_id=20002, operator_id=20002, message_id=0)
    await sim.group_message(group, 20001, "第三句", nickname="甲")
    stored = await settled(bot, group_sid(group), 4)
    assert stored == [
        ("user", "[甲(20001)] 第一句，编号零"),
        ("user", "[乙(20002)] 第二句，也是零"),
        ("notice", "乙(20002) 撤回了一条消息"),
        ("user", "[甲(20001)] 第三句"),
    ]
    marks = await query(
        bot.db_path,
        "SELECT platform_id, withdrawn FROM messages WHERE session_id = ? ORDER BY id",
        group_sid(group),
    )
    assert [(r[0], r[1]) for r in marks][:2] == [(None, 0), (None, 0)]


# The backfill under id 0: a fetched message under 0 cannot be told from one stored already
# (Lagrange's history answers each message under its `CalcMessageHash`, GetGroupMessageHistory
# Operation.cs, as its events do): it is left out, not stored again on every reconnect.
async def test_a_fetched_message_under_id_0_is_not_stored_again_on_every_reconnect(
    tmp_path_factory: pytest.TempPathFactory, llm_answers: ScriptedLLM
) -> None:
    group = 10103
    sid = group_sid(group)
    async with BotProcess(tmp_path_factory.mktemp("audit10lo-zero"), env=bot_env(llm_answers)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await back(bot, sim, restart=False, backfill=False)
        await sim.group_message(group, 20001, "大家好", nickname="甲")
        await wait_rows(bot, sid, 1)
        await away(bot, sim)
        await sim.group_message(group, 20002, "编号零的消息", nickname="乙", message_id=0)
        await sim.group_message(group, 20002, "有编号的消息", nickname="乙")
        await back(bot, sim)
        await sim.close()
        await back(bot, sim, restart=False)
        await sim.group_message(group, 20001, "收尾", nickname="甲")
        assert await settled(bot, sid, 3) == [
            ("user", "[甲(20001)] 大家好"),
            ("user", "[乙(20002)] 有编号的消息"),
            ("user", "[甲(20001)] 收尾"),
        ]
        await sim.close()


# ---- 2. Gemini's retry delay ------------------------------------------------------------------------
# Gemini's 429 carries how long to wait as a `google.rpc.RetryInfo` among the error's `details`
# (googleapis/googleapis google/rpc/error_details.proto: `google.protobuf.Duration retry_delay`,
# in JSON a string of seconds with an "s", fractions allowed), as googleapis/python-genai#1875
# quotes it ("retryDelay": "53s", "Please retry in 53.016342224s.") and Aider-AI/aider#3694
# ("retryDelay": "44s", beside a google.rpc.QuotaFailure); the OpenAI-compatible endpoint
# answers errors as an array of one (n4ze3m/page-assist#406, FuzzAnything/PromptFuzz#42).
def gemini_429(delay: str, *, array: bool = True) -> str:
    error = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing details."
            f" Please retry in {delay[:-1]}.016342224s.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/generate_requests_per_model",
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                            "quotaValue": "10",
                        }
                    ],
                },
                {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": "quota"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
            ],
        }
    }
    return json.dumps([error] if array else error)


class Sleeps(list[float]):
    """The client's waits, recorded instead of waited out."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
async def waits(llm: ScriptedLLM) -> AsyncIterator[tuple[LLMClient, ModelConfig, Sleeps]]:
    sleeps = Sleeps()
    client = LLMClient(timeout=5, sleep=sleeps)
    try:
        yield client, ModelConfig(**llm.model_config()), sleeps
    finally:
        await client.aclose()


MESSAGES = [{"role": "system", "content": "摘要助手"}, {"role": "user", "content": "[甲(20001)] 你好"}]


@pytest.mark.parametrize("array", [True, False], ids=["openai-endpoint-array", "native-object"])
async def test_gemini_429_waits_the_retry_delay_it_names_then_succeeds(
    llm: ScriptedLLM, waits: tuple[LLMClient, ModelConfig, Sleeps], array: bool
) -> None:
    client, model, sleeps = waits
    llm.push(Reply(status=429, raw=gemini_429("7s", array=array)), Reply("好的"))
    result = await client.chat(model, MESSAGES, purpose="摘要")
    assert result.content == "好的"
    assert sleeps == [7.0]  # not the 0.5 s back-off, which only meets the same 429 again


async def test_gemini_retry_delay_longer_than_the_bound_waits_the_bound_as_retry_after_does(
    llm: ScriptedLLM, waits: tuple[LLMClient, ModelConfig, Sleeps]
) -> None:
    client, model, sleeps = waits
    llm.push(*[Reply(status=429, raw=gemini_429("37s"))] * 3)
    with pytest.raises(LLMRateLimited):
        await client.chat(model, MESSAGES, purpose="摘要")
    cap = RetryPolicy().retry_after_cap
    assert sleeps == [cap, cap]


async def test_a_retry_after_header_still_wins_over_the_body(
    llm: ScriptedLLM, waits: tuple[LLMClient, ModelConfig, Sleeps]
) -> None:
    client, model, sleeps = waits
    llm.push(Reply(status=429, raw=gemini_429("9s"), headers={"Retry-After": "2"}), Reply("好的"))
    assert (await client.chat(model, MESSAGES, purpose="摘要")).content == "好的"
    assert sleeps == [2.0]


# ---- 3. The backfill and the bot account's own messages -------------------------------------------
# What the owner types on the bot's account from a phone is, in every implementation's history,
# a message whose sender is the account (NapCat GetGroupMsgHistory.ts answers the account's own
# messages as its other ones, OneBotSim._history does the same; Lagrange's history is the group's
# roaming messages, GetGroupMessageHistoryOperation.cs, sender the account).
async def test_what_the_owner_typed_on_the_bots_account_while_down_is_backfilled_as_the_bots_once(
    tmp_path_factory: pytest.TempPathFactory, llm_answers: ScriptedLLM
) -> None:
    group, off = 10301, 10302
    sid = group_sid(group)
    async with BotProcess(tmp_path_factory.mktemp("audit10lo-own"), env=bot_env(llm_answers)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await back(bot, sim, restart=False, backfill=False)
        await sim.group_message(group, 20001, "大家好", nickname="甲")
        mark = len(sim.calls)
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 在吗")], nickname="甲")
        await wait_rows(bot, sid, 3)  # the answer, sent as the bot's message of the group's history
        await sim.wait_call({"send_msg", "send_group_msg"}, after=mark)  # sent a moment after its row
        mark = len(sim.calls)
        await sim.group_message(group, OWNER, "/记忆模式", nickname="主人")  # its output is no chat
        await sim.wait_call({"send_msg", "send_group_msg"}, after=mark)
        await sim.group_message(off, 20001, "关掉之前", nickname="甲")
        await wait_rows(bot, group_sid(off), 1)
        mark = len(sim.calls)
        await sim.group_message(off, OWNER, "/记忆模式 关", nickname="主人")
        await sim.wait_call({"send_msg", "send_group_msg"}, after=mark)
        chats_before = len(chats(llm_answers))
        await away(bot, sim)
        await sim.group_message(group, 20002, "机器人挂了吗", nickname="乙")
        await sim.group_message(group, SELF_ID, [text("我在修，"), at(20002), text(" 马上好")])
        await sim.group_message(group, 20002, "好", nickname="乙")
        await sim.group_message(off, SELF_ID, "关掉的群里说的")
        await back(bot, sim)
        expected = [
            ("user", "[甲(20001)] 大家好"),
            ("user", f"[甲(20001)] @小记({SELF_ID}) 在吗"),
            ("assistant", ANSWER),
            ("user", "[乙(20002)] 机器人挂了吗"),
            ("assistant", "我在修，@乙(20002) 马上好"),
            ("user", "[乙(20002)] 好"),
        ]
        assert await settled(bot, sid, 6) == expected
        assert await rows(bot, group_sid(off)) == [("user", "[甲(20001)] 关掉之前")]
        assert len(chats(llm_answers)) == chats_before  # the owner's words asked nothing
        # Once more: a reconnect, then a restart, store nothing twice.
        await sim.close()
        await back(bot, sim, restart=False)
        await away(bot, sim)
        await back(bot, sim)
        assert await settled(bot, sid, 6) == expected
        await sim.close()


# The sends of the plugin answered `message_id: 0` (Lagrange.OneBot before beca0917, above) with
# IgnoreSelf on, its default then (Lagrange.OneBot/Resources/appsettings.json `"IgnoreSelf":
# true`): no echo, the answer kept no id, and its copy in the history has its real one.
async def test_the_plugins_answer_sent_under_id_0_is_not_backfilled_again_as_the_bots_words(
    tmp_path_factory: pytest.TempPathFactory, llm_answers: ScriptedLLM
) -> None:
    group = 10303
    sid = group_sid(group)
    async with BotProcess(tmp_path_factory.mktemp("audit10lo-lagrange"), env=bot_env(llm_answers)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await back(bot, sim, restart=False, backfill=False)
        with lagrange_sends(sim, echo=False):
            await sim.group_message(group, 20001, [at(SELF_ID), text(" 在吗")], nickname="甲")
            await wait_rows(bot, sid, 2)
            mark = len(sim.calls)
            await sim.group_message(group, OWNER, "/记忆模式", nickname="主人")
            await sim.wait_call({"send_msg", "send_group_msg"}, after=mark)
            await asyncio.sleep(0.5)  # what went out noted
            await away(bot, sim)
            await sim.group_message(group, SELF_ID, "手机上补一句")
            await back(bot, sim)
        assert await settled(bot, sid, 3) == [
            ("user", f"[甲(20001)] @小记({SELF_ID}) 在吗"),
            ("assistant", ANSWER),
            ("assistant", "手机上补一句"),
        ]
        await sim.close()


# A restart in the middle of the backfill: one group's history is in, the other's fetch still
# waits for the implementation when bot.py is killed. The next start stores the rest, and
# nothing twice.
async def test_a_restart_in_the_middle_of_the_backfill_stores_the_bots_words_once(
    tmp_path_factory: pytest.TempPathFactory, llm_answers: ScriptedLLM
) -> None:
    first, slow = 10304, 10305
    async with BotProcess(tmp_path_factory.mktemp("audit10lo-middle"), env=bot_env(llm_answers)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await back(bot, sim, restart=False, backfill=False)
        for group in (first, slow):
            await sim.group_message(group, 20001, "早", nickname="甲")
            await wait_rows(bot, group_sid(group), 1)
        await away(bot, sim)
        for group in (first, slow):
            await sim.group_message(group, SELF_ID, "主人在手机上说的")
            await sim.group_message(group, 20001, "收到", nickname="甲")
        history = sim.responders["get_group_msg_history"]
        hold = asyncio.Event()

        async def held(params: dict[str, Any]) -> Any:
            if int(params["group_id"]) == slow:
                await hold.wait()
            return history(params)

        sim.responders["get_group_msg_history"] = held
        await bot.start()
        await sim.connect()
        await wait_rows(bot, group_sid(first), 3)
        await sim.wait_call("get_group_msg_history", predicate=lambda c: int(c.params["group_id"]) == slow)
        await away(bot, sim)
        sim.responders["get_group_msg_history"] = history
        hold.set()
        await back(bot, sim)
        for group in (first, slow):
            assert await settled(bot, group_sid(group), 3, quiet=0.3) == [
                ("user", "[甲(20001)] 早"),
                ("assistant", "主人在手机上说的"),
                ("user", "[甲(20001)] 收到"),
            ]
        await sim.close()


# bot.py killed while its answer's send waits for the implementation's response: the answer
# went out (it is in the group's history, under its id) and is stored, but no id or note of the
# send was kept. The fetched copy is that answer, known by its text, not the owner's words.
async def test_an_answer_whose_send_the_kill_cut_short_is_not_backfilled_a_second_time(
    tmp_path_factory: pytest.TempPathFactory, llm_answers: ScriptedLLM
) -> None:
    group = 10306
    sid = group_sid(group)
    async with BotProcess(tmp_path_factory.mktemp("audit10lo-cut"), env=bot_env(llm_answers)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await back(bot, sim, restart=False, backfill=False)
        send = sim.responders["send_msg"]
        went_out = asyncio.Event()

        async def no_response(params: dict[str, Any]) -> Any:
            data = send(params)  # in the history from now on
            went_out.set()
            await asyncio.sleep(60)
            return data

        sim.responders["send_msg"] = no_response
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 在吗")], nickname="甲")
        await asyncio.wait_for(went_out.wait(), 20)
        await away(bot, sim)
        sim.responders["send_msg"] = send
        await sim.group_message(group, SELF_ID, "手机上补一句")
        await back(bot, sim)
        assert await settled(bot, sid, 3) == [
            ("user", f"[甲(20001)] @小记({SELF_ID}) 在吗"),
            ("assistant", ANSWER),
            ("assistant", "手机上补一句"),
        ]
        await sim.close()


def test_each_part_of_a_long_answer_a_kill_cut_short_is_known_as_sent() -> None:
    """A long answer goes out in plain parts when merged-forward is refused (send.py); killed
    between them, the answer is stored without an id and with no note of its parts. Each part
    the backfill fetches is a piece of it, not the owner's words (test_audit5_m's
    test_a_kill_between_the_parts_of_a_long_answer_sends_none_of_it_again raced on this)."""
    from nonebot_plugin_memsum.onebot.said import IN_PARTS, sent_here_match

    answer = "很长的回答。" * 1200
    sent: list[tuple[str, str | None]] = [("别的命令输出", None), (answer, IN_PARTS)]
    parts = [answer[i : i + 2400] for i in range(0, len(answer), 2400)]
    assert all(sent_here_match(sent, str(900 + n), part) for n, part in enumerate(parts))
    assert not sent_here_match(sent, "999", "主人自己打的字")
    assert sent_here_match(sent, "998", "别的命令输出")  # an exact one is taken out once
    assert not sent_here_match(sent, "997", "别的命令输出")
