"""Audit 21 (lib2): another plugin registers its tools, listeners, system parts and todo list
at its import, where NoneBot plugins register their matchers (and nonebot_plugin_apscheduler's
`scheduler.scheduled_job`). Before, `api.tool`, `api.subscribe`, `api.contribute` and
`api.set_todo_provider` raised NotStarted there: NoneBot logged the import as failed and ran
without that plugin. Now they are kept and applied at every start, their errors raised at the
call as after start.

In-process with `runtime.start` on a real SQLite file and the scripted model server, and bot.py
as a subprocess loading a plugin that registers at its import.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.config import Config
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import connected, private_sid, wait_log
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS

PERSONA = "你是测试助手 a21lib2。"
QUESTION = api.Message(role="user", content="[甲(1)] 明天天气怎么样", name="1")
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def before_start(monkeypatch: pytest.MonkeyPatch) -> Iterator[runtime.Pending]:
    """No runtime yet (the plugin's import), and nothing kept from other tests."""
    kept = runtime.Pending()
    monkeypatch.setattr(runtime, "_current", None)
    monkeypatch.setattr(runtime, "pending", kept)
    handler = signal.getsignal(signal.SIGTERM)  # runtime.start may defer SIGTERM
    yield kept
    signal.signal(signal.SIGTERM, handler)


Start = Callable[[], Awaitable[runtime.Runtime]]


@pytest.fixture
async def start(before_start: runtime.Pending, tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[Start]:
    """NoneBot's start-up of the plugin (`runtime.start`) on one SQLite file; stopped after."""
    config = Config(memsum_models=[llm.model_config("test/model")], memsum_persona=PERSONA)  # type: ignore[list-item]

    async def started() -> runtime.Runtime:
        await runtime.stop()
        return await runtime.start(config, tmp_path / "memsum.db", ["小记"], {"10001"})

    llm.reset()
    yield started
    await runtime.stop()
    llm.reset()


def ask_weather(llm: ScriptedLLM, n: int) -> None:
    """The model calls the tool, then answers."""
    call = {"id": f"c{n}", "name": "a21_weather", "arguments": '{"city": "杭州"}'}
    llm.push(Reply("", tool_calls=[call], finish_reason="tool_calls"), Reply(f"杭州明天晴 {n}"))


def offered(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def systems(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "system"]


async def test_registrations_before_start_raise_their_errors_at_the_call(
    before_start: runtime.Pending,
) -> None:
    def weather(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        return "晴"

    with pytest.raises(api.BadToolName):
        api.tool("天气", "查天气", WEATHER)
    with pytest.raises(api.BadToolSchema):
        api.tool("a21_weather", "查天气", {"type": "array"})
    with pytest.raises(api.ToolNameTaken, match="built in"):
        api.tool("recall", "查天气", WEATHER)(weather)
    assert api.tool("a21_weather", "查天气", WEATHER)(weather) is weather
    with pytest.raises(api.ToolNameTaken, match="another plugin"):
        api.tool("a21_weather", "别的", WEATHER)(weather)
    api.tool("a21_weather", "查天气（新）", WEATHER, replace=True)(weather)
    # With no todo list the built-in todo_write is not offered: its name is free, as after start.
    api.set_todo_provider(None)
    api.tool("todo_write", "别的待办", {"type": "object"})(weather)
    with pytest.raises(TypeError):
        api.contribute("weather", "晴")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        api.subscribe(str, print)
    # Kept: the two tools, the replacement and the todo list; nothing that raised.
    assert len(before_start.steps) == 4


async def test_registrations_before_start_apply_at_every_start(start: Start, llm: ScriptedLLM) -> None:
    called: list[tuple[str, dict[str, Any]]] = []
    heard: list[api.TurnEnded] = []
    unheard: list[api.TurnEnded] = []
    written: list[list[api.TodoItem]] = []

    @api.tool("a21_weather", "查询城市天气", WEATHER)
    async def weather(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        called.append((ctx.session_id, args))
        return f"{args['city']}：晴"

    class Todos:
        async def items(self, session_id: str) -> list[api.TodoItem]:
            return [api.TodoItem("带伞", "pending")]

        async def replace(self, session_id: str, items: list[api.TodoItem]) -> None:
            written.append(items)

    api.contribute("weather", lambda sid: "插件提示：出门看天气")
    stop_hearing = api.subscribe(api.TurnEnded, heard.append)
    api.subscribe(api.TurnEnded, unheard.append)()  # unsubscribed before start: never applied
    api.set_todo_provider(Todos())

    await start()
    session = await api.internal_session("a21lib2:weather")
    await api.record(session, QUESTION)
    ask_weather(llm, 1)
    assert await api.run_turn(session.id) == "replied"
    first, second = llm.requests
    assert offered(first).count("a21_weather") == 1
    assert "todo_write" in offered(first)
    assert systems(first["messages"])[1] == "插件提示：出门看天气"
    assert called == [(session.id, {"city": "杭州"})]
    assert [m["content"] for m in second["messages"] if m["role"] == "tool"] == ["杭州：晴"]
    assert [(e.session_id, e.outcome) for e in heard] == [(session.id, "replied")]
    assert unheard == []
    assert await api.todos(session.id) == [api.TodoItem("带伞", "pending")]

    # After start a call applies to this runtime only, as before.
    api.contribute("late", lambda sid: "只在这次启动")
    assert "只在这次启动" in systems((await api.build_prompt(session.id)).messages)

    # A second start in the process (tests, NoneBot restarted in-process) gets them once more.
    llm.reset()
    await start()
    await api.record(session, QUESTION)
    ask_weather(llm, 2)
    assert await api.run_turn(session.id) == "replied"
    first = llm.requests[0]
    assert offered(first).count("a21_weather") == 1
    assert systems(first["messages"]).count("插件提示：出门看天气") == 1
    assert "只在这次启动" not in systems(first["messages"])
    assert len(called) == 2
    assert len(heard) == 2  # once per turn: one listener, not one per start

    # The unsubscribe of a registration kept before start works after it, and for later starts.
    stop_hearing()
    stop_hearing()  # again: nothing
    await api.record(session, QUESTION)
    assert await api.run_turn(session.id) == "replied"
    await start()
    await api.record(session, QUESTION)
    assert await api.run_turn(session.id) == "replied"
    assert len(heard) == 2


# ---- a real NoneBot start: bot.py loading a plugin that registers at its import ------------
PYPROJECT = """[tool.nonebot]
plugin_dirs = ["plugins"]

[tool.nonebot.plugins]
nonebot-plugin-memsum = ["nonebot_plugin_memsum"]
"""
# README 「给其他插件用」, at module level as the example now has it.
WEATHER_PLUGIN = """
from nonebot import require
from nonebot.log import logger

require("nonebot_plugin_memsum")
from nonebot_plugin_memsum import api


@api.tool("a21_weather", "查询城市天气", {"type": "object", "properties": {"city": {"type": "string"}}})
async def weather(ctx: api.ToolContext, args: dict) -> str:
    logger.info(f"a21lib2: weather called in {ctx.session_id}")
    return f"{args['city']}：晴，记得带伞 a21w"


api.contribute("weather", lambda sid: "插件提示：出门看天气")
api.subscribe(api.TurnEnded, lambda e: logger.info(f"a21lib2: turn ended {e.outcome}"))
"""


@pytest.mark.e2e
async def test_a_plugin_registering_at_its_import_under_bot_py(tmp_path: Path, llm: ScriptedLLM) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "a21weather.py").write_text(WEATHER_PLUGIN, "utf-8")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT, "utf-8")
    llm.reset()
    call = {"id": "w1", "name": "a21_weather", "arguments": '{"city": "杭州"}'}
    llm.push(Reply("", tool_calls=[call], finish_reason="tool_calls"), Reply("杭州明天晴，带伞 a21r"))
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")])}
    async with BotProcess(tmp_path, env=env) as bot, connected(bot) as sim:
        assert 'Succeeded to load plugin "a21weather"' in bot.log()
        await sim.private_message(20006, "明天杭州天气怎么样", nickname="小明")
        await sim.wait_call(set(SEND_ACTIONS))
        assert sim.sent_texts() == ["杭州明天晴，带伞 a21r"]
        await wait_log(bot, "a21lib2: turn ended replied")
        assert f"a21lib2: weather called in {private_sid(20006)}" in bot.log()
    first, second = llm.requests
    assert "a21_weather" in offered(first)
    assert "插件提示：出门看天气" in systems(first["messages"])
    assert [m["content"] for m in second["messages"] if m["role"] == "tool"] == ["杭州：晴，记得带伞 a21w"]
