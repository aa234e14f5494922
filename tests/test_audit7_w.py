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
import re
from collections.abc import Iterator
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.agent.prompt import cut_text
from nonebot_plugin_memsum.agent.tools import ToolContext
from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.onebot import group_record
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, connected, query, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import at
from tests.fakes.onebot import text as seg

SUPERUSER = 10001
MEMBER = 20003


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
    # A third plugin after it is told the name is another plugin's now, not a built-in one.
    with pytest.raises(api.ToolNameTaken) as again:
        api.tool("recall", "第三个插件", {"type": "object", "properties": {}})(my_recall)
    assert "registered by another plugin" in str(again.value)


async def test_a_plugin_tool_typed_with_the_api_alone_gets_its_calls_session(
    llm: ScriptedLLM, own_tools: None
) -> None:
    # A plugin author writes a tool with what `api` exports (its context and function types),
    # not the plugin's internal modules; the call says which session it serves.
    seen: list[str] = []

    def where(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        seen.append(ctx.session_id)
        return "在这里"

    fn: api.ToolFn = where
    api.tool("w_where", "说出会话", {"type": "object", "properties": {}})(fn)
    session = await api.internal_session("w:tool-context")
    await api.record(session, api.Message(role="user", content="[甲(1)] 你在哪个会话？"))
    llm.push(Reply("", tool_calls=[{"id": "c1", "name": "w_where", "arguments": "{}"}]), Reply("好"))
    assert await api.run_turn(session.id) == "replied"
    assert seen == ["w:tool-context"]


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


# ---- a /人设 set under a larger window, then a smaller model -------------------------------------------
# A cat-girl persona as owners write them: 996 characters, about 914 tokens.
LONG_PERSONA = "你是一只说话带喵的猫娘，" * 83
SMALL_WINDOW = 1800
SMALL_BUDGET = SMALL_WINDOW - 1024  # the trim budget: the window less the reply reserve


def _request_tokens(body: dict[str, Any]) -> int:
    """What a request carries, as the plugin estimates it: the messages and the tools."""
    tools = json.dumps(body.get("tools") or [], ensure_ascii=False)
    return estimate_text_tokens(tools) + sum(
        estimate_text_tokens(str(m.get("content") or "")) + 4 for m in body["messages"]
    )


def _warnings_naming(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if needle in line and "WARNING" in line]


async def test_a_place_persona_too_big_for_a_new_smaller_model_is_logged_once_and_requests_fit(
    tmp_path: Any,
) -> None:
    # Before: /人设 checked the persona against the model of its day only. After the owner
    # moved to a model with a smaller window nothing said so, and every request of the group
    # was the whole persona plus the question cut to nothing: over the window (a provider
    # refuses it, and the group gets the error reply every time).
    assert estimate_text_tokens(LONG_PERSONA) > SMALL_BUDGET
    group = 71001
    place = f"place onebot:group:{group}"
    with ScriptedLLM() as llm:
        big = llm.model_config("w/big", context_window=32000)
        bot = BotProcess(tmp_path, env={"MEMSUM_MODELS": json.dumps([big])}, log_level="INFO")
        async with bot, connected(bot) as sim:
            await sim.group_message(group, SUPERUSER, f"/人设 {LONG_PERSONA}")

            async def stored() -> bool:
                rows = await query(bot.db_path, "SELECT value FROM settings WHERE name = 'persona'")
                return rows == [(json.dumps(LONG_PERSONA, ensure_ascii=False),)]

            await until(stored, "the persona stored")
            assert _warnings_naming(bot.log(), place) == []  # it fits the model of its day
            small = llm.model_config("w/small", context_window=SMALL_WINDOW)
            bot.env["MEMSUM_MODELS"] = json.dumps([small])
            await bot.restart()
            await asyncio.wait_for(sim.disconnected.wait(), 15)
            await sim.connect()
            await until(lambda: _has(bot, f"Bot {SELF_ID} connected"), "the reconnection")
            warned = _warnings_naming(bot.log(), place)
            assert len(warned) == 1, bot.log()
            assert "w/small" in warned[0]
            assert "/人设" in warned[0]
            assert "猫娘" not in warned[0]  # no persona text in the log
            for question in ("今天星期几？", "那明天呢？"):
                mark = len(llm.requests)
                await sim.group_message(group, MEMBER, [at(SELF_ID), seg(question)])
                body = (await llm.wait_requests_async(mark + 1))[mark]
                persona = body["messages"][0]["content"]
                assert LONG_PERSONA.startswith(persona)
                assert 0 < estimate_text_tokens(persona) <= SMALL_BUDGET // 2
                assert question in body["messages"][-1]["content"]  # the question whole
                assert _request_tokens(body) + 1024 <= SMALL_WINDOW
                await sim.wait_call("send_msg", timeout=15)
            assert len(_warnings_naming(bot.log(), place)) == 1


async def _has(bot: BotProcess, needle: str) -> bool:
    return needle in bot.log()


class OwnModel:
    """The plugin runtime's chat model on a scripted server, its window set by the test."""

    def __init__(self, llm: ScriptedLLM) -> None:
        self.llm = llm

    def __call__(self, window: int) -> None:
        config = self.llm.model_config(f"w/window-{window}", context_window=window)
        runtime.get().registry.set_models([ModelConfig(**config)])


@pytest.fixture
def own_model() -> Iterator[OwnModel]:
    with ScriptedLLM() as server:
        try:
            yield OwnModel(server)
        finally:
            runtime.get().registry.set_models([])


async def test_a_persona_too_big_after_the_model_changes_at_run_time_is_cut_and_said_once(
    app: Any, own_model: OwnModel
) -> None:
    from nonebot.log import logger

    from tests.fakes.nonebug import group_msg, new_group, run

    group = new_group()
    record = group_record("10000", group)
    own_model(32000)  # the persona fits the model of its day
    done = f"已设置本群人设（{len(LONG_PERSONA)} 字），从下一次回答起生效。\n现在：本群人设（本群）：\n"
    await run(app, group_msg(f"/人设 {LONG_PERSONA}", group), done + LONG_PERSONA)
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        own_model(SMALL_WINDOW)  # the owner's model list changes at run time
        for question in ("[甲(1)] 今天星期几？", "[甲(1)] 那明天呢？"):
            await api.record(record, api.Message(role="user", content=question))
            assert await api.run_turn(record.id) == "replied"
        prompt = await api.build_prompt(record.id)
    finally:
        logger.remove(sink)
    naming = [w for w in warnings if f"place onebot:group:{group}" in w]
    assert len(naming) == 1, warnings
    assert prompt.messages[0]["content"] == own_model.llm.requests[-1]["messages"][0]["content"]
    assert estimate_text_tokens(prompt.messages[0]["content"]) <= SMALL_BUDGET // 2
    assert _request_tokens(own_model.llm.requests[-1]) + 1024 <= SMALL_WINDOW
    assert own_model.llm.requests[-1]["messages"][-1]["content"] == "[甲(1)] 那明天呢？"


# OpenAI's rule for a tool's name, from its API reference (ChatCompletionFunctions.name: "Must
# be a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum length of 64"), and the
# 400 it answers otherwise (portkey.ai/error-library/input-validation-error-10046: "… does not
# match ^[a-zA-Z0-9_-]{1,64}$"). DeepSeek and most compatible servers check the same pattern.
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _openai_tool_check(body: dict[str, Any]) -> Reply | None:
    for i, tool in enumerate(body.get("tools") or []):
        name = tool["function"]["name"]
        if not _TOOL_NAME.match(name):
            return Reply(
                status=400,
                error=f"Invalid 'tools[{i}].function.name': string does not match pattern."
                " Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
            )
    return None


@pytest.mark.parametrize("name", ["查天气", "weather.today", "get weather", "", "w" * 65])
async def test_a_tool_name_the_provider_refuses_is_refused_at_registration_and_turns_still_answer(
    llm: ScriptedLLM, own_tools: None, name: str
) -> None:
    # Before: @api.tool("查天气", …) was taken; from then on every request of every session
    # offered it, the provider refused each with a 400, and the bot answered nothing but its
    # error reply, in every group.
    llm.on_request(_openai_tool_check)
    with pytest.raises(api.BadToolName) as bad:
        api.tool(name, "查询天气", {"type": "object", "properties": {}})
    assert repr(name) in str(bad.value)
    assert "a-z" in str(bad.value)
    assert isinstance(bad.value, ValueError)
    session = await api.internal_session(f"w:bad-tool-{len(name)}")
    await api.record(session, api.Message(role="user", content="[甲(1)] 在吗？"))
    llm.push(Reply("在的。"))
    assert await api.run_turn(session.id) == "replied"
    offered = [t["function"]["name"] for t in llm.requests[-1]["tools"]]
    assert name not in offered
    assert {"todo_write", "recall"} <= set(offered)


async def test_tool_names_the_provider_accepts_are_taken(llm: ScriptedLLM, own_tools: None) -> None:
    llm.on_request(_openai_tool_check)
    for name in ("get_weather", "weather-2", "W" * 64):
        api.tool(name, "查询天气", {"type": "object", "properties": {}})(lambda ctx, args: "晴")
    session = await api.internal_session("w:good-tools")
    await api.record(session, api.Message(role="user", content="[甲(1)] 在吗？"))
    llm.push(Reply("在的。"))
    assert await api.run_turn(session.id) == "replied"


async def test_the_persona_command_says_when_the_model_now_takes_only_the_head_of_it(
    app: Any, own_model: OwnModel
) -> None:
    # Before: /人设 showed the whole persona as in force; the owner, who reads QQ rather than
    # the log, had no way to learn that the new model gets only its beginning.
    from tests.fakes.nonebug import group_msg, new_group, run

    group = new_group()
    own_model(32000)
    done = f"已设置本群人设（{len(LONG_PERSONA)} 字），从下一次回答起生效。\n现在：本群人设（本群）：\n"
    await run(app, group_msg(f"/人设 {LONG_PERSONA}", group), done + LONG_PERSONA)
    await run(app, group_msg("/人设", group), "本群人设（本群）：\n" + LONG_PERSONA)
    own_model(SMALL_WINDOW)
    tokens = estimate_text_tokens(LONG_PERSONA)
    kept = len(cut_text(LONG_PERSONA, SMALL_BUDGET // 2, estimate_text_tokens))
    assert 0 < kept < len(LONG_PERSONA)
    note = (
        f"（注意：这段人设约 {tokens} token，超过了当前模型 w/window-1800 每次请求可用的一半"
        f"（{SMALL_BUDGET} token），回答时只带上前 {kept} 字。请写短一些。）"
    )
    await run(app, group_msg("/人设", group), f"本群人设（本群）：\n{LONG_PERSONA}\n{note}")
    # What the note says is what a turn sends.
    record = group_record("10000", group)
    await api.record(record, api.Message(role="user", content="[甲(1)] 在吗？"))
    assert await api.run_turn(record.id) == "replied"
    assert own_model.llm.requests[-1]["messages"][0]["content"] == LONG_PERSONA[:kept]


# ---- api.contribute with a plain function ----------------------------------------------------------
@pytest.fixture
def own_contributions() -> Iterator[None]:
    agent = runtime.get().agent
    before = {anchor: list(fns) for anchor, fns in agent._contributions.items()}  # pyright: ignore[reportPrivateUsage]
    try:
        yield
    finally:
        agent._contributions.clear()  # pyright: ignore[reportPrivateUsage]
        agent._contributions.update(before)  # pyright: ignore[reportPrivateUsage]


async def test_a_plain_function_contributes_as_an_async_one_does(
    llm: ScriptedLLM, own_contributions: None
) -> None:
    # Before: the README's own example, api.contribute("weather", lambda sid: fetch_weather_text()),
    # with a plain function (as api.tool and api.subscribe take them) logged a TypeError with
    # its traceback at every turn and the part never reached the model.
    api.contribute("w_weather", lambda sid: f"天气：晴（{sid}）")
    api.contribute("w_nothing", lambda sid: None)

    async def later(sid: str) -> str:
        return "节日：冬至"

    api.contribute("w_weather", later)
    session = await api.internal_session("w:contribute-sync")
    await api.record(session, api.Message(role="user", content="[甲(1)] 今天适合出门吗？"))
    llm.push(Reply("适合。"))
    assert await api.run_turn(session.id) == "replied"
    system = [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "system"]
    ours = [text for text in system if text.startswith(("天气：", "节日："))]
    assert ours == ["天气：晴（w:contribute-sync）", "节日：冬至"]  # other plugins' parts may come first
    prompt = await api.build_prompt(session.id)
    assert [m["content"] for m in prompt.messages if m["content"] in ours] == ours


# ---- api.run_turn from inside the session's own turn ------------------------------------------------
async def test_run_turn_from_a_tool_of_the_same_session_raises_at_once_instead_of_hanging_it(
    llm: ScriptedLLM, own_tools: None
) -> None:
    # Before: a tool (or a contribution) that called api.run_turn for its own session waited
    # for the session's turn lock, which its own turn held: the turn never ended, and every
    # later message of that session waited behind it for good.
    errors: list[BaseException] = []

    @api.tool("w_again", "再想一遍", {"type": "object", "properties": {}})
    async def again(ctx: ToolContext, args: dict[str, Any]) -> str:
        try:
            return await api.run_turn(ctx.session_id)
        except api.MemsumError as err:
            errors.append(err)
            raise

    session = await api.internal_session("w:reentrant")
    await api.record(session, api.Message(role="user", content="[甲(1)] 再想想？"))
    call = {"id": "call-1", "name": "w_again", "arguments": "{}"}
    llm.push(Reply("", tool_calls=[call]), Reply("想好了。"))
    assert await asyncio.wait_for(api.run_turn(session.id), 10) == "replied"
    assert len(errors) == 1
    assert isinstance(errors[0], api.TurnInProgress)
    assert isinstance(errors[0], RuntimeError)
    assert "w:reentrant" in str(errors[0])
    tool_result = next(m for m in await api.history(session.id) if m.role == "tool")
    assert tool_result.content.startswith("错误：工具 w_again 执行失败：")
    # The session is not stuck: the next question is answered.
    await api.record(session, api.Message(role="user", content="[甲(1)] 好了吗？"))
    llm.push(Reply("好了。"))
    assert await asyncio.wait_for(api.run_turn(session.id), 10) == "replied"


async def test_run_turn_from_a_tool_for_another_session_runs_that_turn(
    llm: ScriptedLLM, own_tools: None
) -> None:
    helper = await api.internal_session("w:helper")

    @api.tool("w_ask_helper", "问助手", {"type": "object", "properties": {}})
    async def ask(ctx: ToolContext, args: dict[str, Any]) -> str:
        answers: list[str] = []

        async def keep(text: str) -> None:
            answers.append(text)

        await api.record(helper, api.Message(role="user", content="[系统(0)] 查一下库存"))
        await api.run_turn(helper.id, keep)
        return "".join(answers)

    session = await api.internal_session("w:asker")
    await api.record(session, api.Message(role="user", content="[甲(1)] 还有货吗？"))
    call = {"id": "call-1", "name": "w_ask_helper", "arguments": "{}"}
    llm.push(Reply("", tool_calls=[call]), Reply("库存 3 件"), Reply("还有 3 件。"))
    assert await asyncio.wait_for(api.run_turn(session.id), 10) == "replied"
    tool_result = next(m for m in await api.history(session.id) if m.role == "tool")
    assert tool_result.content == "库存 3 件"


# ---- api.subscribe's unsubscribe, called twice -------------------------------------------------------
async def test_unsubscribing_twice_is_harmless_and_leaves_other_handlers_alone(llm: ScriptedLLM) -> None:
    # Before: the second call raised `ValueError: list.remove(x): x not in list` (a plugin
    # that unsubscribes in its shutdown and in a `finally` crashed there).
    seen: list[str] = []
    first = api.subscribe(api.TurnEnded, lambda e: seen.append(f"first {e.outcome}"))
    api_unsubscribe = api.subscribe(api.TurnEnded, lambda e: seen.append(f"second {e.outcome}"))
    first()
    first()
    session = await api.internal_session("w:unsubscribe")
    await api.record(session, api.Message(role="user", content="[甲(1)] 在吗？"))
    llm.push(Reply("在。"))
    try:
        assert await api.run_turn(session.id) == "replied"
    finally:
        api_unsubscribe()
    assert seen == ["second replied"]


# ---- the web page's persona against the chat model's window ------------------------------------------
async def test_the_web_page_refuses_a_persona_the_chat_model_cannot_carry_as_the_command_does(
    tmp_path: Any,
) -> None:
    # Before: /人设 refused a persona over half of what a request may carry, while the web
    # page's settings form stored it; every turn of the group then carried it.
    import httpx

    from tests.fakes.web import GROUP, TOKEN, web_env

    async with web_env(tmp_path) as env:
        small = env.llm.model_config("test/chat", model="chat", context_window=SMALL_WINDOW, priority=1)
        summary = env.llm.model_config("test/summary", model="summary", context_window=8000)
        env.rt.registry.set_models([ModelConfig(**small), ModelConfig(**summary)])
        async with httpx.AsyncClient(base_url=env.base + "/") as owner:
            login = await owner.post("api/login", json={"token": TOKEN})
            owner.headers["X-Memsum-CSRF"] = login.json()["csrf"]
            path = f"api/sessions/{GROUP.id.replace(':', '%3A')}/settings"
            body = {"name": "persona", "scope": "place", "value": LONG_PERSONA}
            resp = await owner.post(path, json=body)
            tokens = estimate_text_tokens(LONG_PERSONA)
            assert resp.status_code == 400
            assert resp.json()["detail"] == (
                f"这段人设约 {tokens} token，超过了模型每次请求可用的一半（{SMALL_BUDGET} token），"
                "每次回答都要带上它，聊天记录就放不下了。请写短一些"
            )
            assert "persona" not in await env.rt.store.get_settings("place", "onebot:group:123456")
            resp = await owner.post(path, json={**body, "value": "你是猫娘。"})
            assert resp.status_code == 200
            assert resp.json()["value"] == "你是猫娘。"
