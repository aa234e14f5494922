"""Outside audit 11 (fa): concurrency through the library API, seeded and random, checked
against the specification's invariants (R-PROG, R-RUN-11, R-MEM-2/3, R-INJ-1, R-BUD)."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.agent.events import CompressionProgress
from nonebot_plugin_memsum.compression.service import (
    CLEARED,
    RUNS_NAMESPACE,
)
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, open_store
from nonebot_plugin_memsum.types import Message
from tests.fakes.llm_server import Reply
from tests.fakes.pgdb import raw
from tests.fakes.service import GROUP as SERVICE_GROUP
from tests.fakes.service import Make, held_turn, seed, until

_current: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar("memsum_fa_runtime", default=None)


@pytest.fixture
def per_task_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """`api` calls `runtime.get()`: here it answers the runtime the calling task chose, so
    one test drives two runtimes (two bot processes) through the library API."""
    original = runtime.get

    def get() -> Runtime:
        rt = _current.get()
        return rt if rt is not None else original()

    monkeypatch.setattr(runtime, "get", get)


def body_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body["messages"])


# ---- regressions the random driver found, shrunk -------------------------------------------------
async def test_r_mem_3_a_run_begun_while_a_deletion_waited_for_the_turn_sends_nothing_deleted(
    make: Make, per_task_runtime: None
) -> None:
    # Another plugin deletes a session while its turn runs: the deletion waits for the turn.
    # Meanwhile a compression begins (a /压缩, or the background one the turn's end starts) and
    # reads the history, still whole. Once the deletion returned, that run must not send the
    # deleted conversation to the summariser, and ends as cancelled by the deletion
    # (「压缩期间会话被清空」), leaving no trace of the session. Before: it sent them, failed
    # with 「压缩期间历史被改动」 and wrote a compression record for the deleted session.
    env = await make()
    rt = env.rt
    _current.set(rt)
    await seed(rt, 6, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    turn, chat_gate = await held_turn(env, Reply("好的"))
    with chat_gate:
        deleting = asyncio.create_task(api.delete_session(sid))
        await until(lambda: rt.compression._commit_locks.locked(sid), "the deletion waits for the turn")
        started, release = asyncio.Event(), asyncio.Event()

        async def hold_start(p: CompressionProgress) -> None:
            if p.phase == "start":
                started.set()
                await release.wait()

        rt.bus.subscribe(CompressionProgress, hold_start)
        run = asyncio.create_task(api.compress(sid))
        await asyncio.wait_for(started.wait(), 10)  # its snapshot is read: the whole history
        chat_gate.open()
        await turn
        await asyncio.wait_for(deleting, 10)
    asked = len(env.model.summary_requests())
    release.set()
    with pytest.raises(api.CompressionError) as refused:
        await asyncio.wait_for(run, 10)
    assert str(refused.value) == CLEARED
    assert env.model.summary_requests()[asked:] == []
    assert await rt.store.get_meta(RUNS_NAMESPACE, sid) is None
    assert await rt.store.get_meta(SUMMARY_NAMESPACE, sid) is None
    assert await rt.store.get_history(sid) == []
    assert env.phases(sid)[-2:] == [("start", None), ("error", CLEARED)]


async def test_r_mem_2_a_clear_while_a_turn_builds_its_prompt_keeps_the_cleared_history_from_the_model(
    make: Make, per_task_runtime: None
) -> None:
    # Another plugin's prompt contribution takes a moment (it looks something up); meanwhile
    # the owner clears the context (/清除 上下文, api.clear) and the clear returns. The turn had
    # read the history before: it must not send the cleared conversation to the model now;
    # the question went with the clear, so the turn says nothing (as when the clear comes
    # while the model answers).
    env = await make()
    rt = env.rt
    _current.set(rt)
    said = await seed(rt, 4, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_weather(session_id: str) -> str:
        entered.set()
        await release.wait()
        return "今天晴"

    api.contribute("weather", slow_weather)
    replies: list[str] = []

    async def reply(text: str) -> None:
        replies.append(text)

    turn = asyncio.create_task(api.run_turn(sid, reply, api.Entry("onebot", "group")))
    await asyncio.wait_for(entered.wait(), 10)
    asked = len(env.model.chat_requests())
    await api.clear(sid, "context")
    release.set()
    outcome = await asyncio.wait_for(turn, 10)
    sent = [body_text(b) for b in env.model.chat_requests()[asked:]]
    assert not [t for t in sent if any(m.content in t for m in said)], sent
    assert outcome == "silent"
    assert replies == []
    assert await rt.store.get_history(sid) == []


async def test_r_mem_2_a_tool_result_that_comes_back_after_a_clear_is_not_stored(
    make: Make, per_task_runtime: None
) -> None:
    # The model asked for a tool (recall, or another plugin's lookup) and the tool takes a
    # moment; meanwhile the owner clears the context and the clear returns. The tool's result
    # answers a call the clear removed and holds what was read before it: it must not land
    # in the cleared history, where the next turn or compression would send it to the model.
    env = await make()
    rt = env.rt
    _current.set(rt)
    said = await seed(rt, 4, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    entered, release = asyncio.Event(), asyncio.Event()

    @api.tool("look_up", "查资料", {"type": "object", "properties": {}})
    async def look_up(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        entered.set()
        await release.wait()
        return f"查到：{said[0].content}"

    call = {"id": "call_1", "name": "look_up", "arguments": "{}"}
    env.model.chat.append(Reply("", tool_calls=[call], finish_reason="tool_calls"))
    turn = asyncio.create_task(api.run_turn(sid, entry=api.Entry("onebot", "group")))
    await asyncio.wait_for(entered.wait(), 10)
    await api.clear(sid, "context")
    release.set()
    assert await asyncio.wait_for(turn, 10) == "silent"
    assert await rt.store.get_history(sid) == []
    # What comes next carries nothing of it.
    await api.record(SERVICE_GROUP, Message(role="user", content="[乙(20002)] 新话题"))
    asked = len(env.model.chat_requests())
    await api.run_turn(sid, entry=api.Entry("onebot", "group"))
    [request] = env.model.chat_requests()[asked:]
    assert said[0].content not in body_text(request)


@pytest.mark.parametrize("how", ["clear", "delete"])
async def test_r_mem_3_a_run_in_another_process_sends_nothing_cleared_there(
    pg_url: str, make: Make, per_task_runtime: None, how: str
) -> None:
    # Two bot processes on one PostgreSQL memory. One has begun compressing the group and read
    # its history; before its summary request goes out, the owner clears the group's context
    # (or a plugin deletes the session) through the other process, and that returns. The run
    # cannot be cancelled from there, but it must not send the cleared conversation to the
    # summariser afterwards: it ends cancelled (「压缩期间会话被清空」), having written nothing.
    first = await make(location=pg_url)
    second = await make(location=pg_url)
    _current.set(first.rt)
    said = await seed(first.rt, 6, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    started, release = asyncio.Event(), asyncio.Event()

    async def hold_start(p: CompressionProgress) -> None:
        if p.phase == "start":
            started.set()
            await release.wait()

    second.rt.bus.subscribe(CompressionProgress, hold_start)
    run = asyncio.create_task(second.rt.compression.compress(sid))
    await asyncio.wait_for(started.wait(), 10)  # it read the whole history
    if how == "clear":
        await api.clear(sid, "context")
    else:
        await api.delete_session(sid)
    release.set()
    with pytest.raises(api.CompressionError) as refused:
        await asyncio.wait_for(run, 10)
    assert str(refused.value) == CLEARED
    sent = [body_text(b) for b in second.model.summary_requests()]
    assert not [t for t in sent if any(m.content in t for m in said)]
    assert await first.rt.store.get_meta(SUMMARY_NAMESPACE, sid) is None
    assert await first.rt.store.get_history(sid) == []
    if how == "delete":  # no trace of the deleted session
        assert await first.rt.store.get_meta(RUNS_NAMESPACE, sid) is None


async def test_a_deletion_beside_another_process_s_commit_waits_for_it_not_a_deadlock(pg_url: str) -> None:
    # Two bot processes on one PostgreSQL memory: one commits a compression of the group (it
    # holds the session, then archives its messages) while a plugin in the other deletes the
    # session. The deletion waits for the commit and then removes everything; before, it began
    # deleting the messages without waiting, and PostgreSQL ended one of the two with
    # "deadlock detected" (api.delete_session raised StoreError).
    first, second = await open_store(pg_url), await open_store(pg_url)
    try:
        await first.save_session(SERVICE_GROUP)
        sid = SERVICE_GROUP.id
        for i in range(6):
            await first.append(sid, Message(role="user", content=f"[甲(20001)] 第{i}句", ts=1.0 + i))
        async with first.transaction() as tx:
            await tx._live().hold(sid)  # as the commit does (store.history_in)
            deleting = asyncio.create_task(second.delete_session(sid))
            for _ in range(200):  # until the deletion waits for a lock
                if deleting.done() or await raw(
                    pg_url,
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'",
                ):
                    break
                await asyncio.sleep(0.01)
            await tx.archive_span(sid, 6)
            await tx.put_meta(SUMMARY_NAMESPACE, sid, {"text": "摘要"})
        await asyncio.wait_for(deleting, 10)
        assert await first.get_history(sid) == []
        assert await first.get_archived(sid) == []
        assert await first.get_meta(SUMMARY_NAMESPACE, sid) is None
    finally:
        await first.close()
        await second.close()
