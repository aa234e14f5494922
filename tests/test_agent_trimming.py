"""Count trimming and hard trimming through real turns: the requests the server recorded
are compared message by message with what the rules keep."""

from __future__ import annotations

import json
import random

from hypothesis import given
from hypothesis import strategies as st

from nonebot_plugin_memsum.agent.prompt import hard_trim, safe_start
from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm.tokens import (
    estimate_msg_tokens,
)
from nonebot_plugin_memsum.types import Message, ToolCall
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
    openai_user,
    system_tokens,
    tools_tokens,
    user,
)
from tests.fakes.llm_server import Reply, ScriptedLLM

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
