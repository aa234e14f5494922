"""What the bot account said that this plugin did not write, stored as the bot's own
(assistant) messages of their session, in order, once, starting no turn:

- what other plugins of the same bot process send through the same Bot (a 签到 reply, a
  scheduled push): NoneBot's `Bot.on_called_api` sees each send action and the message id
  it returned;
- what the owner types on the bot's account from another client, as the implementation
  reports it: NapCat's `message_sent` (reportSelfMessage), LLOneBot's and older NapCat's
  plain `message` whose sender is the bot; the private peer is the event's `target_id`.

The plugin's own sends (`agent.turn.own_send`: its answers, stored by their turn; command
output, notices and apologies, which are no chat) are stored by nothing here; another
plugin's send is stored when its response comes. Their echoes are dropped, known by the id
the send went out under, else by their text (`state.OwnSends`): an echo that outruns the
response, or one after a response that gave no id (Lagrange.OneBot answered every send with
`message_id: 0` until 2024-02; 0 is no id, `send.sent_id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from nonebot.adapters import Bot as BaseBot
from nonebot.adapters.onebot.v11 import (
    Bot,
    Event,
    GroupMessageEvent,
    MessageEvent,
    MessageSegment,
    PrivateMessageEvent,
)
from nonebot.adapters.onebot.v11 import Message as OBMessage
from nonebot.compat import type_validate_python
from nonebot.log import logger
from nonebot.utils import DataclassEncoder

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.agent.turn import OWN_SEND
from nonebot_plugin_memsum.errors import NotStarted, StoreError

from .record import fill_forward, fill_forward_refs, note_refused, peer_of, record_message, record_of
from .render import is_empty, render_segments, segments_of
from .send import sent_id
from .sessions import entry_of, group_session_id, private_session_id
from .state import Arrival

_started = contextlib.suppress(NotStarted)
"""Nothing to do before the runtime starts (another plugin sending at start-up)."""
SEND_ACTIONS = frozenset(
    {
        "send_msg",
        "send_group_msg",
        "send_private_msg",
        "send_forward_msg",  # NapCat, go-cqhttp
        "send_group_forward_msg",
        "send_private_forward_msg",
    }
)
"""The OneBot v11 send actions and the merged-forward ones implementations add."""


def register() -> None:
    """The API hooks (NoneBot keeps them per adapter Bot class, once each)."""
    Bot.on_calling_api(_calling)
    Bot.on_called_api(_called)


# ---- sends through the Bot ------------------------------------------------------------------
def _target(self_id: str, api: str, data: Mapping[str, Any]) -> tuple[str, int | None, int] | None:
    """(message_type, group, private peer) a send action goes to; None when it names neither."""
    group_id, user_id = data.get("group_id"), data.get("user_id")
    kind = data.get("message_type")
    if kind is None:  # OneBot v11 send_msg guesses it from the ids it got
        kind = "group" if "group" in api or (group_id and "private" not in api) else "private"
    if kind == "group" and str(group_id or "").isdigit():
        return "group", int(str(group_id)), 0
    if kind == "private" and str(user_id or "").isdigit() and str(user_id) != self_id:
        return "private", None, int(str(user_id))
    return None


def _message(api: str, data: Mapping[str, Any]) -> OBMessage:
    """What a send action carries, as segments (a string is CQ codes unless `auto_escape`)."""
    if "forward" in api:  # its nodes as a received forward's `content` holds them
        nodes = _nodes(data.get("messages") or data.get("message"))  # NapCat takes either
        return OBMessage(MessageSegment("forward", {} if nodes is None else {"content": nodes}))
    raw = data.get("message", "")
    if isinstance(raw, str) and data.get("auto_escape"):
        return OBMessage(MessageSegment.text(raw))
    if isinstance(raw, Mapping):  # one segment as a dict
        raw = [raw]
    if isinstance(raw, list):  # segments as dicts, as a plugin may pass them
        raw = [
            MessageSegment(str(s.get("type")), dict(s.get("data") or {})) if isinstance(s, Mapping) else s
            for s in raw
        ]
    try:
        return OBMessage(raw)
    except Exception:  # nothing a message can be made of: nothing to remember either
        return OBMessage()


def _nodes(raw: Any) -> list[Any] | None:
    """A forward send's `node` segments as they go out (dicts, a plugin's MessageSegments);
    None when they are none."""
    try:
        nodes = json.loads(json.dumps(raw, cls=DataclassEncoder))
    except (TypeError, ValueError):
        return None
    nodes = [nodes] if isinstance(nodes, Mapping) else nodes
    return nodes if isinstance(nodes, list) and nodes else None


def echo_text(message: OBMessage) -> str:
    """What an own send and its echo both read as: rendered without names, blanks collapsed,
    a merged forward as `[合并转发]` (its echo holds its id, or the content as NapCat reads it)."""
    return _collapsed(render_segments(segments_of(message), {}, records=False))


def _collapsed(text: str) -> str:
    """`text` with each run of blanks as one space: a stored answer as its echo reads."""
    return " ".join(text.split())


def _session(self_id: str, target: tuple[str, int | None, int]) -> str:
    kind, group_id, peer = target
    return group_session_id(self_id, group_id or 0) if kind == "group" else private_session_id(self_id, peer)


async def _calling(bot: BaseBot, api: str, data: dict[str, Any]) -> None:
    """Before a send: its text, so an echo that outruns the response, or follows one that
    gave no id, is known."""
    if api not in SEND_ACTIONS or not isinstance(bot, Bot):
        return
    if (target := _target(bot.self_id, api, data)) is not None:
        text = echo_text(_message(api, data))
        with _started:
            rt, sid = runtime.get(), _session(bot.self_id, target)
            rt.onebot.own_sends.expect(sid, text)
            if OWN_SEND.get():
                # Noted before it goes out, not once its response came: bot.py killed in between
                # left the backfill to store it as what the account said (a /回忆 answer read on
                # as the bot's own words, members' lines and all). The id follows (`_called`).
                await _remember_sent(sid, text, None)


async def _called(
    bot: BaseBot, exception: Exception | None, api: str, data: dict[str, Any], result: Any
) -> None:
    """After a send: it notes the id it went out under (its echo is then dropped); another
    plugin's is stored here, once, whenever its echo comes."""
    if api not in SEND_ACTIONS or not isinstance(bot, Bot):
        return
    if (target := _target(bot.self_id, api, data)) is None:
        return
    with _started:
        rt = runtime.get()
        message = _message(api, data)
        sid = _session(bot.self_id, target)
        if exception is not None and not OWN_SEND.get():
            rt.onebot.own_sends.failed(sid, echo_text(message))  # an echo, if any, is stored
            return
        message_id = sent_id(result) if exception is None else None
        rt.onebot.own_sends.sent(sid, echo_text(message), message_id)
        if OWN_SEND.get() == (message_id is not None):  # an own send's id-less note came first
            # What the backfill must not take for the account's own words, after a restart too.
            _in_background(rt, _remember_sent(sid, echo_text(message), message_id), f"memsum-sent-{sid}")
        if OWN_SEND.get():
            return  # stored by its turn, or no chat
        event = _as_event(bot, target, message, message_id)
        if event is None:
            return
        # Stored in the background: the other plugin's send must not wait for this plugin's
        # order (a message of the session before it may be waiting for this very send).
        arrival = rt.onebot.arrivals.take(sid)
        _in_background(rt, record_said(bot, event, arrival), f"memsum-said-{sid}")


def _in_background(rt: runtime.Runtime, work: Coroutine[Any, Any, None], name: str) -> None:
    task = asyncio.create_task(work, name=name)
    rt.onebot.recording_said.add(task)
    task.add_done_callback(rt.onebot.recording_said.discard)


SENT_NAMESPACE = "memsum_sent"
"""Per session, what went out through this process's Bot that no stored message carries the id
of (the plugin's own sends: command output, notices; sends answered without an id), as
[text, id or None, time]: a fetched message of the bot account that is one of them is not
stored as what the account said (recovery.py), after a restart too."""
SENT_KEPT = 20


async def _remember_sent(session_id: str, text: str, message_id: str | None) -> None:
    rt = runtime.get()
    since = clock.now() - rt.config.memsum_backfill_hours * 3600
    mine = [e for e in rt.onebot.sent.get(session_id, []) if e[2] >= since]
    if message_id is not None:
        mine = _named(mine, text)
    mine = rt.onebot.sent[session_id] = [*mine, [text, message_id, clock.now()]][-SENT_KEPT:]
    try:
        async with rt.onebot.recording.hold(f"sent:{session_id}"):
            kept = await rt.store.get_meta(SENT_NAMESPACE, session_id) or []
            kept = [e for e in kept if isinstance(e, list) and len(e) == 3 and e[2] >= since]
            kept = _merged(_named(kept, text) if message_id is not None else kept, mine)
            await rt.store.put_meta(SENT_NAMESPACE, session_id, kept[-SENT_KEPT:])
    except StoreError as err:  # kept in memory: this process's backfill still knows it
        logger.debug(f"memsum: a send of {session_id} not noted: {err}")


def _named(entries: list[Any], text: str) -> list[Any]:
    """`entries` without the earliest id-less note of `text`: the one `_calling` wrote as it went
    out, which the note with its id now stands for."""
    i = next((i for i, e in enumerate(entries) if e[0] == text and e[1] is None), None)
    return entries if i is None else [*entries[:i], *entries[i + 1 :]]


def _merged(*lists: list[Any]) -> list[Any]:
    """Entries of several lists once each, oldest first."""
    seen: dict[tuple[Any, ...], list[Any]] = {}
    for entry in (e for entries in lists for e in entries):
        seen.setdefault(tuple(entry), entry)
    return sorted(seen.values(), key=lambda e: e[2])


async def sent_here(session_id: str) -> list[tuple[str, str | None]]:
    """What `_remember_sent` kept of the session, in the store and in memory, then the
    session's last answers stored without an id (bot.py killed between an answer's send and
    its note): (text, id or None)."""
    rt = runtime.get()
    try:
        kept = await rt.store.get_meta(SENT_NAMESPACE, session_id) or []
        stored = await rt.store.get_history(session_id, SENT_KEPT)
    except StoreError:
        kept, stored = [], []
    kept = [e for e in kept if isinstance(e, list) and len(e) == 3]
    noted = [
        (str(e[0]), None if e[1] is None else str(e[1]))
        for e in _merged(kept, rt.onebot.sent.get(session_id, []))
    ]
    unnamed = [
        (_collapsed(m.content), IN_PARTS) for m in stored if m.role == "assistant" and m.platform_id is None
    ]
    return noted + unnamed


async def name_fetched_answer(session_id: str, message_id: str, text: str) -> None:
    """A fetched message of the account that is the whole of the session's newest answer stored
    without an id (`sent_here`: bot.py killed between its send and its note): the answer gets the
    id, so an admin's withdrawal of it (撤回) is marked, and a reply to it asks the bot."""
    rt = runtime.get()
    try:
        for m in reversed(await rt.store.get_history(session_id, SENT_KEPT)):
            if m.role == "assistant" and m.platform_id is None:
                if _collapsed(m.content) == text:
                    await rt.store.name_answer(session_id, m.content, message_id)
                return  # name_answer names the newest such answer only
    except StoreError as err:
        logger.warning(f"memsum: could not note the id of a fetched answer: {err}")


IN_PARTS = "*"
"""In `sent_here`'s list, an answer stored without an id: a long one went out in plain parts
(send.py), and the kill may have come between them, so each fetched part is a piece of it."""


def sent_here_match(sent: list[tuple[str, str | None]], message_id: str, text: str) -> bool:
    """Whether a fetched message of the account is one of `sent`: the same id, or the same
    text of one sent without an id (then taken out of it), or a piece of an answer stored
    without an id (kept: its other parts may follow)."""
    for i, (said, sent_under) in enumerate(sent):
        if sent_under == IN_PARTS:
            if text and text in said:
                return True
        elif sent_under == message_id or (sent_under is None and said == text):
            del sent[i]
            return True
    return False


def _as_event(
    bot: Bot, target: tuple[str, int | None, int], message: OBMessage, message_id: str | None
) -> MessageEvent | None:
    """A sent message as the message event the implementation would report for it."""
    kind, group_id, peer = target
    payload: dict[str, Any] = {
        "time": int(time.time()),
        "self_id": int(bot.self_id),
        "post_type": "message",
        "message_type": kind,
        "sub_type": "normal" if kind == "group" else "friend",
        "message_id": int(message_id) if message_id and message_id.lstrip("-").isdigit() else 0,
        "user_id": int(bot.self_id),
        "target_id": group_id if kind == "group" else peer,
        "message": message,
        "raw_message": "",
        "font": 0,
        "sender": {"user_id": int(bot.self_id)},
    }
    if kind == "group":
        payload["group_id"] = group_id
    try:
        return type_validate_python(GroupMessageEvent if kind == "group" else PrivateMessageEvent, payload)
    except Exception as err:
        logger.debug(f"memsum: a sent message not recorded: {err!r}")
        return None


# ---- what the implementation reports the account said -----------------------------------------
def message_sent_session(event: Event) -> str | None:
    """The session of NapCat's `message_sent` event (the adapter knows no model for it)."""
    if event.get_type() != "message_sent":
        return None
    payload = event.model_dump()
    if payload.get("message_type") == "group" and str(payload.get("group_id") or "").isdigit():
        return group_session_id(event.self_id, payload["group_id"])
    target = str(payload.get("target_id") or "")
    if payload.get("message_type") == "private" and target.isdigit() and target != str(event.self_id):
        return private_session_id(event.self_id, target)
    return None


def message_sent_event(event: Event) -> MessageEvent | None:
    """NapCat's `message_sent` as the message event it reports (for this plugin alone)."""
    payload = {**event.model_dump(), "post_type": "message"}
    model = GroupMessageEvent if payload.get("message_type") == "group" else PrivateMessageEvent
    try:
        return type_validate_python(model, payload)
    except Exception as err:
        logger.debug(f"memsum: a message_sent event not recorded: {err!r}")
        return None


async def record_echo(bot: Bot, event: MessageEvent, arrival: Arrival | None) -> None:
    """A message of the bot account the implementation reported: the echo of an own send is
    dropped (stored by its turn, or no chat); anything else is stored as the bot's."""
    rt = runtime.get()
    try:
        if isinstance(event, PrivateMessageEvent) and peer_of(bot.self_id, event) is None:
            return  # a private message of the account, to whom the implementation does not say
        if is_empty(event.original_message):
            return  # a malformed event with nothing in it
        sid = record_of(bot, event)[0].id
        if rt.onebot.own_sends.is_echo(sid, str(event.message_id), echo_text(event.original_message)):
            return
        await record_said(bot, event, arrival)
    finally:
        if arrival is not None:
            rt.onebot.arrivals.done(arrival)


async def record_said(bot: Bot, event: MessageEvent, arrival: Arrival | None) -> None:
    """Store what the bot account said as its own message, in its session's order: nothing
    in a 关 place, and no turn anywhere (a 仅记录 place is judged for compression as ever)."""
    rt = runtime.get()
    try:
        place, _ = record_of(bot, event)
        try:
            mode = await rt.controls.mode(place)
        except StoreError as err:
            note_refused(err, place.id, float(event.time))
            return
        if mode == "off":
            return
        await fill_forward_refs(bot, event)
        await fill_forward(bot, event.original_message)  # one the owner sent from another client
        try:
            record, msg = await record_message(bot, event, arrival, by_bot=True)
        except StoreError:  # said in the log already
            return
        if msg is not None and mode == "record":
            await rt.compression.judge_recorded(record.id, entry_of(record))
    except Exception:
        logger.exception("memsum: could not record a message the bot account sent")
    finally:
        if arrival is not None:
            rt.onebot.arrivals.done(arrival)
