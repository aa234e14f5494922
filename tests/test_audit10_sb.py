"""Audit 10 (sb): the specification read literally, sentence by sentence, for R-TRIG, R-BACK,
R-FAIL and R-PROG, as someone who has read only the Chinese original and DESIGN.md would
check it: real turns of the built-in agent, a private runtime on a real SQLite file, the
real HTTP client against the scripted OpenAI-compatible server. Each scenario is a claim of
the original that the earlier tests pinned only near by (a pure function, another path) or
not at all."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nonebot_plugin_memsum.agent.events import UsageEvent
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.compression.request import REFUSED_WINDOW
from nonebot_plugin_memsum.compression.service import BUSY, DIVIDER, INJECTION_HEAD
from nonebot_plugin_memsum.errors import CompressionError
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    GROUP,
    IN_GROUP,
    OLD_SUMMARY,
    Env,
    Make,
    keeping,
    offered,
    seed,
    settle,
    summary_of,
    usage,
)

# Chat window 10000 at compress_at 0.5: E = min(5000, 10000 − 1024) = 5000. With trim ratio
# 0.3 the trim budget is ⌊0.3 × 10000⌋ − 1024 = 1976, under 30 lines of ~130 characters:
# every turn's request would be hard-trimmed.
TRIMMED: dict[str, Any] = {"chat": {"context_window": 10000}, "memsum_trim_ratio": 0.3}
FAIL = Reply(status=500, error="summariser down", headers={"Retry-After": "0"})


def turn_usages(env: Env) -> list[UsageEvent]:
    events: list[UsageEvent] = []
    env.rt.bus.subscribe(UsageEvent, lambda e: events.append(e) if e.turn_id else None)
    return events


def offered_texts(body: dict[str, Any]) -> list[str]:
    return list(offered(body).values())


def starts(env: Env, session_id: str = GROUP.id) -> int:
    return sum(1 for phase, _ in env.phases(session_id) if phase == "start")


async def one_turn(
    env: Env, reply: Reply | None = None, *, session: SessionRecord = GROUP, entry: Entry = IN_GROUP
) -> str:
    """One more member line, then a turn answered by `reply` (default: a plain answer)."""
    await seed(env.rt, 1, record=session, start=9000 + len(env.model.chat_requests()))
    if reply is not None:
        env.model.chat.append(reply)
    outcome = await env.rt.agent.run_turn(session.id, entry=entry)
    await settle(env.rt)
    return outcome


# ---- R-TRIG-3 / R-CFG-4: 「0 表示不按用量压缩（条数线照样起作用）」 ------------------------------------
async def test_r_trig_3_with_compress_at_0_a_hard_trimmed_turn_starts_nothing_but_the_count_line_does(
    make: Make,
) -> None:
    # 经过了硬裁剪就算到线 belongs to the usage line; with compress_at 0 there is no usage line,
    # so even a trimmed turn (and the turn that would compress before its request) starts no
    # run. The count line, set afterwards, still does.
    env = await make(**TRIMMED, memsum_compress_at=0)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    usages = turn_usages(env)
    for _ in range(3):
        assert await one_turn(env, Reply("好的", usage=usage(9000))) == "replied"
    assert [u.trimmed for u in usages] == [True, True, True]
    assert all(2 * u.untrimmed_history >= 1976 for u in usages)  # enough to compress, were the line on
    assert model.summary_requests() == []
    assert env.progress == []
    await rt.settings.set("history_limit", "session", GROUP.id, 10)
    assert await one_turn(env) == "replied"
    assert len(model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]


# ---- R-TRIG-2: 「两条线按会话与用量事件上的入口平台解析」 (the count line too) ---------------------------
async def test_r_trig_2_the_count_line_of_a_session_without_a_birth_platform_follows_its_entry(
    make: Make,
) -> None:
    # Two internal sessions (no birth platform), each with 3 lines. The private tier sets the
    # count line 4: a turn that came in through onebot/private stores its reply, 4 ≥ 4, due.
    # The same turn with no entry platform has only the global count line (0): never due.
    env = await make(memsum_tiers={"onebot.private": {"history_limit": 4}})
    rt, model = env.rt, env.model
    via_private = SessionRecord(id="audit10:cron-private", platform=None, kind="internal")
    nowhere = SessionRecord(id="audit10:cron-plain", platform=None, kind="internal")
    usages = turn_usages(env)
    await seed(rt, 2, record=nowhere)
    assert await one_turn(env, session=nowhere, entry=Entry()) == "replied"
    assert usages[-1].history_limit == 0
    assert model.summary_requests() == []
    await seed(rt, 2, record=via_private)
    assert await one_turn(env, session=via_private, entry=Entry("onebot", "private")) == "replied"
    assert (usages[-1].history_limit, usages[-1].history_messages) == (4, 3)
    assert len(model.summary_requests()) == 1
    assert env.phases(via_private.id) == [("start", None), ("done", None)]
    assert env.phases(nowhere.id) == []


# ---- R-TRIG-4: 「会话条数只数对话消息」: notices are conversation, event markers are not ----------------
@pytest.mark.parametrize(("notices", "due"), [(2, True), (1, False)])
async def test_r_trig_4_notices_count_towards_the_count_line_and_event_markers_do_not(
    make: Make, notices: int, due: bool
) -> None:
    # Count line 5: 2 member lines + `notices` platform notices + the stored reply; two event
    # markers (a divider-like system item and a silent turn's record) never count.
    env = await make(memsum_history_limit=5)
    rt = env.rt
    await seed(rt, 1)
    for i in range(notices):
        await rt.agent.record(GROUP, Message(role="notice", content=f"[新人{i}(3000{i})] 加入了本群"))
    for text in (DIVIDER, "（助手本轮选择不回复）"):
        await rt.store.append(GROUP.id, Message(role="system", content=text, event_marker=True))
    usages = turn_usages(env)
    assert await one_turn(env) == "replied"
    assert usages[-1].history_messages == 2 + notices
    assert starts(env) == int(due)


# ---- R-PROG-3: 「手动压缩遇到在途的以「这个会话正在压缩」拒绝」, the turn's own run in flight -------
async def test_r_prog_3_a_manual_compress_while_a_turns_own_run_waits_is_refused_and_reports_nothing(
    make: Make,
) -> None:
    env = await make(**TRIMMED, memsum_compress_at=0.5)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    gate = model.hold_summary()
    with gate:
        turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
        await gate.reached()  # the turn compresses before its request and waits on the model
        assert rt.compression.is_running(GROUP.id)
        with pytest.raises(CompressionError) as refused:
            await rt.compression.compress(GROUP.id)
        assert refused.value.reason == BUSY == "这个会话正在压缩"
        assert env.phases() == [("start", None)]  # the refusal reports no progress of its own
    assert await turn == "replied"
    await settle(rt)
    assert env.phases() == [("start", None), ("done", None)]
    assert len(model.summary_requests()) == 1


# ---- R-FAIL-1 / R-FAIL-3: a failed background run leaves the old summary injected as it was ----------
async def test_r_fail_1_after_a_failed_background_run_the_old_summary_is_still_what_the_model_reads(
    make: Make,
) -> None:
    env = await make(memsum_history_limit=4)
    rt, model = env.rt, env.model
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await seed(rt, 3)
    model.summary_default = FAIL
    assert await one_turn(env) == "replied"  # 4 lines + the reply: due, the run fails
    [(first, _), (last, reason)] = env.phases()
    assert (first, last) == ("start", "error")
    assert (reason or "").startswith("摘要模型出错")
    assert len(env.failure_warnings()) == 1
    # 不写摘要、不归档、不写分隔线: the old summary, every line active, no divider.
    assert await summary_of(rt) == OLD_SUMMARY
    history = await rt.store.get_history(GROUP.id)
    assert all(m.is_conversation for m in history)
    assert len(history) == 5
    assert await rt.store.get_archived(GROUP.id) == []
    # The next turn (judged turn 1 of the back-off's 2: no run) still reads the old summary,
    # whole, after the fixed first sentence, and the whole history after it.
    assert await one_turn(env) == "replied"
    sent = model.chat_requests()[-1]["messages"]
    injected = [m["content"] for m in sent if m["role"] == "system" and INJECTION_HEAD in m["content"]]
    assert injected == [f"{INJECTION_HEAD}\n\n{OLD_SUMMARY['text']}"]
    assert starts(env) == 1


# ---- R-FAIL-2: a summary window too small fails a background run like any failure, and backs off ------
async def test_r_fail_2_a_window_too_small_fails_the_background_run_and_counts_for_the_back_off(
    make: Make,
) -> None:
    env = await make(summary={"context_window": 1000}, memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 2)
    before = len(await rt.store.get_history(GROUP.id))
    assert await one_turn(env) == "replied"
    assert env.phases() == [("start", None), ("error", REFUSED_WINDOW)]
    assert model.summary_requests() == []  # refused before any request is sent
    assert len(env.failure_warnings()) == 1
    assert await summary_of(rt) is None
    assert len(await rt.store.get_history(GROUP.id)) == before + 2  # its line and the reply
    status = await rt.compression.status(GROUP.id)
    assert (status.backoff_failures, status.backoff_turns_left) == (1, 2)
    # 到此后判定的第 2 轮才重试: one turn without a run, then the retry (refused again: wait 4).
    assert await one_turn(env) == "replied"
    assert starts(env) == 1
    assert await one_turn(env) == "replied"
    assert starts(env) == 2
    status = await rt.compression.status(GROUP.id)
    assert (status.backoff_failures, status.backoff_turns_left) == (2, 4)


# ---- R-TRIG-1 / R-BACK-2: 「条数规则从中取条数线」: a manual run takes the count line of the entry --------
async def test_r_back_2_a_manual_run_takes_the_count_line_of_the_entry_platform_of_the_latest_usage(
    make: Make,
) -> None:
    # An internal session that came in through onebot/private, whose tier sets the count line
    # 10 (⌊10 / 2⌋ = 5 may stay). Two long lines, then four short ones, the turn's line and its
    # reply: 8 < 10, no run at turn end. The summariser asks to keep all six short messages
    # (well under the keep cap, half of what is compressed); nothing follows the cut, so the
    # count rule leaves 5, dropping the earliest.
    env = await make(memsum_summary_budget_ratio=0.5, memsum_tiers={"onebot.private": {"history_limit": 10}})
    rt, model = env.rt, env.model
    cron = SessionRecord(id="audit10:cron-keep", platform=None, kind="internal")
    await seed(rt, 2, record=cron, size=300)
    await seed(rt, 4, record=cron, start=2, size=2)
    assert await one_turn(env, session=cron, entry=Entry("onebot", "private")) == "replied"
    assert model.summary_requests() == []
    short = [m.content for m in (await rt.store.get_history(cron.id))[2:]]
    assert len(short) == 6
    model.summary.append(keeping(*short))
    result = await rt.compression.compress(cron.id)
    assert result.outcome == "done"
    active = [m.content for m in await rt.store.get_history(cron.id) if m.is_conversation]
    assert active == short[1:]
    assert result.kept_messages == 5


async def test_r_back_2_the_turns_own_run_takes_the_count_line_of_the_turns_entry(make: Make) -> None:
    # The same rule for the run a hard-trimmed turn makes before its request (README
    # decisions): the first turn of an internal session that came in through onebot/private,
    # whose tier sets the count line 10. Six short lines, then ten long ones: the last ten
    # messages sent are over the trim budget (1976), so the turn compresses first, its span
    # ending before the question. The summariser keeps the six short lines; after the cut
    # only the question is left, so at most ⌊10 / 2⌋ − 1 = 4 of them may stay.
    env = await make(
        **TRIMMED, memsum_compress_at=0.5, memsum_tiers={"onebot.private": {"history_limit": 10}}
    )
    rt, model = env.rt, env.model
    cron = SessionRecord(id="audit10:cron-in-turn", platform=None, kind="internal")
    short = [m.content for m in await seed(rt, 6, record=cron, size=2)]
    await seed(rt, 10, record=cron, start=6, size=1200)
    model.summary_default = keeping(*short)
    usages = turn_usages(env)
    assert await one_turn(env, session=cron, entry=Entry("onebot", "private")) == "replied"
    assert not usages[-1].trimmed  # the run made room before the request
    assert env.phases(cron.id) == [("start", None), ("done", None)]
    assert set(offered_texts(model.summary_requests()[-1])) >= set(short)
    active = [m.content for m in await rt.store.get_history(cron.id) if m.is_conversation]
    # The four latest short lines, then the question and the answer.
    assert active[:4] == short[2:]
    assert len(active) == 6
    assert (await rt.compression.status(cron.id)).kept_messages == 4
