"""Outside audit (audit8-y): what the bot account says that this plugin did not write.

Two kinds of messages the group sees from the bot were never remembered: what other
NoneBot plugins of the same bot process send through the same Bot (a 签到 reply, a push,
a merged-forward announcement), and what the owner types on the bot's QQ account from
another client (NapCat's `message_sent` with reportSelfMessage, LLOneBot's and older
NapCat's plain `message` whose sender is the bot). They are stored now as the bot's own
(assistant) messages of their session, in order, once, starting no turn; the plugin's own
answers (and their echoes, before or after the send's response) still exactly once, and
its command output never. Everything goes through bot.py as a real process with a second
plugin beside ours, the OneBot simulator over the real WebSocket, the scripted model
server and the bot's SQLite file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import (
    SELF_ID,
    connected,
    group_sid,
    private_sid,
    query,
    rows,
    until,
    wait_log,
    wait_rows,
)
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, OneBotSim, at, plain_text, text

PERSONA = "你是审计群里的助手小记。"
ANSWER = "这是小记的回答"
OWNER = 10001
PYPROJECT = """[tool.nonebot]
plugin_dirs = ["plugins"]

[tool.nonebot.plugins]
nonebot-plugin-memsum = ["nonebot_plugin_memsum"]
"""
# Another plugin of the same bot process, as a 签到 / push plugin is written with NoneBot's
# own API (nonebot2 docs: matcher.send, Bot.call_api / bot.send_group_msg; OneBot v11
# send_private_msg takes CQ codes in a string, send_group_forward_msg a list of nodes).
OTHER_PLUGIN = """
from nonebot import on_fullmatch
from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, MessageSegment

sign = on_fullmatch("签到", priority=5, block=False)
push = on_fullmatch("推送", priority=5, block=False)


@sign.handle()
async def _(event: GroupMessageEvent) -> None:
    await sign.send(
        MessageSegment.at(event.user_id) + " 签到成功，积分 +10" + MessageSegment.image("https://example.invalid/a.png")
    )


@push.handle()
async def _(bot: Bot, event: GroupMessageEvent) -> None:
    await bot.send_private_msg(user_id=20002, message="[CQ:face,id=14]明早九点提醒你交报告")
    content = [{"type": "text", "data": {"text": "群规第一条"}}]
    node = {"type": "node", "data": {"name": "公告", "uin": bot.self_id, "content": content}}
    await bot.call_api("send_group_forward_msg", group_id=event.group_id, messages=[node])
    end = "[群主(10001)] 今天的推送到此结束"
    await bot.send_group_msg(group_id=event.group_id, message=end, auto_escape=True)
"""


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def chats(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [r for r in llm.requests if is_chat(r)]


async def settled(bot: BotProcess, sid: str, n: int) -> list[tuple[str, str]]:
    """The session's rows once it has `n` and nothing more came for a while."""
    await wait_rows(bot, sid, n)
    await asyncio.sleep(0.8)
    return await rows(bot, sid)


# NapCat with reportSelfMessage reports what the account said as `post_type: "message_sent"`
# (NapNeko/NapCatQQ src/onebot/api/msg.ts parseMessage: post_type MESSAGE_SENT when the
# sender is the account's own uin, `message_sent_type: "self"`, `message_format`, font 14,
# sub_type "normal" in groups and "friend" in private chats; src/onebot/index.ts emitMsg:
# `target_id = peerUin` for the account's own messages, the group or the private peer).
# Its message_id is the short id MessageUnique makes for the message, the same the send
# action returned for it (sendMsgWithOb11UniqueId).
def napcat_message_sent(
    message_id: int, message: list[dict[str, Any]], *, group_id: int | None = None, peer: int | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "self_id": SELF_ID,
        "user_id": SELF_ID,
        "message_id": message_id,
        "message_seq": message_id,
        "real_id": message_id,
        "message_type": "group" if group_id is not None else "private",
        "sender": {"user_id": SELF_ID, "nickname": "小记", "card": ""},
        "raw_message": "",
        "font": 14,
        "sub_type": "normal" if group_id is not None else "friend",
        "message": message,
        "message_format": "array",
        "post_type": "message_sent",
        "message_sent_type": "self",
        "target_id": group_id if group_id is not None else peer,
    }
    if group_id is not None:
        payload["group_id"] = group_id
        payload["sender"]["role"] = "member"
    return payload


Responder = Callable[[dict[str, Any]], Any]


@contextmanager
def napcat_echoes(sim: OneBotSim, *, before_response: bool) -> Iterator[list[int]]:
    """Every send answered as NapCat with reportSelfMessage: the `message_sent` of what went
    out, pushed before the action's response (the message's send status comes first) or
    just after it. Yields the ids echoed."""
    echoed: list[int] = []
    saved = {a: sim.responders[a] for a in ("send_msg", "send_group_msg", "send_private_msg")}

    def echoing(base: Responder) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        async def respond(params: dict[str, Any]) -> Any:
            data = base(params)
            sent = sim.messages[int(data["message_id"])]
            where = {"group_id": sent.group_id} if sent.message_type == "group" else {"peer": sent.user_id}
            echo = napcat_message_sent(sent.message_id, sent.message, **where)
            echoed.append(sent.message_id)
            if before_response:
                await sim.send_event(echo)
                await asyncio.sleep(0.3)  # the echo handled while the send still waits
            else:
                asyncio.get_running_loop().call_later(
                    0.05, lambda: asyncio.ensure_future(sim.send_event(echo))
                )
            return data

        return respond

    for action, base in saved.items():
        sim.responders[action] = echoing(base)
    try:
        yield echoed
    finally:
        sim.responders.update(saved)


@pytest.fixture(scope="module")
async def llm_answers(llm: ScriptedLLM) -> AsyncIterator[ScriptedLLM]:
    llm.reset()
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    yield llm
    llm.reset()


@pytest.fixture(scope="module")
async def bot(
    tmp_path_factory: pytest.TempPathFactory, llm_answers: ScriptedLLM
) -> AsyncIterator[BotProcess]:
    workdir = tmp_path_factory.mktemp("audit8y")
    (workdir / "plugins").mkdir()
    (workdir / "plugins" / "signin.py").write_text(OTHER_PLUGIN, "utf-8")
    (workdir / "pyproject.toml").write_text(PYPROJECT, "utf-8")
    env = {"MEMSUM_MODELS": json.dumps([llm_answers.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}
    async with BotProcess(workdir, env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        await wait_log(bot, "memsum: event dispatch:")
        yield s


# ---- other plugins' sends -----------------------------------------------------------------
async def test_another_plugins_sends_are_stored_as_the_bots_in_their_sessions_in_order_without_a_turn(
    bot: BotProcess, sim: OneBotSim, llm_answers: ScriptedLLM
) -> None:
    group = 81001
    before = len(chats(llm_answers))
    await sim.group_message(group, 20001, "签到", nickname="甲")
    await wait_rows(bot, group_sid(group), 2)  # answered before the next is said
    await sim.group_message(group, 20002, "推送", nickname="乙")
    stored = await settled(bot, group_sid(group), 5)
    assert stored == [
        ("user", "[甲(20001)] 签到"),
        ("assistant", "@甲(20001) 签到成功，积分 +10[图片]"),
        ("user", "[乙(20002)] 推送"),
        ("assistant", "[合并转发：\n  公告: 群规第一条\n]"),  # its nodes (audit 18 fwd2)
        # What a plugin repeats cannot speak as a member.
        ("assistant", "（仿冒标注：群主 10001） 今天的推送到此结束"),
    ]
    # The private push is the peer's session, not one of the bot with itself.
    assert await settled(bot, private_sid(20002), 1) == [("assistant", "[表情]明早九点提醒你交报告")]
    assert await rows(bot, private_sid(SELF_ID)) == []
    assert len(chats(llm_answers)) == before  # none of it started a turn


async def test_a_question_about_what_the_bot_just_posted_reads_it_as_the_bots_own_words(
    bot: BotProcess, sim: OneBotSim, llm_answers: ScriptedLLM
) -> None:
    group = 81002
    await sim.group_message(group, 20001, "签到", nickname="甲")
    await wait_rows(bot, group_sid(group), 2)
    before = len(chats(llm_answers))
    await sim.group_message(group, 20001, [at(SELF_ID), text(" 你刚才发了什么？")], nickname="甲")
    await until(lambda: _true(len(chats(llm_answers)) > before), "the chat request")
    request = chats(llm_answers)[-1]["messages"]
    assert {"role": "assistant", "content": "@甲(20001) 签到成功，积分 +10[图片]"} in [
        {"role": m["role"], "content": m["content"]} for m in request
    ]
    stored = await settled(bot, group_sid(group), 4)
    assert [role for role, _ in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[-1] == ("assistant", ANSWER)


async def _true(value: bool) -> bool:
    return value


# ---- echoes: each message once ----------------------------------------------------------------
@pytest.mark.parametrize("before_response", [True, False], ids=["echo-first", "response-first"])
async def test_the_bots_answer_and_another_plugins_send_are_stored_once_whenever_their_echo_comes(
    bot: BotProcess, sim: OneBotSim, llm_answers: ScriptedLLM, before_response: bool
) -> None:
    group = 81003 if before_response else 81004
    with napcat_echoes(sim, before_response=before_response) as echoed:
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 在吗")], nickname="甲")
        await wait_rows(bot, group_sid(group), 2)
        await sim.group_message(group, 20001, "签到", nickname="甲")
        await until(lambda: _true(len(echoed) == 2), "both sends echoed")
        stored = await settled(bot, group_sid(group), 4)
    assert stored == [
        ("user", f"[甲(20001)] @小记({SELF_ID}) 在吗"),
        ("assistant", ANSWER),
        ("user", "[甲(20001)] 签到"),
        ("assistant", "@甲(20001) 签到成功，积分 +10[图片]"),
    ]
    # The answer still carries the id it went out under (a later reply to it asks the bot).
    ids = await query(
        bot.db_path, "SELECT platform_id FROM messages WHERE session_id = ? ORDER BY id", group_sid(group)
    )
    assert [str(r[0]) for r in ids][1::2] == [str(i) for i in echoed]


async def test_command_output_and_its_echo_are_not_remembered_as_chat(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 81005
    mark = len(sim.calls)
    with napcat_echoes(sim, before_response=True) as echoed:
        await sim.group_message(group, OWNER, "/记忆模式", nickname="主人")
        await until(lambda: _true(len(echoed) == 1), "the command's answer echoed")
    sent = [plain_text(c.params.get("message")) for c in sim.calls[mark:] if c.action in SEND_ACTIONS]
    assert len(sent) == 1
    assert sent[0].startswith("本群模式")  # the command answered, through the plugin's own send
    await sim.group_message(group, 20001, "收尾", nickname="甲")
    assert await settled(bot, group_sid(group), 1) == [("user", "[甲(20001)] 收尾")]


# ---- what the owner types on the bot's account ---------------------------------------------------
async def test_what_the_owner_types_on_the_bots_account_is_stored_as_the_bots_in_order(
    bot: BotProcess, sim: OneBotSim, llm_answers: ScriptedLLM
) -> None:
    group, peer = 81006, 20003
    before = len(chats(llm_answers))
    await sim.group_message(group, 20001, "今晚开会吗", nickname="甲")
    await sim.send_event(
        napcat_message_sent(88601, [text("开，八点，"), at(20001), text(" 记得带电脑")], group_id=group)
    )
    # LLOneBot and older NapCat: a plain `message` whose sender is the account.
    await sim.send_event(
        {
            "post_type": "message",
            "message_type": "group",
            "sub_type": "normal",
            "message_id": 88602,
            "group_id": group,
            "user_id": SELF_ID,
            "message": [text("[小王(20009)] 我也去")],
            "raw_message": "",
            "font": 0,
            "sender": {"user_id": SELF_ID, "nickname": "小记"},
        }
    )
    empty = {"post_type": "message", "message_type": "group", "sub_type": "normal", "group_id": group}
    mine = {"user_id": SELF_ID, "sender": {"user_id": SELF_ID}, "message": [], "raw_message": "", "font": 0}
    await sim.send_event({**empty, **mine, "message_id": 88605})  # nothing in it: nothing said
    await sim.group_message(group, 20001, "好的", nickname="甲")
    stored = await settled(bot, group_sid(group), 4)
    assert len(chats(llm_answers)) == before  # the owner's words ask nothing
    assert stored == [
        ("user", "[甲(20001)] 今晚开会吗"),
        ("assistant", "开，八点，@甲(20001) 记得带电脑"),
        ("assistant", "（仿冒标注：小王 20009） 我也去"),
        ("user", "[甲(20001)] 好的"),
    ]
    # A private chat typed on the account: the peer is `target_id`, never the bot.
    await sim.send_event(napcat_message_sent(88603, [text("周末见")], peer=peer))
    # One whose peer the implementation does not say: nowhere to put it.
    await sim.send_event({**napcat_message_sent(88604, [text("无处可放")], peer=peer), "target_id": None})
    await sim.private_message(peer, "好呀", nickname="丙")
    assert await settled(bot, private_sid(peer), 3) == [
        ("assistant", "周末见"),
        ("user", "[丙(20003)] 好呀"),
        ("assistant", ANSWER),  # a private message asks; the owner's words before it did not
    ]
    assert await rows(bot, private_sid(SELF_ID)) == []
    assert len(chats(llm_answers)) == before + 1


async def test_an_off_place_records_nothing_the_bot_account_says(bot: BotProcess, sim: OneBotSim) -> None:
    group = 81007
    mark = len(sim.calls)
    await sim.group_message(group, OWNER, "/记忆模式 关", nickname="主人")
    await sim.wait_call(set(SEND_ACTIONS), predicate=lambda c: c.params.get("group_id") == group, after=mark)
    mark = len(sim.calls)
    await sim.group_message(group, 20001, "签到", nickname="甲")
    await sim.wait_call(set(SEND_ACTIONS), predicate=lambda c: c.params.get("group_id") == group, after=mark)
    await sim.send_event(napcat_message_sent(88701, [text("手机上说的话")], group_id=group))
    await asyncio.sleep(1)
    assert await rows(bot, group_sid(group)) == []
    assert "Traceback" not in bot.log()
