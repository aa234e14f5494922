"""/记忆模式 and what a mode does (开 / 仅记录 / 关), and /人设, through NoneBot (nonebug)."""

from __future__ import annotations

import pytest
from nonebot.adapters.onebot.v11 import GroupIncreaseNoticeEvent
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.config import DEFAULT_PERSONA, PERSONA_MAX
from nonebot_plugin_memsum.onebot import group_record, private_record
from tests.fakes.commands import (
    EMPTY_STATUS,
)
from tests.fakes.nonebug import (
    SELF_ID,
    SUPERUSER_ID,
    Like,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    to_me,
    turns_requested,
)


# ---- /记忆模式 and what a mode does --------------------------------------------------
async def test_mode_is_set_shown_and_reset_with_its_layer(app: App) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/记忆模式 仅记录", group),
        "已将本群模式设为 仅记录。\n现在：本群模式：仅记录（本群）：只记录和压缩，不回答。",
    )
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {"mode": "record"}
    await run(app, group_msg("/记忆模式", group), "本群模式：仅记录（本群）：只记录和压缩，不回答。")
    await run(
        app,
        group_msg("/记忆模式 关", group),
        "已将本群模式设为 关。\n现在：本群模式：关（本群）：不记录也不回答（命令照常可用）。",
    )
    await run(
        app,
        group_msg("/记忆模式 默认", group),
        "已恢复本群模式为默认。\n现在：本群模式：开（全局配置）：记录并回答。",
    )
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {}


async def test_mode_in_private_is_the_sessions(app: App) -> None:
    sid = private_record(SELF_ID, SUPERUSER_ID).id
    try:
        await run(
            app,
            private_msg("/记忆模式 关"),
            "已将本会话模式设为 关。\n现在：本会话模式：关（本会话）：不记录也不回答（命令照常可用）。",
        )
        assert (await runtime.get().store.get_settings("session", sid)).get("mode") == "off"
    finally:
        await runtime.get().settings.reset("mode", "session", sid)


@pytest.mark.parametrize("text", ["/记忆模式 休息", "/记忆模式 开 关", "/记忆模式 on"])
async def test_mode_with_an_unknown_word_shows_the_usage_and_changes_nothing(app: App, text: str) -> None:
    group = new_group()
    await run(app, group_msg(text, group), "用法：/记忆模式 [开|仅记录|关|默认]")
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {}


@pytest.mark.parametrize("admin_option", [True], indirect=True)
async def test_a_group_admin_sets_the_mode_of_their_group(app: App, admin_option: bool) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/记忆模式 关", group, user=20002, role="admin"),
        Like("已将本群模式设为 关。.*"),
    )
    assert await runtime.get().controls.mode(group_record(SELF_ID, group)) == "off"


async def test_an_off_group_records_nothing_but_commands_still_work(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg("/记忆模式 关", group), Like("已将本群模式设为 关。.*"))
    assert await turns_requested(app, to_me(group_msg("小记在吗", group, user=20003))) == []
    joined = GroupIncreaseNoticeEvent.model_validate(
        {
            "time": 1_700_000_000,
            "self_id": int(SELF_ID),
            "post_type": "notice",
            "notice_type": "group_increase",
            "sub_type": "approve",
            "group_id": group,
            "user_id": 20004,
            "operator_id": 20004,
        }
    )
    await run(app, joined, None)
    assert await history(sid) == []
    await run(app, group_msg("/摘要", group), EMPTY_STATUS)
    await run(app, group_msg("/记忆模式 开", group), Like("已将本群模式设为 开。.*"))
    await run(app, group_msg("现在记下来", group, user=20003), None)
    assert [m.content for m in await history(sid)] == ["[用户20003(20003)] 现在记下来"]


async def test_a_record_only_group_records_and_never_answers(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg("/记忆模式 仅记录", group), Like("已将本群模式设为 仅记录。.*"))
    assert await turns_requested(app, to_me(group_msg("小记在吗", group, user=20003))) == []
    assert await turns_requested(app, group_msg("大家好", group, user=20003)) == []
    assert [m.content for m in await history(sid)] == [
        "[用户20003(20003)] 小记在吗",
        "[用户20003(20003)] 大家好",
    ]


async def test_an_on_group_starts_a_turn_for_a_message_to_the_bot(app: App) -> None:
    # The counterpart of the tests around it: the same message in an `on` group asks for a turn.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    assert await turns_requested(app, to_me(group_msg("小记在吗", group, user=20003))) == [sid]


async def test_default_mode_record_answers_nowhere(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    # MEMSUM_DEFAULT_MODE=record: another plugin uses the memory without a second chat bot.
    rt = runtime.get()
    config = rt.config.model_copy(update={"memsum_default_mode": "record"})
    monkeypatch.setattr(rt.settings, "_config", config)
    peer = new_group()  # a private peer of its own
    sid = private_record(SELF_ID, peer).id
    assert await turns_requested(app, private_msg("你好", user=peer)) == []
    assert [m.content for m in await history(sid)] == [f"[用户{peer}({peer})] 你好"]


# ---- /人设 ----------------------------------------------------------------------------------
async def test_persona_is_set_shown_used_and_reset(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    persona = "你是一只会说话的猫，\n说话结尾带「喵」。"
    await run(
        app,
        group_msg(f"/人设 {persona}", group),
        f"已设置本群人设（{len(persona)} 字），从下一次回答起生效。\n现在：本群人设（本群）：\n{persona}",
    )
    rt = runtime.get()
    assert (await rt.agent.system_parts(sid))[0] == persona
    await run(app, group_msg("/人设", group), f"本群人设（本群）：\n{persona}")
    await run(
        app,
        group_msg("/人设 默认", group),
        f"已恢复本群人设为默认。\n现在：本群人设（全局配置）：\n{DEFAULT_PERSONA}",
    )
    assert (await rt.agent.system_parts(sid))[0] == DEFAULT_PERSONA


async def test_a_persona_too_long_is_refused_with_the_limit(app: App) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/人设 " + "喵" * (PERSONA_MAX + 1), group),
        f"没有修改：人设最长 {PERSONA_MAX} 字，这段有 {PERSONA_MAX + 1} 字。",
    )
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {}


async def test_a_persona_set_in_one_group_stays_there(app: App) -> None:
    group, other = new_group(), new_group()
    await run(app, group_msg("/人设 只在这个群", group), Like("已设置本群人设.*"))
    rt = runtime.get()
    assert (await rt.settings.of_place("persona", group_record(SELF_ID, other))).value == DEFAULT_PERSONA
