"""Budget arithmetic (R-BUD), exact: every expected value below is worked out by hand."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from nonebot_plugin_memsum.compression.budget import (
    Budget,
    budget_over_units,
    compression_line,
    compute_budget,
    exact,
    physical_cap,
)
from nonebot_plugin_memsum.compression.templates import CHAT, system_prompt


def budget_of(
    *,
    line: Fraction | None,
    ratio: float = 0.1,
    window: int = 128_000,
    max_output: int | None = 16_384,
    existing: int = 5_000,
    units: int = 45_000,
) -> Budget:
    return compute_budget(
        line=line,
        ratio=ratio,
        summary_window=window,
        summary_max_output=max_output,
        existing_summary_tokens=existing,
        units_tokens=units,
    )


def test_r_bud_1_line_is_min_of_compress_at_times_window_and_trim_budget() -> None:
    assert compression_line(0.8, 100_000, 90_000) == 80_000  # 0.8 × 100000 exactly
    assert compression_line(0.8, 100_000, 60_000) == 60_000


def test_r_bud_1_compress_at_0_takes_the_trim_budget() -> None:
    assert compression_line(0, 100_000, 90_000) == 90_000
    assert compression_line(None, 100_000, 90_000) == 90_000


def test_r_bud_1_budget_is_line_times_ratio() -> None:
    # E 80000 × 0.1 = 8000; content 50000, E/4 20000, ⅔ × 16384 ≈ 10922.67 do not bind.
    b = budget_of(line=compression_line(0.8, 100_000, 90_000))
    assert b.budget == 8_000
    assert b.line == 80_000


def test_r_bud_1_decimal_settings_are_exact() -> None:
    # 0.1 and 0.3 are read as 1/10 and 3/10, not their binary neighbours.
    b = budget_of(
        line=compression_line(0.3, 100_000, 90_000), window=1_000_000, max_output=40_000, units=100_000
    )
    assert b.line == 30_000
    assert b.budget == 3_000  # E / 4 = 7500 and ⅔ × 40000 do not bind
    assert isinstance(b.budget, Fraction)


def test_r_bud_2_budget_at_most_what_is_compressed() -> None:
    # E × ratio = 8000, content = 500 + 2500 = 3000.
    b = budget_of(line=Fraction(80_000), existing=500, units=2_500)
    assert b.budget == 3_000


def test_r_bud_3_floor_of_1000() -> None:
    # content 300 < 1000: the floor lifts it; E / 4 = 20000 does not bind.
    b = budget_of(line=Fraction(80_000), existing=100, units=200)
    assert b.budget == 1_000


def test_r_bud_3_cap_wins_over_floor() -> None:
    # E = min(0.5 × 4000, 4000) = 2000; 2000 × 0.1 = 200 → floor 1000 → E / 4 = 500.
    b = budget_of(line=compression_line(0.5, 4_000, 4_000))
    assert b.budget == 500


def test_r_bud_4_keep_cap_is_floor_of_ratio_times_new_conversation() -> None:
    # budget 8000; ⌊0.1 × 12345⌋ = ⌊1234.5⌋ = 1234.
    b = budget_of(line=Fraction(80_000), existing=0, units=12_345)
    assert b.keep_cap == 1_234


def test_r_bud_4_keep_cap_ignores_the_existing_summary() -> None:
    # content 101000 gives budget 8000, but the keep cap is ⌊0.1 × 1000⌋ = 100.
    b = budget_of(line=Fraction(80_000), existing=100_000, units=1_000)
    assert b.budget == 8_000
    assert b.keep_cap == 100


def test_r_bud_4_keep_cap_at_most_budget() -> None:
    # ratio 0.5: E × 0.5 = 5000 → E / 4 = 2500; ⌊0.5 × 20000⌋ = 10000 → keep cap 2500.
    b = budget_of(line=Fraction(10_000), ratio=0.5, existing=0, units=20_000)
    assert b.budget == 2_500
    assert b.keep_cap == 2_500


def test_r_bud_4_ratio_0_keeps_nothing() -> None:
    b = budget_of(line=Fraction(80_000), ratio=0)
    assert b.keep_cap == 0
    assert b.budget == 1_000  # 0 → the floor


def test_r_bud_5_physical_cap() -> None:
    assert physical_cap(16_384, 128_000) == 16_384
    assert physical_cap(None, 128_000) == 4_096  # unknown output limit
    assert physical_cap(16_384, 8_000) == 2_000  # window / 4
    assert physical_cap(4_096, 10_002) == Fraction(5_001, 2)


def test_r_bud_5_output_8192_model_writes_at_most_5461() -> None:
    # E 800000 × 0.1 = 80000; ⅔ × 8192 = 16384/3 ≈ 5461.33.
    b = budget_of(line=Fraction(800_000), window=1_000_000, max_output=8_192, units=900_000)
    assert b.budget == Fraction(16_384, 3)
    assert b.shown == 5_461


def test_r_bud_5_physical_cap_wins_over_floor() -> None:
    # window 3000 → physical cap 750 → ⅔ = 500, under the floor of 1000.
    b = budget_of(line=Fraction(80_000), window=3_000, max_output=None)
    assert b.budget == 500


def test_r_bud_6_no_line_follows_content() -> None:
    assert budget_of(line=None, existing=1_000, units=2_000).budget == 3_000
    assert budget_of(line=None, existing=0, units=200).budget == 1_000
    # 4096 unknown output: ⅔ × 4096 = 8192/3
    assert budget_of(line=None, max_output=None, units=50_000).budget == Fraction(8_192, 3)


def test_r_bud_6_no_line_without_finite_positive_window_or_trim_budget() -> None:
    assert compression_line(0.8, None, 90_000) is None
    assert compression_line(0.8, 100_000, None) is None
    assert compression_line(0.8, float("inf"), 90_000) is None
    assert compression_line(0.8, float("nan"), 90_000) is None
    assert compression_line(0.8, 100_000, 0) is None
    assert compression_line(0.8, -5, 90_000) is None
    assert compression_line(0, 0, 90_000) is None


def test_r_bud_7_max_tokens_is_ceil_of_one_and_a_half_budget() -> None:
    # no line: budget = content 3001; 1.5 × 3001 = 4501.5 → 4502 ≤ 16384.
    b = budget_of(line=None, existing=1, units=3_000)
    assert b.max_tokens == 4_502


def test_r_bud_7_max_tokens_at_most_physical_cap() -> None:
    # window 10002: cap 2500.5, budget ⅔ × 2500.5 = 1667, 1.5 × 1667 = 2500.5 → ⌈⌉ 2501 → ⌊cap⌋ 2500.
    b = budget_of(line=None, window=10_002, max_output=4_096)
    assert b.budget == 1_667
    assert b.max_tokens == 2_500


def test_r_bud_7_prompt_states_budget_keep_cap_and_characters() -> None:
    b = budget_of(line=Fraction(80_000), existing=0, units=12_345)  # budget 8000, keep cap 1234
    prompt = system_prompt(CHAT, budget=b.shown, keep_cap=b.keep_cap)
    assert "约 8000 tokens（约 32000 个英文字符）" in prompt
    assert "不超过 1234 tokens" in prompt


finite_or_odd = st.one_of(
    st.none(),
    st.integers(min_value=-10, max_value=2_000_000),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=200)
@given(
    compress_at=st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
    window=finite_or_odd,
    trim=finite_or_odd,
    ratio=st.floats(min_value=0, max_value=0.5),
    summary_window=st.integers(min_value=1, max_value=2_000_000),
    max_output=st.one_of(st.none(), st.integers(min_value=1, max_value=200_000)),
    existing=st.integers(min_value=0, max_value=500_000),
    units=st.integers(min_value=0, max_value=2_000_000),
)
def test_r_bud_budget_invariants(
    compress_at: float | None,
    window: float | None,
    trim: float | None,
    ratio: float,
    summary_window: int,
    max_output: int | None,
    existing: int,
    units: int,
) -> None:
    line = compression_line(compress_at, window, trim)
    b = compute_budget(
        line=line,
        ratio=ratio,
        summary_window=summary_window,
        summary_max_output=max_output,
        existing_summary_tokens=existing,
        units_tokens=units,
    )
    if line is not None:
        assert 0 < line <= exact(trim if trim is not None else 0)  # R-BUD-1: never above the trim budget
    caps = [b.physical_cap * Fraction(2, 3)] + ([line / 4] if line is not None else [])
    assert all(b.budget <= c for c in caps)  # R-BUD-3/5: caps always hold
    assert b.budget >= min(Fraction(1_000), *caps)  # R-BUD-3: the floor, unless a cap is lower
    if b.budget > 1_000:
        assert b.budget <= existing + units  # R-BUD-2: above the floor, never more than the content
    assert 0 <= b.keep_cap <= b.budget  # R-BUD-4
    assert b.keep_cap <= exact(ratio) * units
    assert b.max_tokens <= b.physical_cap  # R-BUD-7
    assert b.max_tokens == min(math.ceil(b.budget * Fraction(3, 2)), math.floor(b.physical_cap))


@given(
    compress_at=st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
    window=finite_or_odd,
    trim=finite_or_odd,
    ratio=st.floats(min_value=0, max_value=0.5),
    summary_window=st.integers(min_value=1, max_value=2_000_000),
    max_output=st.one_of(st.none(), st.integers(min_value=1, max_value=200_000)),
    existing=st.integers(min_value=0, max_value=500_000),
    least=st.integers(min_value=0, max_value=2_000_000),
    more=st.integers(min_value=0, max_value=2_000_000),
)
def test_r_bud_2_budget_over_units_is_compute_budget_over_the_units_estimate(
    compress_at: float | None,
    window: float | None,
    trim: float | None,
    ratio: float,
    summary_window: int,
    max_output: int | None,
    existing: int,
    least: int,
    more: int,
) -> None:
    # Issue 15: the units' text estimate is worked out only when the least it can be does not
    # settle the budget; either way the budget is the one over the estimate itself.
    line = compression_line(compress_at, window, trim)
    sizes = {
        "line": line,
        "ratio": ratio,
        "summary_window": summary_window,
        "summary_max_output": max_output,
        "existing_summary_tokens": existing,
    }
    asked: list[int] = []

    def estimate() -> int:
        asked.append(least + more)
        return least + more

    got = budget_over_units(least_units_tokens=least, units_tokens=estimate, **sizes)
    assert got == compute_budget(units_tokens=least + more, **sizes)
    if more == 0:
        assert got == compute_budget(units_tokens=least, **sizes)


def test_r_bud_2_a_long_span_whose_budget_is_settled_is_not_estimated_again() -> None:
    def estimate() -> int:
        raise AssertionError("the stored estimates settle this budget")

    # line × ratio (2,560) far below what the stored estimates alone give: the budget is 2,560.
    b = budget_over_units(
        least_units_tokens=200_000,
        units_tokens=estimate,
        line=Fraction(25_600),
        ratio=0.1,
        summary_window=32_000,
        summary_max_output=None,
        existing_summary_tokens=0,
    )
    assert b.budget == Fraction(2_560)
    assert b.keep_cap == 2_560
