"""Outside audit 5 (m): a bot owner whose machine crashes, reboots and runs hundreds of
groups (issue 15). bot.py as a real process on its own SQLite file, the OneBot simulator
over the reverse WebSocket (tests/fakes/onebot.py, which cites the implementations it
imitates), the scripted model server: kills and stops at points the crash tests do not
reach, the recovery switches turned off, reconnects, history actions that fail for some
places, a database that cannot be written, and what the log keeps of all of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest

from nonebot_plugin_memsum.compression.service import USAGE_NAMESPACE
from nonebot_plugin_memsum.onebot.recovery import PROBES
from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, query, until, wait_log
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import SEND_ACTIONS, ActionFailedError, OneBotSim, at, text
from tests.fakes.service import GROUP, IN_GROUP, Make, seed, settle

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


@asynccontextmanager
async def talking(
    tmp_path: Path,
    llm: ScriptedLLM,
    settings: Mapping[str, str] | None = None,
    *,
    preexec: Callable[[], None] | None = None,
) -> AsyncIterator[tuple[BotProcess, OneBotSim]]:
    """bot.py at INFO (the level an owner runs at) on `tmp_path/bot` with `settings`, the
    simulator connected; a test may kill, stop and start both again inside."""
    bot = BotProcess(tmp_path / "bot", env=env(llm, **(settings or {})), log_level="INFO")
    bot.preexec = preexec
    async with bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await connect(bot, sim)
        try:
            yield bot, sim
        finally:
            await sim.close()


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
    async with talking(tmp_path, answering) as (bot, sim):
        sim.history_like("llonebot")
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


async def test_an_implementation_failing_every_history_call_gets_a_few_calls_and_one_line(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # NapCat answers retcode 1200 when an action throws (src/onebot/action/OneBotAction.ts
    # `websocketHandle`); failing for every place is an implementation that cannot serve it.
    groups = list(range(7201, 7211))
    async with talking(tmp_path, answering) as (bot, sim):

        def broken(params: dict[str, Any]) -> Any:
            raise ActionFailedError(1200, "getMsgHistory error")

        sim.responders["get_group_msg_history"] = broken
        for group in groups:
            await sim.group_message(group, 20001, "在吗", nickname="甲")
        await until(lambda: holds(bot, group_sid(groups[-1]), 1), "the messages")
        await sim.close()
        await connect(bot, sim)
        log = await wait_log(bot, "memsum: backfill of 10000:")
        assert log.count("cannot get_group_msg_history") == 1
        assert len(history_calls(sim)) == PROBES  # not one per group


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
    async with talking(tmp_path, llm) as (bot, sim):
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


async def _true(value: object) -> bool:
    return bool(value)


# ---- a database the bot cannot use at start-up ------------------------------------------
async def bot_with_history(tmp_path: Path, llm: ScriptedLLM) -> BotProcess:
    """A bot folder whose database holds one group's message, the bot stopped."""
    async with talking(tmp_path, llm) as (bot, sim):
        await sim.group_message(7401, 20001, "要保住的一句", nickname="甲")
        await until(lambda: holds(bot, group_sid(7401), 1), "the message stored")
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
    # Once there is room, what the disk refused is fetched again from the implementation's
    # history (get_group_msg_history, as the backfill on connect does) and stored once each:
    # nothing said while the disk was full is lost.
    group = 7501
    sid = group_sid(group)
    limit = 1 << 20
    async with talking(
        tmp_path,
        answering,
        preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY)),
    ) as (bot, sim):
        pastes = 30
        # ~150 KB each in UTF-8: the file reaches the limit within a few. (The fetch again
        # answers all of them in one frame: 9 MB as the simulator's escaped JSON, under the
        # 16 MB a WebSocket frame to NoneBot may hold.)
        for i in range(pastes):
            await sim.group_message(group, 20001, f"第{i}段粘贴" + "长文" * 25_000, nickname="甲")
        await wait_log(bot, "memsum: cannot store messages in the database")
        assert bot._proc is not None
        first = len(await said(bot, sid))
        assert 0 < first < pastes
        resource.prlimit(
            bot._proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        )
        await sim.group_message(group, 20002, "磁盘清出来了", nickname="乙")

        async def count() -> int:
            return len(await said(bot, sid))

        await until(lambda: _count_is(bot, sid, pastes + 1), "every paste stored", progress=count)
        stored = await said(bot, sid)
        pasted = [int(c.split("第")[1].split("段")[0]) for c in stored if c.startswith("[甲(20001)] 第")]
        # Each once. What was refused goes in after the message that found the disk writable
        # again (which may be an early one: SQLite reuses a freed page), so the order said
        # may differ by that message.
        assert sorted(pasted) == list(range(pastes))
        assert stored.count("[乙(20002)] 磁盘清出来了") == 1
        log = await wait_log(bot, "the store refused, fetched again and stored")
        assert log.count("cannot store messages") == 1  # once a minute
        assert str(bot.db_path) in log
        assert re.search(r"messages are stored again; \d+ were not; fetching them again in 1 sessions", log)
        refilled = re.findall(
            rf"memsum: (\d+) messages of {sid} the store refused, fetched again and stored", log
        )
        assert 0 < sum(map(int, refilled)) <= pastes - first
        assert "Traceback" not in log
        assert "长文" not in log


async def _count_is(bot: BotProcess, sid: str, n: int) -> bool:
    return len(await said(bot, sid)) == n


async def _last_is(bot: BotProcess, sid: str, content: str) -> bool:
    stored = await said(bot, sid)
    return bool(stored) and stored[-1] == content


# ---- the recovery switches turned off -----------------------------------------------------
@pytest.mark.parametrize("off", ["MEMSUM_RESUME_WINDOW", "MEMSUM_BACKFILL_COUNT"])
async def test_a_recovery_switch_at_0_is_off_and_leaves_the_other_one_on(
    tmp_path: Path, llm: ScriptedLLM, off: str
) -> None:
    # A question the kill interrupted (the model still thinking) and one said while the bot
    # was down. RESUME_WINDOW=0: both are backfilled, neither answered, a live one is.
    # BACKFILL_COUNT=0: no history call at all, nothing said while down stored, and the
    # interrupted question is still answered, once.
    llm.reset()
    group = 7601
    sid = group_sid(group)
    async with talking(tmp_path, llm, {off: "0"}) as (bot, sim):
        with llm.gate(Reply("来不及说的回答"), holds=is_chat) as gate:
            cut = await sim.group_message(group, 20001, [at(SELF_ID), text(" 第一个问题")], nickname="甲")
            await gate.reached()
            await bot.kill()
        llm.reset()
        llm.on_request(lambda b: Reply("好的") if is_chat(b) else None)
        await sim.disconnected.wait()
        down = await sim.group_message(group, 20002, [at(SELF_ID), text(" 挂着的时候问")], nickname="乙")
        await bot.start()
        await connect(bot, sim)
        if off == "MEMSUM_RESUME_WINDOW":  # (a live question the backfill fetches: a test below)
            await wait_log(bot, "memsum: backfill of 10000:")
        else:  # (a live question while it is answered is part of that turn, as a burst is)
            await until(lambda: _true(answers_to(sim, cut)), "the interrupted question answered")
        live = await sim.group_message(group, 20003, [at(SELF_ID), text(" 现在问")], nickname="丙")
        await until(lambda: _true(answers_to(sim, live)), "the live question answered")
        stored = await said(bot, sid)
        if off == "MEMSUM_RESUME_WINDOW":
            assert stored[:3] == [
                "[甲(20001)] @小记(10000) 第一个问题",
                "[乙(20002)] @小记(10000) 挂着的时候问",
                "[丙(20003)] @小记(10000) 现在问",
            ]
            assert answers_to(sim, cut) == []
            assert "had questions left unanswered" not in bot.log()
        else:
            assert history_calls(sim) == []
            assert "[乙(20002)] @小记(10000) 挂着的时候问" not in stored
            assert len(answers_to(sim, cut)) == 1
        assert answers_to(sim, down) == []
        assert len(answers_to(sim, live)) == 1


@pytest.mark.parametrize("window", ["0", "300"])
async def test_a_question_said_as_the_bot_reconnects_and_fetched_by_the_backfill_is_answered_once(
    tmp_path: Path, answering: ScriptedLLM, window: str
) -> None:
    # Said just after the reconnect, a question reaches the bot live and in the history the
    # backfill fetches; whichever stores it, the other finds it stored. With the resume
    # window on, the backfill's resume answers it. With MEMSUM_RESUME_WINDOW=0 nothing did:
    # the backfill answers nothing and the live event took it for answered from there.
    group = 7651
    sid = group_sid(group)
    async with talking(tmp_path, answering, {"MEMSUM_RESUME_WINDOW": window}) as (bot, sim):
        await sim.group_message(group, 20001, "早上好", nickname="甲")
        await until(lambda: holds(bot, sid, 1), "the first message")
        await sim.close()
        history = sim.responders["get_group_msg_history"]
        asked = asyncio.Event()

        async def after_the_question(params: dict[str, Any]) -> Any:
            await asked.wait()  # the fetch sees the live question
            return history(params)

        sim.responders["get_group_msg_history"] = after_the_question
        await connect(bot, sim)
        await sim.wait_call("get_group_msg_history")
        question = await sim.group_message(group, 20002, [at(SELF_ID), text(" 刚连上就问")], nickname="乙")
        asked.set()
        await until(lambda: _true(answers_to(sim, question)), "the question answered")
        await wait_log(bot, "memsum: backfill of 10000: 1 messages said while away stored")
        await sim.group_message(group, 20003, "谢谢", nickname="丙")
        await until(lambda: _last_is(bot, sid, "[丙(20003)] 谢谢"), "a later message")
        assert len(answers_to(sim, question)) == 1
        assert await said(bot, sid) == [
            "[甲(20001)] 早上好",
            "[乙(20002)] @小记(10000) 刚连上就问",
            "好的",
            "[丙(20003)] 谢谢",
        ]


async def test_a_question_said_while_down_is_answered_once_only_within_the_resume_window(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # The bot was down for a quarter of an hour: a question asked ten minutes ago is left
    # alone (MEMSUM_RESUME_WINDOW 300 s), one asked a minute ago is answered, once, and not
    # again on the next reconnect. Both are recorded.
    old_group, new_group = 7701, 7702
    async with talking(tmp_path, answering) as (bot, sim):
        for group in (old_group, new_group):
            await sim.group_message(group, 20001, "大家好", nickname="甲")
            await until(lambda group=group: holds(bot, group_sid(group), 1), "the first message")
        await bot.kill()
        await sim.disconnected.wait()
        with sqlite3.connect(bot.db_path) as conn:  # what the bot stored was said 15 minutes ago
            conn.execute("UPDATE messages SET ts = ts - 900")
            conn.execute("UPDATE message_counts SET newest_ts = newest_ts - 900")
        conn.close()
        old = await sim.group_message(old_group, 20002, [at(SELF_ID), text(" 十分钟前问的")], nickname="乙")
        new = await sim.group_message(new_group, 20002, [at(SELF_ID), text(" 一分钟前问的")], nickname="乙")
        sim.messages[old].time -= 600
        sim.messages[new].time -= 60
        await bot.start()
        await connect(bot, sim)
        await until(lambda: _true(answers_to(sim, new)), "the recent question answered")
        await wait_log(bot, "memsum: backfill of 10000:")
        assert await said(bot, group_sid(old_group)) == [
            "[甲(20001)] 大家好",
            "[乙(20002)] @小记(10000) 十分钟前问的",
        ]
        await sim.close()
        await connect(bot, sim)
        await sim.group_message(new_group, 20003, "谢谢", nickname="丙")
        await until(lambda: _last_is(bot, group_sid(new_group), "[丙(20003)] 谢谢"), "a later message")
        assert answers_to(sim, old) == []
        assert len(answers_to(sim, new)) == 1


# ---- reconnects ------------------------------------------------------------------------------
async def test_two_reconnects_during_the_backfill_store_nothing_twice_and_answer_once(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # The implementation drops the connection while the bot's first history call is still
    # unanswered, comes back, drops it again at once and comes back for good: the late answer
    # to the first call goes nowhere, and what was said meanwhile is stored once, in order.
    group = 7801
    sid = group_sid(group)
    async with talking(tmp_path, answering) as (bot, sim):
        await sim.group_message(group, 20001, "早上好", nickname="甲")
        await until(lambda: holds(bot, sid, 1), "the first message")
        await sim.close()
        await sim.group_message(group, 20002, "机器人不在的时候说的", nickname="乙")
        question = await sim.group_message(group, 20003, [at(SELF_ID), text(" 还在吗")], nickname="丙")
        history = sim.responders["get_group_msg_history"]
        release = asyncio.Event()

        async def late(params: dict[str, Any]) -> Any:
            await release.wait()
            return history(params)

        sim.responders["get_group_msg_history"] = late
        await connect(bot, sim)
        await sim.wait_call("get_group_msg_history")
        await sim.close()
        await closed_by_peer(bot, 2)
        release.set()
        sim.responders["get_group_msg_history"] = history
        await connect(bot, sim)
        await sim.close()
        await connect(bot, sim)
        await until(lambda: _true(answers_to(sim, question)), "the question answered")
        await sim.group_message(group, 20001, "重连之后", nickname="甲")
        await until(lambda: _last_is(bot, sid, "[甲(20001)] 重连之后"), "the live message")
        assert await said(bot, sid) == [
            "[甲(20001)] 早上好",
            "[乙(20002)] 机器人不在的时候说的",
            "[丙(20003)] @小记(10000) 还在吗",
            "好的",
            "[甲(20001)] 重连之后",
        ]
        assert len(answers_to(sim, question)) == 1


# ---- SIGKILL and SIGTERM at points the crash tests do not reach -----------------------------
async def test_a_kill_between_the_parts_of_a_long_answer_sends_none_of_it_again(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # A long answer goes out as plain parts when merged-forward is refused (send.py). Killed
    # after its first part: marked as being sent before the first, it is never sent again,
    # stored once, and the start-up says a reply was cut.
    answering.reset()
    long = "很长的回答。" * 1200  # 7,200 characters: three plain parts
    answering.on_request(lambda b: Reply(long, chunk_chars=600) if is_chat(b) else None)
    group = 7901
    sid = group_sid(group)
    async with talking(tmp_path, answering) as (bot, sim):
        del sim.responders["send_group_forward_msg"]  # answered with retcode 1404
        send = sim.responders["send_msg"]
        second = asyncio.Event()

        async def stuck_after_the_first(params: dict[str, Any]) -> Any:
            if sum(c.action == "send_msg" for c in sim.calls) >= 2:
                second.set()
                await asyncio.Event().wait()  # the bot dies before this is answered
            return send(params)

        sim.responders["send_msg"] = stuck_after_the_first
        question = await sim.group_message(group, 20001, [at(SELF_ID), text(" 讲个长故事")], nickname="甲")
        await asyncio.wait_for(second.wait(), 20)
        await bot.kill()
        await sim.disconnected.wait()
        sim.responders["send_msg"] = send
        mark = len(sim.calls)
        await bot.start()
        await connect(bot, sim)
        await sim.group_message(group, 20002, "然后呢", nickname="乙")
        await until(lambda: _last_is(bot, sid, "[乙(20002)] 然后呢"), "a later message")
        assert await said(bot, sid) == ["[甲(20001)] @小记(10000) 讲个长故事", long, "[乙(20002)] 然后呢"]
        assert [c for c in sim.calls[mark:] if c.action in SEND_ACTIONS] == []
        assert len(answers_to(sim, question)) == 1  # the first part, before the kill
        assert "1 replies were being sent when the last run stopped" in bot.log()


SUMMARY = "【保留原文】无\n## 最近在聊什么\n闲聊\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


def is_summary(body: dict[str, Any]) -> bool:
    return not is_chat(body)


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
async def test_a_compression_stopped_in_flight_runs_again_at_the_next_start_by_itself(
    tmp_path: Path, llm: ScriptedLLM, stop: str
) -> None:
    # The count line (4) is crossed by the turn; the summariser is still thinking when the bot
    # is stopped. SIGTERM cancels it at once (the turn has already answered); either way the
    # next start runs it without waiting for the group to speak again, and writes it once.
    llm.reset()
    llm.on_request(lambda b: Reply("好的") if is_chat(b) else None)
    group = 8001
    sid = group_sid(group)
    async with talking(tmp_path, llm, {"MEMSUM_HISTORY_LIMIT": "4"}) as (bot, sim):
        with llm.gate(Reply(SUMMARY), holds=is_summary) as gate:
            for i in range(4):
                await sim.group_message(group, 20001, f"第{i}句闲聊", nickname="甲")
            await sim.group_message(group, 20002, [at(SELF_ID), text(" 大家在聊什么")], nickname="乙")
            await gate.reached()
            if stop == "SIGKILL":
                await bot.kill()
            else:
                await bot.terminate(15)
                assert "memsum: compression of" in bot.log()  # cancelled, said once
        assert await query(bot.db_path, "SELECT key FROM metadata WHERE namespace = 'summary'") == []
        assert await query(bot.db_path, "SELECT archived FROM messages WHERE archived = 1") == []
        await sim.disconnected.wait()
        llm.on_request(lambda b: Reply(SUMMARY) if is_summary(b) else None)
        await bot.start()  # no OneBot connection, no message: start-up alone resumes it

        async def summarised() -> bool:
            return bool(await query(bot.db_path, "SELECT 1 FROM metadata WHERE namespace = 'summary'"))

        await until(summarised, "the resumed compression")
        log = await wait_log(bot, f"memsum: compression {sid} done")
        assert "1 interrupted compressions queued again" in log
        assert log.count(f"memsum: compression {sid} done") == 1
        assert "Traceback" not in bot.log(all_runs=True)
        archived = await query(bot.db_path, "SELECT COUNT(*) FROM messages WHERE archived = 1")
        assert archived == [(6,)]  # the five said and the answer


async def test_a_kill_in_the_middle_of_a_backfill_stores_the_rest_once_in_order_at_the_next_start(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # The backfill stores what it fetched one message at a time; a reply among them waits for
    # `get_msg` (its quote). Killed there: the next connection fetches the same history again,
    # skips what is stored and stores the rest after it, once each.
    group = 8101
    sid = group_sid(group)
    async with talking(tmp_path, answering) as (bot, sim):
        first = await sim.group_message(group, 20001, "早上好", nickname="甲")
        await until(lambda: holds(bot, sid, 1), "the first message")
        await sim.close()
        await sim.group_message(group, 20002, "一", nickname="乙")
        await sim.group_message(group, 20002, "二", nickname="乙")
        quoting = await sim.group_message(
            group, 20003, [{"type": "reply", "data": {"id": str(first)}}, text("同意")], nickname="丙"
        )
        await sim.group_message(group, 20002, "三", nickname="乙")
        get_msg = sim.responders["get_msg"]
        asked = asyncio.Event()

        async def never(params: dict[str, Any]) -> Any:
            asked.set()
            await asyncio.Event().wait()

        sim.responders["get_msg"] = never
        await connect(bot, sim)
        await asyncio.wait_for(asked.wait(), 20)
        await bot.kill()
        assert await said(bot, sid) == ["[甲(20001)] 早上好", "[乙(20002)] 一", "[乙(20002)] 二"]
        await sim.disconnected.wait()
        sim.responders["get_msg"] = get_msg
        await bot.start()
        await connect(bot, sim)
        await wait_log(bot, "memsum: backfill of 10000: 2 messages said while away stored in 1 sessions")
        assert await said(bot, sid) == [
            "[甲(20001)] 早上好",
            "[乙(20002)] 一",
            "[乙(20002)] 二",
            "[丙(20003)] [回复 甲(20001)：早上好] 同意",
            "[乙(20002)] 三",
        ], quoting


# ---- the log ----------------------------------------------------------------------------------
async def test_an_event_the_adapter_cannot_parse_is_logged_without_its_text(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # An event that fails even the adapter's base model (a `time` that is no whole number of
    # seconds, a `self_id` that is no number) was logged at ERROR with its whole payload, the
    # message's text included: it outlived /清除 in the log. Later messages go on as before.
    group = 8201
    sid = group_sid(group)
    async with talking(tmp_path, answering) as (bot, sim):
        event = {
            "time": 1,
            "self_id": SELF_ID,
            "post_type": "message",
            "message_type": "group",
            "sub_type": "normal",
            "message_id": 5,
            "group_id": group,
            "user_id": 20001,
            "message": [{"type": "text", "data": {"text": "群里的秘密"}}],
            "raw_message": "群里的秘密",
            "font": 0,
            "sender": {"user_id": 20001, "nickname": "甲"},
        }
        for broken in ({"time": 1733300000123.5}, {"time": "12:00"}, {"self_id": "bot"}):
            await sim.send_raw({**event, **broken})
        await sim.group_message(group, 20002, "后面的话", nickname="乙")
        await until(lambda: _last_is(bot, sid, "[乙(20002)] 后面的话"), "the well-formed message")
        log = bot.log()
        assert log.count("Failed to parse an event") == 3
        assert "群里的秘密" not in log
        assert "后面的话" not in log


# ---- a kill right after a clear (R-MEM-2, R-BACK-4) -------------------------------------------
class Killed(BaseException):
    """The process ends here: nothing after this point runs (as under SIGKILL)."""


@pytest.mark.parametrize("kind", ["context", "summary"])
async def test_r_back_4_a_kill_just_after_a_clear_leaves_no_back_off_behind(
    make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: Literal["context", "summary"]
) -> None:
    # The clear's commit archived the history (R-MEM-2); the back-off it forgets (R-BACK-4)
    # and the latest usage (/摘要's line) were deleted in writes of their own after it. A kill
    # in between left them in the file: after the restart the cleared session still waited
    # out a failing model's back-off, and /摘要 showed the usage of what was cleared.
    db = tmp_path / "memsum.db"
    env = await make(location=db, memsum_history_limit=2)
    rt = env.rt
    env.model.summary.append(Reply("【保留原文】无"))  # the background run fails: a back-off
    await seed(rt, 4)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    status = await rt.compression.status(GROUP.id)
    assert (status.backoff_failures, status.usage is not None) == (1, True)

    async def usage_written() -> bool:  # it waits in memory for a second (issue 9)
        return await rt.store.get_meta(USAGE_NAMESPACE, GROUP.id) is not None

    await until(usage_written, "the latest usage written")
    clear_store = rt.compression._clear_store

    async def then_killed(session_id: str, how: Any) -> None:
        await clear_store(session_id, how)
        raise Killed

    monkeypatch.setattr(rt.compression, "_clear_store", then_killed)
    with pytest.raises(Killed):
        await rt.compression.clear(GROUP.id, kind)
    restarted = await make(location=db)  # what the file holds is what a restart reads
    status = await restarted.rt.compression.status(GROUP.id)
    assert status.backoff_failures == 0
    assert (status.usage is None) == (kind == "context")
