"""Audit 8, angle x: the owner's web page (issue 12) as owners really use it.

Behind a reverse proxy under a path prefix (nginx's defaults), a session with a hundred
thousand messages, what the page shows against the store (kept originals, the daily cap
in MEMSUM_TIMEZONE), a session cleared or forgotten while its page is open, strangers
without the token, cross-site changes, member text that must stay text and not break a
phone's layout, and the page on the PostgreSQL store. Real uvicorn, real httpx, the real
SQLite file, the scripted model server; Debian's Chromium where the browser matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi import FastAPI
from nonebug import App

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.store.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message, SessionRecord
from nonebot_plugin_memsum.web import auth, page_url
from nonebot_plugin_memsum.web.app import create_app
from tests.fakes import web
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import until
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.nonebug import SELF_ID, group_msg, new_group, run
from tests.fakes.proxy import NginxLikeProxy
from tests.fakes.web import GROUP, SUMMARY, TOKEN, WebEnv, say, serving, web_env

G = GROUP.id.replace(":", "%3A")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
CHROMIUM_ARGS += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
"""As tests/test_web_browser.py launches Debian's Chromium (no background connections)."""


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not HAVE_CHROMIUM:
        if os.environ.get("MEMSUM_REQUIRE_BROWSER"):
            raise RuntimeError(f"Chromium is required but missing at {CHROMIUM}")
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        await b.close()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[WebEnv]:
    async with web_env(tmp_path) as e:
        yield e


@pytest.fixture
async def owner(env: WebEnv) -> AsyncIterator[httpx.AsyncClient]:
    """Signed in; the CSRF header set as the page sets it."""
    async with httpx.AsyncClient(base_url=env.base + "/") as client:
        resp = await client.post("api/login", json={"token": TOKEN})
        assert resp.status_code == 200
        client.headers["X-Memsum-CSRF"] = resp.json()["csrf"]
        yield client


def as_chromium(origin: str) -> dict[str, str]:
    """The headers Chromium puts on the page's own fetch() POST (Fetch metadata: the
    request's initiator is the page's origin; https://w3c.github.io/webappsec-fetch-metadata/)."""
    return {"Origin": origin, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}


# ---- behind a reverse proxy ----------------------------------------------------------------
@pytest.mark.parametrize("host", ["$proxy_host", "$host"])
async def test_the_page_works_behind_nginx_under_a_path_prefix(env: WebEnv, host: Any) -> None:
    # location /bot/ { proxy_pass http://127.0.0.1:<bot port>/; } — the owner opens
    # https://their.site/bot/memsum/; nginx sends Host as its own default ($proxy_host)
    # or as the common `proxy_set_header Host $host;` (without the browser's port).
    upstream = env.base.rsplit("/memsum", 1)[0]
    proxy = NginxLikeProxy(upstream, "/bot/", "/", host=host)
    app: Any = proxy
    async with serving(app) as front:
        page = front + "/bot/memsum/"
        async with httpx.AsyncClient(base_url=page) as browser:
            index = await browser.get("")
            assert index.status_code == 200
            assert "static/app.js" in index.text  # relative: resolves under /bot/memsum/
            assert (await browser.get("static/app.js")).status_code == 200
            own = as_chromium(front)
            login = await browser.post("api/login", json={"token": TOKEN}, headers=own)
            assert login.status_code == 200, login.text
            csrf = login.json()["csrf"]
            # The browser sends the cookie back to the page's API under the prefix.
            overview = await browser.get("api/overview")
            assert overview.status_code == 200, overview.text
            assert GROUP.id in {s["id"] for s in overview.json()["sessions"]}
            change = await browser.post(
                f"api/sessions/{G}/settings",
                json={"name": "compress_at", "value": 0.3},
                headers={**own, "X-Memsum-CSRF": csrf},
            )
            assert change.status_code == 200, change.text
            assert (await env.rt.settings.effective("compress_at", GROUP.id)).value == 0.3
            # A cross-site page is still refused through the proxy, token or not.
            evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "X-Memsum-CSRF": csrf}
            resp = await browser.post(
                f"api/sessions/{G}/settings", json={"name": "compress_at", "value": 0.9}, headers=evil
            )
            assert resp.status_code == 403
            assert (await env.rt.settings.effective("compress_at", GROUP.id)).value == 0.3
            out = await browser.post("api/logout", json={}, headers={**own, "X-Memsum-CSRF": csrf})
            assert out.status_code == 200
            assert (await browser.get("api/overview")).status_code == 401


def test_cross_site_rule_trusts_fetch_metadata_then_origin_against_host() -> None:
    # Fetch metadata first (set by the browser, not by scripts): another site is refused
    # even when the proxy made Origin and Host agree, the page passes whatever Host says.
    assert auth.same_origin("https://their.site", "127.0.0.1:8080", "same-origin")
    assert auth.same_origin(None, "127.0.0.1:8080", "none")  # typed by the owner
    assert not auth.same_origin("https://evil.example", "evil.example", "cross-site")
    assert not auth.same_origin("https://a.their.site", "their.site", "same-site")
    # Without it (an older browser, plain http to a LAN address): Origin against Host.
    assert auth.same_origin("http://192.168.1.5:8080", "192.168.1.5:8080")
    assert not auth.same_origin("http://192.168.1.5:8080", "127.0.0.1:8080")
    assert not auth.same_origin("https://evil.example", "their.site")
    # nginx's `$host` drops the port the browser used: the host name still has to match.
    assert auth.same_origin("http://192.168.1.5:8081", "192.168.1.5")
    assert not auth.same_origin("http://evil.example:8081", "192.168.1.5")
    assert auth.same_origin("http://[::1]:8080", "[::1]")
    assert not auth.same_origin("null", "192.168.1.5")
    assert not auth.same_origin("http://192.168.1.5", "192.168.1.5:notaport")


async def test_a_proxy_that_hides_the_browsers_host_is_named_in_the_refusal(env: WebEnv) -> None:
    # Plain http to the proxy from another machine: no Sec-Fetch-Site, nginx's default Host.
    upstream = env.base.rsplit("/memsum", 1)[0]
    app: Any = NginxLikeProxy(upstream, "/bot/", "/")
    async with serving(app) as front, httpx.AsyncClient(base_url=front + "/bot/memsum/") as browser:
        resp = await browser.post(
            "api/login", json={"token": TOKEN}, headers={"Origin": "http://192.168.1.5"}
        )
        assert resp.status_code == 403
        assert "set-cookie" not in resp.headers
        detail = resp.json()["detail"]
        assert detail.startswith("拒绝跨站请求")
        assert "proxy_set_header Host $http_host" in detail
        # With the header forwarded as the refusal says, the sign-in passes.
        app.host = "$http_host"
        resp = await browser.post(
            "api/login", json={"token": TOKEN}, headers={"Origin": front.replace("127.0.0.1", "localhost")}
        )
        assert resp.status_code == 403  # a different name for the host is another origin
        resp = await browser.post("api/login", json={"token": TOKEN}, headers={"Origin": front})
        assert resp.status_code == 200


async def test_in_chromium_behind_nginx_sign_in_look_and_change(env: WebEnv, browser: Any) -> None:
    from playwright.async_api import expect

    upstream = env.base.rsplit("/memsum", 1)[0]
    app: Any = NginxLikeProxy(upstream, "/bot/", "/")  # nginx's defaults: Host $proxy_host
    async with serving(app) as front:
        context = await browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
        page = await context.new_page()
        await page.goto(front + "/bot/memsum/")
        await page.fill("#token", TOKEN)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("#sessions")).to_be_visible()
        await page.click(f"tr.session-row[data-id='{GROUP.id}']")
        row = page.locator("#settings tr[data-name='history_limit']")
        await row.locator("input").fill("35")
        await row.locator("button.save").click()
        await expect(page.locator("#flash")).to_contain_text("条数线 现在是 35（本会话）")
        assert (await env.rt.settings.effective("history_limit", GROUP.id)).value == 35
        # Every request went through the prefix, and the browser said it was the page's own.
        posts = [h for path, h in app.seen if path.endswith("/settings")]
        assert posts
        assert posts[0]["sec-fetch-site"] == "same-origin"
        assert posts[0]["host"] == upstream.split("://", 1)[1]
        await page.click("#logout")
        await expect(page.locator("#login-form")).to_be_visible()
        await page.reload()
        await expect(page.locator("#login-form")).to_be_visible()  # signed out for real
        await context.close()


# ---- what the page shows is true against the store ---------------------------------------
async def test_kept_originals_are_those_the_summary_kept_as_the_summary_command_counts_them(
    env: WebEnv, owner: httpx.AsyncClient
) -> None:
    # Members go on talking while the summary model thinks: what they said then was never
    # read by the compression, so it is not one of the originals it kept (R-RUN-12).
    env.llm.reset()
    gate = Gate(Reply(SUMMARY))
    env.llm.on_request(gate)
    with gate:
        assert (await owner.post(f"api/sessions/{G}/compress", json={})).status_code == 202
        await gate.reached()
        for n in (1, 2):
            await say(env.rt, f"压缩时说的第{n}句", 40 + n, 0)
    await env.app.state.live.wait()
    status = await env.rt.compression.status(GROUP.id)
    d = (await owner.get(f"api/sessions/{G}")).json()
    assert d["compressions"][0]["outcome"] == "done"
    active = [m for m in await env.rt.store.get_history(GROUP.id) if m.is_conversation]
    kept = [m["content"] for m in d["kept"]]
    assert len(kept) == status.kept_messages  # as /摘要 says: 保留原文 N 条
    assert kept == [m.content for m in active[: status.kept_messages]]
    assert not any("压缩时说的" in k for k in kept)
    assert [m["content"] for m in d["recent"]][-2:] == [
        "[成员41(30041)] 压缩时说的第1句",
        "[成员42(30042)] 压缩时说的第2句",
    ]
    # Clearing the summary: no summary keeps anything any more, as /摘要 then says.
    assert (await owner.post(f"api/sessions/{G}/clear", json={"kind": "summary"})).status_code == 200
    assert (await env.rt.compression.status(GROUP.id)).kept_messages == 0
    d = (await owner.get(f"api/sessions/{G}")).json()
    assert d["kept"] == []
    assert d["summary"]["sections"] == []


# ---- a big file ------------------------------------------------------------------------------
BIG = "onebot:10000:group:777"


def fill_big(path: Path, messages: int) -> None:
    """A group whose compressions are off (both lines 0): every message stays active. Filled
    with sqlite3 directly, as bench/bench_web.py does (the Store API would take minutes)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO sessions (id, platform, kind, place, peer, room_class, created)"
        " VALUES (?, 'onebot', 'group', 'group:777', NULL, 'room', ?)",
        (BIG, time.time() - 86400),
    )
    start = time.time() - 86400
    conn.executemany(
        "INSERT INTO messages (session_id, role, content, ts, event_marker, archived, tokens)"
        " VALUES (?, ?, ?, ?, ?, 0, 20)",
        [
            (BIG, "system", "对话已压缩", start + i * 0.5, 1)
            if i == 2
            else (BIG, "user", f"[成员{i % 50}(2{i % 50:04d})] 第{i}句：周末去爬山吗", start + i * 0.5, 0)
            for i in range(messages)
        ],
    )
    conn.execute("COMMIT")
    conn.close()


async def test_a_session_of_100000_active_messages_opens_without_reading_them_all(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    store = Store(path)
    await store.open()  # the schema
    await store.close()
    n = 100_000
    await asyncio.to_thread(fill_big, path, n)
    with ScriptedLLM() as llm:
        config = Config.model_validate(
            {
                "memsum_models": [llm.model_config("test/chat", model="chat", context_window=65536)],
                "memsum_web_token": TOKEN,
                "memsum_compress_at": 0,
                "memsum_history_limit": 0,
            }
        )
        rt: Runtime = await runtime.build(config, path, [], set())
        # The two messages before the divider are what the summary in force kept.
        await rt.store.put_meta(
            SUMMARY_NAMESPACE, BIG, {"text": "## 最近在聊什么\n爬山", "time": time.time(), "kept_messages": 2}
        )
        reads: list[float] = []
        history = rt.store.get_history

        async def counted(session_id: str, limit: float = float("inf")) -> list[Any]:
            reads.append(limit)
            return await history(session_id, limit)

        rt.store.get_history = counted  # type: ignore[method-assign]
        app = create_app(lambda: rt, TOKEN)

        root = FastAPI()
        root.mount("/memsum", app)
        try:
            async with serving(root) as base, httpx.AsyncClient(base_url=base + "/memsum/", timeout=60) as c:
                assert (await c.post("api/login", json={"token": TOKEN})).status_code == 200
                sid = BIG.replace(":", "%3A")
                took = []
                pages = []
                for _ in range(3):  # the page polls every 3 s while it is open
                    t = time.perf_counter()
                    pages.append(await c.get(f"api/sessions/{sid}"))
                    took.append(time.perf_counter() - t)
                assert [r.status_code for r in pages] == [200] * 3
                d = pages[-1].json()
                assert d["active"] == n - 1  # the divider is no message (R-TRIG-4)
                assert [m["content"] for m in d["kept"]] == [
                    "[成员0(20000)] 第0句：周末去爬山吗",
                    "[成员1(20001)] 第1句：周末去爬山吗",
                ]
                assert len(d["recent"]) == 30
                assert (
                    d["recent"][-1]["content"]
                    == f"[成员{(n - 1) % 50}(2{(n - 1) % 50:04d})] 第{n - 1}句：周末去爬山吗"
                )
                # No read of the whole history (it took a second here, on every poll).
                assert reads
                assert max(reads) < 1000, reads
                assert min(took) < 0.5, took
                row = next(s for s in (await c.get("api/overview")).json()["sessions"] if s["id"] == BIG)
                assert (row["active"], row["archived"]) == (n - 1, 0)
                assert row["settings"]["compress_at"]["text"] == "0"
        finally:
            await runtime.close(rt)


@asynccontextmanager
async def small_page(
    location: Path | str, llm: ScriptedLLM | None = None, names: dict[str, str] | None = None, **config: Any
) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    """A runtime of its own (a SQLite file in the folder `location`, or a PostgreSQL URL;
    the scripted model server) with `config`, its page on uvicorn, and a client signed in
    with the page's CSRF header."""
    with ScriptedLLM() if llm is None else contextlib.nullcontext(llm) as llm:
        cfg = Config.model_validate(
            {
                "memsum_models": [llm.model_config("test/chat", model="chat", context_window=8000)],
                "memsum_web_token": TOKEN,
                **config,
            }
        )
        where = location / "small.db" if isinstance(location, Path) else location
        rt = await runtime.build(cfg, where, ["小记"], {"10001"})

        async def named() -> dict[str, str]:
            return names or {}

        app = create_app(lambda: rt, TOKEN, named)
        root = FastAPI()
        root.mount("/memsum", app)
        try:
            async with serving(root) as base, httpx.AsyncClient(base_url=base + "/memsum/") as client:
                resp = await client.post("api/login", json={"token": TOKEN})
                assert resp.status_code == 200
                client.headers["X-Memsum-CSRF"] = resp.json()["csrf"]
                yield rt, client
        finally:
            await app.state.live.wait()
            await runtime.close(rt)


MIDNIGHT = 1796227200.0
"""2026-12-03 00:00 in Asia/Shanghai (UTC+8): 2026-12-02 16:00 UTC."""


async def test_the_daily_cap_shows_today_in_memsum_timezone_as_the_bot_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [MIDNIGHT - 600]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    async with small_page(tmp_path, memsum_timezone="Asia/Shanghai") as (rt, owner):
        await rt.agent.record(GROUP, Message(role="user", content="[甲(30001)] 你好", ts=now[0]))
        # 23:50 yesterday in Shanghai, the same UTC day as now: not today's.
        await rt.store.record_usage(GROUP.id, "对话", "test/chat", 5000, 100)
        now[0] = MIDNIGHT + 600
        await rt.store.record_usage(GROUP.id, "对话", "test/chat", 500, 100)
        await rt.store.record_usage(GROUP.id, "摘要", "test/chat", 80, 20)  # compression counts too
        now[0] = MIDNIGHT + 1800
        body = {"name": "daily_token_cap", "scope": "place", "value": "1000"}
        assert (await owner.post(f"api/sessions/{G}/settings", json=body)).status_code == 200
        d = (await owner.get(f"api/sessions/{G}")).json()
        assert d["daily_cap"] == {"cap": 1000, "used": 700, "ratio": 0.7, "spent": False}
        assert await rt.controls.used_today(GROUP) == 700  # what the bot decides by, and /用量 says
        now[0] = MIDNIGHT + 2400
        await rt.store.record_usage(GROUP.id, "对话", "test/chat", 300, 100)
        d = (await owner.get(f"api/sessions/{G}")).json()
        assert d["daily_cap"] == {"cap": 1000, "used": 1100, "ratio": 1.1, "spent": True}
        assert await rt.controls.answer(GROUP, "30001", in_group=True) == "cap_notice"
        # A new day in Shanghai: nothing used yet.
        now[0] = MIDNIGHT + 86400 + 60
        d = (await owner.get(f"api/sessions/{G}")).json()
        assert d["daily_cap"] == {"cap": 1000, "used": 0, "ratio": 0.0, "spent": False}


# ---- member text on a phone ---------------------------------------------------------------
LONG_URL = "https://pan.example.com/s/" + "Ab3" * 700 + "?pwd=8x7k"
RTL = "\u202e这句话被反过来了\u202c 后面的字"
ZERO_WIDTH = "提\u200b取\u200c码\u200d：\ufeff6666"
PASTE = "日志行 " * 4000


async def test_on_a_phone_member_text_stays_text_in_its_box_and_links_nowhere(
    env: WebEnv, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.async_api import expect

    # A group whose name is one unbroken run, members pasting a long link, bidi overrides,
    # zero-width characters and a 28,000-character log.
    monkeypatch.setitem(web.NAMES, GROUP.place or "", "超长群名" + "啊" * 300)
    for n, text in enumerate(
        [LONG_URL, RTL, ZERO_WIDTH, PASTE, "[CQ:image,file=abc.jpg,url=https://x.example/a.jpg]"]
    ):
        await say(env.rt, text, 50 + n, 0)
    context = await browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, locale="zh-CN"
    )
    page = await context.new_page()
    await page.goto(env.base + "/")
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#sessions")).to_be_visible()
    width = "document.documentElement.scrollWidth"
    assert await page.evaluate(width) <= 390, "the overview scrolls sideways on a phone"
    await page.click(f"tr.session-row[data-id='{GROUP.id}']")
    recent = page.locator("#recent")
    await expect(recent).to_contain_text("pwd=8x7k")
    await expect(recent).to_contain_text("[CQ:image,file=abc.jpg")
    await expect(page.locator("#daily-cap")).to_contain_text("不限")
    assert await page.evaluate(width) <= 390, "the session page scrolls sideways on a phone"
    # Chat text is never made a link: no member-posted URL can take the page (and its
    # address in a Referer) anywhere.
    assert await page.locator("#main a[href*='example']").count() == 0
    # The bidi override and the zero-width characters are shown as they were said.
    texts = await recent.locator(".msg").all_inner_texts()
    assert any("这句话被反过来了" in t for t in texts)
    assert any("\u200b" in t for t in texts)
    box = await page.locator("#recent .msg .pre").last.bounding_box()
    assert box is not None
    assert box["width"] <= 390
    await context.close()


# ---- both engines; a session cleared or forgotten while its page is open -------------------------
async def test_the_page_on_both_engines_and_a_session_cleared_then_forgotten_while_open(
    location: Path | str, tmp_path: Path
) -> None:
    where: Path | str = tmp_path if isinstance(location, Path) else location
    with ScriptedLLM() as llm:
        llm.on_request(lambda body: Reply(SUMMARY) if "摘要" in str(body["messages"][0]) else None)
        async with small_page(where, llm) as (rt, owner):
            for n in range(1, 13):
                await say(rt, f"第{n}句：提取码是{1000 + n}，周末去爬山", n, 1_700_000_000 + n * 60)
            assert (await rt.compression.compress(GROUP.id)).outcome == "done"
            await say(rt, "压缩之后说的话", 20, 1_700_000_000 + 3600)
            status = await rt.compression.status(GROUP.id)
            d = (await owner.get(f"api/sessions/{G}")).json()
            assert len(d["kept"]) == status.kept_messages
            assert d["recent"][-1]["content"] == "[成员20(30020)] 压缩之后说的话"
            assert d["active"] == status.active_messages
            assert [s["title"] for s in d["summary"]["sections"]][:1] == ["最近在聊什么"]
            found = (await owner.get(f"api/sessions/{G}/search", params={"q": "1003"})).json()
            assert [r["hit"]["content"] for r in found["results"]] == [
                "[成员3(30003)] 第3句：提取码是1003，周末去爬山"
            ]
            assert [m["content"][:11] for m in found["results"][0]["before"]] == [
                "[成员1(30001)",
                "[成员2(30002)",
            ]
            row = next(s for s in (await owner.get("api/overview")).json()["sessions"] if s["id"] == GROUP.id)
            archived = row["archived"]
            assert (row["active"], archived > 0) == (status.active_messages, True)
            # Cleared from QQ (/清除) while the page is open: the next poll shows it empty,
            # the archive still counted and searchable, the page still there.
            await rt.compression.clear(GROUP.id, "context")
            d = (await owner.get(f"api/sessions/{G}")).json()
            assert (d["kept"], d["recent"], d["active"], d["summary"]["sections"]) == ([], [], 0, [])
            row = next(s for s in (await owner.get("api/overview")).json()["sessions"] if s["id"] == GROUP.id)
            assert row["active"] == 0
            assert row["archived"] == archived + status.active_messages + 1  # the divider too
            # Forgotten (api.delete_session) while the page is open: every read and every
            # change answers 404 in Chinese, and no change brings a row of it back.
            await rt.compression.delete_session(GROUP.id)
            assert (await owner.get(f"api/sessions/{G}")).json() == {"detail": "没有这个会话"}
            for path, body in [
                (f"api/sessions/{G}/settings", {"name": "mode", "value": "关"}),
                (f"api/sessions/{G}/compress", {}),
                (f"api/sessions/{G}/clear", {"kind": "context", "confirm": True}),
            ]:
                resp = await owner.post(path, json=body)
                assert (resp.status_code, resp.json()["detail"]) == (404, "没有这个会话"), path
            assert (await owner.get(f"api/sessions/{G}/search", params={"q": "1003"})).status_code == 404
            assert await rt.store.get_settings("session", GROUP.id) == {}
            assert await rt.store.get_session(GROUP.id) is None
            assert GROUP.id not in {s["id"] for s in (await owner.get("api/overview")).json()["sessions"]}


# ---- a command in QQ and the page: one set of settings, no restart ------------------------------
async def test_a_group_switched_off_by_command_before_anyone_talked_is_on_the_page_and_back_on_from_it(
    app: App,
) -> None:
    # The owner's first words in a new group: /记忆模式 关. Nothing is recorded there, yet
    # the group is the owner's to see and to switch back on from the page (issue 10's
    # controls beside each session, issue 12).
    group = new_group()
    record = group_record(SELF_ID, group)
    await run(
        app,
        group_msg("/记忆模式 关", group),
        "已将本群模式设为 关。\n现在：本群模式：关（本群）：不记录也不回答（命令照常可用）。",
    )
    await run(
        app,
        group_msg("/压缩线 0.5", group),
        "已将本会话的压缩线设为 0.5。\n现在：压缩线 0.5（本会话）；"
        "还没有用量记录，生效线在首次调用模型后才知道。",
    )
    page = FastAPI()
    page.mount("/memsum", create_app(runtime.get, TOKEN))
    async with serving(page) as base, httpx.AsyncClient(base_url=base + "/memsum/") as owner:
        login = await owner.post("api/login", json={"token": TOKEN})
        owner.headers["X-Memsum-CSRF"] = login.json()["csrf"]
        rows = {s["id"]: s for s in (await owner.get("api/overview")).json()["sessions"]}
        assert record.id in rows, "a group set to 关 by command is missing from the overview"
        row = rows[record.id]
        assert (row["kind"], row["number"], row["active"], row["archived"]) == ("群聊", str(group), 0, 0)
        assert (row["settings"]["mode"]["text"], row["settings"]["mode"]["layer_label"]) == ("关", "本群")
        assert row["settings"]["compress_at"]["text"] == "0.5"
        sid = record.id.replace(":", "%3A")
        d = (await owner.get(f"api/sessions/{sid}")).json()
        assert (d["kept"], d["recent"], d["active"]) == ([], [], 0)
        body = {"name": "mode", "scope": "place", "value": "开"}
        assert (await owner.post(f"api/sessions/{sid}/settings", json=body)).json()["text"] == "开"
    await run(app, group_msg("/记忆模式", group), "本群模式：开（本群）：记录并回答。")


# ---- a stranger without the token; another site ----------------------------------------------
async def test_a_stranger_and_another_site_can_neither_read_nor_change_anything(env: WebEnv) -> None:
    before = len(await env.rt.store.get_history(GROUP.id))
    site = env.base.rsplit("/memsum", 1)[0]
    async with httpx.AsyncClient(base_url=env.base + "/") as stranger:
        # The address without its slash lands on the page; the page holds no data.
        bare = await stranger.get(env.base)
        assert bare.status_code in (307, 308)
        assert bare.headers["location"].endswith("/memsum/")
        page = await stranger.get("")
        assert "爬山" not in page.text
        assert TOKEN not in page.text
        # Nothing outside the package's static folder, however the path is spelled.
        for path in (
            "static/../app.py",
            "static/%2e%2e/app.py",
            "static/..%2fapp.py",
            "static/%2e%2e%2fweb.db",
        ):
            resp = await stranger.get(path)
            assert resp.status_code == 404, path
            assert "create_app" not in resp.text
        # A form on another site posts what a form can post (urlencoded, text/plain with a
        # body that looks like JSON): no sign-in, no change, no cookie.
        for data, kind in [
            ("token=" + TOKEN, "application/x-www-form-urlencoded"),
            ('{"token": "' + TOKEN + '"}', "text/plain"),
        ]:
            headers = {"Content-Type": kind, "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
            resp = await stranger.post("api/login", content=data, headers=headers)
            assert resp.status_code in (403, 422), (kind, resp.status_code)
            assert "set-cookie" not in resp.headers
            headers["Origin"] = site  # even naming this site, a form's body is no sign-in
            del headers["Sec-Fetch-Site"]
            resp = await stranger.post("api/login", content=data, headers=headers)
            assert resp.status_code == 422, kind
            assert "set-cookie" not in resp.headers
        # No CORS grant to any other site, for reads or changes.
        pre = await stranger.options(
            f"api/sessions/{G}/clear",
            headers={
                "Origin": "https://evil.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-memsum-csrf",
            },
        )
        assert "access-control-allow-origin" not in pre.headers
        assert "access-control-allow-origin" not in (await stranger.get("api/overview")).headers
    # Signed in, a GET never changes anything: the change routes take POST only.
    async with httpx.AsyncClient(base_url=env.base + "/") as owner:
        assert (await owner.post("api/login", json={"token": TOKEN})).status_code == 200
        for path in (
            f"api/sessions/{G}/clear?kind=context&confirm=true",
            f"api/sessions/{G}/compress",
            "api/logout",
        ):
            assert (await owner.get(path)).status_code in (404, 405), path  # no such page, or POST only
        assert (await owner.get("api/overview")).status_code == 200  # still signed in
    assert len(await env.rt.store.get_history(GROUP.id)) == before


async def said(text: str, bot: BotProcess) -> bool:
    return text in bot.log()


# ---- bound to every address ------------------------------------------------------------------
async def test_bound_to_0_0_0_0_the_start_up_line_gives_an_address_a_browser_opens(tmp_path: Path) -> None:
    # HOST=0.0.0.0 so a phone on the home network reaches the page: the start-up line is
    # the link the owner copies, and http://0.0.0.0:… is no address a browser should open
    # (Chromium refuses it since its Private Network Access change).
    web_token = "web-token-0f9e8d7c6b5a4"
    bot = BotProcess(tmp_path, env={"HOST": "0.0.0.0", "MEMSUM_WEB_TOKEN": web_token}, log_level="INFO")
    async with bot:
        await until(lambda: said("memsum: web page", bot), "the web page's start-up line")
        (line,) = [x for x in bot.log().splitlines() if "memsum: web page" in x]
        assert "0.0.0.0" not in line.split("(", 1)[0], line
        assert f"http://127.0.0.1:{bot.port}/memsum/" in line
        # A phone on the LAN: plain http to the machine's address (no Sec-Fetch-Site, not a
        # secure context), Host and Origin both that address.
        lan = f"192.168.1.5:{bot.port}"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{bot.port}/memsum/", timeout=10) as phone:
            headers = {"Host": lan, "Origin": f"http://{lan}"}
            resp = await phone.post("api/login", json={"token": web_token}, headers=headers)
            assert resp.status_code == 200, resp.text
            assert (await phone.get("api/overview", headers={"Host": lan})).status_code == 200
    assert web_token not in bot.log()
    # The other spellings of "every address" and of one address.
    assert page_url("::", 8080).startswith("http://127.0.0.1:8080/memsum/ (HOST=::")
    assert page_url("::1", 8080) == "http://[::1]:8080/memsum/"
    assert page_url("192.168.1.5", 8080) == "http://192.168.1.5:8080/memsum/"


async def test_behind_nginx_with_x_forwarded_for_a_strangers_wrong_tokens_never_make_the_owner_wait(
    tmp_path: Path,
) -> None:
    # The README's nginx block passes X-Forwarded-For; uvicorn (NoneBot's FastAPI driver) takes
    # the client address from it when the request comes from 127.0.0.1 (uvicorn's default
    # forwarded_allow_ips), so the sign-in throttle (web/auth.py) is per visitor. Without it,
    # every visitor behind the proxy is 127.0.0.1 and a stranger's guesses lock the owner out.
    web_token = "web-token-7a6b5c4d3e2f1"
    bot = BotProcess(tmp_path, env={"MEMSUM_WEB_TOKEN": web_token}, log_level="INFO")
    async with bot, httpx.AsyncClient(base_url=f"http://127.0.0.1:{bot.port}/memsum/", timeout=10) as proxy:

        def via_nginx(visitor: str) -> dict[str, str]:
            return {**as_chromium(f"http://127.0.0.1:{bot.port}"), "X-Forwarded-For": visitor}

        stranger, owner = via_nginx("203.0.113.9"), via_nginx("198.51.100.7")
        codes = [
            (await proxy.post("api/login", json={"token": f"guess-{i:016d}"}, headers=stranger)).status_code
            for i in range(6)
        ]
        assert codes[:3] == [401, 401, 401], codes
        assert 429 in codes[3:], codes
        signed = await proxy.post("api/login", json={"token": web_token}, headers=owner)
        assert signed.status_code == 200, signed.text
        # The warning names the stranger, not the proxy.
        await until(lambda: said("wrong token from 203.0.113.9", bot), "the stranger named in the log")
    assert web_token not in bot.log()


async def test_the_overview_marks_the_places_whose_daily_cap_is_spent_today(
    tmp_path: Path, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.async_api import expect

    now = [MIDNIGHT + 600]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    spent, under, free = (group_record(SELF_ID, g) for g in (810001, 810002, 810003))
    peer = private_record(SELF_ID, 20099)
    async with small_page(tmp_path, memsum_timezone="Asia/Shanghai") as (rt, owner):
        for record, tokens, cap in [
            (spent, 1100, 1000),
            (under, 500, 1000),
            (free, 5000, 0),
            (peer, 300, 200),
        ]:
            await rt.agent.record(record, Message(role="user", content="[甲(30001)] 你好", ts=now[0]))
            await rt.store.record_usage(record.id, "对话", "test/chat", tokens - 100, 100)
            if cap:
                scope = "place" if record.kind == "group" else "session"
                body = {"name": "daily_token_cap", "scope": scope, "value": cap}
                resp = await owner.post(f"api/sessions/{record.id.replace(':', '%3A')}/settings", json=body)
                assert resp.status_code == 200
        rows = {s["id"]: s["daily_cap"] for s in (await owner.get("api/overview")).json()["sessions"]}
        assert rows == {
            spent.id: {"cap": 1000, "used": 1100, "spent": True},
            under.id: {"cap": 1000, "used": 500, "spent": False},
            free.id: {"cap": 0, "used": 5000, "spent": False},
            peer.id: {"cap": 200, "used": 300, "spent": True},
        }
        for record in (spent, under, free, peer):  # what the bot decides by
            assert (await rt.controls.used_today(record)) == rows[record.id]["used"]
        page = await (await browser.new_context()).new_page()
        await page.goto(str(owner.base_url))
        await page.fill("#token", TOKEN)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("tr.session-row")).to_have_count(4)
        for record in (spent, peer):
            await expect(page.locator(f"tr.session-row[data-id='{record.id}']")).to_contain_text(
                "今日限额已用完"
            )
        for record in (under, free):
            await expect(page.locator(f"tr.session-row[data-id='{record.id}']")).not_to_contain_text("限额")
        # Tomorrow in Shanghai: nothing is spent.
        now[0] = MIDNIGHT + 86400 + 60
        rows = {
            s["id"]: s["daily_cap"]["spent"] for s in (await owner.get("api/overview")).json()["sessions"]
        }
        assert not any(rows.values())


async def test_the_overview_orders_group_names_as_a_chinese_reader_does(tmp_path: Path, browser: Any) -> None:
    from playwright.async_api import expect

    names = {"group:820001": "张三的群", "group:820002": "阿里巴巴群", "group:820003": "北京爬山群"}
    records = [group_record(SELF_ID, g) for g in (820001, 820002, 820003, 100000, 99999)]
    async with small_page(tmp_path, names=names) as (rt, owner):
        for record in records:
            await rt.agent.record(record, Message(role="user", content="[甲(30001)] 你好", ts=1_700_000_000))
        page = await (await browser.new_context(locale="zh-CN")).new_page()
        await page.goto(str(owner.base_url))
        await page.fill("#token", TOKEN)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("tr.session-row")).to_have_count(5)
        head = page.locator("th[data-key='name']")
        await head.click()
        if "↑" not in await head.inner_text():
            await head.click()
        await expect(head).to_contain_text("↑")
        order = await page.locator("tr.session-row").evaluate_all("rows => rows.map(r => r.dataset.id)")
        # Numbers by value, then names by pinyin: a(阿), b(北), z(张) — not by code point (北 张 阿).
        assert [o.rsplit(":", 1)[1] for o in order] == ["99999", "100000", "820002", "820003", "820001"]


async def test_a_withdrawn_message_is_marked_in_the_recent_messages_and_kept_originals_too(
    tmp_path: Path, browser: Any
) -> None:
    from playwright.async_api import expect

    async with small_page(tmp_path) as (rt, owner):
        for n in range(1, 4):
            await rt.agent.record(
                GROUP,
                Message(
                    role="user",
                    content=f"[甲(30001)] 第{n}句：我的手机号是1390000000{n}",
                    ts=1_700_000_000 + n,
                    platform_id=f"m{n}",
                ),
            )
        await rt.store.mark_withdrawn(GROUP.id, "m2")  # 撤回 in QQ (group_recall)
        await rt.store.put_meta(
            SUMMARY_NAMESPACE,
            GROUP.id,
            {"text": "## 最近在聊什么\n手机号", "time": 1_700_000_010, "kept_messages": 3},
        )
        d = (await owner.get(f"api/sessions/{G}")).json()
        assert [m["withdrawn"] for m in d["recent"]] == [False, True, False]
        assert [m["withdrawn"] for m in d["kept"]] == [False, True, False]
        page = await (await browser.new_context()).new_page()
        await page.goto(str(owner.base_url))
        await page.fill("#token", TOKEN)
        await page.click("#login-form button[type=submit]")
        await page.click(f"tr.session-row[data-id='{GROUP.id}']")
        recent = page.locator("#recent .msg")
        await expect(recent).to_have_count(3)
        await expect(recent.nth(1)).to_contain_text("已撤回")
        await expect(recent.nth(0)).not_to_contain_text("已撤回")
        await expect(page.locator("#kept .msg").nth(1)).to_contain_text("已撤回")


async def test_another_plugins_session_with_a_slash_or_hash_in_its_id_opens_and_changes(
    tmp_path: Path,
) -> None:
    # api.internal_session takes any id; another plugin's own names ("scheduler/daily",
    # "room #1?") reach the page as they are: the page quotes them, the routes must take them.
    async with small_page(tmp_path) as (rt, owner):
        ids = ["scheduler/daily", "room #1?x=1", "日程/每天/早上"]
        for sid in ids:
            record = SessionRecord(id=sid, platform=None, kind="internal", created=1_700_000_000)
            await rt.store.save_session(record)
            await rt.agent.record(
                record, Message(role="user", content=f"{sid} 的第一句：提取码 4242", ts=1_700_000_001)
            )
        listed = {s["id"] for s in (await owner.get("api/overview")).json()["sessions"]}
        assert set(ids) <= listed
        for sid in ids:
            path = "api/sessions/" + quote(sid, safe="")
            d = (await owner.get(path)).json()
            assert d.get("id") == sid, (sid, d)
            found = (await owner.get(path + "/search", params={"q": "4242"})).json()
            assert [r["hit"]["content"] for r in found["results"]] == [f"{sid} 的第一句：提取码 4242"], sid
            resp = await owner.post(path + "/settings", json={"name": "compress_at", "value": 0.4})
            assert resp.status_code == 200, (sid, resp.text)
            assert (await rt.settings.effective("compress_at", sid)).value == 0.4
