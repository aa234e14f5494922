"""Audit 4 (g): the library face as another plugin's author uses it, on the plugin's own
running runtime (the real SQLite file) and the scripted OpenAI-compatible server."""

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.errors import NotStarted
from tests.fakes.agent import SUMMARY, tool_call
from tests.fakes.llm_server import Reply, ScriptedLLM


def _is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"].startswith(runtime.get().config.memsum_persona[:20])


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    rt = runtime.get()
    with ScriptedLLM() as server:
        server.on_request(lambda body: None if _is_chat(body) else Reply(SUMMARY))
        rt.registry.set_models([ModelConfig(**server.model_config("g/model", context_window=16000))])
        try:
            yield server
        finally:
            rt.registry.set_models([])


async def _until(check: Any, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


async def test_the_readme_example_runs_as_written(
    llm: ScriptedLLM, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # README 给其他插件用, line for line (fetch_weather_text is the reader's own function).
    # The runtime is every nonebug test's: its contributions are as they were afterwards.
    agent = runtime.get().agent
    monkeypatch.setattr(agent, "_contributions", {k: list(v) for k, v in agent._contributions.items()})

    async def fetch_weather_text() -> str:
        return "今天晴"

    session = await api.internal_session("myplugin:daily-report")
    await api.record(session, api.Message(role="user", content="[系统(0)] 生成今日报告"))

    async def send(text: str) -> None:
        print(text)  # noqa: T201 (the README's own line)

    llm.push(Reply("今日报告：一切正常，网盘提取码 k9x2"))
    outcome = await api.run_turn(session.id, send)
    assert outcome == "replied"
    prompt = await api.build_prompt(session.id)
    assert prompt.messages[-2]["content"] == "今日报告：一切正常，网盘提取码 k9x2"
    recent = await api.history(session.id, limit=20)
    assert len(recent) == 2
    unsubscribe = api.subscribe(api.UsageEvent, lambda e: print(e.usage, e.window))  # noqa: T201
    api.contribute("weather", lambda sid: fetch_weather_text())
    # A turn answers something new (api.run_turn): a second question, then the turn.
    await api.record(session, api.Message(role="user", content="[系统(0)] 天气呢？"))
    llm.push(Reply("好"))
    await api.run_turn(session.id)
    unsubscribe()
    assert any(m["content"] == "今天晴" for m in llm.requests[-1]["messages"] if m["role"] == "system")
    await api.compress(session.id)
    assert (await api.status(session.id)).summary == SUMMARY.split("\n【保留原文】")[0]
    line = await api.compress_at(session.id, "onebot", "group")
    assert line == pytest.approx(0.8)
    await api.clear(session.id, "summary")
    assert (await api.status(session.id)).summary is None
    for hit in await api.search(session.id, "提取码", speaker="小明", limit=5, context=1):
        print(hit.message.ts, hit.message.content, [m.content for m in hit.before])  # noqa: T201
    await api.delete_session(session.id)
    assert await api.history(session.id) == []
    assert await api.search(session.id, "提取码") == []
    out = capsys.readouterr().out
    assert "今日报告：一切正常" in out
    assert " 16000" in out  # the UsageEvent's usage and window


async def test_record_mode_memory_compresses_what_a_plugin_records_at_the_count_line(
    llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # README: MEMSUM_DEFAULT_MODE=record gives a plugin the memory without a second chat bot;
    # 仅记录 is "record and compress, never answer": the count line (R-TRIG) must work for
    # what the plugin records, not only for what the OneBot layer records.
    rt = runtime.get()
    config = rt.config.model_copy(update={"memsum_default_mode": "record"})
    monkeypatch.setattr(rt, "config", config)
    monkeypatch.setattr(rt.settings, "_config", config)  # the layered settings read the default here
    session = await api.internal_session("g:record-mode")
    await rt.settings.set("history_limit", "session", session.id, 6)
    for i in range(8):
        await api.record(session, api.Message(role="user", content=f"[甲(1)] 第{i}条"))

    async def compressed() -> bool:
        return (await api.status(session.id)).summary is not None

    await _until(compressed)
    assert len(await api.history(session.id)) < 8


async def test_r_prog_1_a_compression_emits_start_then_done_exactly_once(llm: ScriptedLLM) -> None:
    session = await api.internal_session("g:progress")
    for i in range(4):
        await api.record(session, api.Message(role="user", content=f"[甲(1)] 消息{i}"))
    seen: list[api.CompressionProgress] = []
    unsubscribe = api.subscribe(api.CompressionProgress, seen.append)
    try:
        await api.compress(session.id)
    finally:
        unsubscribe()
    assert [(e.session_id, e.phase) for e in seen] == [(session.id, "start"), (session.id, "done")]


async def test_r_prog_1_a_failed_compression_emits_start_then_error_with_the_reason(llm: ScriptedLLM) -> None:
    session = await api.internal_session("g:progress-error")
    for i in range(4):
        await api.record(session, api.Message(role="user", content=f"[甲(1)] 消息{i}"))
    llm.reset()
    llm.on_request(lambda body: None if _is_chat(body) else Reply(status=400))
    seen: list[api.CompressionProgress] = []
    unsubscribe = api.subscribe(api.CompressionProgress, seen.append)
    try:
        with pytest.raises(api.CompressionError) as failed:
            await api.compress(session.id)
    finally:
        unsubscribe()
    assert [e.phase for e in seen] == ["start", "error"]
    assert seen[-1].reason == failed.value.reason
    assert len(await api.history(session.id)) == 4  # R-FAIL-3: nothing trimmed


async def test_turn_events_come_once_each_in_order_with_one_turn_id(llm: ScriptedLLM) -> None:
    session = await api.internal_session("g:turn-events")
    await api.record(session, api.Message(role="user", content="[甲(1)] 在吗"))
    seen: list[object] = []
    offs = [api.subscribe(t, seen.append) for t in (api.TurnStarted, api.TurnEnded, api.UsageEvent)]
    llm.push(Reply("在"))
    try:
        assert await api.run_turn(session.id) == "replied"
    finally:
        for off in offs:
            off()
    kinds = [type(e).__name__ for e in seen]
    assert kinds == ["TurnStarted", "UsageEvent", "UsageEvent", "TurnEnded"]
    started, estimate, actual, ended = seen
    assert isinstance(started, api.TurnStarted)
    assert isinstance(ended, api.TurnEnded)
    assert isinstance(estimate, api.UsageEvent)
    assert isinstance(actual, api.UsageEvent)
    assert started.turn_id == ended.turn_id == actual.turn_id
    assert estimate.turn_id is None
    assert {started.session_id, ended.session_id, estimate.session_id} == {session.id}
    assert ended.outcome == "replied"


async def test_a_tool_that_raises_gives_the_model_an_error_and_the_turn_still_replies(
    llm: ScriptedLLM,
) -> None:
    @api.tool("g_broken", "一个总是出错的工具", {"type": "object", "properties": {}})
    async def broken(ctx: Any, args: dict[str, Any]) -> str:
        raise RuntimeError("数据库炸了")

    session = await api.internal_session("g:tool-raises")
    await api.record(session, api.Message(role="user", content="[甲(1)] 查一下"))
    llm.push(
        Reply("", tool_calls=[tool_call("c1", "g_broken", {})], finish_reason="tool_calls"), Reply("查不到")
    )
    replies: list[str] = []

    async def send(text: str) -> None:
        replies.append(text)

    assert await api.run_turn(session.id, send) == "replied"
    assert replies == ["查不到"]
    [result] = [m for m in await api.history(session.id) if m.role == "tool"]
    assert result.tool_call_id == "c1"
    assert result.content  # the model is told the call failed, not handed nothing
    chat = [b for b in llm.requests if _is_chat(b)]
    assert chat[-1]["messages"][-1]["role"] == "tool"


async def test_two_plugins_recording_into_one_session_at_once_lose_nothing() -> None:
    session = await api.internal_session("g:two-writers")

    async def plugin(name: str) -> list[api.Message]:
        return [
            await api.record(session, api.Message(role="user", content=f"[{name}(1)] {i}")) for i in range(40)
        ]

    a, b = await asyncio.gather(plugin("甲"), plugin("乙"))
    stored = await api.history(session.id)
    assert len(stored) == 80
    assert [m.id for m in stored] == sorted(m.id for m in stored)  # type: ignore[type-var]
    assert {m.id for m in stored} == {m.id for m in a + b}
    for mine in (a, b):  # each plugin's own messages keep the order it recorded them in
        ids = [m.id for m in mine]
        assert ids == sorted(ids)  # type: ignore[type-var]


async def test_a_message_of_a_role_the_api_does_not_know_is_refused_and_nothing_is_stored() -> None:
    session = await api.internal_session("g:bad-role")
    await api.record(session, api.Message(role="user", content="before"))
    with pytest.raises(api.MemsumError):
        await api.record(session, api.Message(role="bot", content="?"))  # type: ignore[arg-type]
    await api.record(session, api.Message(role="user", content="after"))
    assert [m.content for m in await api.history(session.id)] == ["before", "after"]


async def test_every_api_function_before_start_raises_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_current", None)
    record = api.SessionRecord(id="g:none", platform=None, kind="internal")
    calls = [
        lambda: api.internal_session("g:none"),
        lambda: api.child_session("g:none", "g:none-child"),
        lambda: api.record(record, api.Message(role="user", content="x")),
        lambda: api.history("g:none"),
        lambda: api.run_turn("g:none"),
        lambda: api.build_prompt("g:none"),
        lambda: api.compress("g:none"),
        lambda: api.compress_at("g:none"),
        lambda: api.clear("g:none"),
        lambda: api.delete_session("g:none"),
        lambda: api.status("g:none"),
        lambda: api.search("g:none", "x"),
    ]
    for call in calls:
        with pytest.raises(NotStarted):
            await call()
    # api.subscribe, tool, contribute and set_todo_provider are kept until the start
    # (tests/test_audit21_lib2.py).


async def test_r_mem_2_delete_session_during_a_turn_waits_and_leaves_nothing_behind(llm: ScriptedLLM) -> None:
    session = await api.internal_session("g:delete-mid-turn")
    await api.record(session, api.Message(role="user", content="[甲(1)] 写首长诗"))
    with llm.gate(Reply("长诗"), holds=_is_chat) as gate:
        turn = asyncio.create_task(api.run_turn(session.id))
        await gate.reached()
        deleting = asyncio.create_task(api.delete_session(session.id))
        await asyncio.sleep(0.2)
        assert not deleting.done()  # it waits for the running turn
        gate.open()
        await asyncio.gather(turn, deleting)
    assert await api.history(session.id) == []
    assert await runtime.get().store.get_archived(session.id) == []
    assert await runtime.get().store.get_session(session.id) is None


async def test_a_compression_during_a_turn_loses_neither_the_question_nor_the_answer(
    llm: ScriptedLLM,
) -> None:
    session = await api.internal_session("g:compress-mid-turn")
    for i in range(4):
        await api.record(session, api.Message(role="user", content=f"[甲(1)] 旧消息{i}"))
    with llm.gate(Reply("答案"), holds=_is_chat) as gate:
        turn = asyncio.create_task(api.run_turn(session.id))
        await gate.reached()
        compressing = asyncio.create_task(api.compress(session.id))
        await asyncio.sleep(0.3)
        gate.open()
        outcome, _ = await asyncio.gather(turn, compressing)
    assert outcome == "replied"
    status = await api.status(session.id)
    assert status.summary == SUMMARY.split("\n【保留原文】")[0]
    active = [m.content for m in await api.history(session.id) if m.is_conversation]
    archived = [m.content for m in await runtime.get().store.get_archived(session.id)]
    assert "答案" in active + archived
    assert {f"[甲(1)] 旧消息{i}" for i in range(4)} <= set(active + archived)
