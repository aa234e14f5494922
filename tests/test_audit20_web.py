"""Audit 20, web: what the page says after an error, and whether it asks again, in Chromium.

A poll that fails because the bot is away is asked again every 5 s (audit 19). A session
that is not there (404: the address was typed, or the session was deleted meanwhile) will
not appear by asking again: the page said 「稍后自动重试」 under 「没有这个会话」 and asked
every 5 s for as long as it stayed open.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

from nonebot_plugin_memsum.onebot import group_record
from tests.test_audit19_web import (  # noqa: F401
    DESKTOP,
    FIRST,
    SELF_ID,
    Browser,
    browser,
    expect,
    member_says,
    page_env,
    signed_in,
)


async def test_a_session_that_is_not_there_is_said_once_and_not_asked_again(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with page_env(tmp_path) as env:
        await member_says(env.rt, FIRST, "周末去爬山吗")
        page = await signed_in(browser, env, DESKTOP)
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/api/sessions/" in r.url else None)
        await page.goto(f"{env.base}#/s/{quote('onebot:1:group:1', safe='')}")
        await expect(page.locator("#main .error")).to_have_text("没有这个会话")
        main = await page.locator("#main").inner_text()
        assert "稍后自动重试" not in main
        assert "null" not in main
        await asyncio.sleep(6.5)  # longer than the page's 5 s retry
        assert len(asked) == 1, asked
        # The way back still works, and a real session's page still shows.
        await page.click("#main a[href='#/']")
        sid = group_record(SELF_ID, FIRST).id
        await page.click(f"tr.session-row[data-id='{sid}']")
        await expect(page.locator("#recent")).to_contain_text("周末去爬山吗")
        await page.close()
