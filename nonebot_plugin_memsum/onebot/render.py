"""Events rendered as text: pure functions, no I/O.

Every group message is recorded as `[昵称(ID)] 正文`; the label is the real sender
(R-TPL-4), and text that imitates a label, a quote or a notice is neutralised so no
member can speak as someone else, as the bot or as the platform.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from nonebot.adapters.onebot.v11 import Message as OBMessage

from .segments import placeholder

MAX_NAME = 32
AT_EVERYONE = frozenset({"all", "0"})
"""`at` targets meaning everyone: "all" (OneBot v11), "0" (Lagrange sends QQ's own uin 0:
LagrangeDev/Lagrange.Core Lagrange.OneBot/Message/Entity/AtSegment.cs, issue #797)."""
# `[name(12345)]`, also with full-width brackets/parentheses, at the start of a line.
# A line starts after any line break a model may read as one. Invisible characters
# (zero-width space, direction marks, soft hyphen, BOM) hide no forgery, in front of it
# or anywhere inside it: a reader does not see them, and neither does a model.
_INVISIBLE = "\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff"
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE}]")
# Blanks within a line only: a lead or gap that ran over line breaks made every line start
# of a message of blank lines rescan the rest of it (50,000 line breaks held the event loop,
# every group's messages, for minutes); a line start is found after the last break anyway.
_BLANK = "\t \x1f\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
_GAP = f"[{_BLANK}{_INVISIBLE}]*"
_LINE_START = r"(?:^|(?<=[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]))"
# Markdown's quote and list markers in front hide no forgery either: `> [群主(10001)] …` reads
# as the owner quoted, `- [群主(10001)] …` as the owner listed.
_LEAD = f"({_GAP}(?:[>＞*\\-+•·][{_BLANK}{_INVISIBLE}]*)*)"
_LABEL_LIKE = re.compile(
    rf"{_LINE_START}{_LEAD}[\[［【]([^\n\]］】]{{0,80}}?)[(（]{_GAP}(\d(?:[{_INVISIBLE}]*\d)*){_GAP}[)）]{_GAP}[\]］】]",
    re.M,
)
# A quote of another speaker's words, as `quote_marker` writes it.
_QUOTE_LIKE = re.compile(rf"{_LINE_START}{_LEAD}[\[［【]{_GAP}(回[{_INVISIBLE}]*复)", re.M)
# A platform event, as the prompt sends a notice (`[通知] …`, llm/tokens.py NOTICE_PREFIX).
# Only that form: 【通知】 is how QQ groups head their own announcements.
_NOTICE_LIKE = re.compile(rf"{_LINE_START}{_LEAD}[\[［]{_GAP}通[{_INVISIBLE}]*知{_GAP}[\]］]", re.M)


# ---- text ---------------------------------------------------------------------------
# The direction controls (UAX #9's explicit formatting characters and its marks): invisible,
# they reorder what follows them up to the paragraph's end on screen, never for the model.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_BIDI_RE = re.compile(f"[{_BIDI}]")
# What a name may not hold: brackets and parentheses (the label's own), every line break the
# label check counts as one (a card with U+2028 split its label over two lines), and the
# direction controls that turn the rest of a line around on the owner's screen.
_NAME_BREAKERS = re.compile(f"[\\[\\]［］【】()（）\t\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029{_BIDI}]")


def clean_name(name: str | None, fallback: str) -> str:
    """A display name that cannot break the label: no brackets, parentheses, line breaks or
    direction controls; one its label would show as a quote (`[回复 …`) says it is not one."""
    # str(): a malformed event may carry a number where a name belongs.
    cleaned = _NAME_BREAKERS.sub("", str(name or "")).strip()
    if _QUOTE_LIKE.match(f"[{cleaned}"):
        # A card 「回复 甲(20001)：」 made the label `[回复 甲20001：(20001)]`, a quote of 甲.
        cleaned = f"〔仿冒引用〕{cleaned}"
    return cleaned[:MAX_NAME] or fallback


def bidi_visible(text: str) -> str:
    """Chat text as the owner reads it (/回忆, /摘要, the web page): each direction control as
    `<U+202E>`. A right-to-left override reorders the rest of its line on screen while the
    model reads code points, so a member could show the owner a line another member seems
    to have said (Trojan Source, CVE-2021-42574); shown, it reorders nothing and the owner
    sees it was there. Dropped instead, the owner could not tell. Display only: what is
    stored and what the model reads keep it (R-MEM)."""
    return _BIDI_RE.sub(lambda m: f"<U+{ord(m.group()):04X}>", text)


def label(name: str | None, user_id: int | str) -> str:
    return f"[{clean_name(name, str(user_id))}({user_id})]"


def neutralise_labels(text: str) -> str:
    """Turn every label-like `[name(digits)]` and quote-like `[回复 …` at a line start into plain
    words, and a notice-like `[通知]` into the 【通知】 of a member's own announcement."""
    text = _LABEL_LIKE.sub(
        lambda m: f"{m.group(1)}（仿冒标注：{m.group(2).strip()} {_INVISIBLE_RE.sub('', m.group(3))}）", text
    )
    text = _QUOTE_LIKE.sub(lambda m: f"{m.group(1)}（仿冒引用）{_INVISIBLE_RE.sub('', m.group(2))}", text)
    return _NOTICE_LIKE.sub(lambda m: f"{m.group(1)}【通知】", text)


def render_segments(
    segments: Iterable[tuple[str, Mapping[str, Any]]], names: Mapping[str, str], *, records: bool = True
) -> str:
    """Message segments as short text: @ as `@昵称(ID)`, media as placeholders, a merged
    forward whose content is known as its record (`records`: not inside a record)."""
    out: list[str] = []
    for kind, data in segments:
        if kind == "forward" and records and isinstance(data.get("content"), list):
            out.append(forward_record(data["content"], names))
        elif kind == "text":
            out.append(str(data.get("text", "")))
        elif kind == "at":
            qq = str(data.get("qq", ""))
            if qq in AT_EVERYONE:
                out.append("@全体成员")
            else:
                out.append(f"@{clean_name(data.get('name') or names.get(qq), qq)}({qq})")
        elif kind == "reply":
            continue  # rendered from the resolved reply, see quote_marker
        else:
            out.append(placeholder(kind, data))
    return "".join(out)


# ---- merged forwards (合并转发) -------------------------------------------------------
FORWARD_CHARS = 4000
"""The most of a forwarded chat record a message keeps: a forward of thousands of nodes or
megabytes of text must not fill the model's window or the store."""


def forward_nodes(answer: Any) -> list[Any] | None:
    """The nodes of a `get_forward_msg` answer: `messages` (NapCat, LLOneBot, go-cqhttp) or
    `message` (Lagrange); None when it holds neither."""
    if isinstance(answer, Mapping):
        answer = answer.get("messages") or answer.get("message")
    return answer if isinstance(answer, list) else None


def _node_segments(said: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """A forwarded message's segments: a list of segments, or CQ codes (a `post-format:
    string` implementation); go-cqhttp gives a nested record as its list of nodes."""
    if isinstance(said, str):
        return segments_of(OBMessage(said))
    if isinstance(said, Mapping):  # one segment (OneBot v11 takes a message as one)
        said = [said]
    if not isinstance(said, list):
        return []
    if any(isinstance(s, Mapping) and ("type" not in s or s["type"] == "node") for s in said):
        return [("forward", {})]  # a record of nodes inside it: fetched, or sent (go-cqhttp)
    out: list[tuple[str, Mapping[str, Any]]] = []
    for s in said:
        if isinstance(s, str):
            out.append(("text", {"text": s}))
        elif isinstance(s, Mapping):
            out.append((str(s["type"]), _mapping(s.get("data"))))
    return out


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _node(node: Any) -> tuple[str, list[tuple[str, Mapping[str, Any]]]]:
    """A forwarded message's (sender's name, segments), from any implementation's shape: a
    `node` segment (Lagrange), a whole OB11 message (NapCat `message`, LLOneBot `content`),
    go-cqhttp's {sender, content}."""
    node = _mapping(node)
    if node.get("type") == "node":
        node = _mapping(node.get("data"))
    sender = _mapping(node.get("sender"))
    user_id = sender.get("user_id") or node.get("user_id") or node.get("uin") or ""
    name = sender.get("card") or sender.get("nickname") or node.get("nickname") or node.get("name")
    said = node.get("message") or node.get("content")
    return clean_name(name, str(user_id) or "某人"), _node_segments(said)


def forward_ref(node: Any) -> str | None:
    """The message id a sent `node` names instead of holding its content (OneBot v11 `node`
    {id}); None for a node with content."""
    node = _mapping(node)
    data = _mapping(node.get("data"))
    if node.get("type") != "node" or "content" in data or not data.get("id"):
        return None
    return str(data["id"])


def forward_record(nodes: list[Any], names: Mapping[str, str]) -> str:
    """A forwarded chat record as a quoted block, `[合并转发：` and a line per message, each
    `  昵称: 正文` indented, its own line breaks indented further: no line of it starts at
    the margin or as a label, quote or notice (neutralised), so none reads as said in this
    chat. A record inside it is `[合并转发]`; past FORWARD_CHARS the rest is counted, not kept."""
    lines: list[str] = []
    room = FORWARD_CHARS
    for node in nodes:
        name, segments = _node(node)
        said = render_segments(segments, names, records=False)[:room]  # before the regexes run
        line = f"  {name}: " + "\n    ".join(neutralise_labels(said).splitlines())
        if len(line) > room:
            if room > len(name) + 4:  # some of its words fit
                lines.append(f"{line[:room]}…")
            lines.append(f"  …（共 {len(nodes)} 条，后面的略）")
            break
        lines.append(line)
        room -= len(line)
    return "[合并转发：\n" + "\n".join(lines) + "\n]" if lines else "[合并转发]"


def excerpt(text: str, limit: int = 30) -> str:
    """The start of a message on one line."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[:limit] + "…"


# A quoted excerpt cannot close its marker and go on as another speaker's label.
_QUOTE_BRACKETS = str.maketrans("[]［］", "〔〕〔〕")


def quote_marker(name: str | None, user_id: int | str, text: str) -> str:
    return f"[回复 {clean_name(name, str(user_id))}({user_id})：{excerpt(text).translate(_QUOTE_BRACKETS)}] "


# What `labelled` writes in front of a body: the label, then a quote if there is one.
_STORED_LABEL = re.compile(r"\[([^\[\]()]*)\((\d+)\)\] (?:\[回复 [^\]]*\] )?")


def unlabelled(content: str) -> tuple[str, str, str] | None:
    """A stored user message's (name, user id, body), as `labelled` wrote it; None otherwise."""
    found = _STORED_LABEL.match(content)
    return None if found is None else (found.group(1), found.group(2), content[found.end() :])


def labelled(name: str | None, user_id: int | str, body: str, quote: str = "") -> str:
    """`[昵称(ID)] 正文`: the label first, the body unable to fake another one."""
    return f"{label(name, user_id)} {quote}{neutralise_labels(body)}"


TRAILING = "。．.！!？?，,、；;…～~"
"""What a phone's input method ends a sentence with: not part of a command's last word."""


def word_goes_on(rest: str) -> bool:
    """Whether the text right after a command's name makes it a longer word: 「/压缩包怎么解压」
    is a member asking about zip files, not /压缩; 「/摘要」「/摘要 今天」「/摘要。」 are the command,
    and so is a number typed without the space (「/限额100000」「/压缩线０.５」「/用量7天」)."""
    if not rest or rest[0].isspace() or rest[0].isdigit():  # full-width digits are digits too
        return False
    return bool(rest.rstrip().rstrip(TRAILING))


def is_empty(message: OBMessage) -> bool:
    """No segment but blank text: a malformed event (QQ cannot send an empty message)."""
    return all(seg.type == "text" and not str(seg.data.get("text", "")).strip() for seg in message)


def segments_of(message: OBMessage) -> list[tuple[str, Mapping[str, Any]]]:
    return [(seg.type, seg.data) for seg in message]
