"""Outside audit (audit19-priv): private chats as the real OneBot implementations deliver them.

Group temporary sessions (临时会话) in each implementation's shape, the owner's words from
another client on the bot's account, live and fetched on reconnect, the owner's commands in
private, and the backfill of a temp-session partner the implementation will not give the
history of. bot.py runs as a real process with the OneBot simulator on its reverse
WebSocket; what the bot remembered is read from its SQLite file, what it sent from the
simulator's calls. Each payload cites the implementation source it is built from.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import (
    SELF_ID,
    away,
    back,
    connected,
    group_sid,
    private_sid,
    rows,
    until,
    wait_rows,
)
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, ActionFailedError, ApiCall, OneBotSim, plain_text, text

PERSONA = "你是审计十九私聊里的助手小记。"
ANSWER = "小记私聊收到"
OWNER = 10001  # a SUPERUSER of BotProcess


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def env(llm: ScriptedLLM) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}


@pytest.fixture(scope="module")
async def answering(llm: ScriptedLLM) -> AsyncIterator[ScriptedLLM]:
    llm.reset()
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    yield llm
    llm.reset()


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, answering: ScriptedLLM) -> AsyncIterator[BotProcess]:
    async with BotProcess(tmp_path_factory.mktemp("audit19priv"), env=env(answering)) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


def sends(sim: OneBotSim, after: int, **where: Any) -> list[ApiCall]:
    """The send calls since call `after` to the place `where` names."""
    return [
        c
        for c in sim.calls[after:]
        if c.action in SEND_ACTIONS and all(str(c.params.get(k)) == str(v) for k, v in where.items())
    ]


async def settled(bot: BotProcess, sid: str, n: int) -> list[tuple[str, str]]:
    """The session's rows once it holds `n`, and a moment later (nothing more came)."""
    await wait_rows(bot, sid, n)
    await asyncio.sleep(0.8)
    return await rows(bot, sid)


def chat_texts(llm: ScriptedLLM, after: int) -> str:
    """Everything the chat requests since `after` showed the model, as one text."""
    return json.dumps([b["messages"] for b in llm.requests[after:] if is_chat(b)], ensure_ascii=False)


# ---- 1. group temporary sessions --------------------------------------------------------
def temp_event(
    message_id: int, user: int, words: str, sender: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    """A private message of a group temporary session: OneBot v11 (botuniverse/onebot-11
    event/message.md 私聊消息) names its `sub_type` `group`; `fields` are an implementation's own."""
    return {
        "post_type": "message",
        "message_type": "private",
        "sub_type": "group",
        "message_id": message_id,
        "user_id": user,
        "message": [text(words)],
        "raw_message": words,
        "sender": {"user_id": user, **sender},
        **fields,
    }


# NapCat (NapNeko/NapCatQQ af07479 packages/napcat-onebot/api/msg.ts `initializeMessage`,
# `handleTempGroupMessage`; index.ts `handleMsg` sets `target_id = peerUin` for a non-group
# chat): the group the chat came from in `group_id`, `temp_source: 0`, the member's
# nickname, `message_format: "array"`, font 14.
def napcat_temp(message_id: int, user: int, group: int, words: str) -> dict[str, Any]:
    return temp_event(
        message_id,
        user,
        words,
        {"nickname": "临时甲", "card": ""},
        message_seq=message_id,
        real_id=message_id,
        group_id=group,
        temp_source=0,
        target_id=user,
        message_format="array",
        font=14,
    )


# LLOneBot (LLOneBot/LLOneBot c9bd964 src/onebot11/entities.ts, ChatType.TempC2CFromGroup):
# `temp_source: 0`, the group only in `sender.group_id`.
def llonebot_temp(message_id: int, user: int, group: int, words: str) -> dict[str, Any]:
    sender = {"nickname": "临时乙", "card": "", "group_id": group}
    return temp_event(message_id, user, words, sender, message_seq=message_id, temp_source=0, font=14)


# Lagrange.OneBot (LagrangeDev/Lagrange.Core v1 e17fe35 Lagrange.OneBot/Message/
# MessageService.cs `OnTempMessageReceived`, Core/Entity/Message/OneBotPrivateMsg.cs,
# OneBotSender.cs): no group at all; `target_id` left 0, age -1.
def lagrange_temp(message_id: int, user: int, words: str) -> dict[str, Any]:
    sender = {"nickname": "临时丙", "sex": "unknown", "age": -1}
    return temp_event(message_id, user, words, sender, font=0, target_id=0)


async def test_a_temporary_session_is_the_members_own_private_chat_and_the_answer_names_its_group(
    bot: BotProcess, sim: OneBotSim, answering: ScriptedLLM
) -> None:
    group, friend = 79001, 20190
    # The group's memory holds something the temp chat must not see.
    sim.add_member(group, 20191, "群友")
    await sim.group_message(group, 20191, "群文件提取码是 q8848，别外传")
    await wait_rows(bot, group_sid(group), 1)
    await sim.private_message(friend, "我是好友", nickname="好友")
    await wait_rows(bot, private_sid(friend), 2)
    cases = [
        (20191, napcat_temp(89001, 20191, group, "群里看到你，问个问题"), group),
        (20192, llonebot_temp(89002, 20192, group, "我也是从群里来的"), None),
        (20193, lagrange_temp(89003, 20193, "我也想问问"), None),
    ]
    for user, payload, named in cases:
        mark, asked = len(sim.calls), len(answering.requests)
        await sim.send_event(payload)
        said = payload["message"][0]["data"]["text"]
        nickname = payload["sender"]["nickname"]
        assert await settled(bot, private_sid(user), 2) == [
            ("user", f"[{nickname}({user})] {said}"),
            ("assistant", ANSWER),
        ]
        await until(lambda mark=mark, user=user: _true(bool(sends(sim, mark, user_id=user))), "the answer")
        (sent,) = sends(sim, mark, user_id=user)
        # Sent privately to the member. NapCat sends a private message to a non-friend as a
        # temp chat of the `group_id` it is given (packages/napcat-onebot/action/msg/SendMsg.ts
        # `createContext`; without one only if QQ still knows the temp chat): the adapter's
        # send copies the event's group along, and it must not turn the send into a group one.
        assert sent.params.get("message_type") == "private"
        assert str(sent.params.get("user_id")) == str(user)
        assert sent.params.get("group_id") == named
        assert "q8848" not in chat_texts(answering, asked)  # the group's memory stays in the group
    # Nothing of the temp chats went to the group or the friend's chat.
    assert await rows(bot, group_sid(group)) == [("user", "[群友(20191)] 群文件提取码是 q8848，别外传")]
    assert await rows(bot, private_sid(friend)) == [("user", "[好友(20190)] 我是好友"), ("assistant", ANSWER)]


async def _true(value: bool) -> bool:
    return value


# ---- 2. sub_type "other" and the owner's words from another client ------------------------
# OneBot v11 (botuniverse/onebot-11 event/message.md 私聊消息): `sub_type` is `friend`,
# `group` or `other`. go-cqhttp (Mrs4s/go-cqhttp coolq/event.go `privateMessageEvent`)
# reports what the account itself said in a private chat as `post_type: "message_sent"`,
# `sub_type: "friend"`, `user_id` the account, the peer in `target_id`, font 0, the sender
# with sex and age. NapCat does the same for a temp chat (api/msg.ts: `handleTempGroupMessage`
# runs for the account's own message too; `getTempChatInfo` of the account's own uid fails,
# and then `group_id` is the fallback 284840486; index.ts `target_id = peerUin`).
def gocq_sent(message_id: int, peer: int, words: str) -> dict[str, Any]:
    return {
        "post_type": "message_sent",
        "message_type": "private",
        "sub_type": "friend",
        "message_id": message_id,
        "user_id": SELF_ID,
        "target_id": peer,
        "message": [text(words)],
        "raw_message": words,
        "font": 0,
        "sender": {"user_id": SELF_ID, "nickname": "小记", "sex": "unknown", "age": 0},
    }


# Lagrange.OneBot (v1 Lagrange.OneBot/Message/MessageService.cs `OnFriendMessageReceived` with
# Message:IgnoreSelf off, `ConvertToPrivateMsg`) reports it as a plain `message` of the account,
# `target_id` the peer: to the adapter a private message, which asks the bot.
def lagrange_self(message_id: int, peer: int, words: str) -> dict[str, Any]:
    return {
        **gocq_sent(message_id, peer, words),
        "post_type": "message",
        "sender": {"user_id": SELF_ID, "nickname": "小记", "sex": "unknown", "age": -1},
    }


def napcat_temp_sent(message_id: int, peer: int, words: str) -> dict[str, Any]:
    payload = napcat_temp(message_id, SELF_ID, 284840486, words)
    payload.update(post_type="message_sent", message_sent_type="self", target_id=peer)
    payload["sender"] = {"user_id": SELF_ID, "nickname": "临时会话", "card": ""}
    return payload


async def test_the_owners_words_from_another_client_are_the_bots_once_and_other_is_a_private_chat(
    bot: BotProcess, sim: OneBotSim, answering: ScriptedLLM
) -> None:
    friend, temp, other = 20291, 20292, 20293
    mark, asked = len(sim.calls), len(answering.requests)
    await sim.send_event(gocq_sent(89101, friend, "周六的聚会改到周日了"))
    await sim.send_event(gocq_sent(89101, friend, "周六的聚会改到周日了"))  # reported twice
    await sim.send_event(napcat_temp_sent(89102, temp, "你好，群里说的事我看到了"))
    await sim.send_event(lagrange_self(89104, friend, "记得带伞"))
    assert await settled(bot, private_sid(friend), 2) == [
        ("assistant", "周六的聚会改到周日了"),
        ("assistant", "记得带伞"),
    ]
    assert await settled(bot, private_sid(temp), 1) == [("assistant", "你好，群里说的事我看到了")]
    # Never a question of a member: nothing asked the model, nothing sent, no session of the
    # bot with itself nor of the fallback group.
    assert sends(sim, mark, user_id=friend) == sends(sim, mark, user_id=temp) == []
    assert len(answering.requests) == asked
    assert await rows(bot, private_sid(SELF_ID)) == []
    assert await rows(bot, group_sid(284840486)) == []
    # A member's private message of sub_type "other" is a private chat like any.
    payload = {**gocq_sent(89103, SELF_ID, "请问在吗"), "post_type": "message", "sub_type": "other"}
    payload.update(user_id=other, sender={"user_id": other, "nickname": "其他", "sex": "unknown", "age": 0})
    await sim.send_event(payload)
    assert await settled(bot, private_sid(other), 2) == [
        ("user", "[其他(20293)] 请问在吗"),
        ("assistant", ANSWER),
    ]


# ---- 2b. the owner's words fetched on reconnect ------------------------------------------
# The simulator answers the history actions as NapCat does (OneBotSim._history cites it): the
# account's own messages with `post_type: "message_sent"` and, in a private chat, no
# `target_id` (NapCat sets it only on live events, packages/napcat-onebot/index.ts `handleMsg`).
async def test_what_the_owner_typed_while_the_bot_was_down_is_fetched_as_the_bots_words_where_said(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    peer, group = 20391, 79201
    sid = private_sid(peer)
    async with BotProcess(tmp_path / "bot", env=env(answering)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        try:
            await back(bot, sim, restart=False, backfill=False)
            await sim.private_message(peer, "明天几点出发", nickname="阿伟")
            await sim.group_message(group, 20392, "周末谁组织", nickname="群友")
            await wait_rows(bot, sid, 2)
            await wait_rows(bot, group_sid(group), 1)
            await away(bot, sim)
            # The owner answers on the phone, on the bot's account.
            sim._store("private", sim._self_sender(), [text("八点，别迟到")], None, user_id=peer)
            await sim.group_message(group, SELF_ID, "我来组织")
            await back(bot, sim)
            await sim.private_message(peer, "好的", nickname="阿伟")

            async def answered() -> bool:
                found = await rows(bot, sid)
                return len(found) >= 4 and found[-1] == ("assistant", ANSWER)

            await until(answered, "the answer to 好的")
            await asyncio.sleep(0.8)
            stored = await rows(bot, sid)
            in_group = await rows(bot, group_sid(group))
            alone = await rows(bot, private_sid(SELF_ID))
        finally:
            await sim.close()
    # Stored once, as the bot's, where it was said; the owner's words ask nothing.
    assert stored == [
        ("user", "[阿伟(20391)] 明天几点出发"),
        ("assistant", ANSWER),
        ("assistant", "八点，别迟到"),
        ("user", "[阿伟(20391)] 好的"),
        ("assistant", ANSWER),
    ]
    assert in_group == [("user", "[群友(20392)] 周末谁组织"), ("assistant", "我来组织")]
    assert alone == []  # never a chat of the bot with itself


# ---- 3. commands in private, a temp chat's group named or not ----------------------------
async def test_commands_in_a_temp_chat_act_on_that_chat_and_a_group_admins_change_nothing(
    tmp_path: Path,
) -> None:
    group, admin = 79301, 20391
    async with BotProcess(tmp_path / "bot", env={"MEMSUM_GROUP_ADMIN_COMMANDS": "true"}) as bot:
        async with connected(bot) as sim:
            sim.add_member(group, admin, "管理", role="admin")
            sim.add_member(group, OWNER, "主人")

            async def said(event: Awaitable[object], *, to: dict[str, Any]) -> str:
                """What the bot answers `event` with where `to` says, "" when nothing."""
                mark = len(sim.calls)
                await event
                try:
                    call = await sim.wait_call(
                        set(SEND_ACTIONS),
                        after=mark,
                        timeout=3,
                        predicate=lambda c: all(str(c.params.get(k)) == str(v) for k, v in to.items()),
                    )
                except TimeoutError:
                    return ""
                return plain_text(call.params["message"])

            # A group admin may use /记忆模式 in the group; in a temp chat started from it the
            # message is a private one, where only the owner's commands count: no answer, no
            # change, nothing stored, though the event names the group.
            for n, words in enumerate(("/记忆模式 关", "/人设 你是一只猫", "/清除 上下文")):
                temp = sim.send_event(napcat_temp(89301 + n, admin, group, words))
                assert await said(temp, to={"user_id": admin}) == ""
            assert await rows(bot, private_sid(admin)) == []
            shown = await said(sim.group_message(group, admin, "/记忆模式"), to={"group_id": group})
            assert shown.startswith("本群模式：开")
            # The owner's command in a temp chat sets that chat (本会话), not the group, and the
            # reply goes back into the temp chat.
            mark = len(sim.calls)
            temp = sim.send_event(napcat_temp(89321, OWNER, group, "/记忆模式 仅记录"))
            shown = await said(temp, to={"user_id": OWNER})
            assert shown.startswith("已将本会话模式设为 仅记录。")
            (reply,) = sends(sim, mark, user_id=OWNER)
            assert (reply.params.get("message_type"), reply.params.get("group_id")) == ("private", group)
            shown = await said(sim.group_message(group, OWNER, "/记忆模式"), to={"group_id": group})
            assert shown.startswith("本群模式：开")
            shown = await said(
                sim.send_event(napcat_temp(89323, OWNER, group, "/记忆模式")), to={"user_id": OWNER}
            )
            assert shown.startswith("本会话模式：仅记录")


# ---- 4. the backfill of a temp-session partner -------------------------------------------
# Lagrange.OneBot's get_friend_msg_history (LagrangeDev/Lagrange.Core v1
# Lagrange.OneBot/Core/Operation/Message/GetFriendMessageHistoryOperation.cs) asks the
# friend roaming history (`GetRoamMessage`); for a member who is no friend there is none and it
# ends in `throw new Exception()`, which Core/Operation/OperationService.cs answers as
# `{"status": "failed", "retcode": 200, "data": null}`.
async def test_a_temp_partners_history_refused_is_one_call_per_connection_and_one_line(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    stranger, friend = 20491, 20492
    async with BotProcess(tmp_path / "bot", env=env(answering)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        sim.history_like("lagrange")
        friendly = sim.responders["get_friend_msg_history"]

        def lagrange(params: dict[str, Any]) -> Any:
            if int(params["user_id"]) == stranger:
                raise ActionFailedError(200, "failed")
            return friendly(params)

        sim.responders["get_friend_msg_history"] = lagrange

        def fetches() -> list[int]:
            return [int(c.params["user_id"]) for c in sim.calls if c.action == "get_friend_msg_history"]

        try:
            await back(bot, sim, restart=False, backfill=False)
            # The stranger's session is the older one: fetched first, before the action has
            # answered for anyone.
            await sim.send_event(lagrange_temp(89401, stranger, "群里的活动怎么报名"))
            await wait_rows(bot, private_sid(stranger), 2)
            await sim.private_message(friend, "在吗", nickname="好友")
            await wait_rows(bot, private_sid(friend), 2)
            for _ in range(2):  # two reconnects: each tries once
                await sim.close()
                await back(bot, sim, restart=False)
            await sim.send_event(lagrange_temp(89402, stranger, "还在吗"))
            stored = await settled(bot, private_sid(stranger), 4)
            await asyncio.sleep(1)
            log = bot.log()
        finally:
            await sim.close()
    assert fetches() == [stranger, friend] * 2
    assert log.count("1 could not be fetched") == 2  # one line per connection
    assert "cannot get_friend_msg_history" not in log  # the friends' backfill goes on
    assert stored == [
        ("user", "[临时丙(20491)] 群里的活动怎么报名"),
        ("assistant", ANSWER),
        ("user", "[临时丙(20491)] 还在吗"),
        ("assistant", ANSWER),
    ]
