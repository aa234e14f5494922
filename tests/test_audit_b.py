"""An outside tester's scenarios for R-TRIG, R-BACK, R-RUN and R-BUD, written from the
specification (REQUIREMENTS.md and the Chinese original) and run through the library's
public pieces: the pure core, the runtime on a real SQLite file, and the scripted model
server. Each asserts concrete values the rule fixes."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest

from nonebot_plugin_memsum.agent.events import TurnEnded, UsageEvent
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.compression.budget import compression_line, compute_budget
from nonebot_plugin_memsum.compression.parse import parse_reply
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    GROUP,
    IN_GROUP,
    Env,
    Make,
    conversation_of,
    held_compression,
    keeping,
    offered,
    seed,
    settle,
    stated,
    usage,
)

PRIVATE = SessionRecord(
    id="onebot:private:20002", platform="onebot", kind="private", peer="20002", room_class="direct"
)
SUMMARY = "## 最近在聊什么\n甲(1) 约了周末爬山\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


# ---- R-RUN-7: reading the 【保留原文】 block ----------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "numbers"),
    [
        # Markdown markers (here a quote) before the heading are allowed; a model that quotes
        # the block quotes its number lines too: they are still lines that only list numbers.
        pytest.param(f"> 【保留原文】\n> 2、5\n\n{SUMMARY}", (2, 5), id="quoted_block"),
        pytest.param(f"> **【保留原文】** 2\n> 5\n{SUMMARY}", (2, 5), id="quoted_bold_block"),
        # Punctuation of any kind around the numbers (quotes, brackets, middle dots, dashes).
        pytest.param(f"【保留原文】\n“1”、“4”\n{SUMMARY}", (1, 4), id="chinese_quotes"),
        pytest.param(f"【保留原文】\n【1】【4】\n{SUMMARY}", (1, 4), id="lenticular_brackets"),
        pytest.param(f"【保留原文】\n1·4\n{SUMMARY}", (1, 4), id="middle_dot"),
        pytest.param(f"【保留原文】\n《1》——《4》\n{SUMMARY}", (1, 4), id="book_title_marks"),
        pytest.param(f"【保留原文】\n'1', \"4\"\n{SUMMARY}", (1, 4), id="ascii_quotes"),
        # The full-width ＃ before the heading, numbers on the lines after it.
        pytest.param(f"＃＃ 【保留原文】\n2\n\n5\n{SUMMARY}", (2, 5), id="full_width_hash"),
    ],
)
def test_r_run_7_number_lines_with_markers_and_punctuation(reply: str, numbers: tuple[int, ...]) -> None:
    parsed = parse_reply(reply)
    assert parsed.numbers == numbers
    assert parsed.summary == SUMMARY  # the stored summary holds no block line
    assert not parsed.block_unreadable


def test_r_run_7_last_block_counts_even_when_it_says_none() -> None:
    parsed = parse_reply(f"【保留原文】3、4\n{SUMMARY}\n\n### 【保留原文】\n无")
    assert parsed.numbers == ()
    assert parsed.summary == SUMMARY
    assert not parsed.block_unreadable


def test_r_run_7_a_line_with_words_ends_the_block_and_hash_numbers_in_the_body_stay() -> None:
    reply = f"【保留原文】\n2\n第 5 条也挺重要\n{SUMMARY}\n#3 是周六"
    parsed = parse_reply(reply)
    assert parsed.numbers == (2,)
    assert parsed.summary == f"第 5 条也挺重要\n{SUMMARY}\n#3 是周六"


# ---- R-BUD: exact sizes ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "ratio", "window", "max_output", "summary", "units", "expected"),
    [
        # E = min(0.8 × 125000, 200000) = 100000; ×0.1 = 10000 < ⅔ × 16000; keep cap ⌊0.1 × 47000⌋.
        pytest.param(
            compression_line(0.8, 125000, 200000),
            0.1,
            200000,
            16000,
            3000,
            47000,
            (Fraction(10000), 4700, 15000),
            id="line_times_ratio",
        ),
        # E 3000: 300 lifted to the floor 1000, which E / 4 = 750 overrides; max_tokens ⌈1125⌉.
        pytest.param(Fraction(3000), 0.1, 200000, 16000, 0, 47000, (Fraction(750), 750, 1125), id="e_over_4"),
        # Window 3000: physical cap min(4096, 750) = 750; ⅔ = 500 wins over the floor.
        pytest.param(
            Fraction(100000), 0.1, 3000, None, 0, 47000, (Fraction(500), 500, 750), id="two_thirds_cap"
        ),
        # No line: what is compressed (4000 + 5000), at most ⅔ × 4096; max_tokens ⌈4096⌉ capped at 4096.
        pytest.param(None, 0.1, 128000, None, 4000, 5000, (Fraction(8192, 3), 500, 4096), id="no_line"),
        # No line, little content: the floor; keep cap ⌊0.1 × 500⌋, not lifted by the floor.
        pytest.param(None, 0.1, 128000, None, 0, 500, (Fraction(1000), 50, 1500), id="no_line_floor"),
        # Budget = content 2600 (< E × 0.5); keep cap ⌊0.5 × 600⌋ = 300, the summary not counted.
        pytest.param(
            Fraction(100000), 0.5, 128000, 8192, 2000, 600, (Fraction(2600), 300, 3900), id="content"
        ),
        # Window 4001: cap 1000.25, budget ⅔ of it; max_tokens ⌈1000.5⌉ = 1001 is over the cap: 1000.
        pytest.param(
            Fraction(100000), 0.1, 4001, None, 0, 60000, (Fraction(4001, 6), 666, 1000), id="fractional_cap"
        ),
    ],
)
def test_r_bud_1_to_7_exact_sizes(
    line: Fraction | None,
    ratio: float,
    window: int,
    max_output: int | None,
    summary: int,
    units: int,
    expected: tuple[Fraction, int, int],
) -> None:
    b = compute_budget(
        line=line,
        ratio=ratio,
        summary_window=window,
        summary_max_output=max_output,
        existing_summary_tokens=summary,
        units_tokens=units,
    )
    assert (b.budget, b.keep_cap, b.max_tokens) == expected


# ---- R-TRIG-4: the count at turn end --------------------------------------------------------
async def test_r_trig_4_a_silent_turns_marker_is_not_counted_by_later_turns(make: Make) -> None:
    # Count line 7: 5 members' lines; a silent turn (5, not due) leaves its record, an event
    # marker; the next replied turn counts 5 + 1 = 6, still under the line. Counting the marker
    # would make it 7 and due.
    env = await make(memsum_history_limit=7)
    rt, model = env.rt, env.model
    await seed(rt, 5)
    counts: list[int] = []
    rt.bus.subscribe(UsageEvent, lambda e: counts.append(e.history_messages) if e.turn_id else None)
    model.chat.extend([Reply("[不回复]", usage=usage(100)), Reply("好的", usage=usage(100))])
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "silent"
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert counts == [5, 5]
    assert model.summary_requests() == []
    # One more member's line: 6 + the reply = 7, due.
    await seed(rt, 1, start=5)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert counts[-1] == 7  # 5 lines, the first reply, the new line (the marker left out)
    assert len(model.summary_requests()) == 1


# ---- R-BACK-3: back-off by judged turns ---------------------------------------------------------
FAIL = Reply(status=500, error="summariser down", headers={"Retry-After": "0"})
# Usage line E = min(0.5 × 10000, 10000 − 1024) = 5000 on the chat model.
USAGE_LINE: dict[str, Any] = {"chat": {"context_window": 10000}, "memsum_compress_at": 0.5}


async def turn(env: Env, used: int) -> bool:
    """One turn reporting `used` prompt tokens; whether its end started a compression."""
    seen = len(env.phases())
    await seed(env.rt, 1, start=5000 + len(env.model.chat_requests()))
    env.model.chat.append(Reply("好的", usage=usage(used)))
    await env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(env.rt)
    return ("start", None) in env.phases()[seen:]


async def test_r_back_3_judged_turns_under_the_line_count_towards_the_wait(make: Make) -> None:
    env = await make(**USAGE_LINE)
    env.model.summary_default = FAIL
    await seed(env.rt, 30, size=120)  # the compressible part is over E / 2
    assert await turn(env, 5000)  # due, fails: wait 2 judged turns
    assert not await turn(env, 100)  # judged (under the line): the first of the 2
    assert await turn(env, 5000)  # the 2nd judged turn after the failure: retried, fails: wait 4
    # Growth of usage does not shorten the wait: 3 more judged turns at ever larger usage.
    assert [await turn(env, 6000 + 1000 * n) for n in range(3)] == [False, False, False]
    assert await turn(env, 9000)  # the 4th
    assert (await env.rt.compression.status(GROUP.id)).backoff_failures == 3


async def test_r_back_3_a_turn_ending_while_the_session_compresses_is_not_judged(make: Make) -> None:
    env = await make(**USAGE_LINE)
    rt, model = env.rt, env.model
    model.summary_default = FAIL
    await seed(rt, 30, size=120)
    assert await turn(env, 5000)  # the 1st failure: wait 2 judged turns
    # A manual run (failing too; manual failures do not back off) is in flight while a turn ends.
    run, gate = await held_compression(env, FAIL)
    assert not await turn(env, 5000)  # not judged (R-TRIG-5): does not count towards the wait
    gate.open()
    with pytest.raises(Exception, match="摘要模型出错"):
        await run
    assert not await turn(env, 5000)  # judged turn 1
    assert await turn(env, 5000)  # judged turn 2: retried
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 2


async def test_r_back_4_deleting_the_session_forgets_the_back_off(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    env.model.summary_default = FAIL
    await seed(env.rt, 2)
    assert await turn(env, 100)  # due by count, fails: wait 2
    assert (await env.rt.compression.status(GROUP.id)).backoff_failures == 1
    await env.rt.compression.delete_session(GROUP.id)
    assert (await env.rt.compression.status(GROUP.id)).backoff_failures == 0
    await seed(env.rt, 2, start=100)
    assert await turn(env, 100)  # the same session id, due again: runs at once


# ---- R-RUN-3 / R-RUN-6: what the summariser reads -------------------------------------------------
async def test_r_run_3_and_6_rendering_and_numbering_in_the_request(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model

    async def put(**fields: Any) -> Message:
        return await rt.agent.record(GROUP, Message(**fields))

    ask = await put(role="user", content="[甲(1)] 北京天气怎么样", ts=1.0)
    call = await put(
        role="assistant",
        content="我查一下",
        tool_calls=(ToolCall("c1", "weather", "{" + "城" * 250 + "}"), ToolCall("c2", "clock", "{}")),
        ts=2.0,
    )
    between = await put(role="user", content="[乙(2)] 顺便看看上海", ts=3.0)
    r1 = await put(role="tool", content="晴" * 260, tool_call_id="c1", name="not_the_tool", ts=4.0)
    r2 = await put(role="tool", content="十点", tool_call_id="c2", ts=5.0)
    note = await put(role="notice", content="甲(1) 戳了戳小记" + "。" * 250, ts=6.0)
    envelope = await put(
        role="assistant",
        content='{"reply": "明天晴", "mood": "ok"}',
        metadata={"visibleContent": "明天晴"},
        ts=7.0,
    )
    await put(role="tool", content="孤立的结果", tool_call_id="gone", name="search", ts=8.0)
    await seed(rt, 1, start=9, size=1500)  # room in the keep cap for the tool group
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    parts = conversation_of(request).split("\n\n")
    group = (
        "助手: 我查一下\n"
        f"调用 weather({'{' + '城' * 199})\n"
        "调用 clock({})\n"
        f"工具结果(weather): {'晴' * 200}\n"
        "工具结果(clock): 十点"
    )

    def cost(*ms: Message) -> int:  # R-RUN-6: N is the stored messages' estimate kept verbatim
        return sum(estimate_msg_tokens(m) for m in ms)

    assert parts[:6] == [
        f"#1〔约 {cost(ask)} token〕[甲(1)] 北京天气怎么样",
        f"#2〔约 {cost(call, r1, r2)} token〕{group}",
        f"#3〔约 {cost(between)} token〕[乙(2)] 顺便看看上海",
        f"#4〔约 {cost(note)} token〕通知: 甲(1) 戳了戳小记{'。' * 190}",
        f"#5〔约 {cost(envelope)} token〕助手: 明天晴",
        "工具结果(search): 孤立的结果",  # a lone result: not numbered
    ]


# ---- R-BACK-2: kept originals cut to half the count line at the commit --------------------------
async def test_r_back_2_kept_trimmed_to_what_half_the_line_leaves_after_late_messages(make: Make) -> None:
    # Count line 10 → 5. Four short lines asked for; two lines arrive during the call, so
    # 5 − 2 = 3 kept originals may stay: the earliest asked-for goes.
    env = await make(memsum_summary_budget_ratio=0.5, memsum_history_limit=10)
    rt = env.rt
    short = await seed(rt, 4, size=2)
    await seed(rt, 3, start=4, size=200)
    run, gate = await held_compression(env, keeping(*(m.content for m in short)))
    late = await seed(rt, 2, start=20)
    gate.open()
    result = await run
    assert result.kept_messages == 3
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [m.id for m in (*short[1:], *late)]


async def test_r_back_2_a_kept_tool_group_counts_its_messages_and_goes_whole(make: Make) -> None:
    # Count line 6 → 3. Asked for: a tool group (2 messages) and 2 lines: 4 > 3, so the group
    # (the earliest) goes as a whole and the 2 lines stay.
    env = await make(memsum_summary_budget_ratio=0.5, memsum_history_limit=6)
    rt = env.rt
    call = await rt.agent.record(
        GROUP,
        Message(role="assistant", content="", tool_calls=(ToolCall("k1", "clock", "{}"),), ts=1.0),
    )
    await rt.agent.record(GROUP, Message(role="tool", content="十点", tool_call_id="k1", ts=2.0))
    lines = await seed(rt, 2, start=1, size=2)
    await seed(rt, 3, start=10, size=200)
    env.model.summary.append(keeping("调用 clock", *(m.content for m in lines)))
    result = await rt.compression.compress(GROUP.id)
    request = env.model.summary_requests()[0]
    assert any("调用 clock" in text for text in offered(request).values())  # it was offered
    assert result.kept_messages == 2
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [m.id for m in lines]
    assert call.id not in [m.id for m in active]


# ---- R-BUD-1 through a count-triggered run ----------------------------------------------------------
async def test_r_bud_1_a_count_triggered_run_takes_its_budget_from_the_usage_line(make: Make) -> None:
    # Chat window 40000 at compress_at 0.25: E = min(10000, 40000 − 1024) = 10000; budget
    # 10000 × 0.2 = 2000 (over the floor, under E / 4 = 2500 and ⅔ × 4096), whatever triggered.
    env = await make(
        chat={"context_window": 40000},
        memsum_compress_at=0.25,
        memsum_summary_budget_ratio=0.2,
        memsum_history_limit=6,
    )
    rt, model = env.rt, env.model
    await seed(rt, 5, size=1500)
    ended: list[str] = []
    rt.bus.subscribe(TurnEnded, lambda e: ended.append(e.outcome))
    model.chat.append(Reply("好的", usage=usage(3000)))  # far under the usage line: due by count
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    (request,) = model.summary_requests()
    assert stated(request)[0] == 2000
    assert request["max_tokens"] == 3000
    assert ended == ["replied"]


# ---- R-TRIG-2 / R-BUD-1: both lines resolved for the entry platform ---------------------------------
async def test_r_trig_2_the_usage_line_and_budget_follow_the_entry_platforms_tier(make: Make) -> None:
    # Global compress_at 0.8, the group tier 0.3; chat window 10000, trim budget 8976.
    # Group: E = min(3000, 8976) = 3000, so a usage of 3000 is due; the budget is
    # 3000 × 0.1 = 300, lifted to the floor 1000, which E / 4 = 750 overrides.
    # A private chat (no tier of its own): E = 8000, 3000 is not due.
    env = await make(
        chat={"context_window": 10000},
        memsum_compress_at=0.8,
        memsum_tiers={"onebot.group": {"compress_at": 0.3}},
    )
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120, record=PRIVATE)
    model.chat.append(Reply("好的", usage=usage(3000)))
    await rt.agent.run_turn(PRIVATE.id, entry=Entry("onebot", "private"))
    await settle(rt)
    assert model.summary_requests() == []
    await seed(rt, 30, size=120)
    model.chat.append(Reply("好的", usage=usage(3000)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    (request,) = model.summary_requests()
    assert stated(request)[0] == 750
    assert request["max_tokens"] == 1125  # ⌈1.5 × 750⌉


# ---- R-BUD-6: no line when the usage's trim budget is no finite positive number -------------------
async def test_r_bud_6_usage_without_a_positive_trim_budget_gives_no_line(make: Make) -> None:
    env = await make()
    rt, model = env.rt, env.model
    await seed(rt, 6, size=1000)  # over ⅔ × 4096 to compress
    snapshot = UsageEvent(
        session_id=GROUP.id,
        turn_id=None,
        platform="onebot",
        platform_type="group",
        model_id="test/chat",
        window=32000,
        trim_budget=0,
        usage=100,
        trimmed=False,
        untrimmed_history=50,
        history_messages=6,
        history_limit=0,
    )
    await rt.bus.emit(snapshot)
    await rt.compression.compress(GROUP.id)
    # No line: what is compressed, at most ⅔ × min(4096, 32000 / 4) = 2730.67 (stated whole).
    # With the line E = min(0.8 × 32000, …) the budget would have been 2560.
    request = model.summary_requests()[0]
    assert stated(request)[0] == 2730
    assert request["max_tokens"] == 4096


NUMBERED = re.compile(r"^#(\d+)〔约 \d+ token〕")


# ---- R-RUN-10: chunked requests re-send the chosen units with their numbers --------------------------
async def test_r_run_10_each_request_resends_the_previous_choice_first_with_its_number(make: Make) -> None:
    env = await make(
        summary={"context_window": 6000}, memsum_capacity="spec", memsum_summary_budget_ratio=0.5
    )
    rt, model = env.rt, env.model
    await seed(rt, 60, size=80)
    chosen: list[str] = []

    def keep_the_last_offered(body: dict[str, Any]) -> Reply:
        numbers = sorted(offered(body))
        chosen.append(
            next(p for p in conversation_of(body).split("\n\n") if p.startswith(f"#{numbers[-1]}〔"))
        )
        return Reply(f"【保留原文】{numbers[-1]}\n{SUMMARY}")

    model.summary_default = keep_the_last_offered
    result = await rt.compression.compress(GROUP.id)
    requests = model.summary_requests()
    assert len(requests) >= 3
    for i, body in enumerate(requests[1:], start=1):
        parts = conversation_of(body).split("\n\n")
        assert parts[0] == chosen[i - 1]  # verbatim, with its original number and annotation
        numbers = [int(m.group(1)) for p in parts if (m := NUMBERED.match(p))]
        assert numbers == sorted(set(numbers))  # new units follow, in order
        assert len(numbers) > 1
    # The end result keeps what the last request chose, nothing else.
    assert result.kept_messages == 1
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.content for m in active] == [NUMBERED.sub("", chosen[-1])]


# ---- R-RUN-12: the next compression renumbers and re-chooses the kept originals --------------------
async def test_r_run_12_next_compression_renumbers_the_kept_and_archives_those_not_chosen_again(
    make: Make,
) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    short = await seed(rt, 3, size=2)
    await seed(rt, 2, start=3, size=300)
    model.summary.append(keeping(short[1].content, short[2].content))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 2
    newer = await seed(rt, 2, start=10, size=300)
    model.summary.append(keeping(short[2].content))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 1
    second = model.summary_requests()[1]
    assert offered(second) == {
        1: short[1].content,
        2: short[2].content,
        3: newer[0].content,
        4: newer[1].content,
    }
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [short[2].id]
    archived = {m.id for m in await rt.store.get_archived(GROUP.id)}
    assert short[1].id in archived


# ---- R-BACK-4: a manual success and a summary-only clear forget the back-off too -------------------
@pytest.mark.parametrize("forget", ["manual_success", "clear_summary"])
async def test_r_back_4_manual_success_or_summary_clear_forgets_the_back_off(make: Make, forget: str) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    model.summary_default = FAIL
    await seed(rt, 2)
    assert await turn(env, 100)  # due by count, fails: wait 2 judged turns
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 1
    if forget == "manual_success":
        model.summary.append(Reply(f"【保留原文】无\n{SUMMARY}"))
        assert (await rt.compression.compress(GROUP.id)).outcome == "done"
    else:
        await rt.compression.clear(GROUP.id, "summary")
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 0
    await seed(rt, 2, start=100)
    assert await turn(env, 100)  # due again: no wait


async def test_r_back_2_the_count_line_of_the_sessions_platform_tier_applies_without_usage(
    make: Make,
) -> None:
    # No turn yet (no usage, no entry platform): the group's own tier still sets the count
    # line, 6 → 3 kept at most; the earliest asked-for goes.
    env = await make(memsum_summary_budget_ratio=0.5, memsum_tiers={"onebot.group": {"history_limit": 6}})
    rt = env.rt
    short = await seed(rt, 4, size=2)
    await seed(rt, 3, start=4, size=200)
    env.model.summary.append(keeping(*(m.content for m in short)))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 3
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [m.id for m in short[1:]]


async def test_r_run_12_count_trimming_drops_the_kept_originals_first(make: Make) -> None:
    # Count line 4 → 2 kept originals stay. Three lines later the active conversation is 5:
    # the agent drops one segment of ⌊4 / 2⌋ = 2, the earliest, which are the kept ones.
    env = await make(memsum_summary_budget_ratio=0.5, memsum_history_limit=4)
    rt = env.rt
    short = await seed(rt, 2, size=2)
    await seed(rt, 3, start=2, size=200)
    env.model.summary.append(keeping(*(m.content for m in short)))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 2
    newer = await seed(rt, 3, start=10)
    prompt = await rt.agent.build_prompt(GROUP.id, IN_GROUP)
    assert prompt.conversation == 5
    assert [m["content"] for m in prompt.messages if m["role"] == "user"] == [m.content for m in newer]


async def test_r_run_7_a_quoted_block_keeps_its_units_and_stays_out_of_the_stored_summary(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    short = await seed(rt, 3, size=2)
    await seed(rt, 2, start=3, size=300)

    def quoted(body: dict[str, Any]) -> Reply:
        numbers = [n for n, text in offered(body).items() if text in (short[0].content, short[2].content)]
        return Reply(f"> **【保留原文】**\n> {'、'.join(map(str, numbers))}\n\n{SUMMARY}")

    model.summary.append(quoted)
    result = await rt.compression.compress(GROUP.id)
    assert result.kept_messages == 2
    assert result.summary == SUMMARY
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [short[0].id, short[2].id]
