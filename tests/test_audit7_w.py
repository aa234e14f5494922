"""Seventh outside audit (w): small library and command edges the last audit left open.

A plugin author on `nonebot_plugin_memsum.api` who calls `run_turn` from two places at
once after one message, or names a tool as a built-in one is named; an owner who set a
long `/人设` and then moved to a model with a smaller window; and the commands that take
no argument, answered with one.

Real paths throughout: the plugin's runtime on its real SQLite file, the scripted
OpenAI-compatible server over real HTTP, nonebug for the commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.config import ModelConfig
from tests.fakes.llm_server import Reply, ScriptedLLM


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """A chat model of the plugin's own runtime on a scripted server, for one test."""
    rt = runtime.get()
    with ScriptedLLM() as server:
        rt.registry.set_models([ModelConfig(**server.model_config("w/model", context_window=16000))])
        try:
            yield server
        finally:
            rt.registry.set_models([])


# ---- api.run_turn twice at once after one message ------------------------------------------------
async def test_two_concurrent_run_turns_after_one_message_call_the_model_once_and_answer_once(
    llm: ScriptedLLM,
) -> None:
    # Before: both calls saw the message as new before either took the turn lock; the second
    # waited for the first, then asked the model again and sent a second answer.
    session = await api.internal_session("w:twice")
    await api.record(session, api.Message(role="user", content="[甲(1)] 明天下雨吗？"))
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    llm.push(Reply("明天多云，不下雨。"))
    llm.default = Reply("又答了一遍")
    with llm.gate() as gate:  # holds the first request, then the queue answers
        first = asyncio.create_task(api.run_turn(session.id, send))
        await gate.reached()
        second = asyncio.create_task(api.run_turn(session.id, send))
        await asyncio.sleep(0.05)  # the second is waiting for the session's turn
        gate.open()
        outcomes = await asyncio.gather(first, second)
    assert outcomes == ["replied", "silent"]
    assert len(llm.requests) == 1
    assert sent == ["明天多云，不下雨。"]
    assert [m.content for m in await api.history(session.id)] == [
        "[甲(1)] 明天下雨吗？",
        "明天多云，不下雨。",
    ]
    # A later message is new again: the check still lets it through.
    await api.record(session, api.Message(role="user", content="[甲(1)] 后天呢？"))
    llm.push(Reply("后天晴。"))
    assert await api.run_turn(session.id, send) == "replied"
    assert sent == ["明天多云，不下雨。", "后天晴。"]
