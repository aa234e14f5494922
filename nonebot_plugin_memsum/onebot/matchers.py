"""The matchers: every message event takes an arrival ticket; group and private
messages are recorded and answered when addressed; notices are recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator

from nonebot import on_message, on_notice
from nonebot.adapters.onebot.v11 import (
    Bot,
    Event,
    GroupMessageEvent,
    MessageEvent,
    NoticeEvent,
    PrivateMessageEvent,
)
from nonebot.message import event_preprocessor
from nonebot.params import Depends
from nonebot.typing import T_State

from nonebot_plugin_memsum import runtime

from .record import notice_record, record_message, record_notice
from .render import is_empty
from .send import replier
from .sessions import entry_of, group_session_id, private_session_id

_ARRIVAL = "memsum_arrival"


def release_arrival(state: T_State) -> None:
    """This event will not be stored (a command): later messages need not wait for it."""
    if (arrival := state.get(_ARRIVAL)) is not None:
        runtime.get().onebot.arrivals.done(arrival)


def _session_of(bot: Bot, event: Event) -> str | None:
    """The session a message or notice belongs to (its group, else its private peer)."""
    if isinstance(event, MessageEvent):
        if isinstance(event, GroupMessageEvent):
            return group_session_id(bot.self_id, event.group_id)
        return private_session_id(bot.self_id, event.user_id)
    if isinstance(event, NoticeEvent) and (where := notice_record(bot, event.model_dump())) is not None:
        return where[0].id
    return None


async def _arrival_ticket(bot: Bot, event: Event, state: T_State) -> AsyncIterator[None]:
    if (sid := _session_of(bot, event)) is None:
        yield
        return
    arrivals = runtime.get().onebot.arrivals
    state[_ARRIVAL] = arrival = arrivals.take(sid)
    try:
        yield
    finally:  # on the event's own exit stack: released however its handling ends
        arrivals.done(arrival)


def register_matchers(priority: int) -> None:
    """Recording and chat sit below the commands, which block, so commands never get recorded."""
    chat = on_message(priority=priority, block=False)
    notices = on_notice(priority=priority, block=False)

    @event_preprocessor
    async def _(_: None = Depends(_arrival_ticket)) -> None:
        """Takes the arrival ticket of every message and notice of a session."""

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
            runtime.get().agent.request_turn(record.id, replier(bot, event), entry_of(record), trigger=msg.id)

    @notices.handle()
    async def _(bot: Bot, event: NoticeEvent, state: T_State) -> None:
        await record_notice(bot, event, state.get(_ARRIVAL))
