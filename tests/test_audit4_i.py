"""Fourth outside audit (i): several processes on one PostgreSQL memory, and the move from
SQLite (issue 13). Every test runs on the real server of tests/fakes/pgserver.py."""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nonebot_plugin_memsum.store import SearchQuery, Store, open_store
from nonebot_plugin_memsum.store.migrate import migrate
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.pgdb import fresh_database
from tests.fakes.pgserver import PgServer

GROUP = SessionRecord(
    id="onebot:10000:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
)
SID = GROUP.id


@pytest.fixture
async def url(pg_server: PgServer) -> AsyncIterator[str]:
    async with fresh_database(pg_server.url()) as fresh:
        yield fresh


def said(text: str, ts: float = 1.0, name: str = "20001") -> Message:
    return Message(role="user", content=f"[甲({name})] {text}", name=name, ts=ts)


async def _sqlite_file(path: Path, messages: list[Message]) -> None:
    store = Store(path)
    await store.open()
    try:
        await store.save_session(GROUP)
        for msg in messages:
            await store.append(SID, msg)
    finally:
        await store.close()


async def test_a_sqlite_message_holding_a_nul_is_migrated_not_a_crash(tmp_path: Path, url: str) -> None:
    path = tmp_path / "memsum.db"
    await _sqlite_file(path, [said("前"), said("a\x00b 提取码", ts=2.0, name="2\x001"), said("后", ts=3.0)])
    # PostgreSQL text refuses U+0000, which the SQLite file kept: the copy stores U+FFFD, as
    # the PostgreSQL store itself does, and verifies; a rerun finds nothing to copy.
    report = await migrate(path, url)
    assert report.verified, report.lines()
    again = await migrate(path, url)
    assert again.verified, again.lines()
    assert {t.name: t.copied for t in again.tables}["messages"] == 0
    pg = await open_store(url)
    try:
        history = await pg.get_history(SID)
        assert [m.content for m in history] == [
            "[甲(20001)] 前",
            "[甲(2\ufffd1)] a\ufffdb 提取码",
            "[甲(20001)] 后",
        ]
        assert history[1].name == "2\ufffd1"
        [hit] = await pg.search(SearchQuery(SID, "提取码"))
        assert hit.message.id == history[1].id
    finally:
        await pg.close()


async def test_a_search_holding_a_nul_answers_not_a_store_error(url: str) -> None:
    store = await open_store(url)
    try:
        await store.append(SID, said("提取码 k2v8"))
        assert await store.search(SearchQuery(SID, "提取\x00码")) is not None
        assert await store.search(SearchQuery(SID, "提取码", speaker="甲\x00")) is not None
    finally:
        await store.close()


async def test_a_nul_in_a_summary_setting_answer_or_deduplicated_message_is_stored(url: str) -> None:
    store = await open_store(url)
    try:
        await store.put_meta("summary", SID, {"text": "a\x00b"})
        await store.set_setting("session", SID, "persona", "你\x00好")
        await store.append_marking(SID, Message(role="assistant", content="x\x00y", ts=2.0), 1, "sending")
        m = Message(role="user", content="q\x00", name="1", ts=3.0, platform_id="p1")
        assert await store.append_once(SID, m) is not None
        assert await store.append_once(SID, m) is None
        assert await store.get_meta("summary", SID) == {"text": "a\x00b"}  # JSON escapes it
        assert (await store.get_settings("session", SID))["persona"] == "你\x00好"
        assert [x.content for x in await store.get_history(SID)] == ["x\ufffdy", "q\ufffd"]
    finally:
        await store.close()


async def test_a_huge_paste_of_long_words_is_stored_and_found_on_postgresql(url: str) -> None:
    # 2,500 distinct 500-letter words (a pasted dump): its tsvector would pass PostgreSQL's
    # 1 MB limit, which refused the message itself; the text is stored whole, the head indexed.
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_lowercase, k=500)) for _ in range(2500)]
    store = await open_store(url)
    try:
        big = await store.append(SID, said(" ".join(words)))
        await store.append(SID, said("之后 提取码", ts=2.0))
        assert [m.content for m in await store.get_history(SID)] == [big.content, "[甲(20001)] 之后 提取码"]
        [hit] = await store.search(SearchQuery(SID, words[0]))
        assert hit.message.id == big.id
        [hit] = await store.search(SearchQuery(SID, "提取码"))
        assert hit.message.content == "[甲(20001)] 之后 提取码"
    finally:
        await store.close()
