"""Audit 17: the README as a contract. What 「在 QQ 里使用」 shows typed as a phone types it,
the `.env` keys as owners write them, and what the quick start prints."""

from __future__ import annotations

import pytest
from nonebug import App

from nonebot_plugin_memsum.commands import COMMAND_NAMES, command_starts
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.onebot.recovery import is_command
from tests.fakes.commands import EMPTY_STATUS
from tests.fakes.nonebug import (
    SELF_ID,
    Like,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    turns_requested,
)


# ---- commands typed with a full-width slash ------------------------------------------
# A Chinese keyboard in full-width mode (the default of many phone IMEs) types 「／压缩」;
# the README shows `/压缩`, and an owner reads the two as the same command.
@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("／压缩", "没有需要压缩的内容。"),
        ("／摘要", EMPTY_STATUS),
        ("／清除 摘要", "已清除本会话的摘要，上下文保留。"),
        (
            "／记忆模式 仅记录",
            "已将本群模式设为 仅记录。\n现在：本群模式：仅记录（本群）：只记录和压缩，不回答。",
        ),
        ("／限额100000", Like("已修改本群每日限额。\n现在：本群每日限额 100000 token（本群）.*")),
    ],
)
async def test_a_command_typed_with_a_full_width_slash_is_that_command(
    app: App, text: str, answer: str
) -> None:
    group = new_group()
    await run(app, group_msg(text, group), answer)
    # A command, not chat: never stored.
    assert await history(group_record(SELF_ID, group).id) == []


async def test_a_full_width_command_in_private_is_answered_by_the_command_not_the_model(app: App) -> None:
    # In a private chat every message asks the model: 「／压缩」 read as chat went to it.
    peer = new_group()
    event = private_msg("／压缩", user=peer)
    assert await turns_requested(app, event) == []
    owner = private_msg("／压缩")
    await run(app, owner, "没有需要压缩的内容。")
    assert await history(private_record(SELF_ID, peer).id) == []


async def test_a_members_full_width_command_is_not_ours_and_a_longer_word_is_chat(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg("／摘要", group, user=20003), None)  # a member: not handled, not stored
    assert await history(sid) == []
    await run(app, group_msg("／压缩包怎么解压", group, user=20003), None)
    assert [m.content for m in await history(sid)] == ["[用户20003(20003)] ／压缩包怎么解压"]


def test_fetched_history_skips_a_full_width_command_too() -> None:
    # What the backfill stores goes through recovery.is_command with the same starts.
    starts = command_starts(["/"])
    assert is_command(group_msg("／压缩", 1), starts, COMMAND_NAMES)
    assert not is_command(group_msg("／压缩包怎么解压", 1), starts, COMMAND_NAMES)
    assert command_starts(["/", "／"]) == ("/", "／")
    assert command_starts([""]) == ("",)
