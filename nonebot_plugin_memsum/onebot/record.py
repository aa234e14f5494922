"""Recording: a message event or a notice becomes a message of its session, in the
order the session's events arrived.

`record_message` is the one entry point for a message, whether it came live or is
fetched later (history backfill builds the same `GroupMessageEvent` / `PrivateMessageEvent`
from the implementation's payload and passes it here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, MessageEvent, NoticeEvent

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.types import Message, SessionRecord

from . import names
from .render import labelled, notice_text, quote_marker, render_segments, segments_of
from .sessions import group_record, private_record
from .state import Arrival


def record_of(bot: Bot, event: MessageEvent) -> tuple[SessionRecord, int | None]:
    """The event's session, and its group (None in a private chat)."""
    if isinstance(event, GroupMessageEvent):
        return group_record(bot.self_id, event.group_id), event.group_id
    return private_record(bot.self_id, event.user_id), None


async def record_message(
    bot: Bot, event: MessageEvent, arrival: Arrival | None = None
) -> tuple[SessionRecord, Message]:
    """Store one message event as a user message of its session, after those that came before it."""
    rt = runtime.get()
    record, group_id = record_of(bot, event)
    try:
        if arrival is not None:
            await rt.onebot.arrivals.wait_turn(arrival)
        # FIFO: a name look-up must not let a later message overtake.
        async with rt.onebot.recording.hold(record.id):
            msg = await message_of(bot, event, record.id, group_id)
            return record, await rt.agent.record(record, msg)
    finally:
        if arrival is not None:
            rt.onebot.arrivals.done(arrival)


async def message_of(bot: Bot, event: MessageEvent, scope: str, group_id: int | None) -> Message:
    """The event as the user message the model will read: `[昵称(ID)] 正文`."""
    name = event.sender.card or event.sender.nickname
    if isinstance(event, GroupMessageEvent) and event.anonymous is not None:
        name = f"匿名 {event.anonymous.name}"  # every anonymous member shares one user id
    names.remember(scope, event.user_id, name)
    segments = segments_of(event.original_message)
    known = await names.look_up(bot, scope, group_id, _mentioned(segments))
    quote = ""
    if event.reply is not None:
        sender = event.reply.sender
        is_bot = str(sender.user_id) == bot.self_id
        reply_name = names.bot_name() if is_bot else (sender.card or sender.nickname)
        quoted = segments_of(event.reply.message)
        known |= names.known(bot, scope, _mentioned(quoted))
        quote = quote_marker(reply_name, sender.user_id or 0, render_segments(quoted, known))
    body = render_segments(segments, known)
    return Message(
        role="user",
        content=labelled(name, event.user_id, body, quote),
        name=str(event.user_id),
        ts=clock.now(),
        metadata={"message_id": event.message_id, "user_id": event.user_id},
    )


def _mentioned(segments: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The QQ numbers @-mentioned without a name of their own."""
    return [
        qq
        for kind, data in segments
        if kind == "at" and (qq := str(data.get("qq", ""))).isdigit() and not data.get("name")
    ]


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
    if await runtime.get().controls.mode(record) == "off":
        return None
    ids = [getattr(event, f, None) for f in ("user_id", "operator_id", "target_id")]
    # A poke at the bot must read as one: the model knows itself by its nickname, not its QQ number.
    text = notice_text(event, names.known(bot, record.id, [i for i in ids if i is not None]))
    if text is None:
        return None
    return await runtime.get().agent.record(record, Message(role="notice", content=text, ts=clock.now()))
