"""Audit 21 (srun): the full compression (R-RUN, R-PROG, R-FAIL, R-INJ, R-MEM) read from the
Chinese original as an outside tester would, driven through the runtime and the library face
on a real SQLite file with the real HTTP client against the scripted OpenAI-compatible server
(tests/fakes/llm_server.py). Only edges no earlier test pins are here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.compression.service import BUSY
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    Env,
    conversation_of,
    existing_summary_of,
    held_compression,
    offered,
    seed,
    settle,
    summary_of,
)

Library = Callable[..., Awaitable[Env]]


# ---- R-PROG-3: 「同一会话同时只有一次压缩：手动压缩遇到在途的…拒绝，后台跳过」 -----------------------
async def test_r_prog_3_a_manual_run_right_after_a_restart_and_the_resumed_run_are_never_both_running(
    library: Library, tmp_path: Path
) -> None:
    """A stop cut a compression short; at the next start it is queued again (runtime.resume)
    and the owner types /压缩 at once. The resumed run first looks up the questions left
    unanswered (a store read); the /压缩 that starts meanwhile is the session's one run, and the
    resumed one skips: one summary request, one start and one done, no failure, no back-off."""
    path = tmp_path / "restart.db"
    first = await library(location=path)
    await seed(first.rt, 5)
    cut, gate = await held_compression(first)
    await runtime.close(first.rt)
    with pytest.raises(api.CompressionError):
        await cut
    gate.open()

    env = await library(location=path)
    gate = env.model.hold_summary()
    await runtime.resume(env.rt)  # the interrupted run is queued again
    manual = asyncio.create_task(api.compress(GROUP.id))
    await gate.reached()
    gate.open()
    assert (await manual).outcome == "done"
    await settle(env.rt)

    assert len(env.model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]
    assert env.failure_warnings() == []
    status = await api.status(GROUP.id)
    assert (status.running, status.backoff_failures) == (False, 0)
    assert (await summary_of(env.rt) or {})["text"] == CHAT_SUMMARY
    # And with the session's run in flight, a second /压缩 is still refused with the reason.
    await seed(env.rt, 3, start=10)
    held, again = await held_compression(env)
    with pytest.raises(api.CompressionError) as refused:
        await api.compress(GROUP.id)
    assert refused.value.reason == BUSY
    again.open()
    assert (await held).outcome == "done"


# ---- R-RUN-8/10: a later request of a chunked run answered without the 【保留原文】 heading -------
async def test_r_run_8_10_a_later_reply_without_the_heading_drops_what_an_earlier_one_chose_and_warns(
    library: Library,
) -> None:
    """「回复里没有【保留原文】标题时整份当摘要用、这次不保留原文…这次请求里有编号可选时记一条告警」 in
    a run of several requests (「保留的是最后一次请求挑中的」): the first request keeps a unit, the
    next re-sends it with its number and is answered without the heading. Nothing is kept in
    the end, that whole reply is the next request's existing summary (nothing re-sent with
    it), the run succeeds, and each request that offered numbers and got no heading warns."""
    env = await library(
        summary={"context_window": 6000, "max_output_tokens": 1000}, memsum_summary_budget_ratio=0.5
    )
    stored = await seed(env.rt, 100, size=60)
    bodies: list[dict[str, Any]] = []
    replies: list[str] = []

    def answer(body: dict[str, Any]) -> Reply:
        bodies.append(body)
        summary = f"## 最近在聊什么\n第{len(bodies)}块\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
        reply = f"【保留原文】{max(offered(body))}\n{summary}" if len(bodies) == 1 else summary
        replies.append(reply)
        return Reply(reply)

    env.model.summary_default = answer
    env.warnings.clear()

    result = await api.compress(GROUP.id)

    assert len(bodies) >= 3
    chosen = max(offered(bodies[0]))
    assert offered(bodies[1])[chosen] == offered(bodies[0])[chosen]  # re-sent, so offered
    for k in range(2, len(bodies)):
        assert existing_summary_of(bodies[k]) == replies[k - 1]  # the whole reply
        assert offered(bodies[0])[chosen] not in conversation_of(bodies[k])  # nothing carried
    assert (result.outcome, result.kept_messages, result.archived) == ("done", 0, len(stored))
    assert [m for m in await api.history(GROUP.id) if m.is_conversation] == []
    assert (await api.status(GROUP.id)).summary == replies[-1]
    assert len([w for w in env.warnings if "保留原文" in w]) == len(bodies) - 1, env.warnings
    assert env.phases() == [("start", None), ("done", None)]
