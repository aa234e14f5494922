"""When a turn's end starts a background compression, and the back-off after failures (R-TRIG, R-BACK)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from nonebot_plugin_memsum.compression.budget import Number, compression_line, finite_positive

MAX_WAIT = 32
"""R-BACK-3: the longest back-off, in judged turns."""


@dataclass(frozen=True, slots=True)
class UsageFacts:
    """What the last model call of a turn reported (its usage event)."""

    turn_id: str | None
    """None for a snapshot, which is never judged (R-TRIG-5)."""
    usage: int
    window: int | None
    trim_budget: int | None
    trimmed: bool
    """The turn's prompt was hard-trimmed."""
    untrimmed_history: int
    """The compressible part: history and tool results over the untrimmed list."""
    history_messages: int
    """Active conversation messages at turn start plus those the turn added."""
    history_limit: int | None
    platform: str | None
    platform_type: str | None


def usage_due(facts: UsageFacts, compress_at: Number | None) -> bool:
    """R-TRIG-3: (usage ≥ E or hard-trimmed) and the compressible part ≥ E / 2.

    R-CFG-4: compress_at 0 (or None, the service's answer for 0) turns this line
    off, although the budget still takes the trim budget as its line then.
    """
    if facts.turn_id is None or finite_positive(compress_at) is None:
        return False
    line = compression_line(compress_at, facts.window, facts.trim_budget)
    if line is None:
        return False
    return (facts.usage >= line or facts.trimmed) and 2 * facts.untrimmed_history >= line


def count_due(history_messages: int, outcome: str, history_limit: int | None) -> bool:
    """R-TRIG-4: the count at turn end reaches the count line; a replied turn stores one more."""
    if not history_limit or history_limit <= 0:
        return False
    count = history_messages + (1 if outcome == "replied" else 0)
    return count >= history_limit


def compression_due(facts: UsageFacts, compress_at: Number | None, outcome: str) -> bool:
    """R-TRIG-2: either line due starts a compression."""
    if facts.turn_id is None:
        return False
    return usage_due(facts, compress_at) or count_due(facts.history_messages, outcome, facts.history_limit)


@dataclass(frozen=True, slots=True)
class Backoff:
    """R-BACK-3: failures in a row and judged turns since the last one.

    Per judged turn call `on_judged_turn()` first, then `may_run()`; after an attempt
    `on_failure()` or `on_success()`. R-BACK-4: success and a clear forget it (a
    fresh `Backoff()`); a run cancelled by a clear is no failure.
    """

    failures: int = 0
    turns_waited: int = 0

    @property
    def wait(self) -> int:
        """Judged turns to wait after the k-th failure in a row: 2^k, at most 32."""
        return min(2 ** min(self.failures, 6), MAX_WAIT)

    def on_judged_turn(self) -> Backoff:
        return replace(self, turns_waited=self.turns_waited + 1) if self.failures else self

    def may_run(self) -> bool:
        return self.failures == 0 or self.turns_waited >= self.wait

    def on_failure(self) -> Backoff:
        return Backoff(failures=self.failures + 1, turns_waited=0)

    def on_success(self) -> Backoff:
        return Backoff()
