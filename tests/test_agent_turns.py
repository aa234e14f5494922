"""The chat agent's turns in process: a private runtime from `runtime.build` on a real
SQLite file, talking real HTTP to the scripted model server.

Every figure of the usage events is computed here by hand from the token estimates;
the requests the server recorded are compared message by message. Slow replies are a
gate the test opens, never a sleep.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import TurnEnded, TurnStarted, UsageEvent
from nonebot_plugin_memsum.agent.prompt import ANSWERED_LAST, hard_trim, safe_start
from nonebot_plugin_memsum.agent.tools import TodoItem, ToolContext
from nonebot_plugin_memsum.agent.turn import SILENT_RECORD, Entry
from nonebot_plugin_memsum.config import Config, ModelConfig, Tier
from nonebot_plugin_memsum.llm.tokens import (
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    estimate_msg_tokens,
    estimate_text_tokens,
)
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured

PERSONA = "你是测试群里的助手小记，回答简短。"
SUMMARY = "【最近在聊什么】\n闲聊\n【谁有问题没回应】\n无\n【关键原话要点】\n无\n【保留原文】\n无"
GROUP = SessionRecord(
    id="onebot:10000:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
)
GROUP_ENTRY = Entry("onebot", "group")
MODEL_ID = "test/model"

Event = TurnStarted | TurnEnded | UsageEvent
MakeRuntime = Callable[..., Awaitable[Runtime]]


def is_chat(body: dict[str, Any]) -> bool:
    """A request of the chat agent (the persona first), not of the compression."""
    return body["messages"][0] == {"role": "system", "content": PERSONA}


def chat_requests(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [b for b in list(llm.requests) if is_chat(b)]


def _summaries(body: dict[str, Any]) -> Reply | None:
    # A compression the count or usage line starts in the background gets its own
    # answer, so it never takes a reply a test queued for the chat.
    return None if is_chat(body) else Reply(SUMMARY)


def user(text: str, uid: int = 20001, name: str = "甲") -> Message:
    return Message(role="user", content=f"[{name}({uid})] {text}", name=str(uid))


def tool_call(cid: str, name: str, arguments: Any) -> dict[str, str]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": cid, "name": name, "arguments": args}


def openai_user(m: Message) -> dict[str, Any]:
    return {"role": "user", "content": m.content}


class Events:
    """Every turn and usage event of a bus, in order."""

    def __init__(self, rt: Runtime) -> None:
        self.items: list[Event] = []
        rt.bus.subscribe(TurnStarted, self.items.append)
        rt.bus.subscribe(TurnEnded, self.items.append)
        rt.bus.subscribe(UsageEvent, self.items.append)

    def usage(self) -> list[UsageEvent]:
        return [e for e in self.items if isinstance(e, UsageEvent)]

    def turns(self) -> list[TurnStarted | TurnEnded]:
        return [e for e in self.items if not isinstance(e, UsageEvent)]


class Replies:
    """The reply function of a turn: what the bot would have said in chat."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def __call__(self, text: str) -> None:
        self.texts.append(text)


@pytest.fixture
async def make_rt(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[MakeRuntime]:
    """Builds runtimes on a fresh database; `model={...}` overrides the model's fields."""
    built: list[Runtime] = []

    async def make(model: dict[str, Any] | None = None, **config: Any) -> Runtime:
        models = [ModelConfig(**llm.model_config(MODEL_ID, **(model or {})))]
        cfg = Config(memsum_models=models, memsum_persona=PERSONA, **config)
        rt = await runtime.build(cfg, tmp_path / f"memsum-{len(built)}.db", ["小记"], {"10001"})
        built.append(rt)
        return rt

    llm.reset()
    llm.on_request(_summaries)
    try:
        yield make
    finally:
        for rt in built:
            await runtime.close(rt)
        llm.reset()


async def fill(rt: Runtime, session: SessionRecord, messages: list[Message]) -> list[Message]:
    return [await rt.agent.record(session, m) for m in messages]


def tools_tokens(rt: Runtime) -> int:
    return estimate_text_tokens(json.dumps(rt.tools.schemas(), ensure_ascii=False))


def system_tokens(*parts: str) -> int:
    """The system messages and the request's own priming (openai-cookbook's count)."""
    return REQUEST_OVERHEAD + sum(estimate_text_tokens(p) + MESSAGE_OVERHEAD for p in parts)


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


# ---- count trimming and hard trimming through a real turn ---------------------------------


async def test_r_cfg_6_count_trim_drops_in_segments_and_never_splits_a_tool_group(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await rt.settings.set("history_limit", "session", GROUP.id, 6)
    one = (ToolCall("c1", "todo_write", "{}"),)
    two = (ToolCall("c2a", "todo_write", "{}"), ToolCall("c2b", "todo_write", "{}"))
    history = await fill(
        rt,
        GROUP,
        [
            user("u0"),
            user("u1"),
            Message(role="system", content="对话已压缩", event_marker=True),
            user("u2"),
            user("u3"),
            user("u4"),
            Message(role="assistant", content="", tool_calls=one),
            Message(role="tool", content="r1", name="todo_write", tool_call_id="c1"),
            user("u7"),
            Message(role="assistant", content="我查一下", tool_calls=two),
            Message(role="tool", content="r2a", name="todo_write", tool_call_id="c2a"),
            Message(role="tool", content="r2b", name="todo_write", tool_call_id="c2b"),
            user("u11"),
        ],
    )
    llm.push(Reply("好"))

    await rt.agent.run_turn(GROUP.id, None, GROUP_ENTRY)

    # 12 conversation messages, limit 6, segment 3: 6 over → drop 6, which would start
    # at the result r1; the cut moves past its group, so u7 leads.
    (request,) = chat_requests(llm)
    assert request["messages"] == [
        {"role": "system", "content": PERSONA},
        openai_user(history[8]),
        {
            "role": "assistant",
            "content": "我查一下",
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in two
            ],
        },
        {"role": "tool", "tool_call_id": "c2a", "content": "r2a"},
        {"role": "tool", "tool_call_id": "c2b", "content": "r2b"},
        openai_user(history[12]),
    ]


async def test_r_cfg_6_count_trim_prefix_moves_only_once_per_segment(make_rt: MakeRuntime) -> None:
    rt = await make_rt()
    await rt.settings.set("history_limit", "session", GROUP.id, 6)
    firsts: list[str] = []
    for i in range(16):
        await fill(rt, GROUP, [user(f"m{i}")])
        prompt = await rt.agent.build_prompt(GROUP.id, GROUP_ENTRY)
        assert len(prompt.history) <= 6
        firsts.append(prompt.messages[1]["content"].removeprefix("[甲(20001)] "))
    # segment 3: the first message sent changes every third message, not every one
    assert firsts == ["m0"] * 6 + ["m3"] * 3 + ["m6"] * 3 + ["m9"] * 3 + ["m12"]


def _reference_safe_start(history: list[Message], start: int) -> int:
    """The first definition: every group's span by a scan over what follows its call."""
    spans = []
    for i, m in enumerate(history):
        if m.role == "assistant" and m.tool_calls:
            ids = {c.id for c in m.tool_calls}
            last = max([i] + [j for j in range(i + 1, len(history)) if history[j].tool_call_id in ids])
            spans.append((i, last))
    i, moved = start, True
    while moved and i < len(history):
        moved = False
        for first, last in spans:
            if first < i <= last:
                i, moved = last + 1, True
        while i < len(history) and history[i].role == "tool":
            i, moved = i + 1, True
    return min(i, len(history))


_ids = st.sampled_from(["a", "b", "c", "d"])
_items = st.one_of(
    st.builds(lambda t: Message(role="user", content=t), st.text("xyz", max_size=6)),
    st.builds(
        lambda ids: Message(
            role="assistant", content="", tool_calls=tuple(ToolCall(i, "f", "{}") for i in ids)
        ),
        st.lists(_ids, min_size=1, max_size=2),
    ),
    st.builds(lambda i, t: Message(role="tool", content=t, tool_call_id=i), _ids, st.text("xyz", max_size=6)),
)


@given(history=st.lists(_items, max_size=30), budget=st.integers(0, 120))
def test_linear_trimming_cuts_where_the_first_definition_did(history: list[Message], budget: int) -> None:
    # Trimming became linear (a 3000-message hard trim took 39 s of blocked event loop);
    # the cut points must not move. Repeated call ids included.
    for start in range(len(history) + 1):
        assert safe_start(history, start) == _reference_safe_start(history, start)
    kept, trimmed = hard_trim(history, 5, budget, lambda m: len(m.content) + 1)
    start, total = 0, 5 + sum(len(m.content) + 1 for m in history)
    while total > budget and start < len(history):
        nxt = _reference_safe_start(history, start + 1)
        total -= sum(len(m.content) + 1 for m in history[start:nxt])
        start = nxt
    assert (kept, trimmed) == (history[start:], start > 0)


async def test_hard_trim_keeps_tool_groups_whole_and_puts_context_last_before_history(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(memsum_compress_at=0, memsum_trim_ratio=1.0)

    async def rules(session_id: str) -> str:
        return "群规：不许刷屏"

    async def context(session_id: str) -> str:
        return f"{session_id} 的背景：大家在约周末爬山"

    async def nothing(session_id: str) -> None:
        return None

    # `context` is registered first (by the compression, and here again) yet comes last.
    rt.agent.contribute("context", context)
    rt.agent.contribute("rules", rules)
    rt.agent.contribute("empty", nothing)
    call = ToolCall("c1", "todo_write", json.dumps({"items": [{"title": "带水", "status": "pending"}]}))
    history = await fill(
        rt,
        GROUP,
        [
            user("很早以前的一句话，" * 20),
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(
                role="tool", content="待办已更新：\n- [pending] 带水", name="todo_write", tool_call_id="c1"
            ),
            user("周六几点出发？", 20002, "乙"),
            user("@小记(10000) 你说呢", 20003, "丙"),
        ],
    )
    parts = [PERSONA, "群规：不许刷屏", f"{GROUP.id} 的背景：大家在约周末爬山"]
    fixed = system_tokens(*parts) + tools_tokens(rt)
    costs = [estimate_msg_tokens(m) for m in history]
    # The budget would hold the tool result and the last two messages, but not the call:
    # a result without its call must go too.
    budget = fixed + sum(costs[2:])
    rt.registry.set_models(
        [ModelConfig(**llm.model_config(MODEL_ID, context_window=budget + 100, max_output_tokens=100))]
    )
    llm.push(Reply("十点吧", usage=None))
    events = Events(rt)

    await rt.agent.run_turn(GROUP.id, None, GROUP_ENTRY)

    (request,) = chat_requests(llm)
    assert request["messages"] == [
        *({"role": "system", "content": p} for p in parts),
        openai_user(history[3]),
        openai_user(history[4]),
    ]
    assert request["max_tokens"] == 100
    _, after = events.usage()
    assert after.trim_budget == budget
    assert after.trimmed is True
    assert after.untrimmed_history == sum(costs)
    assert after.usage == fixed + costs[3] + costs[4] <= budget


async def test_a_50000_character_message_is_stored_whole_and_hard_trimmed_away(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(memsum_compress_at=0)
    rng = random.Random(3)
    huge = "".join(chr(0x4E00 + rng.randrange(0x5000)) for _ in range(50_000))
    await fill(rt, GROUP, [user(huge), user("@小记(10000) 上面那段你看到了吗", 20002, "乙")])
    llm.push(Reply("太长了，没法全看。", usage=None))
    events = Events(rt)
    replies = Replies()

    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "replied"

    stored = await rt.store.get_history(GROUP.id)
    assert stored[0].content == f"[甲(20001)] {huge}"
    (request,) = chat_requests(llm)
    assert [m["content"] for m in request["messages"][1:]] == ["[乙(20002)] @小记(10000) 上面那段你看到了吗"]
    _, after = events.usage()
    assert after.trimmed is True
    assert after.usage <= after.trim_budget == 32000 - 1024
    assert after.untrimmed_history > after.trim_budget
    assert replies.texts == ["太长了，没法全看。"]


async def test_a_huge_newest_message_is_sent_cut_to_the_trim_budget(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(memsum_compress_at=0)
    rng = random.Random(4)
    # Rare ideographs and emoji take two to four tokens a character.
    huge = "".join(
        chr(rng.choice((0x4E00 + rng.randrange(0x5000), 0x1F600 + rng.randrange(80)))) for _ in range(50_000)
    )
    (stored,) = await fill(rt, GROUP, [user(huge)])
    llm.push(Reply("收到", usage=None))
    events = Events(rt)

    assert await rt.agent.run_turn(GROUP.id, None, GROUP_ENTRY) == "replied"

    assert (await rt.store.get_history(GROUP.id))[0] == stored
    (request,) = chat_requests(llm)
    sent = request["messages"][-1]["content"]
    assert sent.startswith(stored.content[:1000])
    assert sent.endswith("（消息过长，已截断）")
    _, after = events.usage()
    assert after.trimmed is True
    fixed = system_tokens(PERSONA) + tools_tokens(rt)
    sent_msg = Message(role="user", content=sent, name="20001")
    assert after.usage == fixed + estimate_msg_tokens(sent_msg) <= after.trim_budget


# ---- tools --------------------------------------------------------------------------


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


# ---- outcomes -----------------------------------------------------------------------


async def test_silent_turn_stores_an_event_marker_and_sends_nothing(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await fill(rt, GROUP, [user("@小记(10000) 随便说点什么")])
    llm.push(Reply("[不回复]"), Reply("好的"))
    events = Events(rt)
    replies = Replies()

    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "silent"

    assert replies.texts == []
    last = (await rt.store.get_history(GROUP.id))[-1]
    assert (last.role, last.content, last.event_marker) == ("system", SILENT_RECORD, True)
    assert await rt.store.count_active(GROUP.id) == 1
    started, ended = events.turns()
    assert ended == TurnEnded(started.turn_id, GROUP.id, "silent")
    # The marker never reaches the model.
    await fill(rt, GROUP, [user("@小记(10000) 还在吗")])
    await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY)
    assert SILENT_RECORD not in json.dumps(chat_requests(llm)[-1], ensure_ascii=False)


async def test_model_error_sends_the_apology_only_and_loses_nothing(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(memsum_error_reply="出了点问题，稍后再试。")
    asked = await fill(rt, GROUP, [user("在吗"), user("@小记(10000) 帮我看看", 20002, "乙")])
    # The client retries a 500 twice; all three attempts fail.
    llm.push(*(Reply(status=500, error="upstream exploded") for _ in range(3)))
    events = Events(rt)
    replies = Replies()
    with captured("DEBUG") as lines:
        assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "error"

    assert replies.texts == ["出了点问题，稍后再试。"]
    assert any("failed" in line for line in lines)  # the details go to the log
    assert not [line for line in lines if API_KEY in line]
    started, ended = events.turns()
    assert ended == TurnEnded(started.turn_id, GROUP.id, "error")
    assert await rt.store.get_history(GROUP.id) == asked
    # The next turn sees both messages.
    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "replied"
    assert [m["content"] for m in chat_requests(llm)[-1]["messages"][1:]] == [m.content for m in asked]


async def test_shutdown_during_a_slow_reply_aborts_the_turn(make_rt: MakeRuntime, llm: ScriptedLLM) -> None:
    rt = await make_rt()
    await fill(rt, GROUP, [user("@小记(10000) 慢慢想")])
    events = Events(rt)
    replies = Replies()
    with llm.gate(holds=is_chat):  # the queued reply (or the default) answers once it opens
        rt.agent.request_turn(GROUP.id, replies, GROUP_ENTRY)
        await llm.wait_requests_async(1)
        await rt.agent.shutdown()

    started, ended = events.turns()
    assert ended == TurnEnded(started.turn_id, GROUP.id, "aborted")
    assert replies.texts == []  # no apology for a shutdown
    assert [m.role for m in await rt.store.get_history(GROUP.id)] == ["user"]


# ---- one turn at a time per session ---------------------------------------------------


async def test_messages_during_a_turn_go_into_the_next_turn_without_interleaving(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    gate = llm.gate(holds=is_chat)
    llm.push(Reply("第一轮的回答"), Reply("第二轮的回答"))
    events = Events(rt)
    said: list[tuple[str, str]] = []

    def replier(tag: str) -> Callable[[str], Awaitable[None]]:
        async def send(text: str) -> None:
            said.append((tag, text))

        return send

    (first,) = await fill(rt, GROUP, [user("@小记(10000) 第一个问题")])
    with gate:
        rt.agent.request_turn(GROUP.id, replier("r1"), GROUP_ENTRY)
        await llm.wait_requests_async(1)
        during = await fill(
            rt, GROUP, [user("插一句", 20002, "乙"), user("@小记(10000) 第二个问题", 20003, "丙")]
        )
        rt.agent.request_turn(GROUP.id, replier("r2"), GROUP_ENTRY)
        rt.agent.request_turn(GROUP.id, replier("r3"), GROUP_ENTRY)
        assert rt.agent.in_turn(GROUP.id)
    await rt.agent.wait_idle(GROUP.id)

    one, two = chat_requests(llm)
    assert one["messages"][1:] == [openai_user(first)]
    # Stored order: the two arrived before the first answer was stored.
    assert two["messages"][1:] == [
        openai_user(first),
        *map(openai_user, during),
        {"role": "assistant", "content": "第一轮的回答"},
        {"role": "user", "content": ANSWERED_LAST},
    ]
    assert said == [("r1", "第一轮的回答"), ("r3", "第二轮的回答")]
    kinds = [type(e).__name__ for e in events.turns()]
    assert kinds == ["TurnStarted", "TurnEnded", "TurnStarted", "TurnEnded"]


async def test_two_sessions_run_their_turns_concurrently(make_rt: MakeRuntime, llm: ScriptedLLM) -> None:
    rt = await make_rt()
    other = SessionRecord(id="onebot:10000:private:20009", platform="onebot", kind="private", peer="20009")
    gate = llm.gate(holds=is_chat)
    await fill(rt, GROUP, [user("@小记(10000) 群里的问题")])
    await fill(rt, other, [user("私聊的问题", 20009, "私")])
    llm.on_request(
        lambda body: Reply("答群里") if "群里的问题" in json.dumps(body, ensure_ascii=False) else None
    )
    llm.default = Reply("答私聊")
    group_replies, private_replies = Replies(), Replies()

    with gate:
        rt.agent.request_turn(GROUP.id, group_replies, GROUP_ENTRY)
        rt.agent.request_turn(other.id, private_replies, Entry("onebot", "private"))
        # Both requests are at the server while the gate is still shut: the second turn
        # did not wait for the first.
        held = await llm.wait_requests_async(2)
        assert rt.agent.in_turn(GROUP.id)
        assert rt.agent.in_turn(other.id)
    await rt.agent.wait_idle(GROUP.id)
    await rt.agent.wait_idle(other.id)

    assert sorted(b["messages"][-1]["content"] for b in held) == [
        "[甲(20001)] @小记(10000) 群里的问题",
        "[私(20009)] 私聊的问题",
    ]
    assert (group_replies.texts, private_replies.texts) == (["答群里"], ["答私聊"])


# ---- review additions ---------------------------------------------------------------------------


async def test_r_trig_4_history_messages_counts_inputs_that_came_in_during_the_turn(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await fill(rt, GROUP, [user("第 0 句")])

    @rt.tools.tool("peek", "看一眼", {"type": "object", "properties": {}})
    async def peek(ctx: ToolContext, args: dict[str, Any]) -> str:
        await rt.agent.record(GROUP, user("插进来的一句", 20002, "乙"))  # arrives mid-turn
        return "看过了"

    llm.push(Reply("", tool_calls=[tool_call("a", "peek", {})]), Reply("好了"))
    events = Events(rt)
    await rt.agent.run_turn(GROUP.id, None, GROUP_ENTRY)
    # One at the start; then the call, the input that came in, and the result.
    assert [e.history_messages for e in events.usage()] == [1, 1, 4, 4]


async def test_usage_without_prompt_tokens_falls_back_to_the_estimate(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    await fill(rt, GROUP, [user("你好")])
    llm.push(Reply("好", usage={"completion_tokens": 3}))
    events = Events(rt)
    await rt.agent.run_turn(GROUP.id, None, GROUP_ENTRY)
    snapshot, reported = events.usage()
    assert reported.turn_id is not None
    assert reported.usage == snapshot.usage > 0


async def test_r_cfg_5_no_chat_model_is_warned_once_not_on_every_turn(tmp_path: Path) -> None:
    from nonebot.log import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="WARNING")
    rt: Runtime | None = None
    try:
        rt = await runtime.build(Config(memsum_persona=PERSONA), tmp_path / "none.db", [], set())
        replies = Replies()
        for _ in range(3):
            await fill(rt, GROUP, [user("在吗")])
            assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "error"
    finally:
        logger.remove(sink)
        if rt is not None:
            await runtime.close(rt)
    assert len([line for line in lines if "no chat" in line]) == 1
    assert replies.texts == [Config().memsum_error_reply] * 3


# ---- QA regressions -----------------------------------------------------------------------------


async def test_a_queued_turn_whose_message_the_running_turn_read_is_dropped(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    # Two @-messages of a burst, both stored before the turn reads history: one answer.
    rt = await make_rt()
    first, second = await fill(rt, GROUP, [user("@小记(10000) 在吗"), user("@小记(10000) 在吗？？", 20002)])
    replies = Replies()
    rt.agent.request_turn(GROUP.id, replies, GROUP_ENTRY, trigger=first.id)
    rt.agent.request_turn(GROUP.id, replies, GROUP_ENTRY, trigger=second.id)
    await rt.agent.wait_idle(GROUP.id)
    assert len(chat_requests(llm)) == 1
    assert replies.texts == ["好的"]


async def test_a_queued_turn_whose_message_came_after_the_read_still_runs(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    (first,) = await fill(rt, GROUP, [user("@小记(10000) 第一个问题")])
    replies = Replies()
    with llm.gate(holds=is_chat):
        rt.agent.request_turn(GROUP.id, replies, GROUP_ENTRY, trigger=first.id)
        await llm.wait_requests_async(1)
        (later,) = await fill(rt, GROUP, [user("@小记(10000) 第二个问题", 20002)])
        rt.agent.request_turn(GROUP.id, replies, GROUP_ENTRY, trigger=later.id)
    await rt.agent.wait_idle(GROUP.id)
    _one, two = chat_requests(llm)
    assert two["messages"][-3] == openai_user(later)
    assert two["messages"][-1] == {"role": "user", "content": ANSWERED_LAST}
    assert replies.texts == ["好的", "好的"]
