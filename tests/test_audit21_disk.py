"""Outside audit 21 (disk): what a bot owner meets when the database file and its folder
misbehave. bot.py as a real process on its own SQLite file, the OneBot simulator over the
reverse WebSocket (tests/fakes/onebot.py), the scripted model server: another process (an
owner's DB browser) holding the file's write lock past the busy timeout, the file deleted
or moved while the bot runs, a folder the bot cannot create its file in; and, on the store
with a real file, a reader in another program holding its snapshot while messages arrive.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import SELF_ID, connected, group_sid, query, until, wait_log, write_lock_held
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import OneBotSim, at, text

if TYPE_CHECKING:
    from nonebot_plugin_memsum.store import Store

PERSONA = "你是审计群里的助手小记。"
ERROR_REPLY = "抱歉，我这边出了点问题，请稍后再试。"  # MEMSUM_ERROR_REPLY's default


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


@pytest.fixture
def answering(llm: ScriptedLLM) -> ScriptedLLM:
    llm.reset()
    llm.on_request(lambda b: Reply("好的") if is_chat(b) else None)
    return llm


def bot_in(tmp_path: Path, llm: ScriptedLLM, **extra: str) -> BotProcess:
    """bot.py at INFO (the level an owner runs at) on `tmp_path/bot`."""
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA, **extra}
    return BotProcess(tmp_path / "bot", env=env, log_level="INFO")


@asynccontextmanager
async def talking(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[tuple[BotProcess, OneBotSim]]:
    async with bot_in(tmp_path, llm) as bot, connected(bot) as sim:
        yield bot, sim


async def said(bot: BotProcess, sid: str) -> list[str]:
    rows = await query(bot.db_path, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", sid)
    return [str(r[0]) for r in rows]


# ---- another process holds the write lock past the busy timeout ---------------------------
# What an owner's DB browser does (tests/fakes/e2e.py, `write_lock_held`): DB Browser for
# SQLite holds the file's write lock after a statement in its Execute SQL tab, even a SELECT or
# with the file opened read-only, until Write Changes, Revert Changes or close
# (github.com/sqlitebrowser/sqlitebrowser issues 1322 and 2154).
@pytest.mark.e2e
async def test_messages_said_while_another_program_holds_the_write_lock_are_stored_once_it_lets_go(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # The owner opened memsum.db in a DB browser and edited a row without saving: every write
    # waits the busy timeout (5 s) and fails. What the group says meanwhile is refused with
    # one line naming the lock, the question is told the bot cannot answer now, and once the
    # browser lets go everything is stored, once each.
    group = 7601
    sid = group_sid(group)
    async with talking(tmp_path, answering) as (bot, sim):
        await sim.group_message(group, 20001, "锁之前", nickname="甲")
        await until(lambda: _holds(bot, sid, ["[甲(20001)] 锁之前"]), "the first message stored")
        async with write_lock_held(bot.db_path) as release:
            await sim.group_message(group, 20002, "锁着时说的第一句", nickname="乙")
            await sim.group_message(group, 20003, [at(SELF_ID), text(" 锁着时问的")], nickname="丙")
            await until(lambda: _told(sim, ERROR_REPLY), "the asker told", within=40)
            await wait_log(bot, "memsum: cannot store messages in the database")
            await release()
        await sim.group_message(group, 20004, "放开之后", nickname="丁")
        await until(lambda: _has_all(bot, sid), "everything stored", within=60)
        stored = await said(bot, sid)
        for line in ("[甲(20001)] 锁之前", "[乙(20002)] 锁着时说的第一句", "[丁(20004)] 放开之后"):
            assert stored.count(line) == 1, stored
        assert sum("锁着时问的" in c for c in stored) == 1, stored
        log = bot.log()
        assert "Traceback" not in log, log
        assert "database is locked" in log


async def _told(sim: OneBotSim, words: str) -> bool:
    return any(words in said for said in sim.sent_texts())


async def _holds(bot: BotProcess, sid: str, lines: list[str]) -> bool:
    return await said(bot, sid) == lines


async def _has_all(bot: BotProcess, sid: str) -> bool:
    stored = await said(bot, sid)
    return all(any(w in c for c in stored) for w in ("锁着时说的第一句", "锁着时问的", "放开之后"))


# ---- the file deleted or moved while the bot runs -----------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("how", ["deleted", "moved"])
async def test_a_database_file_deleted_or_moved_while_the_bot_runs_is_said_in_one_line(
    tmp_path: Path, answering: ScriptedLLM, how: str
) -> None:
    # An owner "resetting" the memory deletes memsum.db while the bot runs (or moves it away
    # as a backup). On Linux the bot went on writing the file it had open, now nameless: it
    # still remembered everything, and all said from then on was gone at the next start, and
    # the log never said a word. Now one line says so and what to do; the bot answers on.
    group = 7602
    sid = group_sid(group)
    async with talking(tmp_path, answering) as (bot, sim):
        await sim.group_message(group, 20001, "删文件之前", nickname="甲")
        await until(lambda: _holds(bot, sid, ["[甲(20001)] 删文件之前"]), "the first message stored")
        if how == "deleted":
            for path in bot.db_path.parent.glob("memsum.db*"):
                path.unlink()
        else:
            bot.db_path.rename(bot.db_path.with_name("备份 memsum.db"))
        sent = 0

        async def told() -> bool:
            nonlocal sent
            if "was deleted, moved or replaced while the bot runs" in bot.log():
                return True
            sent += 1
            await sim.group_message(group, 20002, f"删文件之后第{sent}句", nickname="乙")
            await asyncio.sleep(0.5)
            return False

        await until(told, "the line about the file", within=60)
        await sim.group_message(group, 20003, [at(SELF_ID), text(" 还在吗")], nickname="丙")
        await until(lambda: _answered(sim), "the answer")
        log = bot.log()
    lines = [line for line in log.splitlines() if "was deleted, moved or replaced" in line]
    assert len(lines) == 1, log
    assert str(bot.db_path) in lines[0]
    assert "Traceback" not in log, log


async def _answered(sim: OneBotSim) -> bool:
    return "好的" in " ".join(sim.sent_texts())


# ---- a reader in another program holding its snapshot -------------------------------------
async def _append(store: Store, text: str) -> None:
    from nonebot_plugin_memsum.types import Message

    await store.append("onebot:10000:group:7603", Message(role="user", content=text, ts=1.0))


def _count(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        [(n,)] = conn.execute("SELECT COUNT(*) FROM messages").fetchall()
    conn.close()
    return int(n)


@pytest.mark.parametrize("location", ["sqlite"], indirect=True)  # conftest.py's `store` on a file
async def test_the_wal_a_long_reader_let_grow_shrinks_once_it_lets_go(store: Store) -> None:
    # A program reading the file held its read transaction through a busy evening (the
    # sqlite3 shell after BEGIN, a backup): no checkpoint could pass its snapshot, so the WAL
    # grew with every message (~17 KB each); once it let go the WAL was reused but kept its
    # size, hundreds of MB beside a database of a few, until the bot stopped. Now the next
    # checkpoints bring it back to WAL_SIZE_LIMIT, and nothing written meanwhile is lost.
    from nonebot_plugin_memsum.store.engine import CHECKPOINT_EVERY, WAL_SIZE_LIMIT

    wal = store.path.with_name(store.path.name + "-wal")
    await _append(store, "之前")
    reader = sqlite3.connect(store.path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT COUNT(*) FROM messages").fetchone() == (1,)
        i = 0
        while wal.stat().st_size <= 2 * WAL_SIZE_LIMIT:
            await _append(store, f"读着的时候第 {i} 条，" + "很长的内容" * 300)
            i += 1
        peak = wal.stat().st_size
        reader.execute("COMMIT")
    finally:
        reader.close()
    for j in range(2 * CHECKPOINT_EVERY):
        await _append(store, f"放开之后第 {j} 条")
    assert wal.stat().st_size <= WAL_SIZE_LIMIT < peak
    assert _count(store.path) == 1 + i + 2 * CHECKPOINT_EVERY


# ---- a folder the bot cannot create its file in -------------------------------------------
@pytest.mark.e2e
async def test_a_database_folder_the_bot_cannot_write_stops_start_up_with_one_line_naming_it(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # MEMSUM_DB_PATH in a folder made by another user (`sudo mkdir`, a Windows user's
    # C:\Program Files): SQLite says only "unable to open database file", which names no
    # cause. The line says the folder must be writable.
    folder = tmp_path / "张三 的数据"
    folder.mkdir()
    bot = bot_in(tmp_path, answering, MEMSUM_DB_PATH=str(folder / "memsum.db"))
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes whatever the mode says, unless it drops these capabilities
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "running as root needs util-linux setpriv"
        bot.wrapper = (setpriv, "--bounding-set=-dac_override,-dac_read_search")
    try:
        with pytest.raises(BotExitedError) as exited:
            await bot.start()
    finally:
        folder.chmod(0o755)
    log = exited.value.log
    naming = [line for line in log.splitlines() if "MEMSUM_DB_PATH" in line]
    assert len(naming) == 1, log
    assert str(folder) in naming[0]
    assert "write" in naming[0]
    assert "Traceback" not in log
    assert exited.value.returncode != 0
