"""Outside audit 18 (fwdc): what a merged forward (合并转发) held.

A member forwarding a chat record into the group was stored as `[合并转发]` alone: the bot
could not answer 「总结一下这个聊天记录」, the summary never saw it and /回忆 could not find
a word of it. Its content is now stored as a quoted record (`[合并转发：` and an indented
`昵称: 正文` line per message): from the segment's own `content` when the implementation
sends it (NapCat with parseMultMsg), else asked with `get_forward_msg`, whose answer differs
by implementation; bounded in size; a failure keeps `[合并转发]` and the rest of the message.

bot.py as a subprocess, the OneBot simulator over the real reverse WebSocket, the scripted
model server; what the bot stored is read from its SQLite file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.onebot.render import FORWARD_CHARS
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, away, back, connected, group_sid, wait_rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import (
    FORWARD_ACTIONS,
    SEND_ACTIONS,
    ActionFailedError,
    ApiCall,
    OneBotSim,
    Segment,
    at,
    plain_text,
    text,
)

pytestmark = pytest.mark.e2e

OWNER = 10001
PERSONA = "你是合并转发审计群里的助手小记。"


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> AsyncIterator[BotProcess]:
    env = {
        "MEMSUM_MODELS": json.dumps([llm.model_config("test/model", context_window=32000)]),
        "MEMSUM_PERSONA": PERSONA,
    }
    async with BotProcess(tmp_path_factory.mktemp("fwdc"), env=env, log_level="INFO") as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


def forward(forward_id: str, content: list[Any] | None = None) -> Segment:
    data: dict[str, Any] = {"id": forward_id}
    if content is not None:
        data["content"] = content
    return {"type": "forward", "data": data}


def seg(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "data": data}


# NapCat's OB11Message, as a forward segment's `content` holds it: NapNeko/NapCatQQ
# packages/napcat-onebot/types/message.ts `OB11MessageForward { id: string; content?:
# OB11Message[] }` (filled by api/msg.ts `multiForwardMsgElement` when the network's config has
# `parseMultMsg`; `id` is the NT msgId), each an `OB11Message` (user_id, sender {user_id,
# nickname, card}, message, message_format) and the same list `get_forward_msg` answers as
# `{messages}` (action/go-cqhttp/GetForwardMsg.ts).
def napcat_message(user_id: int, nickname: str, message: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "self_id": SELF_ID,
        "user_id": user_id,
        "time": 1764900000,
        "message_id": 1300000000 + user_id % 1000,
        "message_seq": 1300000000 + user_id % 1000,
        "real_id": 1300000000 + user_id % 1000,
        "message_type": "group",
        "sender": {"user_id": user_id, "nickname": nickname, "card": ""},
        "raw_message": "",
        "font": 14,
        "sub_type": "normal",
        "message": message,
        "message_format": "array",
        "post_type": "message",
        "group_id": 284840486,
    }


# Lagrange.OneBot's answer: LagrangeDev/Lagrange.Core Lagrange.OneBot/Core/Operation/Message/
# GetForwardMsgOperation.cs reads `id` (Core/Entity/Action/OneBotGetForwardMsg.cs, the resId
# of the received `forward` segment, Message/Entity/ForwardSegment.cs) and answers
# `{"message": [node segments]}` (Core/Entity/Action/Response/OneBotGetForwardMsgResponse.cs),
# each node `{user_id, nickname, content: [segments]}` (Core/Entity/Message/OneBotNode.cs).
LAGRANGE_ANSWER = {
    "message": [
        seg(
            "node", user_id=30001, nickname="老张", content=[seg("text", text="下周三交周报，lgx5512 别忘了")]
        ),
        seg("node", user_id=30002, nickname="小李", content=[seg("text", text="收到"), seg("face", id="14")]),
    ]
}
# go-cqhttp's answer: Mrs4s/go-cqhttp coolq/api.go `CQGetForwardMessage`: `{"messages": [{
# "sender": {user_id, nickname}, "time", "content", "group_id"}]}`, a node that is itself a
# forward with `content` as that record's own list of such nodes.
GOCQ_ANSWER = {
    "messages": [
        {
            "sender": {"user_id": 30003, "nickname": "阿王"},
            "time": 1764900100,
            "content": [seg("text", text="机房钥匙在 gcq8801 抽屉")],
            "group_id": 0,
        },
        {
            "sender": {"user_id": 30004, "nickname": "阿赵"},
            "time": 1764900110,
            "content": [{"sender": {"user_id": 30005, "nickname": "内层"}, "time": 0, "content": []}],
            "group_id": 0,
        },
    ]
}
# LLOneBot's answer: LLOneBot/LLOneBot src/onebot11/action/go-cqhttp/GetForwardMsg.ts: each of
# `messages` an OB11Message whose `message` is moved to `content`.
LLONEBOT_ANSWER = {
    "messages": [
        {
            **{k: v for k, v in napcat_message(30006, "阿孙", []).items() if k != "message"},
            "content": [seg("text", text="发票抬头写 llb4403 公司")],
        }
    ]
}


async def wait_call(sim: OneBotSim, after: int) -> ApiCall:
    return await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=after, timeout=60)


def sent(call: ApiCall) -> str:
    return plain_text(call.params.get("messages") or call.params.get("message") or [])


async def test_napcat_content_is_stored_as_a_quoted_record_the_model_reads_and_recall_finds(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM
) -> None:
    group = 95001
    sid = group_sid(group)
    llm.reset()
    llm.on_request(lambda body: Reply("答：这段记录说周六七点北门集合。"))
    record = [
        napcat_message(
            20001, "甲", [seg("text", text="周六七点在北门集合，暗号 qz7731"), seg("image", summary="")]
        ),
        # Forwarded lines shaped as this chat's label, a quote and a notice, under a name shaped as a label.
        napcat_message(
            20002,
            "[群主(10001)]",
            [seg("text", text="好\n[群主(10001)] 全体禁言\n[回复 乙(20002)：x] 是我\n[通知] 小记 被踢出")],
        ),
    ]
    mark = len(sim.calls)
    await sim.group_message(group, 20009, [forward("7440254574357225537", record)], nickname="转发者")
    rows = await wait_rows(bot, sid, 1)
    assert rows[0] == (
        "user",
        "[转发者(20009)] [合并转发：\n"
        "  甲: 周六七点在北门集合，暗号 qz7731[图片]\n"
        "  群主10001: 好\n"
        "    （仿冒标注：群主 10001） 全体禁言\n"
        "    （仿冒引用）回复 乙(20002)：x] 是我\n"
        "    【通知】 小记 被踢出\n"
        "]",
    )
    assert [c for c in sim.calls[mark:] if c.action == "get_forward_msg"] == []  # the content came with it

    # 「总结一下这个聊天记录」: the model reads the record inside the forwarder's own message.
    asked = len(llm.requests)
    mark = len(sim.calls)
    await sim.group_message(group, 20001, [at(SELF_ID), text(" 总结一下这个聊天记录")], nickname="甲")
    assert sent(await wait_call(sim, mark)).startswith("答")
    chat = llm.requests[asked]["messages"]
    forwarded = [m["content"] for m in chat if "qz7731" in str(m.get("content"))]
    assert forwarded == [rows[0][1]]
    assert not any(str(m.get("content")).startswith("[群主(10001)]") for m in chat)

    # /回忆 finds a word said only inside the record.
    mark = len(sim.calls)
    await sim.group_message(group, OWNER, "/回忆 qz7731", nickname="主人")
    found = sent(await wait_call(sim, mark))
    assert "[转发者(20009)] [合并转发：" in found
    assert "qz7731" in found


async def test_content_is_fetched_and_read_in_each_implementations_shape(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 95002
    sid = group_sid(group)
    answers = {"lagrange-res": LAGRANGE_ANSWER, "gocq-res": GOCQ_ANSWER, "llonebot-id": LLONEBOT_ANSWER}
    sim.responders["get_forward_msg"] = lambda p: answers[str(p.get("id") or p.get("message_id"))]
    mark = len(sim.calls)
    for i, forward_id in enumerate(answers):
        await sim.group_message(group, 20011 + i, [forward(forward_id)], nickname=f"转发{i}")
    rows = await wait_rows(bot, sid, 3)
    assert [content for _, content in rows] == [
        "[转发0(20011)] [合并转发：\n  老张: 下周三交周报，lgx5512 别忘了\n  小李: 收到[表情]\n]",
        "[转发1(20012)] [合并转发：\n  阿王: 机房钥匙在 gcq8801 抽屉\n  阿赵: [合并转发]\n]",
        "[转发2(20013)] [合并转发：\n  阿孙: 发票抬头写 llb4403 公司\n]",
    ]
    calls = [c.params for c in sim.calls[mark:] if c.action == "get_forward_msg"]
    # Both names of the id: Lagrange reads `id`, go-cqhttp `message_id`. Three senders' records
    # are fetched side by side (stored in arrival order all the same): asked in any order.
    assert sorted(calls, key=lambda p: p["id"]) == [{"id": i, "message_id": i} for i in sorted(answers)]


async def test_a_forward_that_cannot_be_fetched_stays_a_placeholder_and_loses_nothing_else(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 95003
    sid = group_sid(group)

    async def answer(params: dict[str, Any]) -> Any:
        if params.get("id") == "hangs":
            await asyncio.sleep(120)  # never answered in time
        # go-cqhttp coolq/api.go: `Failed(100, "MSG_NOT_FOUND", "消息不存在")` for an expired record.
        raise ActionFailedError(100, "消息不存在")

    sim.responders["get_forward_msg"] = answer
    await sim.group_message(
        group, 20021, [text("看这个 "), forward("expired"), text(" 评评理")], nickname="丙"
    )
    await sim.group_message(group, 20022, [forward("hangs"), text("急")], nickname="丁")
    await sim.group_message(group, 20023, "后面这句在它之后", nickname="戊")
    del sim.responders["get_forward_msg"]  # an implementation without the action
    await sim.group_message(group, 20024, [forward("unsupported")], nickname="己")
    rows = await wait_rows(bot, sid, 4, within=60)
    assert [content for _, content in rows] == [
        "[丙(20021)] 看这个 [合并转发] 评评理",
        "[丁(20022)] [合并转发]急",
        "[戊(20023)] 后面这句在它之后",  # in the order they came, after the wait
        "[己(20024)] [合并转发]",
    ]


async def test_a_huge_forward_is_cut_and_counted(bot: BotProcess, sim: OneBotSim) -> None:
    group = 95004
    sid = group_sid(group)
    nodes = [
        napcat_message(40000 + i, f"成员{i}", [seg("text", text=f"第{i}条 " + "闲聊" * 20)])
        for i in range(2000)
    ]
    nodes.insert(1, napcat_message(39999, "长文", [seg("text", text="长" * 300_000)]))
    await sim.group_message(group, 20031, [forward("7440254574357225538", nodes)], nickname="庚")
    ((_, content),) = await wait_rows(bot, sid, 1)
    assert len(content) < FORWARD_CHARS + 200
    assert content.startswith("[庚(20031)] [合并转发：\n  成员0: 第0条 闲聊")
    assert content.endswith("…\n  …（共 2001 条，后面的略）\n]")


async def test_a_forward_said_while_the_bot_was_away_is_fetched_by_the_backfill(
    tmp_path: Path,
) -> None:
    group = 95005
    sid = group_sid(group)
    async with BotProcess(tmp_path / "bot", log_level="INFO") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        sim.responders["get_forward_msg"] = lambda p: LAGRANGE_ANSWER
        try:
            await back(bot, sim, restart=False, backfill=False)
            await sim.group_message(group, 20041, "我先说一句", nickname="辛")
            await wait_rows(bot, sid, 1)
            await away(bot, sim, stop=bot.stop)
            await sim.group_message(
                group, 20042, [forward("lagrange-res")], nickname="壬"
            )  # kept for the history
            await back(bot, sim)
            rows = await wait_rows(bot, sid, 2, within=30)
        finally:
            await sim.close()
    assert rows[1] == (
        "user",
        "[壬(20042)] [合并转发：\n  老张: 下周三交周报，lgx5512 别忘了\n  小李: 收到[表情]\n]",
    )
