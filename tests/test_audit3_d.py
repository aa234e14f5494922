"""A third outside audit of the owner's commands and controls (issues 5 and 10) as QQ users
meet them: odd arguments (full-width digits and points, signs, words after a value), a
question that another clear already settled, and a 关 place across a reconnect.

In-process scenarios go through NoneBot (nonebug) with the plugin's real SQLite store;
the reconnect runs bot.py with the OneBot simulator over a real WebSocket."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from nonebot.adapters.onebot.v11 import MessageSegment
from nonebug import App

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.compression.service import RUNS_NAMESPACE
from nonebot_plugin_memsum.controls import CAP_NOTICE
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.usage import CAP_NOTE
from tests.fakes.botproc import BotProcess
from tests.fakes.commands import ALLOWED_ANSWER, NO_USAGE
from tests.fakes.e2e import connected, group_sid, query, until, wait_log
from tests.fakes.llm_server import ScriptedLLM
from tests.fakes.nonebug import (
    SELF_ID,
    Like,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    seed,
    to_me,
    turns_requested,
)
from tests.fakes.onebot import SEND_ACTIONS, plain_text

ASK = str(ALLOWED_ANSWER["/清除"])
CLEARED = "已清除本会话的上下文和摘要。"
LINE_RANGE = "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"


async def stored_setting(scope: str, key: str, name: str) -> object:
    return (await runtime.get().store.get_settings(scope, key)).get(name)


# ---- values typed with a Chinese input method -------------------------------------------
async def test_r_cfg_2_a_line_typed_in_full_width_digits_and_point_is_that_number(app: App) -> None:
    # A Chinese IME in full-width mode types 「０．５」; 「０.５」 was already read as 0.5,
    # so refusing the all-full-width spelling of the same number is only confusing.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(
        app,
        group_msg("/压缩线 ０．５", group),
        f"已将本会话的压缩线设为 0.5。\n现在：压缩线 0.5（本会话）；{NO_USAGE}",
    )
    assert await stored_setting("session", sid, "compress_at") == 0.5
    await run(
        app,
        group_msg("/条数线　群　８０", group),  # full-width spaces too
        "已将本群的条数线设为 80。\n现在：条数线 80（本群）；当前 0 条",
    )
    assert await stored_setting("place", f"onebot:group:{group}", "history_limit") == 80


async def test_a_cap_and_a_period_typed_in_full_width_digits_are_read(app: App) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/限额 ８０００", group),
        f"已修改本群每日限额。\n现在：本群每日限额 8000 token（本群），今天已用 0，还剩 8000。{CAP_NOTE}",
    )
    await run(
        app,
        group_msg("/用量 ７天", group),
        "本群用量（7天）：回答 0 次，压缩 0 次\n这段时间没有调用模型。\n\n"
        f"每日限额 8000 token（本群），今天已用 0，还剩 8000。{CAP_NOTE}",
    )


@pytest.mark.parametrize("word", ["８０％", "80%", "０．５．５", "1/2", "0,5", "0。5"])
async def test_r_cfg_2_a_percentage_or_a_malformed_line_is_refused_with_the_range(
    app: App, word: str
) -> None:
    # 「８０％」 must not be half-read as 80 (or as 0.8 when the range says 0~1).
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg(f"/压缩线 {word}", group), LINE_RANGE)
    assert await stored_setting("session", sid, "compress_at") is None


async def test_r_cfg_4_minus_zero_is_the_line_off_and_is_shown_as_0(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(
        app,
        group_msg("/压缩线 -0", group),
        "已将本会话的压缩线设为 0。\n现在：压缩线 0（本会话）：不按用量压缩。",
    )
    assert await runtime.get().compression.compress_at(sid, "onebot") is None  # R-CFG-4


@pytest.mark.parametrize("text", ["/压缩线 群", "/条数线 群", "/条数线 群 默认"])
async def test_r_cfg_2_a_private_chat_has_no_group_line_to_show_either(app: App, text: str) -> None:
    # 「/压缩线 群 0.3」 in private already says so; asking to see the group's line there
    # answered with the session's global value as if it were a group's.
    await run(app, private_msg(text), "私聊没有群设置。")


# ---- /清除: a question settled another way ---------------------------------------------
async def with_summary(group: int, n: int = 3) -> str:
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, n)
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": "旧摘要", "kept_messages": 0})
    return sid


async def test_r_mem_2_a_confirm_after_the_context_was_cleared_without_it_clears_nothing_more(
    app: App,
) -> None:
    # The owner asks, then clears with 「/清除 上下文 确认」 instead; the group talks on, and
    # the owner's 「确认」 a moment later (an answer to a member) is chat, not a second clear.
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除", group), ASK)
    await run(app, group_msg("/清除 上下文 确认", group), CLEARED)
    await run(app, group_msg("明天几点集合？", group, user=20003), None)
    await run(app, group_msg("确认", group), None)
    assert [m.content.split("] ", 1)[1] for m in await history(sid)] == ["明天几点集合？", "确认"]


# ---- times in the bot's time zone ----------------------------------------------------------
async def test_summary_shows_its_times_in_the_configured_time_zone_as_recall_does(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MEMSUM_TIMEZONE is the bot's time zone (README); /回忆 shows times in it, so /摘要
    # must too, not in the server's zone (UTC here): one bot, one clock for its owner.
    rt = runtime.get()
    monkeypatch.setattr(rt, "config", rt.config.model_copy(update={"memsum_timezone": "Pacific/Kiritimati"}))
    group = new_group()
    sid = group_record(SELF_ID, group).id
    moment = datetime(2026, 12, 3, 23, 30, tzinfo=UTC).timestamp()  # 12-04 13:30 at UTC+14
    await rt.store.put_meta(SUMMARY_NAMESPACE, sid, {"text": "周末爬山", "kept_messages": 0, "time": moment})
    run_ = {"time": moment, "outcome": "done", "reason": None, "kept_messages": 0, "archived": 5}
    await rt.store.put_meta(RUNS_NAMESPACE, sid, run_)
    await run(
        app,
        group_msg("/摘要", group),
        Like(
            r"本会话摘要（2026-12-04 13:30）：\n周末爬山\n\n保留原文 0 条\n"
            r"上次压缩：2026-12-04 13:30 成功，归档 5 条，保留原文 0 条\n.*"
        ),
    )


# ---- a 关 group across a reconnect -------------------------------------------------------
async def test_an_off_group_stores_nothing_said_while_off_when_the_bot_reconnects(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # Issue 10: 「关」 neither records nor answers. What the group said while it was off
    # (here: before and during a dropped connection) must not come back through the
    # history fetched on reconnect.
    group = 7301
    sid = group_sid(group)
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config()])}
    async with BotProcess(tmp_path / "bot", env=env, log_level="INFO") as bot, connected(bot) as sim:
        await sim.group_message(group, 20001, "关之前说的", nickname="甲")
        await until(lambda: stored_count(bot, sid, 1), "the message said while on")
        await sim.group_message(group, 10001, "/记忆模式 关", nickname="主人")
        sent = await sim.wait_call(set(SEND_ACTIONS))
        assert plain_text(sent.params["message"]).startswith("已将本群模式设为 关。")
        await sim.group_message(group, 20002, "关了以后说的", nickname="乙")
        await sim.close()
        await sim.group_message(group, 20003, "断线时说的", nickname="丙")
        await sim.connect()
        await wait_log(bot, "memsum: backfill of 10000:")
        rows = await query(bot.db_path, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", sid)
        assert [r[0] for r in rows] == ["[甲(20001)] 关之前说的"]
        await sim.close()


async def stored_count(bot: BotProcess, sid: str, n: int) -> bool:
    rows = await query(bot.db_path, "SELECT count(*) FROM messages WHERE session_id = ?", sid)
    return rows[0][0] >= n


async def test_r_mem_2_only_the_admin_who_asked_can_confirm_a_clear_over_onebot(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # A group admin (option on) asks to clear; a member's 「确认」 and even the owner's are
    # chat (stored, unanswered), the admin's own clears. Through bot.py and the fast path.
    group = 7302
    sid = group_sid(group)
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config()]), "MEMSUM_GROUP_ADMIN_COMMANDS": "true"}
    async with BotProcess(tmp_path / "bot", env=env, log_level="INFO") as bot, connected(bot) as sim:
        await sim.group_message(group, 20001, "周末去爬山吗", nickname="甲")
        await until(lambda: stored_count(bot, sid, 1), "the first line")
        mark = len(sim.calls)
        await sim.group_message(group, 20005, "/清除", nickname="管理", role="admin")
        asked = await sim.wait_call(set(SEND_ACTIONS), after=mark)
        assert plain_text(asked.params["message"]).endswith("60 秒内回复「确认」继续。")
        await sim.group_message(group, 20001, "确认", nickname="甲")
        await sim.group_message(group, 10001, "确认", nickname="主人")
        await until(lambda: stored_count(bot, sid, 3), "both 「确认」 stored as chat")
        mark = len(sim.calls)
        await sim.group_message(group, 20005, "确认", nickname="管理", role="admin")
        done = await sim.wait_call(set(SEND_ACTIONS), after=mark)
        assert plain_text(done.params["message"]) == CLEARED
        sql = "SELECT content FROM messages WHERE session_id = ? AND archived = 0"
        assert await query(bot.db_path, sql, sid) == []
        said = [c.params["message"] for c in sim.calls if c.action in SEND_ACTIONS]
        assert len(said) == 2  # the question and the receipt, nothing to the others' 「确认」
        await sim.close()


# ---- the daily cap by the bot's day -------------------------------------------------------
async def test_the_cap_and_usage_roll_over_at_midnight_of_the_configured_zone_not_the_servers(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server runs on UTC; the bot's day is Shanghai's (UTC+8). Spent at 23:30 in
    # Shanghai, capped; at 00:30 in Shanghai (still the same UTC day) a new day has begun.
    controls = runtime.get().controls
    monkeypatch.setattr(controls, "_zone", ZoneInfo("Asia/Shanghai"))
    late = datetime(2026, 12, 3, 15, 30, tzinfo=UTC).timestamp()
    group = new_group()
    record = group_record(SELF_ID, group)
    await runtime.get().store.save_session(record)
    await runtime.get().settings.set("daily_token_cap", "place", f"onebot:group:{group}", 100)
    monkeypatch.setattr(clock, "now", lambda: late)
    await runtime.get().store.record_usage(record.id, "对话", "test/model", 90, 10, 0)
    asked: list[str] = []
    monkeypatch.setattr(runtime.get().agent, "request_turn", lambda sid, *a, **k: asked.append(sid))
    capped = to_me(group_msg("还在吗", group, user=20003))
    await run(app, capped, MessageSegment.reply(capped.message_id) + CAP_NOTICE)  # type: ignore[arg-type]
    assert asked == []
    monkeypatch.undo()  # the real agent, the real clock and zone again: the next day in Shanghai
    monkeypatch.setattr(controls, "_zone", ZoneInfo("Asia/Shanghai"))
    monkeypatch.setattr(clock, "now", lambda: late + 3600)
    assert await turns_requested(app, to_me(group_msg("新的一天", group, user=20003))) == [record.id]
    await run(
        app,
        group_msg("/用量", group),
        "本群用量（今天）：回答 0 次，压缩 0 次\n这段时间没有调用模型。\n\n"
        f"每日限额 100 token（本群），今天已用 0，还剩 100。{CAP_NOTE}",
    )
