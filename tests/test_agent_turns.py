"""The chat agent's turns in process: outcomes, one turn at a time per session, and
regressions. A private runtime from `runtime.build` on a real SQLite file talks real
HTTP to the scripted model server; slow replies are a gate the test opens, never a sleep.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import TurnEnded
from nonebot_plugin_memsum.agent.prompt import ANSWERED_LAST
from nonebot_plugin_memsum.agent.tools import ToolContext
from nonebot_plugin_memsum.agent.turn import SILENT_RECORD, Entry
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import SessionRecord
from tests.fakes.agent import (
    GROUP,
    GROUP_ENTRY,
    PERSONA,
    Events,
    MakeRuntime,
    Replies,
    chat_requests,
    fill,
    is_chat,
    openai_user,
    tool_call,
    user,
)
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured

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


# ---- memory (issue 15) ----------------------------------------------------------------


async def test_stored_and_compressed_texts_stay_out_of_the_estimate_cache(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    # Each stored message keeps its estimate (Message.tokens) and a compression's units are
    # rendered for that run only: put in the shared cache, such one-off texts filled it for
    # minutes at a thousand groups and pushed out what every turn estimates again.
    from nonebot_plugin_memsum.llm.tokens import estimate_cache

    rt = await make_rt()
    said = [user(f"第{i}句：今天的天气怎么样，周末去哪里玩") for i in range(30)]
    stored = await fill(rt, GROUP, said)
    assert all(m.tokens is not None for m in stored)
    llm.push(Reply("周末去爬山吧"))
    await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY)
    assert (await rt.compression.compress(GROUP.id)).outcome == "done"
    cache = estimate_cache()
    for m in [*said, *stored]:
        assert cache.get(m.content) is None, m.content
    assert cache.get("周末去爬山吧") is None  # the answer was stored the same way
    # What comes back every turn is kept: the persona, here.
    assert cache.get(PERSONA) is not None
