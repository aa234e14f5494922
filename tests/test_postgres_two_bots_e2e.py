"""Two bot processes on one PostgreSQL memory (issue 13): two `bot.py` subprocesses with the
same MEMSUM_DB_URL on a real server (tests/fakes/pgserver.py), each with a simulated OneBot
implementation on the real reverse WebSocket, both connected as the same QQ account (a
standby beside the first), one scripted model on real HTTP.

- both record into their groups, into the one database;
- `/压缩` sent in both processes on the same session at the same moment: exactly one
  compression (one summary request, one divider, one run record); the other process
  answers 「这个会话正在压缩」 (R-PROG-3 across processes: the advisory lock);
- the first process is SIGKILLed right as its next compression commits: the session is in
  its old state or its new one (R-RUN-11), never a mixture, and the second process carries
  on: every message stored once, `/摘要` shows the stored summary, and its next turn sends
  the model that summary and the active history.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
from collections.abc import Callable
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, until, wait_log
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, ApiCall, OneBotSim, plain_text
from tests.fakes.pgdb import fresh_database, raw
from tests.fakes.pgserver import PgServer

OWNER = 10001
GROUP_A, GROUP_B = 801, 802
BUSY = "这个会话正在压缩"
DIVIDER = "对话已压缩"
SUMMARISER = "你是对话摘要员"
FIRST = "## 最近在聊什么\n大家约了周六爬山\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
SECOND = "## 最近在聊什么\n爬山改到周日，阿强带水\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


def is_summary(body: dict[str, Any]) -> bool:
    return str(body["messages"][0].get("content") or "").startswith(SUMMARISER)


async def say(sim: OneBotSim, group: int, lines: list[str], base: int) -> list[str]:
    """Members' talk in a group; the contents as the bot stores them."""
    stored = []
    for i, text in enumerate(lines):
        qq = base + i % 3
        await sim.group_message(group, qq, text, nickname=f"成员{qq}")
        stored.append(f"[成员{qq}({qq})] {text}")
    return stored


async def command(sim: OneBotSim, group: int, words: str) -> str:
    mark = len(sim.calls)
    await sim.group_message(group, OWNER, words, nickname="群主")
    call = await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=mark, timeout=60)
    return plain_text(call.params.get("messages") or call.params.get("message") or [])


async def contents(url: str, sid: str) -> list[tuple[str, int]]:
    rows = await raw(url, "SELECT content, archived FROM messages WHERE session_id = ? ORDER BY id", (sid,))
    return [(c, a) for c, a in rows]


async def summary_of(url: str, sid: str) -> dict[str, Any] | None:
    rows = await raw(url, "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", (sid,))
    return json.loads(rows[0][0]) if rows else None


async def test_two_processes_share_one_memory_one_compression_and_survive_a_kill(
    tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer
) -> None:
    sid = group_sid(GROUP_A)
    with ScriptedLLM() as llm:
        first_gate = Gate(Reply("【保留原文】无\n" + FIRST), holds=is_summary)
        llm.on_request(first_gate)
        llm.default = Reply("收到")
        async with fresh_database(pg_server.url()) as url:
            settings = {
                "MEMSUM_MODELS": json.dumps([llm.model_config()]),
                "MEMSUM_DB_URL": url,
                "LOG_LEVEL": "INFO",
            }
            bot_a = BotProcess(tmp_path_factory.mktemp("bot_a"), env=settings)
            bot_b = BotProcess(tmp_path_factory.mktemp("bot_b"), env=settings)
            async with bot_a, bot_b:
                sim_a = OneBotSim(bot_a.ws_url, self_id=SELF_ID, access_token=bot_a.access_token)
                sim_b = OneBotSim(bot_b.ws_url, self_id=SELF_ID, access_token=bot_b.access_token)
                sim_b._ids = itertools.count(500_001)  # one account: message ids never repeat
                async with sim_a, sim_b:
                    await wait_log(bot_a, f"Bot {SELF_ID} connected")
                    await wait_log(bot_b, f"Bot {SELF_ID} connected")

                    # Both record into their groups, into the one database.
                    talk_a = await say(sim_a, GROUP_A, [f"周六爬山第{i}句" for i in range(6)], 20001)
                    talk_b = await say(sim_b, GROUP_B, [f"二群闲聊第{i}句" for i in range(4)], 30001)

                    async def recorded() -> bool:
                        a = [c for c, _ in await contents(url, sid)]
                        b = [c for c, _ in await contents(url, group_sid(GROUP_B))]
                        return a == talk_a and b == talk_b

                    await until(recorded, "both groups' talk in the database", within=30)

                    # R-PROG-3 across processes: /压缩 in both at once, one compression.
                    both = [
                        asyncio.create_task(command(sim_a, GROUP_A, "/压缩")),
                        asyncio.create_task(command(sim_b, GROUP_A, "/压缩")),
                    ]
                    with first_gate:
                        await first_gate.reached()
                        done, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED, timeout=60)
                        assert len(done) == 1, "neither process answered while the other compressed"
                        assert BUSY in done.pop().result()
                    answers = await asyncio.gather(*both)
                    assert sorted(BUSY in a for a in answers) == [False, True]
                    assert any(a.startswith("压缩完成") for a in answers)
                    assert len([b for b in llm.requests if is_summary(b)]) == 1
                    assert await raw(
                        url, "SELECT COUNT(*) FROM compressions WHERE session_id = ?", (sid,)
                    ) == [(1,)]
                    stored = await contents(url, sid)
                    assert stored == [(c, 1) for c in talk_a] + [(DIVIDER, 0)]
                    summary = await summary_of(url, sid)
                    assert summary is not None
                    assert summary["text"] == FIRST
                    llm.reset()
                    llm.default = Reply("收到")

                    # The first process is killed as its next compression commits.
                    more = await say(sim_a, GROUP_A, [f"改到周日第{i}句" for i in range(5)], 20001)
                    await until(
                        lambda: _count(url, sid, len(stored) + len(more)), "the new talk stored", within=30
                    )
                    second_gate = llm.gate(Reply("【保留原文】无\n" + SECOND), holds=is_summary)
                    with second_gate:
                        await sim_a.group_message(GROUP_A, OWNER, "/压缩", nickname="群主")
                        await second_gate.reached()
                    await asyncio.sleep(random.uniform(0, 0.05))  # the reply parsed, the commit running
                    assert bot_a._proc is not None
                    bot_a._proc.send_signal(signal.SIGKILL)
                    assert await bot_a.wait_exit(15) == -signal.SIGKILL

                    # Old or new, never a mixture (R-RUN-11).
                    after = await contents(url, sid)
                    summary = await summary_of(url, sid)
                    assert summary is not None
                    old = [(c, 1) for c in talk_a] + [(DIVIDER, 0)] + [(c, 0) for c in more]
                    new = [(c, 1) for c in talk_a] + [(DIVIDER, 1)] + [(c, 1) for c in more] + [(DIVIDER, 0)]
                    if summary["text"] == FIRST:
                        assert after == old
                    else:
                        assert summary["text"] == SECOND
                        assert after == new

                    # The second process, the same account, carries on with the memory.
                    shown = await command(sim_b, GROUP_A, "/摘要")
                    assert summary["text"].splitlines()[1] in shown
                    mark, calls = len(llm.requests), len(sim_b.calls)
                    question = await say(sim_b, GROUP_A, ["小记，周末几点出发？"], 20002)
                    await sim_b.wait_call(set(SEND_ACTIONS), after=calls, timeout=60, predicate=_says("收到"))
                    chat = [b for b in llm.requests[mark:] if not is_summary(b)][-1]
                    prompt = json.dumps(chat["messages"], ensure_ascii=False)
                    assert summary["text"].splitlines()[1] in prompt
                    active = [c for c, a in await contents(url, sid) if not a and c != DIVIDER]
                    assert active[-1] == "收到"  # the answer, stored after the question
                    for line in active[:-1]:  # the history up to the question, as left
                        assert line in prompt
                    everything = [c for c, _ in await contents(url, sid)]
                    for line in talk_a + more + question:
                        assert everything.count(line) == 1


def _says(text: str) -> Callable[[ApiCall], bool]:
    return lambda call: plain_text(call.params.get("message") or []) == text


async def _count(url: str, sid: str, n: int) -> bool:
    return len(await contents(url, sid)) >= n
