"""Platform notices as one short line each: pure, no I/O.

Kept (they change what the group is, who is in it, or what it values): joins, leaves and
kicks, recalls, pokes, admin changes, mutes (one member or the whole group), a message
set as essence or removed from it, a new group name, a new member title, a group honour.
Not kept (noise for a memory): emoji reactions, input status, profile likes, red-packet
luck, file-upload notices (the file arrives as a message with its name), grey tips,
online-file and client-status notices, and anything not listed. A card change is not a
line either: it updates the name cache (see `card_change`).

Payload shapes: OneBot v11 (botuniverse/onebot-11 event/notice.md), NapCat
(NapNeko/NapCatQQ packages/napcat-onebot/event/notice/*.ts), Lagrange (LagrangeDev/
Lagrange.Core v1 Lagrange.OneBot/Core/Entity/Notify/*.cs), LLOneBot (LLOneBot/LLOneBot
src/onebot11/event/notice/*.ts), go-cqhttp (Mrs4s/go-cqhttp docs/cqhttp.md, 事件).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .render import clean_name
from .segments import honour_name, short

_PEOPLE = ("user_id", "operator_id", "target_id", "sender_id")


def _id(payload: Mapping[str, Any], key: str) -> str:
    """A QQ number from the payload, or "" when absent or 0 (no one)."""
    value = str(payload.get(key) or "").strip()
    return "" if value in ("", "0") else value


def people(payload: Mapping[str, Any]) -> list[str]:
    """The QQ numbers a notice names, each once."""
    out: list[str] = []
    for key in _PEOPLE:
        if (uid := _id(payload, key)) and uid not in out:
            out.append(uid)
    return out


def card_change(payload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(user id, new card) of a `group_card` notice; an empty card means the nickname shows again."""
    if payload.get("notice_type") != "group_card" or not (uid := _id(payload, "user_id")):
        return None
    return uid, str(payload.get("card_new") or "")


def withdrawn_id(payload: Mapping[str, Any]) -> str | None:
    """The platform id of the message a `group_recall` / `friend_recall` notice withdraws
    (OneBot v11 event/notice.md: `message_id`; Lagrange's may be negative), as the message
    was stored (`Message.platform_id`); None for any other notice."""
    if payload.get("notice_type") not in ("group_recall", "friend_recall"):
        return None
    value = payload.get("message_id")
    return None if value is None or str(value).strip() in ("", "0") else str(value).strip()


def left_group(payload: Mapping[str, Any], self_id: str) -> bool:
    """Whether the notice says the account is no longer in its group: kicked (`kick_me`), left,
    or the group disbanded (a `disband` decrease; LLOneBot's `group_dismiss`)."""
    kind, sub = payload.get("notice_type"), payload.get("sub_type")
    if kind == "group_dismiss" or (kind == "group_decrease" and sub == "disband"):
        return True
    return kind == "group_decrease" and _id(payload, "user_id") == self_id


def duration_text(seconds: int) -> str:
    """600 → 「10 分钟」, 90061 → 「1 天 1 小时 1 分钟 1 秒」."""
    parts: list[str] = []
    for unit, size in (("天", 86400), ("小时", 3600), ("分钟", 60), ("秒", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
    return " ".join(parts) or "0 秒"


def notice_text(payload: Mapping[str, Any], names: Mapping[str, str], excerpt: str = "") -> str | None:
    """A notice worth keeping as one line naming people as `名字(QQ)`; None for noise.

    `names`: QQ number → the name the group sees; `excerpt`: the text of the message an
    essence notice is about, when it could be fetched.
    """

    def who(uid: str) -> str:
        return f"{clean_name(names.get(uid), uid)}({uid})"

    kind, sub = payload.get("notice_type"), payload.get("sub_type")
    user, op = _id(payload, "user_id"), _id(payload, "operator_id")
    by = f"{who(op)} " if op and op != user else ""
    if kind == "group_increase" and user:
        if sub == "invite" and by:
            return f"{who(op)} 邀请 {who(user)} 加入了本群"
        return f"{who(user)} 加入了本群"
    if kind == "group_dismiss" and user:  # LLOneBot: the owner who dissolved it
        return f"{who(user)} 解散了本群"
    if (kind == "group_decrease" and sub == "disband") or kind == "group_dismiss":
        return "本群已被解散"
    if kind == "group_decrease" and user:
        if sub in ("kick", "kick_me"):
            return f"{who(user)} 被{f' {who(op)} ' if by else ''}移出了本群"
        return f"{who(user)} 退出了本群"
    if kind == "group_recall" and user:
        return f"{by}撤回了 {who(user)} 的一条消息" if by else f"{who(user)} 撤回了一条消息"
    if kind == "friend_recall" and user:
        return f"{who(user)} 撤回了一条消息"
    if kind == "group_admin" and user:
        return f"{who(user)} {'成为' if sub == 'set' else '不再是'}管理员"
    if kind == "group_ban":
        return _ban(payload, who, user, op)
    if kind == "essence":
        return _essence(payload, who, op, excerpt)
    if kind == "group_name_change":  # Lagrange
        return f"群名改为「{short(payload.get('name'))}」"
    if kind == "notify":
        return _notify(payload, who, sub, user)
    return None


def _ban(payload: Mapping[str, Any], who: Any, user: str, op: str) -> str | None:
    lifted = payload.get("sub_type") == "lift_ban" or not payload.get("duration")
    actor = f"{who(op)} " if op else ""
    if not user:  # the whole group (user_id 0; LLOneBot sends duration -1)
        return f"{actor}{'关闭' if lifted else '开启'}了全员禁言"
    by = f"被 {who(op)} " if op and op != user else "被"
    if lifted:
        return f"{who(user)} {by}解除禁言"
    try:
        seconds = int(payload.get("duration") or 0)
    except (TypeError, ValueError):
        seconds = 0
    return f"{who(user)} {by}禁言 {duration_text(seconds)}" if seconds > 0 else f"{who(user)} {by}禁言"


def _essence(payload: Mapping[str, Any], who: Any, op: str, excerpt: str) -> str | None:
    sender = _id(payload, "sender_id") or _id(payload, "user_id")
    whose = f"{who(sender)} 的一条消息" if sender else "一条消息"
    said = f"：「{excerpt}」" if excerpt else ""
    verb = "移出了精华" if payload.get("sub_type") == "delete" else "设为精华"
    return f"{who(op)} 把 {whose}{verb}{said}" if op else f"{whose}被{verb}{said}"


def _notify(payload: Mapping[str, Any], who: Any, sub: Any, user: str) -> str | None:
    # A private poke names the peer in user_id and the poker in sender_id (NapCat, Lagrange, go-cqhttp).
    poker = _id(payload, "sender_id") or user
    if sub == "poke" and poker:
        target = _id(payload, "target_id")
        action, suffix = _poke_words(payload)
        return f"{who(poker)} {action} {who(target) if target else ''}{suffix}".rstrip()
    if sub == "title" and user:
        return f"{who(user)} 获得了头衔「{short(payload.get('title'))}」"
    if sub == "group_name":  # NapCat
        changer = f"{who(user)} " if user else ""
        return f"{changer}把群名改为「{short(payload.get('name_new'))}」"
    if sub == "honor" and user:
        return f"{who(user)} 获得了群荣誉「{honour_name(payload.get('honor_type'))}」"
    return None  # input_status, profile_like, lucky_king, poke_recall, gray_tip, …


def _poke_words(payload: Mapping[str, Any]) -> tuple[str, str]:
    """The poke's own words: Lagrange `action`/`suffix`; NapCat the plain-text parts of `raw_info`."""
    action, suffix = short(payload.get("action"), 12), short(payload.get("suffix"), 24)
    raw = payload.get("raw_info")
    if not action and isinstance(raw, list):
        words = [
            str(p.get("txt"))
            for p in raw
            if isinstance(p, Mapping) and p.get("type") == "nor" and p.get("txt")
        ]
        if words:
            action, suffix = short(words[0], 12), short("".join(words[1:]), 24)
    return action or "戳了戳", suffix
