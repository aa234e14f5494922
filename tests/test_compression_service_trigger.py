"""Background compression at turn end (R-TRIG), the back-off over many turns (R-BACK-3/4)
and the turn that starts a compression (issue 9), through real turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from nonebot_plugin_memsum.agent.events import (
    CompressionProgress,
    TurnEnded,
    TurnStarted,
    UsageEvent,
)
from nonebot_plugin_memsum.compression.service import (
    CLEARED,
    DIVIDER,
    USAGE_NAMESPACE,
)
from nonebot_plugin_memsum.types import Message, ToolCall
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    GROUP,
    IN_GROUP,
    NOTHING_KEPT,
    Env,
    Make,
    committing,
    conversation_of,
    due_usage,
    held_turn,
    seed,
    settle,
    summary_of,
    talk,
    until,
    usage,
)

# ---- R-TRIG: background compression at turn end ---------------------------------------------------------
# The chat model of these: window 10000 at compress_at 0.5 → E = min(5000, 10000 − 1024) = 5000.
TRIG: dict[str, Any] = {"chat": {"context_window": 10000}, "memsum_compress_at": 0.5}


def turn_usages(env: Env) -> list[UsageEvent]:
    events: list[UsageEvent] = []
    env.rt.bus.subscribe(UsageEvent, lambda e: events.append(e) if e.turn_id else None)
    return events


async def test_r_trig_3_usage_at_the_line_with_enough_compressible_compresses(make: Make) -> None:
    env = await make(**TRIG)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    usages = turn_usages(env)
    model.chat.append(Reply("好的", usage=usage(5000)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert usages[-1].usage == 5000
    assert 2 * usages[-1].untrimmed_history >= 5000
    assert len(model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]


async def test_r_trig_3_usage_under_the_line_does_not_compress(make: Make) -> None:
    env = await make(**TRIG)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    model.chat.append(Reply("好的", usage=usage(4999)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert model.summary_requests() == []


async def test_r_trig_3_small_compressible_part_does_not_compress(make: Make) -> None:
    env = await make(**TRIG)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    usages = turn_usages(env)
    model.chat.append(Reply("好的", usage=usage(9000)))  # persona and tools, not history
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert 2 * usages[-1].untrimmed_history < 5000
    assert model.summary_requests() == []


async def test_r_trig_3_a_turn_that_would_be_hard_trimmed_compresses_first(make: Make) -> None:
    # Trim budget ⌊0.3 × 10000⌋ − 1024 = 1976 = E. R-TRIG-3 would compress after the trimmed
    # turn; issue 9 runs that compression inside the turn, before its request, which then fits.
    env = await make(**TRIG, memsum_trim_ratio=0.3)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    usages = turn_usages(env)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert len(model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]
    assert not usages[-1].trimmed
    # Everything before the turn's question was summarised; the question (a turn through
    # api.run_turn marks none as asking: the newest user message) stays active and is sent.
    question = (await rt.store.get_history(GROUP.id))[0]
    assert question.content == talk(29, 120)
    assert usages[-1].untrimmed_history == question.tokens
    assert model.chat_requests()[-1]["messages"][-1] == {"role": "user", "content": talk(29, 120)}
    # R-TRIG-5: the turn's own end is not judged again (the session was compressed since it began).
    await settle(rt)
    assert len(model.summary_requests()) == 1


async def test_r_trig_3_trimmed_turn_beside_a_running_compression_is_sent_trimmed(make: Make) -> None:
    # A run still waiting on the model commits after the turn (R-TRIG-5): the next turn cannot
    # compress first, so it sends its trimmed request rather than wait for that run.
    env = await make(**TRIG, memsum_trim_ratio=0.3)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    usages = turn_usages(env)
    gate = model.hold_summary()
    manual = asyncio.ensure_future(rt.compression.compress(GROUP.id))
    await gate.reached()
    await seed(rt, 30, start=100, size=120)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    assert usages[-1].trimmed
    assert len(model.summary_requests()) == 1
    gate.open()
    await manual
    await settle(rt)
    assert env.phases() == [("start", None), ("done", None)]


@pytest.mark.parametrize(
    ("messages", "reply", "due"),
    [
        pytest.param(5, "好的", True, id="replied_counts_one_more"),
        pytest.param(5, "[不回复]", False, id="silent_record_not_counted"),
        pytest.param(4, "好的", False, id="under_the_line"),
    ],
)
async def test_r_trig_4_count_line(make: Make, messages: int, reply: str, due: bool) -> None:
    env = await make(memsum_history_limit=6)
    rt, model = env.rt, env.model
    await seed(rt, messages)
    model.chat.append(Reply(reply, usage=usage(100)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert len(model.summary_requests()) == int(due)


async def test_r_trig_4_count_line_from_the_session_setting(env: Env) -> None:
    rt, model = env.rt, env.model
    await rt.settings.set("history_limit", "session", GROUP.id, 4)
    await seed(rt, 3)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert len(model.summary_requests()) == 1


TOOL_ROUND = Reply(
    "", tool_calls=[{"id": "call_1", "name": "todo_write", "arguments": '{"items": []}'}], usage=usage(100)
)


@pytest.mark.parametrize(
    ("second", "outcome", "compressed"),
    [
        pytest.param(Reply(status=400, error="bad request"), "error", False, id="error_not_judged"),
        pytest.param(Reply("好的", usage=usage(100)), "replied", True, id="replied_judged"),
    ],
)
async def test_r_trig_2_failed_turn_is_not_judged(
    make: Make, second: Reply, outcome: str, compressed: bool
) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    model.chat.extend([TOOL_ROUND, second])  # the turn's first call is due by count
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == outcome
    await settle(rt)
    assert len(model.summary_requests()) == int(compressed)


async def test_r_trig_2_aborted_turn_is_not_judged(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    gate = model.gate(Reply("好的", usage=usage(100)))
    model.chat.extend([TOOL_ROUND, gate])
    ended: list[TurnEnded] = []
    rt.bus.subscribe(TurnEnded, ended.append)
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    await gate.reached()
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    await settle(rt)
    assert [e.outcome for e in ended] == ["aborted"]
    assert model.summary_requests() == []


async def test_r_trig_5_snapshot_and_left_over_usage_are_not_judged(env: Env) -> None:
    rt, model = env.rt, env.model
    bus = rt.bus
    await seed(rt, 3)
    # A snapshot only: never judged.
    await bus.emit(TurnStarted("t1", GROUP.id))
    await bus.emit(due_usage(None))
    await bus.emit(TurnEnded("t1", GROUP.id, "replied"))
    # A usage left over from t2 is not t3's.
    await bus.emit(TurnStarted("t2", GROUP.id))
    await bus.emit(TurnEnded("t2", GROUP.id, "error"))
    await bus.emit(due_usage("t2"))
    await bus.emit(TurnStarted("t3", GROUP.id))
    await bus.emit(TurnEnded("t3", GROUP.id, "replied"))
    await settle(rt)
    assert model.summary_requests() == []
    # The same usage with its own turn id is judged (the control).
    await bus.emit(TurnStarted("t4", GROUP.id))
    await bus.emit(due_usage("t4"))
    await bus.emit(TurnEnded("t4", GROUP.id, "replied"))
    await settle(rt)
    assert len(model.summary_requests()) == 1


async def test_r_trig_5_not_judged_after_a_compression_since_the_turn_started(env: Env) -> None:
    rt, model = env.rt, env.model
    bus = rt.bus
    await seed(rt, 3)
    await bus.emit(TurnStarted("t1", GROUP.id))
    await rt.compression.compress(GROUP.id)
    await seed(rt, 3, start=3)
    await bus.emit(due_usage("t1"))
    await bus.emit(TurnEnded("t1", GROUP.id, "replied"))
    await settle(rt)
    assert len(model.summary_requests()) == 1  # the manual one only


async def test_r_trig_5_not_judged_after_a_clear_since_the_turn_started(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    turn, gate = await held_turn(env, Reply("好的", usage=usage(100)))
    await rt.compression.clear(GROUP.id, "context")
    await seed(rt, 3, start=3)
    gate.open()
    # the answer to what was cleared is not sent (R-MEM-2); the turn's usage is still not judged
    assert await turn == "silent"
    await settle(rt)
    assert model.summary_requests() == []


async def test_r_trig_5_background_commit_waits_for_the_running_turn(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    summary_gate = model.hold_summary()
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"  # due: background starts
    await summary_gate.reached()
    second, chat_gate = await held_turn(env, Reply("第二轮的回答", usage=usage(100)))
    in_turn_at_done: list[bool] = []
    rt.bus.subscribe(
        CompressionProgress,
        lambda p: in_turn_at_done.append(rt.agent.in_turn(GROUP.id)) if p.phase == "done" else None,
    )
    summary_gate.open()
    await committing(rt)
    history = await rt.store.get_history(GROUP.id)
    assert await summary_of(rt) is None
    assert DIVIDER not in [m.content for m in history]
    chat_gate.open()
    assert await second == "replied"
    await settle(rt)
    assert in_turn_at_done == [False]
    active = await rt.store.get_history(GROUP.id)
    # The second turn's reply is after the cut; the divider comes after it.
    assert [m.content for m in active] == ["第二轮的回答", DIVIDER]


# ---- R-BACK-3/4: the back-off over many turns ------------------------------------------------------
FAIL = Reply(status=500, error="summariser down", headers={"Retry-After": "0"})


async def drive(
    env: Env, turns: int, starts: list[int], *, before: Callable[[int], Any] | None = None
) -> None:
    """`turns` turns, each due by count; the numbers of the turns whose end started a run go to `starts`."""
    rt = env.rt
    first = len(await rt.store.get_history(GROUP.id)) + 1000
    for n in range(1, turns + 1):
        if before is not None:
            await before(n)
        await seed(rt, 1, start=first + n)
        seen = len(env.phases())
        await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
        await settle(rt)
        if ("start", None) in env.phases()[seen:]:
            starts.append(n)


async def test_r_back_3_retries_at_2_4_8_16_32_then_every_32(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    env.model.summary_default = FAIL
    starts: list[int] = []
    await drive(env, 96, starts)
    # First failure at turn 1; then 2, 4, 8, 16, 32, 32 judged turns later.
    assert starts == [1, 3, 7, 15, 31, 63, 95]
    assert [p for p, _ in env.phases()] == ["start", "error"] * 7
    status = await env.rt.compression.status(GROUP.id)
    assert status.backoff_failures == 7


async def test_r_back_4_success_forgets_the_back_off(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    model = env.model
    model.summary_default = FAIL
    starts: list[int] = []

    async def before(n: int) -> None:
        # Succeed once at the third attempt (turn 7), fail again afterwards.
        model.summary_default = Reply(NOTHING_KEPT) if n == 7 else FAIL

    await drive(env, 12, starts, before=before)
    assert starts == [1, 3, 7, 8, 10]
    assert [p for p, _ in env.phases()] == ["start", "error", "start", "error", "start", "done"] + [
        "start",
        "error",
    ] * 2


async def test_r_back_4_clear_forgets_the_back_off(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    env.model.summary_default = FAIL
    starts: list[int] = []

    async def before(n: int) -> None:
        if n == 2:
            await env.rt.compression.clear(GROUP.id, "context")

    await drive(env, 3, starts, before=before)
    assert starts == [1, 2]  # no wait of 2 after the clear


async def test_r_back_4_run_cancelled_by_a_clear_is_no_failure(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 2)
    gate = model.hold_summary()
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)  # due: the background run waits on the model
    await gate.reached()
    await rt.compression.clear(GROUP.id, "context")
    await settle(rt)
    assert env.phases() == [("start", None), ("error", CLEARED)]
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 0
    await seed(rt, 1, start=10)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)  # due again: runs at once
    await settle(rt)
    assert [p for p, _ in env.phases()] == ["start", "error", "start", "done"]
    gate.open()


# ---- issue 9: no hard trim on the turn that starts a compression ----------------------------------
async def test_no_turn_is_hard_trimmed_when_the_history_grows_past_the_trim_budget_between_turns(
    make: Make,
) -> None:
    # Window 8000: trim budget 8000 − 1024 = 6976, line E = 6400; between two turns the history
    # grows by about 1500 tokens, more than the 576 between E and the trim budget, so some
    # turns find their request over the trim budget: they compress before sending it.
    env = await make(chat={"context_window": 8000})
    env.model.chat_default = Reply("好的", usage=None)  # the usage is the plugin's own estimate
    events: list[UsageEvent] = []
    env.rt.bus.subscribe(UsageEvent, events.append)
    in_turn = 0
    for n in range(40):
        await seed(env.rt, 20, start=100 * n, size=60)
        seen = len(env.phases())
        await env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
        in_turn += ("start", None) in env.phases()[seen:]
        await settle(env.rt)
    judged = [e for e in events if e.turn_id is not None]
    assert env.phases().count(("start", None)) >= 2
    assert in_turn >= 1
    assert [e for e in judged if e.trimmed] == []
    assert all(e.line == 6400 and e.trim_budget == 6976 for e in judged)
    assert env.phases().count(("done", None)) == env.phases().count(("start", None))


# ---- issue 9: the in-turn run keeps the turn's question out of its span ---------------------------
async def record(env: Env, content: str, role: str = "user", **fields: Any) -> Message:
    return await env.rt.agent.record(GROUP, Message(role=role, content=content, ts=3000.0, **fields))  # type: ignore[arg-type]


def sent(env: Env) -> list[dict[str, Any]]:
    """The conversation of the last chat request (system parts left out)."""
    return [m for m in env.model.chat_requests()[-1]["messages"] if m["role"] != "system"]


async def test_r_run_1_in_turn_run_ends_before_the_earliest_unanswered_question(make: Make) -> None:
    # Trim budget 1976 = E (as above). An answered question is archived with the rest; the two
    # unanswered ones and the chatter between and after them stay active and are sent verbatim.
    env = await make(**TRIG, memsum_trim_ratio=0.3)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    answered = await record(env, "@小助手 上周的问题", addressed=True)
    assert answered.id is not None
    await rt.store.mark_reply(GROUP.id, answered.id, "sent")  # what a turn's answer writes
    await seed(rt, 3, start=50, size=20)
    first = await record(env, "@小助手 第一个问题", addressed=True)
    between = await record(env, "[路人(3)] 插一句")
    second = await record(env, "@小助手 第二个问题", addressed=True)
    after = await record(env, "[路人(3)] 又一句")
    usages = turn_usages(env)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    assert env.phases() == [("start", None), ("done", None)]
    [request] = model.summary_requests()
    span = conversation_of(request)
    assert talk(29, 120) in span
    assert answered.content in span
    assert talk(52, 20) in span
    assert all(m.content not in span for m in (first, between, second, after))
    tail = [first, between, second, after]
    assert sent(env) == [{"role": "user", "content": m.content} for m in tail]
    assert not usages[-1].trimmed
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active if m.is_conversation][:4] == [m.id for m in tail]  # R-BACK-2 counted them


async def test_r_run_1_in_turn_run_never_splits_a_tool_group_around_the_question(make: Make) -> None:
    # The question came in between a tool call and its result (R-RUN-2: a message inside a
    # group): the cut moves before the group's assistant message, so the call, the question
    # and the result all stay active and go out as one valid request: the group whole, the
    # question after it (providers refuse anything between a call and its results;
    # tests/test_audit10_sc.py).
    env = await make(**TRIG, memsum_trim_ratio=0.3)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    call = ToolCall("call_9", "todo_write", '{"items": []}')
    head = await record(env, "", role="assistant", tool_calls=(call,))
    question = await record(env, "@小助手 查完了吗", addressed=True)
    result = await record(env, "已写入 0 项", role="tool", tool_call_id="call_9", name="todo_write")
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    assert env.phases() == [("start", None), ("done", None)]
    [request] = model.summary_requests()
    assert talk(29, 120) in conversation_of(request)
    assert "todo_write" not in conversation_of(request)
    assert question.content not in conversation_of(request)
    active = [m.id for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert active[:3] == [head.id, question.id, result.id]
    roles = [(m["role"], m.get("tool_call_id"), bool(m.get("tool_calls"))) for m in sent(env)]
    assert roles[:3] == [("assistant", None, True), ("tool", "call_9", False), ("user", None, False)]


async def test_r_trig_3_nothing_compressible_before_the_question_no_in_turn_run(make: Make) -> None:
    # The question is old and the talk after it long: what lies before it is under E / 2,
    # so the turn does not compress; it is sent hard-trimmed and its end is judged as R-TRIG-3
    # says, and that background run keeps R-RUN-1's cut: the whole snapshot, question included.
    env = await make(**TRIG, memsum_trim_ratio=0.3)
    rt, model = env.rt, env.model
    await seed(rt, 2, size=20)
    question = await record(env, "@小助手 一个老问题", addressed=True)
    await seed(rt, 30, start=100, size=120)
    usages = turn_usages(env)
    started_in_turn: list[bool] = []
    rt.bus.subscribe(
        CompressionProgress,
        lambda p: started_in_turn.append(rt.agent.in_turn(GROUP.id)) if p.phase == "start" else None,
    )
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    assert usages[-1].trimmed
    await settle(rt)
    assert started_in_turn == [False]  # one run, after the turn
    [request] = model.summary_requests()
    span = conversation_of(request)
    assert question.content in span
    assert talk(129, 120) in span
    assert [m.role for m in await rt.store.get_history(GROUP.id) if m.is_conversation] == []


# ---- issue 9: the latest usage is written in batches, not once per model call ------------------------
async def test_r_trig_1_latest_usage_waits_in_memory_is_written_together_and_a_clear_drops_it(
    make: Make,
) -> None:
    env = await make()
    rt = env.rt
    await seed(rt, 3)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    assert await rt.store.get_meta(USAGE_NAMESPACE, GROUP.id) is None  # no write per model call
    assert (await rt.compression.status(GROUP.id)).usage == 100  # the budget's line knows it already
    service = rt.compression  # the timer's write, within USAGE_WRITE_DELAY
    await until(lambda: service._usage_timer is None and not service._usage_writes, "the usage was written")
    assert ((await rt.store.get_meta(USAGE_NAMESPACE, GROUP.id)) or {}).get("usage") == 100
    # A usage still waiting when the session is cleared is never written after the clear (R-MEM-2).
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await rt.compression.clear(GROUP.id, "context")
    await rt.compression.write_usage()
    assert await rt.store.get_meta(USAGE_NAMESPACE, GROUP.id) is None
    # What waits at shutdown is written before the store closes (a restart shows it).
    await seed(rt, 3, start=50)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await rt.compression.shutdown()
    assert ((await rt.store.get_meta(USAGE_NAMESPACE, GROUP.id)) or {}).get("usage") == 100
