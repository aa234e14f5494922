"""/用量 and /限额, the daily cap and the member cooldown, through NoneBot (nonebug) with
the plugin's real store; every figure is computed by hand from the ledger rows a test
writes. Time is the plugin's one clock (clock.py), replaced per test."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from nonebot.adapters.onebot.v11 import Bot, MessageSegment
from nonebug import App

from nonebot_plugin_memsum import clock, runtime, usage
from nonebot_plugin_memsum.compression.service import DIVIDER
from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.controls import CAP_NOTICE, COOLDOWN_NAMESPACE, cooled_down, decide, still_cooling
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.store import Activity, UsageRow
from nonebot_plugin_memsum.types import Message
from tests.fakes.nonebug import (
    SELF_ID,
    Like,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    to_me,
    turns_requested,
)

PRICED = ModelConfig.model_validate(
    {
        "id": "test/priced",
        "base_url": "http://127.0.0.1:1/v1",
        "context_window": 64000,
        "price_in": 2,
        "price_out": 8,
        "price_cached": 0.5,
        "currency": "元",
    }
)
FREE = ModelConfig.model_validate(
    {"id": "test/free", "base_url": "http://127.0.0.1:1/v1", "context_window": 8000}
)
NOTE = usage.CAP_NOTE
NO_CAP = f"每日限额：不限（全局配置）。{NOTE}"


@pytest.fixture
def now(app: App, monkeypatch: pytest.MonkeyPatch) -> float:
    """The clock stopped at 15:00 of today in the bot's time zone, and the price table set."""
    rt = runtime.get()
    start = usage.day_start(clock.now(), rt.controls.zone)
    moment = start + 15 * 3600
    monkeypatch.setattr(clock, "now", lambda: moment)
    monkeypatch.setattr(rt, "config", rt.config.model_copy(update={"memsum_models": [PRICED, FREE]}))
    return moment


async def spend(
    session_id: str, purpose: str, model: str, tin: int, tout: int, cached: int, at: float
) -> None:
    """One ledger row, written at `at` by the plugin's own store."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(clock, "now", lambda: at)
        await runtime.get().store.record_usage(session_id, purpose, model, tin, tout, cached)


async def said(session_id: str, role: str, content: str, at: float, *, marker: bool = False) -> None:
    msg = Message(role=role, content=content, ts=at, event_marker=marker)  # type: ignore[arg-type]
    await runtime.get().store.append(session_id, msg)


# ---- pure ---------------------------------------------------------------------------------
def row(place: str = "p", purpose: str = "对话", model: str = "test/priced", **n: int) -> UsageRow:
    counts = {"calls": 1, "tokens_in": 0, "tokens_out": 0, "tokens_cached": 0, **n}
    return UsageRow(place, purpose, model, **counts)


def test_cost_per_million_with_cached_tokens_at_their_own_price() -> None:
    # 600k uncached × 2 + 400k cached × 0.5 + 200k out × 8 = 1.2 + 0.2 + 1.6
    r = row(tokens_in=1_000_000, tokens_cached=400_000, tokens_out=200_000)
    assert usage.row_cost(r, PRICED) == pytest.approx(3.0)
    # Without price_cached a cached token costs price_in: 2.0 + 1.6
    plain = PRICED.model_copy(update={"price_cached": None})
    assert usage.row_cost(r, plain) == pytest.approx(3.6)
    assert usage.row_cost(r, FREE) is None
    assert usage.row_cost(r, None) is None


def test_costs_add_up_per_currency_and_say_when_a_model_has_no_price() -> None:
    usd = PRICED.model_copy(update={"id": "test/usd", "currency": "USD"})
    models = {m.id: m for m in (PRICED, FREE, usd)}
    rows = [
        row(tokens_in=500_000),  # 1.0 元
        row(model="test/usd", tokens_out=100_000),  # 0.8 USD
        row(model="test/free", tokens_in=10),
    ]
    costs = usage.costs_of(rows, models)
    assert costs.by_currency == pytest.approx({"元": 1.0, "USD": 0.8})
    assert costs.unpriced
    assert usage.money_text(costs) == "0.8000 USD + 1.0000 元（部分模型没有价格）"
    assert usage.money_text(usage.costs_of([row(model="test/free", tokens_in=5)], models)) == ""


def test_days_begin_at_midnight_of_the_configured_zone() -> None:
    zone = ZoneInfo("Asia/Shanghai")
    now = datetime(2026, 12, 3, 8, 0, tzinfo=ZoneInfo("UTC")).timestamp()  # 16:00 in Shanghai
    today = datetime(2026, 12, 3, 0, 0, tzinfo=zone).timestamp()
    assert usage.period_start("今天", now, zone) == today
    assert usage.period_start("7天", now, zone) == today - 6 * 86400
    assert usage.period_start("30天", now, zone) == today - 29 * 86400
    assert usage.period_start("全部", now, zone) is None
    # 23:30 UTC on the 2nd is already the 3rd in Shanghai.
    late = datetime(2026, 12, 2, 23, 30, tzinfo=ZoneInfo("UTC")).timestamp()
    assert usage.day_of(late, zone) == "2026-12-03"


def test_places_are_ranked_by_cost_then_tokens() -> None:
    models = {PRICED.id: PRICED, FREE.id: FREE}
    rows = [
        row("onebot:group:1", tokens_in=1000),  # 0.002
        row("onebot:group:2", tokens_in=3000),  # 0.006
        row("onebot:10000:private:9", model="test/free", tokens_in=50_000),
        row("onebot:group:3", model="test/free", tokens_in=10),
    ]
    ranked = usage.rank_places(rows, models, n=3)
    assert [(p, t) for p, t, _ in ranked] == [
        ("onebot:group:2", 3000),
        ("onebot:group:1", 1000),
        ("onebot:10000:private:9", 50_000),
    ]
    assert usage.top_text("今天", ranked) == (
        "花费最多的地方（今天）：\n1. 群 2：3000 token，0.0060 元\n2. 群 1：1000 token，0.0020 元\n"
        "3. 私聊 9：50000 token"
    )


def test_the_cap_decides_before_the_cooldown() -> None:
    assert decide(used_today=999, cap=1000, notified_today=False, cooled=True) == "answer"
    assert decide(used_today=1000, cap=1000, notified_today=False, cooled=True) == "cap_notice"
    assert decide(used_today=1000, cap=1000, notified_today=True, cooled=True) == "capped"
    assert decide(used_today=10**9, cap=0, notified_today=False, cooled=False) == "cooling"


def test_cooldown_arithmetic_and_the_stored_map_stays_small() -> None:
    assert cooled_down(None, 100, 60)
    assert not cooled_down(50, 100, 60)
    assert cooled_down(40, 100, 60)
    assert cooled_down(99, 100, 0)
    assert still_cooling({"a": 30, "b": 50, "c": 99}, 100, 60) == {"b": 50, "c": 99}


# ---- /用量 --------------------------------------------------------------------------------
async def test_usage_today_from_the_ledger_by_hand(app: App, now: float) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    other_bot = group_record(10009, group)  # the same group seen by a second bot account: the same place
    await runtime.get().store.save_session(group_record(SELF_ID, group))
    await runtime.get().store.save_session(other_bot)
    today, yesterday = now - 3600, now - 86400
    await spend(sid, "对话", "test/priced", 10_000, 500, 4000, today)
    await spend(other_bot.id, "对话", "test/priced", 12_000, 700, 0, today)
    await spend(sid, "摘要", "test/priced", 30_000, 2000, 0, today)
    await spend(sid, "对话", "test/free", 3000, 100, 0, today)
    await spend(sid, "对话", "test/priced", 5000, 100, 0, yesterday)
    await spend(
        group_record(SELF_ID, new_group()).id, "对话", "test/priced", 99_999, 1, 0, today
    )  # elsewhere
    await said(sid, "assistant", "好的", today)
    await said(sid, "assistant", "明白", today)
    await said(sid, "system", DIVIDER, today, marker=True)
    await said(sid, "assistant", "昨天的回答", yesterday)
    # 对话 priced: in 22000 (cached 4000), out 1200: (18000×2 + 4000×0.5 + 1200×8) / 1e6 = 0.0476
    # 摘要 priced: (30000×2 + 2000×8) / 1e6 = 0.0760; 对话 free: no price
    # total tokens 22000 + 1200 + 32000 + 3100 = 58300; money 0.1236 元
    expected = "\n".join(
        [
            "本群用量（今天）：回答 2 次，压缩 1 次",
            "对话 test/free：输入 3000，输出 100 token，调用 1 次",
            "对话 test/priced：输入 22000（缓存命中 4000），输出 1200 token，调用 2 次，费用 0.0476 元",
            "摘要 test/priced：输入 30000，输出 2000 token，调用 1 次，费用 0.0760 元",
            "合计 58300 token，费用 0.1236 元（部分模型没有价格）",
            "",
            NO_CAP,
        ]
    )
    await run(app, group_msg("/用量", group), expected)


async def test_usage_over_seven_days_takes_yesterday_in(app: App, now: float) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await runtime.get().store.save_session(group_record(SELF_ID, group))
    await spend(sid, "对话", "test/priced", 1000, 100, 0, now - 86400)  # 0.0020 + 0.0008
    await spend(sid, "对话", "test/priced", 1000, 100, 0, now - 8 * 86400)  # outside 7 days
    await said(sid, "assistant", "昨天的回答", now - 86400)
    head = (
        "本群用量（7天）：回答 1 次，压缩 0 次\n"
        "对话 test/priced：输入 1000，输出 100 token，调用 1 次，费用 0.0028 元\n"
    )
    await run(
        app,
        group_msg("/用量 7天", group),
        f"{head}合计 1100 token，费用 0.0028 元\n\n{NO_CAP}",
    )
    await run(
        app,
        group_msg("/用量 7 天", group),
        f"{head}合计 1100 token，费用 0.0028 元\n\n{NO_CAP}",
    )
    await run(
        app,
        group_msg("/用量 全部", group),
        "本群用量（全部）：回答 1 次，压缩 0 次\n对话 test/priced：输入 2000，输出 200 token，调用 2 次，"
        f"费用 0.0056 元\n合计 2200 token，费用 0.0056 元\n\n{NO_CAP}",
    )


async def test_usage_of_a_quiet_place_and_a_bad_period(app: App, now: float) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/用量", group),
        f"本群用量（今天）：回答 0 次，压缩 0 次\n这段时间没有调用模型。\n\n{NO_CAP}",
    )
    await run(app, group_msg("/用量 昨天", group), "用法：/用量 [今天|7天|30天|全部]")


async def test_a_superuser_in_private_also_gets_the_ten_most_expensive_places(app: App, now: float) -> None:
    store = runtime.get().store
    groups = [new_group() for _ in range(12)]
    for i, g in enumerate(groups):  # group i spends (i + 1) × 1000 tokens in: (i + 1) × 0.002 元
        record = group_record(SELF_ID, g)
        await store.save_session(record)
        await spend(record.id, "对话", "test/priced", (i + 1) * 1000, 0, 0, now - 60)
    answer = await answer_of(app, private_msg("/用量"))
    top = answer.split("\n\n")[-1].splitlines()
    assert top[0] == "花费最多的地方（今天）："
    # Other tests of this module spent today too: the biggest twelve here are the top ten
    # unless one of theirs is bigger; compare with the ledger's own ranking instead.
    rows = await store.usage_rows(None, usage.day_start(now, runtime.get().controls.zone))
    ranked = usage.rank_places(rows, {PRICED.id: PRICED, FREE.id: FREE})
    assert top[1:] == usage.top_text("今天", ranked).splitlines()[1:]
    assert len(top) == 11
    assert f"群 {groups[11]}：12000 token，0.0240 元" in "\n".join(top)
    assert f"群 {groups[0]}：" not in "\n".join(top)  # the cheapest of them is not


async def answer_of(app: App, event: Any) -> str:
    """What the bot says to a private event (a test that reads the answer itself)."""
    seen = Like(r".*")
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        ctx.should_call_send(event, seen, result={"message_id": 1})
    assert seen.seen is not None
    return seen.seen


# ---- /限额 and the cap ------------------------------------------------------------------
async def test_cap_is_set_shown_and_reset(app: App, now: float) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await runtime.get().store.save_session(group_record(SELF_ID, group))
    await spend(sid, "对话", "test/priced", 300, 50, 0, now - 60)
    await run(
        app,
        group_msg("/限额 1000", group),
        f"已修改本群每日限额。\n现在：本群每日限额 1000 token（本群），今天已用 350，还剩 650。{NOTE}",
    )
    await run(
        app, group_msg("/限额", group), f"本群每日限额 1000 token（本群），今天已用 350，还剩 650。{NOTE}"
    )
    await run(
        app, group_msg("/限额 无", group), f"已修改本群每日限额。\n现在：本群每日限额：不限（本群）。{NOTE}"
    )
    await run(
        app,
        group_msg("/限额 默认", group),
        f"已修改本群每日限额。\n现在：本群每日限额：不限（全局配置）。{NOTE}",
    )
    for bad in ("/限额 -5", "/限额 很多", "/限额 1.5"):
        await run(
            app,
            group_msg(bad, group),
            "没有修改：限额须是 0 到 1000000000000 之间的整数 token 数（0 表示不限）。",
        )
    await run(app, group_msg("/限额 1 2", group), "用法：/限额 [token 数|无|默认]")


async def test_a_capped_group_answers_once_then_stays_silent_until_the_next_day(
    app: App, now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = new_group()
    record = group_record(SELF_ID, group)
    sid = record.id
    await runtime.get().store.save_session(record)
    await run(app, group_msg("/限额 1000", group), Like(r"已修改本群每日限额。.*"))
    await spend(sid, "对话", "test/priced", 900, 99, 0, now - 60)  # 999: one token left
    assert await turns_requested(app, to_me(group_msg("小记在吗", group, user=20003))) == [sid]
    await spend(sid, "摘要", "test/priced", 1, 0, 0, now - 30)  # a compression spends the last one
    asking = to_me(group_msg("还在吗", group, user=20003))
    await run_expect_quote(app, asking, CAP_NOTICE)  # once …
    assert await turns_requested(app, to_me(group_msg("再问一次", group, user=20004))) == []  # … then quiet
    assert [m.content.split("] ", 1)[1] for m in await history(sid)][-3:] == [
        "小记在吗",
        "还在吗",
        "再问一次",
    ]
    # The usage says so.
    await run(
        app,
        group_msg("/限额", group),
        f"本群每日限额 1000 token（本群），今天已用 1000，已用完，今天不再回答。{NOTE}",
    )
    tomorrow = usage.day_start(now, runtime.get().controls.zone) + 86400 + 60
    monkeypatch.setattr(clock, "now", lambda: tomorrow)
    assert await turns_requested(app, to_me(group_msg("新的一天", group, user=20003))) == [sid]


async def test_the_cap_counts_the_place_not_the_person(app: App, now: float) -> None:
    peer = new_group()
    sid = private_record(SELF_ID, peer).id
    await runtime.get().store.save_session(private_record(SELF_ID, peer))
    await runtime.get().settings.set("daily_token_cap", "session", sid, 100)
    await spend(sid, "对话", "test/priced", 100, 0, 0, now - 60)
    await run_expect_quote(app, private_msg("你好", user=peer), CAP_NOTICE, quote=False)
    assert await turns_requested(app, private_msg("还在吗", user=peer)) == []
    # Another place is not capped by it.
    other = new_group()
    assert await turns_requested(app, private_msg("你好", user=other)) == [private_record(SELF_ID, other).id]


async def run_expect_quote(app: App, event: Any, text: str, *, quote: bool = True) -> None:
    """Deliver `event`; the bot answers `text`, quoting the event in groups."""
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        message = MessageSegment.reply(event.message_id) + text if quote else text
        ctx.should_call_send(event, message, result={"message_id": 2})


# ---- the cooldown -------------------------------------------------------------------------
@pytest.fixture
def cooldown(app: App, monkeypatch: pytest.MonkeyPatch) -> float:
    controls = runtime.get().controls
    seconds = 60.0
    monkeypatch.setattr(
        controls, "_config", controls._config.model_copy(update={"memsum_user_cooldown": seconds})
    )
    return seconds


async def test_a_member_gets_one_answer_per_cooldown_in_a_group(
    app: App, now: float, cooldown: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id

    async def ask(user: int, at: float) -> list[str]:
        monkeypatch.setattr(clock, "now", lambda: at)
        return await turns_requested(app, to_me(group_msg("小记？", group, user=user)))

    assert await ask(20003, now) == [sid]
    assert await ask(20003, now + cooldown - 1) == []  # recorded, not answered
    assert await ask(20004, now + 1) == [sid]  # another member has a cooldown of their own
    assert await ask(20003, now + cooldown) == [sid]
    assert len(await history(sid)) == 4
    # What the store keeps is only who can still be held back.
    stored = await runtime.get().store.get_meta(COOLDOWN_NAMESPACE, sid)
    assert stored == {"20003": now + cooldown, "20004": now + 1}


async def test_no_cooldown_in_private(app: App, now: float, cooldown: float) -> None:
    peer = new_group()
    sid = private_record(SELF_ID, peer).id
    assert await turns_requested(app, private_msg("一", user=peer)) == [sid]
    assert await turns_requested(app, private_msg("二", user=peer)) == [sid]


async def test_usage_and_activity_rows_of_the_store(app: App, now: float) -> None:
    # The one store query the web page reuses: rows per place, purpose and model.
    group = new_group()
    record = group_record(SELF_ID, group)
    await runtime.get().store.save_session(record)
    await spend(record.id, "对话", "test/priced", 10, 2, 1, now - 5)
    await spend(record.id, "对话", "test/priced", 20, 3, 0, now - 4)
    store = runtime.get().store
    place = usage.usage_place(record)
    assert await store.usage_rows(place, now - 60) == [UsageRow(place, "对话", "test/priced", 2, 30, 5, 1)]
    assert await store.usage_rows(place, now - 4.5) == [UsageRow(place, "对话", "test/priced", 1, 20, 3, 0)]
    assert await store.activity(place, None, DIVIDER) == Activity(answers=0, compressions=0)
    everything = await store.usage_rows(None, now - 60)
    assert UsageRow(place, "对话", "test/priced", 2, 30, 5, 1) in everything
