"""Audit 20: the original Chinese specification (spec/plugin-memory-summary.zh.md) read
sentence by sentence, as a scenario writer who reads only it would check the product:
through the library API (`api`) on a real SQLite file, with the scripted OpenAI-compatible
server as the chat and the summary model. Where the numbered list (REQUIREMENTS.md) has a
rule, the test is named for it; `zh_` names what only the Chinese says in so many words."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from nonebot_plugin_memsum import api
from nonebot_plugin_memsum.compression.service import DIVIDER, INJECTION_HEAD
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    NOTHING_KEPT,
    Env,
    held_compression,
    keeping,
    offered,
    settle,
    stated,
    system_of,
    talk,
)

Library = Callable[..., Any]
CLEARED = "压缩期间会话被清空"
BUSY = "这个会话正在压缩"


async def seed(
    n: int, *, start: int = 0, size: int = 12, session: api.SessionRecord = GROUP
) -> list[api.Message]:
    return [
        await api.record(session, api.Message(role="user", content=talk(i, size), ts=1000.0 + i))
        for i in range(start, start + n)
    ]


async def conversation(session_id: str = GROUP.id) -> list[str]:
    return [m.content for m in await api.history(session_id) if m.is_conversation]


def phases(env: Env, session_id: str = GROUP.id) -> list[tuple[str, str | None]]:
    return env.phases(session_id)


async def failed_in_background(env: Env, session_id: str) -> api.SessionRecord:
    """A session whose turn reached the count line (4) and whose background run failed once
    (the summary stopped at the output limit)."""
    session = await api.internal_session(session_id)
    for i in range(3):
        await api.record(session, api.Message(role="user", content=talk(i)))
    env.model.summary.append(Reply(NOTHING_KEPT, finish_reason="length"))
    assert await api.run_turn(session.id) == "replied"  # 3 + the reply: at the count line
    await settle(env.rt)
    assert [p for p, _ in phases(env, session.id)] == ["start", "error"]
    assert (await api.status(session.id)).backoff_failures == 1
    return session


# ---- 概述: 保留的原文与压缩期间到达的消息原样接在摘要后面 -----------------------------------------
async def test_zh_overview_kept_and_late_messages_follow_the_summary_in_the_prompt(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    await seed(12)
    run, gate = await held_compression(env, keeping(talk(3)))
    late = await seed(2, start=50)  # arrive while the summariser thinks
    gate.open()
    result = await run

    assert result.outcome == "done"
    assert await conversation() == [talk(3), *(m.content for m in late)]
    prompt = await api.build_prompt(GROUP.id)
    contents = [str(m["content"]) for m in prompt.messages]
    head = next(i for i, c in enumerate(contents) if c.startswith(INJECTION_HEAD))
    assert prompt.messages[head]["role"] == "system"
    assert contents[head + 1 :] == [talk(3), *(m.content for m in late)]
    assert DIVIDER not in contents  # an event marker, never sent as conversation


# ---- 清理: 删除会话也走这条 ------------------------------------------------------------------------
async def test_r_mem_2_3_deleting_the_session_while_the_model_thinks_cancels_the_run(
    library: Library,
) -> None:
    env = await library()
    await seed(6)
    run, gate = await held_compression(env)

    await api.delete_session(GROUP.id)
    gate.open()
    with pytest.raises(api.CompressionError) as failed:
        await run

    assert str(failed.value) == CLEARED
    assert phases(env) == [("start", None), ("error", CLEARED)]
    assert await api.history(GROUP.id) == []
    assert (await api.status(GROUP.id)).summary is None
    assert (await api.status(GROUP.id)).backoff_failures == 0


# ---- 边界: 一条消息; 还没有用量时预算按要压的内容, 不少于 1000 ---------------------------------------
async def test_r_bud_6_one_message_without_usage_gets_the_floor(library: Library) -> None:
    env = await library()
    await seed(1)

    result = await api.compress(GROUP.id)

    assert result.outcome == "done"
    (body,) = env.model.summary_requests()
    budget, _ = stated(body)
    assert budget == 1000
    assert body["max_tokens"] == 1500
    assert await conversation() == []
    assert [m.content for m in await api.history(GROUP.id)] == [DIVIDER]


# ---- 边界: summaryBudgetRatio 为 0 时不保留原文 --------------------------------------------------
async def test_r_bud_4_ratio_0_keeps_nothing_whatever_the_model_names(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0)
    await seed(12)
    env.model.summary.append(Reply(f"【保留原文】1、2\n{CHAT_SUMMARY}"))

    result = await api.compress(GROUP.id)

    (body,) = env.model.summary_requests()
    assert offered(body) == {}
    assert "这次不保留原文" in system_of(body)
    assert result.kept_messages == 0
    assert await conversation() == []


# ---- 自动压缩线: compressAt 交出生效值; 用量条目的压缩线是较小值 -----------------------------------
async def test_r_cfg_4_compress_at_is_the_setting_and_the_status_line_the_smaller(library: Library) -> None:
    env = await library(chat={"context_window": 10000, "max_output_tokens": 1000}, memsum_trim_ratio=0.5)
    session = await api.internal_session("task:line")
    await api.record(session, api.Message(role="user", content="你好"))
    assert await api.run_turn(session.id) == "replied"
    trim = env.rt.agent.trim_budget_of(env.rt.registry.resolve("chat"))

    assert await api.compress_at(session.id) == 0.8
    status = await api.status(session.id)
    assert status.compress_at == 0.8
    assert status.line == min(8000, trim)
    assert trim < 8000


# ---- 持久化: namespace summary, key 为会话 ID, 同一个存储 -------------------------------------------
async def test_r_mem_1_summary_is_in_the_store_file_under_summary_and_the_session_id(
    library: Library,
) -> None:
    env = await library()
    await seed(4)
    await api.compress(GROUP.id)

    path = env.rt.store.path
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT namespace, key, value FROM metadata WHERE namespace = 'summary'").fetchall()
    db.close()
    assert [(ns, key) for ns, key, _ in rows] == [("summary", GROUP.id)]
    value = json.loads(rows[0][2])
    assert value["text"] == CHAT_SUMMARY  # the stored summary holds no 【保留原文】 block
    assert NOTHING_KEPT not in rows[0][2]


# ---- 摘要预算: 还没有用量时(如清理之后)预算按要压的内容 ----------------------------------------------
async def test_r_bud_6_after_a_context_clear_the_budget_follows_the_content(library: Library) -> None:
    env = await library(
        chat={"context_window": 32000}, summary={"context_window": 64000, "max_output_tokens": 4096}
    )
    session = await api.internal_session("task:cleared")
    await api.record(session, api.Message(role="user", content="你好"))
    assert await api.run_turn(session.id) == "replied"
    assert (await api.status(session.id)).line is not None
    await api.clear(session.id, "context")
    for i in range(40):
        await api.record(session, api.Message(role="user", content=talk(i, 120)))

    await api.compress(session.id)

    (body,) = env.model.summary_requests()
    budget, _ = stated(body)
    # With the cleared usage's line it would be min(0.8 × 32000 × 0.1, content) = 2560;
    # without a line: the content, at most ⅔ of min(4096, 64000 / 4).
    assert budget == 2730
    assert (await api.status(session.id)).line is None


# ---- 退避: 只有后台压缩没压成时退避; 压成丢掉退避记录 --------------------------------------------------
async def test_r_back_3_4_background_failure_backs_off_and_a_manual_success_forgets_it(
    library: Library,
) -> None:
    env = await library(memsum_history_limit=4)
    session = await failed_in_background(env, "task:backoff")

    assert (await api.compress(session.id)).outcome == "done"
    assert (await api.status(session.id)).backoff_failures == 0


async def test_r_back_3_a_manual_failure_is_no_background_failure(library: Library) -> None:
    env = await library(memsum_history_limit=4)
    session = await api.internal_session("task:manual")
    for i in range(2):
        await api.record(session, api.Message(role="user", content=talk(i)))
    env.model.summary.append(Reply(NOTHING_KEPT, finish_reason="length"))
    with pytest.raises(api.CompressionError):
        await api.compress(session.id)
    assert (await api.status(session.id)).backoff_failures == 0

    await api.record(session, api.Message(role="user", content=talk(9)))
    assert await api.run_turn(session.id) == "replied"  # 3 + the reply: due, and no back-off
    await settle(env.rt)

    assert [p for p, _ in phases(env, session.id)] == ["start", "error", "start", "done"]


# ---- 删除会话: 摘要、退避与用量一并去掉, 同名的新会话从头开始 ----------------------------------------
async def test_r_back_4_a_recreated_session_starts_without_back_off_usage_or_summary(
    library: Library,
) -> None:
    env = await library(memsum_history_limit=4)
    session = await failed_in_background(env, "task:again")

    await api.delete_session(session.id)
    session = await api.internal_session("task:again")

    status = await api.status(session.id)
    assert (status.backoff_failures, status.usage, status.summary, status.active_messages) == (
        0,
        None,
        None,
        0,
    )


# ---- 何时压缩: token:usage 在每次调用之后 (快照不带 turnId); 回合结束时判一次, 到线就在后台压 -----------
async def test_r_trig_1_2_events_of_one_due_turn_in_order(library: Library) -> None:
    env = await library(memsum_history_limit=4)
    session = await api.internal_session("task:events")
    for i in range(3):
        await api.record(session, api.Message(role="user", content=talk(i)))
    seen: list[tuple[str, Any]] = []
    for kind in (api.TurnStarted, api.TurnEnded, api.UsageEvent, api.CompressionProgress):
        api.subscribe(kind, lambda e, k=kind.__name__: seen.append((k, e)))

    assert await api.run_turn(session.id) == "replied"
    await settle(env.rt)

    names = [k for k, _ in seen]
    assert names == [
        "TurnStarted",
        "UsageEvent",
        "UsageEvent",
        "TurnEnded",
        "CompressionProgress",
        "CompressionProgress",
    ]
    started, snapshot, usage, ended = (e for _, e in seen[:4])
    assert snapshot.turn_id is None  # the request's snapshot: never judged
    assert usage.turn_id == started.turn_id == ended.turn_id
    assert (usage.history_messages, usage.history_limit) == (3, 4)
    assert ended.outcome == "replied"
    assert [e.phase for _, e in seen[4:]] == ["start", "done"]


# ---- 退避: 清理 (summary 类型也是) 丢掉退避记录 --------------------------------------------------------
@pytest.mark.parametrize("kind", ["summary", "context"])
async def test_r_back_4_either_clear_forgets_the_back_off(library: Library, kind: str) -> None:
    env = await library(memsum_history_limit=4)
    session = await failed_in_background(env, "task:clear-backoff")

    await api.clear(session.id, kind)  # type: ignore[arg-type]

    assert (await api.status(session.id)).backoff_failures == 0
    # The next due turn compresses at once: no judged turns to wait.
    for i in range(3 if kind == "context" else 0):
        await api.record(session, api.Message(role="user", content=talk(10 + i)))
    await api.record(session, api.Message(role="user", content=talk(20)))
    assert await api.run_turn(session.id) == "replied"
    await settle(env.rt)
    assert [p for p, _ in phases(env, session.id)] == ["start", "error", "start", "done"]


# ---- token:usage 是 agent 调用模型的用量: 摘要请求不发, 也不改这个会话的压缩线 -----------------------------
async def test_r_trig_1_the_summary_calls_emit_no_usage_event(library: Library) -> None:
    env = await library(chat={"context_window": 32000}, summary={"context_window": 8000})
    session = await api.internal_session("task:usage")
    await api.record(session, api.Message(role="user", content="你好"))
    await api.run_turn(session.id)
    line = (await api.status(session.id)).line
    seen: list[api.UsageEvent] = []
    api.subscribe(api.UsageEvent, seen.append)

    assert (await api.compress(session.id)).outcome == "done"

    assert seen == []
    assert (await api.status(session.id)).line == line == 25600
    assert len(env.model.summary_requests()) == 1
