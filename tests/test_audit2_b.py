"""A second outside audit of R-TRIG, R-BACK, R-PROG and R-FAIL, written from the Chinese
original and run through real paths: real turns of the built-in agent, a private runtime on
a real SQLite file, the real HTTP client against the scripted OpenAI-compatible server.
Each scenario is one the earlier tests (tests/test_audit_a.py, tests/test_audit_b.py and the
service tests) do not already check: boundaries, the judged call of a tool turn, hysteresis
over several turns, what counts towards the back-off, the in-turn run's back-off, what a
progress subscriber sees, and what a failure leaves behind."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from nonebot_plugin_memsum.agent.events import CompressionProgress, TurnEnded
from nonebot_plugin_memsum.compression.request import EMPTY_SUMMARY
from nonebot_plugin_memsum.compression.service import BUSY, DIVIDER
from nonebot_plugin_memsum.compression.trigger import UsageFacts, compression_due, usage_due
from nonebot_plugin_memsum.errors import CompressionError
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    NOTHING_KEPT,
    OLD_SUMMARY,
    Env,
    Make,
    held_compression,
    keeping,
    seed,
    settle,
    summary_of,
    usage,
)

# The chat model: window 10000 at compress_at 0.5 → E = min(5000, 10000 − 1024) = 5000.
TRIG: dict[str, Any] = {"chat": {"context_window": 10000}, "memsum_compress_at": 0.5}
# The same with trim ratio 0.3: trim budget ⌊0.3 × 10000⌋ − 1024 = 1976 = E; 30 lines of
# ~130 characters are over it, so every turn would be hard-trimmed.
IN_TURN: dict[str, Any] = {**TRIG, "memsum_trim_ratio": 0.3}
FAIL = Reply(status=500, error="summariser down", headers={"Retry-After": "0"})
TOOL_CALL = {"id": "call_1", "name": "todo_write", "arguments": '{"items": []}'}
PRIVATE = SessionRecord(
    id="onebot:private:20002", platform="onebot", kind="private", peer="20002", room_class="direct"
)


def starts(env: Env, since: int = 0) -> int:
    """How many runs began (progress `start`) after the first `since` progress events."""
    return sum(1 for p, _ in env.phases()[since:] if p == "start")


async def one_turn(env: Env, *script: Reply, line: int | None = None) -> int:
    """One turn after one more member's line, answered by `script` (the chat model's replies
    in order; by default a plain answer); how many runs began during it or at its end."""
    rt = env.rt
    if line is None:
        line = 7000 + len(env.model.chat_requests())
    await seed(rt, 1, start=line)
    env.model.chat.extend(script)
    seen = len(env.phases())
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    return starts(env, seen)


# ---- R-TRIG-3: the usage line at its exact boundaries ---------------------------------------------
FACTS = UsageFacts(
    turn_id="t",
    usage=0,
    window=10001,
    trim_budget=9000,
    trimmed=False,
    untrimmed_history=4000,
    history_messages=1,
    history_limit=None,
    platform="onebot",
    platform_type="group",
)


@pytest.mark.parametrize(
    ("compress_at", "window", "trim_budget", "used", "compressible", "due"),
    [
        # E = 0.5 × 10001 = 5000.5: usage must reach it, so 5000 is one token under.
        pytest.param(0.5, 10001, 9000, 5000, 4000, False, id="one_under_a_fractional_line"),
        pytest.param(0.5, 10001, 9000, 5001, 4000, True, id="first_token_over_a_fractional_line"),
        # E / 2 = 2500.25: 2500 compressible tokens are not half the line, 2501 are.
        pytest.param(0.5, 10001, 9000, 5001, 2500, False, id="compressible_one_under_half"),
        pytest.param(0.5, 10001, 9000, 5001, 2501, True, id="compressible_at_half"),
        # The setting is the decimal it reads as: 0.7 × 10000 is 7000, not 6999.999….
        pytest.param(0.7, 10000, 9000, 6999, 4000, False, id="decimal_setting_one_under"),
        pytest.param(0.7, 10000, 9000, 7000, 4000, True, id="decimal_setting_at_the_line"),
        # The trim budget is the smaller: E = 6000 whatever compress_at × window says.
        pytest.param(1, 10000, 6000, 6000, 3000, True, id="trim_budget_line_exactly"),
        pytest.param(1, 10000, 6000, 5999, 3000, False, id="trim_budget_line_one_under"),
    ],
)
def test_r_trig_3_usage_line_boundaries(
    compress_at: float, window: int, trim_budget: int, used: int, compressible: int, due: bool
) -> None:
    facts = replace(FACTS, usage=used, window=window, trim_budget=trim_budget, untrimmed_history=compressible)
    assert usage_due(facts, compress_at) is due
    assert compression_due(facts, compress_at, "replied") is due  # no count line: the usage decides


# ---- R-TRIG-1/2: a tool turn is judged on its last call's usage ----------------------------------
@pytest.mark.parametrize(
    ("first", "last", "due"),
    [
        # The first call was over the line (5000), the last one under it: not due.
        pytest.param(6000, 100, False, id="first_over_last_under"),
        # The first call was far under, the last one exactly at E: due.
        pytest.param(100, 5000, True, id="first_under_last_at_the_line"),
    ],
)
async def test_r_trig_2_a_tool_turn_is_judged_on_its_last_calls_usage(
    make: Make, first: int, last: int, due: bool
) -> None:
    env = await make(**TRIG)
    await seed(env.rt, 30, size=120)  # the compressible part is well over E / 2
    ran = await one_turn(
        env,
        Reply("", tool_calls=[TOOL_CALL], usage=usage(first)),
        Reply("好的", usage=usage(last)),
    )
    assert len(env.model.chat_requests()) == 2
    assert ran == int(due)
    assert len(env.model.summary_requests()) == int(due)


# ---- R-TRIG-4: the count at turn end with the turn's tool call and result ------------------------
@pytest.mark.parametrize(("limit", "due"), [(6, True), (7, False)])
async def test_r_trig_4_the_turns_tool_call_result_and_reply_count_at_the_line(
    make: Make, limit: int, due: bool
) -> None:
    # 3 lines + the assistant's tool call + its result + the final reply = 6 at turn end.
    env = await make(memsum_history_limit=limit)
    await seed(env.rt, 2)  # one_turn adds the third
    ran = await one_turn(env, Reply("", tool_calls=[TOOL_CALL], usage=usage(100)), Reply("好的"))
    assert ran == int(due)


# ---- R-TRIG-5: only a compression that succeeded since the turn began stops its judgement ------------
async def test_r_trig_5_a_manual_run_that_failed_during_the_turn_does_not_stop_its_end_being_judged(
    make: Make,
) -> None:
    env = await make(memsum_history_limit=2)  # every turn is due by count
    rt, model = env.rt, env.model
    await seed(rt, 2)
    gate = model.gate(Reply("好的", usage=usage(100)))
    model.chat.append(gate)
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    with gate:
        await gate.reached()
        model.summary_default = FAIL
        with pytest.raises(CompressionError):
            await rt.compression.compress(GROUP.id)  # a /压缩 during the turn: the model fails
        model.summary_default = Reply(NOTHING_KEPT)
    assert await turn == "replied"
    await settle(rt)
    # Nothing was compressed since the turn began, and a manual failure is no background
    # failure (R-BACK-3 backs off the background only): the turn's end starts a run.
    assert [p for p, _ in env.phases()] == ["start", "error", "start", "done"]
    assert (await summary_of(rt) or {}).get("text") == CHAT_SUMMARY


# ---- 回差 (R-BACK intro, R-BACK-1): a session left over the line by what cannot be compressed ---------
async def test_r_back_1_a_session_still_over_the_line_after_its_compression_is_not_compressed_again(
    make: Make,
) -> None:
    # The model reports 6000 prompt tokens every turn (persona, tools: over E = 5000 whatever
    # the history). After the first compression the compressible part is the kept originals
    # and the newer lines, far under E / 2: the next turns must not run again and again.
    env = await make(**TRIG)
    rt = env.rt
    lines = await seed(rt, 30, size=120)
    env.model.summary.append(keeping(lines[-1].content, lines[-2].content))
    assert await one_turn(env, Reply("好的", usage=usage(6000))) == 1
    assert (await rt.compression.status(GROUP.id)).kept_messages >= 1
    for _ in range(4):
        assert await one_turn(env, Reply("好的", usage=usage(6000))) == 0
    assert len(env.model.summary_requests()) == 1


async def test_r_back_2_after_a_count_compression_the_next_run_waits_until_the_count_reaches_the_line(
    make: Make,
) -> None:
    # Count line 10. The summariser asks to keep every offered line; the count rule leaves
    # at most ⌊10 / 2⌋ = 5 active. Each later turn adds a line and a reply: the session is due
    # again exactly when kept + 2k reaches 10, not one turn earlier.
    env = await make(memsum_summary_budget_ratio=0.5, memsum_history_limit=10)
    rt = env.rt
    await seed(rt, 8, size=2)
    env.model.summary.append(keeping("第"))
    assert await one_turn(env) == 1  # 9 lines + the reply = 10
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    kept = len(active)
    assert kept <= 5
    assert (await rt.compression.status(GROUP.id)).kept_messages == kept
    k = 0
    while True:
        k += 1
        ran = await one_turn(env)
        if kept + 2 * k >= 10:
            assert ran == 1, (kept, k)
            break
        assert ran == 0, (kept, k)
    assert k >= 3  # at least two turns went by without a run


# ---- R-BACK-3: what counts as a judged turn ------------------------------------------------------
async def test_r_back_3_failed_and_aborted_turns_do_not_count_towards_the_wait_silent_ones_do(
    make: Make,
) -> None:
    env = await make(memsum_history_limit=2)  # every turn is due by count
    rt, model = env.rt, env.model
    model.summary_default = FAIL
    await seed(rt, 2)
    assert await one_turn(env) == 1  # the 1st failure: wait 2 judged turns
    # A turn whose model fails (R-TRIG-2: not judged).
    assert await one_turn(env, Reply(status=400, error="bad request")) == 0
    # An aborted turn (cancelled while the model thinks): not judged either.
    gate = model.gate(Reply("好的", usage=usage(100)))
    model.chat.append(gate)
    ended: list[str] = []
    rt.bus.subscribe(TurnEnded, lambda e: ended.append(e.outcome))
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    with gate:
        await gate.reached()
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
    await settle(rt)
    assert ended == ["aborted"]
    assert (await rt.compression.status(GROUP.id)).backoff_turns_left == 2
    # A silent turn is judged: the 1st of the 2; the next judged turn is the 2nd, retried.
    assert await one_turn(env, Reply("[不回复]", usage=usage(100))) == 0
    assert await one_turn(env) == 1
    status = await rt.compression.status(GROUP.id)
    assert status.backoff_failures == 2
    assert status.backoff_turns_left == 4


async def test_r_back_3_the_count_line_and_the_usage_line_share_one_back_off(make: Make) -> None:
    env = await make(**TRIG)
    rt, model = env.rt, env.model
    model.summary_default = FAIL
    await rt.settings.set("history_limit", "session", GROUP.id, 2)
    await seed(rt, 30, size=120)
    assert await one_turn(env) == 1  # due by count (usage 100): fails, wait 2
    await rt.settings.set("history_limit", "session", GROUP.id, 0)  # from now on the usage line only
    assert await one_turn(env, Reply("好的", usage=usage(5000))) == 0  # due by usage: judged turn 1
    assert await one_turn(env, Reply("好的", usage=usage(5000))) == 1  # judged turn 2: retried
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 2


async def test_r_back_3_a_failed_in_turn_run_backs_off_like_a_background_one(make: Make) -> None:
    # Every turn here would be hard-trimmed, so a turn compresses before its request when it
    # may (the README's in-turn run, the same run R-TRIG-3 starts after a trimmed turn). Its
    # failure is the 1st: the turn's own end is judged turn 1 (no second attempt in the same
    # turn), the next turn's end judged turn 2 (retried: the 2nd failure), then 4 judged turns.
    env = await make(**IN_TURN)
    rt = env.rt
    env.model.summary_default = FAIL
    await seed(rt, 30, size=120)
    assert [await one_turn(env) for _ in range(7)] == [1, 1, 0, 0, 0, 1, 0]
    assert [p for p, _ in env.phases()] == ["start", "error"] * 3
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 3
    # R-FAIL-3: three failures lost nothing; every line and every answer is still active.
    active = await rt.store.get_history(GROUP.id)
    assert all(m.is_conversation for m in active)
    assert len(active) == 30 + 7 * 2
    assert await rt.store.get_archived(GROUP.id) == []


# ---- R-PROG-1: what a progress subscriber sees -------------------------------------------------------
async def test_r_prog_1_start_sees_the_old_state_done_the_committed_one_error_the_old_one(env: Env) -> None:
    # 「压成才报 done（界面据此插「对话已压缩」）」: at `done` the new summary and the divider are
    # there to read; at `start` nothing has changed yet; at `error` the old state is back.
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 4)
    seen: list[tuple[str, str | None, list[str]]] = []

    async def look(event: CompressionProgress) -> None:
        record = await summary_of(rt) or {}
        history = [m.content for m in await rt.store.get_history(GROUP.id)]
        seen.append((event.phase, record.get("text"), history))

    rt.bus.subscribe(CompressionProgress, look)
    first = [m.content for m in await rt.store.get_history(GROUP.id)]
    await rt.compression.compress(GROUP.id)
    assert seen == [("start", OLD_SUMMARY["text"], first), ("done", CHAT_SUMMARY, [DIVIDER])]
    await seed(rt, 3, start=10)
    second = [m.content for m in await rt.store.get_history(GROUP.id)]
    model.summary_default = Reply(status=400, error="bad request")
    with pytest.raises(CompressionError):
        await rt.compression.compress(GROUP.id)
    assert seen[2:] == [("start", CHAT_SUMMARY, second), ("error", CHAT_SUMMARY, second)]


# ---- R-PROG-2: nothing to summarise --------------------------------------------------------------
async def test_r_prog_2_a_history_of_only_an_unfinished_tool_call_does_nothing_without_events(
    env: Env,
) -> None:
    # The cut point moves before the unfinished group (R-RUN-1): the span holds only the
    # divider of an earlier run, so there is no conversation to summarise.
    rt = env.rt
    await rt.store.append(GROUP.id, Message(role="system", content=DIVIDER, event_marker=True, ts=1.0))
    call = await rt.agent.record(
        GROUP,
        Message(role="assistant", content="", tool_calls=(ToolCall("c9", "clock", "{}"),), ts=2.0),
    )
    result = await rt.compression.compress(GROUP.id)
    assert result.outcome == "nothing"
    assert env.progress == []
    assert env.model.summary_requests() == []
    assert [m.id for m in await rt.store.get_history(GROUP.id)][-1] == call.id


# ---- R-PROG-3: one run per session, not one run in all ---------------------------------------------
async def test_r_prog_3_a_manual_run_is_refused_while_the_background_run_of_the_session_waits(
    make: Make,
) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 2)
    gate = model.hold_summary()
    with gate:
        await seed(rt, 1, start=10)
        assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
        await gate.reached()  # due: its background run now waits on the model
        assert (await rt.compression.status(GROUP.id)).running
        with pytest.raises(CompressionError) as refused:
            await rt.compression.compress(GROUP.id)
        assert refused.value.reason == BUSY == "这个会话正在压缩"
        assert env.phases() == [("start", None)]  # the refusal reports nothing
    await settle(rt)
    assert env.phases() == [("start", None), ("done", None)]
    assert len(model.summary_requests()) == 1


async def test_r_prog_3_another_session_compresses_while_one_run_waits_on_the_model(env: Env) -> None:
    rt = env.rt
    await seed(rt, 3)
    await seed(rt, 3, record=PRIVATE, start=50)
    run, gate = await held_compression(env)
    with gate:
        other = await rt.compression.compress(PRIVATE.id)  # not refused, not held up
        assert other.outcome == "done"
        assert env.phases(PRIVATE.id) == [("start", None), ("done", None)]
        assert env.phases() == [("start", None)]
    assert (await run).outcome == "done"
    assert env.phases() == [("start", None), ("done", None)]


# ---- R-FAIL-1 / R-FAIL-3: what a failure leaves ---------------------------------------------------
@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(""), id="nothing_at_all"),
        pytest.param(Reply("  \n\n \n"), id="only_blank_lines"),
        pytest.param(Reply("【保留原文】无"), id="only_the_block"),
        pytest.param(Reply("\n## 【保留原文】\n无\n\n"), id="only_a_block_with_blank_lines"),
    ],
)
async def test_r_fail_1_an_empty_summary_fails_and_leaves_everything(env: Env, reply: Reply) -> None:
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 4)
    before = await rt.store.get_history(GROUP.id)
    model.summary_default = reply
    with pytest.raises(CompressionError) as failed:
        await rt.compression.compress(GROUP.id)
    assert failed.value.reason == EMPTY_SUMMARY
    assert await summary_of(rt) == OLD_SUMMARY
    assert await rt.store.get_history(GROUP.id) == before
    assert env.phases() == [("start", None), ("error", EMPTY_SUMMARY)]
    assert len(env.failure_warnings()) == 1


async def test_r_fail_3_a_failure_after_a_compression_keeps_its_summary_kept_originals_and_archive(
    make: Make,
) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    short = await seed(rt, 3, size=2)
    await seed(rt, 2, start=3, size=300)
    model.summary.append(keeping(short[1].content, short[2].content))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 2
    record = await summary_of(rt)
    archived = await rt.store.get_archived(GROUP.id)
    await seed(rt, 3, start=10, size=300)
    before = await rt.store.get_history(GROUP.id)
    model.summary_default = FAIL
    with pytest.raises(CompressionError) as failed:
        await rt.compression.compress(GROUP.id)
    assert await summary_of(rt) == record  # the summary and its count of kept originals
    assert await rt.store.get_history(GROUP.id) == before  # kept originals, divider, new lines
    assert await rt.store.get_archived(GROUP.id) == archived
    status = await rt.compression.status(GROUP.id)
    assert status.kept_messages == 2
    assert status.last_run is not None
    assert (status.last_run.outcome, status.last_run.reason) == ("error", failed.value.reason)
    # The prompt still carries the summary, then the kept originals and the newer lines.
    prompt = await rt.agent.build_prompt(GROUP.id, IN_GROUP)
    users = [m["content"] for m in prompt.messages if m["role"] == "user"]
    assert users == [m.content for m in before if m.role == "user"]
    assert any(CHAT_SUMMARY in str(m["content"]) for m in prompt.messages if m["role"] == "system")


async def test_r_fail_3_a_run_abandoned_by_its_caller_leaves_everything_and_the_session_free(
    env: Env,
) -> None:
    # Another plugin waits at most a second for api.compress (asyncio.wait_for): the run is
    # abandoned while the model thinks. Nothing may be written, and the session must not stay
    # "being compressed" (R-PROG-3 would refuse every later /压缩).
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 4)
    before = await rt.store.get_history(GROUP.id)
    gate = model.hold_summary()
    with gate:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(rt.compression.compress(GROUP.id), 1.0)
        assert not (await rt.compression.status(GROUP.id)).running
        assert await summary_of(rt) == OLD_SUMMARY
        assert await rt.store.get_history(GROUP.id) == before
    assert not [p for p, _ in env.phases() if p == "done"]
    assert (await rt.compression.compress(GROUP.id)).outcome == "done"
    assert env.phases()[-2:] == [("start", None), ("done", None)]


# ---- R-BACK-2: half the count line, rounded down, counting no event marker after the cut ----------
async def test_r_back_2_an_odd_line_halves_down_and_a_marker_after_the_cut_is_not_counted(make: Make) -> None:
    # Count line 7 → ⌊7 / 2⌋ = 3. While the model thinks, one member's line and a silent turn's
    # record (an event marker) arrive after the cut: 3 − 1 = 2 of the 4 lines asked for stay,
    # the earliest going first. Rounding up (4) would keep 3; counting the marker, 1.
    env = await make(memsum_summary_budget_ratio=0.5, memsum_history_limit=7)
    rt = env.rt
    short = await seed(rt, 4, size=2)
    await seed(rt, 3, start=4, size=200)
    run, gate = await held_compression(env, keeping(*(m.content for m in short)))
    late = await seed(rt, 1, start=20)
    await rt.store.append(
        GROUP.id, Message(role="system", content="（助手本轮选择不回复）", event_marker=True, ts=2000.0)
    )
    gate.open()
    result = await run
    assert result.kept_messages == 2
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [short[2].id, short[3].id, late[0].id]


# ---- R-PROG-3: two manual runs of one session at the same instant ----------------------------------
async def test_r_prog_3_two_manual_runs_started_together_one_runs_the_other_is_refused(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    gate = env.model.hold_summary()
    with gate:
        first = asyncio.ensure_future(rt.compression.compress(GROUP.id))  # /压缩 in the chat
        second = asyncio.ensure_future(rt.compression.compress(GROUP.id))  # 立即压缩 on the web page
        done, _ = await asyncio.wait({first, second}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        (refused,) = done
        with pytest.raises(CompressionError) as busy:
            refused.result()
        assert busy.value.reason == BUSY
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert [getattr(r, "outcome", None) for r in results].count("done") == 1
    assert len(env.model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]


# ---- R-FAIL-1: a provider that reports no finish reason --------------------------------------------
async def test_r_fail_1_without_a_finish_reason_the_summary_is_taken(env: Env) -> None:
    # 「服务商不报结束原因时查不出」: a reply whose stream carries no finish reason is no
    # stop at the output limit; the run succeeds.
    rt = env.rt
    await seed(rt, 4)
    env.model.summary_default = Reply(NOTHING_KEPT, finish_reason=None)
    result = await rt.compression.compress(GROUP.id)
    assert result.outcome == "done"
    assert (await summary_of(rt) or {}).get("text") == CHAT_SUMMARY
    assert env.phases() == [("start", None), ("done", None)]


# ---- R-PROG-1 / R-FAIL-1: a run that ends unfinished reports `error` --------------------------------
async def test_r_prog_1_an_in_turn_run_stopped_with_the_bot_reports_error_and_leaves_everything(
    make: Make,
) -> None:
    # The bot stops while a turn's own compression (every turn here would be hard-trimmed)
    # waits on the model: the turn is aborted, and its run with it. The run did not succeed,
    # so after its `start` comes `error` (「压成才报 done」; every other end is `error`), with
    # one warning and nothing written.
    env = await make(**IN_TURN)
    rt = env.rt
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 30, size=120)
    before = await rt.store.get_history(GROUP.id)
    gate = env.model.hold_summary()
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    with gate:
        await gate.reached()
        env.warnings.clear()
        turn.cancel()  # as Agent.shutdown aborts the running turns, before the compression stops
        with pytest.raises(asyncio.CancelledError):
            await turn
    assert [p for p, _ in env.phases()] == ["start", "error"]
    assert len(env.failure_warnings()) == 1
    assert await summary_of(rt) == OLD_SUMMARY
    assert await rt.store.get_history(GROUP.id) == before
    assert not rt.compression.is_running(GROUP.id)


async def test_r_prog_1_a_run_abandoned_by_its_caller_reports_error(env: Env) -> None:
    # Another plugin gives api.compress one second (asyncio.wait_for): the run is cancelled
    # while the model thinks. Its `start` must not stay without an end.
    rt = env.rt
    await seed(rt, 4)
    gate = env.model.hold_summary()
    with gate:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(rt.compression.compress(GROUP.id), 1.0)
    assert [p for p, _ in env.phases()] == ["start", "error"]
    assert len(env.failure_warnings()) == 1
