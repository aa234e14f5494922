"""Which originals stay verbatim: the model's choice checked (R-RUN-8) and the count rule (R-BACK-2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from nonebot_plugin_memsum.compression.parse import ParsedReply
from nonebot_plugin_memsum.compression.units import Part, Unit


@dataclass(frozen=True, slots=True)
class Selection:
    kept: tuple[Part, ...]
    """The kept parts in time order."""
    no_heading: bool
    """Warn: the reply has no 【保留原文】 heading although numbers were offered."""
    unreadable: bool
    """Warn: the block has words but no number."""


def select_kept(
    reply: ParsedReply, offered: Mapping[int, Part], *, keep_cap: int, budget: Fraction, summary_tokens: int
) -> Selection:
    """R-RUN-8: keep the offered numbers the reply names, within min(keep cap, budget − summary).

    Numbers not offered in this request are dropped; over the limit, the earliest go
    first (the summary covers them).
    """
    if reply.numbers is None:
        return Selection((), no_heading=bool(offered), unreadable=False)
    parts = [offered[n] for n in sorted(set(reply.numbers)) if n in offered]
    limit = min(Fraction(keep_cap), budget - summary_tokens)
    total = sum(p.cost for p in parts)
    while parts and total > limit:
        total -= parts.pop(0).cost
    return Selection(tuple(parts), no_heading=False, unreadable=reply.block_unreadable)


def apply_count_rule(
    kept: Sequence[Unit], after_cut_count: int, history_limit: int | None
) -> tuple[Unit, ...]:
    """R-BACK-2: kept originals + conversation after the cut ≤ ⌊history_limit / 2⌋.

    `after_cut_count` counts the conversation messages after the cut point (event
    markers not counted). Whole units go, the earliest first; when the messages
    after the cut already reach half the limit, none stays. No limit, no rule.
    """
    if not history_limit or history_limit <= 0:
        return tuple(kept)
    half = history_limit // 2
    if after_cut_count >= half:
        return ()
    units = list(kept)
    count = sum(m.is_conversation for u in units for m in u.messages)
    while units and count + after_cut_count > half:
        count -= sum(m.is_conversation for m in units.pop(0).messages)
    return tuple(units)
