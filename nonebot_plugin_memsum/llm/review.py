"""Which item of a request a provider's content review refuses (LLMInputRefused).

Chinese providers review every request's input and refuse the whole request when any part
of it is judged sensitive, so one member's message in a group's active history made every
later request of that group fail: every chat turn, and every compression (R-RUN-1 sends the
whole active history), for good. `find_refused` finds the item(s) by bisection: halves of
the refused items asked alone (a probe each, answered or refused), down to the item that is
refused alone. The callers send those as a placeholder from then on (types.REFUSED_KEY).

Probes: a culprit among n items costs at most 2·⌈log2 n⌉ + 1 probes; `limit` bounds a
search (MAX_PROBES by default), and `ProbeLimit` says the search stopped there, with the
culprits found so far.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from .errors import LLMContentFilter, LLMInputRefused, LLMLengthLimit

T = TypeVar("T")
MAX_PROBES = 24
"""Probes one search may make: two culprits among 64 items need at most 2 × 13 (a chat turn or
a compression run makes one search; the next one goes on from what this one marked)."""
REVIEW_ROUNDS = 3
"""Times one chat turn or one compression run may find refused messages and ask again (each a
search of at most MAX_PROBES probes; a round that finds nothing ends it): a spam wave of
several refused messages is found in one go, and the next turn or run goes on from the marks."""
PROBE_MAX_TOKENS = 16
"""A probe's output cap: only whether the provider takes the input matters."""


class ProbeLimit(Exception):
    """The search made `limit` probes without finishing; `found`: the culprits found so far."""

    def __init__(self, found: list[object]) -> None:
        super().__init__(f"stopped after the probe limit with {len(found)} found")
        self.found = found


async def refused_by_review(call: Awaitable[object]) -> bool:
    """A probe's verdict: True when the provider's review refused its input; False when it
    answered (also cut at the output cap, or with its reply filtered: the input passed).
    Any other error comes out as it is (the provider is down: the search cannot go on)."""
    try:
        await call
    except LLMInputRefused:
        return True
    except LLMLengthLimit | LLMContentFilter:
        return False
    return False


async def find_refused(
    items: Sequence[T], refused: Callable[[Sequence[T]], Awaitable[bool]], *, limit: int = MAX_PROBES
) -> list[T]:
    """The items that a request is refused for, each alone, given that a request with all of
    `items` was refused. Empty when no item is refused alone (the combination is: nothing to
    leave out). `refused(subset)` makes one probe; ProbeLimit after `limit` of them."""
    found: list[T] = []
    probes = 0

    async def probe(subset: Sequence[T]) -> bool:
        nonlocal probes
        if probes >= limit:
            raise ProbeLimit(list(found))
        probes += 1
        return await refused(subset)

    async def search(subset: Sequence[T], known: bool) -> None:
        # `known`: a request with just `subset` was refused (else only inferred).
        if len(subset) == 1:
            if known or await probe(subset):
                found.append(subset[0])
            return
        half = len(subset) // 2
        left, right = subset[:half], subset[half:]
        before = len(found)
        if await probe(left):
            await search(left, True)
        if len(found) > before:  # the left half had its culprit: the right one may hold more
            if await probe(right):
                await search(right, True)
        else:  # the left half passed: what is refused is in the right one (if anything alone)
            await search(right, False)

    await search(list(items), True)
    return found


__all__ = [
    "MAX_PROBES",
    "PROBE_MAX_TOKENS",
    "REVIEW_ROUNDS",
    "ProbeLimit",
    "find_refused",
    "refused_by_review",
]
