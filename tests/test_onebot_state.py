"""The OneBot layer's state is owned by the runtime and bounded (issue 10 item 10): a bot
in thousands of groups keeps at most so many names and so many bytes of them, forgets
names nobody used for a day, and keeps no ticket or lock once a session is quiet."""

import asyncio

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.lru import BoundedCache, KeyedLocks
from nonebot_plugin_memsum.onebot.state import Arrivals, NameCache, OneBotState


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_the_runtime_owns_the_onebot_state() -> None:
    assert isinstance(runtime.get().onebot, OneBotState)


def test_names_are_bounded_by_entries_least_recently_used_first() -> None:
    names = NameCache(max_entries=3, max_bytes=10**9, idle_seconds=10**9, now=FakeClock())
    for uid in range(3):
        names.put("g", uid, f"成员{uid}")
    assert names.get("g", 0) == "成员0"  # 0 is now the most recently used
    names.put("g", 3, "成员3")
    assert len(names) == 3
    assert names.get("g", 1) is None
    assert [names.get("g", u) for u in (0, 2, 3)] == ["成员0", "成员2", "成员3"]


def test_names_are_bounded_by_approximate_bytes() -> None:
    names = NameCache(max_entries=10**9, max_bytes=50_000, idle_seconds=10**9, now=FakeClock())
    for uid in range(10_000):
        names.put(f"onebot:10000:group:{uid % 100}", uid, "名" * 30)
    assert names.bytes <= 50_000
    assert 0 < len(names) < 10_000
    assert names.get("onebot:10000:group:99", 9_999) == "名" * 30  # the newest stays


def test_names_expire_and_idle_ones_are_dropped() -> None:
    clock = FakeClock()
    names = NameCache(max_entries=100, max_bytes=10**9, idle_seconds=600, now=clock)
    names.put("g", 1, "甲", ttl=60)
    names.put("g", 2, "乙", ttl=3600)
    clock.t += 61
    assert names.get("g", 1) is None  # expired: looked up again
    assert names.get("g", 2) == "乙"
    clock.t += 601
    names.put("g", 3, "丙")  # any write sweeps entries idle for longer than idle_seconds
    assert len(names) == 1
    assert names.get("g", 3) == "丙"


def test_replacing_a_value_keeps_the_byte_count_true() -> None:
    cache: BoundedCache[str, str] = BoundedCache(
        max_entries=10, max_bytes=10**6, idle_seconds=10**6, size=lambda k, v: len(v), now=FakeClock()
    )
    cache.put("a", "x" * 10, 60)
    cache.put("a", "y" * 3, 60)
    cache.put("b", "z" * 5, 60)
    assert cache.bytes == 8
    cache.pop("a")
    assert cache.bytes == 5


async def test_no_ticket_or_lock_is_kept_once_a_session_is_quiet() -> None:
    arrivals, locks = Arrivals(), KeyedLocks()
    for sid in (f"onebot:1:group:{g}" for g in range(1000)):
        ticket = arrivals.take(sid)
        async with locks.hold(sid):
            pass
        arrivals.done(ticket)
    assert len(arrivals) == 0
    assert len(locks) == 0


async def test_keyed_locks_serialise_in_arrival_order_and_then_go() -> None:
    locks, order = KeyedLocks(), []

    async def hold(i: int) -> None:
        async with locks.hold("s"):
            await asyncio.sleep(0)
            order.append(i)

    await asyncio.gather(*(hold(i) for i in range(5)))
    assert order == [0, 1, 2, 3, 4]
    assert len(locks) == 0


async def test_a_ticket_taken_for_an_event_is_released_with_it() -> None:
    # What NoneBot drops without any handler of ours storing it (another plugin blocked
    # it) must not hold back the session's later messages: the preprocessor releases it
    # when the event's handling ends.
    class Event:
        pass

    arrivals = Arrivals()
    event = Event()
    first = arrivals.take_for(event, "s")
    assert arrivals.of(event) == first
    assert arrivals.of(Event()) is None
    later = arrivals.take("s")
    waiting = asyncio.create_task(arrivals.wait_turn(later))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    arrivals.release(event)
    await waiting
    assert arrivals.of(event) is None
    arrivals.done(later)
    assert len(arrivals) == 0
