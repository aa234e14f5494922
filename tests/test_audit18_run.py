"""Audit 18: the full compression (R-RUN, R-FAIL, R-PROG, R-MEM-3, R-INJ) as a reader of the
specification would check it, driven only through the library API (`api`) on a real SQLite
file, with the scripted OpenAI-compatible server as both models. The numeric rules (budget,
capacity, thresholds) are tests/test_audit17_ref.py's."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from nonebot_plugin_memsum import api
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    NOTHING_KEPT,
    committing,
    conversation_of,
    existing_summary_of,
    offered,
    raw_sql,
    talk,
)

Library = Callable[..., Any]
NEW_SUMMARY = "## 最近在聊什么\n新的话题\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


async def seed(n: int, *, start: int = 0, size: int = 12) -> list[api.Message]:
    return [
        await api.record(GROUP, api.Message(role="user", content=talk(i, size), ts=1000.0 + i))
        for i in range(start, start + n)
    ]


async def conversation(session_id: str = GROUP.id) -> list[api.Message]:
    return [m for m in await api.history(session_id) if m.is_conversation]


def parts(body: dict[str, Any]) -> list[str]:
    """The units of a summary request as the summariser reads them."""
    return conversation_of(body).split("\n\n")


def part_with(body: dict[str, Any], needle: str) -> str:
    found = [p for p in parts(body) if needle in p]
    assert len(found) == 1, (needle, parts(body))
    return found[0]


def number_of(body: dict[str, Any], needle: str) -> int:
    found = [n for n, text in offered(body).items() if needle in text]
    assert len(found) == 1, (needle, offered(body))
    return found[0]


async def calling(
    session: api.SessionRecord, ts: float, *calls: tuple[str, str, str], content: str = "", **meta: str
) -> api.Message:
    """Store an assistant message asking for `calls`, each as (id, name, arguments)."""
    tool_calls = tuple(api.ToolCall(*c) for c in calls)
    message = api.Message(role="assistant", content=content, tool_calls=tool_calls, metadata=meta, ts=ts)
    return await api.record(session, message)


async def tool_session(session_id: str = "task:audit18") -> api.SessionRecord:
    return await api.internal_session(session_id)


# ---- R-RUN-1: the cut ---------------------------------------------------------------------
async def test_r_run_1_cut_before_unfinished_tool_group(library: Library) -> None:
    env = await library()
    task = await tool_session()
    await api.record(task, api.Message(role="user", content="先前的请求", ts=1.0))
    await api.record(task, api.Message(role="assistant", content="先前的回答", ts=2.0))
    head = await calling(task, 3.0, ("c1", "weather", '{"city":"北京"}'), ("c2", "clock", "{}"))
    inside = await api.record(task, api.Message(role="user", content="组里插话", ts=4.0))
    first = await api.record(task, api.Message(role="tool", content="晴", tool_call_id="c1", ts=5.0))

    result = await api.compress(task.id)

    assert result.outcome == "done"
    (body,) = env.model.summary_requests()
    text = conversation_of(body)
    assert "先前的请求" in text
    assert "先前的回答" in text
    assert "weather" not in text
    assert "组里插话" not in text
    assert "晴" not in text
    later = await api.record(task, api.Message(role="tool", content="十点", tool_call_id="c2", ts=6.0))
    assert await conversation(task.id) == [head, inside, first, later]


# ---- R-RUN-2/3: units and rendering ---------------------------------------------------------
async def test_r_run_2_3_rendering_as_the_summariser_receives_it(library: Library) -> None:
    env = await library()
    task = await tool_session()
    args = '{"q":"' + "甲" * 250 + '"}'
    out = "乙" * 200 + "丙" * 100
    said = "丁" * 200 + "戊" * 50
    await api.record(task, api.Message(role="user", content="帮我搜一下", ts=1.0))
    await calling(task, 2.0, ("c1", "search_web", args))
    await api.record(task, api.Message(role="user", content="夹在中间的话", ts=3.0))
    # The message's own name is wrong on purpose: the name comes from the call (R-RUN-3).
    await api.record(task, api.Message(role="tool", content=out, tool_call_id="c1", name="wrong", ts=4.0))
    await api.record(task, api.Message(role="notice", content=said, ts=5.0))
    await api.record(task, api.Message(role="system", content="系统内部提示XYZ", ts=6.0))
    await api.record(
        task,
        api.Message(
            role="assistant",
            content='{"visibleContent":"信封里的","thought":"内部想法QQQ"}',
            metadata={"visibleContent": "可见的回答正文"},
            ts=7.0,
        ),
    )

    await api.compress(task.id)

    (body,) = env.model.summary_requests()
    units = parts(body)
    group = part_with(body, "调用 search_web(")
    assert "调用 search_web(" + args[:200] in group
    assert args[:201] not in group
    assert "工具结果(search_web): " + "乙" * 200 in group
    assert "丙" not in group
    assert "wrong" not in conversation_of(body)
    # The message inside the group is a unit of its own, after the group.
    assert units.index(group) < units.index(part_with(body, "夹在中间的话"))
    notice = part_with(body, "通知: ")
    assert "通知: " + "丁" * 200 in notice
    assert "戊" not in notice
    assert "可见的回答正文" in conversation_of(body)
    assert "内部想法QQQ" not in conversation_of(body)
    assert "信封里的" not in conversation_of(body)
    assert "系统内部提示XYZ" not in conversation_of(body)


# ---- R-RUN-6: numbering -----------------------------------------------------------------------
async def test_r_run_6_numbering_and_unnumbered_shapes(library: Library) -> None:
    env = await library()
    task = await tool_session()
    stored = [
        await api.record(task, api.Message(role="user", content="请查一下仓库", ts=1.0)),
        await calling(task, 2.0, ("c1", "lookup", '{"k":1}')),
        await api.record(task, api.Message(role="tool", content="结果" * 150, tool_call_id="c1", ts=3.0)),
        await api.record(
            task, api.Message(role="tool", content="孤儿结果", tool_call_id="ghost", name="orphan", ts=4.0)
        ),
        await calling(task, 5.0, ("c8", "half", "{}"), ("c9", "half", "{}")),
        await api.record(task, api.Message(role="tool", content="只有一半", tool_call_id="c8", ts=6.0)),
        await api.record(task, api.Message(role="user", content="长消息" + "己" * 3000, ts=7.0)),
    ]
    for i in range(10):
        await api.record(task, api.Message(role="user", content=f"短消息{i}号", ts=10.0 + i))

    await api.compress(task.id)

    (body,) = env.model.summary_requests()
    assert part_with(body, "请查一下仓库").startswith("#1〔")
    group = part_with(body, "调用 lookup(")
    m = re.match(r"#2〔约 (\d+) token〕", group)
    assert m, group
    assert "工具结果(lookup)" in group
    assert group.count("#") == 1
    assert int(m.group(1)) == sum(estimate_msg_tokens(x) for x in stored[1:3])  # stored, not cut
    assert "长消息" + "己" * 3000 in conversation_of(body)  # user messages are not cut
    for needle in ("工具结果(orphan)", "调用 half(", "长消息"):
        assert not part_with(body, needle).startswith("#"), needle
    assert sorted(offered(body)) == list(range(1, len(offered(body)) + 1))
    assert number_of(body, "短消息0号") == 3
    assert number_of(body, "短消息9号") == 12


# ---- R-RUN-7: parsing the reply ----------------------------------------------------------------
def block_reply(render: Callable[[int, int], str]) -> Callable[[dict[str, Any]], Reply]:
    """A reply keeping the units of talk(2) and talk(4), written by `render(a, b)`."""

    def answer(body: dict[str, Any]) -> Reply:
        return Reply(render(number_of(body, talk(2)), number_of(body, talk(4))))

    return answer


PARSE_VARIANTS = {
    "plain": lambda a, b: f"【保留原文】{a}、{b}\n{CHAT_SUMMARY}",
    "bold_markdown": lambda a, b: f"**【保留原文】** {a}, {b}\n{CHAT_SUMMARY}",
    "heading_marks_numbers_below": lambda a, b: f"## 【保留原文】\n#{a}\n#{b}\n\n{CHAT_SUMMARY}",
    "quote_and_list": lambda a, b: f"> 【保留原文】\n- {a}\n- {b}\n{CHAT_SUMMARY}",
    "full_width_hash": lambda a, b: f"＃【保留原文】{a}；{b}\n{CHAT_SUMMARY}",
    "block_last": lambda a, b: f"{CHAT_SUMMARY}\n\n【保留原文】\n{a} {b}",
    "several_blocks_last_counts": lambda a, b: f"【保留原文】1\n{CHAT_SUMMARY}\n【保留原文】{a}、{b}",
    "heading_bold_colon_hashes": lambda a, b: f"### **【保留原文】**：#{a}、#{b}\n{CHAT_SUMMARY}",
    "blank_lines_inside_block": lambda a, b: f"【保留原文】\n\n{a}\n\n{b}\n\n{CHAT_SUMMARY}",
    "star_heading_block_last": lambda a, b: f"{CHAT_SUMMARY}\n* 【保留原文】 #{a} #{b}\n",
}


@pytest.mark.parametrize("variant", list(PARSE_VARIANTS))
async def test_r_run_7_block_variants(library: Library, variant: str) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    stored = await seed(12)
    env.model.summary.append(block_reply(PARSE_VARIANTS[variant]))

    result = await api.compress(GROUP.id)

    assert result.kept_messages == 2
    assert await conversation() == [stored[2], stored[4]]
    summary = (await api.status(GROUP.id)).summary
    assert summary is not None
    assert "保留原文" not in summary
    assert "甲(1) 约大家周末爬山" in summary
    assert "关键原话要点" in summary


async def test_r_run_7_hash_number_in_body_is_not_a_number(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    await seed(12)
    body_text = "## 最近在聊什么\n甲(1) 说 #3 的方案最好，#4 也行\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
    env.model.summary.append(Reply(f"【保留原文】无\n{body_text}"))

    result = await api.compress(GROUP.id)

    assert result.kept_messages == 0
    assert await conversation() == []
    assert (await api.status(GROUP.id)).summary == body_text


# ---- R-RUN-8: what is kept ----------------------------------------------------------------
async def test_r_run_8_unoffered_numbers_dropped(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    stored = await seed(12)
    env.model.summary.append(
        lambda body: Reply(f"【保留原文】{number_of(body, talk(3))}、99、0\n{CHAT_SUMMARY}")
    )

    result = await api.compress(GROUP.id)

    assert result.kept_messages == 1
    assert await conversation() == [stored[3]]


async def test_r_run_8_over_the_cap_dropped_from_the_earliest(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    stored = await seed(20)
    requests: list[dict[str, Any]] = []

    def keep_all(body: dict[str, Any]) -> Reply:
        requests.append(body)
        return Reply(f"【保留原文】{'、'.join(map(str, offered(body)))}\n{CHAT_SUMMARY}")

    env.model.summary.append(keep_all)

    await api.compress(GROUP.id)

    kept = await conversation()
    assert len(offered(requests[0])) == 20  # all of them could be kept one by one
    assert 0 < len(kept) < 20
    assert kept == stored[20 - len(kept) :]  # the latest survive, the earliest went first


async def test_r_run_8_no_heading_whole_reply_is_summary_with_warning(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    await seed(12)
    env.model.summary.append(Reply(CHAT_SUMMARY))

    result = await api.compress(GROUP.id)

    assert result.outcome == "done"
    assert result.kept_messages == 0
    assert await conversation() == []
    assert (await api.status(GROUP.id)).summary == CHAT_SUMMARY
    assert any("保留原文" in w for w in env.warnings), env.warnings


async def test_r_run_8_no_heading_nothing_offered_no_warning(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0)
    await seed(12)
    env.model.summary.append(Reply(CHAT_SUMMARY))

    result = await api.compress(GROUP.id)

    (body,) = env.model.summary_requests()
    assert offered(body) == {}
    assert result.outcome == "done"
    assert not any("保留原文" in w for w in env.warnings), env.warnings


async def test_r_run_8_block_without_numbers_keeps_nothing_with_warning(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    await seed(12)
    env.model.summary.append(Reply(f"【保留原文】第二条和第三条\n{CHAT_SUMMARY}"))

    result = await api.compress(GROUP.id)

    assert result.outcome == "done"
    assert result.kept_messages == 0
    assert await conversation() == []
    summary = (await api.status(GROUP.id)).summary
    assert summary is not None
    assert "保留原文" not in summary
    assert any("保留原文" in w for w in env.warnings), env.warnings


# ---- R-RUN-10: chunking ------------------------------------------------------------------------
SMALL_SUMMARY_MODEL = {"context_window": 6000, "max_output_tokens": 1000}


async def test_r_run_10_chunks_carry_kept_units_and_previous_summary(library: Library) -> None:
    env = await library(summary=SMALL_SUMMARY_MODEL, memsum_summary_budget_ratio=0.5)
    stored = await seed(100, size=60)
    bodies: list[dict[str, Any]] = []
    chosen: list[tuple[int, str]] = []

    def answer(body: dict[str, Any]) -> Reply:
        bodies.append(body)
        n, text = max(offered(body).items())  # the latest unit offered
        chosen.append((n, text))
        k = len(bodies)
        return Reply(f"【保留原文】{n}\n## 最近在聊什么\n第{k}块\n## 谁有问题没回应\n无\n## 关键原话要点\n无")

    env.model.summary_default = answer

    result = await api.compress(GROUP.id)

    assert len(bodies) >= 2
    for k in range(1, len(bodies)):
        assert f"第{k}块" in existing_summary_of(bodies[k])
        n, text = chosen[k - 1]
        assert offered(bodies[k]).get(n) == text  # re-sent verbatim with its original number
    assert result.kept_messages == 1
    summary = (await api.status(GROUP.id)).summary
    assert summary is not None
    assert f"第{len(bodies)}块" in summary
    assert "保留原文" not in summary
    assert env.phases() == [("start", None), ("done", None)]  # one run, however many requests
    (kept,) = await conversation()
    assert kept in stored
    assert kept.content in chosen[-1][1]


# ---- R-RUN-11/12, R-INJ: the commit and what follows --------------------------------------
async def test_r_run_11_history_changed_during_run_restores_old_summary(library: Library) -> None:
    env = await library()
    await seed(6)
    await api.compress(GROUP.id)
    before = (await api.status(GROUP.id)).summary
    stored = await seed(6, start=6)
    gate = env.model.hold_summary(Reply(f"【保留原文】无\n{NEW_SUMMARY}"))
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    # Another process on the same file removes a message of the span being compressed.
    await raw_sql(env.rt.store.path, "DELETE FROM messages WHERE id = ?", (stored[2].id,))
    gate.open()

    with pytest.raises(api.CompressionError) as failed:
        await run

    assert failed.value.reason == "压缩期间历史被改动"
    assert (await api.status(GROUP.id)).summary == before
    assert await conversation() == stored[:2] + stored[3:]
    assert [m.content for m in await api.history(GROUP.id) if m.event_marker] == ["对话已压缩"]
    assert env.phases()[-1] == ("error", "压缩期间历史被改动")


async def test_r_run_11_late_time_stamp_during_run_stays_active(library: Library) -> None:
    """History is in storage order: a message stored during the run with an earlier time stamp
    comes after the cut, so the summary that never saw it does not archive it."""
    env = await library()
    stored = await seed(6)
    gate = env.model.hold_summary(Reply(f"【保留原文】无\n{NEW_SUMMARY}"))
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    late = await api.record(GROUP, api.Message(role="user", content="[迟到(30001)] 晚到的旧消息", ts=1002.5))
    gate.open()

    assert (await run).archived == len(stored)
    assert await conversation() == [late]


async def test_r_run_11_12_divider_kept_untouched_before_later_messages(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    stored = await seed(12)
    gate = env.model.hold_summary(
        lambda body: Reply(f"【保留原文】{number_of(body, talk(5))}\n{CHAT_SUMMARY}")
    )
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    later = await api.record(
        GROUP, api.Message(role="user", content="[新人(30002)] 压缩途中说的话", ts=5000.0)
    )
    gate.open()
    await run

    history = await api.history(GROUP.id)
    assert [m for m in history if m.is_conversation] == [stored[5], later]
    dividers = [m for m in history if m.event_marker]
    assert [m.content for m in dividers] == ["对话已压缩"]
    assert all(not m.is_conversation for m in history if m.role == "system")

    prompt = await api.build_prompt(GROUP.id)
    messages = prompt.messages
    at = next(i for i, m in enumerate(messages) if "甲(1) 约大家周末爬山" in str(m.get("content")))
    assert messages[at]["role"] == "system"
    assert all(m["role"] == "system" for m in messages[:at])
    assert stored[5].content in str(messages[at + 1]["content"])
    assert "压缩途中说的话" in str(messages[at + 2]["content"])


async def test_r_inj_2_fixed_first_sentence(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    await seed(12)
    env.model.summary.append(lambda body: Reply(f"【保留原文】{number_of(body, talk(1))}\n{CHAT_SUMMARY}"))
    await api.compress(GROUP.id)
    task = await tool_session()
    await api.record(task, api.Message(role="user", content="写周报", ts=1.0))
    await api.compress(task.id)

    def summary_block(prompt_messages: list[dict[str, Any]], needle: str) -> str:
        return next(str(m["content"]) for m in prompt_messages if needle in str(m.get("content")))

    kept = summary_block((await api.build_prompt(GROUP.id)).messages, "约大家周末爬山")
    none_kept = summary_block((await api.build_prompt(task.id)).messages, "约大家周末爬山")
    first = re.split(r"(?<=[。\n])", kept, maxsplit=1)[0]
    assert "原文" in first
    assert none_kept.startswith(first)


# ---- R-FAIL ---------------------------------------------------------------------------
FAILURES = {
    "stream_cut": Reply(NOTHING_KEPT, cut_after=3, chunk_chars=2),
    "finish_length": Reply(NOTHING_KEPT, finish_reason="length"),
    "empty_once_block_removed": Reply("【保留原文】1"),
    "request_refused": Reply(status=400, error="invalid request"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_r_fail_1_3_nothing_written(library: Library, failure: str) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    await seed(6)
    await api.compress(GROUP.id)
    old = await api.status(GROUP.id)
    await seed(6, start=6)
    history = await api.history(GROUP.id)
    env.progress.clear()
    env.model.summary.append(FAILURES[failure])

    with pytest.raises(api.CompressionError) as failed:
        await api.compress(GROUP.id)

    assert failed.value.reason
    assert await api.history(GROUP.id) == history  # no archive, no divider, no trimming
    now = await api.status(GROUP.id)
    assert (now.summary, now.summary_time) == (old.summary, old.summary_time)
    assert env.phases() == [("start", None), ("error", failed.value.reason)]
    assert len(env.failure_warnings()) == 1, env.warnings


async def test_r_fail_1_later_chunk_fails_nothing_written(library: Library) -> None:
    env = await library(summary=SMALL_SUMMARY_MODEL)
    await seed(100, size=60)
    history = await api.history(GROUP.id)
    env.model.summary.extend([Reply(NOTHING_KEPT), Reply(status=400, error="invalid request")])

    with pytest.raises(api.CompressionError):
        await api.compress(GROUP.id)

    assert len(env.model.summary_requests()) == 2
    assert await api.history(GROUP.id) == history
    assert (await api.status(GROUP.id)).summary is None
    assert [p for p, _ in env.phases()] == ["start", "error"]
    assert len(env.failure_warnings()) == 1, env.warnings


# ---- R-PROG, R-MEM-3 -------------------------------------------------------------------
async def test_r_prog_1_start_then_done(library: Library) -> None:
    env = await library()
    await seed(6)
    await api.compress(GROUP.id)
    assert env.phases() == [("start", None), ("done", None)]


async def test_r_prog_2_nothing_to_summarise_no_events(library: Library) -> None:
    env = await library()
    task = await tool_session()
    assert (await api.compress(task.id)).outcome == "nothing"
    await seed(6)
    await api.compress(GROUP.id)  # keeps nothing: only the divider stays active
    env.progress.clear()
    requests = len(env.model.summary_requests())

    assert (await api.compress(GROUP.id)).outcome == "nothing"

    assert env.progress == []
    assert len(env.model.summary_requests()) == requests
    assert [m.content for m in await api.history(GROUP.id)] == ["对话已压缩"]


async def test_r_prog_3_second_manual_run_refused(library: Library) -> None:
    env = await library()
    await seed(6)
    gate = env.model.hold_summary()
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()

    with pytest.raises(api.CompressionError) as refused:
        await api.compress(GROUP.id)

    assert refused.value.reason == "这个会话正在压缩"
    assert env.phases() == [("start", None)]  # the refusal reports no progress of its own
    gate.open()
    assert (await run).outcome == "done"
    assert len(env.model.summary_requests()) == 1


@pytest.mark.parametrize("kind", ["context", "summary"])
async def test_r_mem_3_clear_while_model_thinks(library: Library, kind: str) -> None:
    env = await library()
    await seed(6)
    history = await api.history(GROUP.id)
    gate = env.model.hold_summary()
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    await api.clear(GROUP.id, kind)  # type: ignore[arg-type]
    gate.open()

    with pytest.raises(api.CompressionError) as failed:
        await run

    assert failed.value.reason == "压缩期间会话被清空"
    assert (await api.status(GROUP.id)).summary is None
    assert await api.history(GROUP.id) == ([] if kind == "context" else history)
    assert env.phases() == [("start", None), ("error", "压缩期间会话被清空")]


# ---- more of R-RUN-1/4/10/12, R-FAIL-1/2, R-MEM-3 ------------------------------------------
async def test_r_run_1_cut_before_call_with_no_result_yet(library: Library) -> None:
    env = await library()
    task = await tool_session()
    ask = await api.record(task, api.Message(role="user", content="查一下", ts=1.0))
    head = await calling(task, 2.0, ("c1", "weather", "{}"))

    await api.compress(task.id)

    (body,) = env.model.summary_requests()
    assert "查一下" in conversation_of(body)
    assert "weather" not in conversation_of(body)
    assert ask not in await conversation(task.id)
    later = await api.record(task, api.Message(role="tool", content="晴", tool_call_id="c1", ts=3.0))
    assert await conversation(task.id) == [head, later]


async def test_r_run_4_todo_items_last_in_work_template_only(library: Library) -> None:
    env = await library()

    class Todos:
        async def items(self, session_id: str) -> list[api.TodoItem]:
            return [api.TodoItem("写周报", "in_progress"), api.TodoItem("发邮件", "pending")]

        async def replace(self, session_id: str, items: list[api.TodoItem]) -> None:
            pass

    api.set_todo_provider(Todos())
    task = await tool_session()
    await api.record(task, api.Message(role="user", content="帮我安排今天", ts=1.0))
    await seed(3)

    await api.compress(task.id)
    await api.compress(GROUP.id)

    work, chat = env.model.summary_requests()
    user_text = work["messages"][1]["content"]
    assert user_text.endswith("当前任务列表状态\n- [in_progress] 写周报\n- [pending] 发邮件")
    assert "当前任务列表状态" not in chat["messages"][1]["content"]


async def test_r_run_10_unit_over_half_capacity_split_unnumbered(library: Library) -> None:
    env = await library(summary=SMALL_SUMMARY_MODEL, memsum_summary_budget_ratio=0.5)
    await seed(2)
    rng = "".join(talk(i, 60) for i in range(100, 200))
    big = await api.record(GROUP, api.Message(role="user", content="[长文(20999)] " + rng, ts=1500.0))
    await seed(2, start=2)

    await api.compress(GROUP.id)

    bodies = env.model.summary_requests()
    assert len(bodies) >= 3
    label = "[长文(20999)] "
    pieces = [p for b in bodies for p in parts(b) if p.startswith(label)]
    assert len(pieces) >= 2  # unnumbered, each opening with the speaker's label
    # Later pieces open with the label and 「（接上文）」 (README: compression/request.py).
    assert "".join(p.removeprefix(label).removeprefix("（接上文）") for p in pieces) == rng
    for b in bodies:
        assert all(big.content[200:260] not in text for text in offered(b).values())
    assert big not in await conversation()


async def test_r_run_12_kept_tool_group_untouched_then_rechosen(library: Library) -> None:
    env = await library(memsum_summary_budget_ratio=0.5)
    task = await tool_session()
    for i in range(8):
        await api.record(task, api.Message(role="user", content=f"背景第{i}段：" + "资料" * 20, ts=float(i)))
    head = await calling(
        task, 10.0, ("c1", "lookup", '{"k":"报表"}'), content="我查一下", reasoning_content="先查报表"
    )
    inside = await api.record(task, api.Message(role="user", content="组里插话", ts=11.0))
    res = await api.record(
        task, api.Message(role="tool", content="报表在 /tmp/r.xlsx", tool_call_id="c1", ts=12.0)
    )
    env.model.summary.append(
        lambda body: Reply(f"【保留原文】{number_of(body, '调用 lookup(')}\n{CHAT_SUMMARY}")
    )

    await api.compress(task.id)

    assert await conversation(task.id) == [head, res]
    assert inside not in await conversation(task.id)
    (first,) = env.model.summary_requests()
    assert number_of(first, "组里插话") > number_of(first, "调用 lookup(")
    await api.record(task, api.Message(role="user", content="新的一段" + "话" * 40, ts=20.0))
    await api.compress(task.id)  # keeps nothing this time

    second = env.model.summary_requests()[1]
    assert number_of(second, "调用 lookup(") == 1  # renumbered from 1
    assert await conversation(task.id) == []


async def test_r_fail_1_no_summary_model(library: Library) -> None:
    env = await library(models=lambda llm: [], memsum_chat_model=None, memsum_summary_model=None)
    await seed(6)
    history = await api.history(GROUP.id)

    with pytest.raises(api.CompressionError) as failed:
        await api.compress(GROUP.id)

    assert failed.value.reason
    assert await api.history(GROUP.id) == history
    assert env.phases() == [("start", None), ("error", failed.value.reason)]
    assert len(env.failure_warnings()) == 1, env.warnings


async def test_r_fail_2_window_too_small(library: Library) -> None:
    env = await library(summary={"context_window": 800, "max_output_tokens": 100})
    await seed(6)
    history = await api.history(GROUP.id)

    with pytest.raises(api.CompressionError) as failed:
        await api.compress(GROUP.id)

    assert "窗口" in failed.value.reason
    assert env.model.summary_requests() == []
    assert await api.history(GROUP.id) == history
    assert env.phases() == [("start", None), ("error", failed.value.reason)]
    assert len(env.failure_warnings()) == 1, env.warnings


async def test_r_mem_3_clear_during_commit_waits_then_removes_new_summary(library: Library) -> None:
    env = await library()
    await seed(6)
    turn_gate = env.model.gate(
        Reply("好的", usage={"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102})
    )
    env.model.chat.append(turn_gate)
    turn = asyncio.create_task(api.run_turn(GROUP.id))
    await turn_gate.reached()
    run = asyncio.create_task(api.compress(GROUP.id))
    await committing(env.rt)  # the summary is answered; the commit waits for the turn
    clear = asyncio.create_task(api.clear(GROUP.id))
    turn_gate.open()
    await turn
    result = await run
    await clear

    assert result.outcome == "done"
    assert (await api.status(GROUP.id)).summary is None
    assert await api.history(GROUP.id) == []
    assert [p for p, _ in env.phases()] == ["start", "done"]


async def test_r_mem_3_clear_between_chunks(library: Library) -> None:
    env = await library(summary=SMALL_SUMMARY_MODEL)
    await seed(100, size=60)
    env.model.summary.append(Reply(NOTHING_KEPT))
    gate = env.model.hold_summary()  # the second request
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    await api.clear(GROUP.id)
    gate.open()

    with pytest.raises(api.CompressionError) as failed:
        await run

    assert failed.value.reason == "压缩期间会话被清空"
    assert len(env.model.summary_requests()) == 2
    assert (await api.status(GROUP.id)).summary is None
    assert await api.history(GROUP.id) == []
    assert env.phases() == [("start", None), ("error", "压缩期间会话被清空")]
