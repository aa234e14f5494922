"""Audit 18 (left): what the last session noticed and left alone.

- A withdrawal finds the replies quoting the message by a LIKE over their metadata: a platform
  id holding `\\`, `"`, `%`, `_` or `!` must match literally, on SQLite and on PostgreSQL (whose
  LIKE takes `\\` as its escape by default).
- A reply stored with the start of the message it quotes is not found by those words once that
  message is withdrawn: the index holds the reply as it reads now (its quote as withdrawn),
  through the store on both engines and through bot.py's /回忆.
- bot.py started while HOST:PORT is taken stops with one line naming the address and `.env`'s
  PORT (or HOST), not uvicorn's bind error after the whole start-up.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
from pathlib import Path

import pytest

from nonebot_plugin_memsum.store import SearchQuery, Store, search
from nonebot_plugin_memsum.store.engine import SqliteDb
from nonebot_plugin_memsum.store.store import Tx
from nonebot_plugin_memsum.types import (
    QUOTE_OF_KEY,
    QUOTE_WITHDRAWN_KEY,
    WITHDRAWN_TEXT,
    Message,
    shown_content,
    unquoted,
)
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import group_sid, query, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import reply, text
from tests.fakes.pgdb import fresh_database
from tests.fakes.pgserver import PgServer
from tests.test_audit10_fz import responding
from tests.test_audit16_wd import NOTHING, _command

SID = "onebot:10000:group:93181"


def _reply(text: str, quoted: str, ts: float) -> Message:
    return Message(
        role="user",
        content=f"[乙(20002)] [回复 甲(20001)：{text}] 收到",
        name="20002",
        ts=ts,
        metadata={QUOTE_OF_KEY: quoted},
    )


async def test_a_platform_id_with_like_characters_marks_its_replies_and_only_those(store: Store) -> None:
    # JSON writes `\` as `\\` and `"` as `\"`, which PostgreSQL's LIKE read as escapes; `%`
    # and `_` are LIKE's wildcards on both engines: `decoy` matches them as a pattern.
    odd = 'x\\y"z%w_v!'
    decoy = 'x\\y"zAAw-v!'
    await store.append(SID, Message(role="user", content="[甲(20001)] 奇怪的编号", ts=1.0, platform_id=odd))
    await store.append(SID, Message(role="user", content="[甲(20001)] 另一条", ts=2.0, platform_id=decoy))
    await store.append(SID, _reply("奇怪的编号", odd, 3.0))
    await store.append(SID, _reply("另一条", decoy, 4.0))

    await store.mark_withdrawn(SID, odd)
    history = await store.get_history(SID)
    assert [m.metadata.get(QUOTE_WITHDRAWN_KEY) for m in history[2:]] == [True, None]
    assert shown_content(history[2]) == f"[乙(20002)] [回复 甲(20001)：{WITHDRAWN_TEXT}] 收到"
    assert shown_content(history[3]) == "[乙(20002)] [回复 甲(20001)：另一条] 收到"

    # A message never stored (said before the bot came) is looked for in the active history.
    unknown = '%"\\_'
    await store.append(SID, _reply("早先的话", unknown, 5.0))
    await store.mark_withdrawn(SID, unknown)
    history = await store.get_history(SID)
    assert [m.metadata.get(QUOTE_WITHDRAWN_KEY) for m in history[2:]] == [True, None, True]


# ---- search no longer finds a reply by the quoted words of a message withdrawn since ----------
GROUP = 93182
ORIGINAL = "[甲(20001)] tk8001 提取码 q3m8"
REPLY = "[乙(20002)] [回复 甲(20001)：tk8001 提取码 q3m8] 收到"
EARLY = "[丙(20003)] [回复 丁(20004)：早先的暗号 w5x2] 记下了"


async def _found(store: Store, sid: str, words: str) -> list[str]:
    return [unquoted(h.message) for h in await store.search(SearchQuery(sid, words))]


async def _said(store: Store, sid: str) -> None:
    await store.append(sid, Message(role="user", content=ORIGINAL, name="20001", ts=1.0, platform_id="901"))
    await store.append(
        sid, Message(role="user", content=REPLY, name="20002", ts=2.0, metadata={QUOTE_OF_KEY: "901"})
    )
    # Quotes a message said before the bot came: never stored, found only through this reply.
    await store.append(
        sid, Message(role="user", content=EARLY, name="20003", ts=3.0, metadata={QUOTE_OF_KEY: "777"})
    )


@pytest.mark.parametrize("indexed_first", [True, False], ids=["indexed", "waiting"])
async def test_a_reply_is_not_found_by_the_words_of_a_quote_withdrawn_since(
    store: Store, indexed_first: bool
) -> None:
    """Indexed before the withdrawal (SQLite's index takes its old terms out) or still waiting
    for its batch (which reads the mark); PostgreSQL indexes as it stores."""
    sid = group_sid(GROUP)
    await _said(store, sid)
    if indexed_first:
        assert await _found(store, sid, "q3m8") == [REPLY, ORIGINAL]
        assert await _found(store, sid, "w5x2") == [EARLY]
    await store.mark_withdrawn(sid, "901")
    await store.mark_withdrawn(sid, "777")
    assert await _found(store, sid, "q3m8") == []
    assert await _found(store, sid, "tk8001") == []
    assert await _found(store, sid, "w5x2") == []
    masked = f"[乙(20002)] [回复 甲(20001)：{WITHDRAWN_TEXT}] 收到"
    assert await _found(store, sid, "收到") == [masked]  # found by its own words
    assert await _found(store, sid, "记下了") == [f"[丙(20003)] [回复 丁(20004)：{WITHDRAWN_TEXT}] 记下了"]
    withdrawn = await store.search(SearchQuery(sid, "q3m8", withdrawn=True))
    assert [h.message.content for h in withdrawn] == [ORIGINAL]  # the owner's page finds the message


def _sqlite(tx: Tx) -> SqliteDb:
    db = tx._live()
    assert isinstance(db, SqliteDb)
    return db


def _index_holds(db: Path, sid: str, word: str) -> list[int]:
    """Row ids the FTS5 index itself matches for the word (no join: what it still holds)."""
    expression = search.match_expression(word, search.scope(sid))
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        sql = "SELECT rowid FROM search_index WHERE search_index MATCH ?"
        return [r[0] for r in conn.execute(sql, (expression,))]


async def test_sqlite_index_takes_out_exactly_the_terms_it_holds(tmp_path: Path) -> None:
    """A contentless FTS5 row is deleted by naming the terms it was indexed with: after the
    quote's terms left, a clear of the session takes the rest, and nothing stays behind; a
    batch read before the mark and written after it goes in as the reply reads now."""
    db = tmp_path / "memsum.db"
    store = Store(db)
    await store.open()
    try:
        sid = group_sid(GROUP)
        await _said(store, sid)
        await _found(store, sid, "q3m8")  # indexed
        await store.mark_withdrawn(sid, "901")
        assert _index_holds(db, sid, "q3m8") == [1]  # the withdrawn message's own row (R-MEM-2)
        assert _index_holds(db, sid, "收到") == [2]

        late = group_sid(GROUP + 1)
        await _said(store, late)
        # Store.index_search's two steps, the withdrawal between them.
        async with store.transaction() as tx:
            batch = await search.next_batch(await _sqlite(tx).raw(), 100)
        assert batch is not None
        docs = search.documents(batch.rows)
        await store.mark_withdrawn(late, "901")
        async with store.transaction() as tx:
            await search.commit_batch(await _sqlite(tx).raw(), batch, docs)
        assert _index_holds(db, late, "q3m8") == [4]
        assert await _found(store, late, "q3m8") == []

        for cleared in (sid, late):
            await store.clear(cleared, "context")
            for word in ("q3m8", "tk8001", "收到", "w5x2", "记下了", "甲", "乙"):
                assert _index_holds(db, cleared, word) == []
    finally:
        await store.close()


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
async def test_recall_command_does_not_find_a_reply_by_a_quote_withdrawn_since(
    tmp_path: Path, llm: ScriptedLLM, request: pytest.FixtureRequest, engine: str
) -> None:
    """bot.py as a process: a member's message, a reply quoting it, /回忆 finds both (the index
    holds them), the group_recall notice, then /回忆 of the withdrawn words finds nothing and the
    reply is found by its own words, its quote reading as withdrawn."""
    group = 93183
    sid = group_sid(group)
    settings = {"MEMSUM_MODELS": json.dumps([llm.model_config()]), "LOG_LEVEL": "INFO"}
    async with contextlib.AsyncExitStack() as stack:
        if engine == "postgresql":
            server: PgServer = request.getfixturevalue("pg_server")
            settings["MEMSUM_DB_URL"] = await stack.enter_async_context(fresh_database(server.url()))
        with responding(llm):
            llm.on_request(lambda body: Reply("答：好的"))
            bot, sim = await stack.enter_async_context(running_bot(tmp_path / "bot", settings))
            first = await sim.group_message(group, 20001, "tk8002 提取码 r4n7", nickname="甲")
            await sim.group_message(group, 20002, [reply(first), text("收到")], nickname="乙")
            db = settings.get("MEMSUM_DB_URL") or bot.db_path
            stored = "SELECT COUNT(*) FROM messages WHERE session_id = ?"

            async def both() -> bool:
                return await query(db, stored, sid) == [(2,)]

            await until(both, "both stored")
            found = await _command(sim, group, "/回忆 r4n7")
            assert "[回复 甲(20001)：tk8002 提取码 r4n7] 收到" in found
            # OneBot v11 event/notice.md 群消息撤回 {group_id, user_id, operator_id, message_id}.
            await sim.notice(
                "group_recall", group_id=group, user_id=20001, operator_id=20001, message_id=first
            )
            flags = "SELECT withdrawn FROM messages WHERE session_id = ? AND platform_id = ?"

            async def withdrawn() -> bool:
                return await query(db, flags, sid, str(first)) == [(1,)]

            await until(withdrawn, "withdrawn")
            assert await _command(sim, group, "/回忆 r4n7") == NOTHING
            assert await _command(sim, group, "/回忆 tk8002") == NOTHING
            found = await _command(sim, group, "/回忆 收到")
            assert f"[回复 甲(20001)：{WITHDRAWN_TEXT}] 收到" in found
            assert "r4n7" not in found


# ---- a taken port ---------------------------------------------------------------------------
async def test_a_taken_port_stops_bot_py_with_one_line_naming_port_in_env(tmp_path: Path) -> None:
    """Another program (or a second bot.py) listens on HOST:PORT: uvicorn said only `[Errno 98]
    error while attempting to bind`, after the whole start-up, and named no `.env` key."""
    bot = BotProcess(tmp_path, log_level="INFO")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", bot.port))
        holder.listen()
        await bot.spawn()  # not start(): it would take our socket for the bot's
        returncode = await bot.wait_exit()
    log = bot.log()
    assert returncode == 2, log
    assert "Traceback" not in log, log
    said = [line for line in log.splitlines() if "CRITICAL" in line or "ERROR" in line]
    assert len(said) == 1, log
    assert f"127.0.0.1:{bot.port}" in said[0]
    assert "已被占用" in said[0]
    assert "在 .env 里把 PORT 改成" in said[0]
    assert "memsum: database" not in log  # stopped before the start-up opened anything
