"""When a turn's end starts a compression, and the back-off (R-TRIG-2..4, R-BACK-3/4)."""

from __future__ import annotations

from dataclasses import replace

from nonebot_plugin_memsum.compression.trigger import (
    Backoff,
    UsageFacts,
    compression_due,
    count_due,
    usage_due,
)

# E = min(0.8 × 100000, 90000) = 80000; E / 2 = 40000
FACTS = UsageFacts(
    turn_id="t1",
    usage=80_000,
    window=100_000,
    trim_budget=90_000,
    trimmed=False,
    untrimmed_history=40_000,
    history_messages=10,
    history_limit=None,
    platform="onebot",
    platform_type="group",
)


def test_r_trig_3_due_at_the_line() -> None:
    assert usage_due(FACTS, 0.8)
    assert not usage_due(replace(FACTS, usage=79_999), 0.8)


def test_r_trig_3_line_is_min_with_trim_budget() -> None:
    facts = replace(FACTS, trim_budget=60_000, usage=60_000, untrimmed_history=30_000)
    assert usage_due(facts, 0.8)
    assert not usage_due(replace(facts, usage=59_999), 0.8)


def test_r_trig_3_hard_trim_counts_as_reaching_the_line() -> None:
    assert usage_due(replace(FACTS, usage=50_000, trimmed=True), 0.8)


def test_r_trig_3_needs_half_the_line_compressible() -> None:
    assert not usage_due(replace(FACTS, untrimmed_history=39_999), 0.8)
    assert not usage_due(replace(FACTS, untrimmed_history=39_999, trimmed=True), 0.8)


def test_r_trig_3_compress_at_0_turns_the_usage_line_off() -> None:
    # R-CFG-4, although the budget's line would be the trim budget then
    assert not usage_due(replace(FACTS, usage=99_000, trimmed=True), 0)
    assert not usage_due(replace(FACTS, usage=99_000, trimmed=True), None)


def test_r_trig_3_no_line_without_window() -> None:
    assert not usage_due(replace(FACTS, window=None, trimmed=True), 0.8)
    assert not usage_due(replace(FACTS, trim_budget=0, trimmed=True), 0.8)


def test_r_trig_4_count_line() -> None:
    assert count_due(20, "silent", 20)
    assert not count_due(19, "silent", 20)
    assert count_due(19, "replied", 20)  # the final reply is stored afterwards


def test_r_trig_4_no_count_line() -> None:
    assert not count_due(10_000, "replied", 0)
    assert not count_due(10_000, "replied", None)


def test_r_trig_2_either_line_starts_a_compression() -> None:
    below = replace(FACTS, usage=1_000, history_messages=19, history_limit=20)
    assert not compression_due(below, 0.8, "silent")
    assert compression_due(below, 0.8, "replied")  # count line
    assert compression_due(replace(below, usage=80_000), 0.8, "silent")  # usage line
    assert compression_due(replace(below, usage=80_000), 0, "replied")  # usage off, count on


def test_r_trig_2_snapshot_is_not_judged() -> None:
    snapshot = replace(FACTS, turn_id=None, history_limit=1)
    assert not compression_due(snapshot, 0.8, "replied")
    assert not usage_due(snapshot, 0.8)


def attempts(turns: int) -> list[int]:
    """Judged turns 1..turns, every one due, every attempt failing."""
    backoff = Backoff()
    tried: list[int] = []
    for turn in range(1, turns + 1):
        backoff = backoff.on_judged_turn()
        if backoff.may_run():
            tried.append(turn)
            backoff = backoff.on_failure()
    return tried


def test_r_back_3_retry_after_2_4_8_16_32_then_every_32() -> None:
    # fail at 1 → wait 2 → 3 → wait 4 → 7 → 8 → 15 → 16 → 31 → 32 → 63 → 32 → 95 ...
    assert attempts(70) == [1, 3, 7, 15, 31, 63]
    assert attempts(200) == [1, 3, 7, 15, 31, 63, 95, 127, 159, 191]


def test_r_back_3_waits_for_judged_turns_only() -> None:
    backoff = Backoff().on_failure()
    assert not backoff.may_run()  # usage growth alone does not shorten the wait
    assert not backoff.on_judged_turn().may_run()
    assert backoff.on_judged_turn().on_judged_turn().may_run()


def test_r_back_4_success_forgets_the_back_off() -> None:
    backoff = Backoff().on_failure().on_failure().on_failure()
    assert backoff.wait == 8
    assert backoff.on_success() == Backoff()
    assert backoff.on_success().may_run()
