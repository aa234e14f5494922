"""Audit 10 (sc): R-RUN and R-MEM read literally, sentence by sentence, as someone who has
read only the Chinese original and DESIGN.md would test them.

Every scenario goes through the public library face (`nonebot_plugin_memsum.api`) of a
private runtime on a real SQLite file, with the real HTTP client against the scripted
OpenAI-compatible server (tests/fakes/llm_server.py). Each pins one claim of the original
at its exact value or boundary where the earlier tests pin only something near it: the
200-character cuts at 200 and 201, numbering exactly when N ≤ the stated keep cap, the
commit's item-by-item check field by field (and nothing beyond those fields), a snapshot
taken while the agent's own tool call is still running, the todo part of a work session
written by the built-in tool, a full-width 【保留原文】 block after the summary, and where
the summary lives in the file.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path
from typing import Any, Literal

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.compression.service import CHANGED, DIVIDER, INJECTION_HEAD
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    OLD_SUMMARY,
    WORK_SUMMARY,
    Env,
    Make,
    conversation_of,
    raw_sql,
    stated,
    summary_of,
    user_of,
)

ANNOTATION = re.compile(r"^#(\d+)〔约 (\d+) token〕")


@pytest.fixture
def on_api(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make `api` answer on a test's private runtime."""

    def use(env: Env) -> Env:
        monkeypatch.setattr(runtime, "_current", env.rt)
        return env

    return use


async def put(session: SessionRecord, **fields: Any) -> Message:
    return await api.record(session, api.Message(**fields))


def parts_of(body: dict[str, Any]) -> list[str]:
    """The units of a summary request as written, one per part (R-RUN-2/6)."""
    return conversation_of(body).split("\n\n")


# ---- R-RUN-3: 「两者的参数与正文按每条 200 字硬截断」「通知…同样按每条 200 字硬截断」 ----------------
async def test_r_run_3_arguments_results_and_notices_are_whole_at_200_and_cut_at_201(
    make: Make, on_api: Any
) -> None:
    env = on_api(await make())
    await put(GROUP, role="user", content="[甲(1)] 帮我记两件事", ts=1.0)
    calls = (ToolCall("c200", "note", "参" * 200), ToolCall("c201", "note", "数" * 201))
    await put(GROUP, role="assistant", content="", tool_calls=calls, ts=2.0)
    # The results carry a name of their own: the call's name wins (R-RUN-3).
    await put(GROUP, role="tool", content="果" * 200, tool_call_id="c200", name="other", ts=3.0)
    await put(GROUP, role="tool", content="结" * 201, tool_call_id="c201", name="other", ts=4.0)
    await put(GROUP, role="notice", content="通" * 200, ts=5.0)
    await put(GROUP, role="notice", content="知" * 201, ts=6.0)
    await api.compress(GROUP.id)
    (request,) = env.model.summary_requests()
    texts = [ANNOTATION.sub("", p) for p in parts_of(request)]
    assert texts[1:] == [
        f"调用 note({'参' * 200})\n调用 note({'数' * 200})\n"
        f"工具结果(note): {'果' * 200}\n工具结果(note): {'结' * 200}",
        f"通知: {'通' * 200}",
        f"通知: {'知' * 200}",
    ]


# ---- R-RUN-6: numbered exactly when complete and N ≤ the keep cap the prompt states ------------
async def test_r_run_6_a_unit_is_numbered_exactly_when_its_verbatim_cost_is_within_the_stated_keep_cap(
    make: Make, on_api: Any
) -> None:
    env = on_api(await make(memsum_summary_budget_ratio=0.3))
    sizes = [4, 30, 120, 400, 700, 1500, 60, 8]
    stored = [
        await put(GROUP, role="user", content=f"[成员{i}(3{i:03d})] " + "话" * n, ts=10.0 + i)
        for i, n in enumerate(sizes)
    ]
    await api.compress(GROUP.id)
    (request,) = env.model.summary_requests()
    _, keep_cap = stated(request)
    numbers: list[int] = []
    for message, part in zip(stored, parts_of(request), strict=True):
        cost = estimate_msg_tokens(message)  # 「N 是它原样留在上下文里要占的 token」
        m = ANNOTATION.match(part)
        if cost <= keep_cap:
            assert m is not None, (cost, keep_cap, part[:40])
            assert int(m.group(2)) == cost
            assert part[m.end() :] == message.content
            numbers.append(int(m.group(1)))
        else:
            assert m is None, (cost, keep_cap)
            assert part == message.content
    assert numbers == list(range(1, len(numbers) + 1))  # from 1, in time order
    assert 0 < len(numbers) < len(stored)  # both sides of the cap were met


# ---- R-RUN-7: a full-width heading and digits after the summary ---------------------------------
async def test_r_run_7_a_full_width_block_after_the_summary_keeps_its_units_and_is_not_stored(
    make: Make, on_api: Any
) -> None:
    env = on_api(await make(memsum_summary_budget_ratio=0.5))
    short = [await put(GROUP, role="user", content=f"[甲(1)] 第{i}件事", ts=1.0 + i) for i in range(3)]
    await put(GROUP, role="user", content="[乙(2)] " + "长" * 600, ts=9.0)  # room in the keep cap
    env.model.summary.append(Reply(f"{CHAT_SUMMARY}\n\n＃＃ 【保留原文】\n＃２、＃３"))
    result = await api.compress(GROUP.id)
    (request,) = env.model.summary_requests()
    assert [ANNOTATION.match(p) is not None for p in parts_of(request)] == [True, True, True, False]
    assert result.kept_messages == 2
    assert (await summary_of(env.rt) or {})["text"] == CHAT_SUMMARY
    active = [m for m in await api.history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [short[1].id, short[2].id]


# ---- R-RUN-11: 「核对开头与归档段逐条相同（时间戳、角色、正文与工具调用 id）」 ----------------------
EDITS = {
    "timestamp": "UPDATE messages SET ts = ts + 0.5 WHERE id = ?",
    "role": "UPDATE messages SET role = 'assistant' WHERE id = ?",
    "tool call id": "UPDATE messages SET tool_calls = replace(tool_calls, 'call_a', 'call_z') WHERE id = ?",
}


@pytest.mark.parametrize("field", list(EDITS))
async def test_r_run_11_a_span_item_changed_in_one_compared_field_fails_and_restores(
    make: Make, on_api: Any, field: str
) -> None:
    env = on_api(await make())
    rt = env.rt
    await rt.store.put_meta("summary", GROUP.id, OLD_SUMMARY)
    ask = await put(GROUP, role="user", content="[甲(1)] 几点了", ts=1.0)
    call = await put(
        GROUP, role="assistant", content="", tool_calls=(ToolCall("call_a", "clock", "{}"),), ts=2.0
    )
    await put(GROUP, role="tool", content="十点", tool_call_id="call_a", ts=3.0)
    await put(GROUP, role="assistant", content="十点了", ts=4.0)
    before = await api.history(GROUP.id)
    gate = env.model.hold_summary()
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    # Another connection (another process, a hand edit) changes one field of one span item.
    await raw_sql(rt.store.path, EDITS[field], ((call if field == "tool call id" else ask).id,))
    gate.open()
    with pytest.raises(api.CompressionError) as failed:
        await run
    assert failed.value.reason == CHANGED == "压缩期间历史被改动"
    assert await summary_of(rt) == OLD_SUMMARY  # the previous summary, as it was
    assert [m.id for m in await api.history(GROUP.id)] == [m.id for m in before]  # no archive, no divider
    assert env.phases() == [("start", None), ("error", CHANGED)]
    assert len(env.failure_warnings()) == 1


async def test_r_run_11_a_change_outside_the_compared_fields_does_not_fail_the_commit(
    make: Make, on_api: Any
) -> None:
    # Only 时间戳、角色、正文与工具调用 id are compared: a message's metadata written meanwhile
    # (a platform's message id noted late, say) is no change of the history.
    env = on_api(await make())
    rt = env.rt
    first = await put(GROUP, role="user", content="[甲(1)] 早", ts=1.0, metadata={"message_id": 7})
    await put(GROUP, role="user", content="[乙(2)] 早上好", ts=2.0)
    gate = env.model.hold_summary()
    run = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    await raw_sql(
        rt.store.path, "UPDATE messages SET metadata = ? WHERE id = ?", ('{"message_id": 8}', first.id)
    )
    gate.open()
    result = await run
    assert (result.outcome, result.archived) == ("done", 2)
    history = await api.history(GROUP.id)
    assert [(m.content, m.event_marker) for m in history] == [(DIVIDER, True)]


# ---- R-RUN-1: the snapshot read while the agent's own tool call is still running -------------------
async def test_r_run_1_a_manual_run_during_the_agents_tool_call_leaves_the_whole_group_active(
    make: Make, on_api: Any
) -> None:
    """「快照恰好读在 agent 写这一组的几次写入之间」: a real turn has stored its call and waits for
    its tool; /压缩 now cuts before the call, and the result and the answer written later stay
    with it, so the next request sends the group whole."""
    env = on_api(await make())
    release = asyncio.Event()
    started = asyncio.Event()

    @api.tool("slow_lookup", "查一个很慢的资料", {"type": "object", "properties": {}})
    async def slow_lookup(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        started.set()
        await release.wait()
        return "资料：周六九点集合"

    earlier = await put(GROUP, role="user", content="[丙(3)] 周末去哪", ts=1.0)
    question = await put(GROUP, role="user", content="[甲(1)] @小记 查一下集合时间", ts=2.0)
    env.model.chat.append(Reply("", tool_calls=[{"id": "call_s", "name": "slow_lookup", "arguments": "{}"}]))
    env.model.chat.append(Reply("周六九点集合"))
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    turn = asyncio.create_task(api.run_turn(GROUP.id, reply, IN_GROUP))
    await asyncio.wait_for(started.wait(), 10)
    compression = asyncio.create_task(api.compress(GROUP.id))
    for _ in range(500):  # the summary is written; the commit waits for the turn (R-TRIG-5)
        if env.model.summary_requests():
            break
        await asyncio.sleep(0.01)
    (request,) = env.model.summary_requests()
    text = conversation_of(request)
    assert earlier.content in text
    assert question.content in text
    assert "slow_lookup" not in text
    release.set()
    assert await turn == "replied"
    result = await compression
    assert (result.outcome, result.archived) == ("done", 2)
    active = [m for m in await api.history(GROUP.id) if m.is_conversation]
    assert [(m.role, m.content) for m in active] == [
        ("assistant", ""),
        ("tool", "资料：周六九点集合"),
        ("assistant", "周六九点集合"),
    ]
    assert [c.id for c in active[0].tool_calls] == [active[1].tool_call_id] == ["call_s"]
    prompt = await api.build_prompt(GROUP.id, IN_GROUP)
    head = next(
        i for i, m in enumerate(prompt.messages) if str(m["content"] or "").startswith(INJECTION_HEAD)
    )
    history = prompt.messages[head + 1 :]
    assert history[0]["role"] == "assistant"
    assert [c["id"] for c in history[0]["tool_calls"]] == ["call_s"]
    assert history[1] == {"role": "tool", "content": "资料：周六九点集合", "tool_call_id": "call_s"}


# ---- R-RUN-4: the todo list the built-in tool wrote, as the last part of a work session ----------
async def test_r_run_4_a_work_sessions_request_ends_with_the_todo_list_the_model_wrote(
    make: Make, on_api: Any
) -> None:
    env = on_api(await make())
    env.model.summary_default = Reply(f"【保留原文】无\n{WORK_SUMMARY}")
    task = await api.internal_session("plugin:release")
    await put(task, role="user", content="[系统(0)] 规划下周发布", ts=1.0)
    items = [{"title": "写测试", "status": "in_progress"}, {"title": "发布 2.0", "status": "pending"}]
    env.model.chat.append(
        Reply(
            "",
            tool_calls=[
                {
                    "id": "t1",
                    "name": "todo_write",
                    "arguments": json.dumps({"items": items}, ensure_ascii=False),
                }
            ],
        )
    )
    env.model.chat.append(Reply("已列好待办"))
    assert await api.run_turn(task.id) == "replied"
    await api.compress(task.id)
    (request,) = env.model.summary_requests()
    assert "## 目标" in request["messages"][0]["content"]  # the work template (R-TPL-2)
    assert user_of(request).endswith("\n\n当前任务列表状态\n- [in_progress] 写测试\n- [pending] 发布 2.0")

    # 「没有待办时不写」: the model empties its list; the next compression has no todo part.
    await put(task, role="user", content="[系统(0)] 都做完了", ts=2.0)
    env.model.chat.append(
        Reply("", tool_calls=[{"id": "t2", "name": "todo_write", "arguments": '{"items": []}'}])
    )
    env.model.chat.append(Reply("清空了"))
    assert await api.run_turn(task.id) == "replied"
    await api.compress(task.id)
    last = env.model.summary_requests()[-1]
    assert "当前任务列表状态" not in user_of(last)
    assert user_of(last).endswith("〔对话记录结束〕")


# ---- R-MEM-1: 「namespace summary，key 为会话 ID」, in the same file as the history -------------
async def test_r_mem_1_the_summary_is_a_metadata_row_of_the_same_sqlite_file_as_the_history(
    make: Make, on_api: Any
) -> None:
    env = on_api(await make())
    await put(GROUP, role="user", content="[甲(1)] 周六爬山", ts=1.0)
    await api.compress(GROUP.id)
    path: Path = env.rt.store.path

    def read() -> tuple[list[tuple[str]], int]:
        with sqlite3.connect(path) as db:
            rows = db.execute(
                "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", (GROUP.id,)
            ).fetchall()
            messages = db.execute(
                "SELECT COUNT(*) FROM messages WHERE session_id = ?", (GROUP.id,)
            ).fetchone()
        db.close()
        return rows, int(messages[0])

    rows, messages = await asyncio.to_thread(read)
    assert messages == 2  # the archived line and the divider
    (value,) = rows
    assert json.loads(value[0])["text"] == CHAT_SUMMARY
    assert (await api.status(GROUP.id)).summary == CHAT_SUMMARY


# ---- R-MEM-2/3: a clear that cancels the turn's own compression ---------------------------------
IN_TURN: dict[str, Any] = {
    "chat": {"context_window": 10000},
    "memsum_compress_at": 0.5,
    "memsum_trim_ratio": 0.3,
}


@pytest.mark.parametrize("kind", ["context", "summary"])
async def test_r_mem_3_a_clear_that_cancels_the_in_turn_run_keeps_what_it_cleared_from_the_model(
    make: Make, on_api: Any, kind: Literal["context", "summary"]
) -> None:
    """The turn whose request is over the trim budget compresses first (the README's decision);
    the owner clears while that summary is still being written. The run is cancelled (R-MEM-3),
    and once the clear has returned what it cleared is 「不再发给模型」: the turn must not send
    the request it assembled before the clear (the cleared messages, or the cleared summary)."""
    env = on_api(await make(**IN_TURN))
    await env.rt.store.put_meta("summary", GROUP.id, OLD_SUMMARY)
    history = [
        await put(GROUP, role="user", content=f"[成员{i}(3{i:03d})] 旧话题{i}：" + "字" * 120, ts=1.0 + i)
        for i in range(30)
    ]
    gate = env.model.hold_summary()
    turn = asyncio.create_task(api.run_turn(GROUP.id, None, IN_GROUP))
    with gate:
        await gate.reached()
        await api.clear(GROUP.id, kind)
    outcome = await turn
    assert env.phases() == [("start", None), ("error", "压缩期间会话被清空")]
    assert (await api.status(GROUP.id)).summary is None
    sent = json.dumps(env.model.chat_requests(), ensure_ascii=False)
    assert "上周的旧话题" not in sent  # the old summary, cleared by either kind
    if kind == "context":
        # Nothing is left to answer: no request at all, nothing stored after the clear.
        assert (outcome, env.model.chat_requests()) == ("silent", [])
        assert await api.history(GROUP.id) == []
    else:
        # The history stays and is answered (hard-trimmed: the run that would have made room
        # was cancelled), without the summary the owner cleared.
        assert outcome == "replied"
        (request,) = env.model.chat_requests()
        assert history[-1].content in sent
        assert not any(str(m["content"] or "").startswith(INJECTION_HEAD) for m in request["messages"])


# ---- R-RUN-2 / R-RUN-12: a message written between a call and its results ------------------------
# What every OpenAI-compatible provider requires of the messages it is sent: an assistant message
# with `tool_calls` is followed at once by the tool messages answering each call id; anything in
# between is refused with a 400. The wording, as users hit it: OpenAI ("An assistant message with
# 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following
# tool_call_ids did not have response messages: …", agno-agi/agno#3105, BerriAI/litellm#10083),
# DeepSeek ("… (insufficient tool messages following tool_calls message)", langgenius/dify#32222),
# DashScope/Qwen ("InternalError.Algo.InvalidParameter: An assistant message with "tool_calls" must
# be followed by tool messages …", QwenLM/qwen-code#606).
def tool_groups_whole(messages: list[dict[str, Any]]) -> bool:
    """Whether each assistant message with tool calls is followed at once by their results."""
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            after = messages[i + 1 : i + 1 + len(ids)]
            if sorted(r.get("tool_call_id") or "" for r in after if r["role"] == "tool") != sorted(ids):
                return False
        elif m["role"] == "tool" and not (
            i and (messages[i - 1].get("tool_calls") or messages[i - 1]["role"] == "tool")
        ):
            return False
    return True


async def test_r_run_2_a_member_speaking_while_the_bots_tool_runs_comes_after_the_group_on_the_wire(
    make: Make, on_api: Any
) -> None:
    """A member's message recorded while the agent's tool runs sits between the call and its
    result in the store (R-RUN-2: 「夹在调用与结果之间的别的消息另成单位、排在这组之后」). The
    next request carries the group whole and the member's message after it: the provider takes
    it, the bot answers, and the later turns of the group do not fail on it either."""
    env = on_api(await make())
    release = asyncio.Event()
    started = asyncio.Event()

    @api.tool("slow_lookup", "查一个很慢的资料", {"type": "object", "properties": {}})
    async def slow_lookup(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        started.set()
        await release.wait()
        return "资料：周六九点集合"

    await put(GROUP, role="user", content="[甲(1)] @小记 查一下集合时间", ts=1.0)
    env.model.chat.append(Reply("", tool_calls=[{"id": "call_s", "name": "slow_lookup", "arguments": "{}"}]))
    env.model.chat.append(Reply("周六九点集合"))
    turn = asyncio.create_task(api.run_turn(GROUP.id, None, IN_GROUP))
    await asyncio.wait_for(started.wait(), 10)
    inside = await put(GROUP, role="user", content="[乙(2)] 我也想知道", ts=2.0)
    release.set()
    assert await turn == "replied"
    stored = [m.role for m in await api.history(GROUP.id)]
    assert stored == ["user", "assistant", "user", "tool", "assistant"]  # the store keeps arrival order
    second = env.model.chat_requests()[-1]["messages"]
    assert tool_groups_whole(second)
    assert [m["role"] for m in second[1:]] == ["user", "assistant", "tool", "user"]
    assert second[-1]["content"] == inside.content
    await put(GROUP, role="user", content="[丙(3)] 那几点散？", ts=3.0)
    assert await api.run_turn(GROUP.id, None, IN_GROUP) == "replied"
    assert tool_groups_whole(env.model.chat_requests()[-1]["messages"])


async def test_r_run_12_a_kept_tool_group_and_the_message_inside_it_reach_the_model_as_a_whole_group(
    make: Make, on_api: Any
) -> None:
    """The summariser keeps both the tool group and the member's line written inside it; they
    stay active in their stored order (R-RUN-12) and from the next turn on follow the summary
    as the provider accepts them: the group whole, the line after it (as R-RUN-2 placed it)."""
    env = on_api(await make(memsum_summary_budget_ratio=0.5))
    await put(GROUP, role="user", content="[甲(1)] 几点了", ts=1.0)
    await put(GROUP, role="assistant", content="", tool_calls=(ToolCall("c1", "clock", "{}"),), ts=2.0)
    inside = await put(GROUP, role="user", content="[乙(2)] 顺便看看日期", ts=3.0)
    await put(GROUP, role="tool", content="十点", tool_call_id="c1", ts=4.0)
    await put(GROUP, role="user", content="[丙(3)] " + "长" * 600, ts=5.0)  # room in the keep cap
    env.model.summary.append(Reply(f"【保留原文】2、3\n{CHAT_SUMMARY}"))
    result = await api.compress(GROUP.id)
    (request,) = env.model.summary_requests()
    assert ANNOTATION.sub("", parts_of(request)[1]).startswith("调用 clock({})\n工具结果(clock): 十点")
    assert ANNOTATION.sub("", parts_of(request)[2]) == inside.content  # after the group
    assert result.kept_messages == 3
    await put(GROUP, role="user", content="[甲(1)] @小记 现在呢", ts=6.0)
    assert await api.run_turn(GROUP.id, None, IN_GROUP) == "replied"
    messages = env.model.chat_requests()[-1]["messages"]
    assert tool_groups_whole(messages)
    head = next(i for i, m in enumerate(messages) if str(m["content"] or "").startswith(INJECTION_HEAD))
    assert [m["role"] for m in messages[head + 1 :]] == ["assistant", "tool", "user", "user"]
    assert messages[head + 3]["content"] == inside.content
