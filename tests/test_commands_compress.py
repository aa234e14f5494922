"""/压缩 and /摘要 through NoneBot (nonebug), with a real summary model on 127.0.0.1 where a
test needs one; and the texts they answer with, pure."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from nonebot.adapters.onebot.v11 import Bot
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.commands import parse_setting, receipt, setting_text, status_text
from nonebot_plugin_memsum.compression.service import CompressionResult, LastRun, SessionStatus
from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.settings import Resolved
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.commands import (
    EMPTY_STATUS,
    NO_USAGE,
    event_for,
)
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.nonebug import (
    SELF_ID,
    SUPERUSER_ID,
    Like,
    Satisfies,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    seed,
    usage_event,
)

CHAT_SUMMARY = "【最近在聊什么】\n大家在商量周末去爬山\n【谁有问题没回应】\n无\n【关键原话要点】\n无"


@pytest.fixture
def llm(app: App) -> Iterator[ScriptedLLM]:
    """A real summary model on 127.0.0.1 for this test."""
    rt = runtime.get()
    with ScriptedLLM() as server:
        rt.registry.set_models([ModelConfig.model_validate(server.model_config())])
        try:
            yield server
        finally:
            rt.registry.set_models([])


# ---- /压缩 ------------------------------------------------------------------------------
async def test_compress_nothing_to_compress(app: App) -> None:
    await run(app, group_msg("/压缩", new_group()), "没有需要压缩的内容。")


async def test_compress_without_a_model_fails_with_the_reason_and_keeps_history(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    await run(app, group_msg("/压缩", group), "压缩失败：没有可用的摘要模型")
    assert len(await history(sid)) == 3
    status = await runtime.get().compression.status(sid)
    assert status.last_run is not None
    assert (status.last_run.outcome, status.last_run.reason) == ("error", "没有可用的摘要模型")


@pytest.mark.parametrize("admin_option", [True], indirect=True)
@pytest.mark.parametrize("who", ["superuser", "admin"])
async def test_compress_answers_with_a_receipt(
    app: App, admin_option: bool, llm: ScriptedLLM, who: Literal["superuser", "admin"]
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 4)
    llm.push(Reply(f"{CHAT_SUMMARY}\n【保留原文】\n无"))
    answer = Like(r"压缩完成：(\d+) → (\d+) token，保留原文 0 条，归档 4 条。")
    await run(app, event_for(who, "/压缩", group), answer)
    assert answer.seen is not None
    before, after = map(int, re.findall(r"\d+", answer.seen)[:2])
    assert before > 0
    assert after > 0
    remaining = await history(sid)
    assert [(m.role, m.content, m.event_marker) for m in remaining] == [("system", "对话已压缩", True)]
    stored = await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid)
    assert stored is not None
    assert stored["text"] == CHAT_SUMMARY
    assert len(llm.requests) == 1


async def test_compress_model_error_names_no_secret(app: App, llm: ScriptedLLM) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    llm.push(Reply(status=400, error=f"bad request for key {API_KEY[:6]}"))
    answer = Like(r"压缩失败：摘要模型出错.*")
    await run(app, group_msg("/压缩", group), answer)
    assert answer.seen is not None
    assert API_KEY not in answer.seen
    assert len(await history(sid)) == 3
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None


# ---- /摘要 ------------------------------------------------------------------------------
async def test_summary_shows_summary_kept_last_run_usage_and_count(app: App, llm: ScriptedLLM) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 4)
    llm.push(Reply(f"{CHAT_SUMMARY}\n【保留原文】\n无"))
    await run(app, group_msg("/压缩", group), Like("压缩完成：.*"))
    await usage_event(sid, 12345)
    await runtime.get().settings.set("history_limit", "session", sid, 40)
    answer = Like(
        r"本会话摘要（\d{4}-\d\d-\d\d \d\d:\d\d）：\n"
        + re.escape(CHAT_SUMMARY)
        + r"\n\n保留原文 0 条\n上次压缩：\d{4}-\d\d-\d\d \d\d:\d\d 成功，归档 4 条，保留原文 0 条\n"
        r"用量 12345 / 压缩线 51200 token（窗口 64000）\n条数 0 / 条数线 40\n"
        r"设置：压缩线 0\.8（全局配置），条数线 40（本会话）"
    )
    await run(app, group_msg("/摘要", group), answer)


async def test_summary_line_is_capped_by_the_trim_budget(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage_event(sid, 30000, window=64000, trim_budget=40000)
    await run(app, group_msg("/摘要", group), Like(r".*\n用量 30000 / 压缩线 40000 token（窗口 64000）\n.*"))


async def test_summary_says_the_line_is_off_at_compress_at_zero(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage_event(sid, 30000)
    await runtime.get().settings.set("compress_at", "session", sid, 0)
    await run(app, group_msg("/摘要", group), Like(r".*\n用量 30000 token；压缩线已关闭，不按用量压缩。\n.*"))


async def test_summary_shows_a_failed_run_and_its_reason(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 2)
    await run(app, group_msg("/压缩", group), "压缩失败：没有可用的摘要模型")
    await run(app, group_msg("/摘要", group), Like(r".*\n上次压缩：[-\d: ]+ 失败：没有可用的摘要模型\n.*"))


async def test_long_summary_goes_out_as_merged_forward_in_groups(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    long_text = "很长的摘要。" * 100
    await runtime.get().store.put_meta(
        SUMMARY_NAMESPACE, sid, {"text": long_text, "time": 1.0, "kept_messages": 2}
    )

    def forwarded(nodes: Any) -> bool:
        content = "".join(seg["data"]["text"] for n in nodes for seg in n["data"]["content"])
        return all(n["type"] == "node" for n in nodes) and long_text in content and "保留原文 2 条" in content

    event = group_msg("/摘要", group)
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        ctx.should_call_api(
            "send_group_forward_msg", {"group_id": group, "messages": Satisfies(forwarded)}, result={}
        )


async def test_long_summary_is_plain_text_in_private(app: App) -> None:
    sid = private_record(SELF_ID, SUPERUSER_ID).id
    long_text = "私聊里的长摘要。" * 60
    # The superuser's private chat is every test's: the clears keep the service's copy of
    # its summary in step with the store, whichever test ran before or runs after.
    service = runtime.get().compression
    await service.clear(sid, "summary")
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": long_text, "kept_messages": 0})
    try:
        await run(app, private_msg("/摘要"), Like(f"本会话摘要：\n{long_text}\n\n保留原文 0 条\n.*"))
    finally:
        await service.clear(sid, "summary")


# ---- the texts, pure ----------------------------------------------------------------
def status(**changes: Any) -> SessionStatus:
    base: dict[str, Any] = {
        "summary": None,
        "summary_time": None,
        "kept_messages": 0,
        "last_run": None,
        "running": False,
        "usage": None,
        "line": None,
        "window": None,
        "compress_at": 0.8,
        "history_limit": 0,
        "active_messages": 0,
        "backoff_failures": 0,
        "backoff_turns_left": 0,
    }
    return SessionStatus(**{**base, **changes})


def test_status_text_of_an_empty_session() -> None:
    assert status_text(status()) == EMPTY_STATUS


def test_r_back_3_status_text_shows_the_back_off_only_after_failures() -> None:
    failing = status(
        backoff_failures=2,
        backoff_turns_left=3,
        last_run=LastRun(time=0, outcome="error", reason="摘要模型出错：超时", kept_messages=0, archived=0),
    )
    text = status_text(failing)
    assert "失败：摘要模型出错：超时" in text
    assert text.endswith("自动压缩退避中：已连续失败 2 次，再过 3 轮对话才会重试。")
    assert "退避" not in status_text(status(backoff_failures=0, backoff_turns_left=0))


def test_status_text_says_when_a_compression_is_running() -> None:
    assert status_text(status(running=True)).endswith("正在压缩中…")


def test_receipt() -> None:
    done = CompressionResult("s", "done", tokens_before=9000, tokens_after=1200, kept_messages=3, archived=40)
    assert receipt(done) == "压缩完成：9000 → 1200 token，保留原文 3 条，归档 40 条。"
    assert receipt(CompressionResult("s", "nothing")) == "没有需要压缩的内容。"


def test_setting_text_names_the_layer_and_the_meaning() -> None:
    assert (
        setting_text("compress_at", Resolved(0.75, "platform"), status())
        == f"压缩线 0.75（平台档）；{NO_USAGE}"
    )
    assert (
        setting_text("compress_at", Resolved(0.5, "place"), status(line=20000, window=40000))
        == "压缩线 0.5（本群）；生效线 20000 token（窗口 40000）"
    )
    assert (
        setting_text("history_limit", Resolved(0, "global"), status())
        == "条数线 0（全局配置）：不按条数压缩。"
    )


@pytest.mark.parametrize(("word", "value"), [("0", 0.0), ("1", 1.0), (".25", 0.25), ("1e-1", 0.1)])
def test_parse_setting_accepts_the_range(word: str, value: float) -> None:
    assert parse_setting("compress_at", word) == value


def test_parse_setting_history_limit_is_an_integer() -> None:
    assert parse_setting("history_limit", "40") == 40
    assert isinstance(parse_setting("history_limit", "40.0"), int)
    with pytest.raises(ValueError, match="整数"):
        parse_setting("history_limit", "inf")
