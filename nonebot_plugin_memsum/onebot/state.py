"""What the OneBot layer remembers between events, owned by the runtime and bounded.

A bot in thousands of groups must not grow without limit: names are an LRU bounded by
entries and by approximate bytes, with expiry and idle eviction; arrival tickets and
per-session recording locks exist only while an event of their session is in flight.
No I/O and no nonebot import here.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.lru import LRU, BoundedCache, KeyedLocks

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


# ---- names --------------------------------------------------------------------------
NAME_TTL = 3600.0
"""A name is looked up again after an hour: cards change, and a card-change notice can be missed."""
UNKNOWN_NAME_TTL = 300.0
"""A failed look-up is not retried for each message for five minutes."""
NAME_ENTRIES = 100_000
NAME_BYTES = 16 * 1024 * 1024
NAME_IDLE = 24 * 3600.0
_ENTRY_OVERHEAD = 390
"""An OrderedDict slot, the key tuple and the entry object (bench/bench_onebot_names.py measures it)."""


def _name_size(key: tuple[str, str], name: str) -> int:
    # The scope string is shared by the entries of one place; the id and the name are not.
    return _ENTRY_OVERHEAD + sys.getsizeof(key[1]) + sys.getsizeof(name)


class NameCache:
    """Display names as a place sees them (card, else nickname), per scope (a session)."""

    def __init__(
        self,
        *,
        max_entries: int = NAME_ENTRIES,
        max_bytes: int = NAME_BYTES,
        idle_seconds: float = NAME_IDLE,
        now: Callable[[], float] = lambda: clock.now(),
    ) -> None:
        self._cache: BoundedCache[tuple[str, str], str] = BoundedCache(
            max_entries=max_entries, max_bytes=max_bytes, idle_seconds=idle_seconds, size=_name_size, now=now
        )

    def get(self, scope: str, user_id: int | str) -> str | None:
        return self._cache.get((scope, str(user_id)))

    def put(self, scope: str, user_id: int | str, name: str, ttl: float = NAME_TTL) -> None:
        self._cache.put((scope, str(user_id)), name, ttl)

    def forget(self, scope: str, user_id: int | str) -> None:
        self._cache.pop((scope, str(user_id)))

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def bytes(self) -> int:
        return self._cache.bytes


# ---- arrival order ------------------------------------------------------------------
Arrival = tuple[str, int]
"""(session id, ticket)"""


class Arrivals:
    """Per session, the tickets of events not yet stored nor dropped.

    NoneBot runs the events of a burst concurrently and they reach the matchers in any
    order; a ticket taken in the event preprocessor (which still sees them in the order
    they came) lets a session's messages be stored in that order.
    """

    def __init__(self) -> None:
        self._tickets = itertools.count()
        self._open: defaultdict[str, dict[int, asyncio.Event]] = defaultdict(dict)
        self._of_event: dict[int, Arrival] = {}
        """Tickets by the id of the event they were taken for, while it is handled."""

    def take(self, session_id: str) -> Arrival:
        ticket = next(self._tickets)
        self._open[session_id][ticket] = asyncio.Event()
        return session_id, ticket

    def take_for(self, event: object, session_id: str) -> Arrival:
        """A ticket that belongs to `event` while it is handled (`of(event)` finds it;
        `release(event)` when NoneBot is done with it)."""
        arrival = self._of_event[id(event)] = self.take(session_id)
        return arrival

    def of(self, event: object) -> Arrival | None:
        """The ticket taken for this event, if any."""
        return self._of_event.get(id(event))

    def release(self, event: object) -> None:
        """The event is handled: its ticket, if still open, is done."""
        if (arrival := self._of_event.pop(id(event), None)) is not None:
            self.done(arrival)

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

    def __len__(self) -> int:
        """Sessions with an event in flight."""
        return len(self._open)


# ---- messages the store refused ---------------------------------------------------------
REFUSALS_EVERY = 60.0
"""Seconds between two lines about messages the store keeps refusing."""
PLACES_KEPT = 10_000
"""Sessions whose refused messages are fetched again once the store stores (a bound on memory
through a long outage; beyond it, the next restart's backfill is what is left)."""


@dataclass
class Refusals:
    """Messages the store refused while it could not write (a full disk): what to tell the
    operator, so a hundred messages a second make one line a minute, not a stack trace each."""

    total: int = 0
    """Refused since the last message that was stored."""
    told: float | None = None
    """When the last line was logged (a monotonic time)."""
    places: dict[str, float] = field(default_factory=dict)
    """Sessions with a message refused and not fetched again yet: when the first was refused
    (`clock.now()`); at most PLACES_KEPT, the first ones."""
    refilling: asyncio.Task[None] | None = None
    """The task fetching again what `places` lost, once the store stores (recovery.refill_all)."""
    apologised: LRU[str, float] = field(default_factory=LRU)
    """Per session, when it was last told that the bot cannot answer now (a monotonic time)."""

    def refused(self, now: float, session_id: str | None = None, at: float = 0.0) -> bool:
        """One more message refused (of `session_id`, said at `at`): whether to say so now
        (the first, then once a minute)."""
        if session_id is not None and (session_id in self.places or len(self.places) < PLACES_KEPT):
            self.places.setdefault(session_id, at)
        self.total += 1
        if self.told is None or now - self.told >= REFUSALS_EVERY:
            self.told = now
            return True
        return False

    def stored(self) -> int:
        """A message was stored: how many were refused before it; the count starts over."""
        refused, self.total, self.told = self.total, 0, None
        return refused

    def apology_due(self, session_id: str, now: float) -> bool:
        """A refused question of this session: whether to send the error reply now. Once a
        minute per session, so a group asking on through an outage is not flooded with it."""
        last = self.apologised.get(session_id)
        if last is not None and now - last < REFUSALS_EVERY:
            return False
        self.apologised[session_id] = now
        return True


# ---- what the plugin itself sent ------------------------------------------------------
ECHO_SECONDS = 120.0
"""How long a send of the plugin's own waits for its echo (NapCat's `message_sent`)."""
OWN_IDS_KEPT = 4096


class OwnSends:
    """The sends through the Bot (the plugin's own, other plugins'), so their echoes (the bot
    account's messages the implementation reports back) are not stored a second time: by the
    message id a send returned, and by its text for an echo that arrives before the send's
    response or after a response that gave no id (Lagrange's `message_id: 0`) (`said.py`)."""

    def __init__(self, now: Callable[[], float] = lambda: clock.now()) -> None:
        self._now = now
        self._pending: LRU[str, list[tuple[float, str]]] = LRU()
        """Per session, the texts of own sends not answered yet, with when they stop waiting."""
        self._ids: LRU[tuple[str, str], None] = LRU(OWN_IDS_KEPT)

    def expect(self, session_id: str, text: str) -> None:
        """An own send is about to go out."""
        now = self._now()
        waiting = [p for p in self._pending.get(session_id, []) if p[0] > now]
        self._pending[session_id] = [*waiting, (now + ECHO_SECONDS, text)]

    def sent(self, session_id: str, text: str, message_id: str | None) -> None:
        """Its response came. `message_id`: what it went out under, its echo's id. None (it
        said none, or it failed and may have gone out all the same): the text keeps waiting
        for its echo, until ECHO_SECONDS after the send."""
        if message_id is not None:
            self._take(session_id, text)
            self._ids[(session_id, message_id)] = None

    def failed(self, session_id: str, text: str) -> None:
        """It failed and nothing will store it: should it have gone out, its echo is stored."""
        self._take(session_id, text)

    def is_echo(self, session_id: str, message_id: str, text: str) -> bool:
        """Whether a message of the bot account is the echo of an own send (it is then forgotten)."""
        if self._ids.pop((session_id, message_id), False) is None:
            return True
        return self._take(session_id, text)

    def _take(self, session_id: str, text: str) -> bool:
        waiting = self._pending.get(session_id)
        if not waiting:
            return False
        now = self._now()
        for i, (until, said) in enumerate(waiting):
            if said == text and until > now:
                del waiting[i]
                break
        else:
            return False
        if not waiting:
            del self._pending[session_id]
        return True


@dataclass
class OneBotState:
    """Everything the OneBot layer keeps between events; the runtime owns one."""

    names: NameCache = field(default_factory=NameCache)
    arrivals: Arrivals = field(default_factory=Arrivals)
    recording: KeyedLocks = field(default_factory=KeyedLocks)
    accounts: dict[str, Any] = field(default_factory=dict)
    """Per connected account, its backfill on connect (recovery.Account)."""
    self_ids: set[str] = field(default_factory=set)
    """Every account that connected to this process (as many as the owner runs): another
    one's messages are a member's, never a question to this one (recovery.another_account)."""
    refusals: Refusals = field(default_factory=Refusals)
    own_sends: OwnSends = field(default_factory=OwnSends)
    """The plugin's own sends whose echoes are not stored again (`said.py`)."""
    withdrawn: LRU[tuple[str, str], None] = field(default_factory=lambda: LRU(OWN_IDS_KEPT))
    """(session, platform message id) of messages withdrawn (撤回) lately: an answer does not
    quote one (`send.replier`)."""
    sent: LRU[str, list[Any]] = field(default_factory=LRU)
    """Per session, what went out through the Bot that the backfill must not store as the
    account's words (`said._remember_sent`), also while the store refuses to keep it."""
    recording_said: set[asyncio.Task[None]] = field(default_factory=set)
    """Messages other plugins sent being stored (`said.py`): kept until done."""
