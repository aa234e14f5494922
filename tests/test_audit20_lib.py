"""Audit 20: the product as a library, used the way the README's 「给其他插件用」, the `api`
docstrings and DESIGN.md tell another NoneBot LLM plugin to use it: its own LLM call that only
wants the memory, its own tools and system parts, child sessions, a summary model of its own,
wrong arguments, many sessions at once. In-process on a private runtime (SQLite file in
tmp_path, the scripted OpenAI-compatible server as chat and summary model) that `api` answers
for."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from tests.fakes.e2e import query
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.service import CHAT_MODEL, SUMMARY_MODEL, Env, Make, Model, is_summary, settle

PLUGIN_PERSONA = "你是日报插件的写作助手。"


@pytest.fixture
async def lib(make: Make, monkeypatch: pytest.MonkeyPatch) -> Env:
    """A private runtime the `api` answers for (its tools, parts and listeners die with it)."""
    env = await make(memsum_persona=PLUGIN_PERSONA)
    monkeypatch.setattr(runtime, "_current", env.rt)
    return env


def said(n: int) -> api.Message:
    return api.Message(role="user", content=f"[甲(1)] 第{n}句：今天的日报写什么" + "内容" * 20, name="1")


# ---- a plugin with its own LLM call, using only the memory ------------------------------
async def test_own_llm_call_records_reads_prompt_compresses_and_sees_progress(lib: Env) -> None:
    session = await api.internal_session("a20lib:own")
    for n in range(6):
        await api.record(session, said(n))
        await api.record(session, api.Message(role="assistant", content=f"第{n}条回答"))
    progress: list[api.CompressionProgress] = []
    stop = api.subscribe(api.CompressionProgress, progress.append)
    result = await api.compress(session.id)
    stop()
    assert result.outcome == "done"
    assert [(p.session_id, p.phase) for p in progress] == [(session.id, "start"), (session.id, "done")]
    # The summary went to the summary model, not to the chat model.
    [summary_request] = lib.model.summary_requests()
    assert summary_request["model"] == lib.rt.registry.resolve("summary").model  # type: ignore[union-attr]
    assert lib.rt.registry.resolve("summary").id == SUMMARY_MODEL  # type: ignore[union-attr]
    # The plugin's own request: persona, the summary (last system part), then the history.
    await api.record(session, api.Message(role="user", content="[甲(1)] 接着写", name="1"))
    prompt = await api.build_prompt(session.id)
    systems = [m["content"] for m in prompt.messages if m["role"] == "system"]
    assert systems[0] == PLUGIN_PERSONA
    assert "甲(1) 约大家周末爬山" in systems[-1]
    assert prompt.messages[-1] == {"role": "user", "content": "[甲(1)] 接着写"}
    assert [m.content for m in await api.history(session.id) if m.is_conversation][-1] == "[甲(1)] 接着写"
    assert lib.model.chat_requests() == []  # reading the prompt calls no model


async def test_compression_error_event_carries_the_reason_the_exception_carries(lib: Env) -> None:
    session = await api.internal_session("a20lib:fails")
    for n in range(4):
        await api.record(session, said(n))
    lib.model.summary.append(Reply(status=500, error="upstream down"))
    lib.model.summary_default = Reply(status=500, error="upstream down")
    progress: list[api.CompressionProgress] = []
    stop = api.subscribe(api.CompressionProgress, progress.append)
    with pytest.raises(api.CompressionError) as failed:
        await api.compress(session.id)
    stop()
    assert failed.value.reason
    assert [(p.phase, p.reason) for p in progress] == [("start", None), ("error", failed.value.reason)]
    assert len([m for m in await api.history(session.id) if m.is_conversation]) == 4  # nothing lost


async def test_record_mode_session_compresses_by_itself_on_record(lib: Env) -> None:
    # README: 只想要记忆、不想多一个聊天机器人：MEMSUM_DEFAULT_MODE=record (here the session's own
    # mode, as the owner sets it): recording alone reaches the count line and compresses.
    session = await api.internal_session("a20lib:record-mode")
    await lib.rt.settings.set("mode", "session", session.id, "record")
    await lib.rt.settings.set("history_limit", "session", session.id, 6)
    done = asyncio.Event()
    stop = api.subscribe(api.CompressionProgress, lambda p: done.set() if p.phase == "done" else None)
    for n in range(8):
        await api.record(session, said(n))
    await asyncio.wait_for(done.wait(), 30)
    stop()
    await settle(lib.rt)
    assert (await api.status(session.id)).summary is not None
    assert lib.model.chat_requests() == []


# ---- a plugin that lets the built-in agent answer -----------------------------------------
async def test_run_turn_events_in_order_with_one_turn_id(lib: Env) -> None:
    session = await api.internal_session("a20lib:turn")
    await api.record(session, api.Message(role="user", content="[甲(1)] 你好", name="1"))
    seen: list[Any] = []
    stops = [api.subscribe(t, seen.append) for t in (api.TurnStarted, api.TurnEnded, api.UsageEvent)]
    replies: list[str] = []

    async def send(text: str) -> None:
        replies.append(text)

    assert await api.run_turn(session.id, send) == "replied"
    for stop in stops:
        stop()
    assert replies == ["好的"]
    started, before, after, ended = seen
    assert isinstance(started, api.TurnStarted)
    assert isinstance(ended, api.TurnEnded)
    assert isinstance(before, api.UsageEvent)
    assert before.turn_id is None
    assert isinstance(after, api.UsageEvent)
    assert after.turn_id == started.turn_id == ended.turn_id
    assert after.model_id == CHAT_MODEL
    assert ended.outcome == "replied"
    # Nothing new: no model call, no events.
    assert await api.run_turn(session.id, send) == "silent"
    assert len(lib.model.chat_requests()) == 1


async def test_own_tool_is_offered_called_with_its_session_and_its_result_stored(lib: Env) -> None:
    session = await api.internal_session("a20lib:tool")
    calls: list[tuple[str, dict[str, Any]]] = []

    @api.tool("daily_report", "读取今日报告", {"type": "object", "properties": {"day": {"type": "string"}}})
    async def report(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        calls.append((ctx.session_id, args))
        return "报告：一切正常"

    call = {"id": "c1", "name": "daily_report", "arguments": '{"day": "today"}'}
    lib.model.chat.extend([Reply("", tool_calls=[call], finish_reason="tool_calls"), Reply("一切正常")])
    await api.record(session, api.Message(role="user", content="[甲(1)] 今天怎么样", name="1"))
    assert await api.run_turn(session.id) == "replied"
    assert calls == [(session.id, {"day": "today"})]
    offered = [t["function"]["name"] for t in lib.model.chat_requests()[0]["tools"]]
    assert "daily_report" in offered
    stored = await api.history(session.id)
    assert [m.content for m in stored if m.role == "tool"] == ["报告：一切正常"]
    with pytest.raises(api.ToolNameTaken, match="daily_report"):
        api.tool("daily_report", "别的", {"type": "object", "properties": {}})(report)


async def test_contribution_lands_before_the_summary_for_its_session_only(lib: Env) -> None:
    a = await api.internal_session("a20lib:contrib-a")
    b = await api.internal_session("a20lib:contrib-b")
    api.contribute("weather", lambda sid: "天气：晴" if sid == a.id else None)
    for s in (a, b):
        await api.record(s, said(1))
    await api.compress(a.id)
    systems_a = [m["content"] for m in (await api.build_prompt(a.id)).messages if m["role"] == "system"]
    systems_b = [m["content"] for m in (await api.build_prompt(b.id)).messages if m["role"] == "system"]
    assert systems_a[1] == "天气：晴"
    assert "摘要" in systems_a[-1]
    assert "天气：晴" not in systems_b


# ---- child sessions --------------------------------------------------------------------------
async def test_child_session_has_its_own_history_and_turn(lib: Env) -> None:
    parent = await api.internal_session("a20lib:parent")
    await api.record(parent, api.Message(role="user", content="[甲(1)] 父会话的话", name="1"))
    child = await api.child_session(parent.id, "a20lib:parent/child")
    assert child.parent == parent.id
    assert child.kind == "child"
    await api.record(child, api.Message(role="user", content="[甲(1)] 子任务", name="1"))
    assert await api.run_turn(child.id) == "replied"
    [request] = lib.model.chat_requests()
    assert [m["content"] for m in request["messages"] if m["role"] == "user"] == ["[甲(1)] 子任务"]
    assert [m.content for m in await api.history(parent.id)] == ["[甲(1)] 父会话的话"]
    # A child record of the plugin's own making (parent set) is created on first record.
    own = api.SessionRecord(id="a20lib:parent/own", platform=None, kind="child", parent=parent.id)
    await api.record(own, api.Message(role="user", content="[甲(1)] 自建子会话", name="1"))
    assert await api.child_session(parent.id, own.id) == await lib.rt.store.get_session(own.id)


# ---- many sessions at once ----------------------------------------------------------------------
async def test_many_sessions_at_once_each_gets_its_own_answer(lib: Env) -> None:
    def echo(body: dict[str, Any]) -> Reply:
        return Reply("回：" + body["messages"][-1]["content"])

    lib.model.chat_default = echo
    sessions = [await api.internal_session(f"a20lib:many:{i}") for i in range(24)]

    async def one(i: int) -> tuple[str, list[str]]:
        s = sessions[i]
        for k in range(3):
            await api.record(s, api.Message(role="user", content=f"[甲(1)] 会话{i}第{k}句", name="1"))
        replies: list[str] = []

        async def send(text: str) -> None:
            replies.append(text)

        return await api.run_turn(s.id, send), replies

    results = await asyncio.gather(*(one(i) for i in range(24)))
    for i, (outcome, replies) in enumerate(results):
        assert outcome == "replied"
        assert replies == [f"回：[甲(1)] 会话{i}第2句"]
        assert [m.content for m in await api.history(sessions[i].id)] == [
            f"[甲(1)] 会话{i}第0句",
            f"[甲(1)] 会话{i}第1句",
            f"[甲(1)] 会话{i}第2句",
            f"回：[甲(1)] 会话{i}第2句",
        ]


async def test_many_writers_into_one_session_lose_nothing(lib: Env) -> None:
    session = await api.internal_session("a20lib:writers")

    async def writer(w: int) -> None:
        for k in range(10):
            await api.record(session, api.Message(role="user", content=f"[甲(1)] w{w}-{k}", name="1"))

    await asyncio.gather(*(writer(w) for w in range(8)))
    contents = [m.content for m in await api.history(session.id)]
    assert sorted(contents) == sorted(f"[甲(1)] w{w}-{k}" for w in range(8) for k in range(10))
    for w in range(8):  # each writer's own order kept
        mine = [c for c in contents if c.startswith(f"[甲(1)] w{w}-")]
        assert mine == [f"[甲(1)] w{w}-{k}" for k in range(10)]
    assert not any(is_summary(b) for b in lib.model.llm.requests)


# ---- wrong arguments: a clear error at the call, nothing registered or lost -------------------
async def test_subscribe_to_something_that_is_no_event_is_refused(lib: Env) -> None:
    with pytest.raises(TypeError, match="UsageEvent"):
        api.subscribe("UsageEvent", print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CompressionProgress"):
        api.subscribe(api.Message, print)


async def test_contribute_something_that_is_no_function_is_refused(lib: Env) -> None:
    session = await api.internal_session("a20lib:bad-contrib")
    await api.record(session, said(1))
    with pytest.raises(TypeError, match="weather"):
        api.contribute("weather", "天气：晴")  # type: ignore[arg-type]
    prompt = await api.build_prompt(session.id)
    assert [m["content"] for m in prompt.messages if m["role"] == "system"] == [PLUGIN_PERSONA]


@pytest.mark.parametrize(
    "parameters",
    [
        "{}",  # JSON text, not a schema object
        {"type": "array", "items": {"type": "string"}},  # OpenAI: the parameters must be an object
        {"type": "object", "properties": {"when": {"type": "string", "default": {1, 2}}}},  # no JSON
    ],
)
async def test_tool_whose_parameters_no_model_api_takes_is_refused_at_once(lib: Env, parameters: Any) -> None:
    # OpenAI answers such a request with a 400: "Invalid schema for function 'sendEmailTool': schema
    # must be a JSON Schema of 'type: \"object\"', got 'type: \"string\"'." (quoted in
    # https://github.com/alibaba/spring-ai-alibaba/issues/4576); what JSON cannot carry never goes out.
    session = await api.internal_session("a20lib:bad-tool")
    refused: ValueError | None = None
    try:
        api.tool("bad_schema", "坏的参数", parameters)(lambda ctx, args: "x")
    except ValueError as err:
        refused = err
    # Every other turn goes on as before: the tool was never offered.
    await api.record(session, said(1))
    assert await api.run_turn(session.id) == "replied"
    assert "bad_schema" not in [t["function"]["name"] for t in lib.model.chat_requests()[-1]["tools"]]
    assert isinstance(refused, api.BadToolSchema)
    assert "bad_schema" in str(refused)


async def test_record_given_a_session_id_says_to_pass_the_session(lib: Env) -> None:
    session = await api.internal_session("a20lib:by-id")
    with pytest.raises(TypeError, match="internal_session"):
        await api.record(session.id, said(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"api\.Message"):
        await api.record(session, {"role": "user", "content": "x"})  # type: ignore[arg-type]
    assert await api.history(session.id) == []


async def test_unknown_session_and_unknown_clear_kind(lib: Env) -> None:
    with pytest.raises(api.SessionNotFound, match="a20lib:never"):
        await api.run_turn("a20lib:never")
    with pytest.raises(LookupError):
        await api.build_prompt("a20lib:never")
    with pytest.raises(api.SessionNotFound):
        await api.child_session("a20lib:never", "a20lib:never/child")
    assert await lib.rt.store.get_session("a20lib:never/child") is None
    with pytest.raises(ValueError, match="summary"):
        await api.clear("a20lib:never", "summry")  # type: ignore[arg-type]
    assert (await api.compress("a20lib:never")).outcome == "nothing"


# ---- as NoneBot loads it: other plugins that `require` it, in a NoneBot process of their own ----
REPO = Path(__file__).resolve().parents[1]
HOST = """
import asyncio, json, sys
repo, plugins_dir, setup = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[:0] = [repo, plugins_dir]
import nonebot
from nonebot.adapters.onebot.v11 import Adapter
nonebot.init(**setup["config"])
nonebot.get_driver().register_adapter(Adapter)
loaded = {name: nonebot.load_plugin(name) is not None for name in setup["plugins"]}
import scenario


async def main():
    # NoneBot's own start-up and shutdown hooks, through the ASGI lifespan as nonebug runs them.
    from async_asgi_testclient import TestClient

    out = {"loaded": loaded, "before": await scenario.before()}
    async with TestClient(nonebot.get_driver().asgi):
        out["during"] = await scenario.during()
    out["after"] = await scenario.after()
    print("RESULT " + json.dumps(out, ensure_ascii=False))


asyncio.run(main())
"""


def readme_example() -> str:
    """The code of README 「给其他插件用」, as written."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## 给其他插件用", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


async def host(tmp_path: Path, llm: ScriptedLLM, files: dict[str, str], **config: Any) -> dict[str, Any]:
    """Run NoneBot in a process of its own with the plugins in `files` (module path → source;
    `scenario.py` holds `before`, `during` and `after`, the steps around start-up and shutdown)
    and the plugin's models on `llm`; what the steps returned."""
    plugins = tmp_path / "plugins"
    for path, source in files.items():
        (plugins / path).parent.mkdir(parents=True, exist_ok=True)
        (plugins / path).write_text(source, encoding="utf-8")
    names = [p.split("/")[0].removesuffix(".py") for p in files if p != "scenario.py"]
    data = tmp_path / "data"
    setup = {
        "plugins": names,
        "config": {
            "driver": "~fastapi",
            "superusers": ["10001"],
            "memsum_db_path": str(data / "memsum.db"),
            "localstore_data_dir": str(data / "ls-data"),
            "localstore_cache_dir": str(data / "ls-cache"),
            "localstore_config_dir": str(data / "ls-config"),
            "memsum_models": [
                llm.model_config(CHAT_MODEL, priority=1),
                llm.model_config(SUMMARY_MODEL),
            ],
            "memsum_chat_model": CHAT_MODEL,
            "memsum_summary_model": SUMMARY_MODEL,
            "memsum_persona": PLUGIN_PERSONA,
            **config,
        },
    }
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOST,
        str(REPO),
        str(plugins),
        json.dumps(setup),
        cwd=tmp_path,
        env={**env, "HOME": str(tmp_path)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    log = out.decode("utf-8", "replace")
    results = [line for line in log.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0, log[-4000:]
    assert results, log[-4000:]
    return {**json.loads(results[-1].removeprefix("RESULT ")), "log": log}


@pytest.fixture
def models() -> Iterator[Model]:
    """The chat and the summary model, answered by kind (tests/fakes/service.py)."""
    with ScriptedLLM() as llm:
        yield Model(llm)


NO_STEPS = """
async def before():
    return None


async def during():
    return None


async def after():
    return None
"""


async def test_readme_example_runs_as_written_once_per_event(tmp_path: Path, models: Model) -> None:
    # The README's code block, word for word, with the one name it leaves to the reader.
    plugin = readme_example() + '\n\ndef fetch_weather_text() -> str:\n    return "天气：晴"\n'
    scenario = """
import contextlib, io
from nonebot_plugin_memsum import api


async def before():
    return None


async def during():
    import readme_plugin

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for _ in range(3):  # as a handler runs: once per event
            await readme_plugin.on_something("onebot:group:1")
    return {"printed": printed.getvalue().splitlines()}


async def after():
    return None
"""
    out = await host(tmp_path, models.llm, {"readme_plugin/__init__.py": plugin, "scenario.py": scenario})
    assert out["loaded"] == {"readme_plugin": True}
    printed = out["during"]["printed"]
    # Each turn: a usage line before the model call and one after it (not one more per call
    # before it, as when the example subscribed inside the handler), then the answer.
    assert printed[2::3] == ["好的"] * 3
    assert printed[1::3] == ["100 32000"] * 3  # the usage the model reported, the window
    assert all(re.fullmatch(r"\d+ 32000", p) for p in printed[0::3]), printed  # the estimate
    # The weather once in every prompt (the example contributed it on every call before).
    for request in models.chat_requests():
        systems = [m["content"] for m in request["messages"] if m["role"] == "system"]
        assert systems == [PLUGIN_PERSONA, "天气：晴"]


PLUGIN_A = """
from nonebot import get_driver, require

require("nonebot_plugin_memsum")
from nonebot_plugin_memsum import api

SESSION = "plugin-a:notes"
# At import, before NoneBot started (as matchers are registered): kept, applied at start.
api.contribute("a-notes", lambda sid: "A 的备注" if sid == SESSION else None)


@get_driver().on_startup
async def _register() -> None:
    @api.tool("a_lookup", "A 插件的查询", {"type": "object", "properties": {}})
    async def lookup(ctx: api.ToolContext, args: dict) -> str:
        return "A 的结果"


@get_driver().on_shutdown
async def _bye() -> None:  # NoneBot runs shutdown hooks in reverse: memsum is still up
    session = await api.internal_session(SESSION)
    await api.record(session, api.Message(role="user", content="[系统(0)] A 关闭"))
"""
PLUGIN_B = """
from nonebot import get_driver, require

require("nonebot_plugin_memsum")
from nonebot_plugin_memsum import api

SESSION = "plugin-b:chat"
ENDED: list = []
TAKEN: list = []


@get_driver().on_startup
async def _register() -> None:
    api.subscribe(api.TurnEnded, lambda e: ENDED.append([e.session_id, e.outcome]))
    try:
        api.tool("a_lookup", "B 也想要这个名字", {"type": "object", "properties": {}})(lambda c, a: "B")
    except api.ToolNameTaken as err:
        TAKEN.append(str(err))
"""
TWO_PLUGINS = """
import asyncio
from nonebot_plugin_memsum import api
import plugin_a, plugin_b


async def before():
    try:
        await api.internal_session("too-early")
    except RuntimeError as err:
        return {"call": f"{type(err).__name__}: {err}"}


async def during():
    async def plugin(session_id, n):
        session = await api.internal_session(session_id)
        for k in range(n):
            await api.record(session, api.Message(role="user", content=f"[甲(1)] {session_id} 第{k}句"))
        return await api.run_turn(session.id)

    outcomes = await asyncio.gather(plugin(plugin_a.SESSION, 5), plugin(plugin_b.SESSION, 5))
    compressed = await api.compress(plugin_b.SESSION)
    return {
        "outcomes": outcomes,
        "ended": sorted(plugin_b.ENDED),
        "taken": plugin_b.TAKEN,
        "compressed": compressed.outcome,
    }


async def after():
    try:
        await api.history(plugin_a.SESSION)
    except RuntimeError as err:
        return f"{type(err).__name__}: {err}"
"""


async def test_two_plugins_require_it_in_one_process_before_during_and_after_start(
    tmp_path: Path, models: Model
) -> None:
    files = {"plugin_a/__init__.py": PLUGIN_A, "plugin_b/__init__.py": PLUGIN_B, "scenario.py": TWO_PLUGINS}
    out = await host(tmp_path, models.llm, files)
    assert out["loaded"] == {"plugin_a": True, "plugin_b": True}
    not_started = "NotStarted: nonebot-plugin-memsum is not started yet (NoneBot on_startup has not run)"
    assert out["before"] == {"call": not_started}
    assert out["after"] == not_started
    during = out["during"]
    assert during["outcomes"] == ["replied", "replied"]
    assert during["ended"] == [["plugin-a:notes", "replied"], ["plugin-b:chat", "replied"]]
    [taken] = during["taken"]
    assert "a_lookup" in taken
    assert "another plugin" in taken
    assert during["compressed"] == "done"
    by_session = {r["messages"][-1]["content"].split()[1]: r for r in models.chat_requests()}
    for session_id, request in by_session.items():
        systems = [m["content"] for m in request["messages"] if m["role"] == "system"]
        assert ("A 的备注" in systems) == (session_id == "plugin-a:notes")
        assert "a_lookup" in [t["function"]["name"] for t in request["tools"]]
    # The summary went to the summary model; the chat to the chat model.
    [summary] = models.summary_requests()
    assert summary["model"] != by_session["plugin-b:chat"]["model"]
    # Everything is in the SQLite file, with what plugin A recorded in its own shutdown hook.
    rows = await query(
        tmp_path / "data" / "memsum.db", "SELECT content FROM messages WHERE session_id = ?", "plugin-a:notes"
    )
    assert [r[0] for r in rows] == [
        *(f"[甲(1)] plugin-a:notes 第{k}句" for k in range(5)),
        "好的",
        "[系统(0)] A 关闭",
    ]


MEMORY_ONLY = """
import asyncio
from nonebot_plugin_memsum import api




async def before():
    return None


async def after():
    return None


async def during():
    # A plugin with its own LLM call: it records both sides and reads the prompt for its request.
    done = asyncio.Event()
    api.subscribe(api.CompressionProgress, lambda p: done.set() if p.phase == "done" else None)
    session = await api.internal_session("own-llm:1")
    for k in range(4):
        await api.record(session, api.Message(role="user", content=f"[甲(1)] 问题{k}", name="1"))
        await api.record(session, api.Message(role="assistant", content=f"回答{k}"))
    await asyncio.wait_for(done.wait(), 30)
    await api.record(session, api.Message(role="user", content="[甲(1)] 新问题", name="1"))
    prompt = await api.build_prompt(session.id)
    status = await api.status(session.id)
    return {
        "systems": [m["content"] for m in prompt.messages if m["role"] == "system"],
        "last": prompt.messages[-1],
        "summary": status.summary,
        "turn": await api.run_turn(session.id),
    }
"""


async def test_default_mode_record_gives_a_plugin_the_memory_and_it_compresses(
    tmp_path: Path, models: Model
) -> None:
    # README: 只想要记忆、不想多一个聊天机器人：MEMSUM_DEFAULT_MODE=record.
    out = await host(
        tmp_path,
        models.llm,
        {
            "memory_user.py": 'from nonebot import require\n\nrequire("nonebot_plugin_memsum")\n',
            "scenario.py": MEMORY_ONLY,
        },
        memsum_default_mode="record",
        memsum_history_limit=6,
    )
    during = out["during"]
    assert during["summary"] is not None
    assert "甲(1) 约大家周末爬山" in during["systems"][-1]  # the summary, last before the history
    assert during["last"] == {"role": "user", "content": "[甲(1)] 新问题"}
    assert during["turn"] == "replied"  # a plugin that runs a turn itself decides to answer
    assert len(models.summary_requests()) == 1


async def test_run_turn_with_a_plain_reply_function_delivers_once_and_logs_no_failure(lib: Env) -> None:
    # Tools and contributions may be plain functions (README); a reply function as well:
    # `print` or a list's `append` is what a plugin passes to see the answer.
    session = await api.internal_session("a20lib:plain-reply")
    await api.record(session, said(1))
    replies: list[str] = []
    assert await api.run_turn(session.id, replies.append) == "replied"
    assert replies == ["好的"]
    assert not [w for w in lib.warnings if "could not send" in w], lib.warnings
    assert [m.content for m in await api.history(session.id)][-1] == "好的"


def test_every_type_the_api_functions_take_or_give_is_exported() -> None:
    # A typed plugin writes `prompt: api.Prompt`; a name missing from `__all__` is private to a
    # type checker (pyright's reportPrivateImportUsage on a py.typed package).
    found: set[type] = set()

    def walk(hint: Any) -> None:
        for arg in typing.get_args(hint):
            walk(arg)
        origin = typing.get_origin(hint) or hint
        if isinstance(origin, type) and origin.__module__.startswith("nonebot_plugin_memsum"):
            found.add(origin)

    for name in api.__all__:
        fn = getattr(api, name)
        if inspect.isfunction(fn):
            for hint in typing.get_type_hints(fn, dict(vars(api))).values():
                walk(hint)
    assert sorted(t.__name__ for t in found if t.__name__ not in api.__all__) == []


async def test_a_failed_turn_ends_with_error_and_a_failing_listener_loses_nothing(lib: Env) -> None:
    session = await api.internal_session("a20lib:turn-fails")
    await api.record(session, said(1))
    ended: list[api.TurnEnded] = []

    def broken(event: api.UsageEvent) -> None:
        raise RuntimeError("a listener's own bug")

    stops = [api.subscribe(api.UsageEvent, broken), api.subscribe(api.TurnEnded, ended.append)]
    answers = lib.model.chat_default
    lib.model.chat_default = Reply(status=500, error="upstream down")  # retries too
    replies: list[str] = []
    assert await api.run_turn(session.id, replies.append) == "error"
    lib.model.chat_default = answers
    assert [(e.session_id, e.outcome) for e in ended] == [(session.id, "error")]
    assert replies == [lib.rt.config.memsum_error_reply]  # MEMSUM_ERROR_REPLY, as in a chat
    # The error reply answered it, as in a chat; asked again, the next turn answers, despite
    # the broken listener.
    await api.record(session, said(2))
    assert await api.run_turn(session.id, replies.append) == "replied"
    for stop in stops:
        stop()
    assert replies[-1] == "好的"
    conversation = [m.content for m in await api.history(session.id) if m.is_conversation]
    assert conversation == [said(1).content, said(2).content, "好的"]


async def test_child_session_under_another_parent_is_refused_not_shared(lib: Env) -> None:
    # Two groups' tasks under one child id would write into one history: the second call
    # got the first parent's child back, silently.
    a = await api.internal_session("a20lib:group-a")
    b = await api.internal_session("a20lib:group-b")
    child = await api.child_session(a.id, "a20lib:task")
    with pytest.raises(ValueError, match="a20lib:group-a"):
        await api.child_session(b.id, "a20lib:task")
    with pytest.raises(ValueError, match="a20lib:group-a"):
        await api.child_session(b.id, a.id)  # not a child at all
    assert await api.child_session(a.id, "a20lib:task") == child


async def test_a_tool_runs_a_child_sessions_turn_but_not_its_own(lib: Env) -> None:
    # A sub-agent: the tool hands the task to a child session and returns its answer; the same
    # session's own turn from inside its tool is refused (it would wait for itself).
    parent = await api.internal_session("a20lib:agent")
    inside: list[str] = []

    @api.tool("delegate", "交给子会话", {"type": "object", "properties": {"task": {"type": "string"}}})
    async def delegate(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        try:
            await api.run_turn(ctx.session_id)
        except api.TurnInProgress as err:
            inside.append(str(err))
        child = await api.child_session(ctx.session_id, f"{ctx.session_id}/sub")
        await api.record(child, api.Message(role="user", content=f"[系统(0)] {args['task']}"))
        answers: list[str] = []
        await api.run_turn(child.id, answers.append)
        return answers[0]

    call = {"id": "d1", "name": "delegate", "arguments": '{"task": "算 1+1"}'}
    lib.model.chat.extend(
        [Reply("", tool_calls=[call], finish_reason="tool_calls"), Reply("2"), Reply("子会话说是 2")]
    )
    await api.record(parent, api.Message(role="user", content="[甲(1)] 1+1 等于几", name="1"))
    replies: list[str] = []
    assert await api.run_turn(parent.id, replies.append) == "replied"
    assert replies == ["子会话说是 2"]
    assert len(inside) == 1
    assert "a20lib:agent" in inside[0]
    assert [m.content for m in await api.history(parent.id) if m.role == "tool"] == ["2"]
    assert [m.content for m in await api.history("a20lib:agent/sub")] == ["[系统(0)] 算 1+1", "2"]
