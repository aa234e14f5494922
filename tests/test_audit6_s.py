"""Outside audit 6 (s): the gaps the previous session left open, reproduced as a bot owner
meets them and closed where they were defects.

1. A question asked while the database cannot be written (a full SQLite disk, PostgreSQL
   gone) is answered with `MEMSUM_ERROR_REPLY`, and the owner gets one log line; nothing
   stored before is lost.
2. A group switched on again (开) whose history is already over its compression line.
3. The first compression after the owner moved to a model with another window (R-BUD-1,
   R-BUD-6, R-TRIG-1: the latest usage).
4. A summary whose only content is the question (the in-turn run): can it pass its budget?
5. The web page's per-day figures around a daylight-saving change in `MEMSUM_TIMEZONE`.

bot.py runs as a real process on its own SQLite file (or the test PostgreSQL server) with the
OneBot simulator over the reverse WebSocket and the scripted model server; a full disk is
RLIMIT_FSIZE, as test_audit5_m does it (a write past it fails as one past the end of a full
disk does).
"""

from __future__ import annotations

import asyncio
import json
import math
import resource
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import httpx
import pytest
from fastapi import FastAPI

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum import usage as ledger
from nonebot_plugin_memsum.compression.service import USAGE_NAMESPACE
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.web.app import create_app
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, private_sid, query, until, wait_log
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import OneBotSim, at, text
from tests.fakes.pgdb import fresh_database, raw
from tests.fakes.pgserver import PgServer
from tests.fakes.service import GROUP, IN_GROUP, Env, Make, is_summary, seed, settle, stated, usage
from tests.fakes.web import serving

PERSONA = "你是审计群里的助手小记。"
ERROR_REPLY = "抱歉，我这边出了点问题，请稍后再试。"  # MEMSUM_ERROR_REPLY's default


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def bot_env(llm: ScriptedLLM, **extra: str) -> dict[str, str]:
    return {
        "MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]),
        "MEMSUM_PERSONA": PERSONA,
        **extra,
    }


@pytest.fixture
def answering(llm: ScriptedLLM) -> ScriptedLLM:
    llm.reset()
    llm.on_request(lambda b: Reply("好的") if is_chat(b) else None)
    return llm


async def said(db: Path | str, sid: str) -> list[str]:
    rows = await query(db, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", sid)
    return [str(r[0]) for r in rows]


@asynccontextmanager
async def talking(
    tmp_path: Path,
    llm: ScriptedLLM,
    settings: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[BotProcess, OneBotSim]]:
    """bot.py at INFO (the level an owner runs at) with `settings`, the simulator connected."""
    bot = BotProcess(tmp_path / "bot", env=bot_env(llm, **(settings or {})), log_level="INFO")
    async with bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await sim.connect()
        await wait_log(bot, f"Bot {SELF_ID} connected")
        try:
            yield bot, sim
        finally:
            await sim.close()


def sends_to(sim: OneBotSim, *, group: int | None = None, user: int | None = None) -> list[str]:
    """What the bot sent to one group or one private peer, in order (plain text)."""
    from tests.fakes.onebot import SEND_ACTIONS, plain_text

    out: list[str] = []
    for call in sim.calls:
        if call.action not in SEND_ACTIONS:
            continue
        p = call.params
        if group is not None and int(p.get("group_id") or 0) == group:
            out.append(plain_text(p.get("message")))
        elif user is not None and int(p.get("user_id") or 0) == user and not p.get("group_id"):
            out.append(plain_text(p.get("message")))
    return out


async def fill_the_disk(bot: BotProcess, sim: OneBotSim, group: int) -> None:
    """The disk is full from now on: pastes in another group grow the database's WAL past
    1 MB, then the bot may not write past 256 KB of any file (its log stays under that), so
    every write to the database fails as one past the end of a full disk does."""
    wal = bot.db_path.with_name(bot.db_path.name + "-wal")
    for i in range(4):  # ~300 KB each in UTF-8
        await sim.group_message(group, 20009, f"第{i}段粘贴" + "长文" * 50_000, nickname="贴")
    await until(lambda: _holds(bot.db_path, group_sid(group), 4), "the pastes stored")
    assert wal.stat().st_size > 1 << 20
    assert bot.log_path.stat().st_size < FULL
    assert bot._proc is not None
    resource.prlimit(bot._proc.pid, resource.RLIMIT_FSIZE, (FULL, resource.RLIM_INFINITY))


FULL = 256 << 10


def room_again(bot: BotProcess) -> None:
    assert bot._proc is not None
    resource.prlimit(bot._proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


# ---- 1. a question while the database cannot be written -----------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("where", ["group", "private"])
async def test_a_question_the_full_disk_refuses_gets_the_error_reply_and_nothing_stored_is_lost(
    tmp_path: Path, answering: ScriptedLLM, where: str
) -> None:
    # The disk filled (another group pasting long texts). A member then asked the bot:
    # the store refused the question and the member got no answer at all, as if the bot
    # were gone. They now get MEMSUM_ERROR_REPLY, quoted; the owner one log line.
    group, user = 7601, 20001
    sid = group_sid(group) if where == "group" else private_sid(user)

    async def ask(words: str, who: int = user, name: str = "甲") -> None:
        if where == "group":
            await sim.group_message(group, who, [at(SELF_ID), text(f" {words}")], nickname=name)
        else:
            await sim.private_message(user, words, nickname="甲")

    def sent() -> list[str]:
        return sends_to(sim, group=group) if where == "group" else sends_to(sim, user=user)

    async with talking(tmp_path, answering) as (bot, sim):
        await ask("磁盘满之前问的")
        await until(lambda: _holds(bot.db_path, sid, 2), "the first question answered")
        await fill_the_disk(bot, sim, 7699)
        await ask("在吗？")
        await until(lambda: _true(sent()[1:]), "an answer to the question")
        assert sent() == ["好的", ERROR_REPLY]
        chat_calls = len([b for b in answering.requests if is_chat(b)])
        assert chat_calls == 1  # no turn without its question
        log = bot.log()
        assert log.count("memsum: cannot store messages") == 1
        assert "Traceback" not in log
        # A second question within the minute: no second apology, no second log line.
        # (The sends checked below, after a later question, would show a second apology.)
        await ask("我也问", 20002, "乙")
        await asyncio.sleep(1)  # handled in milliseconds: refused before the disk has room
        room_again(bot)
        await ask("现在呢？")
        # What the disk refused is fetched again once it has room (recovery.refill): each
        # once, after the message that found it free; the refused questions are not answered
        # again (they had the apology).
        await until(lambda: _holds(bot.db_path, sid, 6), "the answer and the refused questions")
        at_bot = "@小记(10000) " if where == "group" else ""
        stored = await said(bot.db_path, sid)
        assert sorted(stored) == sorted(
            [
                f"[甲(20001)] {at_bot}磁盘满之前问的",
                "好的",
                f"[甲(20001)] {at_bot}现在呢？",
                "好的",
                f"[甲(20001)] {at_bot}在吗？",
                f"[乙(20002)] {at_bot}我也问" if where == "group" else "[甲(20001)] 我也问",
            ]
        )
        assert stored[:3] == [f"[甲(20001)] {at_bot}磁盘满之前问的", "好的", f"[甲(20001)] {at_bot}现在呢？"]
        # The answer is stored before it is sent: wait for the send, not the row.
        await until(lambda: _true(sent()[2:]), "the answer sent")
        assert sent() == ["好的", ERROR_REPLY, "好的"]
        log = bot.log()
        assert log.count("memsum: cannot store messages") == 1
        assert "messages are stored again; 2 were not" in log


async def _holds(db: Path | str, sid: str, n: int) -> bool:
    return len(await said(db, sid)) >= n


async def _true(value: object) -> bool:
    return bool(value)


@pytest.mark.e2e
async def test_a_full_disk_while_the_model_thinks_gets_the_error_reply_and_one_line(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # The question was stored; while the model thought, the disk filled. The answer could
    # not be stored, and the error reply was not sent either (marking it as being sent is
    # a write too): the member got nothing, the owner a traceback.
    llm.reset()
    group = 7602
    sid = group_sid(group)
    async with talking(tmp_path, llm) as (bot, sim):
        with llm.gate(Reply("想好了：周六。"), holds=is_chat) as gate:
            await sim.group_message(group, 20001, [at(SELF_ID), text(" 哪天去？")], nickname="甲")
            await gate.reached()
            await fill_the_disk(bot, sim, 7699)
            gate.open()
            await until(lambda: _true(sends_to(sim, group=group)), "an answer to the question")
        assert sends_to(sim, group=group) == [ERROR_REPLY]
        assert await said(bot.db_path, sid) == ["[甲(20001)] @小记(10000) 哪天去？"]
        log = await wait_log(bot, f"memsum: turn {sid} error")
        assert "Traceback" not in log
        assert f"memsum: turn of {sid} failed: the database refused it" in log


@pytest.mark.e2e
async def test_a_question_while_postgresql_is_down_gets_the_error_reply_where_the_mode_is_known(
    tmp_path: Path, pg_server: PgServer, answering: ScriptedLLM
) -> None:
    # A `docker restart` of the owner's PostgreSQL: a question asked meanwhile was not
    # stored (its place's mode could not even be read) and got no answer at all. A group
    # whose mode the bot read before the outage now gets the error reply; a group it never
    # read since its start might be 关, so it stays quiet.
    known, unknown = 7611, 7612
    async with fresh_database(pg_server.url()) as url:
        db = urlsplit(url).path.lstrip("/")
        settings = {"MEMSUM_DB_URL": url, "MEMSUM_BACKFILL_COUNT": "0"}
        async with talking(tmp_path, answering, settings) as (bot, sim):
            await sim.group_message(known, 20001, "停机之前", nickname="甲")
            await until(lambda: _holds(url, group_sid(known), 1), "the first message stored")
            pg_server.psql(f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS false')
            try:
                await raw(
                    pg_server.url(),
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ?",
                    (db,),
                )
                await sim.group_message(unknown, 20002, [at(SELF_ID), text(" 有人吗")], nickname="乙")
                await sim.group_message(known, 20001, [at(SELF_ID), text(" 在吗？")], nickname="甲")
                await until(lambda: _true(sends_to(sim, group=known)), "an answer in the known group")
                await wait_log(bot, "cannot store messages in the database")
            finally:
                pg_server.psql(f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS true')
            assert sends_to(sim, group=known) == [ERROR_REPLY]
            assert sends_to(sim, group=unknown) == []
            await sim.group_message(known, 20001, [at(SELF_ID), text(" 现在呢？")], nickname="甲")
            await until(lambda: _holds(url, group_sid(known), 3), "the answer after the outage")
            log = bot.log()
        assert await said(url, group_sid(known)) == [
            "[甲(20001)] 停机之前",
            "[甲(20001)] @小记(10000) 现在呢？",
            "好的",
        ]
        assert sends_to(sim, group=known) == [ERROR_REPLY, "好的"]
        assert sends_to(sim, group=unknown) == []
        assert log.count("cannot store messages in the database") == 1
        assert "Traceback" not in log


# ---- 2. a 开 place that gets no turn --------------------------------------------------------
SUMMARY = "【保留原文】无\n## 最近在聊什么\n闲聊\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


def summarising(llm: ScriptedLLM) -> ScriptedLLM:
    llm.reset()
    llm.on_request(lambda b: Reply(SUMMARY) if is_summary(b) else Reply("好的") if is_chat(b) else None)
    return llm


async def summarised(db: Path) -> bool:
    return bool(await query(db, "SELECT 1 FROM metadata WHERE namespace = 'summary'"))


@pytest.mark.e2e
async def test_r_trig_4_a_capped_group_still_compresses_what_it_records(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # Issue 10: "a compression is never stopped by the cap (it is what keeps the memory
    # within the window)". A 开 group over its daily cap records on, but no turn ends, so
    # nothing judged its lines: the history grew past the count line all day and the next
    # day's first question waited for (or was cut by) the whole backlog. A question the cap
    # leaves unanswered is now judged as the turn it would have been, as 仅记录 is.
    summarising(llm)
    group = 7621
    sid = group_sid(group)
    settings = {"MEMSUM_HISTORY_LIMIT": "4", "MEMSUM_DAILY_TOKEN_CAP": "1"}
    async with talking(tmp_path, llm, settings) as (bot, sim):
        await sim.group_message(group, 20001, [at(SELF_ID), text(" 早")], nickname="甲")
        await until(lambda: _holds(bot.db_path, sid, 2), "the answer before the cap")
        for i in range(3):
            await sim.group_message(group, 20002, f"第{i}句闲聊", nickname="乙")
        await sim.group_message(group, 20003, [at(SELF_ID), text(" 还在吗")], nickname="丙")
        await until(lambda: _true(sends_to(sim, group=group)[1:]), "the cap notice")
        assert sends_to(sim, group=group)[1] == "今天的额度已经用完了，明天再聊吧。"
        await until(lambda: summarised(bot.db_path), "a compression of the capped group")
        await wait_log(bot, f"memsum: compression {sid} done")
    assert len([b for b in llm.requests if is_chat(b)]) == 1


@pytest.mark.e2e
async def test_a_group_switched_on_again_over_its_count_line_compresses_at_once(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # A 开 group chatted past its count line without asking the bot (a turn end judges
    # the line, and there was none); the owner switched it off for the night and on again
    # in the morning. Nothing compressed until someone asked, and that first answer waited
    # for the summariser. Switching a place on (开 or 仅记录) now judges it once, as a
    # 仅记录 place is judged after each message.
    summarising(llm)
    group = 7622
    sid = group_sid(group)
    async with talking(tmp_path, llm, {"MEMSUM_HISTORY_LIMIT": "4"}) as (bot, sim):
        for i in range(5):
            await sim.group_message(group, 20002, f"第{i}句闲聊", nickname="乙")
        await until(lambda: _holds(bot.db_path, sid, 5), "the chatter stored")
        await sim.group_message(group, 10001, "/记忆模式 关", nickname="主人")
        await until(lambda: _true(sends_to(sim, group=group)), "the mode switched off")
        assert not await summarised(bot.db_path)
        await sim.group_message(group, 10001, "/记忆模式 开", nickname="主人")
        await until(lambda: _true(sends_to(sim, group=group)[1:]), "the mode switched on")
        await until(lambda: summarised(bot.db_path), "a compression once the group is on")
        await wait_log(bot, f"memsum: compression {sid} done")
    assert not [b for b in llm.requests if is_chat(b)]


# ---- 3. the first compression after a change of chat model (R-BUD-1, R-TRIG-1) -------------
OLD_SUMMARY_TEXT = (
    "## 最近在聊什么\n" + "旧话题的细节。" * 520 + "\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
)


async def moved_to_a_4k_model(make: Make, tmp_path: Path) -> Env:
    """A group that talked under a 32k chat model (its latest usage is that model's, kept
    across the restart), with a summary written then; the owner restarts the bot with a
    4k chat model on the same file: trim budget 4096 − 1024 = 3072 = E."""
    db = tmp_path / "moved.db"
    old = await make(chat={"context_window": 32000}, location=db)
    await old.rt.store.put_meta(
        SUMMARY_NAMESPACE,
        GROUP.id,
        {"text": OLD_SUMMARY_TEXT, "template": "chat", "time": 1.0, "kept_messages": 0},
    )
    await seed(old.rt, 2, size=30)
    old.model.chat.append(Reply("好的", usage=usage(5000)))
    await old.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(old.rt)
    await runtime.close(old.rt)
    new = await make(chat={"context_window": 4096}, location=db)
    stored = await new.rt.store.get_meta(USAGE_NAMESPACE, GROUP.id)
    assert stored is not None
    assert stored["window"] == 32000  # what the bot knows of the session: the old model's usage
    return new


# E = 3072, ratio 0.1: 307 → the floor 1000 → E / 4 = 768 wins (R-BUD-1/3); under the old
# model's line (E = 25,600) it was 2,560, over the new E / 2 = 1,536.
NEW_BUDGET = 768


async def test_r_bud_1_the_in_turn_run_after_a_model_change_uses_the_new_models_line(
    make: Make, tmp_path: Path
) -> None:
    # The first question under the new model finds the old summary alone over the new trim
    # budget, so the turn compresses first (issue 9's in-turn run). That run's budget came
    # from the latest usage, the old model's: a summary of up to 2,560 tokens, itself over
    # E / 2 of the new line, so the next turn rewrote it again, and the one after. The turn's
    # request snapshot (R-TRIG-1: every usage, snapshots too, sets the budget's window) now
    # goes out before the in-turn run, so its line is the new model's.
    env = await moved_to_a_4k_model(make, tmp_path)
    await seed(env.rt, 2, start=10, size=30)
    env.model.chat.append(Reply("好的", usage=usage(2000)))
    await env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(env.rt)
    (request,) = env.model.summary_requests()
    assert stated(request)[0] == NEW_BUDGET
    assert request["max_tokens"] == math.ceil(1.5 * NEW_BUDGET)  # R-BUD-7


async def test_r_bud_1_a_manual_compression_after_a_model_change_uses_the_new_models_line(
    make: Make, tmp_path: Path
) -> None:
    # /压缩 right after the restart, before anyone spoke: the stored latest usage is the old
    # model's, which no request will carry again. The line is the chat model's now.
    env = await moved_to_a_4k_model(make, tmp_path)
    await env.rt.compression.compress(GROUP.id)
    (request,) = env.model.summary_requests()
    assert stated(request)[0] == NEW_BUDGET


# ---- 5. the web page's days across daylight-saving changes ----------------------------------
NEW_YORK = ZoneInfo("America/New_York")


def new_york(y: int, mo: int, d: int, h: int, mi: int = 30, *, fold: int = 0) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=NEW_YORK, fold=fold).timestamp()


# (when, the New York day it belongs to). 2026-03-08 is 23 hours long (02:00 EST → 03:00
# EDT), 2026-11-01 is 25 (02:00 EDT → 01:00 EST: 01:30 happens twice).
CALLS = [
    (new_york(2026, 3, 7, 23), "2026-03-07"),
    (new_york(2026, 3, 8, 0), "2026-03-08"),
    (new_york(2026, 3, 8, 23), "2026-03-08"),
    (new_york(2026, 3, 9, 0), "2026-03-09"),
    (new_york(2026, 10, 31, 23), "2026-10-31"),
    (new_york(2026, 11, 1, 0), "2026-11-01"),
    (new_york(2026, 11, 1, 1, fold=0), "2026-11-01"),
    (new_york(2026, 11, 1, 1, fold=1), "2026-11-01"),
    (new_york(2026, 11, 1, 23), "2026-11-01"),
    (new_york(2026, 11, 2, 0), "2026-11-02"),
]


@pytest.mark.parametrize("today", [(2026, 11, 2, 12), (2026, 3, 8, 12), (2026, 7, 1, 12)])
async def test_the_usage_pages_days_are_new_york_days_on_both_sides_of_a_dst_change(
    tmp_path: Path, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch, today: tuple[int, int, int, int]
) -> None:
    # The page counted every day with the zone's offset of the moment it was opened: in
    # November, the hour after midnight of each summer day went to the day before (and in
    # summer the hour before midnight of each winter day to the day after), so a day's
    # figures on the page disagreed with /用量 for the same day.
    cfg = Config.model_validate(
        {
            "memsum_models": [llm.model_config("test/chat", priority=1)],
            "memsum_timezone": "America/New_York",
            "memsum_web_token": WEB_TOKEN,
        }
    )
    rt = await runtime.build(cfg, tmp_path / "dst.db", ["小记"], {"10001"})
    try:
        for ts, _ in CALLS:
            monkeypatch.setattr(clock, "now", lambda ts=ts: ts)
            await rt.store.record_usage("onebot:10000:group:1", "对话", "test/chat", 100, 10)
        now = datetime(*today, tzinfo=NEW_YORK).timestamp()
        monkeypatch.setattr(clock, "now", lambda: now)
        expected: dict[str, int] = {}
        for ts, day in CALLS:
            if ts < now:
                expected[day] = expected.get(day, 0) + 1
        app = create_app(lambda: rt, WEB_TOKEN, _no_names)
        root = FastAPI()
        root.mount("/memsum", app)
        async with serving(root) as base, httpx.AsyncClient(base_url=base + "/memsum/") as page:
            resp = await page.post("api/login", json={"token": WEB_TOKEN})
            assert resp.status_code == 200
            rows = (await page.get("api/usage?days=400")).json()["rows"]
            shown: dict[str, int] = {}
            for row in rows:
                shown[row["day"]] = shown.get(row["day"], 0) + row["calls"]
            assert shown == expected
            today_calls = (await page.get("api/overview")).json()["today"]["calls"]
        assert today_calls == expected.get(ledger.day_of(now, NEW_YORK), 0)
    finally:
        await runtime.close(rt)


WEB_TOKEN = "web-test-token-0123456789abcdef"


async def _no_names() -> dict[str, str]:
    return {}
