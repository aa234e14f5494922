"""An outside audit of R-CFG, R-TPL, R-INJ, R-MEM, R-PROG and R-FAIL: black-box scenarios
through the service and the agent (a private runtime on a real SQLite file, or two on one
PostgreSQL database standing for two bot processes; the scripted OpenAI-compatible server on
127.0.0.1), each one a case the rule or the Chinese original names that the other tests do
not already check."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal

import pytest

from nonebot_plugin_memsum.compression.service import (
    BACKOFF_NAMESPACE,
    CLEARED,
    CLEARS_NAMESPACE,
    DIVIDER,
    DUE_NAMESPACE,
    INJECTION_HEAD,
    RUNS_NAMESPACE,
    _Run,
)
from nonebot_plugin_memsum.config import ConfigError, parse_config
from nonebot_plugin_memsum.errors import CompressionCancelled, CompressionError
from nonebot_plugin_memsum.settings import validate
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    NOTHING_KEPT,
    OLD_SUMMARY,
    Env,
    Make,
    raw_sql,
    seed,
    settle,
    summary_of,
    usage,
)

# A summary model this small (under R-RUN-9's literal rule) needs several requests for 12
# long lines (tests/test_compression_service_request.py, test_r_bud_7_...).
CHUNKED: dict[str, Any] = {"summary": {"context_window": 6002}, "memsum_capacity": "spec"}


# ---- R-CFG ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"memsum_compress_at": float("nan")}, "MEMSUM_COMPRESS_AT"),
        ({"memsum_compress_at": float("inf")}, "MEMSUM_COMPRESS_AT"),
        ({"memsum_summary_budget_ratio": float("nan")}, "MEMSUM_SUMMARY_BUDGET_RATIO"),
        ({"memsum_summary_budget_ratio": 0.5000001}, "MEMSUM_SUMMARY_BUDGET_RATIO"),
        ({"memsum_compress_at": -0.0001}, "MEMSUM_COMPRESS_AT"),
        ({"memsum_tiers": {"onebot.group": {"compress_at": float("nan")}}}, "MEMSUM_TIERS"),
    ],
)
def test_r_cfg_1_nan_inf_and_just_outside_the_range_are_refused_naming_the_key(
    raw: dict[str, Any], key: str
) -> None:
    # NoneBot decodes `.env` values as JSON first, and Python's json reads NaN and Infinity.
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_config(raw)


def test_r_cfg_1_the_ends_of_both_ranges_are_allowed() -> None:
    low = parse_config({"memsum_compress_at": 0, "memsum_summary_budget_ratio": 0})
    high = parse_config({"memsum_compress_at": 1, "memsum_summary_budget_ratio": 0.5})
    assert (low.memsum_compress_at, low.memsum_summary_budget_ratio) == (0, 0)
    assert (high.memsum_compress_at, high.memsum_summary_budget_ratio) == (1, 0.5)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1.0001"])
def test_r_cfg_2_a_per_session_compress_at_outside_0_to_1_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="压缩线须在 0 到 1 之间"):
        validate("compress_at", value)


async def test_r_cfg_4_zero_on_the_session_turns_the_usage_line_off_not_the_count_line(make: Make) -> None:
    # E = min(0.5 × 10000, ⌊0.3 × 10000⌋ − 1024) = 1976 with the global 0.5: every turn of 30
    # long lines is over it and hard-trimmed. compress_at 0 on the session: no usage line.
    env = await make(chat={"context_window": 10000}, memsum_compress_at=0.5, memsum_trim_ratio=0.3)
    rt, model = env.rt, env.model
    await rt.settings.set("compress_at", "session", GROUP.id, 0)
    assert await rt.compression.compress_at(GROUP.id, "onebot", "group") is None
    await seed(rt, 30, size=120)
    model.chat.append(Reply("好的", usage=usage(9000)))
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert model.summary_requests() == []  # neither in the turn nor after it
    # The count line still works: 31 messages + this turn's reply ≥ 20.
    await rt.settings.set("history_limit", "session", GROUP.id, 20)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert len(model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]


async def test_r_cfg_5_summary_model_falls_to_the_global_preference_before_priority(make: Make) -> None:
    def models(llm: ScriptedLLM) -> list[dict[str, Any]]:
        return [
            llm.model_config("test/chat", priority=9),
            llm.model_config("test/sum"),
            llm.model_config("test/global"),
        ]

    env = await make(models=models, memsum_summary_model="ghost/gone", memsum_preferred_model="test/global")
    await seed(env.rt, 3)
    assert (await env.rt.compression.compress(GROUP.id)).outcome == "done"
    assert [r["model"] for r in env.model.summary_requests()] == ["global"]


# ---- R-FAIL --------------------------------------------------------------------------------
async def test_r_fail_1_an_unresolvable_global_preference_is_named_as_provider_model(make: Make) -> None:
    def no_chat_model(llm: ScriptedLLM) -> list[dict[str, Any]]:
        return [llm.model_config("test/embedder", chat=False)]

    env = await make(models=no_chat_model, memsum_summary_model=None, memsum_preferred_model="ghost/global")
    await seed(env.rt, 3)
    with pytest.raises(CompressionError) as failed:
        await env.rt.compression.compress(GROUP.id)
    assert failed.value.reason == "摘要模型 ghost/global 不可用"
    assert env.phases() == [("start", None), ("error", "摘要模型 ghost/global 不可用")]


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(
            Reply(status=500, error="upstream exploded", headers={"Retry-After": "0"}), id="http_500"
        ),
        pytest.param(Reply(f"【保留原文】无\n{CHAT_SUMMARY}", finish_reason="length"), id="length"),
        pytest.param(Reply("【保留原文】无\n"), id="empty"),
        pytest.param(Reply(f"【保留原文】无\n{CHAT_SUMMARY}", cut_after=3), id="stream_cut"),
    ],
)
async def test_r_fail_1_a_failed_later_chunk_writes_nothing_and_warns_once(make: Make, second: Reply) -> None:
    env = await make(**CHUNKED)
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 12, size=110)
    before = await rt.store.get_history(GROUP.id)
    model.summary.append(Reply(NOTHING_KEPT))
    model.summary_default = second  # every later request (the client retries a 500)
    env.warnings.clear()
    with pytest.raises(CompressionError) as failed:
        await rt.compression.compress(GROUP.id)
    assert len(model.summary_requests()) >= 2
    assert await summary_of(rt) == OLD_SUMMARY  # not the first chunk's result either
    assert await rt.store.get_history(GROUP.id) == before  # R-FAIL-3: no archive, no divider
    assert await rt.store.get_archived(GROUP.id) == []
    assert env.phases() == [("start", None), ("error", failed.value.reason)]
    assert len(env.warnings) == 1, env.warnings  # one warning, whatever the client logged


async def test_r_fail_1_a_failed_background_run_warns_once_and_reports_error(make: Make) -> None:
    env = await make(memsum_history_limit=4)
    rt, model = env.rt, env.model
    await seed(rt, 4)
    model.summary_default = Reply(status=500, error="upstream exploded", headers={"Retry-After": "0"})
    env.warnings.clear()
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert [p for p, _ in env.phases()] == ["start", "error"]
    assert len(env.warnings) == 1, env.warnings
    assert await summary_of(rt) is None
    assert [m.is_conversation for m in await rt.store.get_history(GROUP.id)] == [True] * 5


# ---- R-MEM-3 -------------------------------------------------------------------------------
async def test_r_mem_3_a_clear_between_two_chunk_requests_cancels_the_run(make: Make) -> None:
    env = await make(**CHUNKED)
    rt, model = env.rt, env.model
    await seed(rt, 12, size=110)
    model.summary.append(Reply(NOTHING_KEPT))
    gate = model.hold_summary()  # the second request
    run = asyncio.create_task(rt.compression.compress(GROUP.id))
    with gate:
        await gate.reached()
        await rt.compression.clear(GROUP.id, "context")
    with pytest.raises(CompressionCancelled) as failed:
        await run
    assert failed.value.reason == CLEARED == "压缩期间会话被清空"
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == []  # no divider after the clear
    assert env.phases() == [("start", None), ("error", CLEARED)]


async def test_r_mem_3_clearing_only_the_summary_while_the_model_thinks_cancels_too(env: Env) -> None:
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    history = await seed(rt, 4)
    gate = model.hold_summary()
    run = asyncio.create_task(rt.compression.compress(GROUP.id))
    with gate:
        await gate.reached()
        await rt.compression.clear(GROUP.id, "summary")
    with pytest.raises(CompressionCancelled, match=CLEARED):
        await run
    assert await summary_of(rt) is None  # neither the old summary nor a new one
    assert [m.id for m in await rt.store.get_history(GROUP.id)] == [m.id for m in history]
    assert env.phases() == [("start", None), ("error", CLEARED)]


# ---- R-PROG-2 ------------------------------------------------------------------------------
async def test_r_prog_2_history_that_cannot_be_read_fails_without_progress_events(env: Env, tmp_path) -> None:
    rt = env.rt
    await seed(rt, 1)
    await raw_sql(tmp_path / "memsum-0.db", "ALTER TABLE messages RENAME TO messages_gone")
    with pytest.raises(CompressionError, match="读不出会话历史"):
        await rt.compression.compress("onebot:group:2")  # never read: not in the history cache
    assert env.progress == []
    assert not rt.compression.is_running("onebot:group:2")


# ---- R-INJ ---------------------------------------------------------------------------------
def _summary_at_history_start(body: dict[str, Any], text: str) -> None:
    """R-INJ-1: the summary is one system message, the last one, right before the history."""
    messages = body["messages"]
    first_history = next(i for i, m in enumerate(messages) if m["role"] != "system")
    carrying = [i for i, m in enumerate(messages) if text in str(m["content"])]
    assert carrying == [first_history - 1], messages
    assert messages[first_history - 1] == {"role": "system", "content": f"{INJECTION_HEAD}\n\n{text}"}


async def test_r_inj_1_every_call_of_a_tool_turn_carries_the_summary(env: Env) -> None:
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 2)
    call = {"id": "call_1", "name": "todo_write", "arguments": '{"items": []}'}
    model.chat.extend([Reply("", tool_calls=[call], usage=usage(100)), Reply("好的", usage=usage(100))])
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    first, second = model.chat_requests()
    for body in (first, second):
        _summary_at_history_start(body, OLD_SUMMARY["text"])
    assert [m["role"] for m in second["messages"]][-2:] == ["assistant", "tool"]


async def test_r_inj_1_the_next_call_sees_a_new_summary_and_none_after_it_is_cleared(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    await seed(rt, 1, start=10)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    _summary_at_history_start(model.chat_requests()[-1], CHAT_SUMMARY)
    await rt.compression.clear(GROUP.id, "summary")
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    assert not [m for m in messages if INJECTION_HEAD in str(m["content"])]
    # The divider is an event marker: never sent as conversation (R-RUN-11).
    assert not [m for m in messages if m["content"] == DIVIDER]


async def test_r_cfg_3_a_child_first_seen_through_record_copies_its_parents_values() -> None:
    # Another plugin may create a child by recording into it (api.record makes the session on
    # first use): it is created then, so it copies its parent's effective values then too.
    from nonebot_plugin_memsum import api, runtime

    rt = runtime.get()
    parent = await api.internal_session("audit:parent")
    await rt.settings.set("compress_at", "session", parent.id, 0.35)
    await rt.settings.set("history_limit", "session", parent.id, 12)
    child = api.SessionRecord(id="audit:child", platform=None, kind="child", parent=parent.id)
    await api.record(child, api.Message(role="user", content="子任务开始"))
    await rt.settings.set("compress_at", "session", parent.id, 0.9)
    assert (await rt.settings.effective("compress_at", child.id)).value == 0.35
    assert (await rt.settings.effective("history_limit", child.id)).value == 12


# ---- the in-turn compression (README decision) and R-INJ / R-FAIL -------------------------------
# Window 10000 at compress_at 0.5, trim ratio 0.3: E = trim budget = 1976; 30 long lines are over it.
IN_TURN: dict[str, Any] = {
    "chat": {"context_window": 10000},
    "memsum_compress_at": 0.5,
    "memsum_trim_ratio": 0.3,
}


async def test_r_inj_1_the_request_after_an_in_turn_compression_carries_the_new_summary(make: Make) -> None:
    env = await make(**IN_TURN)
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 30, size=120)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    assert env.phases() == [("start", None), ("done", None)]
    (request,) = model.chat_requests()
    _summary_at_history_start(request, CHAT_SUMMARY)  # the new one, not OLD_SUMMARY
    assert OLD_SUMMARY["text"] not in str(request["messages"])


async def test_r_fail_1_a_failed_in_turn_compression_leaves_history_and_the_turn_answers(make: Make) -> None:
    env = await make(**IN_TURN)
    rt, model = env.rt, env.model
    history = await seed(rt, 30, size=120)
    model.summary_default = Reply(f"【保留原文】无\n{CHAT_SUMMARY}", finish_reason="length")
    env.warnings.clear()
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert env.phases() == [("start", None), ("error", "摘要在输出上限处被截断")]
    assert len(env.warnings) == 1, env.warnings
    assert await summary_of(rt) is None
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active][:30] == [m.id for m in history]  # R-FAIL-3: nothing archived
    assert [m.role for m in active[30:]] == ["assistant"]  # the answer, no divider


async def test_r_prog_3_a_manual_run_that_starts_while_the_turn_decides_keeps_the_turn_from_running_one(
    make: Make,
) -> None:
    # The turn decides to compress first (README decision) over a few reads; a /压缩 that
    # starts between its check and its run is the one run of the session: the turn is sent
    # trimmed instead of starting a second run beside it.
    env = await make(**IN_TURN)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    gate = model.hold_summary()
    service = rt.compression
    decide = service.compress_at
    manual: list[asyncio.Task[Any]] = []

    async def compress_at_meanwhile(*args: Any) -> float | None:
        if not manual:  # the turn's first question to the service: the in-turn decision
            manual.append(asyncio.create_task(service.compress(GROUP.id)))
            await gate.reached()
        return await decide(*args)

    service.compress_at = compress_at_meanwhile  # type: ignore[method-assign]
    with gate:
        assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
        assert len(model.summary_requests()) == 1  # the manual run's only
        assert service.is_running(GROUP.id)
    assert (await manual[0]).outcome == "done"
    await settle(rt)
    assert env.phases() == [("start", None), ("done", None)]


# ---- R-MEM-3 across processes (PostgreSQL) --------------------------------------------------
@pytest.fixture
async def pg_db(pg_server: Any) -> Any:
    """A fresh database; requested before `make`, so it is dropped after the runtimes close."""
    from tests.fakes.pgdb import fresh_database

    async with fresh_database(pg_server.url()) as fresh:
        yield fresh


@pytest.mark.parametrize("kind", ["summary", "context"])
async def test_r_mem_3_a_clear_in_another_process_while_the_model_thinks_cancels_the_run(
    pg_db: str, make: Make, kind: Literal["summary", "context"]
) -> None:
    # Two runtimes on one PostgreSQL database stand for two bot processes: the owner clears
    # the session on the second one's web page while the first one's run waits on the model.
    first, second = await make(location=pg_db), await make(location=pg_db)
    rt = first.rt
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    history = await seed(rt, 4)
    gate = first.model.hold_summary()
    run = asyncio.create_task(rt.compression.compress(GROUP.id))
    with gate:
        await gate.reached()
        await second.rt.compression.clear(GROUP.id, kind)
    with pytest.raises(CompressionCancelled) as failed:
        await run
    assert failed.value.reason == CLEARED
    assert await summary_of(rt) is None  # no new summary after the clear
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active] == ([m.id for m in history] if kind == "summary" else [])
    assert first.phases() == [("start", None), ("error", CLEARED)]
    assert (await rt.compression.compress(GROUP.id)).outcome == ("done" if kind == "summary" else "nothing")


async def test_r_mem_3_a_clear_while_the_in_turn_compression_waits_on_the_model_cancels_it(
    make: Make,
) -> None:
    env = await make(**IN_TURN)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    gate = model.hold_summary()
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    with gate:
        await gate.reached()
        await rt.compression.clear(GROUP.id, "context")  # not held up by the running turn
    # Nothing is left to answer once the context is cleared: the turn no longer sends the
    # request it assembled from the cleared history (tests/test_audit10_sc.py).
    assert await turn == "silent"
    await settle(rt)
    assert env.phases() == [("start", None), ("error", CLEARED)]
    assert await summary_of(rt) is None
    assert DIVIDER not in [m.content for m in await rt.store.get_archived(GROUP.id)]
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 0  # R-BACK-4: no failure


@pytest.mark.parametrize("model", ["answers", "fails"])
async def test_r_mem_3_a_deletion_in_another_process_while_the_model_thinks_leaves_no_trace(
    pg_db: str, make: Make, model: str
) -> None:
    # The owner deletes the session on the second process's web page while the first
    # process's run waits on the model: whether the model then answers or fails, the run
    # ends without writing a last run, a compression row or a back-off for the session
    # that no longer exists.
    first, second = await make(location=pg_db), await make(location=pg_db)
    rt = first.rt
    await second.rt.compression.clear(GROUP.id, "summary")  # a clear mark the deletion must take too
    await seed(rt, 4)
    down = Reply(status=500, error="upstream exploded", headers={"Retry-After": "0"})
    gate = first.model.hold_summary(down if model == "fails" else None)
    first.model.summary_default = down
    run = asyncio.create_task(rt.compression._run_counted(GROUP.id, _Run()))  # as the background runs it
    with gate:
        await gate.reached()
        await second.rt.compression.delete_session(GROUP.id)
    assert await run is None
    reason = CLEARED if model == "answers" else first.phases()[-1][1]
    assert first.phases() == [("start", None), ("error", reason)]
    assert await rt.store.get_history(GROUP.id) == []
    assert await rt.store.compressions(GROUP.id) == []
    status = await rt.compression.status(GROUP.id)
    assert status.last_run is None
    assert status.backoff_failures == 0
    namespaces = (RUNS_NAMESPACE, BACKOFF_NAMESPACE, DUE_NAMESPACE, CLEARS_NAMESPACE, SUMMARY_NAMESPACE)
    left = [ns for ns in namespaces if GROUP.id in await rt.store.list_meta(ns)]
    assert left == []
