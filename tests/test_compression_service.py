"""The compression run in-process (issue 4): the run and its one-transaction commit,
replies that still succeed, the count rule, failures and progress (R-RUN, R-BACK-1/2,
R-FAIL, R-PROG). A private runtime on a real SQLite file, real turns through the agent,
and a real OpenAI-compatible server on 127.0.0.1; a `Gate` holds a scripted reply until
the test lets it go."""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from nonebot.log import logger

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.tools import TodoItem
from nonebot_plugin_memsum.compression.request import (
    EMPTY_SUMMARY,
    REFUSED_WINDOW,
    CompressionError,
)
from nonebot_plugin_memsum.compression.service import (
    BUSY,
    CHANGED,
    DIVIDER,
    INJECTION_HEAD,
    STOPPED,
    STORE_FAILED,
)
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, StoreError
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    OLD_SUMMARY,
    PRIVATE_OWNER,
    SUMMARY_MODEL,
    Env,
    Make,
    Script,
    conversation_of,
    held_compression,
    is_summary,
    keeping,
    offered,
    raw_sql,
    seed,
    settle,
    stated,
    summary_of,
    system_of,
    talk,
    units_tokens,
    user_of,
)


# ---- R-RUN: the run and its commit --------------------------------------------------------
async def test_r_prog_1_manual_compression_start_and_done(env: Env) -> None:
    rt = env.rt
    history = await seed(rt, 6)
    result = await rt.compression.compress(GROUP.id)
    assert result.outcome == "done"
    assert result.archived == len(history)
    assert env.phases() == [("start", None), ("done", None)]
    active = await rt.store.get_history(GROUP.id)
    assert [(m.role, m.content, m.event_marker) for m in active] == [("system", DIVIDER, True)]
    assert [m.id for m in await rt.store.get_archived(GROUP.id)] == [m.id for m in history]


async def test_r_mem_1_summary_lives_in_metadata_namespace_summary(env: Env) -> None:
    rt = env.rt
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    record = await rt.store.get_meta("summary", GROUP.id)
    assert record is not None
    assert record["text"] == CHAT_SUMMARY
    assert record["template"] == "chat"
    assert record["kept_messages"] == 0
    # The divider and the summary come from the same commit (R-RUN-11).
    divider = (await rt.store.get_history(GROUP.id))[-1]
    assert divider.content == DIVIDER
    assert record["time"] == divider.ts


async def test_r_run_1_unfinished_tool_group_stays_active_with_later_results(env: Env) -> None:
    rt, model = env.rt, env.model
    plain = await seed(rt, 4)
    call = await rt.store.append(
        GROUP.id,
        Message(
            role="assistant",
            content="",
            tool_calls=(ToolCall("call_7", "todo_write", '{"items": []}'),),
            ts=2000.0,
        ),
    )
    run, gate = await held_compression(env)
    # The agent finishes its tool group while the model summarises.
    result = await rt.store.append(
        GROUP.id, Message(role="tool", content="待办已清空", tool_call_id="call_7", ts=2001.0)
    )
    later = await rt.agent.record(GROUP, Message(role="user", content=talk(99), ts=2002.0))
    gate.open()
    done = await run
    assert done.archived == len(plain)
    (request,) = model.summary_requests()
    assert "调用 todo_write" not in user_of(request)
    assert all(m.content in user_of(request) for m in plain)
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active[:3]] == [call.id, result.id, later.id]
    assert active[0] == call  # untouched
    assert [m.content for m in active[3:]] == [DIVIDER]


async def test_r_run_11_history_changed_during_the_summary_call_fails_and_restores(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    before = await rt.store.get_history(GROUP.id)
    run, gate = await held_compression(env)
    await rt.store.archive_span(GROUP.id, 1)  # a message of the span goes away (a rollback elsewhere)
    gate.open()
    with pytest.raises(CompressionError) as failed:
        await run
    assert failed.value.reason == CHANGED
    assert await summary_of(rt) == OLD_SUMMARY  # the previous summary, restored
    assert await rt.store.get_history(GROUP.id) == before[1:]  # nothing more archived, no divider
    assert env.phases() == [("start", None), ("error", CHANGED)]
    assert len(env.failure_warnings()) == 1


async def test_r_run_11_head_compared_item_by_item_content_edit_is_a_change(env: Env) -> None:
    rt = env.rt
    history = await seed(rt, 4)
    run, gate = await held_compression(env)
    # Same ids, same count: only the content of the third item differs.
    await raw_sql(rt.store.path, "UPDATE messages SET content = ? WHERE id = ?", ("改过的话", history[2].id))
    gate.open()
    with pytest.raises(CompressionError, match=CHANGED):
        await run
    assert await summary_of(rt) is None
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active] == [m.id for m in history]
    assert await rt.store.get_archived(GROUP.id) == []


async def test_r_run_11_archive_error_restores_the_summary_and_raises(env: Env) -> None:
    rt = env.rt
    history = await seed(rt, 4)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await raw_sql(
        rt.store.path,
        "CREATE TRIGGER refuse_archive BEFORE UPDATE OF archived ON messages WHEN NEW.archived = 1"
        " BEGIN SELECT RAISE(ABORT, 'archive refused by the test'); END",
    )
    # R-RUN-11: 「归档抛错时同样把摘要回滚到写入前，原样抛出」: the store's own error.
    with pytest.raises(StoreError, match="archive refused by the test"):
        await rt.compression.compress(GROUP.id)
    assert await summary_of(rt) == OLD_SUMMARY
    assert await rt.store.get_history(GROUP.id) == history
    assert env.phases() == [("start", None), ("error", STORE_FAILED)]
    assert len(env.failure_warnings()) == 1


async def test_r_run_12_kept_originals_untouched_and_first_after_the_summary(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    first = await rt.agent.record(
        GROUP, Message(role="user", content="[甲(1)] 早上好", ts=1.0, metadata={"message_id": 11})
    )
    call = await rt.store.append(
        GROUP.id,
        Message(
            role="assistant",
            content="我记一下",
            tool_calls=(
                ToolCall("call_1", "todo_write", '{"items": [{"title": "买票", "status": "pending"}]}'),
            ),
            ts=2.0,
            metadata={"visibleContent": "我记一下"},
        ),
    )
    result = await rt.store.append(
        GROUP.id,
        Message(role="tool", content="待办已更新", name="todo_write", tool_call_id="call_1", ts=3.0),
    )
    promise = await rt.agent.record(
        GROUP, Message(role="user", content="[乙(2)] 我周六带帐篷", ts=4.0, metadata={"message_id": 12})
    )
    # A long last line makes the keep cap (a ratio of the conversation) roomy.
    last = await rt.agent.record(GROUP, Message(role="user", content=talk(50, 200), ts=5.0))
    model.summary.append(keeping("调用 todo_write", "带帐篷"))
    done = await rt.compression.compress(GROUP.id)
    assert done.kept_messages == 3  # the tool group (2 messages) and one user message
    active = await rt.store.get_history(GROUP.id)
    assert active[:3] == [call, result, promise]  # role, content, calls, ts, metadata all unchanged
    assert active[3].content == DIVIDER
    archived = await rt.store.get_archived(GROUP.id)
    assert [m.id for m in archived] == [first.id, last.id]
    assert (await summary_of(rt) or {})["kept_messages"] == 3

    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    assert messages[1]["role"] == "system"
    assert messages[1]["content"].startswith(INJECTION_HEAD)
    assert messages[2]["role"] == "assistant"
    assert messages[2]["tool_calls"][0]["id"] == "call_1"
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "待办已更新"}
    assert messages[4] == {"role": "user", "content": promise.content}
    assert len(messages) == 5
    # The divider is an event marker: never sent as conversation.
    assert all(m.get("content") != DIVIDER for m in messages)


async def test_r_inj_1_2_summary_is_one_system_message_right_before_the_history(env: Env) -> None:
    rt, model = env.rt, env.model
    archived = await seed(rt, 5)
    await rt.compression.compress(GROUP.id)
    newer = await seed(rt, 2, start=5)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    systems = [m for m in messages if m["role"] == "system"]
    assert len(systems) == 2  # the persona, then the summary
    assert messages[1] == {"role": "system", "content": f"{INJECTION_HEAD}\n\n{CHAT_SUMMARY}"}
    assert [m["content"] for m in messages[2:]] == [m.content for m in newer]
    sent = "\n".join(str(m.get("content")) for m in messages)
    assert not any(m.content in sent for m in archived)
    assert sent.count(CHAT_SUMMARY) == 1


async def test_r_inj_1_summary_is_last_though_another_plugin_contributes_to_context(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 5)
    await rt.compression.compress(GROUP.id)

    async def weather(session_id: str) -> str:
        return "天气：晴"

    async def rules(session_id: str) -> str:
        return "群规：不许刷屏"

    # Registered after the compression's injection, under the same anchor and another one.
    rt.agent.contribute("context", weather)
    rt.agent.contribute("rules", rules)
    newer = await seed(rt, 2, start=5)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    systems = [m["content"] for m in messages if m["role"] == "system"]
    assert systems[1:] == ["群规：不许刷屏", "天气：晴", f"{INJECTION_HEAD}\n\n{CHAT_SUMMARY}"]
    # the summary is the system message right before the history
    assert [m["content"] for m in messages[len(systems) :]] == [m.content for m in newer]
    prompt = await rt.agent.build_prompt(GROUP.id, IN_GROUP)
    assert prompt.messages[len(systems) - 1]["content"].startswith(INJECTION_HEAD)


async def test_r_inj_2_no_truncation_of_a_long_summary(env: Env) -> None:
    rt, model = env.rt, env.model
    long_summary = CHAT_SUMMARY + "\n" + "很长的摘要内容。" * 600
    await seed(rt, 3)
    model.summary.append(Reply(f"【保留原文】无\n{long_summary}"))
    await rt.compression.compress(GROUP.id)
    await seed(rt, 1, start=3)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    assert model.chat_requests()[-1]["messages"][1]["content"] == f"{INJECTION_HEAD}\n\n{long_summary}"


# ---- R-RUN-8: replies that still succeed ------------------------------------------------------
async def test_r_run_8_no_heading_whole_reply_is_the_summary_nothing_kept_warning(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    await seed(rt, 4)
    model.summary.append(Reply(CHAT_SUMMARY))
    result = await rt.compression.compress(GROUP.id)
    assert offered(model.summary_requests()[0])  # numbers were offered
    assert result.kept_messages == 0
    assert result.archived == 4
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY
    assert env.phases() == [("start", None), ("done", None)]
    assert any("has no 【保留原文】 heading" in w for w in env.warnings)


async def test_r_run_8_numbers_not_offered_are_dropped(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    history = await seed(rt, 4)
    model.summary.append(Reply(f"【保留原文】2、99\n{CHAT_SUMMARY}"))
    result = await rt.compression.compress(GROUP.id)
    assert sorted(offered(model.summary_requests()[0])) == [1, 2, 3, 4]
    assert result.kept_messages == 1
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active if m.is_conversation] == [history[1].id]


async def test_r_run_7_annotated_and_listed_hash_numbers_keep_only_those_units(make: Make) -> None:
    # R-RUN-7: the model copies the annotations back inside a numbered list; its list
    # numbers and the token counts are no numbers to keep.
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    history = await seed(rt, 6)

    def answer(body: dict[str, Any]) -> Reply:
        annotated = re.findall(r"^#(?:2|4)〔约 \d+ token〕", conversation_of(body), re.MULTILINE)
        listed = "\n".join(f"{i}. {a}" for i, a in enumerate(annotated, 1))
        return Reply(f"【保留原文】\n{listed}\n{CHAT_SUMMARY}")

    model.summary.append(answer)
    result = await rt.compression.compress(GROUP.id)
    assert result.kept_messages == 2
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active if m.is_conversation] == [history[1].id, history[3].id]
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY


# ---- R-BACK-1/2 through the service -----------------------------------------------------------
async def test_r_back_1_kept_at_most_ratio_of_the_new_conversation_not_lifted_by_the_floor(
    make: Make,
) -> None:
    env = await make(memsum_summary_budget_ratio=0.2)
    rt, model = env.rt, env.model
    history = await seed(rt, 10, size=20)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, {**OLD_SUMMARY, "text": "旧摘要" * 100})
    cap = math.floor(Fraction(1, 5) * units_tokens(history))  # the old summary does not count
    model.summary.append(
        lambda body: Reply(f"【保留原文】{'、'.join(map(str, offered(body)))}\n{CHAT_SUMMARY}")
    )
    result = await rt.compression.compress(GROUP.id)
    request = model.summary_requests()[0]
    assert stated(request) == (1000, cap)  # the budget sits at the floor; the keep cap does not
    kept = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert 0 < result.kept_messages == len(kept)
    assert sum(estimate_msg_tokens(m) for m in kept) <= cap
    # The earliest go first: what stays is the latest of those asked for.
    assert kept[-1].id == history[-1].id


async def test_r_back_2_kept_cut_to_half_the_count_line_earliest_first(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5, memsum_history_limit=9)
    rt, model = env.rt, env.model
    short = await seed(rt, 6, size=2)
    await seed(rt, 4, start=6, size=150)  # long ones make the keep cap roomy
    model.summary.append(keeping(*(m.content for m in short)))
    result = await rt.compression.compress(GROUP.id)
    assert len(offered(model.summary_requests()[0])) >= 6
    # ⌊9 / 2⌋ = 4, nothing after the cut: the last 4 of the 6 asked for stay.
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [m.id for m in short[2:]]
    assert result.kept_messages == 4


async def test_r_back_2_none_kept_when_messages_after_the_cut_reach_half(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt = env.rt
    await rt.settings.set("history_limit", "session", GROUP.id, 8)  # the count line from the settings
    short = await seed(rt, 4, size=2)
    await seed(rt, 2, start=4, size=150)
    run, gate = await held_compression(env, keeping(*(m.content for m in short)))
    after = await seed(rt, 4, start=10)  # arrive during the call: 4 = ⌊8 / 2⌋
    gate.open()
    result = await run
    assert result.kept_messages == 0
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [m.id for m in after]


# ---- R-FAIL --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    script: Script | None
    reason: str
    """A regular expression the reason must match in full."""
    config: dict[str, Any]


def _only_a_non_chat_model(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [llm.model_config("test/embedder", chat=False)]


FAILURES = {
    "http_500": Failure(
        Reply(status=500, error="upstream exploded", headers={"Retry-After": "0"}),
        r"摘要模型出错：test/sum 服务端出错（HTTP 500: upstream exploded）",
        {},
    ),
    "timeout": Failure(
        Reply(f"【保留原文】无\n{CHAT_SUMMARY}", delay=1.5),
        r"摘要模型出错：test/sum 超时，没有在限定时间内给出完整回复",
        {"memsum_llm_timeout": 0.5},
    ),
    "stream_cut": Failure(
        Reply(f"【保留原文】无\n{CHAT_SUMMARY}", cut_after=3),
        r"摘要模型出错：test/sum 回复中途断开（.*）",
        {},
    ),
    "finish_reason_length": Failure(
        Reply(f"【保留原文】无\n{CHAT_SUMMARY}", finish_reason="length"), r"摘要在输出上限处被截断", {}
    ),
    "empty_once_the_keep_block_is_removed": Failure(
        Reply("【保留原文】1、2\n"), re.escape(EMPTY_SUMMARY), {}
    ),
    "r_fail_2_window_too_small": Failure(
        None, re.escape(REFUSED_WINDOW), {"summary": {"context_window": 1000}}
    ),
    "no_summary_model_preference_named": Failure(
        None,
        r"摘要模型 ghost/model 不可用",
        {"models": _only_a_non_chat_model, "memsum_summary_model": "ghost/model"},
    ),
    "no_summary_model_at_all": Failure(
        None, r"没有可用的摘要模型", {"models": _only_a_non_chat_model, "memsum_summary_model": None}
    ),
}


@pytest.mark.parametrize("case", list(FAILURES.values()), ids=[f"r_fail_1_{k}" for k in FAILURES])
async def test_r_fail_1_nothing_written_one_warning_error_event_reason(make: Make, case: Failure) -> None:
    env = await make(**case.config)
    rt, model = env.rt, env.model
    if case.script is not None:
        model.summary_default = case.script
    await seed(rt, 5)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    before = await rt.store.get_history(GROUP.id)
    with pytest.raises(CompressionError) as failed:
        await rt.compression.compress(GROUP.id)
    reason = failed.value.reason
    assert re.fullmatch(case.reason, reason), reason
    assert await summary_of(rt) == OLD_SUMMARY  # no new summary
    assert await rt.store.get_history(GROUP.id) == before  # R-FAIL-3: untouched, no divider
    assert await rt.store.get_archived(GROUP.id) == []
    assert env.phases() == [("start", None), ("error", reason)]
    assert len(env.failure_warnings()) == 1
    assert not any(API_KEY in w for w in env.warnings)
    assert API_KEY not in reason


async def test_r_cfg_5_missing_summary_preference_falls_through_to_the_next_model(make: Make) -> None:
    env = await make(memsum_summary_model="ghost/model")
    await seed(env.rt, 3)
    result = await env.rt.compression.compress(GROUP.id)
    assert result.outcome == "done"
    # No own preference that resolves, no global one: the highest priority model, the chat one.
    assert env.model.summary_requests()[0]["model"] == "chat"


# ---- R-PROG ----------------------------------------------------------------------------------------
async def test_r_prog_2_empty_history_does_nothing_without_events(env: Env) -> None:
    result = await env.rt.compression.compress(GROUP.id)
    assert result.outcome == "nothing"
    assert env.progress == []
    assert env.model.llm.requests == []


async def test_r_prog_2_only_markers_does_nothing_without_events(env: Env) -> None:
    rt = env.rt
    await seed(rt, 2)
    await rt.compression.compress(GROUP.id)
    env.progress.clear()
    await rt.store.append(
        GROUP.id, Message(role="system", content="（助手本轮选择不回复）", event_marker=True)
    )
    result = await rt.compression.compress(GROUP.id)  # the divider and a silent record only
    assert result.outcome == "nothing"
    assert env.progress == []
    assert len(env.model.summary_requests()) == 1
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY


async def test_r_prog_3_one_run_per_session_manual_refused_background_skips(make: Make) -> None:
    env = await make(memsum_history_limit=2)  # every turn is due by count
    rt, model = env.rt, env.model
    await seed(rt, 3)
    run, gate = await held_compression(env)
    with pytest.raises(CompressionError, match=BUSY):
        await rt.compression.compress(GROUP.id)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"  # due, but a run is going
    await settle(rt)
    gate.open()
    await run
    await settle(rt)
    assert len(model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]
    assert not rt.compression.is_running(GROUP.id)


# ---- R-CFG-4 -----------------------------------------------------------------------------------------
async def test_r_cfg_4_compress_at_is_none_for_0(make: Make) -> None:
    env = await make(memsum_compress_at=0.8, memsum_tiers={"onebot.group": {"compress_at": 0.5}})
    service, settings = env.rt.compression, env.rt.settings
    assert await service.compress_at("internal:x") == 0.8
    assert await service.compress_at("internal:x", "onebot", "group") == 0.5
    await settings.set("compress_at", "session", "internal:x", 0)
    assert await service.compress_at("internal:x", "onebot", "group") is None
    zero = await make(memsum_compress_at=0)
    assert await zero.rt.compression.compress_at(GROUP.id, "onebot") is None


# ---- review additions --------------------------------------------------------------------------
async def test_r_fail_1_an_unexpected_error_gives_one_warning_with_its_traceback(env: Env) -> None:
    rt = env.rt

    class BrokenTodos:
        """Another plugin's todo provider that fails (the work template reads it, R-RUN-4)."""

        async def items(self, session_id: str) -> list[TodoItem]:
            raise RuntimeError("todo backend down")

        async def replace(self, session_id: str, items: list[TodoItem]) -> None:
            raise RuntimeError("todo backend down")

    rt.compression.todos = BrokenTodos()
    await seed(rt, 3, record=PRIVATE_OWNER)
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(m.record["message"]), level="ERROR")
    try:
        with pytest.raises(CompressionError) as failed:
            await rt.compression.compress(PRIVATE_OWNER.id)
    finally:
        logger.remove(sink)
    assert failed.value.reason == "内部错误：RuntimeError"
    assert errors == []
    (warning,) = env.failure_warnings(PRIVATE_OWNER.id)
    assert "内部错误：RuntimeError" in warning
    assert [p for p, _ in env.phases(PRIVATE_OWNER.id)] == ["start", "error"]


async def test_r_mem_2_an_unknown_clear_kind_is_refused_and_cancels_nothing(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3)
    gate = model.hold_summary()
    run = asyncio.create_task(rt.compression.compress(GROUP.id))
    await gate.reached()
    with pytest.raises(ValueError, match="unknown clear kind"):
        await rt.compression.clear(GROUP.id, "everything")  # type: ignore[arg-type]
    gate.open()
    assert (await run).outcome == "done"
    assert env.phases() == [("start", None), ("done", None)]


async def test_r_tpl_2_owner_written_the_nonebot_way_gets_the_work_template(tmp_path: Path) -> None:
    # SUPERUSERS=["onebot:10001"] is NoneBot's current form; the commands accept it, so the
    # template choice must too.
    llm = ScriptedLLM().start()
    rt = await runtime.build(
        Config.model_validate({"memsum_models": [llm.model_config(SUMMARY_MODEL)]}),
        tmp_path / "owner.db",
        [],
        {"onebot:10001"},
    )
    try:
        assert rt.compression.is_owner is not None
        assert rt.compression.is_owner("10001")
        assert not rt.compression.is_owner("10002")
        dm = SessionRecord(
            id="onebot:private:10001", platform="onebot", kind="private", peer="10001", room_class="direct"
        )
        await rt.agent.record(dm, Message(role="user", content="[主人(10001)] 记一下", ts=1.0))
        await rt.compression.compress(dm.id)
        (body,) = [b for b in llm.requests if is_summary(b)]
        assert "## 目标" in system_of(body)
    finally:
        await runtime.close(rt)
        llm.stop()


def test_r_inj_2_the_first_sentence_explains_the_kept_originals() -> None:
    first = INJECTION_HEAD.split("。")[0]
    assert "保留的原文" in first
    assert "按原来的时间顺序" in first
    assert "历史开头" in first
    assert "概括过" in first
    # Issue 9: it goes with every chat request of a compressed session (o200k: 53 → 48).
    assert estimate_text_tokens(INJECTION_HEAD) <= 48


# ---- QA regressions ------------------------------------------------------------------------------
async def test_shutdown_abandons_a_manual_run_waiting_on_the_model_and_leaves_the_old_state(env: Env) -> None:
    # NoneBot shields a command from cancellation: a /压缩 waiting on the model held the
    # bot's shutdown for the whole model timeout, then hit the closed store.
    rt = env.rt
    before = await seed(rt, 4)
    run, gate = await held_compression(env)
    await asyncio.wait_for(rt.compression.shutdown(), 10)  # a bound: the gate stays shut
    assert run.done()
    with pytest.raises(CompressionError, match=STOPPED):
        run.result()
    assert await rt.store.get_history(GROUP.id) == before
    assert await summary_of(rt) is None
    assert (await rt.compression.status(GROUP.id)).last_run.reason == STOPPED  # type: ignore[union-attr]
    gate.open()
