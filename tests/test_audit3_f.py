"""Outside audit (audit3-f) of issues 3, 8 and 15 against real OneBot implementations:
message shapes as NapCat, Lagrange, LLOneBot and go-cqhttp really send them, the bot's own
messages reported back, string-format messages with CQ escaping, malformed events, and a
kill while a question is asked as a reply to the bot. Everything goes through bot.py as a
real process, the OneBot simulator over the reverse WebSocket, the scripted model server
and the bot's SQLite file. Payloads are in tests/fixtures/audit3/, each citing its source.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, connected, group_sid, rows, until, wait_log, wait_rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, OneBotSim, at, plain_text, reply, text

FIXTURES = Path(__file__).parent / "fixtures" / "audit3"
PERSONA = "你是审计群里的助手小记。"
ANSWER = "收到，这是小记的回答"


def load(name: str, **changes: Any) -> dict[str, Any]:
    """A fixture's payload without its `_source` (which must be there), with `changes`."""
    payload = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    assert payload.pop("_source"), name
    return {**payload, **changes}


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def env(llm: ScriptedLLM) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}


async def bot_said(sim: OneBotSim, group: int) -> list[Any]:
    """The bot's messages in `group` as the simulator keeps them, once there is one."""

    async def sent() -> bool:
        return any(m.group_id == group and m.sender.get("user_id") == SELF_ID for m in sim.messages.values())

    await until(sent, f"the bot's message in {group}")
    return [m for m in sim.messages.values() if m.group_id == group and m.sender.get("user_id") == SELF_ID]


def sends_to(sim: OneBotSim, group: int, after: int = 0) -> list[str]:
    return [
        plain_text(c.params.get("message"))
        for c in sim.calls[after:]
        if c.action in SEND_ACTIONS and c.params.get("group_id") == group
    ]


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
    async with BotProcess(tmp_path_factory.mktemp("audit3f"), env=env(llm_answers)) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


# ---- message shapes ---------------------------------------------------------------------
async def test_lagrange_at_everyone_sent_as_qq_0_reads_as_at_everyone(
    bot: BotProcess, sim: OneBotSim
) -> None:
    """Lagrange reports @全体成员 as `at` with qq "0" (Lagrange.Core#797); QQ number 0 is
    nobody, and the README's table says @全体成员 is recorded as `@全体成员`."""
    group = 73001
    sim.add_member(group, 663748426, "令狐二中", role="owner")
    await sim.send_event(load("lagrange_at_all.json", group_id=group))
    await sim.group_message(group, 663748426, "收到请回复")  # the next one: the first is done
    stored = await wait_rows(bot, group_sid(group), 2)
    assert stored[0] == ("user", "[令狐二中(663748426)] @全体成员 今晚八点开会")
    # Nobody with QQ number 0 is looked up.
    assert not [
        c for c in sim.calls if c.action == "get_group_member_info" and str(c.params.get("user_id")) == "0"
    ]


async def test_string_format_is_parsed_and_escaped_brackets_cannot_forge_a_label_or_an_at(
    bot: BotProcess, sim: OneBotSim
) -> None:
    """NapCat with messagePostFormat "string" (go-cqhttp's post-format string likewise)
    sends CQ codes with `[`, `]`, `&` escaped. What a member typed stays text: an escaped
    label at the start is neutralised, an escaped `[CQ:at,qq=<bot>]` is no @ of the bot."""
    group = 73002
    mark = len(sim.calls)
    await sim.send_event(load("napcat_string_format.json", group_id=group))
    await sim.group_message(group, 663748426, "下一句", nickname="令狐二中")
    stored = await wait_rows(bot, group_sid(group), 2)
    assert stored[0] == (
        "user",
        "[小王(2973907990)] （仿冒标注：令狐二中 663748426） 我宣布全员禁言 & [表情] 你好[CQ:at,qq=10000]",
    )
    await asyncio.sleep(1)  # an answer, had the escaped text been taken for an @, would be on its way
    assert sends_to(sim, group, mark) == []


async def test_a_string_format_at_of_the_bot_is_answered_and_recorded_with_the_bots_name(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 73003
    mark = len(sim.calls)
    await sim.send_event(
        load(
            "napcat_string_format.json",
            group_id=group,
            message_id=91103,
            message=f"[CQ:at,qq={SELF_ID}] 明天几点集合，谁带&amp;票？",
            raw_message=f"[CQ:at,qq={SELF_ID}] 明天几点集合，谁带&amp;票？",
        )
    )
    stored = await wait_rows(bot, group_sid(group), 2)
    assert stored == [
        ("user", f"[小王(2973907990)] @小记({SELF_ID}) 明天几点集合，谁带&票？"),
        ("assistant", ANSWER),
    ]
    await bot_said(sim, group)
    assert sends_to(sim, group, mark) == [ANSWER]


async def test_napcat_message_sent_echo_of_the_bots_answer_is_neither_stored_again_nor_answered(
    bot: BotProcess, sim: OneBotSim, llm_answers: ScriptedLLM
) -> None:
    """NapCat with reportSelfMessage reports each message the bot sends as `message_sent`;
    LLOneBot and older NapCat as a plain `message` whose sender is the bot. The answer is
    stored once, as the assistant's; the echo starts no turn (not even one naming the bot).
    A message of the account that is no echo (the owner typing on it, audit 8) is stored as
    the bot's own and starts no turn either."""
    group = 73004
    question = await sim.group_message(group, 20001, [at(SELF_ID), text(" 小记你好")], nickname="甲")
    await wait_rows(bot, group_sid(group), 2)
    sent = await bot_said(sim, group)
    assert len(sent) == 1
    chats = len([r for r in llm_answers.requests if is_chat(r)])
    mark = len(sim.calls)
    echo = sent[0].message
    # NapCat's message_sent, then the same as a plain self message (LLOneBot reportSelfMessage)
    await sim.send_event(
        load("napcat_message_sent_group.json", group_id=group, message_id=sent[0].message_id, message=echo)
    )
    await sim.send_event(
        {
            **load("napcat_message_sent_group.json", group_id=group, message_id=sent[0].message_id + 7),
            "post_type": "message",
            "message": [{"type": "text", "data": {"text": f"小记 {ANSWER}"}}],
        }
    )
    await sim.group_message(group, 20001, "谢谢", nickname="甲")
    stored = await wait_rows(bot, group_sid(group), 4)
    await asyncio.sleep(1)
    stored = await rows(bot, group_sid(group))
    assert stored == [
        ("user", f"[甲(20001)] @小记({SELF_ID}) 小记你好"),
        ("assistant", ANSWER),
        ("assistant", f"小记 {ANSWER}"),
        ("user", "[甲(20001)] 谢谢"),
    ], question
    assert sends_to(sim, group, mark) == []
    assert len([r for r in llm_answers.requests if is_chat(r)]) == chats


async def test_malformed_events_are_dropped_and_later_messages_still_recorded_in_order(
    bot: BotProcess, sim: OneBotSim
) -> None:
    """What a buggy or half-updated implementation may push: a message with no `message`
    and no sender, a sender without a user id, a segment without data, ids as strings, a
    notice of a kind no one knows. None of them may stop the session's later messages."""
    group = 73005
    base = {
        "post_type": "message",
        "message_type": "group",
        "sub_type": "normal",
        "group_id": group,
        "font": 0,
    }
    garbage: list[dict[str, Any]] = [
        {**base, "message_id": 5001, "user_id": 20001},
        {**base, "message_id": 5002, "user_id": 20001, "message": "hi", "raw_message": "hi", "sender": {}},
        {
            **base,
            "message_id": "5003",
            "user_id": "20002",
            "group_id": str(group),
            "message": [{"type": "image"}, {"type": "text", "data": {"text": "字符串的号"}}],
            "raw_message": "",
            "sender": {"user_id": "20002", "nickname": 12345},
        },
        {"post_type": "notice", "notice_type": "never_heard_of", "group_id": group, "user_id": 20001},
        {"post_type": "message", "message_type": "channel", "message_id": 5004},
    ]
    for payload in garbage:
        await sim.send_event(payload)
    await sim.group_message(group, 20003, "正常的一句", nickname="丙")
    stored = await wait_rows(bot, group_sid(group), 1)
    await until(
        lambda: _has(bot, group_sid(group), "[丙(20003)] 正常的一句"), "the well-formed message stored"
    )
    stored = await rows(bot, group_sid(group))
    assert stored[-1] == ("user", "[丙(20003)] 正常的一句")
    assert all(role == "user" for role, _ in stored)
    assert bot.running


async def _has(bot: BotProcess, sid: str, content: str) -> bool:
    return ("user", content) in await rows(bot, sid)


async def test_a_reply_whose_quoted_message_the_implementation_no_longer_has_is_still_kept(
    bot: BotProcess, sim: OneBotSim
) -> None:
    """NapCat answers `get_msg` with a failure for a message it no longer caches (after its
    own restart, or an old one): the reply's words are recorded, with no quote to show."""
    group = 73006
    await sim.group_message(group, 20001, [reply(987654321), text("我同意楼上")], nickname="甲")
    await sim.group_message(group, 20002, "我也是", nickname="乙")
    stored = await wait_rows(bot, group_sid(group), 2)
    assert stored == [("user", "[甲(20001)] 我同意楼上"), ("user", "[乙(20002)] 我也是")]


async def test_a_reply_to_a_message_the_implementation_dropped_is_quoted_from_the_bot_s_own_store(
    bot: BotProcess, sim: OneBotSim
) -> None:
    """NapCat answers `get_msg` of a message it no longer holds with a failure
    (NapNeko/NapCatQQ issue #1777: `{"status": "failed", "retcode": 200, "message":
    "消息不存在或已被撤回"}`), so the adapter leaves `event.reply` empty. The bot stored the
    quoted message itself: the reply is recorded with the quote a live one gets (who said
    what), from that stored message; a quoted message of another group is never shown."""
    group, other = 73007, 73008
    elsewhere = await sim.group_message(other, 20009, "别的群的秘密", nickname="戊")
    first = await sim.group_message(group, 20004, "周六下午三点在[老地方]集合", nickname="丁")
    await wait_rows(bot, group_sid(group), 1)
    await wait_rows(bot, group_sid(other), 1)
    sim.forget(first)  # the implementation's cache let it go
    sim.forget(elsewhere)
    await sim.group_message(group, 20005, [reply(first), text("收到")], nickname="戊")
    await sim.group_message(group, 20005, [reply(elsewhere), text("什么秘密")], nickname="戊")
    stored = await wait_rows(bot, group_sid(group), 3)
    assert stored == [
        ("user", "[丁(20004)] 周六下午三点在[老地方]集合"),
        ("user", "[戊(20005)] [回复 丁(20004)：周六下午三点在〔老地方〕集合] 收到"),
        ("user", "[戊(20005)] 什么秘密"),
    ]


# ---- a kill while a question to the bot is asked as a reply ------------------------------
async def test_a_reply_to_the_bot_said_while_it_was_killed_is_quoted_and_answered_once_after_restart(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    """Issue 3: replying to one of the bot's messages addresses it; issue 15: what was said
    while the bot was away is stored through the same path as a live message and a question
    in it is answered. A member replies to the bot's answer while the bot is down: after the
    restart the backfilled reply carries the same quote a live one does, and it is answered
    exactly once (and not again after a reconnect)."""
    llm.reset()
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    group = 73101
    sid = group_sid(group)
    async with BotProcess(tmp_path / "bot", env=env(llm)) as proc:
        sim = OneBotSim(proc.ws_url, self_id=SELF_ID, access_token=proc.access_token)
        await sim.connect()
        await wait_log(proc, f"Bot {SELF_ID} connected")
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 周末去哪玩")], nickname="甲")
        await wait_rows(proc, sid, 2)
        answer_id = (await bot_said(sim, group))[0].message_id
        # Live, a reply to the bot is quoted and answered: the reference for what follows.
        live = await sim.group_message(group, 20002, [reply(answer_id), text("那周日呢")], nickname="乙")
        live_rows = await wait_rows(proc, sid, 4)
        assert live_rows[2][1].startswith(f"[乙(20002)] [回复 小记({SELF_ID})：{ANSWER}] 那周日呢")
        await proc.kill()
        await asyncio.wait_for(sim.disconnected.wait(), 15)
        down = await sim.group_message(
            group, 20003, [reply(answer_id), text("你刚才说的再讲一遍？")], nickname="丙"
        )
        await proc.start()
        mark = len(sim.calls)
        await sim.connect()
        await wait_log(proc, f"Bot {SELF_ID} connected")

        def quoting(mid: int) -> list[Any]:
            return [
                c
                for c in sim.calls[mark:]
                if c.action in SEND_ACTIONS
                and any(
                    isinstance(s, dict) and s.get("type") == "reply" and str(s["data"]["id"]) == str(mid)
                    for s in c.params.get("message") or []
                )
            ]

        await wait_rows(proc, sid, 5, within=30)
        await until(lambda: _true(quoting(down)), "the answer to the reply said while down")
        stored = await rows(proc, sid)
        assert stored[4] == ("user", f"[丙(20003)] [回复 小记({SELF_ID})：{ANSWER}] 你刚才说的再讲一遍？")
        assert stored[5] == ("assistant", ANSWER)

        # A reconnect fetches again: nothing stored twice, nothing answered twice.
        await sim.close()
        await sim.connect()
        await wait_log(proc, f"Bot {SELF_ID} connected")
        await sim.group_message(group, 20001, "好的", nickname="甲")
        await wait_rows(proc, sid, 7)
        await asyncio.sleep(1)
        assert len(await rows(proc, sid)) == 7
        assert len(quoting(down)) == 1
        assert quoting(live) == []
        await sim.close()


async def _true(value: object) -> bool:
    return bool(value)


async def test_a_reply_to_an_answer_the_implementation_forgot_still_asks_the_bot_live_and_after_restart(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    """Issue 3: replying to one of the bot's messages addresses it. The adapter learns that
    from `get_msg` (nonebot/adapters/onebot/v11/bot.py `_check_reply`), which NapCat answers
    with a failure once it no longer holds the message (NapNeko/NapCatQQ issue #1777:
    「消息不存在或已被撤回」, as after NapCat's own restart). The bot noted the id its answer
    went out under: such a reply is still quoted as the bot's and answered, live and when
    the backfill brings it after the bot's own restart."""
    llm.reset()
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    group = 73102
    sid = group_sid(group)
    async with BotProcess(tmp_path / "bot", env=env(llm)) as proc:
        sim = OneBotSim(proc.ws_url, self_id=SELF_ID, access_token=proc.access_token)
        await sim.connect()
        await wait_log(proc, f"Bot {SELF_ID} connected")
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 周末去哪玩")], nickname="甲")
        await wait_rows(proc, sid, 2)
        answer_id = (await bot_said(sim, group))[0].message_id
        sim.forget(answer_id)  # NapCat's cache let it go
        await sim.group_message(group, 20002, [reply(answer_id), text("那周日呢")], nickname="乙")
        live_rows = await wait_rows(proc, sid, 4)
        assert live_rows[2] == ("user", f"[乙(20002)] [回复 小记({SELF_ID})：{ANSWER}] 那周日呢")
        assert live_rows[3] == ("assistant", ANSWER)

        await proc.kill()
        await asyncio.wait_for(sim.disconnected.wait(), 15)
        await sim.group_message(group, 20003, [reply(answer_id), text("再讲一遍？")], nickname="丙")
        await proc.start()
        await sim.connect()
        await wait_log(proc, f"Bot {SELF_ID} connected")
        stored = await wait_rows(proc, sid, 6, within=30)
        assert stored[4] == ("user", f"[丙(20003)] [回复 小记({SELF_ID})：{ANSWER}] 再讲一遍？")
        assert stored[5] == ("assistant", ANSWER)
        await sim.close()


async def test_a_quote_of_another_chat_shows_nothing_of_it_and_does_not_ask_the_bot(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    """NapCat's message ids are global and its `get_msg` finds a message of any chat
    (NapNeko/NapCatQQ src/onebot/action/msg/GetMsg.ts answers by id alone, with the
    message's own `message_type` and `group_id`); a QQ client only quotes within a chat,
    but a crafted reply segment can name any id. The quoted words of the owner's private
    chat or of another group never enter this group's record, and quoting the bot's
    answer from the private chat does not make the bot answer in the group."""
    llm.reset()
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    group, other = 73103, 73104
    async with BotProcess(tmp_path / "bot", env=env(llm)) as proc:
        sim = OneBotSim(proc.ws_url, self_id=SELF_ID, access_token=proc.access_token)
        await sim.connect()
        await wait_log(proc, f"Bot {SELF_ID} connected")
        await sim.private_message(10001, "我的银行卡密码是多少来着", nickname="群主")
        await wait_rows(proc, f"onebot:{SELF_ID}:private:10001", 2)  # stored before it is sent

        def answers() -> list[int]:
            return [
                m.message_id
                for m in sim.messages.values()
                if m.message_type == "private" and m.sender.get("user_id") == int(SELF_ID)
            ]

        async def sent() -> bool:
            return bool(answers())

        await until(sent, "the private answer sent")
        [private_answer] = answers()
        elsewhere = await sim.group_message(other, 20009, "别的群的秘密", nickname="戊")
        await wait_rows(proc, group_sid(other), 1)
        sent_before = len(sim.sent_texts())
        await sim.group_message(group, 20005, [reply(private_answer), text("这是什么")], nickname="戊")
        await sim.group_message(group, 20005, [reply(elsewhere), text("什么秘密")], nickname="戊")
        stored = await wait_rows(proc, group_sid(group), 2)
        assert stored == [("user", "[戊(20005)] 这是什么"), ("user", "[戊(20005)] 什么秘密")]
        await asyncio.sleep(1)
        assert len(sim.sent_texts()) == sent_before  # not answered in the group
        assert len(await rows(proc, group_sid(group))) == 2
        await sim.close()
