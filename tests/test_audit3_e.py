"""A third outside audit of recall (issue 11) and the owner's web page (issue 12), as a group
member, the bot's owner and an outside tester would try them: queries that are long or full
of FTS5's own syntax, dates in the bot's time zone on every path, what a clear on the page
leaves findable, and neighbours across the archive's edge. Real SQLite files (and the real
PostgreSQL server where the engine matters), a real uvicorn and httpx for the page."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from nonebot_plugin_memsum.agent.recall import NOTHING, register_recall_tool
from nonebot_plugin_memsum.agent.tools import ToolContext, ToolRegistry
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.store import SearchQuery, Store
from nonebot_plugin_memsum.types import Message
from tests.fakes.web import GROUP

SHANGHAI = ZoneInfo("Asia/Shanghai")
G = GROUP.id.replace(":", "%3A")
T0 = time.time() - 10 * 86400


def said(name: str, qq: int, body: str, ts: float) -> Message:
    return Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=ts)


@pytest.fixture
async def store(location: Path | str) -> AsyncIterator[Store]:
    s = Store(location)
    await s.open()
    yield s
    await s.close()


HIKE = "上周六去香山爬山吧，早上八点东门集合 😀"
SYNTAX = '他说 "NEAR" OR (AND) -x *y NOT ^z body:w 走'


async def seed(store: Store) -> None:
    await store.append(GROUP.id, said("小明", 20001, HIKE, T0))
    await store.append(GROUP.id, said("阿强", 20002, SYNTAX, T0 + 1))
    await store.append(GROUP.id, said("莉莉", 20003, "链接 https://a.com/x?y=1&z=2 提取码 k9", T0 + 2))


async def contents(store: Store, text: str, **kw: object) -> list[str]:
    hits = await store.search(SearchQuery(GROUP.id, text, **kw))  # type: ignore[arg-type]
    return [h.message.content for h in hits]


# ---- queries that must not crash -----------------------------------------------------------
async def test_a_query_of_hundreds_of_words_is_answered_not_an_error(store: Store) -> None:
    # A pasted paragraph or a model that repeats itself: every word must still occur (issue 11),
    # and the search answers instead of failing on SQLite's expression depth.
    await seed(store)
    assert await contents(store, " ".join(["爬山"] * 600)) == [f"[小明(20001)] {HIKE}"]
    assert await contents(store, " ".join(f"词{i}" for i in range(1200))) == []
    assert await contents(store, "爬山 " + " ".join(["集合"] * 800)) == [f"[小明(20001)] {HIKE}"]
    # …and through the model's tool, which must not hand the model an internal error.
    registry = ToolRegistry()
    register_recall_tool(registry, store, estimate_text_tokens)
    ctx = ToolContext(session_id=GROUP.id)
    many = " ".join(f"w{i}" for i in range(1500))
    assert await registry.call(ctx, "recall", f'{{"query": "{many}"}}') == NOTHING
    found = await registry.call(ctx, "recall", '{"query": "' + " ".join(["香山"] * 700) + '"}')
    assert "早上八点东门集合" in found


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ('"', []),
        ("*", []),
        ("-", []),
        ("(", []),
        (")", []),
        ('"爬山"', [0]),  # quotes are not FTS5 quotes: the word inside is searched
        ("爬山*", [0]),
        ("-爬山", [0]),
        ("(爬山)", [0]),
        ("NEAR", [1]),  # FTS5's operators are ordinary words of the text
        ("OR", [1]),
        ("AND", [1]),
        ("not", [1]),
        ("爬山 OR 链接", []),  # not an OR: every word must occur
        ("body:w", [1]),  # not a column filter
        ("^z", [1, 2]),  # z, a prefix: also the z of the link
        ("NEAR(爬山 香山)", []),
        ("😀", []),  # nothing searchable, no error
        ("https://a.com/x?y=1&z=2", [2]),
        ("提取码 k9", [2]),
    ],
)
async def test_fts_syntax_in_a_query_is_plain_text(store: Store, query: str, expected: list[int]) -> None:
    await seed(store)
    texts = [HIKE, SYNTAX, "链接 https://a.com/x?y=1&z=2 提取码 k9"]
    assert sorted(texts.index(c.split("] ", 1)[1]) for c in await contents(store, query)) == expected
    assert await contents(store, "", speaker=query) is not None  # as a speaker, no error either
