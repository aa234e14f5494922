"""Audit 21 (sbud): edges of R-BUD and R-TRIG-3 that only the pure functions pinned, checked
end to end through a private runtime (a real SQLite file, the scripted model server). The
expected numbers are worked out by hand from spec/plugin-memory-summary.zh.md (摘要预算,
何时压缩) before reading the product's code."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from nonebot_plugin_memsum.agent.events import UsageEvent
from tests.fakes.llm_server import Reply
from tests.fakes.service import GROUP, IN_GROUP, Make, seed, settle, stated, units_tokens, usage


# 「有效阈值 E 取「压缩线 × 窗口」与 agent 裁剪预算的较小者,用量到 E …,且可压缩部分至少是 E 的一半」:
# window 10001 at compress_at 0.8 is E = min(8000.8, 10001 − 1024) = 8000.8, a line no whole
# usage equals. The usage event reports the line in whole tokens (8000) for display; a turn
# that used 8000 tokens has not reached E, one that used 8001 has.
@pytest.mark.parametrize(("used", "due"), [(8000, False), (8001, True)])
async def test_r_trig_3_a_fractional_line_is_reached_only_by_the_token_over_it(
    make: Make, used: int, due: bool
) -> None:
    env = await make(chat={"context_window": 10001}, memsum_compress_at=0.8)
    rt = env.rt
    await seed(rt, 60, size=120)
    events: list[UsageEvent] = []
    rt.bus.subscribe(UsageEvent, lambda e: events.append(e) if e.turn_id else None)
    env.model.chat.append(Reply("好的", usage=usage(used)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    (u,) = events
    assert (u.usage, u.trim_budget, u.line, u.trimmed) == (used, 8977, 8000, False)
    assert 2 * u.untrimmed_history >= Fraction(80008, 10)  # at least E / 2: the usage decides
    assert (("start", None) in env.phases()) is due


# 「预算 … = 这个会话的压缩线 × summaryBudgetRatio … 也不超过压缩线的四分之一」 and 「保留上限 =
# min(预算, ⌊summaryBudgetRatio × 这次新压的对话⌋)」 at the ratio's upper end 0.5: window 28571 at
# compress_at 0.7 is E = 19999.7 (trim budget 27547 is larger); E × 0.5 = 9999.85 is over
# E / 4 = 4999.925, which is the budget (the floor 1000 and ⅔ × 8192 = 5461.33 do not bind;
# stated 4999). The keep cap is half of what is newly compressed when that is under the
# budget, and max_tokens ⌈1.5 × 4999.925⌉ = 7500 (under the physical cap 8192).
async def test_r_bud_3_4_ratio_half_budget_is_a_quarter_of_the_line_and_keep_cap_half_the_new(
    make: Make,
) -> None:
    env = await make(
        chat={"context_window": 28571},
        summary={"context_window": 200000, "max_output_tokens": 8192},
        memsum_compress_at=0.7,
        memsum_summary_budget_ratio=0.5,
    )
    rt = env.rt
    await seed(rt, 60, size=120)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)  # its usage sets the line; not due
    await settle(rt)
    assert env.phases() == []
    content = units_tokens(await rt.store.get_history(GROUP.id))
    assert Fraction(4999925, 1000) < content < 2 * 4999  # E / 4 binds; ½ × content is under it
    await rt.compression.compress(GROUP.id)
    (request,) = env.model.summary_requests()
    assert stated(request) == (4999, math.floor(Fraction(1, 2) * content))
    assert request["max_tokens"] == 7500
