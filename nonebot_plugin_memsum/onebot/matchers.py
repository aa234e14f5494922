"""The matchers: every message event takes an arrival ticket; group and private
messages are recorded and answered when addressed; notices are recorded."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from nonebot import get_adapters, get_driver, on, on_message, on_notice
from nonebot.adapters.onebot.v11 import (
    Adapter,
    Bot,
    Event,
    GroupMessageEvent,
    MessageEvent,
    NoticeEvent,
    PrivateMessageEvent,
)
from nonebot.drivers import HTTPClientMixin, WebSocketClientMixin
from nonebot.log import logger
from nonebot.message import event_preprocessor
from nonebot.params import Depends
from nonebot.typing import T_State

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.controls import CAP_NOTICE
from nonebot_plugin_memsum.errors import StoreError
from nonebot_plugin_memsum.types import SessionRecord

from . import fastpath, recovery, said
from .fastpath import Claim, Route
from .record import (
    drop_foreign_quote,
    fill_forgotten_quote,
    fill_forward,
    note_refused,
    notice_record,
    peer_of,
    record_message,
    record_notice,
    record_of,
)
from .render import is_empty
from .send import replier, send_reply
from .sessions import entry_of, group_session_id, private_session_id


def release_arrival(event: Event) -> None:
    """This event will not be stored (a command): later messages need not wait for it."""
    arrivals = runtime.get().onebot.arrivals
    if (arrival := arrivals.of(event)) is not None:
        arrivals.done(arrival)


def _session_of(event: Event) -> str | None:
    """The session a message or notice belongs to (its group, else its private peer)."""
    if isinstance(event, GroupMessageEvent):
        return group_session_id(event.self_id, event.group_id)
    if isinstance(event, MessageEvent):
        return private_session_id(event.self_id, peer_of(event.self_id, event) or event.user_id)
    if isinstance(event, NoticeEvent) and (where := notice_record(event.self_id, event.model_dump())):
        return where[0].id
    return said.message_sent_session(event)


async def _arrival_ticket(event: Event) -> AsyncIterator[None]:
    # One parameter: NoneBot solves each parameter of each dependency in a task of its own
    # (with bot and state as well this came to about a tenth of the CPU of a message).
    arrivals = runtime.get().onebot.arrivals
    if arrivals.of(event) is not None or (sid := _session_of(event)) is None:
        yield  # no session, or the fast path took it before NoneBot's dispatch and releases it
        return
    arrivals.take_for(event, sid)
    try:
        yield
    finally:  # on the event's own exit stack: released however its handling ends
        arrivals.release(event)


arrival_ticket = asynccontextmanager(_arrival_ticket)
"""The arrival ticket of a message or notice of a session, held while it is handled."""


async def take_arrival_ticket(_: None = Depends(_arrival_ticket)) -> None:
    """The event preprocessor: takes the arrival ticket of every message and notice of a session."""


async def answer_if_allowed(
    bot: Bot, event: MessageEvent, record: SessionRecord, trigger: int | None
) -> None:
    """A message that asks for an answer in an `on` place: the daily cap and the cooldown decide."""
    rt = runtime.get()
    in_group = isinstance(event, GroupMessageEvent)
    decision = await rt.controls.answer(record, str(event.user_id), in_group=in_group)
    if decision == "answer":

        async def still_allowed() -> bool:
            # Queued behind a turn that used up the day's cap: the notice, not an answer.
            try:
                again = await rt.controls.still_within_cap(record)
            except StoreError as err:  # the decision made on arrival stands
                logger.warning(f"memsum: could not check the daily cap of {record.id} again: {err}")
                return True
            if again == "cap_notice":
                await _cap_notice(bot, event, record)
            return again == "answer"

        rt.agent.request_turn(
            record.id, replier(bot, event), entry_of(record), trigger=trigger, allowed=still_allowed
        )
        return
    logger.debug(f"memsum: not answering message {trigger} of {record.id}: {decision}")
    if decision == "cap_notice":
        await _cap_notice(bot, event, record)
    # No turn ends for it: judged as the turn it would have been, as a 仅记录 place's
    # messages are, so the cap never stops the memory's compression (issue 10).
    await rt.compression.judge_recorded(record.id, entry_of(record))


async def _cap_notice(bot: Bot, event: MessageEvent, record: SessionRecord) -> None:
    """The day's one cap notice; noted as sent already, so a failed one is not tried again."""
    try:
        await replier(bot, event)(CAP_NOTICE)
    except Exception as err:  # the bot muted there, the implementation gone: nothing more to do
        logger.warning(f"memsum: could not send the cap notice to {record.id}: {type(err).__name__}: {err}")


def _asks(bot: Bot, event: GroupMessageEvent | PrivateMessageEvent) -> bool:
    """A private message, or one addressed to the bot; never one of another account of this
    NoneBot or of MEMSUM_IGNORED_USERS (`recovery.never_asks`: two bots must not answer each
    other). An @ of the bot anywhere in the message addresses it (「这个 @小记 你怎么看」), as a
    fetched one does (`recovery.addresses_bot`); the adapter's `to_me` sees one at the start
    or end only."""
    addressed = (
        isinstance(event, PrivateMessageEvent)
        or event.is_tome()
        or recovery.addresses_bot(event, bot.self_id, runtime.get().nicknames)
    )
    return addressed and not recovery.never_asks(bot, event.user_id)


async def tell_not_stored(bot: Bot, event: MessageEvent, record: SessionRecord) -> None:
    """A question the store refused cannot be answered (the turn reads it from the store):
    the asker gets `MEMSUM_ERROR_REPLY` rather than silence, once a minute per session."""
    rt = runtime.get()
    text = rt.config.memsum_error_reply
    if not text or not rt.onebot.refusals.apology_due(record.id, time.monotonic()):
        return
    try:
        await send_reply(bot, event, text, quote=isinstance(event, GroupMessageEvent))
    except Exception as err:  # the implementation gone as well: nothing more to do
        logger.warning(f"memsum: could not tell {record.id} that its question was not stored: {err!r}")


def unanswerable(bot: Bot) -> str | None:
    """Why an account that posts its events over HTTP (no WebSocket of its own) cannot be
    answered, in the `.env` words that fix it; None when it can. nonebot-adapter-onebot
    calls its API over HTTP only with an HTTP client driver and an ONEBOT_API_ROOTS entry
    for the account; otherwise every send fails, and the log says little of why."""
    adapter = bot.adapter
    if not isinstance(adapter, Adapter) or bot.self_id in adapter.connections:
        return None
    if not isinstance(adapter.driver, HTTPClientMixin):
        return (
            f"the driver has no HTTP client to call its API with; write DRIVER=~fastapi+~httpx"
            f' and ONEBOT_API_ROOTS=\'{{"{bot.self_id}": "http://<its HTTP API address>"}}\''
        )
    if bot.self_id not in adapter.onebot_config.onebot_api_roots:
        return (
            f"ONEBOT_API_ROOTS has no address for it; write"
            f' ONEBOT_API_ROOTS=\'{{"{bot.self_id}": "http://<its HTTP API address>"}}\''
        )
    return None


def _check_forward_urls() -> None:
    """ONEBOT_WS_URLS (the bot connects to the implementation) needs a WebSocket client
    driver: without one the adapter ignores the URLs and the account never connects."""
    driver = get_driver()
    for adapter in get_adapters().values():
        if isinstance(adapter, Adapter) and adapter.onebot_config.onebot_ws_urls:
            if not isinstance(driver, WebSocketClientMixin):
                logger.warning(
                    "memsum: ONEBOT_WS_URLS is set but the driver cannot open WebSocket connections,"
                    " so no account connects that way; write DRIVER=~fastapi+~websockets"
                )


def register_matchers(priority: int, is_command: Callable[[T_State], bool], commands: Claim) -> None:
    """Recording and chat sit below the commands, which block, so commands never get recorded.

    `is_command`: whether a message is one of our commands that its sender may not use:
    it is not ours to handle at all, so not recorded either (another plugin may own it).
    `commands`: the commands' matcher and its rule, for the fast path (`fastpath.py`)."""
    chat = on_message(priority=priority, block=False)
    notices = on_notice(priority=priority, block=False)
    sent = on("message_sent", priority=priority, block=False)
    said.register()
    driver = get_driver()

    driver.on_startup(_check_forward_urls)

    @driver.on_bot_connect
    async def _(bot: Bot) -> None:
        if (why := unanswerable(bot)) is not None:
            logger.warning(
                f"memsum: account {bot.self_id} posts its events over HTTP, but no answer can go out: {why}"
            )
        recovery.account_of(bot)  # backfill and answer what was missed, in the background

    @driver.on_bot_disconnect
    async def _(bot: Bot) -> None:
        recovery.forget(bot)

    event_preprocessor(take_arrival_ticket)

    @chat.handle()
    async def handle_chat(bot: Bot, event: MessageEvent, state: T_State) -> None:
        if not isinstance(event, GroupMessageEvent | PrivateMessageEvent):
            return
        if str(event.user_id) == bot.self_id:  # LLOneBot, older NapCat: the account's own message
            await said.record_echo(bot, event, runtime.get().onebot.arrivals.of(event))
            return
        if is_empty(event.original_message) and event.reply is None:
            return  # a malformed event with nothing in it: nothing said, nothing to answer
        if is_command(state):
            release_arrival(event)
            return  # one of our commands its sender may not use: not ours to handle
        drop_foreign_quote(bot, event)
        place, _ = record_of(bot, event)
        rt = runtime.get()
        try:
            mode = await rt.controls.mode(place)
        except StoreError as err:  # the database cannot be reached: counted as not stored
            release_arrival(event)
            note_refused(err, place.id, float(event.time))
            # The mode as last read: a place never read since the start may be 关, so it
            # stays quiet (a 关 group must never hear from the bot).
            if rt.controls.last_mode(place) == "on" and _asks(bot, event):
                await tell_not_stored(bot, event, place)
            return
        if mode == "off":
            release_arrival(event)
            logger.debug(f"memsum: not recording a message of {place.id}: mode off")
            return
        await fill_forgotten_quote(bot, event)
        await fill_forward(bot, event.original_message)
        asks = mode == "on" and _asks(bot, event)
        try:
            record, msg = await record_message(bot, event, rt.onebot.arrivals.of(event), addressed=asks)
        except StoreError:  # refused (a full disk, the server gone): in the log already
            if asks:
                await tell_not_stored(bot, event, place)
            return
        if msg is None:
            # Fetched on connect already and answered from there; with MEMSUM_RESUME_WINDOW 0
            # nothing answers on connect, and a question said as the bot connected is answered here.
            if asks and (trigger := recovery.fetched_question(bot, record.id, event.message_id)) is not None:
                await answer_if_allowed(bot, event, record, trigger)
            return
        if mode == "record":
            logger.debug(f"memsum: not answering message {msg.id} of {record.id}: record-only")
            await runtime.get().compression.judge_recorded(record.id, entry_of(record))
        elif asks:
            await answer_if_allowed(bot, event, record, msg.id)

    @sent.handle()
    async def handle_sent(bot: Bot, event: Event) -> None:
        """NapCat's `message_sent`: what the bot account said (reportSelfMessage)."""
        arrival = runtime.get().onebot.arrivals.of(event)
        if (message := said.message_sent_event(event)) is None:
            release_arrival(event)
            return
        await said.record_echo(bot, message, arrival)

    @notices.handle()
    async def handle_notice(bot: Bot, event: NoticeEvent) -> None:
        await record_notice(bot, event, runtime.get().onebot.arrivals.of(event))
        await recovery.note_left(bot, event)

    fastpath.register(
        {
            "message": Route(frozenset({chat, commands.matcher}), handle_chat, commands),
            "notice": Route(frozenset({notices}), lambda bot, event, _: handle_notice(bot, event)),
        },
        take_arrival_ticket,
        arrival_ticket,
    )
