"""A second outside audit of R-RUN (the full compression) and R-MEM (persistence and
clearing): black-box scenarios from the Chinese original, run through the service on a real
SQLite file (reopened for the restarts) and the scripted OpenAI-compatible server. Each case
is one the earlier audits (tests/test_audit_a.py, tests/test_audit_b.py) and the unit tests
leave open: messages arriving during a run, tool groups with a message inside them, what the
reply may list, chunk order, the divider, the archive's content and order, restarts and
what a clear leaves behind."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import CompressionProgress
from nonebot_plugin_memsum.compression.service import BUSY, CLEARED, DIVIDER, INJECTION_HEAD
from nonebot_plugin_memsum.errors import CompressionCancelled, CompressionError
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message, ToolCall
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    NOTHING_KEPT,
    OLD_SUMMARY,
    Env,
    Make,
    committing,
    conversation_of,
    existing_summary_of,
    held_compression,
    held_turn,
    keeping,
    offered,
    seed,
    settle,
    stated,
    summary_of,
    talk,
    usage,
    user_of,
)

ANNOTATED = re.compile(r"^#(\d+)〔约 (\d+) token〕")


def conversation(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.is_conversation]


def ids(messages: list[Message]) -> list[int | None]:
    return [m.id for m in messages]


async def put(env: Env, **fields: Any) -> Message:
    return await env.rt.agent.record(GROUP, Message(**fields))


# ---- R-RUN-1 / R-RUN-12: messages arriving during the run -------------------------------------
async def test_r_run_1_and_12_late_messages_stay_active_after_the_kept_and_reach_the_model_in_order(
    make: Make,
) -> None:
    """The span is the snapshot: what arrives while the model summarises is neither offered nor
    archived; the kept originals sit before it, and the next prompt is summary → kept → late."""
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    short = await seed(rt, 3, size=2)
    long = await seed(rt, 2, start=3, size=300)
    run, gate = await held_compression(env, keeping(short[0].content, short[2].content))
    late = await seed(rt, 2, start=40)
    gate.open()
    result = await run
    (request,) = model.summary_requests()
    assert all(m.content not in user_of(request) for m in late)  # not in the span
    assert result.kept_messages == 2
    assert result.archived == 3
    active = await rt.store.get_history(GROUP.id)
    assert ids(conversation(active)) == ids([short[0], short[2], *late])
    assert (active[-1].content, active[-1].event_marker) == (DIVIDER, True)
    assert ids(await rt.store.get_archived(GROUP.id)) == ids([short[1], *long])

    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    head = next(i for i, m in enumerate(messages) if str(m["content"]).startswith(INJECTION_HEAD))
    assert [m["content"] for m in messages[head + 1 : head + 5]] == [
        short[0].content,
        short[2].content,
        late[0].content,
        late[1].content,
    ]


# ---- R-RUN-1: an unfinished tool group with a message inside it ----------------------------------
async def test_r_run_1_unfinished_group_and_the_message_inside_it_stay_active_whole(env: Env) -> None:
    """「退到这组的 assistant 之前，它、夹在组里的别的消息与随后写入的结果都留在活跃历史里」."""
    rt, model = env.rt, env.model
    ask = await put(env, role="user", content="[甲(1)] 查北京和上海的天气", ts=1.0)
    call = await put(
        env,
        role="assistant",
        content="",
        tool_calls=(
            ToolCall("w1", "weather", '{"city":"北京"}'),
            ToolCall("w2", "weather", '{"city":"上海"}'),
        ),
        ts=2.0,
    )
    inside = await put(env, role="user", content="[乙(2)] 顺便看看广州", ts=3.0)
    first = await put(env, role="tool", content="北京晴", tool_call_id="w1", ts=4.0)
    run, gate = await held_compression(env)
    second = await put(env, role="tool", content="上海雨", tool_call_id="w2", ts=5.0)
    gate.open()
    result = await run
    (request,) = model.summary_requests()
    text = conversation_of(request)
    assert ask.content in text
    assert all(x not in text for x in ("调用 weather", "顺便看看广州", "北京晴"))
    assert result.archived == 1
    active = await rt.store.get_history(GROUP.id)
    assert ids(conversation(active)) == ids([call, inside, first, second])
    assert active[0] == call  # untouched
    assert ids(await rt.store.get_archived(GROUP.id)) == [ask.id]


# ---- R-RUN-2 / R-RUN-11: a kept tool group's indexes skip the message inside it -----------------
@pytest.mark.parametrize("keep", ["group", "inside"])
async def test_r_run_2_keeping_a_tool_group_or_the_message_inside_it_archives_only_the_other(
    location: Path | str, make: Make, keep: str
) -> None:
    """A unit knows its messages' indexes in the span: keeping the group keeps the call and its
    result but not the member's line written between them, and the other way round."""
    env = await make(memsum_summary_budget_ratio=0.5, location=location)
    rt, model = env.rt, env.model
    ask = await put(env, role="user", content="[甲(1)] 几点了", ts=1.0)
    call = await put(env, role="assistant", content="", tool_calls=(ToolCall("k1", "clock", "{}"),), ts=2.0)
    inside = await put(env, role="user", content="[乙(2)] 我也想知道", ts=3.0)
    answer = await put(env, role="tool", content="十点", tool_call_id="k1", ts=4.0)
    tail = await seed(rt, 2, start=10, size=300)
    model.summary.append(keeping("调用 clock" if keep == "group" else "我也想知道"))
    result = await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    numbers = {text.split("\n", 1)[0]: n for n, text in offered(request).items()}
    # The group stands at its call's place, the line inside it after the group.
    assert numbers["[甲(1)] 几点了"] < numbers["调用 clock({})"] < numbers["[乙(2)] 我也想知道"]
    kept, archived = ([call, answer], [ask, inside]) if keep == "group" else ([inside], [ask, call, answer])
    assert result.kept_messages == len(kept)
    assert ids(conversation(await rt.store.get_history(GROUP.id))) == ids(kept)
    assert ids(await rt.store.get_archived(GROUP.id)) == ids([*archived, *tail])  # storage order


# ---- R-RUN-3: a tool call id reused by the provider ---------------------------------------------
async def test_r_run_3_a_result_is_named_by_the_call_it_answers_when_a_later_call_reuses_its_id(
    env: Env,
) -> None:
    """Some OpenAI-compatible servers number tool calls per reply ("call_0" every turn): the
    name comes from the call whose result it is, not from the last call with that id."""
    rt, model = env.rt, env.model
    await put(env, role="user", content="[甲(1)] 北京天气", ts=1.0)
    await put(env, role="assistant", content="", tool_calls=(ToolCall("call_0", "weather", "{}"),), ts=2.0)
    await put(env, role="tool", content="晴", tool_call_id="call_0", ts=3.0)
    await put(env, role="user", content="[甲(1)] 几点了", ts=4.0)
    await put(env, role="assistant", content="", tool_calls=(ToolCall("call_0", "clock", "{}"),), ts=5.0)
    await put(env, role="tool", content="十点", tool_call_id="call_0", ts=6.0)
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    text = conversation_of(request)
    assert "调用 weather({})\n工具结果(weather): 晴" in text
    assert "调用 clock({})\n工具结果(clock): 十点" in text


async def test_r_run_3_a_lone_result_is_not_named_by_a_later_call_that_reuses_its_id(env: Env) -> None:
    """A result whose call was archived by an earlier compression is alone in the span: a later
    call with the same id is not its call, so its own name is the fallback."""
    rt, model = env.rt, env.model
    await put(env, role="tool", content="晴", tool_call_id="call_0", name="weather", ts=1.0)
    await put(env, role="user", content="[甲(1)] 几点了", ts=2.0)
    await put(env, role="assistant", content="", tool_calls=(ToolCall("call_0", "clock", "{}"),), ts=3.0)
    await put(env, role="tool", content="十点", tool_call_id="call_0", ts=4.0)
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    parts = conversation_of(request).split("\n\n")
    assert parts[0] == "工具结果(weather): 晴"  # a lone result: not numbered either
    assert parts[-1].endswith("调用 clock({})\n工具结果(clock): 十点")


# ---- R-RUN-8: what the reply may list ---------------------------------------------------------------
async def test_r_run_8_duplicates_zero_and_numbers_out_of_range_keep_each_offered_unit_once(
    make: Make,
) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    short = await seed(rt, 3, size=2)
    await seed(rt, 2, start=3, size=300)

    def listing(body: dict[str, Any]) -> Reply:
        n = next(k for k, text in offered(body).items() if text == short[1].content)
        top = max(offered(body))
        return Reply(f"【保留原文】{n}、{n}、0、{top + 1}、{top + 50}\n{n}\n{CHAT_SUMMARY}")

    model.summary.append(listing)
    result = await rt.compression.compress(GROUP.id)
    assert result.kept_messages == 1
    assert result.summary == CHAT_SUMMARY
    assert ids(conversation(await rt.store.get_history(GROUP.id))) == [short[1].id]
    assert (await summary_of(rt) or {})["kept_messages"] == 1


async def test_r_run_8_a_reply_keeping_everything_keeps_the_latest_that_fit_the_keep_cap(make: Make) -> None:
    """「保留的合计超过 min(保留上限, 预算 − 摘要的估算) 时从最早的起去掉，直到不超」: the order the
    reply lists them in does not matter; time order does."""
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    lines = await seed(rt, 10, size=60)

    def everything(body: dict[str, Any]) -> Reply:
        return Reply(
            f"【保留原文】{'、'.join(map(str, sorted(offered(body), reverse=True)))}\n{CHAT_SUMMARY}"
        )

    model.summary.append(everything)
    result = await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    budget, keep_cap = stated(request)
    costs = [
        (int(m.group(1)), int(m.group(2)))
        for part in conversation_of(request).split("\n\n")
        if (m := ANNOTATED.match(part))
    ]
    assert [n for n, _ in costs] == list(range(1, 11))  # every line was offered
    assert sum(c for _, c in costs) > keep_cap  # so some must go
    kept: list[int] = []
    total = 0
    for n, cost in reversed(costs):  # the latest that fit, nothing earlier than a dropped one
        if total + cost > keep_cap:
            break
        kept.insert(0, n)
        total += cost
    assert kept
    assert result.kept_messages == len(kept)
    assert ids(conversation(await rt.store.get_history(GROUP.id))) == ids(lines[-len(kept) :])
    assert budget >= keep_cap


@pytest.mark.parametrize(
    "block",
    [
        pytest.param("【保留原文】第一条和第三条", id="words"),
        pytest.param("【保留原文】一、三", id="chinese_numerals"),
    ],
)
async def test_r_run_8_a_block_without_a_number_keeps_nothing_succeeds_and_warns(
    make: Make, block: str
) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    history = await seed(rt, 4, size=2)
    await seed(rt, 2, start=4, size=300)
    model.summary.append(Reply(f"{block}\n{CHAT_SUMMARY}"))
    result = await rt.compression.compress(GROUP.id)
    assert (result.outcome, result.kept_messages) == ("done", 0)
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY
    assert conversation(await rt.store.get_history(GROUP.id)) == []
    assert set(ids(history)) <= set(ids(await rt.store.get_archived(GROUP.id)))
    assert [w for w in env.warnings if "保留原文" in w]
    assert env.phases() == [("start", None), ("done", None)]


# ---- R-RUN-10: chunk order and the summary carried between chunks --------------------------------
async def test_r_run_10_every_unit_is_sent_once_in_time_order_and_each_chunk_carries_the_last_summary(
    make: Make,
) -> None:
    env = await make(summary={"context_window": 6000}, memsum_capacity="spec")
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    history = await seed(rt, 40, size=80)
    written: list[str] = []

    def chunk(body: dict[str, Any]) -> Reply:
        text = f"## 最近在聊什么\n第{len(written) + 1}块\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
        written.append(text)
        return Reply(f"{text}\n\n【保留原文】无")  # the block last this time

    model.summary_default = chunk
    result = await rt.compression.compress(GROUP.id)
    requests = model.summary_requests()
    assert len(requests) >= 2
    sent: list[str] = []
    for i, body in enumerate(requests):
        assert existing_summary_of(body) == (written[i - 1] if i else OLD_SUMMARY["text"])
        assert "请在同名小节上合并更新" in user_of(body)  # R-TPL-5, also for the previous chunk's result
        sent += [ANNOTATED.sub("", p) for p in conversation_of(body).split("\n\n")]
    assert sent == [m.content for m in history]  # nothing lost, nothing twice, in order
    assert result.summary == written[-1] == (await summary_of(rt) or {})["text"]
    assert "保留原文" not in result.summary
    assert ids(await rt.store.get_archived(GROUP.id)) == ids(history)


@pytest.mark.parametrize("rechosen", [True, False])
async def test_r_run_10_a_unit_chosen_early_survives_only_when_every_later_request_chooses_it_again(
    make: Make, rechosen: bool
) -> None:
    """Each request re-sends what the previous one chose; a number is valid only in a request
    that carried it (「编号必须在这次请求里出现过」), and the end keeps the last request's choice."""
    env = await make(
        summary={"context_window": 6000}, memsum_capacity="spec", memsum_summary_budget_ratio=0.5
    )
    rt, model = env.rt, env.model
    history = await seed(rt, 40, size=80)
    answers = 0

    def choose(body: dict[str, Any]) -> Reply:
        nonlocal answers
        answers += 1
        numbers = sorted(offered(body))
        if rechosen:
            return Reply(f"【保留原文】1、{numbers[-1]}\n{CHAT_SUMMARY}")
        if answers == 1:
            return Reply(f"【保留原文】{numbers[-1]}\n{CHAT_SUMMARY}")
        return Reply(f"【保留原文】1\n{CHAT_SUMMARY}")  # 1 was not re-sent: not offered now

    model.summary_default = choose
    result = await rt.compression.compress(GROUP.id)
    requests = model.summary_requests()
    assert len(requests) >= 3
    last = requests[-1]
    if rechosen:
        assert offered(requests[1])[1] == history[0].content  # re-sent with its own number
        assert offered(last)[1] == history[0].content
        kept = [history[0].content, offered(last)[max(offered(last))]]
    else:
        assert all(1 not in offered(body) for body in requests[1:])
        kept = []
    assert result.kept_messages == len(kept)
    assert [m.content for m in conversation(await rt.store.get_history(GROUP.id))] == kept
    assert len(await rt.store.get_archived(GROUP.id)) == len(history) - len(kept)


# ---- R-RUN-11: the divider ------------------------------------------------------------------------
async def test_r_run_11_the_previous_divider_is_archived_with_the_next_span_never_summarised(
    env: Env,
) -> None:
    rt, model = env.rt, env.model
    first = await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    (divider1,) = await rt.store.get_history(GROUP.id)
    assert (divider1.role, divider1.content, divider1.event_marker) == ("system", "对话已压缩", True)
    second = await seed(rt, 3, start=10)
    await rt.compression.compress(GROUP.id)
    assert DIVIDER not in conversation_of(model.summary_requests()[1])  # a marker is no unit
    active = await rt.store.get_history(GROUP.id)
    assert [(m.content, m.event_marker) for m in active] == [(DIVIDER, True)]
    assert active[0].id != divider1.id
    # The archive, in storage order: each message once.
    assert ids(await rt.store.get_archived(GROUP.id)) == ids([*first, divider1, *second])


async def test_r_run_11_done_is_reported_once_the_summary_archive_and_divider_are_written(env: Env) -> None:
    """The page inserts 「对话已压缩」 on `done`: by then the commit is visible to every reader."""
    rt = env.rt
    history = await seed(rt, 4)
    seen: list[tuple[str | None, list[str], int]] = []

    async def on_done(p: CompressionProgress) -> None:
        if p.phase == "done":
            record = await rt.store.get_meta(SUMMARY_NAMESPACE, GROUP.id)
            active = [m.content for m in await rt.store.get_history(GROUP.id)]
            seen.append(
                (record["text"] if record else None, active, len(await rt.store.get_archived(GROUP.id)))
            )

    rt.bus.subscribe(CompressionProgress, on_done)
    await rt.compression.compress(GROUP.id)
    assert seen == [(CHAT_SUMMARY, [DIVIDER], len(history))]


# ---- R-PROG-3's string through the library face ----------------------------------------------------
async def test_r_run_manual_compression_while_one_runs_is_refused_with_the_exact_reason(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    run, gate = await held_compression(env)
    with pytest.raises(CompressionError) as refused:
        await rt.compression.compress(GROUP.id)
    assert refused.value.reason == BUSY == "这个会话正在压缩"
    gate.open()
    assert (await run).outcome == "done"
    assert env.phases() == [("start", None), ("done", None)]  # the refusal reported nothing


# ---- R-MEM-1 and restarts ---------------------------------------------------------------------------
def _file_summary(path: Path, session_id: str) -> str | None:
    with sqlite3.connect(path) as db:
        row = db.execute(
            "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", (session_id,)
        ).fetchone()
    db.close()
    return row[0] if row else None


async def test_r_mem_1_summary_kept_originals_and_archive_survive_a_restart_and_the_next_run(
    location: Path | str, make: Make
) -> None:
    path = location
    env = await make(memsum_summary_budget_ratio=0.5, location=path)
    rt = env.rt
    short = await seed(rt, 3, size=2)
    long = await seed(rt, 2, start=3, size=300)
    env.model.summary.append(keeping(short[0].content, short[1].content))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 2
    await runtime.close(rt)
    if isinstance(path, Path):
        stored = _file_summary(path, GROUP.id)  # in the same SQLite file as the history
        assert stored is not None
        assert CHAT_SUMMARY.split("\n")[1] in stored

    again = await make(memsum_summary_budget_ratio=0.5, location=path)
    rt, model = again.rt, again.model
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY
    assert ids(conversation(await rt.store.get_history(GROUP.id))) == ids(short[:2])
    assert ids(await rt.store.get_archived(GROUP.id)) == ids([short[2], *long])
    newer = await seed(rt, 2, start=20, size=300)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    head = next(i for i, m in enumerate(messages) if str(m["content"]).startswith(INJECTION_HEAD))
    assert messages[head]["content"] == f"{INJECTION_HEAD}\n\n{CHAT_SUMMARY}"
    assert [m["content"] for m in messages[head + 1 : head + 5]] == [m.content for m in (*short[:2], *newer)]

    # The next run after the restart: the kept ones come first, numbered again from 1, with the
    # stored summary as the existing one; what is not chosen again is archived, once.
    model.summary.append(keeping(short[1].content))
    result = await rt.compression.compress(GROUP.id)
    request = model.summary_requests()[0]
    assert existing_summary_of(request) == CHAT_SUMMARY
    assert [offered(request)[1], offered(request)[2]] == [short[0].content, short[1].content]
    assert result.kept_messages == 1
    active = await rt.store.get_history(GROUP.id)
    assert ids(conversation(active)) == [short[1].id]
    archived = await rt.store.get_archived(GROUP.id)
    assert len(ids(archived)) == len(set(ids(archived)))  # nothing twice
    everything = ids([*short, *long, *newer])
    assert set(everything) <= set(ids(archived)) | {short[1].id}  # nothing lost
    assert [m.content for m in active if m.event_marker] == [DIVIDER]


async def test_r_mem_1_a_run_stopped_by_shutdown_writes_nothing_and_completes_once_after_restart(
    make: Make, tmp_path: Path
) -> None:
    path = tmp_path / "stopped.db"
    env = await make(location=path)
    rt = env.rt
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    history = await seed(rt, 5)
    run, gate = await held_compression(env)
    await runtime.close(rt)
    with pytest.raises(CompressionError):
        await run
    gate.open()

    again = await make(location=path)
    rt = again.rt
    assert (await summary_of(rt) or {})["text"] == OLD_SUMMARY["text"]  # the old state, whole
    assert ids(await rt.store.get_history(GROUP.id)) == ids(history)
    assert await rt.store.get_archived(GROUP.id) == []
    assert await rt.compression.resume() == 1
    await settle(rt)
    (request,) = again.model.summary_requests()
    assert existing_summary_of(request) == OLD_SUMMARY["text"]
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY
    assert [m.content for m in await rt.store.get_history(GROUP.id)] == [DIVIDER]
    assert ids(await rt.store.get_archived(GROUP.id)) == ids(history)  # each once, no divider twice


# ---- R-MEM-2: what a clear removes and what stays -------------------------------------------------
async def test_r_mem_2_clearing_the_context_takes_the_kept_originals_and_summary_and_keeps_settings(
    make: Make,
) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    await rt.settings.set("compress_at", "session", GROUP.id, 0.3)
    short = await seed(rt, 3, size=2)
    await seed(rt, 2, start=3, size=300)
    model.summary.append(keeping(short[0].content))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 1
    later = await seed(rt, 1, start=30)
    await rt.compression.clear(GROUP.id, "context")
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == []  # the kept original and the later line too
    archived = ids(await rt.store.get_archived(GROUP.id))
    assert short[0].id in archived
    assert later[0].id in archived
    assert (await rt.compression.status(GROUP.id)).compress_at == 0.3  # a setting is no context
    # Nothing left to summarise: no request, no progress.
    seen = len(env.progress)
    assert (await rt.compression.compress(GROUP.id)).outcome == "nothing"
    assert len(model.summary_requests()) == 1
    assert len(env.progress) == seen
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    sent = model.chat_requests()[-1]["messages"]
    assert not any(INJECTION_HEAD in str(m["content"]) or short[0].content == m["content"] for m in sent)


async def test_r_mem_2_clearing_the_summary_keeps_the_kept_originals_and_the_next_run_starts_fresh(
    make: Make,
) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    short = await seed(rt, 3, size=2)
    await seed(rt, 2, start=3, size=300)
    model.summary.append(keeping(short[0].content))
    await rt.compression.compress(GROUP.id)
    before = await rt.store.get_history(GROUP.id)
    await rt.compression.clear(GROUP.id, "summary")
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == before  # the kept original and the divider stay
    newer = await seed(rt, 2, start=30, size=300)
    await rt.compression.compress(GROUP.id)
    request = model.summary_requests()[1]
    assert existing_summary_of(request) == ""  # no summary left to merge into
    assert "〔已有摘要开始〕" not in user_of(request)
    assert offered(request)[1] == short[0].content
    assert [ANNOTATED.sub("", p) for p in conversation_of(request).split("\n\n")] == [
        m.content for m in (short[0], *newer)
    ]


async def test_r_mem_2_api_clear_defaults_to_the_context(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's clear without a type is the unified memory:clear of the context."""
    from nonebot_plugin_memsum import api

    rt = env.rt
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    await seed(rt, 1, start=10)
    monkeypatch.setattr(runtime, "_current", rt)  # the api on this test's runtime
    await api.clear(GROUP.id)
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == []


# ---- R-MEM-3: a summary-only clear during the commit ---------------------------------------------
async def test_r_mem_3_a_summary_clear_during_the_commit_waits_and_leaves_the_archive_as_committed(
    env: Env,
) -> None:
    rt = env.rt
    history = await seed(rt, 4)
    run, summary_gate = await held_compression(env)
    turn, chat_gate = await held_turn(env, Reply("好的", usage=usage(100)))
    summary_gate.open()
    await committing(rt)
    clearing = asyncio.create_task(rt.compression.clear(GROUP.id, "summary"))
    await asyncio.sleep(0.05)
    assert not clearing.done()
    chat_gate.open()
    assert await turn == "replied"
    assert (await run).outcome == "done"
    await clearing
    assert await summary_of(rt) is None  # the new summary, deleted after its commit
    assert ids(await rt.store.get_archived(GROUP.id)) == ids(history)  # the archive stays
    active = await rt.store.get_history(GROUP.id)
    assert [m.content for m in active][-1] == DIVIDER
    assert env.phases() == [("start", None), ("done", None)]


async def test_r_mem_3_a_clear_while_the_model_thinks_leaves_late_messages_and_writes_no_divider(
    env: Env,
) -> None:
    rt = env.rt
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 4)
    run, gate = await held_compression(env, Reply(NOTHING_KEPT))
    await rt.compression.clear(GROUP.id, "context")
    late = await seed(rt, 2, start=50)  # said after the clear, while the request is still out
    gate.open()
    with pytest.raises(CompressionCancelled) as failed:
        await run
    assert failed.value.reason == CLEARED
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == late  # never archived by the cancelled run
    assert DIVIDER not in [m.content for m in await rt.store.get_archived(GROUP.id)]
    assert talk(50) == late[0].content
