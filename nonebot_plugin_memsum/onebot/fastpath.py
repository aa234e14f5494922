"""The fast path: ordinary messages and notices handled without NoneBot's per-event tasks,
when that is provably what NoneBot's dispatch would do.

NoneBot dispatches every event through task groups: each preprocessor, each matcher of
each priority, each permission, rule and handler parameter in a task of its own. For an
ordinary group message that machinery was most of the bot's CPU (cProfile of
bench/bench_ingest.py: about 5 tasks per event, 5.4 ms per event), the plugin's own
handler about 11 % of it.

When only this plugin handles an event type, NoneBot's dispatch of such an event is
known in full: our arrival-ticket preprocessor, the command parser
(`TrieRule.get_value`), the commands' matcher, whose rule turns down anything that is
no command of ours, and the handler of our one matcher without rule or permission. The
OneBot adapter's `Bot.handle_event` calls the name `handle_event` of its module after its
own preprocessing (reply, @ and nickname set `to_me`); at start-up that name is replaced
by `FastPath.handle_event`, which runs exactly that sequence in the event's own task, and
hands the event to NoneBot whenever anything else would see it:
- another matcher of the type (another plugin's, a temporary one) or any other
  event or run pre/postprocessor: checked for every event, a few microseconds;
- a message our commands take (their rule says so): it goes to NoneBot as it always did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import nonebot.adapters.onebot.v11.bot as adapter_bot
import nonebot.message
from nonebot import get_driver
from nonebot.adapters.onebot.v11 import Bot, Event
from nonebot.exception import NoLogException
from nonebot.log import logger
from nonebot.matcher import Matcher, matchers
from nonebot.rule import TrieRule
from nonebot.typing import T_State
from nonebot.utils import escape_tag

_HOOKED = "handle_event"
"""The name by which the adapter's `Bot.handle_event` calls NoneBot's dispatch
(nonebot/adapters/onebot/v11/bot.py imports it from nonebot.message)."""
Handler = Callable[[Bot, Any, T_State], Awaitable[Any]]
Ticket = Callable[[Event], contextlib.AbstractAsyncContextManager[None]]


@dataclass(frozen=True, slots=True)
class Claim:
    """A matcher of ours that may take an event before the route's handler, and its rule
    (a plain function of the event: NoneBot's own call of it costs tasks)."""

    matcher: type[Matcher]
    rule: Callable[[Bot, Any, T_State], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Route:
    """What this plugin registered for one event type."""

    matchers: frozenset[type[Matcher]]
    """Every matcher of ours that handles the type."""
    handler: Handler
    """The handler of the one matcher among them without rule or permission."""
    claim: Claim | None = None
    """The other one, when there is one."""


def _name(thing: Any) -> str:
    if isinstance(thing, type) and issubclass(thing, Matcher):
        return thing.plugin_id or thing.module_name or repr(thing)
    return getattr(thing, "__module__", None) or repr(thing)


class FastPath:
    def __init__(self, routes: dict[str, Route], preprocessor: Callable[..., Any], ticket: Ticket) -> None:
        self._routes = routes
        self._preprocessor = preprocessor
        """Our arrival-ticket preprocessor: the one event processor the fast path stands in for."""
        self._ticket = ticket
        self._dispatch: Callable[[Bot, Event], Awaitable[None]] = nonebot.message.handle_event
        self._hook = self.handle_event
        self._bot_handle_event: Callable[[Bot, Event], Awaitable[None]] | None = None

    def others(self, kind: str, route: Route) -> list[str]:
        """Who else would see an event of this type in NoneBot's dispatch (none: the fast path may run)."""
        found = [
            _name(m)
            for priority in matchers.values()
            for m in priority
            if m.type in (kind, "") and m not in route.matchers
        ]
        found += [
            _name(p.call) for p in nonebot.message._event_preprocessors if p.call is not self._preprocessor
        ]
        for processors in (
            nonebot.message._event_postprocessors,
            nonebot.message._run_preprocessors,
            nonebot.message._run_postprocessors,
        ):
            found += [_name(p.call) for p in processors]
        return found

    async def handle_event(self, bot: Bot, event: Event) -> None:
        """In place of NoneBot's `handle_event`, after the adapter's own preprocessing."""
        kind = event.get_type()
        if (route := self._routes.get(kind)) is None:
            await self._dispatch(bot, event)
            return
        # Taken here, at the same step for every message and notice whichever way it goes
        # on, so a session's events keep their order (the preprocessor then takes none).
        async with self._ticket(event):
            if self.others(kind, route):
                await self._dispatch(bot, event)
                return
            state: T_State = {}
            try:
                TrieRule.get_value(bot, event, state)
                claimed = route.claim is not None and await route.claim.rule(bot, event, state.copy())
            except Exception:
                claimed = True  # NoneBot's dispatch logs it and goes on as it does
            if claimed:
                await self._dispatch(bot, event)
                return
            self._log(bot, event)
            with anyio.CancelScope(shield=True):  # as NoneBot runs each matcher: a stop lets it finish
                try:
                    await route.handler(bot, event, state)
                except Exception as err:  # as NoneBot: logged, the connection and later events go on
                    logger.opt(exception=err).error(f"memsum: handling a {kind} event failed")

    @staticmethod
    def _log(bot: Bot, event: Event) -> None:
        """The line NoneBot's dispatch logs for each event (none when bot.py quietens it)."""
        try:
            line = event.get_log_string()
        except NoLogException:
            return
        logger.opt(colors=True).success(f"<m>{escape_tag(bot.type)} {escape_tag(bot.self_id)}</m> | {line}")

    def _ticket_on_arrival(self, handle: Callable[[Bot, Event], Awaitable[None]]) -> Any:
        """`Bot.handle_event` taking the event's arrival ticket before the adapter's own
        preprocessing: a message with a reply segment waits there for `get_msg` (NapCat,
        Lagrange: a round trip; a failure for a message no longer cached), and the
        messages that came after it must not be stored before it."""
        ticket = self._ticket

        async def handle_event(bot: Bot, event: Event) -> None:
            async with ticket(event):
                await handle(bot, event)

        return handle_event

    async def install(self) -> None:
        """At start-up, when every plugin is loaded: one line says which way each type goes."""
        if self._bot_handle_event is None:
            self._bot_handle_event = Bot.handle_event
            Bot.handle_event = self._ticket_on_arrival(Bot.handle_event)  # type: ignore[method-assign]
        current = getattr(adapter_bot, _HOOKED)
        if current == self._hook:
            return
        if current is not nonebot.message.handle_event:
            logger.info(f"memsum: the OneBot adapter's dispatch is hooked by {_name(current)}: no fast path")
            return
        self._dispatch = current
        setattr(adapter_bot, _HOOKED, self._hook)
        ways = []
        for kind, route in self._routes.items():
            others = sorted(set(self.others(kind, route)))
            way = f"through NoneBot, also handled by {', '.join(others)}" if others else "fast path"
            ways.append(f"{kind}s {way}")
        logger.info(f"memsum: event dispatch: {'; '.join(ways)}")

    async def uninstall(self) -> None:
        if self._bot_handle_event is not None:
            Bot.handle_event = self._bot_handle_event  # type: ignore[method-assign]
            self._bot_handle_event = None
        if getattr(adapter_bot, _HOOKED) == self._hook:
            setattr(adapter_bot, _HOOKED, self._dispatch)


def register(routes: dict[str, Route], preprocessor: Callable[..., Any], ticket: Ticket) -> FastPath:
    """The fast path for these routes, installed while the driver runs."""
    fast = FastPath(routes, preprocessor, ticket)
    driver = get_driver()
    driver.on_startup(fast.install)
    driver.on_shutdown(fast.uninstall)
    return fast
