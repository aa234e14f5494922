"""The bot on PostgreSQL end to end (issue 13): bot.py as a subprocess with MEMSUM_DB_URL,
the OneBot simulator over the real reverse WebSocket, a scripted model on real HTTP, and
a real PostgreSQL server (tests/fakes/pgserver.py).

One group's life: talk recorded, `/压缩` archives it in one transaction and injects the
summary, `/回忆` finds a detail the summary dropped, `/清除 上下文` clears it for good
(also for recall), and a restart finds the memory as it was left. A bad MEMSUM_DB_URL and
an unreachable server each stop start-up with one line and no password.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import group_sid, query, restart, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, plain_text
from tests.fakes.pgdb import fresh_database
from tests.fakes.pgserver import PgServer

SUPERUSER = 10001
GROUP = 991
CODE = "q7z4"
SUMMARY = "## 最近在聊什么\n阿强(20002) 分享了复习资料。\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
TALK = [
    (20001, "小明", "期末复习资料谁有啊"),
    (20002, "阿强", f"我传网盘了，提取码：{CODE}"),
    (20003, "莉莉", "谢谢强哥！周末一起去图书馆自习吧"),
]


def model(body: dict[str, Any]) -> Reply:
    first = str(body["messages"][0].get("content") or "")
    return Reply("【保留原文】无\n" + SUMMARY) if first.startswith("你是对话摘要员") else Reply("收到")


@pytest.fixture(scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer
) -> AsyncIterator[tuple[BotProcess, OneBotSim, str]]:
    with ScriptedLLM() as llm:
        llm.on_request(model)
        async with fresh_database(pg_server.url()) as url:
            # INFO: at DEBUG NoneBot itself prints every .env value (README, 配置).
            settings = {
                "MEMSUM_MODELS": json.dumps([llm.model_config()]),
                "MEMSUM_DB_URL": url,
                "LOG_LEVEL": "INFO",
            }
            async with running_bot(tmp_path_factory.mktemp("pg"), settings) as (bot, sim):
                yield bot, sim, url


async def command(sim: OneBotSim, words: str) -> str:
    mark = len(sim.calls)
    await sim.group_message(GROUP, SUPERUSER, words, nickname="群主")
    call = await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=mark, timeout=30)
    return plain_text(call.params.get("messages") or call.params.get("message") or [])


async def test_compress_recall_clear_and_restart_on_postgresql(
    env: tuple[BotProcess, OneBotSim, str],
) -> None:
    bot, sim, url = env
    sid = group_sid(GROUP)
    assert not bot.db_path.exists()  # nothing went to a SQLite file
    assert "memsum: database postgresql://memsum@127.0.0.1:" in bot.log()
    assert "memsum-test-pw" not in bot.log(all_runs=True)  # never the password
    for qq, name, words in TALK:
        await sim.group_message(GROUP, qq, words, nickname=name)

    async def stored() -> bool:
        return len(await query(url, "SELECT id FROM messages WHERE session_id = ?", sid)) == len(TALK)

    await until(stored, "the talk stored")

    assert (await command(sim, "/压缩")).startswith("压缩完成")
    rows = await query(url, "SELECT archived, content FROM messages WHERE session_id = ? ORDER BY id", sid)
    assert [a for a, _ in rows] == [1, 1, 1, 0]  # archived, then the divider
    assert rows[-1][1] == "对话已压缩"
    [(summary,)] = await query(url, "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", sid)
    assert CODE not in summary

    shown = (await command(sim, "/回忆 提取码")).splitlines()
    assert shown[0] == "找到 1 条（按相关程度排列）："
    assert shown[1].endswith(f"[阿强(20002)] 我传网盘了，提取码：{CODE}")
    assert "复习资料" in await command(sim, "/摘要")

    await restart(bot, sim)  # the memory is the database's, not the process's
    assert "复习资料" in await command(sim, "/摘要")
    assert (await command(sim, "/回忆 提取码")).splitlines()[0] == "找到 1 条（按相关程度排列）："

    await command(sim, "/清除 上下文")
    assert "已清除" in await command(sim, "确认")
    assert await query(url, "SELECT 1 FROM messages WHERE session_id = ? AND archived = 0", sid) == []
    assert await query(url, "SELECT 1 FROM metadata WHERE namespace = 'summary' AND key = ?", sid) == []
    assert await command(sim, "/回忆 提取码") == "没有找到相关的聊天记录。"
    assert len(await query(url, "SELECT id FROM messages WHERE session_id = ?", sid)) == len(TALK) + 1


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://memsum:hunter2@127.0.0.1:1/memsum", "MEMSUM_DB_URL: cannot connect to"),
        ("postgresql://memsum:hunter2@127.0.0.1:bad/memsum", "invalid MEMSUM_DB_URL"),
    ],
    ids=["unreachable", "malformed"],
)
async def test_a_bad_database_url_stops_start_up_with_one_line(
    tmp_path_factory: pytest.TempPathFactory, url: str, shown: str
) -> None:
    bot = BotProcess(tmp_path_factory.mktemp("pgbad"), env={"MEMSUM_DB_URL": url, "LOG_LEVEL": "INFO"})
    with pytest.raises(BotExitedError) as exited:
        async with bot:
            pass
    lines = [line for line in exited.value.log.splitlines() if "nonebot-plugin-memsum" in line]
    assert len(lines) == 1, lines
    assert shown in lines[0]
    assert "hunter2" not in exited.value.log
    assert exited.value.returncode != 0
