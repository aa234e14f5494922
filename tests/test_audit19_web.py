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
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.config import DEFAULT_PERSONA, Config
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.onebot.render import forward_nodes, forward_record
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.e2e import until
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.web import TOKEN, free_port, mounted, serving
from tests.test_web_browser import ARGS, CHROMIUM

if not Path(CHROMIUM).exists():  # as tests/test_web_browser.py: .ci/run makes a missing browser fail
    if os.environ.get("MEMSUM_REQUIRE_BROWSER"):
        raise RuntimeError(f"Chromium is required but missing at {CHROMIUM}")
    pytest.skip("Debian's chromium is not installed (.ci/run installs it)", allow_module_level=True)

from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

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
    sight, not only that group's. A name now wraps inside its cell (and so does a persona
    of one unbroken run, in its row and in the line after saving it)."""
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
            # A persona of the longest kind, one unbroken run, in its row and the line after saving.
            persona = page.locator("#settings tr[data-name='persona']")
            await persona.locator("textarea").fill("W" * 1000)
            await persona.locator("button.save").click()
            await expect(page.locator("#flash bdi")).to_have_text("W" * 1000)
            await expect(persona.locator("b bdi")).to_have_text("W" * 1000)
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


# ---- hostile text: markup, links, SVG, template literals, direction controls, zero width ---------
HOSTILE = (
    "<script>window.__pwned=1</script>"
    '<img src=x onerror="window.__pwned=2;alert(2)">'
    '<a href="javascript:window.__pwned=3">点我</a>'
    '<svg onload="window.__pwned=4"><circle r="5"/></svg>'
    "${window.__pwned=5}`${alert(5)}`"
    '<iframe srcdoc="<script>parent.__pwned=6</script>"></iframe>'
    "javascript:alert(7) {{constructor.constructor('alert(8)')()}}"
    "\u202e反过来\u202c 提\u200b取\u200d码\ufeff"
)
"""Everything a member, a group name or a model's echo could hold that a page might run or
render: would any of it reach the document as markup, an element or a handler would exist."""
SHOWN = HOSTILE.replace("\u202e", "<U+202E>").replace("\u202c", "<U+202C>")
"""As the page shows chat text: each direction control as its code point (render.bidi_visible,
tests/test_audit16_bidi.py), the zero-width characters as they were."""
G = FIRST + 7
FRIEND = 20099
# A member's merged forward (合并转发) as NapCat's get_forward_msg answers it: `messages`, each
# an OB11Message with its sender's card and nickname and its segments (NapNeko/NapCatQQ
# src/onebot/action/go-cqhttp/GetForwardMsg.ts; read the same way by node-napcat-ts's
# WSSendReturn['get_forward_msg']['messages']), stored as render.forward_record writes it.
FORWARD = {
    "messages": [
        {
            "message_id": 1400000001,
            "message_type": "group",
            "sender": {"user_id": 30002, "nickname": HOSTILE, "card": ""},
            "message": [{"type": "text", "data": {"text": HOSTILE}}],
        }
    ]
}
KEY_ECHO = f'Incorrect API key provided: {API_KEY}. <img src=x onerror="window.__pwned=9">'
"""A relay's 401 that echoes the whole key (OpenAI's own masks it) with markup after it."""

FOREIGN_MARKUP = """() => {
  const main = document.getElementById('main');
  const out = [];
  for (const node of main.querySelectorAll('*')) {
    const tag = node.tagName.toLowerCase();
    const made = ['script', 'img', 'iframe', 'object', 'embed', 'circle', 'foreignobject'];
    if (made.includes(tag)) out.push(tag);
    if (tag === 'svg' && !['usage-chart', 'usage-bars'].includes(node.id)) out.push('svg');
    const href = node.getAttribute('href');
    if (tag === 'a' && !/^(#|api\\/)/.test(href || '')) out.push('a ' + href);
    for (const attr of node.attributes) if (attr.name.startsWith('on')) out.push(tag + ' ' + attr.name);
  }
  return out;
}"""
"""Every element and handler in the page's main part that the page itself never makes."""


async def test_hostile_text_from_chat_and_the_model_shows_as_written_and_nothing_runs_in_chromium(
    browser: Browser, tmp_path: Path
) -> None:
    """A group name, a friend's nickname, members' cards, messages and a forwarded record, the
    summary the model wrote echoing them, a persona, the search's results and a provider's
    error text all hold HOSTILE: on the overview and the group's page, on a phone, each reads
    as written; no dialog opened, no script ran, no request left for `x`, no element or
    handler was made. The provider echoed the API key: the page, its API and the log have
    it masked. Holds: app.js writes chat text with textContent only (test_web_api.py pins
    that no innerHTML is used); this pins the outcome for every field at once."""
    failing = [False]

    def model(body: dict[str, Any]) -> Reply | None:
        if body.get("model") != "summary":
            return None
        if failing[0]:
            return Reply(status=401, error=KEY_ECHO)
        return Reply(
            f"{SUMMARY_HEAD}大家在聊爬山 {HOSTILE}\n## 谁有问题没回应\n{HOSTILE}\n## 关键原话要点\n无"
        )

    with captured("DEBUG") as logs:
        async with page_env(tmp_path) as env:
            env.llm.on_request(model)
            sid = group_record(SELF_ID, G).id
            env.names[f"group:{G}"] = HOSTILE
            env.names[f"private:{FRIEND}"] = HOSTILE
            for n in range(12):
                await member_says(env.rt, G, f"{HOSTILE} 第{n}句", name=HOSTILE[:60])
            assert (await env.rt.compression.compress(sid)).outcome == "done"
            nodes = forward_nodes(FORWARD)
            assert nodes is not None
            await member_says(env.rt, G, f"{HOSTILE} 压缩之后", name=HOSTILE[:60])
            await member_says(env.rt, G, forward_record(nodes, {}), name="转发的人")
            await env.rt.agent.record(
                private_record(SELF_ID, FRIEND),
                Message(role="user", content=f"[好友({FRIEND})] {HOSTILE}", ts=time.time()),
            )

            page = await browser.new_page(viewport={"width": 390, "height": 844}, locale="zh-CN")
            dialogs: list[str] = []

            async def dismiss(dialog: Dialog) -> None:
                dialogs.append(dialog.message)
                await dialog.dismiss()

            page.on("dialog", dismiss)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            asked: list[str] = []
            page.on("request", lambda r: asked.append(r.url))
            await page.goto(env.base)
            await page.fill("#token", TOKEN)
            await page.click("#login-form button[type=submit]")
            rows = page.locator("tr.session-row")
            await expect(rows).to_have_count(2)
            for row in await rows.all():
                assert SHOWN in await row.locator("bdi").inner_text()
            await rows.locator(f"[data-id='{sid}']").or_(page.locator(f"tr[data-id='{sid}']")).first.click()
            await expect(page.locator("#session-title bdi")).to_have_text(SHOWN)
            await expect(page.locator("#summary")).to_contain_text(f"大家在聊爬山 {SHOWN}")
            recent = page.locator("#recent .msg bdi")
            await expect(recent.last).to_contain_text("转发的人(30001)] [合并转发：")
            texts = await recent.all_inner_texts()
            assert f"{SHOWN} 压缩之后" in texts[-2]
            assert SHOWN in texts[-1]
            # A persona holding it, saved on the page (an admin's /人设 could have set it).
            persona = page.locator("#settings tr[data-name='persona']")
            await persona.locator("textarea").fill(HOSTILE)
            await persona.locator("button.save").click()
            await expect(page.locator("#flash bdi")).to_have_text(HOSTILE)
            await expect(persona.locator("b bdi")).to_have_text(HOSTILE)
            await expect(persona.locator("textarea")).to_have_value(HOSTILE)
            # The search's results.
            await page.fill("#search input[name=q]", "第3句")
            await page.click("#search button[type=submit]")
            await expect(page.locator("#search-results .msg.found bdi")).to_contain_text(f"{SHOWN} 第3句")
            # A compression the provider refuses with the key and markup in its words.
            failing[0] = True
            await page.click("#compress")
            progress = page.locator("#progress")
            await expect(progress).to_contain_text("压缩失败", timeout=15_000)
            await expect(progress).to_contain_text(
                'Incorrect API key provided: ***. <img src=x onerror="window.__pwned=9">'
            )
            await expect(page.locator("#compressions tbody tr").first).to_contain_text("不认这个密钥")

            assert await page.evaluate(FOREIGN_MARKUP) == []
            await page.goto(env.base + "#/")
            await expect(rows).to_have_count(2)
            await expect(page.locator(f"tr[data-id='{sid}']")).to_contain_text("不认这个密钥")
            assert await page.evaluate(FOREIGN_MARKUP) == []
            assert await page.evaluate("[window.__pwned, typeof window.__pwned]") == [None, "undefined"]
            assert dialogs == []
            assert errors == []
            assert [u for u in asked if not re.search(r"/memsum/(|api/.*|static/app\.(js|css))$", u)] == []
            assert API_KEY not in await page.content()
            async with httpx.AsyncClient(base_url=env.base) as owner:
                assert (await owner.post("api/login", json={"token": TOKEN})).status_code == 200
                q = quote(sid, safe="")
                for path in (
                    "api/overview",
                    f"api/sessions/{q}",
                    f"api/sessions/{q}/search?q=key",
                    "api/usage",
                ):
                    resp = await owner.get(path)
                    assert resp.status_code == 200
                    assert API_KEY not in resp.text, path
            await page.close()
    assert not [line for line in logs if API_KEY in line or TOKEN in line]


# ---- another page of this machine posts at the page ----------------------------------------------
def attack(base: str, sid: str) -> str:
    """A page of another origin posting what a page can post without asking CORS: forms
    (text/plain holding JSON, urlencoded) into hidden frames, a no-cors fetch, a beacon."""
    at = f"{base}api/sessions/{quote(sid, safe='')}/"
    clear = '{"kind": "context", "confirm": true, "x": "'
    return f"""<!doctype html><meta charset="utf-8"><body>
<iframe name="f1"></iframe><iframe name="f2"></iframe><iframe name="f3"></iframe>
<form id="a" method="post" enctype="text/plain" target="f1" action="{at}clear">
<input name='{clear}' value='"}}'></form>
<form id="b" method="post" target="f2" action="{at}settings">
<input name="name" value="mode"><input name="scope" value="place"><input name="value" value="off"></form>
<form id="c" method="post" target="f3" action="{base}api/logout"></form>
<script>
document.getElementById("a").submit();
document.getElementById("b").submit();
document.getElementById("c").submit();
fetch("{at}settings", {{method: "POST", mode: "no-cors", credentials: "include",
  body: JSON.stringify({{name: "compress_at", scope: "session", value: 0.01}})}});
navigator.sendBeacon("{at}compress", "{{}}");
</script>"""


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_another_origins_forms_fetch_and_beacon_change_nothing_in_chromium(
    browser: Browser, tmp_path: Path, host: str
) -> None:
    """The owner is signed in; another page opened in the same browser posts at the page.
    From another port of 127.0.0.1 (the same site: the SameSite=Strict cookie goes along,
    Chromium says `Sec-Fetch-Site: same-site`) and from `localhost` (another site: no
    cookie). Every post is refused, nothing changed, the owner still signed in. Holds
    (web/auth.same_origin, the CSRF header; tests/test_audit8_x.py sends such posts with
    httpx): this is Chromium's own requests."""
    async with page_env(tmp_path) as env:
        for n in range(3):
            await member_says(env.rt, FIRST, f"第{n}句")
        sid = group_record(SELF_ID, FIRST).id
        before = len(await env.rt.store.get_history(sid))
        context = await browser.new_context(locale="zh-CN")
        owner = await context.new_page()
        await owner.goto(env.base)
        await owner.fill("#token", TOKEN)
        await owner.click("#login-form button[type=submit]")
        await expect(owner.locator("#sessions")).to_be_visible()

        evil = FastAPI()
        evil.get("/")(lambda: HTMLResponse(attack(env.base, sid)))
        answers: list[tuple[str, int]] = []
        context.on(
            "response", lambda r: answers.append((r.url, r.status)) if "/memsum/api/" in r.url else None
        )
        async with serving(evil) as site:
            page = await context.new_page()
            await page.goto(site.replace("127.0.0.1", host) + "/")

            async def all_answered() -> bool:
                return len(answers) >= 5

            await until(all_answered, "the five posts answered")
        assert sorted({status for _, status in answers}) == ([403] if host == "127.0.0.1" else [401]), answers
        assert len(await env.rt.store.get_history(sid)) == before
        assert await env.rt.store.get_settings("session", sid) == {}
        assert await env.rt.store.get_settings("place", f"group:{FIRST}") == {}
        assert await env.rt.store.compressions(sid) == []
        await owner.reload()
        await expect(owner.locator("#sessions")).to_contain_text(str(FIRST))
        await context.close()


# ---- Chinese wherever the owner reads ------------------------------------------------------------
WORDS = """() => {
  const seen = [document.body.innerText];
  for (const node of document.querySelectorAll('[placeholder], [title], [aria-label], option')) {
    seen.push(node.getAttribute('placeholder') || '', node.getAttribute('title') || '',
      node.getAttribute('aria-label') || '', node.tagName === 'OPTION' ? node.textContent : '');
  }
  return seen.join('\\n');
}"""
"""What the owner reads on the page: its text, and the words in placeholders, tooltips,
labels and the options of a select."""
NOT_WORDS = re.compile(
    "|".join(
        [
            re.escape(DEFAULT_PERSONA),  # the prompt the model reads, as configured
            r"（HTTP 500: scripted error）",  # the provider's own words, after the Chinese headline
            r"\.env|MEMSUM_WEB_TOKEN|token|CSV|QQ|test/(chat|summary)|scheduler/daily",
        ]
    )
)
"""What the owner configured or a provider said (the .env setting, the model ids, another
plugin's session, the persona, an error's detail), and the two words a Chinese page about
models writes as they are."""


async def english_in(page: Page) -> list[str]:
    text = NOT_WORDS.sub("", await page.evaluate(WORDS))
    return re.findall(r"[^\n]{0,30}[A-Za-z]{2,}[^\n]{0,20}", text)


async def test_every_state_of_the_page_reads_in_chinese(browser: Browser, tmp_path: Path) -> None:
    """Sign-in and its errors, the overview of a group, a friend and another plugin's session,
    a group's page with nothing yet (no summary, no compression, no usage), a search that
    finds nothing, a value refused, a compression that failed, the confirmation, the usage
    page, a session that is not there: no English word but the names the owner configured.
    The search's results ended in a stray 「null」 whenever all were listed (app.js handed
    `replaceChildren` a null, which the DOM writes as text); the rest holds."""
    async with page_env(tmp_path) as env:
        env.llm.on_request(lambda body: Reply(status=500) if body.get("model") == "summary" else None)
        await member_says(env.rt, FIRST, "周末去爬山吗")
        env.names[f"group:{FIRST}"] = "爬山群"
        env.names["private:20002"] = "小明"
        await env.rt.agent.record(
            private_record(SELF_ID, 20002), Message(role="user", content="[小明(20002)] 你好")
        )
        await env.rt.agent.record(
            SessionRecord(id="scheduler/daily", platform="internal", kind="internal"),
            Message(role="user", content="每日提醒"),
        )
        page = await browser.new_page(locale="zh-CN")
        await page.goto(env.base)
        await expect(page.locator("#login-form")).to_be_visible()
        found = await english_in(page)
        with captured("DEBUG") as logs:
            await page.fill("#token", "not-the-token-at-all")
            await page.click("#login-form button[type=submit]")
            await expect(page.locator("#login-error")).to_have_text("令牌不对")
        assert any("wrong token" in line for line in logs)
        assert not [line for line in logs if "not-the-token" in line]  # a near-miss is half a token
        found += await english_in(page)
        await page.fill("#token", TOKEN)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("tr.session-row")).to_have_count(3)
        found += await english_in(page)
        sid = group_record(SELF_ID, FIRST).id
        await page.click(f"tr.session-row[data-id='{sid}']")
        await expect(page.locator("#summary")).to_contain_text("还没有摘要")
        found += await english_in(page)
        await page.fill("#search input[name=q]", "没有这个词")
        await page.click("#search button[type=submit]")
        await expect(page.locator("#search-results")).to_have_text("没有找到。")
        row = page.locator("#settings tr[data-name='compress_at']")
        await row.locator("input").fill("很多")
        await row.locator("button.save").click()
        await expect(page.locator("#flash")).to_contain_text("请填写数字")
        found += await english_in(page)
        await page.click("#compress")
        await expect(page.locator("#progress")).to_contain_text("压缩失败", timeout=30_000)
        await expect(page.locator("#compressions")).to_contain_text("失败")
        found += await english_in(page)
        await page.click("#clear-context")
        await expect(page.locator("#modal")).to_be_visible()
        found += await english_in(page)
        await page.click("#modal-cancel")
        await page.goto(f"{env.base}#/s/{quote('scheduler/daily', safe='')}")
        await expect(page.locator("#session-title")).to_contain_text("scheduler/daily")
        found += await english_in(page)
        await page.goto(f"{env.base}#/s/onebot%3A1%3Agroup%3A1")
        await expect(page.locator("#main .error")).to_have_text("没有这个会话")
        found += await english_in(page)
        await page.goto(f"{env.base}#/usage")
        await expect(page.locator("#usage-table")).to_be_visible()
        found += await english_in(page)
        assert found == [], sorted(set(found))
        await page.close()
