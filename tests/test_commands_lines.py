"""/压缩线 and /条数线 (R-CFG-2/6) through NoneBot (nonebug): shown with their layer, set
and reset per session or group by superusers only, bad values refused with the range."""

from __future__ import annotations

import pytest
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.onebot import group_record
from tests.fakes.commands import (
    NO_USAGE,
    Role,
)
from tests.fakes.nonebug import (
    SELF_ID,
    group_msg,
    new_group,
    private_msg,
    run,
    seed,
    usage_event,
)

# ---- /压缩线 and /条数线 -----------------------------------------------------------------


async def test_r_cfg_2_superuser_sets_and_resets_compress_at_for_the_session(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(
        app,
        group_msg("/压缩线 0.3", group),
        f"已将本会话的压缩线设为 0.3。\n现在：压缩线 0.3（本会话）；{NO_USAGE}",
    )
    assert (await runtime.get().store.get_settings("session", sid)).get("compress_at") == 0.3
    await run(app, group_msg("/压缩线", group), f"压缩线 0.3（本会话）；{NO_USAGE}")
    await run(
        app,
        group_msg("/压缩线 默认", group),
        f"已恢复本会话的压缩线为默认。\n现在：压缩线 0.8（全局配置）；{NO_USAGE}",
    )
    assert (await runtime.get().store.get_settings("session", sid)).get("compress_at") is None


async def test_r_cfg_2_a_number_typed_right_after_the_command_name_sets_it(app: App) -> None:
    # 「/压缩线0.3」 without the space is the command (a longer word, 「/压缩包…」, is chat).
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(
        app,
        group_msg("/压缩线0.3", group),
        f"已将本会话的压缩线设为 0.3。\n现在：压缩线 0.3（本会话）；{NO_USAGE}",
    )
    assert (await runtime.get().store.get_settings("session", sid)).get("compress_at") == 0.3


async def test_r_cfg_2_group_layer_is_set_with_qun_and_the_session_still_wins(app: App) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/压缩线 群 0.5", group),
        f"已将本群的压缩线设为 0.5。\n现在：压缩线 0.5（本群）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 0.4", group),
        f"已将本会话的压缩线设为 0.4。\n现在：压缩线 0.4（本会话）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 群 0.6", group),
        f"已将本群的压缩线设为 0.6。\n现在：压缩线 0.4（本会话）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 默认", group),
        f"已恢复本会话的压缩线为默认。\n现在：压缩线 0.6（本群）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 群 默认", group),
        f"已恢复本群的压缩线为默认。\n现在：压缩线 0.8（全局配置）；{NO_USAGE}",
    )


async def test_r_cfg_2_compress_at_shows_the_line_in_force_once_usage_is_known(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage_event(sid, 1000, window=64000, trim_budget=60000)
    await run(app, group_msg("/压缩线", group), "压缩线 0.8（全局配置）；生效线 51200 token（窗口 64000）")
    await run(
        app,
        group_msg("/压缩线 0.5", group),
        "已将本会话的压缩线设为 0.5。\n现在：压缩线 0.5（本会话）；生效线 32000 token（窗口 64000）",
    )
    await run(
        app,
        group_msg("/压缩线 0", group),
        "已将本会话的压缩线设为 0。\n现在：压缩线 0（本会话）：不按用量压缩。",
    )


async def test_r_cfg_6_history_limit_set_show_and_reset(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 2)
    await run(
        app,
        group_msg("/条数线 20", group),
        "已将本会话的条数线设为 20。\n现在：条数线 20（本会话）；当前 2 条",
    )
    assert (await runtime.get().store.get_settings("session", sid)).get("history_limit") == 20
    await run(
        app,
        group_msg("/条数线 群 30", group),
        "已将本群的条数线设为 30。\n现在：条数线 20（本会话）；当前 2 条",
    )
    await run(
        app,
        group_msg("/条数线 默认", group),
        "已恢复本会话的条数线为默认。\n现在：条数线 30（本群）；当前 2 条",
    )
    await run(app, group_msg("/条数线", group), "条数线 30（本群）；当前 2 条")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("/压缩线 1.5", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 -0.1", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 abc", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 nan", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 群 2", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/条数线 2.5", "没有修改：条数线须是 0 到 100000 之间的整数（0 表示不按条数压缩）。"),
        ("/条数线 -1", "没有修改：条数线须是 0 到 100000 之间的整数（0 表示不按条数压缩）。"),
        ("/条数线 十", "没有修改：条数线须是 0 到 100000 之间的整数（0 表示不按条数压缩）。"),
        ("/压缩线 0.3 0.4", "用法：/压缩线 [群] [值|默认]"),
        ("/条数线 群 5 6", "用法：/条数线 [群] [值|默认]"),
    ],
)
async def test_r_cfg_2_bad_values_are_refused_with_the_range_and_nothing_changes(
    app: App, text: str, answer: str
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg(text, group), answer)
    store = runtime.get().store
    for name in ("compress_at", "history_limit"):
        assert (await store.get_settings("session", sid)).get(name) is None
        assert (await store.get_settings("place", f"onebot:group:{group}")).get(name) is None


async def test_r_cfg_2_no_group_layer_in_private(app: App) -> None:
    await run(app, private_msg("/压缩线 群 0.3"), "私聊没有群设置。")


@pytest.mark.parametrize("admin_option", [True], indirect=True)
@pytest.mark.parametrize("role", ["owner", "admin"])
@pytest.mark.parametrize(
    "text", ["/压缩线 0.3", "/压缩线 默认", "/压缩线 群 0.3", "/条数线 10", "/条数线 群 默认"]
)
async def test_r_cfg_2_the_lines_stay_superuser_only_with_the_admin_option(
    app: App, admin_option: bool, role: Role, text: str
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await runtime.get().settings.set("compress_at", "place", f"onebot:group:{group}", 0.7)
    await run(app, group_msg(text, group, user=20002, role=role), None)
    rt = runtime.get()
    assert (await rt.settings.of_place("compress_at", group_record(SELF_ID, group))).value == 0.7
    assert (await rt.store.get_settings("session", sid)).get("compress_at") is None
    assert (await rt.store.get_settings("session", sid)).get("history_limit") is None
