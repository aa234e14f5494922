"""/清除 (R-MEM-2) through NoneBot (nonebug): the summary alone, or the context after a
「确认」 from the same user in the same session within 60 seconds."""

from __future__ import annotations

import pytest
from nonebug import App

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.commands import (
    ALLOWED_ANSWER,
)
from tests.fakes.nonebug import (
    SELF_ID,
    SUPERUSER_ID,
    group_msg,
    history,
    new_group,
    run,
    seed,
)

# ---- /清除 ------------------------------------------------------------------------------
ASK = str(ALLOWED_ANSWER["/清除"])
CLEARED = "已清除本会话的上下文和摘要。"


async def with_summary(group: int, n: int = 3) -> str:
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, n)
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": "旧摘要", "kept_messages": 0})
    return sid


async def test_r_mem_2_clear_summary_keeps_the_context(app: App) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除 摘要", group), "已清除本会话的摘要，上下文保留。")
    assert len(await history(sid)) == 3
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None


async def test_r_mem_2_clear_context_with_confirm_word_skips_the_question(app: App) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除 上下文 确认", group), CLEARED)
    assert await history(sid) == []
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None


@pytest.mark.parametrize("text", ["/清除", "/清除 上下文"])
async def test_r_mem_2_clear_context_asks_and_confirm_does_it_unrecorded(app: App, text: str) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg(text, group), ASK)
    assert len(await history(sid)) == 3  # nothing yet
    await run(app, group_msg("确认", group), CLEARED)
    # Had 「确认」 been recorded it would follow the clear; it is an operator action.
    assert await history(sid) == []
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None
    # A second 「确认」 is plain chat again: recorded, nothing answered.
    await run(app, group_msg("确认", group), None)
    assert [m.content for m in await history(sid)] == [f"[用户{SUPERUSER_ID}({SUPERUSER_ID})] 确认"]


async def test_r_mem_2_confirm_from_someone_else_or_elsewhere_does_nothing(app: App) -> None:
    group, other = new_group(), new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除", group), ASK)
    await run(app, group_msg("确认", group, user=20003), None)  # another member: chat
    await run(app, group_msg("确认", other), None)  # the same user elsewhere: chat
    assert len(await history(sid)) == 4
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None
    await run(app, group_msg("确认", group), CLEARED)
    assert await history(sid) == []


async def confirmed_after(app: App, monkeypatch: pytest.MonkeyPatch, seconds: int, expect: str | None) -> str:
    """/清除 in a new group with a summary, and 「确认」 `seconds` later, which the bot answers
    with exactly `expect` (None: nothing); the session's id."""
    group = new_group()
    sid = await with_summary(group)
    now = clock.now()
    monkeypatch.setattr(clock, "now", lambda: now)
    await run(app, group_msg("/清除", group), ASK)
    monkeypatch.setattr(clock, "now", lambda: now + seconds)
    await run(app, group_msg("确认", group), expect)
    return sid


async def test_r_mem_2_confirm_after_60_seconds_is_too_late(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await confirmed_after(app, monkeypatch, 61, None)
    assert len(await history(sid)) == 4  # the late 「确认」 is ordinary chat
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None


async def test_r_mem_2_confirm_within_60_seconds_counts(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = await confirmed_after(app, monkeypatch, 60, CLEARED)
    assert await history(sid) == []


@pytest.mark.parametrize("admin_option", [True], indirect=True)
async def test_r_mem_2_group_admin_clears_with_confirmation(app: App, admin_option: bool) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除", group, user=20002, role="admin"), ASK)
    await run(app, group_msg("确认", group, user=20002, role="admin"), CLEARED)
    assert await history(sid) == []


@pytest.mark.parametrize("text", ["/清除 全部", "/清除 摘要 确认 现在", "/清除 上下文 好的"])
async def test_clear_with_unknown_words_shows_usage_and_clears_nothing(app: App, text: str) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg(text, group), "用法：/清除 [上下文|摘要]")
    assert len(await history(sid)) == 3
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None
