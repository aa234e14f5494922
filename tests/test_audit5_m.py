"""Outside audit 5 (m): a bot owner whose machine crashes, reboots and runs hundreds of
groups (issue 15). bot.py as a real process on its own SQLite file, the OneBot simulator
over the reverse WebSocket (tests/fakes/onebot.py, which cites the implementations it
imitates), the scripted model server: kills and stops at points the crash tests do not
reach, the recovery switches turned off, reconnects, history actions that fail for some
places, a database that cannot be written, and what the log keeps of all of it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.onebot.recovery import PROBES
from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, query, until, wait_log
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, ActionFailedError, OneBotSim, at, text

pytestmark = pytest.mark.e2e

PERSONA = "你是审计群里的助手小记。"


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def env(llm: ScriptedLLM, **extra: str) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA, **extra}


@pytest.fixture
def answering(llm: ScriptedLLM) -> ScriptedLLM:
    llm.reset()
    llm.on_request(lambda b: Reply("好的") if is_chat(b) else None)
    return llm


async def said(bot: BotProcess, sid: str) -> list[str]:
    rows = await query(bot.db_path, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", sid)
    return [str(r[0]) for r in rows]


async def holds(bot: BotProcess, sid: str, n: int) -> bool:
    return len(await said(bot, sid)) >= n


async def connect(bot: BotProcess, sim: OneBotSim) -> None:
    await sim.connect()
    await wait_log(bot, f"Bot {SELF_ID} connected")


def history_calls(sim: OneBotSim) -> list[int]:
    return [int(c.params["group_id"]) for c in sim.calls if c.action == "get_group_msg_history"]


# ---- the backfill: a history action that fails for some places --------------------------
async def test_a_group_whose_history_cannot_be_read_does_not_stop_the_backfill_of_the_others(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # LLOneBot answers 「未找到消息」 for a place it holds no message of (the simulator's
    # "llonebot" dialect cites its source): here two groups the bot was removed from while
    # it was down. The oldest of them is the first fetched. One failure said the whole
    # implementation lacked the action, and nothing said in any group was backfilled.
    groups = [7101, 7102, 7103, 7104, 7105]
    gone = {7101, 7103}
    async with BotProcess(tmp_path / "bot", env=env(answering), log_level="INFO") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        sim.history_like("llonebot")
        await connect(bot, sim)
        for group in groups:  # oldest first: 7101 is fetched first
            await sim.group_message(group, 20001, "早上好", nickname="甲")
            await until(lambda group=group: holds(bot, group_sid(group), 1), "the group's message")
        await sim.close()
        for group in groups:
            await sim.group_message(group, 20002, "机器人不在的时候说的", nickname="乙")
        for group in gone:
            del sim._places[("group", group)]
        await connect(bot, sim)
        log = await wait_log(bot, "memsum: backfill of 10000:")
        assert "messages said while away stored in 5 sessions" in log
        assert "2 could not be fetched" in log
        assert "cannot get_group_msg_history" not in log
        for group in groups:
            expected = ["[甲(20001)] 早上好"]
            if group not in gone:
                expected.append("[乙(20002)] 机器人不在的时候说的")
            assert await said(bot, group_sid(group)) == expected, group
        assert sorted(history_calls(sim)) == groups  # each once
        await sim.close()


async def test_an_implementation_failing_every_history_call_gets_a_few_calls_and_one_line(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # NapCat answers retcode 1200 when an action throws (src/onebot/action/OneBotAction.ts
    # `websocketHandle`); failing for every place is an implementation that cannot serve it.
    groups = list(range(7201, 7211))
    async with BotProcess(tmp_path / "bot", env=env(answering), log_level="INFO") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)

        def broken(params: dict[str, Any]) -> Any:
            raise ActionFailedError(1200, "getMsgHistory error")

        sim.responders["get_group_msg_history"] = broken
        await connect(bot, sim)
        for group in groups:
            await sim.group_message(group, 20001, "在吗", nickname="甲")
        await until(lambda: holds(bot, group_sid(groups[-1]), 1), "the messages")
        await sim.close()
        await connect(bot, sim)
        log = await wait_log(bot, "memsum: backfill of 10000:")
        assert log.count("cannot get_group_msg_history") == 1
        assert len(history_calls(sim)) == PROBES  # not one per group
        await sim.close()


# ---- a reconnect while the model thinks -------------------------------------------------
def answers_to(sim: OneBotSim, message_id: int) -> list[Any]:
    """Sends that quote `message_id` (a group answer quotes its question)."""
    return [
        c
        for c in sim.calls
        if c.action in SEND_ACTIONS
        and any(
            isinstance(seg, dict) and seg.get("type") == "reply" and str(seg["data"]["id"]) == str(message_id)
            for seg in c.params.get("message") or []
        )
    ]


async def closed_by_peer(bot: BotProcess, times: int) -> None:
    async def seen() -> bool:
        return bot.log().count("closed by peer") >= times

    await until(seen, "the bot to see the connection go")


async def test_an_answer_ready_while_the_implementation_reconnects_is_sent_once_it_is_back(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # NapCat (or QQ) restarting while the model thinks: the answer was stored and marked as
    # being sent, its send failed with ApiNotAvailable, and the reconnect's resume rightly
    # left the question alone (marked answered). The member never got an answer.
    llm.reset()
    group = 7301
    sid = group_sid(group)
    async with BotProcess(tmp_path / "bot", env=env(llm), log_level="INFO") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await connect(bot, sim)
        with llm.gate(Reply("想好了：周六。"), holds=is_chat) as gate:
            question = await sim.group_message(group, 20001, [at(SELF_ID), text(" 哪天去？")], nickname="甲")
            await gate.reached()
            await sim.close()
            await closed_by_peer(bot, 1)
            gate.open()
            await until(lambda: holds(bot, sid, 2), "the answer stored")
        await connect(bot, sim)
        await until(lambda: _true(answers_to(sim, question)), "the answer sent on the new connection")
        await sim.group_message(group, 20002, "好的", nickname="乙")
        await until(lambda: holds(bot, sid, 3), "a later message")
        assert len(answers_to(sim, question)) == 1
        assert await said(bot, sid) == [
            "[甲(20001)] @小记(10000) 哪天去？",
            "想好了：周六。",
            "[乙(20002)] 好的",
        ]
        assert "could not send a reply" not in bot.log()
        await sim.close()


async def _true(value: object) -> bool:
    return bool(value)


# ---- a database the bot cannot use at start-up ------------------------------------------
async def bot_with_history(tmp_path: Path, llm: ScriptedLLM) -> BotProcess:
    """A bot folder whose database holds one group's message, the bot stopped."""
    async with BotProcess(tmp_path / "bot", env=env(llm), log_level="INFO") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await connect(bot, sim)
        await sim.group_message(7401, 20001, "要保住的一句", nickname="甲")
        await until(lambda: holds(bot, group_sid(7401), 1), "the message stored")
        await sim.close()
    return bot


def rows_of(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT session_id, content FROM messages ORDER BY id").fetchall()


def read_only_to(bot: BotProcess) -> None:
    """The database's files become read-only to the bot (its folder stays writable)."""
    for path in bot.db_path.parent.glob("memsum.db*"):
        path.chmod(0o444)
    if os.geteuid() == 0:  # root writes whatever the mode says, unless it drops these capabilities
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without util-linux setpriv")
        bot.wrapper = (setpriv, "--bounding-set=-dac_override,-dac_read_search")


async def test_a_database_file_the_bot_cannot_write_stops_start_up_with_one_line(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # A backup restored as another user, a file copied off a read-only mount: start-up went
    # on, and every message then failed to store, one traceback each, all of them lost.
    bot = await bot_with_history(tmp_path, answering)
    before = rows_of(bot.db_path)
    read_only_to(bot)
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    log = exited.value.log
    naming = [line for line in log.splitlines() if "MEMSUM_DB_PATH" in line]
    assert len(naming) == 1, log
    assert str(bot.db_path) in naming[0]
    assert "cannot write" in naming[0]
    assert "Traceback" not in log
    assert exited.value.returncode != 0
    assert rows_of(bot.db_path) == before


@pytest.mark.parametrize("damage", ["newer_schema", "not_a_database"])
async def test_a_database_the_bot_cannot_use_stops_start_up_with_one_line_and_no_stack(
    tmp_path: Path, answering: ScriptedLLM, damage: str
) -> None:
    # The line named the file, then uvicorn printed the whole stack down to the exit, which
    # reads as a crash. A newer version's file (a downgrade) is left as it was found.
    bot = await bot_with_history(tmp_path, answering)
    before = rows_of(bot.db_path)
    if damage == "newer_schema":
        with sqlite3.connect(bot.db_path) as conn:
            conn.execute("PRAGMA user_version = 999")
        conn.close()
    else:  # something else restored in its place (a download's error page)
        for path in bot.db_path.parent.glob("memsum.db-*"):
            path.unlink()
        bot.db_path.write_bytes(b"<html><body>404 Not Found</body></html>\n" * 200)
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    log = exited.value.log
    naming = [line for line in log.splitlines() if "MEMSUM_DB_PATH" in line]
    assert len(naming) == 1, log
    assert str(bot.db_path) in naming[0]
    assert "Traceback" not in log
    assert exited.value.returncode != 0
    if damage == "newer_schema":
        assert "newer" in naming[0]
        assert rows_of(bot.db_path) == before


# ---- a full disk while the bot runs -------------------------------------------------------
async def test_a_full_disk_is_one_error_line_and_messages_are_stored_again_once_there_is_room(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # The disk filled while a group pasted long texts. Every message then failed with a
    # stack trace of its own (58 for 28 messages; at a hundred messages a second that log
    # fills the disk further). RLIMIT_FSIZE stands in for the full disk: a write past it
    # fails as one past the end of a full disk does (SQLite: disk I/O error).
    group = 7501
    sid = group_sid(group)
    bot = BotProcess(tmp_path / "bot", env=env(answering), log_level="INFO")
    limit = 2 << 20
    bot.preexec = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    await bot.start()
    try:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await connect(bot, sim)
        pastes = 30
        for i in range(pastes):  # ~300 KB each in UTF-8: the file reaches the limit within a few
            await sim.group_message(group, 20001, f"第{i}段粘贴" + "长文" * 50_000, nickname="甲")
        await wait_log(bot, "memsum: cannot store messages in the database")
        assert bot._proc is not None
        resource.prlimit(
            bot._proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        )
        await sim.group_message(group, 20002, "磁盘清出来了", nickname="乙")
        await until(
            lambda: _last_is(bot, sid, "[乙(20002)] 磁盘清出来了"), "the message after the disk has room"
        )
        stored = len(await said(bot, sid)) - 1
        assert 0 < stored < pastes
        log = await wait_log(bot, "memsum: messages are stored again")
        assert log.count("cannot store messages") == 1  # once a minute
        assert str(bot.db_path) in log
        assert f"messages are stored again; {pastes - stored} were not" in log
        assert "Traceback" not in log
        assert "长文" not in log
        await sim.close()
    finally:
        await bot.stop()


async def _last_is(bot: BotProcess, sid: str, content: str) -> bool:
    stored = await said(bot, sid)
    return bool(stored) and stored[-1] == content
