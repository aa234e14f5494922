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

from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.tools import ToolContext
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.onebot.render import bidi_visible, clean_name, label
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.nonebug import SELF_ID, Like, group_msg, history, new_group, run

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
