"""Usage and cost of a place, from the ledger: what `/用量` shows and the web page reuses.

`load` is the one read (the ledger rows and the answers and compressions of a place
and period); everything else is pure: periods and days in the bot's time zone,
costs from the price table of `MEMSUM_MODELS`, the per-model lines, the ranking of
places, the texts.
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .compression.service import DIVIDER
from .config import Config, ModelConfig
from .settings import place_key
from .store import Activity, Store, UsageRow
from .types import SessionRecord

PERIODS: dict[str, int | None] = {"今天": 0, "7天": 6, "30天": 29, "全部": None}
"""A period's word → how many days before today it starts (None: ever)."""
CAP_NOTE = "压缩用的 token 也计入限额，但压缩从不因限额停止（它让记忆留在窗口之内）。"


# ---- days -----------------------------------------------------------------------------
def zone_of(config: Config) -> tzinfo:
    """The time zone days begin in: `MEMSUM_TIMEZONE`, else the system's."""
    if config.memsum_timezone:
        return ZoneInfo(config.memsum_timezone)
    if (system := _system_zone(os.environ.get("TZ"))) is not None:
        return system
    local = datetime.now().astimezone().tzinfo  # today's offset: read again on every call
    assert local is not None
    return local


@functools.lru_cache(maxsize=4)
def _system_zone(tz: str | None) -> ZoneInfo | None:
    """The system's zone with its rules (`TZ`, else /etc/localtime): today's offset alone
    (`datetime.now().astimezone()`) is an hour off for the other half of a year with daylight
    saving. None where neither names a zone (a POSIX `TZ` string, Windows)."""
    try:
        if tz:
            return ZoneInfo(tz.removeprefix(":"))
        with open("/etc/localtime", "rb") as file:
            return ZoneInfo.from_file(file, key="localtime")
    except (OSError, ValueError, ZoneInfoNotFoundError):
        return None


def day_of(ts: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(ts, zone).date().isoformat()


def day_start(ts: float, zone: tzinfo, days_back: int = 0) -> float:
    """The moment the day of `ts` (or the one `days_back` before it) began in `zone`."""
    day = datetime.fromtimestamp(ts, zone).date() - timedelta(days=days_back)
    return datetime.combine(day, time(0), tzinfo=zone).timestamp()


def offset_spans(since: float, until: float, zone: tzinfo) -> list[tuple[float, float, int]]:
    """[since, until) cut where `zone`'s UTC offset changes (daylight saving): (start, end,
    seconds east of UTC). Within a span a time's local day is (ts + offset) // 86400, so
    a day of 23 or 25 hours is counted as the zone has it; no day twice, none skipped."""

    def offset(ts: float) -> int:
        delta = datetime.fromtimestamp(ts, zone).utcoffset()
        return int(delta.total_seconds()) if delta else 0

    spans: list[tuple[float, float, int]] = []
    start, current = since, offset(since)
    step = 86400.0  # offsets change at most a few times a year, never twice in a day
    probe = since
    while probe < until:
        nxt = min(probe + step, until)
        if offset(nxt) != current and nxt < until:
            low, high = probe, nxt  # the change lies in (low, high]: to the second
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if offset(mid) == current else (low, mid)
            spans.append((start, high, current))
            start, current = high, offset(high)
        probe = nxt
    spans.append((start, until, current))
    return spans


def period_start(period: str, now: float, zone: tzinfo) -> float | None:
    """When a period of PERIODS begins (None: the whole ledger)."""
    days = PERIODS[period]
    return None if days is None else day_start(now, zone, days)


# ---- places ---------------------------------------------------------------------------
def usage_place(record: SessionRecord) -> str:
    """What usage and the cap are counted by: a group's place, else the session."""
    return place_key(record) or record.id


def place_label(place: str) -> str:
    """`onebot:group:123` (or a group's session id) → 群 123; a private session → 私聊 456."""
    parts = place.split(":")
    kinds = {"group": "群", "private": "私聊"}
    if len(parts) in (3, 4) and parts[-2] in kinds:
        return f"{kinds[parts[-2]]} {parts[-1]}"
    return place or "（不属于任何会话）"


# ---- money ----------------------------------------------------------------------------
def row_cost(row: UsageRow, model: ModelConfig | None) -> float | None:
    """The cost of a row by its model's prices per million tokens; None without prices.
    Cached prompt tokens cost `price_cached` (default `price_in`)."""
    if model is None or (model.price_in is None and model.price_out is None):
        return None
    price_in = model.price_in or 0.0
    price_cached = model.price_cached if model.price_cached is not None else price_in
    cached = min(row.tokens_cached, row.tokens_in)
    paid = (
        (row.tokens_in - cached) * price_in + cached * price_cached + row.tokens_out * (model.price_out or 0)
    )
    return paid / 1_000_000


@dataclass(frozen=True, slots=True)
class Costs:
    """Money by currency, and whether some tokens had no price."""

    by_currency: Mapping[str, float]
    unpriced: bool

    @property
    def total(self) -> float:
        """All currencies added up: only for ordering places."""
        return sum(self.by_currency.values())


def costs_of(rows: Iterable[UsageRow], models: Mapping[str, ModelConfig]) -> Costs:
    money: defaultdict[str, float] = defaultdict(float)
    unpriced = False
    for row in rows:
        model = models.get(row.model)
        cost = row_cost(row, model)
        if cost is None:
            unpriced = unpriced or row.tokens_in + row.tokens_out > 0
        else:
            money[model.currency if model else ""] += cost
    return Costs(dict(money), unpriced)


def money_text(costs: Costs) -> str:
    parts = [f"{amount:.4f}{f' {cur}' if cur else ''}" for cur, amount in sorted(costs.by_currency.items())]
    text = " + ".join(parts)
    if text and costs.unpriced:
        text += "（部分模型没有价格）"
    return text


# ---- the report -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ModelLine:
    """One purpose of one model: tokens, calls and cost."""

    purpose: str
    model: str
    calls: int
    tokens_in: int
    tokens_out: int
    tokens_cached: int
    costs: Costs


def model_lines(rows: Iterable[UsageRow], models: Mapping[str, ModelConfig]) -> list[ModelLine]:
    """Rows summed per purpose and model (over places), chat before summary."""
    grouped: defaultdict[tuple[str, str], list[UsageRow]] = defaultdict(list)
    for row in rows:
        grouped[(row.purpose, row.model)].append(row)
    order = {"对话": 0, "摘要": 1}
    return [
        ModelLine(
            purpose,
            model,
            sum(r.calls for r in group),
            sum(r.tokens_in for r in group),
            sum(r.tokens_out for r in group),
            sum(r.tokens_cached for r in group),
            costs_of(group, models),
        )
        for (purpose, model), group in sorted(grouped.items(), key=lambda kv: (order.get(kv[0][0], 2), kv[0]))
    ]


def rank_places(
    rows: Iterable[UsageRow], models: Mapping[str, ModelConfig], n: int = 10
) -> list[tuple[str, int, Costs]]:
    """The `n` places that cost the most (then used the most tokens): place, tokens, costs."""
    grouped: defaultdict[str, list[UsageRow]] = defaultdict(list)
    for row in rows:
        grouped[row.place].append(row)
    ranked = [
        (place, sum(r.tokens_in + r.tokens_out for r in group), costs_of(group, models))
        for place, group in grouped.items()
    ]
    ranked.sort(key=lambda p: (-p[2].total, -p[1], p[0]))
    return ranked[:n]


def report_text(
    where: str, period: str, rows: Sequence[UsageRow], activity: Activity, models: Mapping[str, ModelConfig]
) -> str:
    """What `/用量` says about one place and period."""
    lines = [f"{where}用量（{period}）：回答 {activity.answers} 次，压缩 {activity.compressions} 次"]
    if not rows:
        lines.append("这段时间没有调用模型。")
        return "\n".join(lines)
    for line in model_lines(rows, models):
        cached = f"（缓存命中 {line.tokens_cached}）" if line.tokens_cached else ""
        money = money_text(line.costs)
        lines.append(
            f"{line.purpose} {line.model}：输入 {line.tokens_in}{cached}，输出 {line.tokens_out} token，"
            f"调用 {line.calls} 次" + (f"，费用 {money}" if money else "")
        )
    total = sum(r.tokens_in + r.tokens_out for r in rows)
    money = money_text(costs_of(rows, models))
    lines.append(f"合计 {total} token" + (f"，费用 {money}" if money else ""))
    return "\n".join(lines)


def cap_text(cap: int, layer_label: str, used_today: int) -> str:
    """The daily cap, what today used of it, and the rule about compression."""
    if cap <= 0:
        return f"每日限额：不限（{layer_label}）。{CAP_NOTE}"
    state = "已用完，今天不再回答" if used_today >= cap else f"还剩 {cap - used_today}"
    return f"每日限额 {cap} token（{layer_label}），今天已用 {used_today}，{state}。{CAP_NOTE}"


def top_text(period: str, ranked: Sequence[tuple[str, int, Costs]]) -> str:
    lines = [f"花费最多的地方（{period}）："]
    for i, (place, tokens, costs) in enumerate(ranked, 1):
        money = money_text(costs)
        lines.append(f"{i}. {place_label(place)}：{tokens} token" + (f"，{money}" if money else ""))
    if not ranked:
        lines.append("这段时间没有调用模型。")
    return "\n".join(lines)


# ---- the one read -----------------------------------------------------------------------
async def load(store: Store, place: str, since: float | None) -> tuple[list[UsageRow], Activity]:
    """A place's ledger rows and its answers and compressions since `since`."""
    return await store.usage_rows(place, since), await store.activity(place, since, DIVIDER)
