"""Recall (issue 11): the search index on both engines (real SQLite files, fresh PostgreSQL
databases; the background index of an older file is SQLite's alone), the `recall` tool, `/回忆`'s
arguments, clearing, isolation, and the upgrade of a database made by the version before.

Messages are stored through `Store.append` (the path OneBot recording takes), labelled
`[昵称(ID)] 正文` as onebot.py writes them.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from zoneinfo import ZoneInfo

import aiosqlite
import pytest

from nonebot_plugin_memsum.agent.recall import (
    NO_TERMS,
    NOTHING,
    RESULT_TOKENS,
    line,
    parse_time,
    query_of,
    register_recall_tool,
    render,
)
from nonebot_plugin_memsum.agent.tools import ToolContext, ToolRegistry
from nonebot_plugin_memsum.commands import parse_recall
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.runtime import keep_search_index
from nonebot_plugin_memsum.store import SearchHit, SearchQuery, Store, pg_search
from nonebot_plugin_memsum.store import search as search_mod
from nonebot_plugin_memsum.store.migrations import MIGRATIONS, Migration, migrate
from nonebot_plugin_memsum.types import Message, ToolCall
from tests.fakes.logs import captured
from tests.fakes.pgdb import raw

T = TypeVar("T")
GROUP = "onebot:10000:group:1"
OTHER = "onebot:10000:group:2"
PRIVATE = "onebot:10000:private:20001"
DAY = 86400.0
T0 = datetime(2026, 11, 2, 20, 0).timestamp()

_ts = itertools.count()


def said(name: str, qq: int, body: str, ts: float | None = None) -> Message:
    return Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=ts or T0 + next(_ts))


async def find(store: Store, session: str, text: str = "", **kw: object) -> list[str]:
    hits = await store.search(SearchQuery(session, text, **kw))  # type: ignore[arg-type]
    return [h.message.content for h in hits]


LOG = [
    ("小明", 20001, "这周末有人去爬山吗"),
    ("阿强", 20002, "资料我传网盘了，链接 https://pan.baidu.com/s/1AbCdE 提取码：x7k9"),
    ("莉莉", 20003, "链接打不开啊"),
    ("老王", 20004, "我的 QQ 是 123456789，有事找我"),
    ("Tony", 20011, "The meeting is moved to Friday"),
    ("小明", 20001, "ＡＢＣ全角字母也要能搜"),
]


async def seed(store: Store, session: str = GROUP) -> list[Message]:
    return [await store.append(session, said(n, q, b)) for n, q, b in LOG]


# ---- what can be found --------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("周末", [0]),  # a two-character word inside a longer run
        ("链接", [1, 2]),  # two messages; the one carrying the link first (length prior)
        ("提取码", [1]),  # three characters: a phrase of two bigrams
        ("爬", [0]),  # one character: a prefix term
        ("山", [0]),  # one character at the end of its run
        ("x7k9", [1]),  # an extraction code
        ("x7k", [1]),  # its head
        ("123456789", [3]),  # a QQ number
        ("12345678", []),  # a longer QQ number does not match a shorter one's query…
        ("pan.baidu.com/s/1AbCdE", [1]),  # a URL
        ("meeting", [4]),  # an English word, any case
        ("FRIDAY", [4]),
        ("abc", [5]),  # full-width letters are folded (NFKC)
        ("网盘 提取码", [1]),  # every word must occur
        ("网盘 周末", []),
        ("码提", []),  # characters in the wrong order are not the word
        ("！？。", []),  # nothing searchable
    ],
)
async def test_words_codes_numbers_and_urls_are_found(store: Store, query: str, expected: list[int]) -> None:
    stored = await seed(store)
    assert await find(store, GROUP, query) == [stored[i].content for i in expected]


def test_terms_cut_cjk_runs_into_bigrams_and_keep_other_runs_whole() -> None:
    assert search_mod.terms("资料传网盘 https://t.cn/Ab1 QQ123") == [
        "资料",
        "料传",
        "传网",
        "网盘",
        "盘",
        "https",
        "t",
        "cn",
        "ab1",
        "qq123",
    ]
    assert (
        search_mod.match_expression("提取码 码 B站 12345")
        == '"提取 取码" AND "码"* AND "b 站"* AND ("12345" OR "12 345")'
    )
    assert search_mod.match_expression("  ，。😀 ") is None


async def test_label_is_the_speaker_not_the_body(store: Store) -> None:
    await store.append(GROUP, said("周末", 20009, "你好"))
    assert await find(store, GROUP, "周末") == []  # a nickname is not what was said
    assert await find(store, GROUP, "", speaker="周末") == ["[周末(20009)] 你好"]


async def test_ranking_is_relevance_then_newest(store: Store) -> None:
    first = await store.append(GROUP, said("甲", 1, "烧烤呢"))
    second = await store.append(GROUP, said("乙", 2, "烧烤呢"))
    plan = await store.append(GROUP, said("丙", 3, "周六晚上七点楼下烧烤，人均五十，带上饮料"))
    hits = await store.search(SearchQuery(GROUP, "烧烤"))
    # The message that carries the plan before the short ones that repeat its word (the
    # length prior); equal ones newest first.
    assert [h.message.id for h in hits] == [plan.id, second.id, first.id]
    assert hits[1].score == hits[2].score
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


async def test_a_frequent_word_ranks_only_its_newest_matches(store: Store) -> None:
    old = await store.append(GROUP, said("甲", 1, "今天的会议纪要：下周一交方案，周三评审，周五上线"))
    for i in range(search_mod.CANDIDATES):
        await store.append(GROUP, said("乙", 2, f"今天{i}"))
    hits = await store.search(SearchQuery(GROUP, "今天", limit=3))
    assert old.id not in [h.message.id for h in hits]  # past the newest CANDIDATES matches
    assert [h.message.id for h in await store.search(SearchQuery(GROUP, "今天 纪要"))] == [old.id]
    day = await store.search(SearchQuery(GROUP, "今天", since=old.ts - 1, until=old.ts + 1))
    assert [h.message.id for h in day] == [old.id]  # a time range finds it again


async def test_assistant_answers_and_notices_are_found_tool_results_are_not(store: Store) -> None:
    await store.append(GROUP, Message(role="assistant", content="周六的烧烤改到周日了"))
    await store.append(GROUP, Message(role="notice", content="老王(20004) 加入了本群"))
    call = ToolCall(id="c1", name="recall", arguments='{"query": "烧烤"}')
    await store.append(GROUP, Message(role="assistant", content="", tool_calls=(call,)))
    await store.append(GROUP, Message(role="tool", content="烧烤 的旧记录", tool_call_id="c1", name="recall"))
    await store.append(GROUP, Message(role="system", content="对话已压缩 烧烤", event_marker=True))
    assert await find(store, GROUP, "烧烤") == ["周六的烧烤改到周日了"]
    assert await find(store, GROUP, "", speaker="助手") == ["周六的烧烤改到周日了"]
    assert await find(store, GROUP, "加入") == ["老王(20004) 加入了本群"]


# ---- filters --------------------------------------------------------------------------
async def test_speaker_filter_by_qq_number_or_name(store: Store) -> None:
    stored = await seed(store)
    await store.append(GROUP, said("小明同学", 20021, "链接也发我一份"))
    assert await find(store, GROUP, "链接", speaker="20003") == [stored[2].content]
    assert await find(store, GROUP, "链接", speaker="阿强") == [stored[1].content]
    assert await find(store, GROUP, "链接", speaker="2000") == []  # QQ numbers match whole
    assert await find(store, GROUP, "", speaker="20001") == [stored[5].content, stored[0].content]
    # A name matches any nickname holding it.
    assert len(await find(store, GROUP, "", speaker="小明")) == 3
    assert await find(store, GROUP, "周末", speaker="阿强") == []


async def test_time_filter_since_inclusive_until_exclusive(store: Store) -> None:
    days = [await store.append(GROUP, said("甲", 1, f"第{i}天的周报", ts=T0 + i * DAY)) for i in range(5)]
    got = await find(store, GROUP, "周报", since=T0 + DAY, until=T0 + 3 * DAY)
    assert got == [days[2].content, days[1].content]
    assert await find(store, GROUP, "周报", since=T0 + 4 * DAY) == [days[4].content]
    assert await find(store, GROUP, "周报", until=T0) == []


async def test_context_lines_are_the_neighbours_in_the_session_not_cleared(store: Store) -> None:
    before = await store.append(GROUP, said("甲", 1, "大家好"))
    await store.append(OTHER, said("乙", 2, "别的群的话"))
    await store.append(GROUP, Message(role="system", content="对话已压缩", event_marker=True))
    hit = await store.append(GROUP, said("丙", 3, "提取码是 x7k9"))
    await store.archive_span(GROUP, 2)  # neighbours come from the archive and the active history
    after = await store.append(GROUP, said("丁", 4, "谢谢"))
    [found] = await store.search(SearchQuery(GROUP, "提取码"), context=2)
    assert found.message.id == hit.id
    assert found.before == (before,)
    assert found.after == (after,)


# ---- isolation and clearing ------------------------------------------------------------
async def test_a_session_never_sees_another_sessions_messages(store: Store) -> None:
    await seed(store, GROUP)
    await seed(store, OTHER)
    await store.append(PRIVATE, said("小明", 20001, "私聊里的提取码 zz99"))
    for session in (GROUP, OTHER):
        got = await store.search(SearchQuery(session, "提取码"))
        assert len(got) == 1
        assert all(h.message.content.endswith("x7k9") for h in got)
    assert await find(store, GROUP, "zz99") == []
    assert await find(store, PRIVATE, "zz99") == ["[小明(20001)] 私聊里的提取码 zz99"]
    assert await find(store, "onebot:10000:group:3", "提取码") == []


async def test_archived_messages_stay_findable_after_compression(store: Store) -> None:
    stored = await seed(store)
    archived = await store.archive_span(GROUP, len(stored) - 1, keep=[0])
    assert archived == len(stored) - 2
    assert await find(store, GROUP, "提取码") == [stored[1].content]
    assert await find(store, GROUP, "周末") == [stored[0].content]  # a kept original


async def _index_rows(location: Path | str, session: str, word: str) -> list[int]:
    """Ids of the index's rows holding a word of the session (not the answers of a search:
    the index itself)."""
    if isinstance(location, Path):
        match = search_mod.match_expression(word, search_mod.scope(session))
        sql = "SELECT rowid FROM search_index WHERE search_index MATCH ?"
    else:
        match = pg_search.tsquery(SearchQuery(session, word))
        sql = "SELECT id FROM search_index WHERE doc @@ CAST(? AS tsquery)"
    return [r[0] for r in await raw(location, sql, (match,))]


async def test_cleared_context_is_never_found_again(store: Store) -> None:
    stored = await seed(store)
    await store.archive_span(GROUP, 3)  # some of it compressed before the clear
    await seed(store, OTHER)
    await store.clear(GROUP, "summary")  # the summary alone: the messages stay findable
    assert await find(store, GROUP, "提取码") == [stored[1].content]

    await store.clear(GROUP, "context")
    for word in ("提取码", "周末", "x7k9", "链接"):
        assert await find(store, GROUP, word) == []
    assert await find(store, GROUP, "", speaker="20001") == []
    # The rows left the index itself, not only the answers; the other group keeps its own.
    assert await _index_rows(store.location, GROUP, "提取码") == []
    assert len(await _index_rows(store.location, OTHER, "提取码")) == 1
    assert len(await find(store, OTHER, "提取码")) == 1

    later = await store.append(GROUP, said("阿强", 20002, "新的提取码是 q1w2"))
    assert await find(store, GROUP, "提取码") == [later.content]
    [hit] = await store.search(SearchQuery(GROUP, "提取码"), context=5)
    assert hit.before == ()  # cleared neighbours are not shown either


async def test_a_deleted_session_is_never_found_again(store: Store) -> None:
    await seed(store)
    await seed(store, OTHER)
    await find(store, GROUP, "提取码")  # indexed now
    await store.delete_session(GROUP)
    assert await _index_rows(store.location, GROUP, "提取码") == []  # only the other group's row is left
    assert len(await _index_rows(store.location, OTHER, "提取码")) == 1
    assert await find(store, GROUP, "提取码") == []
    again = await store.append(GROUP, said("阿强", 20002, "重新开始：提取码 n3w1"))
    assert await find(store, GROUP, "提取码") == [again.content]
    assert len(await find(store, OTHER, "提取码")) == 1


async def test_a_context_cleared_before_it_was_indexed_never_enters_the_index(store: Store) -> None:
    # Cleared before SQLite's background batch ran: nothing of it is indexed later, and
    # nothing was indexed before (the batches alone index SQLite, not the write itself).
    await seed(store)
    await store.clear(GROUP, "context")
    await seed(store, OTHER)
    while await store.index_search() is not None:
        pass
    assert await _index_rows(store.location, GROUP, "提取码") == []
    assert await _index_rows(store.location, GROUP, "周末") == []
    assert await find(store, GROUP, "链接") == []
    assert len(await find(store, OTHER, "链接")) == 2
    if isinstance(store.location, Path):
        await raw(store.location, "INSERT INTO search_index (search_index) VALUES ('integrity-check')")


async def test_sessions_sharing_a_scope_still_never_see_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite: two sessions whose scope hashes collide share posting lists, never answers:
    # the statement re-checks the session (and the cleared watermark) on the message row.
    monkeypatch.setattr(search_mod, "scope", lambda session_id: "0" * search_mod.SCOPE_DIGITS)
    store = Store(tmp_path / "memsum.db")
    await store.open()
    try:
        mine = await seed(store, GROUP)
        await seed(store, OTHER)
        assert await find(store, GROUP, "提取码") == [mine[1].content]
        [hit] = await store.search(SearchQuery(GROUP, "提取码"), context=3)
        assert all(m.id in {x.id for x in mine} for m in (*hit.before, *hit.after))
        await store.clear(OTHER, "context")
        assert await find(store, GROUP, "提取码") == [mine[1].content]
        assert await find(store, OTHER, "提取码") == []
    finally:
        await store.close()


# ---- the recall tool --------------------------------------------------------------------
async def test_recall_tool_returns_lines_of_its_own_session(store: Store) -> None:
    stored = await seed(store)
    await seed(store, OTHER)
    tools = ToolRegistry()
    register_recall_tool(tools, store, estimate_text_tokens)
    out = await tools.call(ToolContext(GROUP), "recall", '{"query": "提取码", "speaker": "阿强"}')
    assert out.startswith("找到 1 处相关记录（按相关程度排列，→ 标出命中的消息）")
    assert "→ " + line(stored[1]) in out
    assert line(stored[0]) in out
    assert line(stored[2]) in out
    assert line(stored[1]).endswith(
        "[阿强(20002)] 资料我传网盘了，链接 https://pan.baidu.com/s/1AbCdE 提取码：x7k9"
    )
    assert await tools.call(ToolContext(GROUP), "recall", '{"query": "不存在的词"}') == NOTHING
    assert await tools.call(ToolContext(GROUP), "recall", '{"query": "？！"}') == f"错误：{NO_TERMS}"
    bad = await tools.call(ToolContext(GROUP), "recall", '{"query": "链接", "since": "上周"}')
    assert bad.startswith("错误：日期「上周」")
    # The model swapped the dates: told so, as /回忆 tells a person, not 「没有找到」.
    swapped = '{"query": "链接", "since": "2026-11-03", "until": "2026-11-02"}'
    assert await tools.call(ToolContext(GROUP), "recall", swapped) == "错误：日期范围的结束早于开始"


def test_recall_arguments() -> None:
    q = query_of(GROUP, {"query": "链接", "speaker": "@小明", "since": "2026-11-02", "until": "2026-11-03"})
    assert (q.text, q.speaker, q.limit) == ("链接", "小明", 8)
    assert q.since == datetime(2026, 11, 2).timestamp()
    assert q.until == datetime(2026, 11, 4).timestamp()  # the whole last day
    assert query_of(GROUP, {"query": "x", "limit": 500}).limit == 20
    assert query_of(GROUP, {"query": "", "speaker": "20001"}).speaker == "20001"
    assert parse_time("2026-11-02 08:30") == datetime(2026, 11, 2, 8, 30).timestamp()
    # MEMSUM_TIMEZONE: dates are read and times written in the bot's zone, as /用量 does.
    shanghai = ZoneInfo("Asia/Shanghai")
    assert parse_time("2026-11-02", zone=shanghai) == datetime(2026, 11, 1, 16, 0, tzinfo=UTC).timestamp()
    at = Message(role="assistant", content="好", ts=datetime(2026, 11, 1, 16, 30, tzinfo=UTC).timestamp())
    assert line(at, shanghai) == "2026-11-02 00:30 [助手] 好"
    assert line(at, UTC) == "2026-11-01 16:30 [助手] 好"
    with pytest.raises(ValueError, match="没有「2026-02-30」这个日期"):
        parse_time("2026-02-30")
    with pytest.raises(ValueError, match="limit"):
        query_of(GROUP, {"query": "x", "limit": "很多"})


def _hit(i: int, body: str) -> SearchHit:
    return SearchHit(Message(role="user", content=f"[甲({i})] {body}", name=str(i), ts=T0, id=i), -1.0)


def test_render_keeps_to_the_budget_and_drops_neighbours_first() -> None:
    def chars(text: str) -> int:
        return len(text)

    near = Message(role="assistant", content="好" * 30, ts=T0, id=100)
    hits = [
        SearchHit(_hit(1, "一" * 20).message, -2.0, before=(near,)),
        _hit(2, "二" * 20),
        _hit(3, "三" * 20),
    ]
    one_line = chars("→ " + line(hits[0].message))
    out = render(hits, 2 * one_line + 1, chars)
    assert "好" not in out  # the neighbour did not fit; its hit came alone
    assert "一" * 20 in out
    assert "二" * 20 in out
    assert "三" not in out
    assert render([_hit(1, "长" * 500)], 50, chars).endswith("…（过长，已截断）")
    assert render([], RESULT_TOKENS, chars) == NOTHING


def test_line_format() -> None:
    m = said("小明", 20001, "你好", ts=datetime(2026, 11, 2, 20, 5).timestamp())
    assert line(m) == "2026-11-02 20:05 [小明(20001)] 你好"
    assert line(Message(role="assistant", content="在的", ts=m.ts)) == "2026-11-02 20:05 [助手] 在的"
    assert (
        line(Message(role="notice", content="甲 加入了本群", ts=m.ts))
        == "2026-11-02 20:05 [通知] 甲 加入了本群"
    )


# ---- /回忆 arguments ---------------------------------------------------------------------
def test_recall_command_arguments() -> None:
    q = parse_recall(GROUP, ["提取码", "网盘", "2026-11-01..2026-11-03"], ["20002"])
    assert (q.text, q.speaker, q.limit) == ("提取码 网盘", "20002", 10)
    assert (q.since, q.until) == (datetime(2026, 11, 1).timestamp(), datetime(2026, 11, 4).timestamp())
    one_day = parse_recall(GROUP, ["@小明", "2026-11-02"], [])
    assert (one_day.text, one_day.speaker) == ("", "小明")
    assert one_day.until == datetime(2026, 11, 3).timestamp()
    for words, mentions, error in [
        ([], [], "请给出关键词或 @某人"),
        (["2026-11-02"], [], "请给出关键词或 @某人"),
        (["。。"], [], NO_TERMS),
        (["链接"], ["1", "2"], "一次只能指定一个人"),
        (["链接", "2026-11-02", "2026-11-03"], [], "只能给一个日期"),
        (["链接", "2026-11-05..2026-11-01"], [], "结束早于开始"),
        (["链接", "2026-13-01"], [], "没有「2026-13-01」这个日期"),
    ]:
        with pytest.raises(ValueError, match=error):
            parse_recall(GROUP, words, mentions)


# ---- the upgrade ---------------------------------------------------------------------------
def _before(suffix: str) -> tuple[Migration, ...]:
    """The migrations a version had before the one whose name ends with `suffix`."""
    return MIGRATIONS[: MIGRATIONS.index(next(m for m in MIGRATIONS if m.__name__.endswith(suffix)))]


async def _old_database(path: Path, rows: list[tuple[str, str, str, str, float]]) -> None:
    """A file exactly as the version before the search index left it."""
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await migrate(db, _before("_search"))
        await db.executemany(
            "INSERT INTO messages (session_id, role, content, name, ts) VALUES (?, ?, ?, ?, ?)", rows
        )


async def test_migration_indexes_an_old_database_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    rows = [(GROUP, "user", f"[甲(1)] 第{i}条 周末爬山", "1", T0 + i) for i in range(23)]
    rows += [(OTHER, "user", "[乙(2)] 提取码 k8k8", "2", T0 + 30), (GROUP, "tool", "周末", None, T0 + 31)]
    await _old_database(path, rows)

    store = Store(path)
    await store.open()  # the migration adds the index and records how far; it indexes nothing
    try:
        assert await store.search_state() == search_mod.IndexState(25, 25, 25)
        assert await find(store, GROUP, "周末") == []
        new = await store.append(GROUP, said("丙", 3, "新消息也说周末"))
        assert await find(store, GROUP, "周末") == [new.content]  # new messages at once

        first = await store.index_search(10)  # the newest ten of the older ids
        assert first == search_mod.IndexState(15, 26, 25)
        assert len(await find(store, GROUP, "周末", limit=100)) == 1 + 8  # ids 16..23 of GROUP
        await store.clear(OTHER, "context")  # cleared before the backfill reached it
        with captured("INFO") as logs:
            task = asyncio.create_task(keep_search_index(store, batch=10, idle=0.01))
            await until(lambda: store.search_state(), lambda at: at.old_upto == 0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert [line.strip() for line in logs] == [
            "memsum: indexing 15 older messages for search in the background",
            "memsum: search index of older messages 80% built",
            "memsum: search index of older messages 100% built",
        ]
        assert len(await find(store, GROUP, "周末", limit=100)) == 24
        assert await find(store, OTHER, "提取码") == []  # never indexed: it was cleared
    finally:
        await store.close()

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        conn.execute("INSERT INTO search_index (search_index) VALUES ('integrity-check')")
    assert len(await _index_rows(path, GROUP, "周末")) == 24  # the old tool result was not indexed


def _previous_format(
    row_id: int, session_id: str, body: str, who: str, ts: float
) -> tuple[int, str, str, str]:
    """An index row as the version before migration 7 wrote it (store/search.py at commit
    68bab2e): unscoped terms, and a session term plus a day term in `sess`."""
    session = "s" + hashlib.blake2b(session_id.encode(), digest_size=8).hexdigest()
    terms = search_mod.terms
    return row_id, " ".join(terms(body)), " ".join(terms(who)), f"{session} {session}d{int(ts // DAY)}"


async def test_migration_rebuilds_an_index_of_the_previous_format_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "v6.db"
    rows = [(GROUP, "user", f"[甲(1)] 第{i}条 周末爬山", "1", T0 + i) for i in range(23)]
    rows += [(OTHER, "user", "[乙(2)] 提取码 k8k8", "2", T0 + 30), (GROUP, "tool", "周末", None, T0 + 31)]
    async with aiosqlite.connect(path, isolation_level=None) as db:  # as the previous version left it
        await migrate(db, _before("_search_scoped"))
        await db.executemany(
            "INSERT INTO messages (session_id, role, content, name, ts) VALUES (?, ?, ?, ?, ?)", rows
        )
        await db.executemany(
            "INSERT INTO search_index (rowid, body, who, sess) VALUES (?, ?, ?, ?)",
            [
                _previous_format(i + 1, sid, content.split("] ", 1)[1], content[1:].split("(", 1)[0], ts)
                for i, (sid, role, content, _, ts) in enumerate(rows)
                if role == "user"
            ],
        )
        await db.execute("UPDATE search_state SET old_upto = 0, indexed_upto = 25, total_old = 0")
        await db.execute("INSERT INTO search_cleared (session_id, upto) VALUES (?, 24)", (OTHER,))

    store = Store(path)
    await store.open()  # the migration drops the old index and records how far; it indexes nothing
    try:
        assert await store.search_state() == search_mod.IndexState(25, 25, 25)
        assert await find(store, GROUP, "周末") == []
        new = await store.append(GROUP, said("丙", 3, "新消息也说周末"))
        assert await find(store, GROUP, "周末") == [new.content]  # new messages at once
        with captured("INFO") as logs:
            task = asyncio.create_task(keep_search_index(store, batch=10, idle=0.01))
            await until(lambda: store.search_state(), lambda at: at.old_upto == 0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert [line.strip() for line in logs][:: len(logs) - 1] == [
            "memsum: indexing 25 older messages for search in the background",
            "memsum: search index of older messages 100% built",
        ]
        assert len(await find(store, GROUP, "周末", limit=100)) == 24
        assert await find(store, OTHER, "提取码") == []  # cleared in the previous version: stays out
    finally:
        await store.close()

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        conn.execute("INSERT INTO search_index (search_index) VALUES ('integrity-check')")
    assert len(await _index_rows(path, GROUP, "周末")) == 24
    assert await _index_rows(path, OTHER, "提取码") == []


async def until(read: Callable[[], Awaitable[T]], ok: Callable[[T], bool]) -> None:
    """Wait (bounded) until what `read` returns satisfies `ok`."""
    for _ in range(500):
        if ok(await read()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_runtime_start_is_not_blocked_by_the_backfill(tmp_path: Path) -> None:
    from nonebot_plugin_memsum import runtime
    from nonebot_plugin_memsum.config import Config

    path = tmp_path / "old.db"
    await _old_database(path, [(GROUP, "user", f"[甲(1)] 链接{i}", "1", T0 + i) for i in range(50)])
    rt = await runtime.build(Config(), path, [], set())
    try:
        assert rt.indexing is not None  # a task of its own: start-up did not wait for it
        await until(rt.store.search_state, lambda at: at.old_upto == 0)
        assert len(await find(rt.store, GROUP, "链接", limit=100)) == 50
    finally:
        await runtime.close(rt)


async def test_caught_up_the_indexer_waits_before_indexing_what_arrived_meanwhile(tmp_path: Path) -> None:
    # Issue 9: a busy chat stores a message during every batch; the indexer that went straight
    # on cost one indexing transaction per message. Caught up, it now waits `idle` first, and a
    # search still finds what waits (it indexes it itself).
    store = Store(tmp_path / "m.db")
    await store.open()
    batches: list[int] = []
    arrived: list[Message] = []
    index = store.index_search

    async def chatty(batch: int = 2000, *, new_only: bool = False) -> search_mod.IndexState | None:
        at = await index(batch, new_only=new_only)
        if at is not None and not new_only:  # the background's batch: a message comes meanwhile
            batches.append(at.indexed_upto)
            arrived.append(await store.append(GROUP, said("乙", 2, f"第{len(arrived) + 2}条周末")))
        return at

    store.index_search = chatty  # type: ignore[method-assign]
    try:
        first = await store.append(GROUP, said("甲", 1, "第一条"))
        task = asyncio.create_task(keep_search_index(store, batch=10, idle=60, start=0))
        await until(lambda: asyncio.sleep(0, batches), lambda b: len(b) == 1)
        await asyncio.sleep(0.3)  # going straight on, it would have indexed the second by now
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert batches == [first.id]
        assert (await store.search_state()).indexed_upto == first.id
        assert await find(store, GROUP, "周末") == [arrived[0].content]
    finally:
        await store.close()
