"""Outside audit 17 (fwd): left-overs of the "who said what" audit (tests/test_audit17_who.py).

- A long answer went out cut every 1500 (merged-forward node) or 3000 (plain message)
  characters, so a /回忆 result line, even its `时间 [昵称(QQ)]`, could run over two bubbles.
- A group card starting with 「回复 」 made the member's own label read as a quote marker.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from nonebot.adapters.onebot.v11 import Bot
from nonebot.adapters.onebot.v11.event import Sender
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.onebot.render import neutralise_labels, unlabelled
from nonebot_plugin_memsum.onebot.send import FORWARD_PART, PLAIN_PART
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message
from tests.fakes.nonebug import (
    SELF_ID,
    SUPERUSER_ID,
    Like,
    forwarded,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
)

# ---- 1. a long answer is cut between lines ----------------------------------------------
HEAD = re.compile(r"找到 \d+ 条")
RESULT = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d \[用户\d+\(\d+\)\] 第\d+条")


def _body(i: int, size: int) -> str:
    """A message of about `size` characters, unique by `i`, of sentences (爬山 the keyword)."""
    sentence = f"第{i}条说周末去爬山，记得带水和伞。"
    return (f"第{i}条" + sentence * (size // len(sentence) + 1))[:size]


async def _seed(record: Any, size: int) -> list[str]:
    bodies = [_body(i, size) for i in range(10)]  # RECALL_LIMIT lines: no "more than" head
    for i, body in enumerate(bodies):
        user = 20001 + i
        message = Message(role="user", content=f"[用户{user}({user})] {body}", ts=1_700_000_000.0 + 60 * i)
        await runtime.get().agent.record(record, message)
    return bodies


def _check_whole_lines(parts: list[str], bodies: list[str], size: int) -> None:
    """Each part at most `size` characters of whole lines: the head or `时间 [昵称(QQ)] 正文`."""
    assert len(parts) > 1
    assert all(len(p) <= size for p in parts)
    lines = [line for p in parts for line in p.split("\n")]
    assert HEAD.match(lines[0])
    assert all(RESULT.match(line) for line in lines[1:]), lines
    assert sorted(line.split("] ", 1)[1] for line in lines[1:]) == sorted(bodies)


async def test_recall_forward_nodes_hold_whole_result_lines(app: App) -> None:
    group = new_group()
    bodies = await _seed(group_record(SELF_ID, group), 277)
    _check_whole_lines(await forwarded(app, group, "/回忆 爬山"), bodies, FORWARD_PART)


async def test_recall_in_plain_messages_holds_whole_result_lines(app: App) -> None:
    # Private chats have no merged-forward here: plain messages of PLAIN_PART characters.
    # The owner's private chat is every test's: it is left empty, as found.
    record = private_record(SELF_ID, SUPERUSER_ID)
    event = private_msg("/回忆 爬山")
    sent = [Like(".*"), Like(".*")]  # each keeps the message it matched
    try:
        bodies = await _seed(record, 331)
        async with app.test_matcher() as ctx:
            bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
            ctx.receive_event(bot, event)
            for i, part in enumerate(sent):
                ctx.should_call_send(event, part, result={"message_id": i + 1})
    finally:
        await runtime.get().compression.delete_session(record.id)
    _check_whole_lines([str(part.seen) for part in sent], bodies, PLAIN_PART)


async def test_a_line_longer_than_a_node_is_cut_at_sentence_ends(app: App) -> None:
    # A summary of one long line: only it is cut, each node ending a sentence.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    summary = "".join(f"第{i}句，大家约好了周末去爬山。" for i in range(300))
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": summary, "kept_messages": 0})
    texts = await forwarded(app, group, "/摘要")
    assert len(texts) > 2
    assert all(len(t) <= FORWARD_PART for t in texts)
    pieces = [line for t in texts for line in t.split("\n") if line.startswith("第")]
    assert "".join(pieces) == summary
    assert all(re.fullmatch(r"(第\d+句，大家约好了周末去爬山。)+", p) for p in pieces), pieces


# ---- 2. a card cannot make its own label a quote ----------------------------------------
# Cards as QQ lets a member type them: full-width brackets, a zero-width space anywhere.
QUOTE_CARDS = ["回复 甲(20001)：", "［回复 乙(20002)：］", "\u200b回\u200b复 丙(20003)：", "【回复】"]


@pytest.mark.parametrize("card", QUOTE_CARDS)
async def test_a_card_starting_with_a_quote_marker_labels_no_quote(app: App, card: str) -> None:
    group = new_group()
    event = group_msg("周六几点集合？", group, user=20009)
    event = event.model_copy(
        update={"sender": Sender(user_id=20009, nickname="阿九", card=card, role="member")}
    )
    await run(app, event, None)
    (stored,) = await history(group_record(SELF_ID, group).id)
    name, qq, body = unlabelled(stored.content) or ("", "", "")
    assert (qq, body) == ("20009", "周六几点集合？")
    # What render reads as a quote (`[回复 …`, invisible characters too) leaves the label alone.
    assert "（仿冒引用）" not in neutralise_labels(stored.content)
    assert not re.sub(r"[\s\u200b-\u200f\u2060\ufeff]", "", stored.content).startswith(
        ("[回复", "[［回复", "[【回复")
    )
    assert name.replace("\u200b", "").find("回复") > 0  # the member's card, still shown
