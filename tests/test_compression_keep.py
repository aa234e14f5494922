"""Checking the model's choice of originals (R-RUN-8) and the count rule (R-BACK-1/2)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from nonebot_plugin_memsum.compression.budget import compute_budget
from nonebot_plugin_memsum.compression.keep import apply_count_rule, select_kept
from nonebot_plugin_memsum.compression.parse import ParsedReply
from nonebot_plugin_memsum.compression.units import Part, Unit, build_units, number_units
from tests.fakes.compression import EST, assistant, result, user


def offered_parts(*costs: int) -> dict[int, Part]:
    """Numbered parts 1.. whose verbatim cost is `costs` (a user message of cost − 4 characters)."""
    units = build_units([user("x" * (c - 4)) for c in costs])
    parts = number_units(units, keep_cap=10_000, capacity=100_000, est=EST)
    return {p.number: p for p in parts if p.number is not None}


def reply(*numbers: int, summary: str = "摘要") -> ParsedReply:
    return ParsedReply(summary, numbers, block_unreadable=False)


def test_r_run_8_numbers_not_offered_are_dropped() -> None:
    offered = offered_parts(10, 20, 30)
    chosen = select_kept(reply(2, 9, 0), offered, keep_cap=1000, budget=Fraction(2000), summary_tokens=100)
    assert [p.number for p in chosen.kept] == [2]
    assert not chosen.no_heading
    assert not chosen.unreadable


def test_r_run_8_over_keep_cap_drops_the_earliest() -> None:
    offered = offered_parts(40, 50, 60)
    # 40 + 50 + 60 = 150 > keep cap 120 → drop #1 → 110 ≤ 120
    chosen = select_kept(reply(3, 1, 2), offered, keep_cap=120, budget=Fraction(5000), summary_tokens=100)
    assert [p.number for p in chosen.kept] == [2, 3]


def test_r_run_8_budget_minus_summary_binds_too() -> None:
    offered = offered_parts(40, 50, 60)
    # min(keep cap 1000, budget 1100 − summary 1000 = 100): 150 → 110 → 60
    chosen = select_kept(reply(1, 2, 3), offered, keep_cap=1000, budget=Fraction(1100), summary_tokens=1000)
    assert [p.number for p in chosen.kept] == [3]
    # the summary alone over budget: nothing kept
    chosen = select_kept(reply(1), offered, keep_cap=1000, budget=Fraction(900), summary_tokens=1000)
    assert chosen.kept == ()


def test_r_run_8_no_heading_keeps_nothing_and_warns_only_when_numbers_were_offered() -> None:
    no_heading = ParsedReply("摘要", None, block_unreadable=False)
    chosen = select_kept(no_heading, offered_parts(10), keep_cap=100, budget=Fraction(1000), summary_tokens=2)
    assert chosen.kept == ()
    assert chosen.no_heading
    chosen = select_kept(no_heading, {}, keep_cap=100, budget=Fraction(1000), summary_tokens=2)
    assert not chosen.no_heading


def test_r_run_8_unreadable_block_keeps_nothing_and_warns() -> None:
    unreadable = ParsedReply("摘要", (), block_unreadable=True)
    chosen = select_kept(unreadable, offered_parts(10), keep_cap=100, budget=Fraction(1000), summary_tokens=2)
    assert chosen.kept == ()
    assert chosen.unreadable


@settings(max_examples=200)
@given(
    costs=st.lists(st.integers(min_value=4, max_value=300), max_size=12),
    numbers=st.lists(st.integers(min_value=0, max_value=20), max_size=15),
    keep_cap=st.integers(min_value=0, max_value=2000),
    budget=st.integers(min_value=0, max_value=3000),
    summary_tokens=st.integers(min_value=0, max_value=3000),
)
def test_r_run_8_selection_keeps_only_offered_within_limit(
    costs: list[int], numbers: list[int], keep_cap: int, budget: int, summary_tokens: int
) -> None:
    offered = offered_parts(*costs)
    chosen = select_kept(
        reply(*numbers), offered, keep_cap=keep_cap, budget=Fraction(budget), summary_tokens=summary_tokens
    )
    kept = [p.number for p in chosen.kept if p.number is not None]
    assert len(kept) == len(chosen.kept)
    assert all(n in offered and n in numbers for n in kept)
    assert kept == sorted(set(kept))
    assert sum(p.cost for p in chosen.kept) <= max(0, min(keep_cap, budget - summary_tokens))


def test_r_back_1_keep_cap_is_not_lifted_by_the_floor() -> None:
    # E 5000 × 0.1 = 500 is lifted to 1000 (E / 4 = 1250); the keep cap stays ⌊0.1 × 2000⌋ = 200
    b = compute_budget(
        line=Fraction(5_000),
        ratio=0.1,
        summary_window=128_000,
        summary_max_output=None,
        existing_summary_tokens=0,
        units_tokens=2_000,
    )
    assert b.budget == 1_000
    assert b.keep_cap == 200
    offered = offered_parts(150, 120)
    chosen = select_kept(reply(1, 2), offered, keep_cap=b.keep_cap, budget=b.budget, summary_tokens=300)
    assert [p.number for p in chosen.kept] == [2]  # 270 > 200 → drop #1


def units_of(*sizes: int) -> list[Unit]:
    """Units of 1 message (size 1) or a tool group of `size` messages (call + size − 1 results)."""
    span = []
    for k, size in enumerate(sizes):
        if size == 1:
            span.append(user(f"[甲(1)] {k}"))
        else:
            ids = [f"c{k}-{j}" for j in range(size - 1)]
            span.append(assistant("", *[(i, "f", "{}") for i in ids]))
            span.extend(result(i) for i in ids)
    return build_units(span)


def test_r_back_2_kept_cut_to_half_the_count_line_earliest_first() -> None:
    kept = units_of(1, 3, 1)  # 5 messages
    # limit 10 → half 5; 5 kept + 2 after the cut = 7 → drop the 1 → 6 → drop the group → 3
    assert apply_count_rule(kept, 2, 10) == (kept[2],)
    # limit 11 → half 5 as well
    assert apply_count_rule(kept, 2, 11) == (kept[2],)
    # limit 14 → half 7: 5 + 2 fits
    assert apply_count_rule(kept, 2, 14) == tuple(kept)


def test_r_back_2_tool_group_goes_whole() -> None:
    kept = units_of(4, 1)
    # half 3: 5 kept + 0 after → dropping the group (4 messages) leaves 1
    assert apply_count_rule(kept, 0, 6) == (kept[1],)


def test_r_back_2_none_kept_when_after_cut_reaches_half() -> None:
    kept = units_of(1, 1)
    assert apply_count_rule(kept, 5, 10) == ()
    assert apply_count_rule(kept, 6, 10) == ()
    assert apply_count_rule(kept, 4, 10) == (kept[1],)  # 2 + 4 = 6 > 5 → drop one


def test_r_back_2_no_limit_no_rule() -> None:
    kept = units_of(1, 3, 1)
    assert apply_count_rule(kept, 100, 0) == tuple(kept)
    assert apply_count_rule(kept, 100, None) == tuple(kept)
