"""The web page in a real headless Chromium (Debian's `chromium`, driven by Playwright for
Python, no browser download): sign in, the groups, one group's summary and chart, a new
compression line that the next compression uses, and a clear only after confirming.

Screenshots of each page go to tests/.screenshots/ (not committed; two are in docs/).
`.ci/run` installs Chromium and sets MEMSUM_REQUIRE_BROWSER=1, so there a missing
browser fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from nonebot_plugin_memsum.compression.budget import compression_line
from tests.fakes import web
from tests.fakes.web import (
    CHAT_TURNS,
    COMPRESSIONS,
    GROUP,
    GROUP_NAME,
    HTML,
    LINE,
    TOKEN,
    WINDOW,
    WebEnv,
    chat_turn,
    settle,
    web_env,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).parent / ".screenshots"
# Flags the machine's closed network needs (no background connections to Google).
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not Path(CHROMIUM).exists():
    if os.environ.get("MEMSUM_REQUIRE_BROWSER"):
        raise RuntimeError(f"Chromium is required but missing at {CHROMIUM}")
    pytest.skip("Debian's chromium is not installed (.ci/run installs it)", allow_module_level=True)

from playwright.async_api import Browser, Page, async_playwright, expect


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        await b.close()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[WebEnv]:
    async with web_env(tmp_path) as e:
        yield e


async def signed_in(browser: Browser, env: WebEnv, **context: object) -> Page:
    page = await (await browser.new_context(**context)).new_page()  # type: ignore[arg-type]
    await page.goto(env.base + "/")
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#sessions")).to_be_visible()
    return page


async def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


async def test_sign_in_overview_group_page_and_its_chart(browser: Browser, env: WebEnv) -> None:
    page = await (await browser.new_context(viewport={"width": 1200, "height": 900})).new_page()
    await page.goto(env.base + "/")
    await page.fill("#token", "not-the-token-at-all")
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#login-error")).to_have_text("令牌不对")
    await shot(page, "login")
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")
    # The overview: both sessions, the group by its name (its markup shown as text).
    rows = page.locator("tr.session-row")
    await expect(rows).to_have_count(2)
    await expect(page.locator("#sessions")).to_contain_text(GROUP_NAME)
    await expect(page.locator("#sessions")).to_contain_text("小明")
    await expect(page.locator("#today")).to_contain_text("今日调用")
    await shot(page, "overview")
    # The filter keeps the group alone.
    await page.fill("#filter", "123456")
    await expect(rows).to_have_count(1)
    await page.click(f"tr.session-row[data-id='{GROUP.id}']")
    # The group's page: its summary by sections, the kept original, the chart.
    await expect(page.locator("#session-title")).to_contain_text(GROUP_NAME)
    summary = page.locator("#summary")
    await expect(summary).to_contain_text("【最近在聊什么】")
    await expect(summary).to_contain_text("集合时间周六八点")
    await expect(page.locator("#kept")).to_contain_text((await env.rt.store.get_history(GROUP.id))[0].content)
    chart = page.locator("#usage-chart")
    await expect(chart).to_be_visible()
    await expect(chart.locator("polyline")).to_have_count(1)
    await expect(chart.locator("circle")).to_have_count(CHAT_TURNS)  # one per chat call
    await expect(chart.locator("line.line")).to_have_count(1)  # the compression line
    await expect(chart.locator("line.marker")).to_have_count(COMPRESSIONS)
    await expect(page.locator("#compressions tbody tr")).to_have_count(COMPRESSIONS)
    # A member's <script> and <img onerror> are shown as text, in the messages and in the
    # summary, and never ran.
    await expect(page.locator("#recent")).to_contain_text(HTML)
    await expect(summary).to_contain_text(HTML)
    assert await page.locator("#main img, #main script").count() == 0
    assert await page.evaluate("window.__pwned") is None
    await shot(page, "session")
    # The search (issue 11): an archived line with its neighbours; a member's HTML as text.
    await page.fill("#search input[name=q]", "第5句")
    await page.click("#search button[type=submit]")
    await expect(page.locator("#search-results .msg.found")).to_have_count(1)
    await expect(page.locator("#search-results .msg.found")).to_contain_text("第5句：周末去爬山吗")
    await page.fill("#search input[name=q]", "pwned")
    await page.click("#search button[type=submit]")
    await expect(page.locator("#search-results .msg.found").first).to_contain_text("<script>")
    assert await page.locator("#main img, #main script").count() == 0
    assert await page.evaluate("window.__pwned") is None
    # The usage page: chart and table.
    await page.click("nav a[href='#/usage']")
    rows = await env.rt.store.usage_by_day()
    await expect(page.locator("#usage-table tbody tr")).to_have_count(len(rows))
    await expect(page.locator("#usage-bars rect")).to_have_count(len({(r.day, r.purpose) for r in rows}))
    await expect(page.locator("#csv")).to_have_attribute("href", "api/usage.csv?days=30")
    await shot(page, "usage")


async def test_the_usage_bars_show_only_what_each_day_used(
    browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The seeded talk starts ten minutes before a midnight: the first day has chat calls
    # only, the second chat and summary calls. The chart drew an empty bar for the first
    # day's summaries too (4 where 3 have usage); the chart test above saw it between
    # midnight and 3 a.m.
    midnight = datetime.fromtimestamp(time.time() - 3 * 3600).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    monkeypatch.setattr(web, "T0", midnight.timestamp() - 600)
    async with web_env(tmp_path) as env:
        page = await signed_in(browser, env)
        await page.click("nav a[href='#/usage']")
        await expect(page.locator("#usage-table tbody tr")).to_have_count(3)
        await expect(page.locator("#usage-bars rect")).to_have_count(3)


async def test_a_new_compression_line_is_used_by_the_next_compression(browser: Browser, env: WebEnv) -> None:
    page = await signed_in(browser, env)
    await page.click(f"tr.session-row[data-id='{GROUP.id}']")
    row = page.locator("#settings tr[data-name='compress_at']")
    await expect(row).to_contain_text("0.08")
    await expect(row).to_contain_text("全局配置")
    await row.locator("input").fill("0.03")
    await row.locator("button.save").click()
    await expect(page.locator("#flash")).to_contain_text("压缩线 现在是 0.03（本会话）")
    await expect(page.locator("#settings tr[data-name='compress_at']")).to_contain_text("本会话")
    assert (await env.rt.settings.effective("compress_at", GROUP.id)).value == 0.03  # what /压缩线 shows
    # The next turn's usage passes the new line (0.03 × 8000 = 240 tokens): the turn's end
    # starts a compression in the background (R-TRIG-3), and the page shows it with its line.
    chat_model = env.rt.registry.resolve("chat")
    assert chat_model is not None
    line = compression_line(0.03, WINDOW, env.rt.agent.trim_budget_of(chat_model))
    assert line is not None
    for i in range(12):
        await chat_turn(env.rt, f"第{i}个问题：周末爬哪座山，要带多少水和干粮才够", 3 + i, 0)
        await settle(env.rt)
        if len(await env.rt.store.compressions(GROUP.id)) > COMPRESSIONS:
            break
    runs = await env.rt.store.compressions(GROUP.id)
    assert [r.line for r in runs] == [int(line)] + [LINE] * COMPRESSIONS
    newest = page.locator("#compressions tbody tr").first
    await expect(page.locator("#compressions tbody tr")).to_have_count(COMPRESSIONS + 1)  # live, no reload
    await expect(newest.locator("td.line")).to_have_text(f"{int(line):,}")
    await expect(page.locator("#usage-chart line.marker")).to_have_count(COMPRESSIONS + 1)


async def test_clear_context_only_after_confirming(browser: Browser, env: WebEnv) -> None:
    page = await signed_in(browser, env, viewport={"width": 390, "height": 844}, is_mobile=True)
    await shot(page, "overview-phone")
    await page.click(f"tr.session-row[data-id='{GROUP.id}']")
    before = len(await env.rt.store.get_history(GROUP.id))
    assert before > 0
    await page.click("#clear-context")
    await expect(page.locator("#modal")).to_be_visible()
    await expect(page.locator("#modal-text")).to_contain_text("无法恢复")
    await shot(page, "confirm-phone")
    await page.click("#modal-cancel")
    await expect(page.locator("#modal")).to_be_hidden()
    assert len(await env.rt.store.get_history(GROUP.id)) == before
    await page.click("#clear-context")
    await page.click("#modal-ok")
    await expect(page.locator("#flash")).to_contain_text("已清除上下文和摘要")
    await expect(page.locator("#recent")).to_contain_text("没有活跃消息")
    await expect(page.locator("#summary")).to_contain_text("还没有摘要")
    assert await env.rt.store.get_history(GROUP.id) == []
