"""Audit 21 (srun): the full compression (R-RUN, R-PROG, R-FAIL, R-INJ, R-MEM) read from the
Chinese original as an outside tester would, driven through the runtime and the library face
on a real SQLite file with the real HTTP client against the scripted OpenAI-compatible server
(tests/fakes/llm_server.py). Only edges no earlier test pins are here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.compression.service import BUSY
from tests.fakes.service import CHAT_SUMMARY, GROUP, Env, held_compression, seed, settle, summary_of

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
