"""A third outside audit of recall (issue 11) and the owner's web page (issue 12), as a group
member, the bot's owner and an outside tester would try them: queries that are long or full
of FTS5's own syntax, dates in the bot's time zone on every path, what a clear on the page
leaves findable, and neighbours across the archive's edge. Real SQLite files (and the real
PostgreSQL server where the engine matters), a real uvicorn and httpx for the page."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from fastapi import FastAPI

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.recall import NOTHING, register_recall_tool
from nonebot_plugin_memsum.agent.tools import ToolContext, ToolRegistry
from nonebot_plugin_memsum.commands import parse_recall
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SearchQuery, Store
from nonebot_plugin_memsum.types import Message
from nonebot_plugin_memsum.web.app import create_app
from tests.fakes.web import COMPRESSIONS, GROUP, LINE, TOKEN, WebEnv, chat_turn, serving, web_env

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


# ---- the page's search -------------------------------------------------------------------
@pytest.fixture
def utc_system(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The machine's clock in UTC, as on most servers; the bot told to live in Shanghai."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@asynccontextmanager
async def shanghai_page(tmp_path: Path) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    cfg = Config.model_validate({"memsum_timezone": "Asia/Shanghai", "memsum_web_token": TOKEN})
    rt = await runtime.build(cfg, tmp_path / "tz.db", ["小记"], {"10001"})
    root = FastAPI()
    root.mount("/memsum", create_app(lambda: rt, TOKEN))
    try:
        async with serving(root) as base, httpx.AsyncClient(base_url=base + "/memsum/") as client:
            resp = await client.post("api/login", json={"token": TOKEN})
            client.headers["X-Memsum-CSRF"] = resp.json()["csrf"]
            yield rt, client
    finally:
        await runtime.close(rt)


async def test_the_pages_dates_are_the_bots_days_as_in_recall(tmp_path: Path, utc_system: None) -> None:
    # Said at 07:30 on 2 November in Shanghai (23:30 on the 1st in UTC). /回忆 and the recall
    # tool read dates in MEMSUM_TIMEZONE (README: days are the bot's time zone's); the owner
    # searching the same day on the page must find the same line, and not on the day before.
    morning = datetime(2026, 11, 2, 7, 30, tzinfo=SHANGHAI).timestamp()
    async with shanghai_page(tmp_path) as (rt, client):
        await rt.store.append(GROUP.id, said("小明", 20001, "周六去香山爬山", morning))
        by_command = await rt.store.search(parse_recall(GROUP.id, ["爬山", "2026-11-02"], [], SHANGHAI))
        assert len(by_command) == 1

        async def page(day: str) -> list[str]:
            params = {"q": "爬山", "since": day, "until": day}
            resp = await client.get(f"api/sessions/{G}/search", params=params)
            assert resp.status_code == 200
            return [r["hit"]["content"] for r in resp.json()["results"]]

        assert await page("2026-11-02") == ["[小明(20001)] 周六去香山爬山"]
        assert await page("2026-11-01") == []


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[WebEnv]:
    async with web_env(tmp_path) as e:
        yield e


@pytest.fixture
async def owner(env: WebEnv) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=env.base + "/") as client:
        resp = await client.post("api/login", json={"token": TOKEN})
        client.headers["X-Memsum-CSRF"] = resp.json()["csrf"]
        yield client


async def gauges(owner: httpx.AsyncClient) -> tuple[dict[str, Any], dict[str, Any]]:
    overview = (await owner.get("api/overview")).json()
    row = next(r for r in overview["sessions"] if r["id"] == GROUP.id)
    return row, (await owner.get(f"api/sessions/{G}")).json()


async def test_a_cleared_context_shows_no_usage_on_the_page_as_in_the_command(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    # Clearing the context forgets the session's latest usage (/摘要 then says there is none):
    # an emptied memory is not 43 % full. The page's gauges must say what the command says,
    # and come back with the next call.
    row, page = await gauges(owner)
    status = await env.rt.compression.status(GROUP.id)
    assert row["usage"] == page["usage"] == status.usage is not None
    assert (await owner.post(f"api/sessions/{G}/clear", json={"kind": "context", "confirm": True})).is_success
    assert (await env.rt.compression.status(GROUP.id)).usage is None
    row, page = await gauges(owner)
    assert (row["active"], page["active"]) == (0, 0)
    assert (row["usage"], row["usage_ratio"]) == (None, None)
    assert (page["usage"], page["usage_ratio"]) == (None, None)
    assert len(page["series"]) == COMPRESSIONS * 4 + 1  # the history of calls stays: it was paid

    await chat_turn(env.rt, "小记，清空后第一个问题", 9, time.time())
    status = await env.rt.compression.status(GROUP.id)
    assert status.usage is not None
    row, page = await gauges(owner)
    assert row["usage"] == page["usage"] == status.usage
    assert row["usage_ratio"] == page["usage_ratio"] == round(status.usage / LINE, 4)
