"""bot.py's garbage-collector policy (gcpolicy.py): what start-up left and what survives a
full collection is frozen; a cycle that dies frozen is freed once the hour is over."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from nonebot_plugin_memsum.gcpolicy import UNFREEZE_EVERY, GcPolicy


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def walked(obj: object) -> bool:
    """Whether a full collection would walk `obj` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


@pytest.fixture
def policy(clock: list[float]) -> Iterator[GcPolicy]:
    p = GcPolicy(clock=lambda: clock[0])
    yield p
    p.stop()


def test_start_freezes_what_start_up_left(policy: GcPolicy) -> None:
    before = Node()
    assert walked(before)
    frozen = policy.start()
    assert frozen == gc.get_freeze_count() > 0
    assert not walked(before)
    assert policy.start() == gc.get_freeze_count()  # idempotent: no second collection


def test_survivors_of_a_full_collection_are_frozen_younger_collections_leave_them(policy: GcPolicy) -> None:
    policy.start()
    later = Node()
    gc.collect(0)
    gc.collect(1)
    assert walked(later)
    gc.collect()
    assert not walked(later)


def test_a_cycle_that_dies_frozen_is_freed_after_the_hour(policy: GcPolicy, clock: list[float]) -> None:
    policy.start()
    node, alive = cycle()
    gc.collect()  # frozen while alive
    del node
    gc.collect()
    assert alive() is not None  # garbage, but frozen: not walked
    clock[0] += UNFREEZE_EVERY
    gc.collect()  # the hour is over: everything is given back after this one
    assert alive() is not None
    gc.collect()
    assert alive() is None
    # and freezing goes on after it
    kept = Node()
    gc.collect()
    assert not walked(kept)


def test_stop_gives_everything_back(policy: GcPolicy) -> None:
    policy.start()
    node, alive = cycle()
    gc.collect()
    policy.stop()
    assert gc.get_freeze_count() == 0
    assert walked(node)
    del node
    gc.collect()
    assert alive() is None
    later = Node()
    gc.collect()
    assert walked(later)  # no longer frozen after a full collection
