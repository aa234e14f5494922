"""The agent's usage and turn events (R-TRIG-1/4): every figure computed here by hand
from the token estimates, against a private runtime and the scripted model server."""

from __future__ import annotations

import json
from typing import Any

from nonebot_plugin_memsum.agent.events import TurnEnded, TurnStarted, UsageEvent
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.config import Tier
from nonebot_plugin_memsum.llm.tokens import (
    estimate_msg_tokens,
)
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall
from tests.fakes.agent import (
    GROUP,
    GROUP_ENTRY,
    MODEL_ID,
    PERSONA,
    Events,
    MakeRuntime,
    Replies,
    chat_requests,
    fill,
    system_tokens,
    tool_call,
    tools_tokens,
    user,
)
from tests.fakes.llm_server import Reply, ScriptedLLM

# ---- usage events ---------------------------------------------------------------------


async def test_every_usage_event_field_against_hand_computed_values(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(
        model={"context_window": 32000, "max_output_tokens": 2000},
        memsum_trim_ratio=0.5,
        memsum_reply_max_tokens=1024,
        memsum_history_limit=100,
        memsum_tiers={"onebot": Tier(history_limit=80), "onebot.group": Tier(history_limit=60)},
    )
    await rt.settings.set("history_limit", "place", "onebot:group:1", 40)
    stored = await fill(
        rt,
        GROUP,
        [
            user("今天天气不错"),
            user("是啊，适合爬山", 20002, "乙"),
            Message(role="notice", content="乙(20002) 戳了戳 小记(10000)"),
            Message(role="system", content="对话已压缩", event_marker=True),
            user("@小记(10000) 周末去哪儿玩？帮我记个待办", 20003, "丙"),
        ],
    )
    args = {"items": [{"title": "订香山门票", "status": "pending"}]}
    llm.push(
        Reply("", tool_calls=[tool_call("call_1", "todo_write", args)], usage={"prompt_tokens": 1234}),
        Reply("去香山吧，待办记好了。", usage=None),
    )
    events = Events(rt)
    replies = Replies()

    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "replied"

    conversation = [m for m in stored if not m.event_marker]
    call_msg = Message(
        role="assistant",
        content="",
        tool_calls=(ToolCall("call_1", "todo_write", json.dumps(args, ensure_ascii=False)),),
    )
    result_msg = Message(
        role="tool", content="待办已更新：\n- [pending] 订香山门票", name="todo_write", tool_call_id="call_1"
    )
    fixed = system_tokens(PERSONA) + tools_tokens(rt)
    history_1 = sum(estimate_msg_tokens(m) for m in conversation)
    history_2 = history_1 + estimate_msg_tokens(call_msg) + estimate_msg_tokens(result_msg)
    started = events.items[0]
    assert isinstance(started, TurnStarted)
    facts: dict[str, Any] = {
        "session_id": GROUP.id,
        "platform": "onebot",
        "platform_type": "group",
        "model_id": MODEL_ID,
        "window": 32000,
        "trim_budget": 16000 - 1024,  # ⌊0.5 × 32000⌋ − min(2000, 1024)
        "trimmed": False,
        "history_limit": 40,  # the place layer beats both tiers and the global value
        "line": 16000 - 1024,  # E = min(0.8 × 32000, trim budget)
    }
    assert events.usage() == [
        UsageEvent(
            turn_id=None, usage=fixed + history_1, untrimmed_history=history_1, history_messages=4, **facts
        ),
        UsageEvent(
            turn_id=started.turn_id, usage=1234, untrimmed_history=history_1, history_messages=4, **facts
        ),
        UsageEvent(
            turn_id=None, usage=fixed + history_2, untrimmed_history=history_2, history_messages=6, **facts
        ),
        # The server sent no usage: the estimate stands in.
        UsageEvent(
            turn_id=started.turn_id,
            usage=fixed + history_2,
            untrimmed_history=history_2,
            history_messages=6,
            **facts,
        ),
    ]
    assert events.turns() == [started, TurnEnded(started.turn_id, GROUP.id, "replied")]
    assert [b["max_tokens"] for b in chat_requests(llm)] == [1024, 1024]


async def test_usage_event_of_an_internal_session_takes_the_tier_of_its_entry(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    # No reported usage and a model that declares no max output: reserve = MEMSUM_REPLY_MAX_TOKENS.
    rt = await make_rt(
        model={"context_window": 10000},
        memsum_reply_max_tokens=500,
        memsum_tiers={"onebot": Tier(history_limit=30), "onebot.private": Tier(history_limit=20)},
    )
    internal = SessionRecord(id="internal:cron", platform=None, kind="internal")
    (msg,) = await fill(rt, internal, [Message(role="user", content="整理一下今天的待办")])
    llm.push(Reply("好的", usage=None))
    events = Events(rt)

    await rt.agent.run_turn(internal.id, None, Entry("onebot", "private"))

    fixed = system_tokens(PERSONA) + tools_tokens(rt)
    snapshot, after = events.usage()
    assert snapshot.turn_id is None
    assert after.turn_id is not None
    for event in (snapshot, after):
        assert (event.platform, event.platform_type) == ("onebot", "private")
        assert event.trim_budget == 10000 - 500
        assert event.history_limit == 20
        assert event.usage == fixed + estimate_msg_tokens(msg)
        assert event.history_messages == 1
        assert event.line == 8000  # min(0.8 × 10000, 9500)


async def test_r_trig_4_history_messages_counts_the_whole_active_conversation_and_the_turns_tool_items(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await rt.settings.set("history_limit", "session", GROUP.id, 4)
    await fill(rt, GROUP, [user(f"第 {i} 句") for i in range(6)])
    await fill(rt, GROUP, [Message(role="system", content="对话已压缩", event_marker=True)])
    calls = [tool_call("a", "todo_write", {"items": []}), tool_call("b", "todo_write", {"items": []})]
    llm.push(Reply("", tool_calls=calls), Reply("好了"))
    events = Events(rt)

    await rt.agent.run_turn(GROUP.id, None, GROUP_ENTRY)

    # Six at the start, though only four were sent (limit 4, segment 2: two over, drop
    # two); the marker does not count; then the call and its two results.
    usage = events.usage()
    assert [e.history_messages for e in usage] == [6, 6, 9, 9]
    assert {e.history_limit for e in usage} == {4}
    first = chat_requests(llm)[0]
    assert [m["content"] for m in first["messages"][1:]] == [f"[甲(20001)] 第 {i} 句" for i in range(2, 6)]
