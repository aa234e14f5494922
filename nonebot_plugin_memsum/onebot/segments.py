"""Non-text message segments as short placeholders: pure, no I/O.

A placeholder keeps what a reader of the chat would see and nothing else: a sticker's
own summary (「[动画表情]」, 「[doge]」), a file's name, a card's title. Never a URL
(download links carry tokens), never raw JSON or XML, never a line break or a bracket
of the sender's choosing (a summary or a card title is text the sender controls).

Segment shapes: OneBot v11 (botuniverse/onebot-11 message/segment.md), NapCat
(NapNeko/NapCatQQ packages/napcat-onebot/types/message.ts and api/msg.ts), Lagrange
(LagrangeDev/Lagrange.Core v1 Lagrange.OneBot/Message/Entity/*Segment.cs), LLOneBot
(LLOneBot/LLOneBot src/onebot11/types.ts), go-cqhttp (Mrs4s/go-cqhttp docs/cqhttp.md).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from typing import Any

SHORT = 40
"""The longest a title or summary may be inside a placeholder."""
FILE_NAME = 255
"""The longest a file's name is kept: whole (file systems allow 255), as the group sees it and
later searches it (「教务处」「docx」 at the end of a notice's 43-character name)."""

_URL = re.compile(r"(?:https?|ftp|file)://\S*|\bwww\.\S+", re.I)
_BREAKERS = re.compile(r"[\[\]［］【】\r\n\t\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
_FIXED = {
    "face": "[表情]",
    "record": "[语音]",
    "video": "[视频]",
    "forward": "[合并转发]",
    "node": "[合并转发]",
    "poke": "[戳一戳]",
    "shake": "[窗口抖动]",
    "rps": "[猜拳]",
    "gift": "[礼物]",
    "redbag": "[红包]",
    "flashtransfer": "[文件]",
    "keyboard": "",  # the buttons under a bot's markdown message: nothing said
}
_CARD_PARTS = (("detail_1", "title", "desc"), ("news", "tag", "title"), ("music", "tag", "title"))
"""(meta key, the source's field, the subject's field) of the card kinds QQ sends."""
_HONOURS = {"talkative": "龙王", "performer": "群聊之火", "emotion": "快乐源泉", "legend": "群聊炽焰"}


def short(text: Any, limit: int = SHORT) -> str:
    """Text safe inside a placeholder: no URL, bracket or line break; at most `limit` characters."""
    cleaned = _BREAKERS.sub(" ", _URL.sub("", str(text or "")))
    cleaned = re.sub(r"\s+", " ", cleaned).strip()
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "…"


def _tagged(tag: str, detail: Any, limit: int = SHORT) -> str:
    detail = short(detail, limit)
    return f"[{tag}: {detail}]" if detail else f"[{tag}]"


def _summary(data: Mapping[str, Any]) -> str:
    """A sticker's own summary, 「[动画表情]」 or 「[doge]」, without its brackets."""
    return short(str(data.get("summary") or "").strip().strip("[]［］【】"))


def _image(data: Mapping[str, Any]) -> str:
    if summary := _summary(data):
        return f"[{summary}]"
    if data.get("type") == "flash":  # go-cqhttp
        return "[闪照]"
    # NapCat `sub_type`, LLOneBot and go-cqhttp `subType`: 1 is a sticker saved as an image.
    sticker = str(data.get("sub_type", data.get("subType", ""))) == "1"
    return "[动画表情]" if sticker else "[图片]"


def _file(data: Mapping[str, Any]) -> str:
    # NapCat/LLOneBot put the name in `file`, Lagrange in `file_name`, NapCat online files in `fileName`.
    name = str(data.get("name") or data.get("file_name") or data.get("fileName") or data.get("file") or "")
    if "://" in name:  # a download link, not a name
        name = ""
    name = re.split(r"[\\/]", name)[-1]
    return _tagged("文件", name, FILE_NAME)


def card_title(raw: Any) -> str:
    """What a JSON card (mini-program, share, contact) is about, from its own fields."""
    card = raw
    if isinstance(raw, str):
        try:
            card = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return ""
    if not isinstance(card, Mapping):
        return ""
    meta = card.get("meta")
    meta = meta if isinstance(meta, Mapping) else {}
    # A mini-program names the app in `title` and the thing shared in `desc` (哔哩哔哩 + the video).
    for key, head_key, body_key in (
        ("detail_1", "title", "desc"),
        ("news", "tag", "title"),
        ("music", "tag", "title"),
    ):
        part = meta.get(key)
        if isinstance(part, Mapping):
            parts = [short(part.get(head_key)), short(part.get(body_key))]
            parts = [p for i, p in enumerate(parts) if p and p not in parts[:i]]
            if parts:
                return short("：".join(parts), 2 * SHORT)
    # QQ's own one-line preview, 「[QQ小程序]标题」 or 「推荐群聊: 名字」, without its tag.
    prompt = re.sub(r"^\s*[\[【][^\]】]{0,12}[\]】]\s*", "", str(card.get("prompt") or ""))
    return short(prompt, 2 * SHORT)


def xml_title(raw: Any) -> str:
    text = str(raw or "")
    found = re.search(r"<title>([^<]*)</title>", text) or re.search(r'\bbrief="([^"]*)"', text)
    if found is None:
        return ""
    return short(re.sub(r"^\s*[\[【][^\]】]{0,12}[\]】]\s*", "", html.unescape(found.group(1))), 2 * SHORT)


def placeholder(kind: str, data: Mapping[str, Any]) -> str:
    """A non-text, non-@, non-reply segment as short text."""
    if kind in _FIXED:
        return _FIXED[kind]
    if kind == "image":
        return _image(data)
    if kind in ("mface", "marketface"):
        return f"[{_summary(data) or '表情'}]"
    if kind in ("file", "onlinefile"):
        return _file(data)
    if kind in ("json", "miniapp"):
        return _tagged("卡片", card_title(data.get("data")))
    if kind == "xml":
        return _tagged("卡片", xml_title(data.get("data")))
    if kind == "share":
        return _tagged("链接", data.get("title"))
    if kind == "music":
        return _tagged("音乐", data.get("title"))
    if kind == "location":
        return _tagged("位置", data.get("title") or data.get("content"))
    if kind == "contact":
        return _tagged("推荐群聊" if data.get("type") == "group" else "推荐好友", data.get("id"))
    if kind == "dice":
        return _tagged("骰子", data.get("result"))
    if kind == "markdown":
        # A bot's markdown message: its words, without image links and markup.
        content = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", str(data.get("content") or ""))
        return _tagged("Markdown", re.sub(r"[#*_`>|~]+", " ", content))
    return f"[{short(kind, 16) or '消息'}]"


def honour_name(honour: Any) -> str:
    return _HONOURS.get(str(honour), short(honour, 16))
