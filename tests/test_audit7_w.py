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
import json
from collections.abc import Iterator
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.agent.tools import ToolContext
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


# ---- api.tool with a name already taken ----------------------------------------------------------
@pytest.fixture
def own_tools() -> Iterator[None]:
    """The tools a test registers on the plugin's runtime are gone after it; the built-in
    ones are as they were."""
    registry = runtime.get().tools
    before = dict(registry._tools)  # pyright: ignore[reportPrivateUsage]
    try:
        yield
    finally:
        registry._tools.clear()  # pyright: ignore[reportPrivateUsage]
        registry._tools.update(before)  # pyright: ignore[reportPrivateUsage]


def _recall_call(query: str) -> dict[str, str]:
    return {"id": "call-1", "name": "recall", "arguments": json.dumps({"query": query}, ensure_ascii=False)}


async def test_a_plugin_tool_named_as_a_built_in_one_is_refused_naming_it_and_the_built_in_stays(
    llm: ScriptedLLM, own_tools: None
) -> None:
    # Before: @api.tool("recall", …) silently replaced the built-in recall: the model's
    # searches of the session's own history went to the other plugin's function.
    called: list[dict[str, Any]] = []

    async def my_recall(ctx: ToolContext, args: dict[str, Any]) -> str:
        called.append(args)
        return "别的插件的结果"

    for name in ("recall", "todo_write"):
        with pytest.raises(api.ToolNameTaken) as taken:
            api.tool(name, "我的搜索", {"type": "object", "properties": {}})(my_recall)
        assert taken.value.name == name
        assert f"'{name}'" in str(taken.value)
        assert "built in" in str(taken.value)
        assert "replace=True" in str(taken.value)
        assert isinstance(taken.value, ValueError)
    # The model still gets the built-in recall, and its searches reach the session's history.
    session = await api.internal_session("w:tool-clash")
    await api.record(session, api.Message(role="user", content="[甲(1)] 提取码是 w7k2"))
    await api.record(session, api.Message(role="user", content="[乙(2)] 我之前说的提取码是多少？"))
    llm.push(Reply("", tool_calls=[_recall_call("提取码")]), Reply("是 w7k2。"))
    assert await api.run_turn(session.id) == "replied"
    assert called == []
    tool_result = next(m for m in await api.history(session.id) if m.role == "tool")
    assert "w7k2" in tool_result.content
    assert "别的插件" not in tool_result.content
    offered = [t["function"] for t in llm.requests[0]["tools"]]
    assert [t["description"] for t in offered if t["name"] == "recall"] != ["我的搜索"]


async def test_a_tool_name_two_plugins_use_is_refused_and_replace_true_replaces_on_purpose(
    llm: ScriptedLLM, own_tools: None
) -> None:
    @api.tool("w_weather", "查天气", {"type": "object", "properties": {}})
    def weather(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "晴"

    with pytest.raises(api.ToolNameTaken) as taken:
        api.tool("w_weather", "查天气（另一个插件）", {"type": "object", "properties": {}})(weather)
    assert "'w_weather'" in str(taken.value)
    assert "built in" not in str(taken.value)

    # replace=True: the author means it; the model is offered the new one, once.
    @api.tool("recall", "我的搜索", {"type": "object", "properties": {}}, replace=True)
    def my_recall(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "别的插件的结果"

    session = await api.internal_session("w:tool-replace")
    await api.record(session, api.Message(role="user", content="[甲(1)] 搜一下提取码"))
    llm.push(Reply("", tool_calls=[_recall_call("提取码")]), Reply("好了"))
    assert await api.run_turn(session.id) == "replied"
    offered = [t["function"] for t in llm.requests[0]["tools"]]
    assert [t["description"] for t in offered if t["name"] == "recall"] == ["我的搜索"]
    assert [t["name"] for t in offered].count("recall") == 1
    tool_result = next(m for m in await api.history(session.id) if m.role == "tool")
    assert tool_result.content == "别的插件的结果"


# ---- commands that take no argument ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("typed", "usage"),
    [
        ("/摘要 多余参数", "用法：/摘要（不带参数）"),
        ("/摘要 今天", "用法：/摘要（不带参数）"),
        ("/记忆帮助 压缩", "用法：/记忆帮助（不带参数）"),
        ("/压缩 现在", "用法：/压缩（不带参数）"),
    ],
)
async def test_a_command_that_takes_no_argument_answers_one_with_its_usage_line(
    app: Any, typed: str, usage: str
) -> None:
    # Before: /摘要 and /记忆帮助 ignored the words after them (「/摘要 今天」 showed the whole
    # summary as if the date meant something) while 「/压缩 现在」 showed its usage.
    from tests.fakes.nonebug import group_msg, new_group, private_msg, run

    group = new_group()
    await run(app, group_msg(typed, group), usage)
    await run(app, private_msg(typed), usage)


async def test_the_commands_without_an_argument_still_answer_and_trailing_spaces_are_no_argument(
    app: Any,
) -> None:
    from tests.fakes.nonebug import Like, group_msg, new_group, private_msg, run

    group = new_group()
    await run(app, group_msg("/摘要", group), Like("本会话还没有摘要。\n.*"))
    await run(app, group_msg("/摘要\u3000", group), Like("本会话还没有摘要。\n.*"))  # a full-width space
    await run(app, private_msg("/记忆帮助 "), Like("/压缩  立即压缩本会话\n.*"))
