"""Clearing while a compression runs or waits (R-MEM-2/3), through a private runtime and a
real server; a `Gate` holds the summary until the test lets it go."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.agent.events import (
    CompressionProgress,
)
from nonebot_plugin_memsum.agent.tools import TodoItem, ToolContext
from nonebot_plugin_memsum.compression.request import (
    CompressionError,
)
from nonebot_plugin_memsum.compression.service import (
    CLEARED,
    DIVIDER,
    IN_TURN,
    INJECTION_HEAD,
    STORE_FAILED,
)
from nonebot_plugin_memsum.types import SessionRecord
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    GROUP,
    IN_GROUP,
    Env,
    Make,
    committing,
    held_compression,
    held_turn,
    raw_sql,
    seed,
    settle,
    summary_of,
    talk,
    usage,
)


# ---- R-MEM: clearing ---------------------------------------------------------------------------------
async def test_r_mem_2_clear_context_clears_the_summary_too(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    await seed(rt, 2, start=3)
    await rt.compression.clear(GROUP.id, "context")
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == []
    await seed(rt, 1, start=5)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    assert not any(INJECTION_HEAD in str(m["content"]) for m in model.chat_requests()[-1]["messages"])


def _session_rows(path: Path, session_id: str) -> dict[str, int]:
    """How many rows of each table belong to the session, read from the file itself."""
    queries = {
        "messages": "SELECT COUNT(*) FROM messages WHERE session_id = ?",
        "metadata": "SELECT COUNT(*) FROM metadata WHERE key = ?",
        "settings": "SELECT COUNT(*) FROM settings WHERE scope = 'session' AND scope_key = ?",
        "sessions": "SELECT COUNT(*) FROM sessions WHERE id = ?",
        "ledger": "SELECT COUNT(*) FROM ledger WHERE session_id = ?",
    }
    with sqlite3.connect(path) as db:
        counts = {table: db.execute(sql, (session_id,)).fetchone()[0] for table, sql in queries.items()}
    db.close()
    return counts


async def test_r_mem_2_delete_session_cancels_the_run_and_removes_everything(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    model.summary.append(Reply("【保留原文】无"))  # the background run fails: a back-off
    await seed(rt, 4)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    await rt.settings.set("compress_at", "session", GROUP.id, 0.3)
    await rt.todos.replace(GROUP.id, [TodoItem("写周报", "pending")])
    status = await rt.compression.status(GROUP.id)
    assert (status.backoff_failures, status.compress_at, status.usage is not None) == (1, 0.3, True)
    other = SessionRecord(id="onebot:group:2", platform="onebot", kind="group", place="group:2")
    await seed(rt, 2, record=other, start=50)
    await rt.store.flush_ledger()  # usage rows are written in batches (issue 9)
    before = await asyncio.to_thread(_session_rows, rt.store.path, GROUP.id)
    assert all(before.values()), before

    run, gate = await held_compression(env)  # a compression waiting on the model
    await rt.compression.delete_session(GROUP.id)
    with pytest.raises(CompressionError) as failed:
        await asyncio.wait_for(run, 10)
    assert failed.value.reason == CLEARED
    assert env.phases()[-2:] == [("start", None), ("error", CLEARED)]
    # Gone from the file: history (archive too), summary, last run, todos, back-off, usage,
    # the session's own settings and its record; the usage ledger stays (it was paid).
    after = await asyncio.to_thread(_session_rows, rt.store.path, GROUP.id)
    assert after == {**dict.fromkeys(before, 0), "ledger": before["ledger"]}
    assert len(await rt.store.get_history(other.id)) == 2  # another session is untouched
    status = await rt.compression.status(GROUP.id)
    assert (status.backoff_failures, status.usage, status.compress_at) == (0, None, 0.8)
    assert await rt.store.get_session(GROUP.id) is None
    # The session starts again from nothing.
    await seed(rt, 1, start=60)
    assert [m.content for m in await rt.store.get_history(GROUP.id)] == [talk(60)]
    gate.open()


async def test_r_mem_2_delete_session_waits_for_a_running_turn(env: Env) -> None:
    rt = env.rt
    await seed(rt, 2)
    turn, chat_gate = await held_turn(env, Reply("好的", usage=usage(100)))
    deleting = asyncio.create_task(rt.compression.delete_session(GROUP.id))
    await asyncio.sleep(0.05)
    assert not deleting.done()  # the turn's answer is still to be stored
    chat_gate.open()
    assert await turn == "replied"
    await asyncio.wait_for(deleting, 10)
    await rt.store.flush_ledger()
    assert await asyncio.to_thread(_session_rows, rt.store.path, GROUP.id) == {
        "messages": 0,
        "metadata": 0,
        "settings": 0,
        "sessions": 0,
        "ledger": 1,
    }


async def test_r_mem_2_clear_summary_alone_keeps_the_history(env: Env) -> None:
    rt = env.rt
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    newer = await seed(rt, 2, start=3)
    history = await rt.store.get_history(GROUP.id)
    await rt.compression.clear(GROUP.id, "summary")
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == history
    assert [m.id for m in history if m.is_conversation] == [m.id for m in newer]
    assert await rt.compression.injection(GROUP.id) is None


async def test_r_mem_3_clear_before_the_model_answered_cancels_the_run(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    run, gate = await held_compression(env)
    await rt.compression.clear(GROUP.id, "context")
    with pytest.raises(CompressionError) as failed:
        await run
    assert failed.value.reason == CLEARED
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == []
    archived = await rt.store.get_archived(GROUP.id)
    assert DIVIDER not in [m.content for m in archived]  # no divider was ever written
    assert env.phases() == [("start", None), ("error", CLEARED)]
    gate.open()


async def test_r_mem_3_clear_during_the_commit_waits_then_deletes_the_new_summary(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    run, summary_gate = await held_compression(env)
    # A turn holds the session while the model answers: the commit must wait for it.
    turn, chat_gate = await held_turn(env, Reply("慢慢说", usage=usage(100)))
    summary_gate.open()
    await committing(rt)
    order: list[str] = []
    rt.bus.subscribe(CompressionProgress, lambda p: order.append(p.phase))
    clearing = asyncio.create_task(rt.compression.clear(GROUP.id, "context"))
    clearing.add_done_callback(lambda _: order.append("cleared"))
    await asyncio.sleep(0.05)
    assert not clearing.done()  # it waits for the commit, which waits for the turn
    assert await summary_of(rt) is None
    chat_gate.open()
    assert await turn == "replied"
    result = await run
    await clearing
    await asyncio.sleep(0)  # its done callback, when `await clearing` found it done already
    assert result.outcome == "done"  # the run was not cancelled: it had its answer
    assert order == ["done", "cleared"]
    assert await summary_of(rt) is None  # the new summary is deleted too
    assert await rt.store.get_history(GROUP.id) == []
    archived = await rt.store.get_archived(GROUP.id)
    assert [m.content for m in archived][-2:] == ["慢慢说", DIVIDER]


async def test_r_mem_3_clear_from_inside_the_awaited_turn_cancels_instead_of_deadlocking(env: Env) -> None:
    """A tool of the very turn the commit waits for clears the session: waiting for the
    commit would wait for itself, and the commit has written nothing yet."""
    rt, model = env.rt, env.model
    await seed(rt, 4)
    run, summary_gate = await held_compression(env)

    @rt.tools.tool("forget", "清空本会话", {"type": "object", "properties": {}})
    async def forget(ctx: ToolContext, args: dict[str, Any]) -> str:
        await rt.compression.clear(ctx.session_id, "context")
        return "已清空"

    call = [{"id": "c1", "name": "forget", "arguments": "{}"}]
    chat_gate = model.gate(Reply("", tool_calls=call, finish_reason="tool_calls", usage=usage(100)))
    model.chat.extend([chat_gate, Reply("好了", usage=usage(100))])
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    await chat_gate.reached()
    summary_gate.open()
    await committing(rt)  # the commit now waits for the turn
    chat_gate.open()  # the turn runs the tool, which clears
    assert await asyncio.wait_for(turn, 10) == "replied"
    with pytest.raises(CompressionError) as failed:
        await asyncio.wait_for(run, 10)
    assert failed.value.reason == CLEARED
    assert await summary_of(rt) is None
    assert DIVIDER not in [m.content for m in await rt.store.get_archived(GROUP.id)]


async def test_r_run_11_archive_error_in_the_background_counts_as_a_failure(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt = env.rt
    await seed(rt, 4)
    await raw_sql(
        rt.store.path,
        "CREATE TRIGGER refuse_archive BEFORE UPDATE OF archived ON messages WHEN NEW.archived = 1"
        " BEGIN SELECT RAISE(ABORT, 'archive refused by the test'); END",
    )
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert env.phases() == [("start", None), ("error", STORE_FAILED)]
    assert len(env.failure_warnings()) == 1  # no second "crashed" report
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 1


async def test_compress_from_inside_the_sessions_own_turn_refuses_and_clear_still_works(env: Env) -> None:
    """A tool or a prompt contribution of the turn compresses its own session: the commit
    would wait for the turn that waits for it. It is refused at once; nothing is held."""
    rt, model = env.rt, env.model
    await seed(rt, 4)
    refusals: list[str] = []

    @rt.tools.tool("compress_me", "压缩本会话", {"type": "object", "properties": {}})
    async def compress_me(ctx: ToolContext, args: dict[str, Any]) -> str:
        try:
            await rt.compression.compress(ctx.session_id)
        except CompressionError as err:
            refusals.append(err.reason)
            return err.reason
        return "压缩好了"

    async def contribution(session_id: str) -> str | None:
        if session_id == GROUP.id and not refusals:
            try:
                await rt.compression.compress(session_id)
            except CompressionError as err:
                refusals.append(err.reason)
        return None

    rt.agent.contribute("plugin-x", contribution)
    call = [{"id": "c1", "name": "compress_me", "arguments": "{}"}]
    model.chat.extend(
        [
            Reply("", tool_calls=call, finish_reason="tool_calls", usage=usage(100)),
            Reply("好了", usage=usage(100)),
        ]
    )
    assert await asyncio.wait_for(rt.agent.run_turn(GROUP.id, entry=IN_GROUP), 20) == "replied"
    assert refusals == [IN_TURN, IN_TURN]
    assert model.summary_requests() == []
    assert not rt.compression.is_running(GROUP.id)
    # the tool's answer reached the model as its result
    tool_results = [m for m in model.chat_requests()[-1]["messages"] if m["role"] == "tool"]
    assert tool_results[-1]["content"] == IN_TURN
    # nothing is left holding the session: a clear and a compression afterwards work
    await asyncio.wait_for(rt.compression.clear(GROUP.id, "context"), 10)
    assert await rt.store.get_history(GROUP.id) == []
    await seed(rt, 3, start=10)
    assert (await asyncio.wait_for(rt.compression.compress(GROUP.id), 20)).outcome == "done"


# ---- R-MEM-2: a context clear from outside a running turn --------------------------------------------
async def _held_tool_turn(env: Env) -> tuple[asyncio.Task[Any], asyncio.Event, list[str]]:
    """A turn whose model calls a slow tool; the tool waits until the returned event is set."""
    rt, model = env.rt, env.model
    await seed(rt, 2)
    running, release = asyncio.Event(), asyncio.Event()

    @rt.tools.tool("slow_lookup", "查资料", {"type": "object", "properties": {}})
    async def slow_lookup(ctx: ToolContext, args: dict[str, Any]) -> str:
        running.set()
        await release.wait()
        return "查到了"

    call = [{"id": "c1", "name": "slow_lookup", "arguments": "{}"}]
    model.chat.extend(
        [
            Reply("", tool_calls=call, finish_reason="tool_calls", usage=usage(100)),
            Reply("查到了：答案", usage=usage(100)),
        ]
    )
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, reply, entry=IN_GROUP))
    await asyncio.wait_for(running.wait(), 10)
    return turn, release, sent


async def test_r_mem_2_a_context_clear_while_the_bots_tool_runs_gets_no_answer_to_nothing(env: Env) -> None:
    """The owner sends /清除 上下文 while the bot's tool runs: the question is gone, so the turn
    makes no further model call and sends nothing into the freshly cleared chat."""
    rt, model = env.rt, env.model
    turn, release, sent = await _held_tool_turn(env)
    await rt.compression.clear(GROUP.id, "context")
    release.set()
    assert await asyncio.wait_for(turn, 10) == "silent"
    assert sent == []
    assert len(model.chat_requests()) == 1  # only the call that asked for the tool
    assert [m for m in await rt.store.get_history(GROUP.id) if m.role == "assistant" and m.content] == []
    # the next question is answered as usual
    model.chat.append(Reply("新的回答", usage=usage(100)))
    await seed(rt, 1, start=10)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"


async def test_r_mem_2_a_context_clear_while_the_model_answers_sends_no_answer(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 2)
    gate = model.gate(Reply("迟到的回答", usage=usage(100)))
    model.chat.append(gate)
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, reply, entry=IN_GROUP))
    await gate.reached()
    await rt.compression.clear(GROUP.id, "context")
    gate.open()
    assert await asyncio.wait_for(turn, 10) == "silent"
    assert sent == []
    assert await rt.store.get_history(GROUP.id) == []


async def test_r_mem_2_a_summary_clear_while_the_bots_tool_runs_still_answers(env: Env) -> None:
    """Only the context's clear takes the question away: after /清除 摘要 the history is there."""
    rt = env.rt
    turn, release, sent = await _held_tool_turn(env)
    await rt.compression.clear(GROUP.id, "summary")
    release.set()
    assert await asyncio.wait_for(turn, 10) == "replied"
    assert sent == ["查到了：答案"]
