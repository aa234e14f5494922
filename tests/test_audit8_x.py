"""Audit 8, angle x: the owner's web page (issue 12) as owners really use it.

Behind a reverse proxy under a path prefix (nginx's defaults), a session with a hundred
thousand messages, what the page shows against the store (kept originals, the daily cap
in MEMSUM_TIMEZONE), a session cleared or forgotten while its page is open, strangers
without the token, cross-site changes, member text that must stay text and not break a
phone's layout, and the page on the PostgreSQL store. Real uvicorn, real httpx, the real
SQLite file, the scripted model server; Debian's Chromium where the browser matters.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nonebot_plugin_memsum.web import auth
from tests.fakes.proxy import NginxLikeProxy
from tests.fakes.web import GROUP, TOKEN, WebEnv, serving, web_env

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
