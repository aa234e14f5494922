"""Seventeenth audit: a context clear (R-MEM-2) that commits while a turn waits to store what it
made from the history before it.

A seeded driver (tests/test_audit11_fa.py, seed 64 of MEMSUM_MORE_SEEDS, two runtimes on
PostgreSQL, under load) found a chat request, made after `api.clear(sid, "context")` returned
in the same process, that carried cleared messages: the model had called `recall`, the tool
read the history, and its result waited for the store while the clear's transaction held it.
The turn had checked for a clear before storing; the result was stored right after the clear
committed, as active history, and every later request carried what it had found. The same
wait could store the turn's answer after the clear and send it into the cleared chat.

A clear now counts in the store as it commits (`Store.clears`), and every message a turn stores
says which count it read the history under: one that comes after a clear is not stored, and
the turn ends silent. Driven here deterministically through the real runtime, a real SQLite
file and the scripted model server.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from nonebot_plugin_memsum.agent.tools import ToolContext
from nonebot_plugin_memsum.runtime import Runtime
from tests.fakes.agent import GROUP, GROUP_ENTRY, MakeRuntime, Replies, chat_requests, fill, tool_call, user
from tests.fakes.e2e import query
from tests.fakes.llm_server import Reply, ScriptedLLM

SECRET = "提取码 8d3k"


async def asked_with_a_secret(make_rt: MakeRuntime) -> Runtime:
    rt = await make_rt()
    said = [user(f"网盘{SECRET}", 20042, "阿洁"), user("@小记(10000) 提取码是多少", 20041, "小林")]
    await fill(rt, GROUP, said)
    return rt


async def clear_now(rt: Runtime, clearing: list[asyncio.Task[None]]) -> None:
    """The owner's /清除 上下文, started now; back once its transaction holds the store (its
    one connection's lock), so the turn's next write waits behind it."""
    clearing.append(asyncio.create_task(rt.compression.clear(GROUP.id, "context")))
    while not rt.store._lock.locked():  # noqa: ASYNC110  (the lock has no event to wait on)
        await asyncio.sleep(0)


async def test_r_mem_2_a_tool_result_that_waited_behind_a_clear_is_not_stored_after_it(
    make_rt: MakeRuntime, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await asked_with_a_secret(make_rt)
    search = rt.tools.call
    clearing: list[asyncio.Task[None]] = []

    async def cleared_meanwhile(ctx: ToolContext, name: str, arguments: str) -> str:
        output = await search(ctx, name, arguments)
        assert SECRET in output
        await clear_now(rt, clearing)  # before the turn stores the result
        return output

    monkeypatch.setattr(rt.tools, "call", cleared_meanwhile)
    replies = Replies()
    llm.push(Reply("", tool_calls=[tool_call("r1", "recall", {"query": "提取码"})]), Reply("是 8d3k。"))
    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "silent"
    await clearing[0]

    assert replies.texts == []  # nothing into the cleared chat
    active = await query(rt.store.location, "SELECT role, content FROM messages WHERE archived = 0")
    assert active == []  # R-MEM-2: nothing of before the clear is active
    await fill(rt, GROUP, [user("@小记(10000) 在吗", 20041, "小林")])
    llm.push(Reply("在。"))
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    assert SECRET not in json.dumps(chat_requests(llm)[-1]["messages"], ensure_ascii=False)


async def test_r_mem_2_an_answer_that_waited_behind_a_clear_is_neither_stored_nor_sent(
    make_rt: MakeRuntime, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await asked_with_a_secret(make_rt)
    clearing: list[asyncio.Task[None]] = []
    withdrawn = rt.store.questions_withdrawn

    async def cleared_meanwhile(session_id: str, upto: int | None = None) -> bool:
        answer = await withdrawn(session_id, upto)
        await clear_now(rt, clearing)  # the turn's last read before it stores the answer
        return answer

    monkeypatch.setattr(rt.store, "questions_withdrawn", cleared_meanwhile)
    replies = Replies()
    llm.push(Reply("是 8d3k。"))
    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY, requested=True) == "silent"
    await clearing[0]

    assert replies.texts == []
    assert await query(rt.store.location, "SELECT role, content FROM messages WHERE archived = 0") == []
