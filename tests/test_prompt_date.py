"""MEMSUM_DATE_IN_PROMPT: the model is told today's date and the part of the day, as a
system part after the persona, in the bot's time zone; the summary stays the last system
part (R-INJ-1), the estimate counts the line, and the prefix stays the same within a part
of the day so providers' prompt caches keep hitting. A private runtime on a real SQLite
file talks real HTTP to the scripted model server."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.agent.prompt import now_line
from nonebot_plugin_memsum.compression.service import INJECTION_HEAD
from nonebot_plugin_memsum.config import parse_config
from nonebot_plugin_memsum.llm.tokens import MESSAGE_OVERHEAD, estimate_text_tokens
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.llm_server import Reply
from tests.fakes.service import CHAT_SUMMARY, GROUP, IN_GROUP, Env, Make, seed, settle, usage

SHANGHAI = ZoneInfo("Asia/Shanghai")


def at(*when: int, zone: ZoneInfo = SHANGHAI) -> float:
    return datetime(*when, tzinfo=zone).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("hour", "minute", "period"),
    [
        (0, 0, "凌晨"),
        (4, 59, "凌晨"),
        (5, 0, "早上"),
        (8, 0, "上午"),
        (11, 0, "中午"),
        (12, 59, "中午"),
        (13, 0, "下午"),
        (17, 0, "傍晚"),
        (19, 0, "晚上"),
        (23, 59, "晚上"),
    ],
)
def test_the_line_names_the_date_the_weekday_and_the_part_of_the_day(
    hour: int, minute: int, period: str
) -> None:
    line = now_line(at(2026, 12, 5, hour, minute), SHANGHAI)
    assert line == f"现在是 2026年12月5日 星期六 {period}（UTC+08:00）。"  # 2026-12-05 is a Saturday


def test_the_line_is_the_date_where_the_bot_is_not_where_utc_is() -> None:
    # 2026-12-06 02:30 in Shanghai is Saturday 18:30 in UTC and 15:00 in St. John's (−03:30).
    ts = at(2026, 12, 6, 2, 30)
    assert now_line(ts, SHANGHAI) == "现在是 2026年12月6日 星期日 凌晨（UTC+08:00）。"
    assert now_line(ts, ZoneInfo("UTC")) == "现在是 2026年12月5日 星期六 傍晚（UTC+00:00）。"
    assert now_line(ts, ZoneInfo("America/St_Johns")) == "现在是 2026年12月5日 星期六 下午（UTC-03:30）。"


def test_the_setting_is_off_by_default_and_a_yes_or_no_in_env() -> None:
    assert parse_config({}).memsum_date_in_prompt is False
    assert parse_config({"memsum_date_in_prompt": "true"}).memsum_date_in_prompt is True


async def turn(env: Env) -> list[dict[str, str]]:
    env.model.chat.append(Reply("好的", usage=usage(100)))
    assert await env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(env.rt)
    return env.model.chat_requests()[-1]["messages"]


def system_parts(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "system"]


async def test_on_the_date_follows_the_persona_and_the_summary_stays_last_r_inj_1(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = await make(memsum_date_in_prompt=True, memsum_timezone="Asia/Shanghai")
    rt = env.rt
    monkeypatch.setattr(clock, "now", lambda: at(2026, 12, 5, 14, 5))
    rt.agent.contribute("weather", lambda sid: "〔天气：晴〕")
    await rt.settings.set("persona", "place", "onebot:group:1", "你是本群的小助手。")
    record = {"text": CHAT_SUMMARY, "template": "chat", "time": 1.0, "kept_messages": 0}
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, record)
    history = await seed(rt, 2)

    messages = await turn(env)

    assert system_parts(messages) == [
        "你是本群的小助手。",
        "现在是 2026年12月5日 星期六 下午（UTC+08:00）。",
        "〔天气：晴〕",
        f"{INJECTION_HEAD}\n\n{CHAT_SUMMARY}",
    ]
    assert messages[3]["content"].startswith(INJECTION_HEAD)  # right before the history
    assert [m["content"] for m in messages[4:]] == [m.content for m in history]


async def test_within_a_part_of_the_day_the_prefix_is_the_same_and_it_moves_with_the_clock(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = await make(memsum_date_in_prompt=True, memsum_timezone="Asia/Shanghai")
    now = [at(2026, 12, 5, 13, 0)]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    await seed(env.rt, 1)
    first = await turn(env)
    now[0] = at(2026, 12, 5, 16, 59)
    await seed(env.rt, 1, start=10)
    second = await turn(env)
    now[0] = at(2026, 12, 5, 17, 0)
    await seed(env.rt, 1, start=20)
    third = await turn(env)

    # Same system parts and the same history prefix: a provider's prompt cache hits.
    assert second[: len(first) - 1] == first[:-1]
    afternoon = "现在是 2026年12月5日 星期六 下午（UTC+08:00）。"
    assert system_parts(first)[1] == system_parts(second)[1] == afternoon
    assert system_parts(third)[1] == "现在是 2026年12月5日 星期六 傍晚（UTC+08:00）。"


async def test_off_nothing_is_added_and_on_the_estimate_counts_the_line(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clock, "now", lambda: at(2026, 12, 5, 9, 0))
    off, on = await make(), await make(memsum_date_in_prompt=True, memsum_timezone="Asia/Shanghai")
    for env in (off, on):
        await seed(env.rt, 3)

    off_prompt = await off.rt.agent.build_prompt(GROUP.id, IN_GROUP)
    on_prompt = await on.rt.agent.build_prompt(GROUP.id, IN_GROUP)

    line = "现在是 2026年12月5日 星期六 上午（UTC+08:00）。"
    assert [m["content"] for m in on_prompt.messages if m["content"] == line] == [line]
    assert line not in [m["content"] for m in off_prompt.messages]
    assert on_prompt.estimate - off_prompt.estimate == estimate_text_tokens(line) + MESSAGE_OVERHEAD
    assert system_parts(await turn(off)) == system_parts(off_prompt.messages)  # persona only
