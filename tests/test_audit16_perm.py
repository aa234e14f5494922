"""Audit 16, who may use a command: whoever confirms /清除 上下文 holds its permission when
confirming, not only when asking; nobody else's 「确认」 counts."""

from __future__ import annotations

import pytest
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.nonebug import SUPERUSER_ID, group_msg, history, new_group, private_msg, run
from tests.test_commands_clear import ASK, CLEARED, with_summary

ADMIN = 20061


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
    await run(app, private_msg("确认", user=ADMIN), None)
    assert len(await history(sid)) == 5
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None
    await run(app, group_msg("确认", group, user=ADMIN, role="admin"), CLEARED)
