"""Recording: a message event or a notice becomes a message of its session, in the
order the session's events arrived.

`record_message` is the one entry point for a message, whether it came live or is
fetched later (history backfill builds the same `GroupMessageEvent` / `PrivateMessageEvent`
from the implementation's payload and passes it here).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, MessageEvent, MessageSegment, NoticeEvent
from nonebot.adapters.onebot.v11 import Message as OBMessage
from nonebot.adapters.onebot.v11.event import Reply, Sender
from nonebot.log import logger

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.errors import StoreError
from nonebot_plugin_memsum.types import QUOTE_OF_KEY, WITHDRAWN_TEXT, Message, SessionRecord

from . import names, recovery
from .notices import card_change, notice_text, people, withdrawn_id
from .render import (
    AT_EVERYONE,
    excerpt,
    forward_nodes,
    forward_ref,
    labelled,
    neutralise_labels,
    quote_marker,
    render_segments,
    segments_of,
    unlabelled,
)
from .sessions import group_record, private_record, private_session_id
from .state import Arrival


def record_of(bot: Bot, event: MessageEvent) -> tuple[SessionRecord, int | None]:
    """The event's session, and its group (None in a private chat)."""
    if isinstance(event, GroupMessageEvent):
        return group_record(bot.self_id, event.group_id), event.group_id
    return private_record(bot.self_id, peer_of(event.self_id, event) or event.user_id), None


def peer_of(self_id: int | str, event: MessageEvent) -> int | None:
    """The other side of a private message: its sender; for one the bot account sent, its
    `target_id` (NapCat, LLOneBot), None when the implementation did not say."""
    if str(event.user_id) != str(self_id):
        return event.user_id
    target = getattr(event, "target_id", None)
    return int(str(target)) if str(target or "").isdigit() and str(target) != str(self_id) else None


NAPCAT_NO_GROUP = 284840486
"""NapCat's `group_id` of a temporary session whose group it could not look up
(NapNeko/NapCatQQ packages/napcat-onebot/api/msg.ts `handleTempGroupMessage`: 「兜底数据」 when
`getTempChatInfo` fails); QQ's own placeholder group of merged forwards, no group of the account."""


TEMP_GROUP_KEY = "temp_group"
"""Message metadata: the group of a temporary session's message (`temp_group`), so an answer
resumed after a restart is sent from it as the live one would be."""


def temp_group(event: MessageEvent) -> int | None:
    """The group a private message's temporary session came from, as the implementation put it
    in `group_id` (NapCat; OneBot v11 calls such a message's `sub_type` `group`); None for any
    other message, and for NapCat's placeholder."""
    if isinstance(event, GroupMessageEvent):
        return None
    value = str(getattr(event, "group_id", None) or "").strip()
    return int(value) if value.isdigit() and int(value) not in (0, NAPCAT_NO_GROUP) else None


async def record_message(
    bot: Bot,
    event: MessageEvent,
    arrival: Arrival | None = None,
    *,
    addressed: bool = False,
    said_at: float | None = None,
    fetched: bool = False,
    by_bot: bool = False,
) -> tuple[SessionRecord, Message | None]:
    """Store one message event as a user message of its session, after those that came
    before it: live ones after the history fetched on connect (`fetched`: one of those).
    `by_bot`: the bot account said it (said.py): stored as the assistant's.

    `addressed`: it asks the bot (a crash before the answer leaves it for the next start);
    `said_at`: the platform's time of a fetched message. None when the message (same
    platform id) is stored already: fetched and then received live, or the other way round.
    A message the store refused (a full disk, the database server gone) is said in the log
    once a minute; then a fetched one gives None and a live one raises the StoreError.
    """
    rt = runtime.get()
    record, group_id = record_of(bot, event)
    try:
        if not fetched:
            # FIFO here too: a message that waited for the backfill must not be overtaken
            # by a later one that found it done.
            async with rt.onebot.recording.hold(f"backfill:{record.id}"):
                await recovery.wait_backfilled(bot, record.id)
                refusals = rt.onebot.refusals
                if record.id in refusals.places and not refusals.total:  # it stores: what it refused first
                    await recovery.refill(bot, record.id)
        if arrival is not None:
            await rt.onebot.arrivals.wait_turn(arrival)
        # FIFO: a name look-up must not let a later message overtake.
        async with rt.onebot.recording.hold(record.id):
            if by_bot:
                msg = await bot_message_of(bot, event, record.id, group_id, said_at=said_at)
            else:
                msg = await message_of(bot, event, record.id, group_id, addressed=addressed, said_at=said_at)
            try:
                stored = await rt.agent.record_once(record, msg)
            except StoreError as err:
                note_refused(err, record.id, msg.ts)
                if fetched:
                    return record, None
                raise  # a live question is told that the bot cannot answer now (matchers.py)
            if rt.onebot.refusals.total:
                refilled = len(rt.onebot.refusals.places)
                logger.warning(
                    f"memsum: messages are stored again; {rt.onebot.refusals.stored()} were not"
                    + (f"; fetching them again in {refilled} sessions" if refilled else "")
                )
                recovery.refill_all()
            return record, stored
    finally:
        if arrival is not None:
            rt.onebot.arrivals.done(arrival)


def note_refused(err: StoreError, session_id: str | None = None, said_at: float = 0.0) -> None:
    """One event the store refused (a full disk, a database server gone away): counted, and
    said in the log once a minute, not with a traceback each. A message's session is noted:
    once the store stores again, what it said meanwhile is fetched again (recovery.refill)."""
    rt = runtime.get()
    refusals = rt.onebot.refusals
    if not rt.config.memsum_backfill_count:
        session_id = None  # no history to fetch it from
    if refusals.refused(time.monotonic(), session_id, said_at or clock.now()):
        logger.error(
            f"memsum: cannot store messages in the database {rt.store}: {err};"
            f" {refusals.total} not stored so far"
        )


async def message_of(
    bot: Bot,
    event: MessageEvent,
    scope: str,
    group_id: int | None,
    *,
    addressed: bool = False,
    said_at: float | None = None,
) -> Message:
    """The event as the user message the model will read: `[昵称(ID)] 正文`, with its
    platform id (`record_message` says what `addressed` and `said_at` are)."""
    name = event.sender.card or event.sender.nickname
    if isinstance(event, GroupMessageEvent) and event.anonymous is not None:
        name = f"匿名 {event.anonymous.name}"  # every anonymous member shares one user id
    names.remember(scope, event.user_id, name)
    segments = segments_of(event.original_message)
    known = await names.look_up(bot, scope, group_id, _mentioned(segments))
    quote = ""
    quoted_id = None
    if event.reply is not None:
        sender = event.reply.sender
        is_bot = str(sender.user_id) == bot.self_id
        reply_name = names.bot_name() if is_bot else (sender.card or sender.nickname)
        quoted = segments_of(event.reply.message)
        known |= names.known(bot, scope, _mentioned(quoted))
        said = render_segments(quoted, known)
        if await _withdrawn(scope, event.reply.message_id):  # the implementation may still hold it
            said = WITHDRAWN_TEXT
        quote = quote_marker(reply_name, sender.user_id or 0, said)
        quoted_id = platform_id(event.reply.message_id)
    body = render_segments(segments, known)
    # The quoted message's id: its withdrawal later masks the quote (Store.mark_withdrawn).
    quote_of = {QUOTE_OF_KEY: quoted_id} if quoted_id is not None else {}
    temp = {TEMP_GROUP_KEY: group} if (group := temp_group(event)) is not None else {}
    return Message(
        role="user",
        content=labelled(name, event.user_id, body, quote),
        name=str(event.user_id),
        ts=said_at or clock.now(),
        metadata={"message_id": event.message_id, "user_id": event.user_id, **quote_of, **temp},
        platform_id=platform_id(event.message_id),
        addressed=addressed,
    )


async def bot_message_of(
    bot: Bot, event: MessageEvent, scope: str, group_id: int | None, *, said_at: float | None = None
) -> Message:
    """What the bot account said, not through this plugin, as the assistant message the model
    will read: no label, as its own answers (a quote is left out as well). `said_at`: the
    platform's time of a fetched one."""
    segments = segments_of(event.original_message)
    known = await names.look_up(bot, scope, group_id, _mentioned(segments))
    return Message(
        role="assistant",
        # Another plugin may repeat what a member wrote: no label in it speaks for anyone.
        content=neutralise_labels(render_segments(segments, known)),
        ts=said_at or clock.now(),
        metadata={"message_id": event.message_id},
        platform_id=platform_id(event.message_id),
    )


def platform_id(message_id: object) -> str | None:
    """A message's platform id as stored; None for 0, which is no id (Lagrange.OneBot's sends
    until 2024-02, its hash of a message whose sequence and random id both end in 0x0000):
    two messages under 0 are two messages, and no withdrawal, quote or fetch names one by it."""
    value = str(message_id).strip()
    return None if value in ("", "0") else value


async def _withdrawn(scope: str, message_id: int) -> bool:
    """Whether the session's stored message with this platform id was withdrawn (撤回): a
    later reply's quote then shows the placeholder, as QQ's clients do, not its text."""
    try:
        stored = await runtime.get().store.by_platform_id(scope, str(message_id))
    except StoreError:
        return False  # the message's own write fails next and says so
    return stored is not None and stored.withdrawn


def drop_foreign_quote(bot: Bot, event: MessageEvent) -> None:
    """Forget a quote the implementation resolved to a message of another chat (NapCat's
    message ids are global, and `get_msg` finds any of them; a QQ client cannot make such
    a reply, a crafted one can): its words are not shown here, and quoting the bot there
    does not ask it here (`to_me` again without the quote, as `recovery.addresses_bot` says)."""
    reply = event.reply
    if reply is None:
        return
    if isinstance(event, GroupMessageEvent):
        where = getattr(reply, "group_id", None)  # not in OneBot v11's get_msg; NapCat adds it
        foreign = reply.message_type == "private" or (where is not None and str(where) != str(event.group_id))
    else:
        speakers = {str(event.user_id), bot.self_id}
        foreign = reply.message_type == "group" or str(reply.sender.user_id) not in speakers
    if foreign:
        event.reply = None
        event.to_me = recovery.addresses_bot(event, bot.self_id, runtime.get().nicknames)


async def fill_forgotten_quote(bot: Bot, event: MessageEvent) -> None:
    """The quote of a message the implementation no longer holds (its `get_msg` failed, so
    the adapter left `event.reply` empty: NapCat and Lagrange keep a bounded cache), from the
    session's own store: a member's message, or an answer of the bot (`send.py` notes the id
    it went out under), which then asks the bot as a live reply to it does. Nothing when the
    store has not got it either."""
    if event.reply is not None:
        return
    segment = next((seg for seg in event.original_message if seg.type == "reply"), None)
    quoted_id = str(segment.data.get("id") or "") if segment is not None else ""
    if quoted_id in ("", "0"):  # 0 is no message: Lagrange's reply id in a private chat (issue #847)
        return
    stored = await runtime.get().store.by_platform_id(record_of(bot, event)[0].id, quoted_id)
    if stored is None or (said := _speaker(bot, stored)) is None:
        return
    name, user_id, body = said
    event.reply = Reply(
        time=int(stored.ts or 0),
        message_type=event.message_type,
        message_id=int(quoted_id) if quoted_id.lstrip("-").isdigit() else 0,
        real_id=int(quoted_id) if quoted_id.lstrip("-").isdigit() else 0,
        sender=Sender(user_id=int(user_id), nickname=name),
        message=OBMessage(MessageSegment.text(body)),  # as text: no CQ code in it is parsed
    )
    if stored.role == "assistant":
        event.to_me = True


def _speaker(bot: Bot, stored: Message) -> tuple[str, str, str] | None:
    """A stored message's (name, user id, body): a member's, or an answer of the bot; None
    for anything else (a notice)."""
    if stored.role == "assistant":
        name, user_id, body = names.bot_name(), bot.self_id, stored.content
    elif stored.role == "user" and (parts := unlabelled(stored.content)) is not None:
        name, user_id, body = parts
    else:
        return None
    return name, user_id, WITHDRAWN_TEXT if stored.withdrawn else body


async def fill_forward_refs(bot: Bot, event: MessageEvent) -> None:
    """The nodes of a merged forward the bot account sent that name a message by its id
    instead of holding it (OneBot v11 `node` {id}), from the session's store; one it has
    not got is left out, and a forward left with none is `[合并转发]`."""
    sid = record_of(bot, event)[0].id
    for segment in event.original_message:
        nodes = segment.data.get("content") if segment.type == "forward" else None
        if not isinstance(nodes, list) or all(forward_ref(n) is None for n in nodes):
            continue
        filled: list[Any] = []
        for node in nodes:
            if (ref := forward_ref(node)) is None:
                filled.append(node)
                continue
            try:
                stored = await runtime.get().store.by_platform_id(sid, ref)
            except StoreError:
                stored = None
            if stored is not None and (said := _speaker(bot, stored)) is not None:
                name, user_id, body = said
                filled.append(
                    {
                        "user_id": user_id,
                        "nickname": name,
                        "content": [{"type": "text", "data": {"text": body}}],
                    }
                )
        if filled:
            segment.data["content"] = filled
        else:
            del segment.data["content"]


FORWARD_TIMEOUT = 5.0
"""How long a merged forward's content is waited for: the session's later messages wait too."""


async def fill_forward(bot: Bot, message: OBMessage) -> bool:
    """The content of each merged forward (合并转发) the implementation did not send with it
    (NapCat sends it only with `parseMultMsg`; Lagrange, LLOneBot and go-cqhttp never), asked
    with `get_forward_msg` (NapCat and LLOneBot read `message_id` or `id`, Lagrange `id`,
    go-cqhttp `message_id`), into the segment's `content` as NapCat sends it. Unanswered
    within FORWARD_TIMEOUT, refused or not understood: the segment stays `[合并转发]`.
    Whether an ask timed out (the backfill asks no more)."""
    timed_out = False
    for segment in message:
        if segment.type != "forward" or "content" in segment.data:
            continue
        forward_id = str(segment.data.get("id") or "")
        if not forward_id:
            continue
        try:
            async with asyncio.timeout(FORWARD_TIMEOUT):
                answer = await bot.call_api("get_forward_msg", id=forward_id, message_id=forward_id)
        except Exception as err:  # unsupported, expired, timed out: the placeholder
            logger.debug(f"memsum: merged forward {forward_id} not available: {type(err).__name__} {err}")
            timed_out = timed_out or isinstance(err, TimeoutError)
            continue
        if (nodes := forward_nodes(answer)) is not None:
            segment.data["content"] = nodes
    return timed_out


def _mentioned(segments: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The QQ numbers @-mentioned without a name of their own."""
    return [
        qq
        for kind, data in segments
        if kind == "at"
        and (qq := str(data.get("qq", ""))).isdigit()
        and qq not in AT_EVERYONE
        and not data.get("name")
    ]


def notice_record(self_id: int | str, payload: Mapping[str, Any]) -> tuple[SessionRecord, int | None] | None:
    """A notice's session (its group, else the private peer) and group, or None."""
    group_id = payload.get("group_id")
    user_id = payload.get("user_id")
    if group_id:
        return group_record(self_id, group_id), int(group_id)
    if user_id:
        return private_record(self_id, user_id), None
    return None


async def record_notice(bot: Bot, event: NoticeEvent, arrival: Arrival | None = None) -> Message | None:
    """Store a platform notice worth keeping as a notice message of its session, in arrival
    order, naming people as the group sees them; never answered. A card change only
    updates the name cache."""
    rt = runtime.get()
    payload = event.model_dump()
    try:
        where = notice_record(bot.self_id, payload)
        if where is None:
            return None
        record, group_id = where
        # A withdrawn message is marked even where nothing is recorded now: it may have
        # been stored before (recall then no longer repeats it into the chat).
        withdrawn = withdrawn_id(payload)
        if group_id is None and record.peer == bot.self_id:
            # The account withdrew its own private message (the owner typing on it, another
            # plugin's delete_msg): NapCat and LLOneBot name the sender, not the friend. Its
            # session is the one that stored the message; none: nothing to mark, nowhere to say it.
            found = withdrawn and await rt.store.session_of_platform_id(
                private_session_id(bot.self_id, ""), withdrawn
            )
            if not found:
                return None
            record = private_record(bot.self_id, found.removeprefix(private_session_id(bot.self_id, "")))
        off = await rt.controls.mode(record) == "off"
        change = card_change(payload)
        if withdrawn is None and (off or (change is None and notice_text(payload, {}) is None)):
            return None  # noise: no look-ups, no waiting
        # In arrival order, a card change too: an earlier event keeps the name it was said under.
        if arrival is not None:
            await rt.onebot.arrivals.wait_turn(arrival)
        async with rt.onebot.recording.hold(record.id):
            if withdrawn is not None:
                await rt.mark_withdrawn(record.id, withdrawn)  # after the message, in order
                rt.onebot.withdrawn[(record.id, withdrawn)] = None
                if off:
                    return None
            if change is not None:
                uid, card = change
                if card:
                    names.remember(record.id, uid, card)
                else:
                    rt.onebot.names.forget(record.id, uid)  # the nickname shows again: look it up
                return None
            known = await names.look_up(bot, record.id, group_id, people(payload))
            said = await _essence_excerpt(bot, record.id, payload, known)
            text = notice_text(payload, known, said)
            if text is None:
                return None
            return await rt.agent.record(record, Message(role="notice", content=text, ts=clock.now()))
    except StoreError as err:  # its mode or its write: the database cannot be reached
        note_refused(err)
        return None
    finally:
        if arrival is not None:
            rt.onebot.arrivals.done(arrival)


async def _essence_excerpt(bot: Bot, scope: str, payload: Mapping[str, Any], known: dict[str, str]) -> str:
    """The start of the message an essence notice is about, asked of the implementation."""
    if payload.get("notice_type") != "essence" or not payload.get("message_id"):
        return ""
    try:
        found = await bot.get_msg(message_id=int(payload["message_id"]))
        said = found.get("message") or []
        if isinstance(said, str):  # go-cqhttp's `post-format: string` answers get_msg in CQ codes too
            segments = segments_of(OBMessage(said))
        else:
            segments = [(str(s.get("type")), s.get("data") or {}) for s in said]
    except Exception as err:
        logger.debug(f"memsum: essence message not available: {err}")
        return ""
    known |= names.known(bot, scope, _mentioned(segments))
    return neutralise_labels(excerpt(render_segments(segments, known)))
