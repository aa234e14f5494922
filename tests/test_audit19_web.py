"""Audit 19, web: the owner's page against hostile and extreme content, in Debian's Chromium.

Group members choose their nicknames, cards, messages, forwarded records and group names, and
a summary is model output that can echo any of them: all of it is put on the page. Here it
holds markup, `javascript:` links, SVG, template-literal text, direction controls and
zero-width characters; a bot is in a thousand groups with names QQ allows (empty, emoji or
CJK only, one unbroken Latin run), a member pastes 20,000 characters, a summary fills the
physical cap; the bot goes away while the page is open; another page of this machine posts
forms at it. Real uvicorn, the real SQLite file, the scripted model server, real Chromium.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.web import TOKEN, free_port, mounted
from tests.test_web_browser import ARGS, CHROMIUM

if not Path(CHROMIUM).exists():  # as tests/test_web_browser.py: .ci/run makes a missing browser fail
    if os.environ.get("MEMSUM_REQUIRE_BROWSER"):
        raise RuntimeError(f"Chromium is required but missing at {CHROMIUM}")
    pytest.skip("Debian's chromium is not installed (.ci/run installs it)", allow_module_level=True)

from playwright.async_api import Browser, Page, async_playwright, expect

SELF_ID = 10000
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1200, "height": 900}
SUMMARY_HEAD = "【保留原文】无\n## 最近在聊什么\n"
"""The chat template's keep line and first section (R-TPL-4), as tests/fakes/web.py writes it."""


@dataclass
class Env:
    rt: Runtime
    llm: ScriptedLLM
    base: str
    """The page's address, ending in /memsum/."""
    names: dict[str, str]
    """What get_group_list / get_friend_list say: `group:<n>` and `private:<n>` to a name."""


def config(llm: ScriptedLLM) -> Config:
    return Config.model_validate(
        {
            "memsum_models": [
                llm.model_config("test/chat", model="chat", context_window=8000, priority=1),
                llm.model_config("test/summary", model="summary", context_window=8000),
            ],
            "memsum_summary_model": "test/summary",
            "memsum_web_token": TOKEN,
        }
    )


@asynccontextmanager
async def page_env(tmp: Path) -> AsyncIterator[Env]:
    with ScriptedLLM() as llm:
        rt = await runtime.build(config(llm), tmp / "web.db", ["小记"], {"10001"})
        names: dict[str, str] = {}

        async def read_names() -> Mapping[str, str]:
            return names

        try:
            async with mounted(rt, read_names) as (base, _):
                yield Env(rt, llm, base + "/", names)
        finally:
            await runtime.close(rt)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        await b.close()


async def member_says(
    rt: Runtime, group: int, text: str, name: str = "成员", ts: float | None = None
) -> None:
    await rt.agent.record(
        group_record(SELF_ID, group),
        Message(role="user", content=f"[{name}(30001)] {text}", ts=ts or time.time()),
    )


async def signed_in(browser: Browser, env: Env, viewport: Mapping[str, int]) -> Page:
    page = await browser.new_page(viewport=dict(viewport), locale="zh-CN")  # type: ignore[arg-type]
    await page.goto(env.base)
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#sessions")).to_be_visible()
    return page


async def inside_its_box(page: Page) -> None:
    """Nothing on the page is wider than the window, and no table is wider than the box
    that holds it (a table wider than its box pushes every row's values out of sight)."""
    widths = await page.evaluate(
        """() => [document.documentElement.scrollWidth, window.innerWidth,
            [...document.querySelectorAll('.table-wrap')].map((w) => [w.scrollWidth, w.clientWidth])]"""
    )
    page_width, window, wraps = widths
    assert page_width <= window, widths
    for scroll, client in wraps:
        assert scroll <= client, widths


# ---- extremes: a thousand groups, names QQ allows, 20,000 characters, a full summary ---------------
GROUPS = 1000
FIRST = 600000
EXTREME_NAMES = [
    "",  # a group whose name the client did not give
    "😀🏔️📚🎉",
    "爬山读书摄影美食旅行" * 3,
    "W" * 24,  # one unbroken Latin run, as QQ lets a group be named
    "\u200b\u200b",
    "普通的群",
]
LONG_GROUP = FIRST + 1
FULL_GROUP = FIRST + 2
PASTE = "这是一段很长的粘贴" * 1000 + "x" * 11000
"""20,000 characters, its last 11,000 one unbroken run (a log line, a base64 blob)."""


def full_summary(body: dict[str, Any]) -> Reply | None:
    """The summary model fills its output to the physical cap: min(4096, 8000 / 4) = 2000
    tokens (R-BUD-7), a link it echoed among the text as one unbroken run."""
    if body.get("model") != "summary":
        return None
    text = SUMMARY_HEAD + "大家聊了爬山路线和装备。" * 250 + "\n链接 https://pan.example.com/s/" + "Ab3" * 400
    return Reply(text, usage={"prompt_tokens": 900, "completion_tokens": 2000, "total_tokens": 2900})


async def test_a_thousand_groups_with_extreme_names_are_all_listed_in_their_box_on_a_phone_and_a_desktop(
    browser: Browser, tmp_path: Path
) -> None:
    """A group named with one unbroken Latin run (24 W, a name QQ accepts) made the overview's
    table 494 pixels wide on a 390-pixel phone: in the phone's card layout every row's values
    sit at the table's right edge, so every group's mode, counts and gauges were out of
    sight, not only that group's. A name now wraps inside its cell."""
    async with page_env(tmp_path) as env:
        env.llm.on_request(full_summary)
        t0 = time.time() - 3600
        for n in range(GROUPS):
            group = FIRST + n
            env.names[f"group:{group}"] = EXTREME_NAMES[n % len(EXTREME_NAMES)]
            await member_says(env.rt, group, f"第{n}个群的第一句", ts=t0 + n)
        await member_says(env.rt, LONG_GROUP, PASTE)
        full = group_record(SELF_ID, FULL_GROUP).id
        for n in range(12):
            await member_says(env.rt, FULL_GROUP, f"第{n}句：周末去爬山吗，带上水和干粮", ts=t0 + 2000 + n)
        assert (await env.rt.compression.compress(full)).outcome == "done"
        ids = {group_record(SELF_ID, FIRST + n).id for n in range(GROUPS)}

        for viewport in (PHONE, DESKTOP):
            page = await signed_in(browser, env, viewport)
            rows = page.locator("tr.session-row")
            await expect(rows).to_have_count(GROUPS)
            await expect(page.locator("#count")).to_have_text(f"共 {GROUPS} 个会话")
            assert set(await rows.evaluate_all("rs => rs.map((r) => r.dataset.id)")) == ids
            await inside_its_box(page)
            # A group with no name is listed by its number, and opens.
            await page.fill("#filter", str(FIRST))
            await expect(rows).to_have_count(1)
            await expect(rows.first).to_contain_text(str(FIRST))
            await rows.first.click()
            await expect(page.locator("#session-title")).to_contain_text(str(FIRST))
            await expect(page.locator("#recent")).to_contain_text("第0个群的第一句")
            await inside_its_box(page)
            # The 20,000 characters: all there, wrapped in the message's box.
            await page.goto(f"{env.base}#/s/{quote(group_record(SELF_ID, LONG_GROUP).id)}")
            recent = page.locator("#recent .msg .pre").last
            await expect(recent).to_contain_text("x" * 11000)
            assert len(await recent.inner_text()) >= len(PASTE)
            await inside_its_box(page)
            # The summary at the physical cap, its echoed link wrapped too.
            await page.goto(f"{env.base}#/s/{quote(full)}")
            await expect(page.locator("#summary")).to_contain_text("Ab3" * 400)
            await inside_its_box(page)
            await page.close()


# ---- the bot goes away while the page is open ------------------------------------------------------
async def test_while_the_bot_is_away_the_page_says_so_in_chinese_and_comes_back_by_itself(
    browser: Browser, tmp_path: Path
) -> None:
    """The owner restarts the bot with the page open. The page's next poll found no server:
    it showed the browser's own words, 「Failed to fetch」, and stopped polling, so it stayed
    on them after the bot was back until the owner reloaded. Now it says in Chinese that the
    bot cannot be reached, and keeps asking: once the bot is back the page carries on by
    itself (here, as after a real restart, at the sign-in, the old session gone with it)."""
    port = free_port()
    with ScriptedLLM() as llm:
        rt = await runtime.build(config(llm), tmp_path / "web.db", ["小记"], {"10001"})
        try:
            await member_says(rt, FIRST, "周末去爬山吗")
            sid = group_record(SELF_ID, FIRST).id

            async def names() -> Mapping[str, str]:
                return {f"group:{FIRST}": "爬山群"}

            async with mounted(rt, names, port) as (base, _):
                page = await browser.new_page(locale="zh-CN")
                await page.goto(base + "/")
                await page.fill("#token", TOKEN)
                await page.click("#login-form button[type=submit]")
                await page.click(f"tr.session-row[data-id='{sid}']")
                await expect(page.locator("#recent")).to_contain_text("周末去爬山吗")
            # The bot is down: the next poll cannot reach it.
            error = page.locator("#main .error")
            await expect(error).to_contain_text("连不上机器人", timeout=15_000)
            assert re.search(r"[A-Za-z]{3}", await page.locator("#main").inner_text()) is None
            async with mounted(rt, names, port):
                await expect(page.locator("#login-form")).to_be_visible(timeout=15_000)
                await page.fill("#token", TOKEN)
                await page.click("#login-form button[type=submit]")
                await expect(page.locator("#recent")).to_contain_text("周末去爬山吗")
                await page.close()
        finally:
            await runtime.close(rt)


async def test_the_overview_of_a_thousand_groups_travels_compressed(tmp_path: Path) -> None:
    """The overview polls every 5 seconds. For a bot in a thousand groups each answer was
    0.7 MB of JSON sent as it is: a phone left on the page used half a gigabyte of mobile
    data an hour. Answers go gzip-compressed to a browser that takes it (every browser)."""
    async with page_env(tmp_path) as env:
        for n in range(GROUPS):
            env.names[f"group:{FIRST + n}"] = EXTREME_NAMES[n % len(EXTREME_NAMES)] + "群"
            await member_says(env.rt, FIRST + n, f"第{n}个群的第一句")
        async with httpx.AsyncClient(base_url=env.base, headers={"Accept-Encoding": "gzip"}) as owner:
            assert (await owner.post("api/login", json={"token": TOKEN})).status_code == 200
            resp = await owner.get("api/overview")
            assert resp.status_code == 200
            assert len(resp.json()["sessions"]) == GROUPS
            assert len(resp.content) > 500_000  # what the page reads
            assert resp.headers["content-encoding"] == "gzip"
            assert resp.num_bytes_downloaded < len(resp.content) / 10  # what went over the wire
