"""DeepSeek's thinking mode with tools: the reasoning of a message that called a tool goes back.

DeepSeek's API docs ("Thinking Mode", api-docs.deepseek.com/guides/thinking_mode; thinking
is on by default on its V4 models): between two user messages, if the model called a tool,
that assistant message's `reasoning_content` "must be passed back to the API in all
subsequent requests"; without it the API answers 400 with

    {"error": {"message": "The `reasoning_content` in the thinking mode must be passed back
     to the API.", "type": "invalid_request_error", "param": null, "code": "invalid_request_error"}}

(the body as reported in the-open-agent/openagent#2206, dataelement/Clawith#570,
anomalyco/opencode#24722). Its adaptive thinking may call a tool without thinking at all, and
the API wants the field all the same (leookun/cursor-byok#268: an empty one is accepted).
Reasoning after which no tool was called is ignored when sent, so it is never kept.

`deepseek` below answers as that API: every assistant message with `tool_calls` must carry
`reasoning_content`, else the 400 above. The bot's `recall` tool is offered by default, so a
bot on DeepSeek hits this on its first recall.
"""

from __future__ import annotations

import json
from typing import Any

from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.store.search import SearchQuery
from nonebot_plugin_memsum.types import REASONING_KEY, Message, ToolCall
from tests.fakes.agent import (
    GROUP,
    GROUP_ENTRY,
    MakeRuntime,
    Replies,
    chat_requests,
    fill,
    is_chat,
    tool_call,
    user,
)
from tests.fakes.llm_server import Reply, ScriptedLLM

DEEPSEEK_400 = "The `reasoning_content` in the thinking mode must be passed back to the API."
THOUGHT = "用户想知道周六的安排，我先用 recall 查一下群里说过的话。"


def deepseek(script: list[Reply], refusal: Reply | None = None) -> Any:
    """DeepSeek's thinking mode: a request whose tool-call message lacks its reasoning is
    refused (with DeepSeek's own 400, or `refusal`); otherwise the next scripted reply."""
    queue = list(script)

    def answer(body: dict[str, Any]) -> Reply | None:
        if not is_chat(body):
            return None
        for m in body["messages"]:
            if m["role"] == "assistant" and m.get("tool_calls") and "reasoning_content" not in m:
                return refusal or Reply(status=400, error=DEEPSEEK_400)
        return queue.pop(0)

    return answer


def kept_without_reasoning(arguments: str) -> list[Message]:
    """A question answered through a tool call stored without its reasoning, then a new one."""
    return [
        user("@小记(10000) 周六几点？"),
        Message(role="assistant", content="", tool_calls=(ToolCall("old_1", "recall", arguments),)),
        Message(role="tool", content="（没有找到）", tool_call_id="old_1"),
        Message(role="assistant", content="没查到。"),
        user("@小记(10000) 那周日呢？"),
    ]


def recall_call(cid: str = "call_0") -> dict[str, str]:
    return tool_call(cid, "recall", {"query": "周六"})


async def test_a_tool_calls_reasoning_is_kept_on_it_and_sent_back_in_this_and_later_turns(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await fill(rt, GROUP, [user("周六下午三点集合"), user("@小记(10000) 周六几点集合？")])
    llm.on_request(
        deepseek(
            [
                Reply("", tool_calls=[recall_call()], reasoning=THOUGHT),
                Reply("周六下午三点。", reasoning="查到了，三点。"),
                Reply("不客气。", reasoning="道谢，简单回应。"),
            ]
        )
    )
    replies = Replies()
    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "replied"
    assert replies.texts == ["周六下午三点。"]

    history = await rt.store.get_history(GROUP.id)
    called = next(m for m in history if m.tool_calls)
    assert called.metadata == {REASONING_KEY: THOUGHT}
    # Only on the message that called a tool: the answer keeps no thinking.
    answer = history[-1]
    assert (answer.role, answer.content, dict(answer.metadata)) == ("assistant", "周六下午三点。", {})
    # Its estimate is what goes on the wire, the reasoning included.
    assert called.tokens is not None
    assert called.tokens == estimate_msg_tokens(called)
    assert called.tokens >= estimate_text_tokens(THOUGHT)

    await fill(rt, GROUP, [user("@小记(10000) 谢谢")])
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    requests = chat_requests(llm)
    assert [r for r in requests if any("reasoning_content" in m for m in r["messages"])] == requests[1:]
    for request in requests[1:]:  # this turn's second call and the next turn's call
        sent = [m for m in request["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
        assert [m["reasoning_content"] for m in sent] == [THOUGHT]
        # The answers' thinking is never sent back.
        assert not [
            m
            for m in request["messages"]
            if m["role"] == "assistant" and not m.get("tool_calls") and "reasoning_content" in m
        ]


async def test_the_reasoning_is_never_summarised_searched_or_shown(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await fill(rt, GROUP, [user("周六下午三点集合"), user("@小记(10000) 周六几点集合？")])
    llm.on_request(
        deepseek(
            [
                Reply("", tool_calls=[recall_call()], reasoning=THOUGHT),
                Reply("周六下午三点。"),
            ]
        )
    )
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    summary = "【最近在聊什么】\n周六集合\n【谁有问题没回应】\n无\n【关键原话要点】\n无\n【保留原文】\n无"
    llm.on_request(lambda body: None if is_chat(body) else Reply(summary))
    await rt.compression.compress(GROUP.id)
    asked = [json.dumps(b, ensure_ascii=False) for b in llm.requests if not is_chat(b)]
    assert asked
    assert all("recall" in a for a in asked)  # the call is rendered (R-RUN-3) ...
    assert not [a for a in asked if "我先用" in a]  # ... its reasoning is not
    # Recall finds what was said, the call's own words too, never the thinking.
    assert await rt.store.search(SearchQuery(GROUP.id, "集合"))
    assert await rt.store.search(SearchQuery(GROUP.id, "我先用")) == []


async def test_a_tool_call_kept_without_reasoning_gets_an_empty_one_after_deepseeks_400(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    # A call stored before the reasoning was kept (or one DeepSeek made without thinking):
    # the API refuses the history; asked again once with an empty reasoning on it, then
    # sent that way from the start for the life of the process.
    rt = await make_rt()
    await fill(rt, GROUP, kept_without_reasoning('{"query":"周六"}'))
    llm.on_request(deepseek([Reply("周日休息。"), Reply("好的。")]))
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    first, second = chat_requests(llm)
    old = [m for m in second["messages"] if m.get("tool_calls")]
    assert [m.get("reasoning_content") for m in old] == [""]
    assert not [m for m in first["messages"] if "reasoning_content" in m]

    await fill(rt, GROUP, [user("@小记(10000) 好")])
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    assert len(chat_requests(llm)) == 3  # no second 400: the empty one is sent at once
    assert [m.get("reasoning_content") for m in chat_requests(llm)[2]["messages"] if m.get("tool_calls")] == [
        ""
    ]


async def test_a_provider_without_reasoning_is_never_sent_the_field(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    # OpenAI's Chat Completions (and Mistral, Groq) validate message fields: nothing is sent
    # that the provider did not give.
    rt = await make_rt()
    await fill(rt, GROUP, [user("@小记(10000) 周六几点？")])
    llm.push(Reply("", tool_calls=[recall_call()]), Reply("三点。"))
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    assert not [m for r in chat_requests(llm) for m in r["messages"] if "reasoning_content" in m]
    assert all(not m.metadata for m in await rt.store.get_history(GROUP.id))


# OpenRouter in front of DeepSeek: the upstream's 400 wrapped as OpenRouter documents its errors
# ("Errors and Debugging": `error.metadata` with `provider_name` and the upstream's `raw` body),
# as reported in endolith/open-interpreter#215.
OPENROUTER_400 = json.dumps(
    {
        "error": {
            "message": "Provider returned error",
            "code": 400,
            "metadata": {
                "raw": json.dumps(
                    {
                        "error": {
                            "message": DEEPSEEK_400,
                            "type": "invalid_request_error",
                            "param": None,
                            "code": "invalid_request_error",
                        }
                    }
                ),
                "provider_name": "DeepSeek",
                "is_byok": False,
            },
        }
    }
)


async def test_deepseeks_400_behind_openrouter_is_read_from_its_metadata(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await fill(rt, GROUP, kept_without_reasoning("{}"))
    openrouter = Reply(status=400, raw=OPENROUTER_400, headers={"Content-Type": "application/json"})
    llm.on_request(deepseek([Reply("周日休息。")], refusal=openrouter))
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    assert len(chat_requests(llm)) == 2
