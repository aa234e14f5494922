"""A small typed in-process event bus, and the events the agent and the compression emit.

Other plugins subscribe with `bus.subscribe(UsageEvent, handler)`. A handler's error is
logged and never breaks the emitter: a listener must not be able to lose a turn.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from nonebot.log import logger

Outcome = Literal["replied", "silent", "aborted", "error"]


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """A turn of the agent begins (agent:turn:before)."""

    turn_id: str
    session_id: str


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """A turn ended with an outcome (agent:turn:after)."""

    turn_id: str
    session_id: str
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """Usage of one model call (token:usage), or a snapshot before it (turn_id None).

    `usage` is the prompt size: the API's reported prompt tokens when present, else the
    estimate. `untrimmed_history` estimates history and tool results over the list before
    hard trimming; `history_messages` is R-TRIG-4's count.
    """

    session_id: str
    turn_id: str | None
    platform: str | None
    platform_type: str | None
    model_id: str
    window: int
    trim_budget: int
    usage: int
    trimmed: bool
    untrimmed_history: int
    history_messages: int
    history_limit: int
    line: int | None = None
    """The effective compression line E = min(compress_at × window, trim budget), floored;
    None when the session's compress_at is 0 (R-CFG-4)."""


@dataclass(frozen=True, slots=True)
class CompressionProgress:
    """session:compressing: `start`, then `done` on success or `error` with the reason."""

    session_id: str
    phase: Literal["start", "done", "error"]
    reason: str | None = None


E = TypeVar("E")
Handler = Callable[[E], Awaitable[None] | None]


class EventBus:
    """Subscribe handlers by event class; `emit` awaits them in subscription order."""

    def __init__(self) -> None:
        self._handlers: defaultdict[type, list[Callable[[Any], Any]]] = defaultdict(list)

    def subscribe(self, event_type: type[E], handler: Handler[E]) -> Callable[[], None]:
        """Add a handler; returns a function that removes it again (once: calling it again
        does nothing)."""
        self._handlers[event_type].append(handler)
        subscribed = [True]

        def unsubscribe() -> None:
            if subscribed[0]:
                subscribed[0] = False
                self._handlers[event_type].remove(handler)

        return unsubscribe

    async def emit(self, event: object) -> None:
        for handler in list(self._handlers[type(event)]):
            try:
                result = handler(event)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception(f"memsum: a {type(event).__name__} handler failed")
