"""OneBot v11 in and out: sessions from events, messages rendered as labelled text,
notices, when to answer, and sending replies (merged-forward when long).

Every group message is recorded as `[昵称(ID)] 正文`; the label is the real sender
(R-TPL-4), and text that imitates a label is neutralised so no member can speak as
someone else or as the bot.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from nonebot import on_message, on_notice
from nonebot.adapters.onebot.v11 import (
    Bot,
    FriendRecallNoticeEvent,
    GroupAdminNoticeEvent,
    GroupBanNoticeEvent,
    GroupDecreaseNoticeEvent,
    GroupIncreaseNoticeEvent,
    GroupMessageEvent,
    GroupRecallNoticeEvent,
    MessageEvent,
    MessageSegment,
    NoticeEvent,
    PokeNotifyEvent,
    PrivateMessageEvent,
)
from nonebot.adapters.onebot.v11 import Message as OBMessage
from nonebot.log import logger
from nonebot.message import event_preprocessor
from nonebot.params import Depends
from nonebot.typing import T_State

from . import clock, runtime
from .agent.turn import Entry
from .types import Message, SessionRecord

PLATFORM = "onebot"
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


# ---- sessions -----------------------------------------------------------------------
def group_session_id(self_id: int | str, group_id: int | str) -> str:
    return f"{PLATFORM}:{self_id}:group:{group_id}"


def private_session_id(self_id: int | str, user_id: int | str) -> str:
    return f"{PLATFORM}:{self_id}:private:{user_id}"


def group_record(self_id: int | str, group_id: int | str) -> SessionRecord:
    """A group is a multi-party `room`; memory is per bot account."""
    return SessionRecord(
        id=group_session_id(self_id, group_id),
        platform=PLATFORM,
        kind="group",
        place=f"group:{group_id}",
        room_class="room",
        created=clock.now(),
    )


def private_record(self_id: int | str, user_id: int | str) -> SessionRecord:
    return SessionRecord(
        id=private_session_id(self_id, user_id),
        platform=PLATFORM,
        kind="private",
        peer=str(user_id),
        room_class="direct",
        created=clock.now(),
    )


def entry_of(record: SessionRecord) -> Entry:
    return Entry(record.platform, record.kind)


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


def _segments(message: OBMessage) -> list[tuple[str, Mapping[str, Any]]]:
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


# ---- names --------------------------------------------------------------------------
_names: dict[str, dict[str, str]] = {}
_recording: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)


def _names_of(scope: str) -> dict[str, str]:
    return _names.setdefault(scope, {})


def bot_name() -> str:
    nicknames = runtime.get().nicknames
    return next(iter(nicknames)) if nicknames else "机器人"


async def _fill_at_names(bot: Bot, group_id: int | None, message: OBMessage, names: dict[str, str]) -> None:
    """Look up names of @-mentioned members we have not heard speak yet."""
    for seg in message:
        qq = str(seg.data.get("qq", ""))
        if seg.type != "at" or not qq.isdigit() or qq in names or seg.data.get("name"):
            continue
        if qq == bot.self_id:
            names[qq] = bot_name()
            continue
        try:
            if group_id is not None:
                info = await bot.get_group_member_info(group_id=group_id, user_id=int(qq))
                names[qq] = info.get("card") or info.get("nickname") or qq
            else:
                info = await bot.get_stranger_info(user_id=int(qq))
                names[qq] = info.get("nickname") or qq
        except Exception as err:
            logger.debug(f"memsum: no name for {qq}: {err}")
            names[qq] = qq


# ---- arrival order ------------------------------------------------------------------
# NoneBot runs the events of a burst concurrently and they reach the matchers in any
# order; a ticket taken in the event preprocessor (which still sees them in the order
# they came) lets a session's messages be stored in that order.
_ARRIVAL = "memsum_arrival"
Arrival = tuple[str, int]
"""(session id, ticket)"""


class _Arrivals:
    """Per session, the tickets of events not yet stored nor dropped."""

    def __init__(self) -> None:
        self._tickets = itertools.count()
        self._open: defaultdict[str, dict[int, asyncio.Event]] = defaultdict(dict)

    def take(self, session_id: str) -> Arrival:
        ticket = next(self._tickets)
        self._open[session_id][ticket] = asyncio.Event()
        return session_id, ticket

    async def wait_turn(self, arrival: Arrival) -> None:
        """Until every earlier event of the session is stored or dropped."""
        session_id, ticket = arrival
        for earlier, done in list(self._open.get(session_id, {}).items()):
            if earlier < ticket:
                await done.wait()

    def done(self, arrival: Arrival) -> None:
        session_id, ticket = arrival
        tickets = self._open.get(session_id)
        if tickets is None or (done := tickets.pop(ticket, None)) is None:
            return
        done.set()
        if not tickets:
            del self._open[session_id]


_arrivals = _Arrivals()


def release_arrival(state: T_State) -> None:
    """This event will not be stored (a command): later messages need not wait for it."""
    if (arrival := state.get(_ARRIVAL)) is not None:
        _arrivals.done(arrival)


async def _arrival_ticket(bot: Bot, event: MessageEvent, state: T_State) -> AsyncIterator[None]:
    if isinstance(event, GroupMessageEvent):
        sid = group_session_id(bot.self_id, event.group_id)
    else:
        sid = private_session_id(bot.self_id, event.user_id)
    state[_ARRIVAL] = arrival = _arrivals.take(sid)
    try:
        yield
    finally:  # on the event's own exit stack: released however its handling ends
        _arrivals.done(arrival)


# ---- recording and answering --------------------------------------------------------
async def record_message(
    bot: Bot, event: MessageEvent, arrival: Arrival | None = None
) -> tuple[SessionRecord, Message]:
    """Store one message event as a user message of its session, after those that came before it."""
    rt = runtime.get()
    if isinstance(event, GroupMessageEvent):
        record = group_record(bot.self_id, event.group_id)
        group_id: int | None = event.group_id
    else:
        record, group_id = private_record(bot.self_id, event.user_id), None
    try:
        if arrival is not None:
            await _arrivals.wait_turn(arrival)
        async with _recording[record.id]:  # FIFO: a name look-up must not let a later message overtake
            return record, await _record_locked(rt, bot, event, record, group_id)
    finally:
        if arrival is not None:
            _arrivals.done(arrival)


async def _record_locked(
    rt: runtime.Runtime,
    bot: Bot,
    event: MessageEvent,
    record: SessionRecord,
    group_id: int | None,
) -> Message:
    names = _names_of(record.id)
    name = event.sender.card or event.sender.nickname
    if isinstance(event, GroupMessageEvent) and event.anonymous is not None:
        name = f"匿名 {event.anonymous.name}"  # every anonymous member shares one user id
    names[str(event.user_id)] = clean_name(name, str(event.user_id))
    await _fill_at_names(bot, group_id, event.original_message, names)
    quote = ""
    if event.reply is not None:
        sender = event.reply.sender
        is_bot = str(sender.user_id) == bot.self_id
        reply_name = bot_name() if is_bot else (sender.card or sender.nickname)
        quote = quote_marker(
            reply_name, sender.user_id or 0, render_segments(_segments(event.reply.message), names)
        )
    body = render_segments(_segments(event.original_message), names)
    msg = Message(
        role="user",
        content=labelled(name, event.user_id, body, quote),
        name=str(event.user_id),
        ts=clock.now(),
        metadata={"message_id": event.message_id, "user_id": event.user_id},
    )
    return await rt.agent.record(record, msg)


async def record_notice(bot: Bot, event: NoticeEvent) -> Message | None:
    """Store a platform notice worth keeping as a notice message of its session; never answered."""
    group_id = getattr(event, "group_id", None)
    user_id = getattr(event, "user_id", None)
    if group_id:
        record = group_record(bot.self_id, group_id)
    elif user_id:
        record = private_record(bot.self_id, user_id)
    else:
        return None
    names = _names_of(record.id)
    # A poke at the bot must read as one: the model knows itself by its nickname, not its QQ number.
    names.setdefault(bot.self_id, bot_name())
    text = notice_text(event, names)
    if text is None:
        return None
    return await runtime.get().agent.record(record, Message(role="notice", content=text, ts=clock.now()))


def _replier(bot: Bot, event: MessageEvent):
    async def send(text: str) -> None:
        await send_reply(bot, event, text, quote=isinstance(event, GroupMessageEvent))

    return send


async def send_reply(bot: Bot, event: MessageEvent, text: str, *, quote: bool = False) -> None:
    """Plain text; in groups a long text goes out as a merged-forward message.

    `quote`: the answer quotes the message it answers, so a busy group sees to whom.
    """
    threshold = runtime.get().config.memsum_forward_threshold
    if isinstance(event, GroupMessageEvent) and threshold and len(text) > threshold:
        # Content as a text segment: implementations parse a string as CQ codes, and a
        # model told to repeat `[CQ:at,qq=all]` must not make the bot @ everyone.
        nodes = [
            {
                "type": "node",
                "data": {
                    "name": "记忆助手",
                    "uin": bot.self_id,
                    "content": [{"type": "text", "data": {"text": part}}],
                },
            }
            for part in _split(text, 1500)
        ]
        try:
            await bot.call_api("send_group_forward_msg", group_id=event.group_id, messages=nodes)
            return
        except Exception as err:
            logger.info(f"memsum: merged-forward not available ({type(err).__name__}); sending plain text")
    for i, part in enumerate(_split(text, 3000)):
        if quote and i == 0:
            await bot.send(event, MessageSegment.reply(event.message_id) + part)
        else:
            await bot.send(event, part)


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def register_matchers(priority: int) -> None:
    """Recording and chat sit below the commands, which block, so commands never get recorded."""
    chat = on_message(priority=priority, block=False)
    notices = on_notice(priority=priority, block=False)

    @event_preprocessor
    async def _(_: None = Depends(_arrival_ticket)) -> None:
        """Takes the arrival ticket of every message event."""

    @chat.handle()
    async def _(bot: Bot, event: MessageEvent, state: T_State) -> None:
        if not isinstance(event, GroupMessageEvent | PrivateMessageEvent):
            return
        if str(event.user_id) == bot.self_id:
            return  # the bot's own message echoed back: already stored as an assistant message
        if is_empty(event.original_message) and event.reply is None:
            return  # a malformed event with nothing in it: nothing said, nothing to answer
        record, msg = await record_message(bot, event, state.get(_ARRIVAL))
        if isinstance(event, PrivateMessageEvent) or event.is_tome():
            runtime.get().agent.request_turn(
                record.id, _replier(bot, event), entry_of(record), trigger=msg.id
            )

    @notices.handle()
    async def _(bot: Bot, event: NoticeEvent) -> None:
        await record_notice(bot, event)
