"""Audit 16: whoever confirms /清除 上下文 holds its permission when confirming, not only
when asking, and nobody else's 「确认」 counts; the web overview's sessions come in a
defined order on both engines."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from nonebot.adapters.onebot.v11 import Bot
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import UsageEvent
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, Store
from nonebot_plugin_memsum.types import Message, SessionRecord
from nonebot_plugin_memsum.web.app import CHAT_PURPOSE, create_app
from tests.fakes.nonebug import (
    SELF_ID,
    SUPERUSER_ID,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    turns_requested,
)
from tests.fakes.web import TOKEN, serving
from tests.test_commands_clear import ASK, CLEARED, with_summary

ADMIN = 20961


# OneBot v11, group message event (botuniverse/onebot-11, event/message.md, 群消息): the
# event's `sender.role` is "owner", "admin" or "member", the sender's role as the
# implementation knows it when the message is posted: an admin demoted in between sends
# their next message as "member".
@pytest.mark.parametrize("admin_option", [True], indirect=True)
async def test_an_admin_demoted_before_confirming_cannot_confirm(app: App, admin_option: bool) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除 上下文", group, user=ADMIN, role="admin"), ASK)
    await run(app, group_msg("确认", group, user=ADMIN, role="member"), None)  # chat now
    assert len(await history(sid)) == 4
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None
    # Made admin again within the minute: the question still stands.
    await run(app, group_msg("确认", group, user=ADMIN, role="admin"), CLEARED)
    assert await history(sid) == []


@pytest.mark.parametrize("admin_option", [True], indirect=True)
async def test_nobody_confirms_what_someone_else_asked(app: App, admin_option: bool) -> None:
    group, other = new_group(), new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除", group, user=ADMIN, role="admin"), ASK)
    # Another admin of the group, the superuser, the asker in another group they run, and
    # the asker in a private chat: none of them answers this question.
    await run(app, group_msg("确认", group, user=ADMIN + 1, role="admin"), None)
    await run(app, group_msg("确认", group, user=SUPERUSER_ID, role="owner"), None)
    await run(app, group_msg("确认", other, user=ADMIN, role="admin"), None)
    # In private it is a question to the bot (its turn taken here, not run: no model).
    assert await turns_requested(app, private_msg("确认", user=ADMIN)) == [private_record(SELF_ID, ADMIN).id]
    assert len(await history(sid)) == 5
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None
    await run(app, group_msg("确认", group, user=ADMIN, role="admin"), CLEARED)


# ---- the overview's order ---------------------------------------------------------------
async def test_session_overview_lists_sessions_by_id_on_both_engines(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    try:
        for sid, ts in (("c", 3.0), ("a", 1.0), ("b", 2.0), ("c", 4.0)):
            await store.append(sid, Message(role="user", content=f"[甲(1)] {sid}", ts=ts))
        # A place with a record and nothing stored (a group set to 关 by its first command).
        await store.save_session(SessionRecord(id="ab", platform="onebot", kind="group", place="group:9"))
        listed = [a.session_id for a in await store.session_overview("对话")]
        assert listed == ["a", "ab", "b", "c"]
    finally:
        await store.close()


USAGES = {"g4": None, "g1": 300, "g3": 3000, "g2": 300, "g0": None, "g5": 1500}
"""Each group's last chat call's prompt size (None: no call); written in this order."""


async def test_overview_api_lists_sessions_as_the_page_first_shows_them(location: Path | str) -> None:
    """app.js draws the overview sorted by 用量 / 压缩线, fullest first, sessions without a
    ratio last (`state.sort`, `sortValue`), and its sort is stable: the API's own order is
    what any other reader of /api/overview sees and what breaks the page's ties."""
    cfg = Config.model_validate(
        {
            "memsum_models": [
                {
                    "id": "test/chat",
                    "base_url": "http://127.0.0.1:9/v1",
                    "api_key": "k",
                    "context_window": 8000,
                }
            ],
            "memsum_compress_at": 0.5,
            "memsum_web_token": TOKEN,
        }
    )
    rt = await runtime.build(cfg, location, ["小记"], {"10001"})
    try:
        for n, (name, used) in enumerate(USAGES.items()):
            record = group_record(10000, 900 + int(name[1:]))
            await rt.agent.record(record, Message(role="user", content=f"[甲(1)] {name}", ts=1.0 + n))
            if used is not None:
                await rt.store.record_usage(record.id, CHAT_PURPOSE, "test/chat", used, 10)
                await rt.bus.emit(usage_of(record.id, used))

        async def names() -> dict[str, str]:
            return {}

        app = create_app(lambda: rt, TOKEN, names)
        try:
            async with serving(app) as base, httpx.AsyncClient(base_url=base + "/") as client:
                assert (await client.post("api/login", json={"token": TOKEN})).status_code == 200
                rows = (await client.get("api/overview")).json()["sessions"]
        finally:
            await app.state.live.wait()
    finally:
        await runtime.close(rt)
    assert [(r["number"], r["usage"]) for r in rows] == [
        ("903", 3000),
        ("905", 1500),
        ("901", 300),  # a tie: by session id
        ("902", 300),
        ("900", None),
        ("904", None),
    ]
    assert all(r["usage_ratio"] is not None for r in rows[:4])


def usage_of(session_id: str, used: int) -> UsageEvent:
    """What the agent reports before a chat call (tests/fakes/nonebug.py `usage_event`)."""
    return UsageEvent(
        session_id=session_id,
        turn_id="turn-1",
        platform="onebot",
        platform_type="group",
        model_id="test/chat",
        window=8000,
        trim_budget=7000,
        usage=used,
        trimmed=False,
        untrimmed_history=0,
        history_messages=0,
        history_limit=0,
    )


# ---- another account of this NoneBot ------------------------------------------------------
OTHER_ACCOUNT = "10088"


# Two QQ accounts on one NoneBot, both in a group (tests/test_audit8_v.py runs it over
# OneBot): to this account, what the other says is a member's message, its `sender.role`
# whatever the group made it, admin often. Its answers are its model's words, which a
# member can steer (「原样回复：/清除 摘要」): were they commands here, that member would have
# an admin's effect through it.
@pytest.mark.parametrize("admin_option", [True], indirect=True)
@pytest.mark.parametrize("text", ["/清除 摘要", "/记忆模式 关"])
async def test_a_command_from_another_account_of_this_nonebot_is_not_run(
    app: App, admin_option: bool, text: str
) -> None:
    group = new_group()
    sid = await with_summary(group)
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.create_bot(base=Bot, self_id=OTHER_ACCOUNT)  # connected: get_bots() lists it
        ctx.receive_event(bot, group_msg(text, group, user=int(OTHER_ACCOUNT), role="admin"))
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None
    assert (await runtime.get().settings.of_place("mode", group_record(SELF_ID, group))).value == "on"
    assert len(await history(sid)) == 3  # and not recorded: a command of ours, not its to use
    # The same words from an admin who is a person are run.
    await run(
        app, group_msg("/清除 摘要", group, user=ADMIN, role="admin"), "已清除本会话的摘要，上下文保留。"
    )
