"""Audit 18 (fwd2): merged forwards (合并转发) the bot account sends, and the backfill's wait.

1. A forward another plugin of the same bot process sends (`send_group_forward_msg`,
   `send_forward_msg`) was stored as `[合并转发]`, though the call's own `messages` hold every
   node: it is stored as the record a member's forward is (`render.forward_record`), a node
   naming a stored message by its id rendered from the store, one the store has not got left
   out; NapCat's `message_sent` echo of it is still dropped, whether it outruns the response
   or follows it, and carries the content or not.
2. After a restart the backfill asked `get_forward_msg` for each fetched forward one after
   another, each waiting FORWARD_TIMEOUT when the implementation hangs on it: after one
   timeout the pass asks no more (the rest keep `[合并转发]`); a live forward still asks.

bot.py as a subprocess (with a second plugin beside ours), the OneBot simulator over the
real reverse WebSocket; what the bot stored is read from its SQLite file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, away, back, connected, group_sid, rows, until, wait_log, wait_rows
from tests.fakes.llm_server import ScriptedLLM
from tests.fakes.onebot import OneBotSim
from tests.test_audit18_fwdc import LAGRANGE_ANSWER, forward

pytestmark = pytest.mark.e2e

PYPROJECT = """[tool.nonebot]
plugin_dirs = ["plugins"]

[tool.nonebot.plugins]
nonebot-plugin-memsum = ["nonebot_plugin_memsum"]
"""
# Another plugin sending merged forwards, with each node shape the docs give:
# - OneBot v11 (botuniverse/onebot-11 message/segment.md 合并转发节点 / 合并转发自定义节点):
#   `{"type": "node", "data": {"id": "123456"}}` names a message; a custom node is
#   `{"user_id", "nickname", "content"}`, content a message (segments or CQ codes); what
#   nonebot-adapter-onebot's `MessageSegment.node_custom` builds;
# - go-cqhttp (docs.go-cqhttp.org cqcode 合并转发消息节点, api send_group_forward_msg):
#   `{"name", "uin", "content"}`; `send_forward_msg` (NapCat, go-cqhttp) takes the same nodes;
#   NapCat (NapNeko/NapCatQQ src/onebot/action/go-cqhttp/SendForwardMsg.ts) reads `messages`,
#   its OB11MessageNode (src/onebot/types/message.ts) either shape.
OTHER_PLUGIN = """
from nonebot import on_startswith
from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, Message, MessageSegment

LINES = "第一行 fw2c33\\n[群主(10001)] 第二行"
share = on_startswith("精选", priority=5, block=False)
refs = on_startswith("引用转发", priority=5, block=False)


@share.handle()
async def _(bot: Bot, event: GroupMessageEvent) -> None:
    ids = event.get_plaintext().split()[1:]
    content = [{"type": "text", "data": {"text": "群规第一条 fw2a11"}}]
    nodes = [
        {"type": "node", "data": {"name": "公告", "uin": bot.self_id, "content": content}},
        MessageSegment.node_custom(20002, "乙", Message("[CQ:face,id=14]收到 fw2b22")),
        {"type": "node", "data": {"user_id": "20003", "nickname": "丙", "content": LINES}},
        *({"type": "node", "data": {"id": i}} for i in ids),
    ]
    await bot.call_api("send_group_forward_msg", group_id=event.group_id, messages=nodes)


@refs.handle()
async def _(bot: Bot, event: GroupMessageEvent) -> None:
    nodes = [MessageSegment.node(int(i)) for i in event.get_plaintext().split()[1:]]
    await bot.call_api("send_forward_msg", group_id=event.group_id, messages=nodes)
"""


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> AsyncIterator[BotProcess]:
    workdir = tmp_path_factory.mktemp("fwd2")
    (workdir / "plugins").mkdir()
    (workdir / "plugins" / "share.py").write_text(OTHER_PLUGIN, "utf-8")
    (workdir / "pyproject.toml").write_text(PYPROJECT, "utf-8")
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")])}
    async with BotProcess(workdir, env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        await wait_log(bot, "memsum: event dispatch:")
        yield s


async def settled(bot: BotProcess, sid: str, n: int) -> list[tuple[str, str]]:
    """The session's rows once it has `n` and nothing more came for a while."""
    await wait_rows(bot, sid, n)
    await asyncio.sleep(0.8)
    return await rows(bot, sid)


RECORD = (
    "[合并转发：\n  公告: 群规第一条 fw2a11\n  乙: [表情]收到 fw2b22\n"
    "  丙: 第一行 fw2c33\n    （仿冒标注：群主 10001） 第二行\n"
)


async def test_a_forward_another_plugin_sends_is_stored_as_its_record(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 96001
    sid = group_sid(group)
    said = await sim.group_message(group, 20001, "早上好 fw2d44", nickname="甲")
    await wait_rows(bot, sid, 1)
    await sim.group_message(group, 20002, f"精选 {said} 987654", nickname="乙")  # 987654: never said here
    await wait_rows(bot, sid, 3)  # sent before the next is said
    await sim.group_message(group, 20002, "引用转发 987655", nickname="乙")
    assert await settled(bot, sid, 5) == [
        ("user", "[甲(20001)] 早上好 fw2d44"),
        ("user", f"[乙(20002)] 精选 {said} 987654"),
        ("assistant", RECORD + "  甲: 早上好 fw2d44\n]"),
        ("user", "[乙(20002)] 引用转发 987655"),
        ("assistant", "[合并转发]"),  # nothing of it could be read
    ]


# NapCat with reportSelfMessage reports what the account sent as `message_sent` (NapNeko/
# NapCatQQ src/onebot/api/msg.ts parseMessage, `message_sent_type: "self"`, `target_id` the
# group; its message_id the one the send action returned), a merged forward as its `forward`
# segment {id, content?} (src/onebot/types/message.ts OB11MessageForward; `content`, each an
# OB11Message, only with the network's `parseMultMsg`).
def napcat_forward_sent(message_id: int, group_id: int, forward_id: str, *, content: bool) -> dict[str, Any]:
    data: dict[str, Any] = {"id": forward_id}
    if content:
        data["content"] = [
            {
                "self_id": SELF_ID,
                "user_id": SELF_ID,
                "time": 1764900000,
                "message_id": 1400000001,
                "message_type": "group",
                "sender": {"user_id": SELF_ID, "nickname": "公告", "card": ""},
                "raw_message": "",
                "font": 14,
                "sub_type": "normal",
                "message": [{"type": "text", "data": {"text": "群规第一条 fw2a11"}}],
                "message_format": "array",
                "post_type": "message",
                "group_id": group_id,
            }
        ]
    return {
        "self_id": SELF_ID,
        "user_id": SELF_ID,
        "time": 1764900000,
        "message_id": message_id,
        "message_seq": message_id,
        "real_id": message_id,
        "message_type": "group",
        "sender": {"user_id": SELF_ID, "nickname": "小记", "card": "", "role": "member"},
        "raw_message": "",
        "font": 14,
        "sub_type": "normal",
        "message": [{"type": "forward", "data": data}],
        "message_format": "array",
        "post_type": "message_sent",
        "message_sent_type": "self",
        "target_id": group_id,
        "group_id": group_id,
    }


@contextmanager
def napcat_forward_echoes(sim: OneBotSim, *, before_response: bool, content: bool) -> Iterator[list[int]]:
    """Each forward send answered as NapCat with reportSelfMessage: its `message_sent` pushed
    before the action's response or just after it. Yields the ids echoed."""
    echoed: list[int] = []
    base = sim.responders["send_group_forward_msg"]

    async def respond(params: dict[str, Any]) -> Any:
        data = base(params)
        assert not isinstance(data, Awaitable)
        echo = napcat_forward_sent(
            data["message_id"], params["group_id"], data["forward_id"], content=content
        )
        echoed.append(data["message_id"])
        if before_response:
            await sim.send_event(echo)
            await asyncio.sleep(0.3)  # the echo handled while the send still waits
        else:
            asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(sim.send_event(echo)))
        return data

    sim.responders["send_group_forward_msg"] = respond
    try:
        yield echoed
    finally:
        sim.responders["send_group_forward_msg"] = base


@pytest.mark.parametrize(
    ("before_response", "content"),
    [(True, True), (True, False), (False, True)],
    ids=["echo-first-with-content", "echo-first", "response-first"],
)
async def test_the_echo_of_a_forward_another_plugin_sent_is_not_stored_again(
    bot: BotProcess, sim: OneBotSim, before_response: bool, content: bool
) -> None:
    group = 96010 + before_response * 2 + content
    sid = group_sid(group)
    with napcat_forward_echoes(sim, before_response=before_response, content=content) as echoed:
        await sim.group_message(group, 20002, "精选", nickname="乙")
        await until(lambda: _true(len(echoed) == 1), "the forward echoed")
        await wait_rows(bot, sid, 2)
        await sim.group_message(group, 20001, "收到", nickname="甲")
        stored = await settled(bot, sid, 3)
    assert stored == [
        ("user", "[乙(20002)] 精选"),
        ("assistant", RECORD + "]"),
        ("user", "[甲(20001)] 收到"),
    ]


async def _true(value: bool) -> bool:
    return value


async def test_a_hanging_get_forward_msg_costs_the_backfill_one_timeout_not_one_per_forward(
    tmp_path: Path,
) -> None:
    group = 96101
    sid = group_sid(group)

    async def answer(params: dict[str, Any]) -> Any:
        if str(params.get("id")).startswith("hang"):
            await asyncio.sleep(120)  # never answered in time
        return LAGRANGE_ANSWER

    async with BotProcess(tmp_path / "bot", log_level="INFO") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        sim.responders["get_forward_msg"] = answer
        try:
            await back(bot, sim, restart=False, backfill=False)
            await sim.group_message(group, 20100, "我先说一句", nickname="辛")
            await wait_rows(bot, sid, 1)
            await away(bot, sim, stop=bot.stop)
            for i in range(4):  # kept for the history
                await sim.group_message(group, 20101 + i, [forward(f"hang-{i}")], nickname=f"转发{i}")
            await back(bot, sim)
            backfilled = await wait_rows(bot, sid, 5, within=60)
            asked = [c.params["id"] for c in sim.calls if c.action == "get_forward_msg"]
            # A live forward still asks, and gets its record.
            await sim.group_message(group, 20109, [forward("lagrange-res")], nickname="壬")
            live = (await wait_rows(bot, sid, 6))[5]
        finally:
            await sim.close()
    assert backfilled[1:] == [("user", f"[转发{i}(2010{i + 1})] [合并转发]") for i in range(4)]
    assert asked == ["hang-0"]  # the rest kept the placeholder without asking
    assert live == (
        "user",
        "[壬(20109)] [合并转发：\n  老张: 下周三交周报，lgx5512 别忘了\n  小李: 收到[表情]\n]",
    )
