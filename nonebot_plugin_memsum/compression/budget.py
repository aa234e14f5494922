"""Budget arithmetic of a compression (R-BUD), exact in fractions.

Settings and usage figures arrive as floats or ints; a float is read as the decimal
it prints as (0.8 → 4/5), so `0.8 × 100000` is exactly 80000 and a hand-computed
expectation in a test is the value the code reaches. Rounding happens only where
the specification says: ⌊ ⌋ for the keep cap, ⌈ ⌉ for max_tokens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

Number = int | float | Fraction

BUDGET_FLOOR = 1000
"""R-BUD-3: enough room to write every section even when little is compressed."""
DEFAULT_MAX_OUTPUT = 4096
"""R-BUD-5: the output limit assumed for a summary model that declares none."""


def exact(value: Number) -> Fraction:
    """`value` as an exact fraction; a float as the decimal it prints as."""
    if isinstance(value, float):
        return Fraction(repr(value))
    return Fraction(value)


def finite_positive(value: Number | None) -> Fraction | None:
    """`value` when it is a finite positive number, else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    v = exact(value)
    return v if v > 0 else None


@functools.lru_cache(maxsize=256)  # every turn asks it twice, with the same few numbers
def compression_line(
    compress_at: Number | None, window: Number | None, trim_budget: Number | None
) -> Fraction | None:
    """The session's compression line E in tokens, or None when there is none.

    R-TRIG-3 / R-BUD-1: E = min(compress_at × window, trim budget); with compress_at
    0 (or None, the service's answer for 0) E is the trim budget. This is the line
    the budget is taken from; whether the usage line triggers at all is the
    trigger's business (R-CFG-4: compress_at 0 turns it off). R-BUD-6: a window or
    trim budget that is missing or not a finite positive number gives no line.
    """
    w = finite_positive(window)
    t = finite_positive(trim_budget)
    if w is None or t is None:
        return None
    at = finite_positive(compress_at)
    return t if at is None else min(at * w, t)


def physical_cap(max_output_tokens: int | None, window: int) -> Fraction:
    """R-BUD-5: min(the summary model's output limit (4096 unknown), its window / 4).

    Kept as a fraction (window / 4 need not be whole); max_tokens is its floor, the
    largest whole number of output tokens that stays under it.
    """
    return min(Fraction(max_output_tokens or DEFAULT_MAX_OUTPUT), Fraction(window, 4))


@dataclass(frozen=True, slots=True)
class Budget:
    """The sizes one compression works to (tokens)."""

    line: Fraction | None
    """The compression line E the budget was taken from; None without usage."""
    budget: Fraction
    """Summary and kept originals together (R-BUD-1..3, 5, 6)."""
    keep_cap: int
    """Kept originals at most (R-BUD-4)."""
    physical_cap: Fraction
    """min(max output, window / 4) of the summary model (R-BUD-5)."""
    max_tokens: int
    """The request's output limit: ⌈1.5 × budget⌉, at most ⌊physical cap⌋ (R-BUD-7)."""

    @property
    def shown(self) -> int:
        """The budget as the prompt states it, in whole tokens."""
        return math.floor(self.budget)


def compute_budget(
    *,
    line: Fraction | None,
    ratio: Number,
    summary_window: int,
    summary_max_output: int | None,
    existing_summary_tokens: int,
    units_tokens: int,
) -> Budget:
    """The budget of one compression.

    `line` is `compression_line(...)` over the latest usage; `units_tokens` the text
    estimate of the rendered units (without numbering annotations), which is also the
    "newly compressed conversation" the keep cap is a ratio of (R-BUD-4: the content
    minus the existing summary).
    """
    r = exact(ratio)
    cap = physical_cap(summary_max_output, summary_window)
    content = Fraction(existing_summary_tokens + units_tokens)
    if line is None:
        # R-BUD-6: no line, the budget follows what is compressed.
        budget = max(content, Fraction(BUDGET_FLOOR))
    else:
        budget = min(line * r, content)  # R-BUD-1, R-BUD-2
        budget = max(budget, Fraction(BUDGET_FLOOR))  # R-BUD-3 floor ...
        budget = min(budget, line / 4)  # ... which E / 4 overrides
    budget = min(budget, cap * Fraction(2, 3))  # R-BUD-5: wins over the floor too
    keep_cap = min(math.floor(budget), math.floor(r * units_tokens))  # R-BUD-4
    max_tokens = min(math.ceil(budget * Fraction(3, 2)), math.floor(cap))  # R-BUD-7
    return Budget(line=line, budget=budget, keep_cap=keep_cap, physical_cap=cap, max_tokens=max_tokens)


_UNBOUNDED = 2**62
"""More tokens than any conversation has: `compute_budget` over it is its limit."""


def budget_over_units(
    *,
    least_units_tokens: int,
    units_tokens: Callable[[], int],
    line: Fraction | None,
    ratio: Number,
    summary_window: int,
    summary_max_output: int | None,
    existing_summary_tokens: int,
) -> Budget:
    """`compute_budget` with the units' text estimate (`units_tokens()`, R-BUD-2) worked out
    only when it can change the budget. Every size of the budget grows with it (each step is
    a min or max with it, or a product of it), so when the least it can be
    (`least_units_tokens`) and no bound at all give the same budget, it gives that one too:
    a long span (its line × ratio far below what is compressed) is not tokenised again."""

    def over(units: int) -> Budget:
        return compute_budget(
            line=line,
            ratio=ratio,
            summary_window=summary_window,
            summary_max_output=summary_max_output,
            existing_summary_tokens=existing_summary_tokens,
            units_tokens=units,
        )

    least = over(least_units_tokens)
    if least == over(_UNBOUNDED):
        return least
    return over(units_tokens())
