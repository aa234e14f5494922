"""Sending answers: in groups the answer quotes the message it answers, and a long one
goes out as a merged-forward message where the implementation allows it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nonebot import get_bots
from nonebot.adapters.onebot.v11 import ActionFailed, Bot, GroupMessageEvent, MessageEvent, MessageSegment
from nonebot.exception import ApiNotAvailable, NetworkError, WebSocketClosed
from nonebot.log import logger

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.turn import own_send
from nonebot_plugin_memsum.compression import request
from nonebot_plugin_memsum.errors import NotDelivered, StoreError

from .record import record_of, temp_group

FORWARD_PART = 1500
PLAIN_PART = 3000
NOT_SENT = (ApiNotAvailable, WebSocketClosed)
"""What a send raises when the account has no connection: nothing went out."""


def replier(bot: Bot, event: MessageEvent) -> Callable[[str], Awaitable[None]]:
    """How a turn answers this event: in a group, quoting it, unless it was withdrawn (撤回)
    meanwhile (the turn answers the others it read: a quote of a withdrawn one shows nothing)."""

    async def send(text: str) -> None:
        sid = record_of(bot, event)[0].id
        quote = (
            isinstance(event, GroupMessageEvent)
            and (sid, str(event.message_id)) not in runtime.get().onebot.withdrawn
        )
        sent = await send_reply(bot, event, text, quote=quote)
        if sent is not None:
            # A later reply to this answer asks the bot even after the implementation forgot
            # it (record.py `fill_forgotten_quote`).
            try:
                await runtime.get().store.name_answer(sid, text, sent)
            except StoreError as err:
                logger.warning(f"memsum: could not note the id of a sent answer: {err}")

    return send


async def send_reply(bot: Bot, event: MessageEvent, text: str, *, quote: bool = False) -> str | None:
    """Plain text; in groups a long text goes out as a merged-forward message. Returns the
    platform id of what went out (the first part of a long one), when the implementation says.
    NotDelivered when nothing went out: the implementation refused it (muted, not in the group)
    or the account had no connection within MEMSUM_RESUME_WINDOW.

    `quote`: the answer quotes the message it answers, so a busy group sees to whom.
    What goes out here is the plugin's own: an answer is stored by its turn, and the rest
    (command output, notices, apologies) is not chat (said.py stores neither again).
    """
    with own_send():
        return await _send(bot, event, text, quote=quote)


async def _send(bot: Bot, event: MessageEvent, text: str, *, quote: bool) -> str | None:
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
            for part in split_text(text, FORWARD_PART)
        ]
        try:
            sent = await _deliver(
                bot, lambda b: b.call_api("send_group_forward_msg", group_id=event.group_id, messages=nodes)
            )
            return sent_id(sent)
        except NOT_SENT as err:
            raise NotDelivered(refusal(err)) from err
        except NetworkError:
            raise  # no answer in time: it may have gone out, and a plain copy would say it twice
        except Exception as err:
            logger.info(f"memsum: merged-forward not available ({type(err).__name__}); sending plain text")
    first: str | None = None
    to = addressee(event)
    for i, part in enumerate(split_text(text, PLAIN_PART)):
        message = MessageSegment.reply(event.message_id) + part if quote and i == 0 else part
        try:
            sent = await _deliver(bot, lambda b, message=message: b.send(to, message))
        except (ActionFailed, *NOT_SENT) as err:
            if i:
                raise  # its first parts went out
            raise NotDelivered(refusal(err)) from err
        first = sent_id(sent) if i == 0 else first
    return first


def addressee(event: MessageEvent) -> MessageEvent:
    """The event a send answers, as the adapter's `send` reads it (its `group_id` goes along):
    a private one without a group unless `temp_group` names one. NapCat sends a temp message
    from the `group_id` it is given, before the group QQ remembers of the chat
    (packages/napcat-onebot/action/msg/SendMsg.ts `createContext`, PR #1963): its placeholder
    is no group of the account, so a send naming it fails where one naming none goes out."""
    extra = event.model_extra or {}
    if isinstance(event, GroupMessageEvent) or "group_id" not in extra or temp_group(event) is not None:
        return event
    copy = event.model_copy()
    copy.__pydantic_extra__ = {k: v for k, v in extra.items() if k != "group_id"}
    return copy


def refusal(err: Exception) -> str:
    """A failed send, on one line: the implementation's retcode and words (NapCat's run over
    several lines), or that there was no connection."""
    if not isinstance(err, ActionFailed):
        return f"no connection ({type(err).__name__})"
    info = err.info
    words = " ".join(str(info.get("wording") or info.get("message") or info.get("msg") or "").split())
    return (
        f"the implementation refused it (retcode {info.get('retcode')}{': ' + words[:300] if words else ''})"
    )


def sent_id(result: object) -> str | None:
    """`message_id` of a send action's data (OneBot v11 `send_msg`), if the implementation gave
    one: 0 is none (Lagrange and NapCat answer 0 when they have no id for what they sent)."""
    message_id = result.get("message_id") if isinstance(result, dict) else None
    return None if message_id is None or str(message_id) in ("", "0") else str(message_id)


async def _deliver(bot: Bot, send: Callable[[Bot], Awaitable[Any]]) -> Any:
    """One send, on the account's current connection. When it has none (the implementation
    restarting while the model thought), once more on its next one, if that comes within
    MEMSUM_RESUME_WINDOW: the answer is stored and marked as being sent already, so the
    reconnect's resume leaves its question alone and only this send can still deliver it."""
    current = _current(bot)
    try:
        return await send(current)
    except NOT_SENT:
        if not await _reconnected(current, runtime.get().config.memsum_resume_window):
            raise
        return await send(_current(bot))


def _current(bot: Bot) -> Bot:
    """The account's bot on its current connection (each connection has its own)."""
    found = get_bots().get(bot.self_id)
    return found if isinstance(found, Bot) else bot


async def _reconnected(gone: Bot, within: float) -> bool:
    """Whether the account connects again (a bot other than `gone`) within `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while get_bots().get(gone.self_id) in (None, gone):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def split_text(text: str, size: int) -> list[str]:
    """`text` in parts of at most `size` characters, each line whole in one part: a /回忆 result
    line (its `时间 [昵称(QQ)]` above all) cut over two bubbles reads as two. Only a line longer
    than a part is cut, where `cut_at` says (a sentence or word end); a part drops the line
    break it ends at (the next bubble is the next line)."""
    parts: list[str] = []
    for line in text.split("\n"):
        pieces = request.split_text(line, lambda t: len(t) <= size, size) or [""]
        for i, piece in enumerate(pieces):
            if parts and len(parts[-1]) + len(piece) <= size:
                parts[-1] += piece
            else:
                parts.append(piece)
            parts[-1] += "\n" if i == len(pieces) - 1 else ""
    return [p for part in parts if (p := part.removesuffix("\n"))] or [""]
