"""Sixteenth audit, bidi: direction controls in what members say, shown to the owner.

A right-to-left override (U+202E) and the other explicit formatting characters of UAX #9
(https://www.unicode.org/reports/tr9/, section 2) are invisible and reorder the rest of
their paragraph on screen, while the model reads code points: the Trojan Source class
(Boucher and Anderson, CVE-2021-42574), here used to make a line look as if the group's
owner said it. What is stored and what the model reads keep the controls (R-MEM); every
place the bot shows a member's text to the owner (/回忆, /摘要, the web page) shows them as
`<U+202E>`, and the web page isolates each message and name (HTML's <bdi>, CSS
`unicode-bidi: isolate`), so no text reorders the page's framing.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.tools import ToolContext
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.onebot.render import bidi_visible, clean_name, label
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes import web
from tests.fakes.nonebug import SELF_ID, Like, group_msg, history, new_group, run
from tests.fakes.web import GROUP, PRIVATE, TOKEN, WebEnv, say
from tests.test_audit8_x import browser, env  # noqa: F401  (fixtures)

RLO, PDF = "\u202e", "\u202c"
_MIRRORED = str.maketrans("[]()", "][)(")


def on_screen_reversed(shown: str) -> str:
    """The code points that, after an RLO, show as `shown`: an override reverses the order and
    mirrors brackets and parentheses (UAX #9 rules X6 and L4)."""
    return shown[::-1].translate(_MIRRORED)


FORGED = RLO + on_screen_reversed("[群主(10001)] 提取码作废了，别用")
"""Shows as the owner's labelled line; for the model it is no label at all."""
TIME = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}"


def test_controls_are_shown_as_code_points_and_names_drop_them() -> None:
    assert bidi_visible(f"a{RLO}b{PDF}\u200e\u200f\u061c\u2066\u2067\u2068\u2069") == (
        "a<U+202E>b<U+202C><U+200E><U+200F><U+061C><U+2066><U+2067><U+2068><U+2069>"
    )
    assert bidi_visible("提\u200b取码 [甲(1)]") == "提\u200b取码 [甲(1)]"  # nothing else touched
    # The prompt's `[昵称(ID)]` label (R-TPL-4) already drops them from a name: the label
    # cannot show another ID in a log or on the page.
    assert label(f"甲{RLO})10002(乙", 20001) == "[甲10002乙(20001)]"
    assert clean_name(RLO + "\u2067\u200f", "20001") == "20001"


async def test_recall_and_summary_in_qq_show_the_override_the_model_reads_it_as_said(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    said = f"周末的提取码是 8d3k\n{FORGED}"
    await run(app, group_msg(said, group, user=20001), None)
    stored = [m.content for m in await history(sid)]
    assert stored == [f"[用户20001(20001)] {said}"]  # R-MEM: kept as said
    shown = "周末的提取码是 8d3k ⏎ <U+202E>" + FORGED[1:]
    await run(
        app,
        group_msg("/回忆 提取码", group),
        Like(re.escape("找到 1 条（按相关程度排列）：\n") + TIME + re.escape(f" [用户20001(20001)] {shown}")),
    )
    # The model's recall tool reads what was said, code point for code point.
    result = await runtime.get().tools.call(ToolContext(sid), "recall", json.dumps({"query": "提取码"}))
    assert FORGED in result
    # A summary that copied the override (the compression model quotes members).
    summary = f"## 最近在聊什么\n提取码 8d3k\n{FORGED}"
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": summary, "kept_messages": 0})
    await run(
        app,
        group_msg("/摘要", group),
        Like(re.escape("本会话摘要：\n## 最近在聊什么\n提取码 8d3k\n<U+202E>" + FORGED[1:] + "\n") + ".*"),
    )


# ---- the web page ---------------------------------------------------------------------------
# Where each piece of `pieces` (in logical order, each within one text node of `root`) starts
# on screen, left to right: a page whose framing no member text reorders lists them rising.
_LEFTS = """([root, pieces]) => {
  const box = document.querySelector(root);
  const walker = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  return pieces.map((piece) => {
    const node = nodes.find((n) => n.data.includes(piece));
    if (!node) return null;
    const range = document.createRange();
    const at = node.data.indexOf(piece);
    range.setStart(node, at);
    range.setEnd(node, at + piece.length);
    return Math.round(range.getBoundingClientRect().left);
  });
}"""


async def test_the_page_shows_controls_and_isolates_names_and_messages_in_chromium(
    env: WebEnv,  # noqa: F811
    browser: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from playwright.async_api import expect

    # A group name holding an override, a friend's name in Hebrew (no control at all: strong
    # right-to-left letters pull a number that follows them to their left, HTML's own <bdi>
    # example), and a member's second line that shows as the owner's labelled words.
    monkeypatch.setitem(web.NAMES, GROUP.place or "", f"爬山群{RLO}ABC")
    monkeypatch.setitem(web.NAMES, "private:20002", "שלום")
    said = f"周末的提取码是 8d3k\n{FORGED}"
    await say(env.rt, said, 9, time.time())
    assert (await env.rt.store.get_history(GROUP.id))[-1].content == f"[成员9(30009)] {said}"  # R-MEM

    page = await browser.new_page(locale="zh-CN")
    await page.goto(env.base + "/")
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#sessions")).to_contain_text("ABC")
    await page.click(f"tr.session-row[data-id='{GROUP.id}']")
    await expect(page.locator("#recent")).to_contain_text("8d3k")
    # The title: the name, then the group's number, left to right.
    title = await page.evaluate(_LEFTS, ["#session-title", ["爬山群", "ABC", "123456"]])
    assert None not in title
    assert title == sorted(title), title
    # The forged line reads in the order it was written: its first character at the left.
    line = await page.evaluate(_LEFTS, ["#recent .msg:last-child", ["用别", "主群"]])
    assert None not in line
    assert line == sorted(line), line
    await page.goto(f"{env.base}/#/s/{PRIVATE.id}")
    await expect(page.locator("#session-title")).to_contain_text("שלום")
    title = await page.evaluate(_LEFTS, ["#session-title", ["私聊", "שלום", "20002"]])
    assert None not in title
    assert title == sorted(title), title
    await page.close()
    # What the page is given: the controls as code points, the store keeping them.
    async with httpx.AsyncClient(base_url=env.base + "/") as owner:
        assert (await owner.post("api/login", json={"token": TOKEN})).status_code == 200
        d = (await owner.get(f"api/sessions/{GROUP.id.replace(':', '%3A')}")).json()
    assert d["name"] == "爬山群<U+202E>ABC"
    assert d["recent"][-1]["content"] == f"[成员9(30009)] 周末的提取码是 8d3k\n<U+202E>{FORGED[1:]}"


async def test_the_flash_line_after_saving_a_persona_isolates_it_in_chromium(
    env: WebEnv,  # noqa: F811
    browser: Any,  # noqa: F811
) -> None:
    """The line 「人设 现在是 …（本会话）」 after a save put the new persona in one text node
    with its frame: an override in it (only an owner or an admin sets one) laid the layer's
    name out reversed, on the persona's side. The persona now sits in a <bdi> there too, also
    after the page's refresh."""
    from playwright.async_api import expect

    page = await browser.new_page(locale="zh-CN")
    await page.goto(env.base + "/")
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")
    await page.click(f"tr.session-row[data-id='{GROUP.id}']")
    row = page.locator("#settings tr[data-name='persona']")
    await row.locator("textarea").fill(f"你是小记{RLO}XYZ")
    await row.locator("button.save").click()
    await expect(page.locator("#flash")).to_contain_text("本会话")
    # The frame reads left to right: 现在是, the persona (its XYZ reversed by its own override,
    # inside it), then the layer's name, each of its characters in order (the override had
    # laid it out 「话会本」); and so after the page's timed refresh draws the line again.
    for _ in range(2):
        lefts = await page.evaluate(_LEFTS, ["#flash", ["现在是", "你是小记", "本", "会", "话"]])
        assert None not in lefts
        assert lefts == sorted(lefts), lefts
        await page.evaluate("document.getElementById('flash').dataset.old = '1'; refresh()")
        await expect(page.locator("#flash:not([data-old])")).to_contain_text("本会话")
    assert (await env.rt.settings.effective("persona", GROUP.id)).value == f"你是小记{RLO}XYZ"  # as typed
    await page.close()
