"""Events rendered as text: pure functions, no I/O.

Every group message is recorded as `[昵称(ID)] 正文`; the label is the real sender
(R-TPL-4), and text that imitates a label is neutralised so no member can speak as
someone else or as the bot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from nonebot.adapters.onebot.v11 import (
    FriendRecallNoticeEvent,
    GroupAdminNoticeEvent,
    GroupBanNoticeEvent,
    GroupDecreaseNoticeEvent,
    GroupIncreaseNoticeEvent,
    GroupRecallNoticeEvent,
    NoticeEvent,
    PokeNotifyEvent,
)
from nonebot.adapters.onebot.v11 import Message as OBMessage

MAX_NAME = 32
_PLACEHOLDERS = {
    "image": "[图片]",
    "face": "[表情]",
    "mface": "[表情]",
    "marketface": "[表情]",
    "record": "[语音]",
    "video": "[视频]",
    "file": "[文件]",
    "forward": "[合并转发]",
    "node": "[合并转发]",
    "json": "[卡片]",
    "xml": "[卡片]",
    "share": "[链接]",
    "music": "[音乐]",
    "location": "[位置]",
    "contact": "[名片]",
    "poke": "[戳一戳]",
    "dice": "[骰子]",
    "rps": "[猜拳]",
    "markdown": "[消息]",
}
# `[name(12345)]`, also with full-width brackets/parentheses, at the start of a line.
# A line starts after any line break a model may read as one, and invisible characters
# (zero-width space, direction marks, BOM) in front do not hide a forgery.
_LINE_START = r"(?:^|(?<=[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]))"
_LEAD = r"([\s\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]*)"
_LABEL_LIKE = re.compile(
    _LINE_START + _LEAD + r"[\[［【]([^\n\]］】]{0,80}?)[(（]\s*(\d+)\s*[)）]\s*[\]］】]", re.M
)
# A quote of another speaker's words, as `quote_marker` writes it.
_QUOTE_LIKE = re.compile(_LINE_START + _LEAD + r"[\[［【]\s*(回复)", re.M)


# ---- text ---------------------------------------------------------------------------
def clean_name(name: str | None, fallback: str) -> str:
    """A display name that cannot break the label: no brackets, parentheses or newlines."""
    # str(): a malformed event may carry a number where a name belongs.
    cleaned = re.sub(r"[\[\]［］【】()（）\r\n\t]", "", str(name or "")).strip()[:MAX_NAME]
    return cleaned or fallback


def label(name: str | None, user_id: int | str) -> str:
    return f"[{clean_name(name, str(user_id))}({user_id})]"


def neutralise_labels(text: str) -> str:
    """Turn every label-like `[name(digits)]` and quote-like `[回复 …` at a line start into plain words."""
    text = _LABEL_LIKE.sub(lambda m: f"{m.group(1)}（仿冒标注：{m.group(2).strip()} {m.group(3)}）", text)
    return _QUOTE_LIKE.sub(lambda m: f"{m.group(1)}（仿冒引用）{m.group(2)}", text)


def render_segments(segments: Iterable[tuple[str, Mapping[str, Any]]], names: Mapping[str, str]) -> str:
    """Message segments as short text: @ as `@昵称(ID)`, media as placeholders."""
    out: list[str] = []
    for kind, data in segments:
        if kind == "text":
            out.append(str(data.get("text", "")))
        elif kind == "at":
            qq = str(data.get("qq", ""))
            if qq == "all":
                out.append("@全体成员")
            else:
                out.append(f"@{clean_name(data.get('name') or names.get(qq), qq)}({qq})")
        elif kind == "reply":
            continue  # rendered from the resolved reply, see quote_marker
        else:
            out.append(_PLACEHOLDERS.get(kind, f"[{kind}]"))
    return "".join(out)


def quote_marker(name: str | None, user_id: int | str, text: str) -> str:
    excerpt = text.replace("\n", " ").strip()
    excerpt = excerpt if len(excerpt) <= 30 else excerpt[:30] + "…"
    return f"[回复 {clean_name(name, str(user_id))}({user_id})：{excerpt}] "


def labelled(name: str | None, user_id: int | str, body: str, quote: str = "") -> str:
    """`[昵称(ID)] 正文`: the label first, the body unable to fake another one."""
    return f"{label(name, user_id)} {quote}{neutralise_labels(body)}"


def is_empty(message: OBMessage) -> bool:
    """No segment but blank text: a malformed event (QQ cannot send an empty message)."""
    return all(seg.type == "text" and not str(seg.data.get("text", "")).strip() for seg in message)


def segments_of(message: OBMessage) -> list[tuple[str, Mapping[str, Any]]]:
    return [(seg.type, seg.data) for seg in message]


def notice_text(event: NoticeEvent, names: Mapping[str, str]) -> str | None:
    """A platform notice as a short line, or None for notices not worth keeping."""

    def who(uid: int) -> str:
        return f"{clean_name(names.get(str(uid)), str(uid))}({uid})"

    if isinstance(event, GroupIncreaseNoticeEvent):
        return f"{who(event.user_id)} 加入了本群"
    if isinstance(event, GroupDecreaseNoticeEvent):
        verb = {"kick": "被移出了本群", "kick_me": "把机器人移出了本群"}.get(event.sub_type, "离开了本群")
        return f"{who(event.user_id)} {verb}"
    if isinstance(event, GroupRecallNoticeEvent):
        if event.operator_id != event.user_id:
            return f"{who(event.operator_id)} 撤回了 {who(event.user_id)} 的一条消息"
        return f"{who(event.user_id)} 撤回了一条消息"
    if isinstance(event, FriendRecallNoticeEvent):
        return f"{who(event.user_id)} 撤回了一条消息"
    if isinstance(event, PokeNotifyEvent):
        return f"{who(event.user_id)} 戳了戳 {who(event.target_id)}"
    if isinstance(event, GroupAdminNoticeEvent):
        return f"{who(event.user_id)} {'成为' if event.sub_type == 'set' else '不再是'}管理员"
    if isinstance(event, GroupBanNoticeEvent):
        if event.sub_type == "lift_ban" or event.duration == 0:
            return f"{who(event.user_id)} 被解除禁言"
        return f"{who(event.user_id)} 被禁言 {event.duration} 秒"
    return None
