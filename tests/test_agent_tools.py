"""Tool calls through real turns: rounds, results stored in order, the todo tool, and the
limit on rounds."""

from __future__ import annotations

import json
from typing import Any

from nonebot_plugin_memsum.agent.tools import TodoItem, ToolContext
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.types import ToolCall
from tests.fakes.agent import (
    GROUP,
    GROUP_ENTRY,
    Events,
    MakeRuntime,
    Replies,
    chat_requests,
    fill,
    openai_user,
    tool_call,
    user,
)
from tests.fakes.llm_server import Reply, ScriptedLLM

# ---- tools --------------------------------------------------------------------------


async def test_issue_9_the_tool_schemas_sent_with_every_chat_request_stay_short(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    # Issue 9: the built-in tools' schemas go with every chat request (and count against the
    # trim budget); their o200k size was 407 tokens, 345 with the shorter descriptions.
    rt = await make_rt()
    await fill(rt, GROUP, [user("@小记(10000) 在吗")])
    llm.push(Reply("在。"))

    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"

    (request,) = chat_requests(llm)
    assert [t["function"]["name"] for t in request["tools"]] == ["todo_write", "recall"]
    assert estimate_text_tokens(json.dumps(request["tools"], ensure_ascii=False)) <= 350
    recall = request["tools"][1]["function"]
    assert "须全部出现" in recall["description"]  # the search's AND, which the model must know
    assert set(recall["parameters"]["properties"]) == {"query", "speaker", "since", "until", "limit"}


async def test_issue_9_the_prompt_counts_the_tools_offered_and_one_registered_later(
    make_rt: MakeRuntime,
) -> None:
    # The tools' size is taken once and kept while the schemas stay the same (their JSON cost
    # every turn ~20 µs): a tool registered later must be counted from the next prompt on.
    rt = await make_rt()
    await fill(rt, GROUP, [user("@小记(10000) 在吗")])

    def sent_size() -> int:
        return estimate_text_tokens(json.dumps(rt.tools.schemas(), ensure_ascii=False))

    bare = await rt.agent.build_prompt(GROUP.id, GROUP_ENTRY, with_tools=False)
    offered = await rt.agent.build_prompt(GROUP.id, GROUP_ENTRY)
    assert offered.estimate - bare.estimate == sent_size()

    @rt.tools.tool("peek", "看一眼最近的几条消息", {"type": "object", "properties": {}})
    def peek(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "无"

    more = await rt.agent.build_prompt(GROUP.id, GROUP_ENTRY)
    assert more.estimate - bare.estimate == sent_size() > offered.estimate - bare.estimate
    assert (await rt.agent.build_prompt(GROUP.id, GROUP_ENTRY, with_tools=False)).estimate == bare.estimate


async def test_tool_call_round_trip_is_stored_as_a_group_and_sent_back(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    (asked,) = await fill(rt, GROUP, [user("@小记(10000) 记一下：周六买票")])
    args = json.dumps({"items": [{"title": "周六买票", "status": "pending"}]}, ensure_ascii=False)
    llm.push(Reply("", tool_calls=[tool_call("call_1", "todo_write", args)]), Reply("记下了。"))
    replies = Replies()

    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "replied"

    result_text = "待办已更新：\n- [pending] 周六买票"
    first, second = chat_requests(llm)
    assert [t["function"]["name"] for t in first["tools"]] == ["todo_write", "recall"]
    assert second["messages"][1:] == [
        openai_user(asked),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "todo_write", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": result_text},
    ]
    history = await rt.store.get_history(GROUP.id)
    assert [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in history[1:]] == [
        ("assistant", "", (ToolCall("call_1", "todo_write", args),), None),
        ("tool", result_text, (), "call_1"),
        ("assistant", "记下了。", (), None),
    ]
    assert await rt.todos.items(GROUP.id) == [TodoItem("周六买票", "pending")]
    assert replies.texts == ["记下了。"]


async def test_a_failing_tool_becomes_its_result_and_the_turn_goes_on(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()

    @rt.tools.tool("boom", "总是失败的工具", {"type": "object", "properties": {}})
    async def boom(ctx: ToolContext, args: dict[str, Any]) -> str:
        raise RuntimeError("炸了")

    await fill(rt, GROUP, [user("@小记(10000) 试试工具")])
    llm.push(
        Reply(
            "",
            tool_calls=[
                tool_call("t1", "boom", {}),
                tool_call("t2", "todo_write", "{not json"),
                tool_call("t3", "nope", {}),
                tool_call("t4", "todo_write", {"items": [{"title": "x", "status": "奇怪"}]}),
            ],
        ),
        Reply("工具都坏了。"),
    )
    replies = Replies()

    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "replied"

    results = {m.tool_call_id: m.content for m in await rt.store.get_history(GROUP.id) if m.role == "tool"}
    assert results["t1"] == "错误：工具 boom 执行失败：炸了"
    assert results["t2"].startswith("错误：工具 todo_write 执行失败：")
    assert results["t3"] == "错误：没有名为 nope 的工具"
    assert results["t4"] == "错误：工具 todo_write 执行失败：未知状态 奇怪"
    _, second = chat_requests(llm)
    assert [m["tool_call_id"] for m in second["messages"] if m["role"] == "tool"] == ["t1", "t2", "t3", "t4"]
    assert replies.texts == ["工具都坏了。"]


async def test_max_tool_rounds_is_respected_and_the_last_call_offers_no_tools(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(memsum_max_tool_rounds=2)
    await fill(rt, GROUP, [user("@小记(10000) 一直调工具吧")])
    again = {"items": [{"title": "再来", "status": "in_progress"}]}
    llm.push(
        Reply("", tool_calls=[tool_call("r1", "todo_write", again)]),
        Reply("", tool_calls=[tool_call("r2", "todo_write", again)]),
        Reply("只能先这样了。", tool_calls=[tool_call("r3", "todo_write", again)]),
    )
    events = Events(rt)
    replies = Replies()

    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "replied"

    requests = chat_requests(llm)
    assert ["tools" in r for r in requests] == [True, True, False]
    assert replies.texts == ["只能先这样了。"]
    history = await rt.store.get_history(GROUP.id)
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert history[-1].tool_calls == ()
    assert [e.history_messages for e in events.usage()] == [1, 1, 3, 3, 5, 5]
