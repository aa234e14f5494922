"""A third outside audit of recall (issue 11) and the owner's web page (issue 12), as a group
member, the bot's owner and an outside tester would try them: queries that are long or full
of FTS5's own syntax, dates in the bot's time zone on every path, what a clear on the page
leaves findable, and neighbours across the archive's edge. Real SQLite files (and the real
PostgreSQL server where the engine matters), a real uvicorn and httpx for the page."""

from __future__ import annotations

import csv
import io
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
from tests.fakes.llm_server import API_KEY, Reply
from tests.fakes.web import COMPRESSIONS, GROUP, LINE, PRIVATE, TOKEN, WebEnv, chat_turn, serving, web_env

SHANGHAI = ZoneInfo("Asia/Shanghai")
G = GROUP.id.replace(":", "%3A")
T0 = time.time() - 10 * 86400


def said(name: str, qq: int, body: str, ts: float) -> Message:
    return Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=ts)


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


async def test_a_provider_echoing_the_key_in_a_failure_never_shows_it_on_the_page(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    # Some gateways answer a refused key with the key itself; the failure reason is on the
    # page (the compression history, the progress line), the key must not be.
    env.llm.reset()
    env.llm.on_request(lambda body: Reply(status=401, error=f"Incorrect API key provided: {API_KEY}"))
    assert (await owner.post(f"api/sessions/{G}/compress", json={})).status_code == 202
    await env.app.state.live.wait()
    page = await owner.get(f"api/sessions/{G}")
    data = page.json()
    assert data["progress"]["phase"] == "error"
    assert data["compressions"][0]["outcome"] != "done"
    assert "401" in page.text
    for path in (f"api/sessions/{G}", "api/overview", "api/usage", "api/usage.csv"):
        assert API_KEY not in (await owner.get(path)).text, path


async def test_the_pages_search_takes_fts_syntax_and_pasted_paragraphs(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    path = f"api/sessions/{G}/search"
    for q in [
        '"爬山',
        "爬山 OR",
        "NEAR(爬山)",
        "-爬山 *",
        "(((",
        "😀",
        " ".join(["爬山"] * 700),
        "爬" * 4000,
    ]:
        resp = await owner.get(path, params={"q": q})
        assert resp.status_code == 200, q[:20]
    hits = (await owner.get(path, params={"q": " ".join(["干粮"] * 700), "speaker": "@成员5"})).json()
    assert [r["hit"]["content"][:11] for r in hits["results"]] == ["[成员5(30005)"]


async def test_search_neighbours_are_the_nearest_said_across_the_archive_edge(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    # Each hit comes with the two conversation lines said just before and just after it in
    # this session, whether they are archived, kept or active, in time order.
    store = env.rt.store
    said_here = sorted(
        (
            m
            for m in [*await store.get_archived(GROUP.id), *await store.get_history(GROUP.id)]
            if m.is_conversation
        ),
        key=lambda m: m.id or 0,
    )
    said_here = [m for m in said_here if m.content.strip()]
    ids = [m.id for m in said_here]
    results = (await owner.get(f"api/sessions/{G}/search", params={"q": "爬山"})).json()["results"]
    assert len(results) == 20  # the page's limit: more than that many lines say it
    archived = {m.id for m in await store.get_archived(GROUP.id)}
    edges = 0
    for r in results:
        at = ids.index(r["hit"]["id"])
        assert [m["id"] for m in r["before"]] == ids[max(0, at - 2) : at]
        assert [m["id"] for m in r["after"]] == ids[at + 1 : at + 3]
        edges += (
            len({r["hit"]["id"] in archived} | {m["id"] in archived for m in r["before"] + r["after"]}) > 1
        )
    assert edges > 0  # some hit's neighbours straddle the archive's edge


async def test_usage_csv_cells_are_the_usage_tables(env: WebEnv, owner: httpx.AsyncClient) -> None:
    rows = (await owner.get("api/usage?days=7")).json()["rows"]
    text = (await owner.get("api/usage.csv?days=7")).content.decode("utf-8-sig")
    cells = list(csv.reader(io.StringIO(text)))[1:]
    assert len(cells) == len(rows) > 0
    for cell, row in zip(cells, rows, strict=True):
        day, model, purpose, calls, tokens_in, cached, tokens_out, cost, currency = cell
        assert (day, model, purpose) == (row["day"], row["model"], row["purpose"])
        assert (int(calls), int(tokens_in), int(cached), int(tokens_out)) == (
            row["calls"],
            row["tokens_in"],
            row["tokens_cached"],
            row["tokens_out"],
        )
        if row["cost"] is None:
            assert (cost, currency) == ("", "")
        else:
            assert float(cost) == pytest.approx(row["cost"], abs=1e-6)
            assert currency == row["currency"] == "元"
            assert float(cost) == pytest.approx(
                (row["tokens_in"] * 2 + row["tokens_out"] * 8) / 1e6, abs=1e-6
            )


async def test_every_layer_reads_the_same_on_the_overview_and_the_session_page(tmp_path: Path) -> None:
    # Global < onebot < onebot.group < 本群 < 本会话 (README): the overview resolves a thousand
    # sessions its own way and must name the same value and layer as the session page and the
    # commands, at every layer as the owner moves a setting up and down.
    cfg = Config.model_validate(
        {
            "memsum_web_token": TOKEN,
            "memsum_compress_at": 0.6,
            "memsum_tiers": {"onebot": {"compress_at": 0.5}, "onebot.group": {"compress_at": 0.4}},
        }
    )
    rt = await runtime.build(cfg, tmp_path / "tiers.db", ["小记"], {"10001"})
    root = FastAPI()
    root.mount("/memsum", create_app(lambda: rt, TOKEN))
    try:
        await rt.agent.record(GROUP, said("小明", 20001, "周六爬山", time.time()))
        await rt.agent.record(PRIVATE, said("小明", 20002, "你好", time.time()))
        async with serving(root) as base, httpx.AsyncClient(base_url=base + "/memsum/") as owner:
            owner.headers["X-Memsum-CSRF"] = (await owner.post("api/login", json={"token": TOKEN})).json()[
                "csrf"
            ]

            async def both(sid: str) -> tuple[tuple[float, str], tuple[float, str], tuple[float, str]]:
                rows = (await owner.get("api/overview")).json()["sessions"]
                row = next(r for r in rows if r["id"] == sid)["settings"]["compress_at"]
                quoted = sid.replace(":", "%3A")
                pages = (await owner.get(f"api/sessions/{quoted}")).json()["settings"]
                page = next(s for s in pages if s["name"] == "compress_at")
                command = await rt.settings.effective("compress_at", sid)
                return (
                    (row["value"], row["layer_label"]),
                    (page["value"], page["layer_label"]),
                    (command.value, command.layer_label),
                )

            path = f"api/sessions/{G}/settings"
            private = await both(PRIVATE.id)
            assert private[0] == private[1] == private[2]
            assert private[0][0] == 0.5  # the platform's tier, not the group type's
            group = await both(GROUP.id)
            assert group[0] == group[1] == group[2]
            assert group[0][0] == 0.4
            await owner.post(path, json={"name": "compress_at", "scope": "place", "value": 0.3})
            group = await both(GROUP.id)
            assert group[0] == group[1] == group[2] == (0.3, "本群")
            await owner.post(path, json={"name": "compress_at", "value": 0.2})
            group = await both(GROUP.id)
            assert group[0] == group[1] == group[2] == (0.2, "本会话")
            await owner.post(path, json={"name": "compress_at", "scope": "place", "value": None})
            await owner.post(path, json={"name": "compress_at", "value": None})
            group = await both(GROUP.id)
            assert group[0] == group[1] == group[2]
            assert group[0][0] == 0.4
            assert await both(PRIVATE.id) == private  # the group's place never reached it
    finally:
        await runtime.close(rt)


async def test_a_long_unbroken_paste_is_stored_and_found(store: Store) -> None:
    # A base64 screenshot or a long link pasted into the group is one run of letters longer
    # than PostgreSQL's 2,046-byte limit of a tsvector word: the message must still be stored
    # (nothing said is lost) and found, by its other words and by the run itself.
    blob = "QUJD" * 1000
    url = "https://pan.example.com/s/" + "a1" * 1500
    first = await store.append(GROUP.id, said("阿强", 20002, f"截图 base64:{blob} 完", T0))
    second = await store.append(GROUP.id, said("莉莉", 20003, f"网盘链接 {url} 提取码 k9", T0 + 1))
    assert [m.id for m in await store.get_history(GROUP.id)] == [first.id, second.id]
    assert await contents(store, "截图") == [first.content]
    assert await contents(store, blob) == [first.content]
    assert await contents(store, "base64:" + blob[:3000]) == [first.content]
    assert await contents(store, url) == [second.content]
    assert await contents(store, "网盘链接 提取码") == [second.content]
    assert await contents(store, "a" * 5000) == []
    assert await contents(store, "9" * 3000) == []
