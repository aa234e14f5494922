"""Who may use which command, through NoneBot (nonebug): every command × role × the admin
option; the help, the plugin's metadata, and regressions QA found."""

from __future__ import annotations

from typing import Any

import pytest
from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.commands import COMMANDS, USAGE
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.commands import (
    ALLOWED_ANSWER,
    ROLES,
    Role,
    event_for,
    may_use,
    session_of,
)
from tests.fakes.nonebug import (
    SELF_ID,
    Like,
    Satisfies,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    seed,
    seeded_line,
)


@pytest.mark.parametrize("admin_option", [False, True], indirect=True, ids=["option-off", "option-on"])
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("text", list(ALLOWED_ANSWER))
async def test_who_may_use_each_command(app: App, admin_option: bool, role: Role, text: str) -> None:
    group = new_group()
    session = session_of(role, group)
    before = await history(session)
    expected = ALLOWED_ANSWER[text]
    if not may_use(role, text, admin_option):
        expected = None  # not handled at all: no refusal
    elif callable(expected):
        expected = expected(role)
    await run(app, event_for(role, text, group), expected)
    # Allowed or not, a command never enters history.
    assert await history(session) == before


async def test_a_member_changes_nothing_and_hears_nothing(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": "旧摘要", "kept_messages": 0})
    for text in (
        "/清除 上下文 确认",
        "/清除 摘要",
        "/压缩",
        "/压缩线 0.1",
        "/条数线 群 5",
        "/记忆模式 关",
        "/人设 你是一只猫",
    ):
        await run(app, group_msg(text, group, user=20003), None)
    assert [m.content for m in await history(sid)] == [seeded_line(i) for i in range(3)]
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) == {
        "text": "旧摘要",
        "kept_messages": 0,
    }
    rt = runtime.get()
    for name in ("compress_at", "history_limit", "mode", "persona"):
        assert (await rt.settings.effective(name, sid)).layer == "global"  # type: ignore[arg-type]


async def test_a_members_command_goes_on_to_another_plugins_matcher(app: App) -> None:
    # Another plugin with a /摘要 of its own, below our commands' priority: a member's
    # /摘要 is its business; ours (a superuser's) blocks before it.
    from nonebot import on_command

    other = on_command("摘要", priority=10, block=True)
    seen: list[str] = []

    @other.handle()
    async def _(event: GroupMessageEvent) -> None:
        seen.append(event.get_plaintext())

    try:
        group = new_group()
        await run(app, group_msg("/摘要 今天", group, user=20003), None)
        assert seen == ["/摘要 今天"]
        await run(app, group_msg("/摘要", group), Like("本会话还没有摘要。.*"))
        assert seen == ["/摘要 今天"]
    finally:
        other.destroy()
    assert await history(group_record(SELF_ID, group).id) == []


# ---- help ---------------------------------------------------------------------------
def test_usage_lists_every_command() -> None:
    named = [c.name for c in COMMANDS if c.name]
    assert sorted(named) == sorted(
        ["压缩", "摘要", "压缩线", "条数线", "清除", "回忆", "记忆帮助", "记忆模式", "人设", "用量", "限额"]
    )
    for name in named:
        assert f"\n/{name} " in f"\n{USAGE}"


# ---- QA regressions ------------------------------------------------------------------------


async def test_compress_with_an_argument_answers_the_usage_and_compresses_nothing(app: App) -> None:
    # `/压缩 取消` read as `/压缩` would compress when the user meant to stop.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 2)
    await run(app, group_msg("/压缩 取消", group), "用法：/压缩（不带参数）")
    assert len(await history(sid)) == 2
    assert (await runtime.get().compression.status(sid)).last_run is None


async def test_a_command_from_the_bots_own_account_is_ignored(app: App) -> None:
    # Some implementations report the bot's own messages; an answer starting with "/" must
    # not make the bot answer itself.
    await run(app, group_msg("/摘要", new_group(), user=int(SELF_ID)), None)


async def test_a_forwarded_summary_carries_cq_code_as_text(app: App) -> None:
    # Implementations parse a string node content as CQ codes: a summary quoting
    # `[CQ:at,qq=all]` would make the bot @ everyone.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    long_text = "有人发了 [CQ:at,qq=all] 想让机器人复述。" * 20
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": long_text, "kept_messages": 0})

    def as_text(nodes: Any) -> bool:
        contents = [n["data"]["content"] for n in nodes]
        return all(seg["type"] == "text" for c in contents for seg in c) and long_text in "".join(
            seg["data"]["text"] for c in contents for seg in c
        )

    event = group_msg("/摘要", group)
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        ctx.should_call_api(
            "send_group_forward_msg", {"group_id": group, "messages": Satisfies(as_text)}, result={}
        )


async def test_an_empty_message_event_is_neither_recorded_nor_answered(app: App) -> None:
    group = new_group()
    await run(app, group_msg("", group, user=20003), None)
    await run(app, private_msg("  ", user=group), None)  # a private peer of its own
    assert await history(group_record(SELF_ID, group).id) == []
    assert await history(private_record(SELF_ID, group).id) == []


def test_plugin_metadata_is_complete_for_the_plugin_store() -> None:
    # What the NoneBot plugin store reads: type, adapters, config class and a usage that
    # names every command.
    from nonebot import get_plugin

    from nonebot_plugin_memsum.config import Config

    plugin = get_plugin("nonebot_plugin_memsum")
    assert plugin is not None
    meta = plugin.metadata
    assert meta is not None
    assert meta.type == "application"
    assert meta.supported_adapters == {"~onebot.v11"}
    assert meta.config is Config
    assert meta.homepage
    for command in COMMANDS:
        if command.name:
            assert f"/{command.name} " in meta.usage
