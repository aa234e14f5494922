"""Audit 9 (i): this session's new features together and at their edges.

A question withdrawn (撤回) before its answer, the bot account's own words from other plugins
(said.py), two accounts on one NoneBot, and a message the provider's content review refuses
(llm/review.py): each met another here, as a real QQ group meets them, through the real store,
the real HTTP client against the scripted OpenAI-compatible server and the real agent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nonebot_plugin_memsum.types import REFUSED_TEXT, Message, ToolCall, is_refused
from tests.fakes.llm_server import Reply
from tests.fakes.service import GROUP, IN_GROUP, NOTHING_KEPT, Env, conversation_of, seed
from tests.test_audit8_m import DEEPSEEK, PHRASE, refusing, turn


def _text(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)


# ---- a refused tool call -------------------------------------------------------------------
async def recalled_phrase(env: Env) -> None:
    """A group history where the model looked a member's phrase up with the recall tool: the
    call's arguments hold PHRASE, which the provider's review refuses wherever it is."""
    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    env.model.summary_default = refusing(DEEPSEEK, Reply(NOTHING_KEPT))
    await seed(env.rt, 4)
    call = ToolCall(id="call_1", name="recall", arguments=json.dumps({"query": PHRASE}, ensure_ascii=False))
    await env.rt.agent.record(GROUP, Message(role="assistant", content="", tool_calls=(call,), ts=1010.0))
    await env.rt.agent.record(
        GROUP, Message(role="tool", content="没有找到", name="recall", tool_call_id="call_1", ts=1010.5)
    )
    await env.rt.agent.record(GROUP, Message(role="assistant", content="没找到相关记录。", ts=1011.0))


async def test_a_refused_tool_calls_arguments_no_longer_fail_every_turn(env: Env) -> None:
    # The model looked a member's phrase up with the recall tool: the call's arguments hold it.
    # The provider's review refuses every request carrying that call; the search finds the call
    # and marks it, and what is sent from then on must not carry its arguments either (the
    # content alone was replaced: each turn of the group failed with the error reply for good).
    await recalled_phrase(env)
    outcome, sent = await turn(env, "今晚吃什么？")
    assert (outcome, sent) == ("replied", ["好的"])
    final = env.model.chat_requests()[-1]
    assert PHRASE not in _text(final)
    # The tool-call group stays whole: the call and its result, ids matching (providers require it).
    calls = [m for m in final["messages"] if m.get("tool_calls")]
    results = [m for m in final["messages"] if m.get("role") == "tool"]
    assert [c["id"] for m in calls for c in m["tool_calls"]] == [r["tool_call_id"] for r in results]
    for m in calls:
        for c in m["tool_calls"]:
            json.loads(c["function"]["arguments"])  # still JSON
    history = await env.rt.store.get_history(GROUP.id)
    assert [m.role for m in history if is_refused(m)] == ["assistant"]
    before = len(env.model.chat_requests())
    assert await turn(env, "那明天呢？") == ("replied", ["好的"])
    assert len(env.model.chat_requests()) == before + 1


async def test_r_run_3_a_refused_tool_call_reaches_the_summariser_without_its_arguments(env: Env) -> None:
    # The same in the summary request (R-RUN-3 renders a call as 调用 name(arguments)): the run
    # finds the call's unit, marks it, and its request again must not carry the arguments.
    await recalled_phrase(env)
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    final = env.model.summary_requests()[-1]
    assert PHRASE not in _text(final)
    assert f"调用 recall({REFUSED_TEXT})" in conversation_of(final)
    assert env.failure_warnings() == []


# ---- a refused question, withdrawn -----------------------------------------------------------
async def test_a_refused_question_withdrawn_during_the_search_gets_no_error_reply(env: Env) -> None:
    # A member asks something the provider's review refuses, sees it, and withdraws it (撤回)
    # while the bot's search runs: the question is gone from the group, so the error reply
    # (MEMSUM_ERROR_REPLY, "something went wrong") answers nothing and must not go out either.
    from tests.fakes.llm_server import Gate

    env.model.chat_default = refusing(DEEPSEEK, Reply("好的"))
    await seed(env.rt, 3)
    await env.rt.agent.record(
        GROUP,
        Message(
            role="user",
            content=f"[路人(30007)] @小记 你怎么看{PHRASE}？",
            name="30007",
            addressed=True,
            platform_id="777001",
        ),
    )
    gate = Gate(refusing(DEEPSEEK, Reply("好的")))
    env.model.chat.append(gate)
    sent: list[str] = []

    async def reply(out: str) -> None:
        sent.append(out)

    with gate:
        task = asyncio.create_task(env.rt.agent.run_turn(GROUP.id, reply, IN_GROUP, requested=True))
        await gate.reached()
        await env.rt.store.mark_withdrawn(GROUP.id, "777001")
    outcome = await task
    assert sent == []
    assert outcome != "replied"
    # Nothing is left pending: a restart does not answer it either.
    assert await env.rt.store.pending_questions(0.0, GROUP.id) == []
