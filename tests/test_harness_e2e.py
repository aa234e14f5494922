"""The end-to-end harness itself: bot.py as a subprocess, and the OneBot v11 simulator.

One bot process with no memsum configuration is shared by the module; tests that need
their own (a bad config, a restart) start one. The simulator is also checked on its own
against the adapter's event models and a bare WebSocket server that plays the bot.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from nonebot.adapters.onebot.v11 import Adapter
from nonebot.adapters.onebot.v11.event import (
    GroupIncreaseNoticeEvent,
    GroupMessageEvent,
    GroupRecallNoticeEvent,
    PokeNotifyEvent,
    PrivateMessageEvent,
    Reply,
)
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers

from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import connected, restart, wait_log
from tests.fakes.onebot import ConnectionRejectedError, OneBotSim, at, face, image, plain_text, reply, text

PARSE_ERRORS = ("Event Parser Error", "Failed to parse event")


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BotProcess]:
    proc = BotProcess(tmp_path_factory.mktemp("bot"))
    # Nothing of ours at all, not even the database path: the plugin must find its own
    # place, and localstore keeps that inside the work folder.
    del proc.env["MEMSUM_DB_PATH"]
    async with proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


# --- bot.py as a process ---------------------------------------------------------------


async def test_bot_starts_with_no_memsum_config_and_accepts_the_implementation(
    bot: BotProcess, sim: OneBotSim
) -> None:
    assert "MEMSUM" not in (bot.workdir / ".env").read_text(encoding="utf-8")
    log = bot.log()
    assert 'Succeeded to load plugin "nonebot_plugin_memsum"' in log
    assert "Bot 10000 connected" in log
    # gcpolicy.py: what start-up left is frozen once the plugin's start-up is done
    assert log.index("memsum: database") < log.index("objects left by start-up frozen")
    assert [line for line in log.splitlines() if "[ERROR]" in line or "[CRITICAL]" in line] == []
    # The store went where localstore was told, inside the work folder, not the real home.
    assert list((bot.workdir / "localstore" / "data").rglob("*.db"))


async def test_no_chat_model_is_warned_exactly_once(bot: BotProcess, sim: OneBotSim) -> None:
    # "no chat model" or "no chat-capable model": the wording may vary, the count may not.
    warnings = [line for line in bot.log().splitlines() if re.search(r"no chat[\w-]* model", line)]
    assert len(warnings) == 1, warnings
    assert "[WARNING]" in warnings[0]


@pytest.mark.parametrize(
    ("token", "reason"), [("wrong", "Authorization Header is invalid"), (None, "Missing")]
)
async def test_connection_without_the_access_token_is_refused(
    bot: BotProcess, token: str | None, reason: str
) -> None:
    intruder = OneBotSim(bot.ws_url, self_id=10002, access_token=token)
    with pytest.raises(ConnectionRejectedError) as refused:
        await intruder.connect(timeout=5)
    assert refused.value.status == 403
    assert reason in await wait_log(bot, reason)
    assert "Bot 10002 connected" not in bot.log()


async def test_group_message_with_every_segment_kind_is_parsed(bot: BotProcess, sim: OneBotSim) -> None:
    sim.add_member(30001, 20001, "张三", card="老张", role="admin")
    first = await sim.group_message(30001, 20001, "大家好")
    second = await sim.group_message(
        30001, 20002, [at(20001), text(" 看这个"), image(summary="[图片]"), face(14)], nickname="李四"
    )
    log = await wait_log(bot, f"[message.group.normal]: Message {second} from 20002@[群:30001]")
    assert f"[message.group.normal]: Message {first} from 20001@[群:30001] '大家好'" in log
    assert not [e for e in PARSE_ERRORS if e in log]


async def test_reply_is_resolved_through_get_msg(bot: BotProcess, sim: OneBotSim) -> None:
    original = await sim.group_message(30001, 20001, "原话")
    mark = len(sim.calls)
    answer = await sim.group_message(30001, 20002, [reply(original), text("回复你")])
    call = await sim.wait_call("get_msg", after=mark)
    assert call.params["message_id"] == original
    log = await wait_log(bot, f"Message {answer} from 20002")
    assert "Error when getting message reply info" not in log


async def test_private_message_and_notices_are_parsed(bot: BotProcess, sim: OneBotSim) -> None:
    mid = await sim.private_message(20001, "私聊一句", nickname="张三")
    recalled = await sim.group_message(30001, 20001, "说错了")
    await sim.notice("group_increase", group_id=30001, user_id=20003)
    await sim.notice("group_decrease", group_id=30001, user_id=20003)
    await sim.notice("group_admin", group_id=30001, user_id=20002)
    await sim.notice("group_ban", group_id=30001, user_id=20002, operator_id=20001)
    await sim.notice("group_recall", group_id=30001, user_id=20001, message_id=recalled)
    await sim.notice("notify", sub_type="poke", group_id=30001, user_id=20001)
    await wait_log(bot, f"[message.private.friend]: Message {mid} from 20001 '私聊一句'")
    for name in (
        "notice.group_increase.approve",
        "notice.group_decrease.leave",
        "notice.group_admin.set",
        "notice.group_ban.ban",
        "notice.group_recall",
        "notice.notify.poke",
    ):
        await wait_log(bot, f"[{name}]:")
    assert not [e for e in PARSE_ERRORS if e in bot.log()]


async def test_sigint_exits_zero_and_a_restart_keeps_the_folder(tmp_path: Path) -> None:
    async with BotProcess(tmp_path) as bot:
        async with connected(bot) as sim:
            port, env = bot.port, (tmp_path / ".env").read_text(encoding="utf-8")
            await restart(bot, sim)
            assert bot.returncode is None
            mid = await sim.group_message(30001, 20001, "又见面了")
            await wait_log(bot, f"Message {mid} from 20001")
            assert (bot.port, (tmp_path / ".env").read_text(encoding="utf-8")) == (port, env)
            assert bot.log(all_runs=True).count("Application startup complete") == 2
        assert await bot.stop() == 0
        assert await bot.stop() == 0  # idempotent


async def test_bad_config_value_stops_start_up_naming_the_key(tmp_path: Path) -> None:
    model = {
        "id": "p/m",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "sk-do-not-log",
        "context_window": 8000,
    }
    # At INFO, the level an operator runs at; at DEBUG NoneBot itself prints the whole config.
    bot = BotProcess(
        tmp_path, env={"MEMSUM_MODELS": json.dumps([model]), "MEMSUM_COMPRESS_AT": "2"}, log_level="INFO"
    )
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    log = exited.value.log
    assert exited.value.returncode != 0
    naming = [line for line in log.splitlines() if "MEMSUM_COMPRESS_AT" in line]
    assert len(naming) == 1, log
    assert "Traceback" not in log
    assert "sk-do-not-log" not in log


# --- the simulator on its own ----------------------------------------------------------


class CapturingSim(OneBotSim):
    """The sim with its socket replaced by a list: the events are what is under test."""

    def __init__(self) -> None:
        super().__init__("ws://unused", self_id=10000)
        self.pushed: list[dict[str, Any]] = []

    async def send_event(self, event: Mapping[str, Any]) -> None:
        self.pushed.append({"time": 1, "self_id": self.self_id, **event})


async def test_sim_events_parse_as_the_adapters_exact_models() -> None:
    sim = CapturingSim()
    m = await sim.group_message(1, 2, [at(10000), text("嗨"), image(), face(1)], card="卡片")
    await sim.private_message(2, "hi")
    await sim.notice("group_increase", group_id=1, user_id=3)
    await sim.notice("group_recall", group_id=1, user_id=2, message_id=m)
    await sim.notice("notify", group_id=1, user_id=2)
    events = [Adapter.json_to_event(event) for event in sim.pushed]
    assert [type(e) for e in events] == [
        GroupMessageEvent,
        PrivateMessageEvent,
        GroupIncreaseNoticeEvent,
        GroupRecallNoticeEvent,
        PokeNotifyEvent,
    ]
    group = events[0]
    assert isinstance(group, GroupMessageEvent)
    assert (group.sender.card, group.sender.role) == ("卡片", "member")
    assert group.raw_message.startswith("[CQ:at,qq=10000]嗨[CQ:image,file=")


class FakeBotServer:
    """A bare reverse-WS server standing in for NoneBot: records events, makes calls."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.headers: Headers = Headers()
        self.connected = asyncio.Event()
        self._conn: ServerConnection | None = None
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._seq = 0

    async def handler(self, conn: ServerConnection) -> None:
        assert conn.request is not None
        self.headers = conn.request.headers
        self._conn = conn
        self.connected.set()
        async for raw in conn:
            data = json.loads(raw)
            if "post_type" in data:
                await self.events.put(data)
            else:
                self._replies.pop(data["echo"]).set_result(data)

    async def call(self, action: str, **params: Any) -> dict[str, Any]:
        assert self._conn is not None
        self._seq += 1
        echo = str(self._seq)
        future = self._replies[echo] = asyncio.get_running_loop().create_future()
        await self._conn.send(json.dumps({"action": action, "params": params, "echo": echo}))
        return await asyncio.wait_for(future, 5)


async def test_sim_answers_api_calls_like_an_implementation() -> None:
    server = FakeBotServer()
    async with serve(server.handler, "127.0.0.1", 0) as ws_server:
        port = next(iter(ws_server.sockets)).getsockname()[1]
        async with OneBotSim(
            f"ws://127.0.0.1:{port}/onebot/v11/ws", access_token="tok", nickname="小记"
        ) as sim:
            await asyncio.wait_for(server.connected.wait(), 5)
            assert server.headers["X-Self-ID"] == "10000"
            assert server.headers["X-Client-Role"] == "Universal"
            assert server.headers["Authorization"] == "Bearer tok"
            hello = await asyncio.wait_for(server.events.get(), 5)
            assert (hello["meta_event_type"], hello["sub_type"]) == ("lifecycle", "connect")

            login = await server.call("get_login_info")
            assert login["data"] == {"user_id": 10000, "nickname": "小记"}

            sent = await server.call("send_group_msg", group_id=30001, message=[text("我说的话")])
            bot_mid = sent["data"]["message_id"]
            mid = await sim.group_message(30001, 20001, [reply(bot_mid), text("回你")], nickname="张三")
            event = await asyncio.wait_for(server.events.get(), 5)
            assert event["message"][0] == {"type": "reply", "data": {"id": str(bot_mid)}}
            quoted = await server.call("get_msg", message_id=bot_mid)
            # What the adapter's _check_reply needs to set to_me on a reply to the bot.
            assert Reply.model_validate(quoted["data"]).sender.user_id == 10000
            own = await server.call("get_msg", message_id=mid)
            assert own["data"]["sender"]["nickname"] == "张三"
            missing = await server.call("get_msg", message_id=999_999)
            assert (missing["status"], missing["retcode"]) == ("failed", 100)

            member = await server.call("get_group_member_info", group_id=30001, user_id=20001)
            assert (member["data"]["nickname"], member["data"]["role"]) == ("张三", "member")
            unknown = await server.call("set_essence_msg", message_id=mid)
            assert (unknown["status"], unknown["retcode"]) == ("failed", 1404)
            broken = await server.call("get_group_member_info", group_id=30001)  # no user_id
            assert (broken["status"], broken["retcode"]) == ("failed", 102)

            await server.call(
                "send_msg", message_type="private", user_id=20001, message="CQ &amp; [CQ:face,id=1]"
            )
            node = {
                "type": "node",
                "data": {"user_id": "10000", "nickname": "小记", "content": [text("长回答")]},
            }
            forward = await server.call("send_group_forward_msg", group_id=30001, messages=[node, node])
            assert forward["status"] == "ok"

            assert sim.sent_texts() == ["我说的话", "CQ & ", "长回答\n长回答"]
            assert [c.action for c in sim.calls][:2] == ["get_login_info", "send_group_msg"]
            assert (await sim.wait_call("send_msg")).params["user_id"] == 20001
            with pytest.raises(TimeoutError):
                await sim.wait_call("send_like", timeout=0.2)


def test_plain_text_reads_cq_strings_and_forward_nodes() -> None:
    assert plain_text("a&#91;1&#93;[CQ:at,qq=1]b") == "a[1]b"
    assert plain_text({"type": "text", "data": {"text": "x"}}) == "x"
    nodes = [{"type": "node", "data": {"content": "一"}}, {"type": "node", "data": {"content": [text("二")]}}]
    assert plain_text(nodes) == "一\n二"
