"""What the service asks the summary model (R-RUN-5, R-BUD, R-TPL), chunking end to end
(R-RUN-10) and the measured capacity, through a private runtime and a real server."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from nonebot_plugin_memsum.agent.tools import TodoItem
from nonebot_plugin_memsum.compression.request import (
    MARGIN,
    CompressionError,
)
from nonebot_plugin_memsum.compression.service import (
    DIVIDER,
)
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.types import SessionRecord
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    PRIVATE_OWNER,
    Env,
    Make,
    conversation_of,
    due_usage,
    existing_summary_of,
    offered,
    seed,
    stated,
    summary_of,
    system_of,
    units_tokens,
    user_of,
)


# ---- R-RUN-5, R-BUD: the request ------------------------------------------------------------
async def test_r_run_5_purpose_summary_session_and_shallowest_thinking_level(make: Make) -> None:
    env = await make(summary={"thinking_levels": ["low", "medium", "high"]})
    rt, model = env.rt, env.model
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert request["model"] == "sum"
    assert request["reasoning_effort"] == "low"
    totals = await rt.store.usage_totals(GROUP.id)
    assert set(totals) == {"摘要"}
    tokens_in, tokens_out = totals["摘要"]
    assert tokens_in > 0
    assert tokens_out > 0


async def test_r_run_5_no_reasoning_effort_without_thinking_levels(env: Env) -> None:
    await seed(env.rt, 3)
    await env.rt.compression.compress(GROUP.id)
    assert "reasoning_effort" not in env.model.summary_requests()[0]


# The chat model of these: window 28571 at compress_at 0.7 is a line of 19999.7 tokens;
# the trim budget 28571 − 1024 = 27547 is above it. Summary model: window 200000,
# max output 8192 → physical cap 8192, ⅔ of it 5461.33.
LINE_CHAT = {"context_window": 28571}
BIG_SUMMARY = {"context_window": 200000, "max_output_tokens": 8192}


async def seeded(env: Env, n: int, size: int = 12, *, turn: bool) -> int:
    """n group lines, and with `turn` a turn on them (its usage sets the line); what the
    history's units take."""
    await seed(env.rt, n, size=size)
    if turn:
        await env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    return units_tokens(await env.rt.store.get_history(GROUP.id))


async def summary_request(env: Env) -> dict[str, Any]:
    """The one summary request of a manual compression of the group."""
    await env.rt.compression.compress(GROUP.id)
    (request,) = env.model.summary_requests()
    return request


async def test_r_bud_1_budget_from_latest_usage_line(make: Make) -> None:
    env = await make(chat=LINE_CHAT, summary=BIG_SUMMARY, memsum_compress_at=0.7)
    content = await seeded(env, 30, 120, turn=True)
    assert content > 2000  # R-BUD-2 does not bind
    request = await summary_request(env)
    budget = Fraction(199997, 100)  # E × 0.1 = 1999.97; floor 1000, E / 4 and ⅔ cap do not bind
    assert stated(request) == (1999, min(1999, math.floor(Fraction(1, 10) * content)))
    assert request["max_tokens"] == math.ceil(Fraction(3, 2) * budget) == 3000


async def test_r_bud_1_compress_at_0_takes_the_trim_budget_as_line(make: Make) -> None:
    env = await make(chat=LINE_CHAT, summary=BIG_SUMMARY, memsum_compress_at=0)
    assert await seeded(env, 30, 120, turn=True) > 2755
    request = await summary_request(env)
    # E = trim budget 27547; × 0.1 = 2754.7; max_tokens ⌈4132.05⌉.
    assert stated(request)[0] == 2754
    assert request["max_tokens"] == 4133


async def test_r_trig_1_budget_takes_the_latest_usage_snapshots_included(make: Make) -> None:
    env = await make(chat=LINE_CHAT, summary=BIG_SUMMARY, memsum_compress_at=0.8)
    await seeded(env, 30, 120, turn=True)
    # A later snapshot (no turn id) from a smaller model: window 4000, trim budget 2976.
    smaller = {"model_id": "other/small", "window": 4000, "trim_budget": 2976}
    await env.rt.bus.emit(replace(due_usage(None), **smaller, history_messages=31, history_limit=0))
    request = await summary_request(env)
    # E = min(0.8 × 4000, 2976) = 2976 → × 0.1 = 297.6 → floor 1000 → E / 4 = 744 wins.
    assert stated(request)[0] == 744
    assert request["max_tokens"] == 1116


async def test_r_bud_2_budget_at_most_what_is_compressed(make: Make) -> None:
    env = await make(chat=LINE_CHAT, summary=BIG_SUMMARY, memsum_compress_at=0.7)
    content = await seeded(env, 12, 110, turn=True)
    assert 1000 < content < 1999  # between the floor and E × ratio
    request = await summary_request(env)
    assert stated(request)[0] == content
    assert request["max_tokens"] == math.ceil(Fraction(3, 2) * content)


async def test_r_bud_3_line_over_4_wins_over_the_floor(make: Make) -> None:
    # E = min(0.5 × 4000, 4000 − 1024) = 2000; × 0.1 = 200 → floor 1000 → E / 4 = 500.
    env = await make(chat={"context_window": 4000}, summary=BIG_SUMMARY, memsum_compress_at=0.5)
    content = await seeded(env, 8, turn=True)
    request = await summary_request(env)
    assert stated(request) == (500, min(500, math.floor(Fraction(1, 10) * content)))
    assert request["max_tokens"] == 750


async def test_r_bud_6_no_usage_budget_from_content(make: Make) -> None:
    env = await make(summary=BIG_SUMMARY)
    content = await seeded(env, 12, 110, turn=False)  # no turn: no usage, no line
    assert 1000 < content < 5461
    request = await summary_request(env)
    assert stated(request) == (content, math.floor(Fraction(1, 10) * content))
    assert request["max_tokens"] == math.ceil(Fraction(3, 2) * content)


async def test_r_bud_6_no_usage_little_content_gets_the_floor(env: Env) -> None:
    await seed(env.rt, 3)
    request = await summary_request(env)
    assert stated(request)[0] == 1000
    assert request["max_tokens"] == 1500


async def test_r_bud_4_ratio_0_offers_and_keeps_nothing(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0)
    rt, model = env.rt, env.model
    await seed(rt, 4)
    model.summary.append(Reply(f"【保留原文】1、2\n{CHAT_SUMMARY}"))
    result = await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert offered(request) == {}
    assert "这次不保留原文" in system_of(request)
    assert stated(request) == (1000, 0)
    assert result.kept_messages == 0
    assert [m.content for m in await rt.store.get_history(GROUP.id)] == [DIVIDER]


async def test_r_bud_5_physical_cap_wins_over_the_floor(make: Make) -> None:
    # Physical cap min(1200, 32000 / 4) = 1200; ⅔ of it, 800, is under the floor of 1000.
    env = await make(summary={"max_output_tokens": 1200})
    await seed(env.rt, 3)
    request = await summary_request(env)
    assert stated(request)[0] == 800
    assert request["max_tokens"] == 1200


async def test_r_bud_7_max_tokens_at_most_the_physical_cap(make: Make) -> None:
    # Window 6002: physical cap 1500.5; more than 1000.33 to compress, so the budget is ⅔ of the
    # cap, 1000.33, and ⌈1.5 × budget⌉ = 1501 is over the cap: max_tokens is 1500.
    env = await make(summary={"context_window": 6002}, memsum_capacity="spec")
    await seed(env.rt, 12, size=110)
    assert units_tokens(await env.rt.store.get_history(GROUP.id)) > 1001
    await env.rt.compression.compress(GROUP.id)
    requests = env.model.summary_requests()
    assert len(requests) > 1  # the small window chunks; every request has the same sizes
    assert {stated(r)[0] for r in requests} == {1000}
    assert {r["max_tokens"] for r in requests} == {1500}


# ---- R-TPL through the service ----------------------------------------------------------------
PRIVATE_PEER = SessionRecord(
    id="onebot:private:20002", platform="onebot", kind="private", peer="20002", room_class="direct"
)
CHILD = SessionRecord(
    id="child:1", platform="onebot", kind="group", place="group:1", parent=GROUP.id, room_class="room"
)
INTERNAL = SessionRecord(id="internal:cron", platform=None, kind="internal")
CHAT_TITLES = ("最近在聊什么", "谁有问题没回应", "关键原话要点")
WORK_TITLES = ("目标", "做过的决定", "改过的文件", "未完成的事")
TODO_TAIL = "当前任务列表状态\n- [in_progress] 写周报\n- [pending] 发邮件"


def in_order(text: str, needles: Sequence[str]) -> bool:
    places = [text.find(n) for n in needles]
    return -1 not in places and places == sorted(places)


@pytest.mark.parametrize(
    ("record", "template"),
    [
        pytest.param(GROUP, "chat", id="r_tpl_1_group_chat"),
        pytest.param(PRIVATE_PEER, "chat", id="r_tpl_1_private_non_owner_chat"),
        pytest.param(PRIVATE_OWNER, "work", id="r_tpl_2_private_owner_work"),
        pytest.param(CHILD, "work", id="r_tpl_2_child_of_a_group_work"),
        pytest.param(INTERNAL, "work", id="r_tpl_2_internal_work"),
    ],
)
async def test_r_tpl_template_choice_through_the_service(
    env: Env, record: SessionRecord, template: str
) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3, record=record)
    await rt.todos.replace(record.id, [TodoItem("写周报", "in_progress"), TodoItem("发邮件", "pending")])
    await rt.compression.compress(record.id)
    (request,) = model.summary_requests()
    system, user = system_of(request), user_of(request)
    titles = CHAT_TITLES if template == "chat" else WORK_TITLES
    assert in_order(system, [f"「## {t}」" for t in titles])
    other = WORK_TITLES if template == "chat" else CHAT_TITLES
    assert not any(f"「## {t}」" in system for t in other)
    assert ("昵称(ID)" in system) == (template == "chat")
    # R-RUN-4: the work template ends with the todo list of this moment; the chat one has none.
    assert user.endswith(TODO_TAIL) == (template == "work")
    assert ("当前任务列表状态" in user) == (template == "work")
    assert (await summary_of(rt, record.id) or {})["template"] == template


async def test_r_run_4_work_template_without_todos_has_no_todo_part(env: Env) -> None:
    await seed(env.rt, 3, record=PRIVATE_OWNER)
    await env.rt.compression.compress(PRIVATE_OWNER.id)
    assert "当前任务列表状态" not in user_of(env.model.summary_requests()[0])


async def test_r_tpl_5_existing_summary_is_merged_into_the_same_sections(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    await seed(rt, 3, start=3)
    await rt.compression.compress(GROUP.id)
    first, second = model.summary_requests()
    assert "已有摘要" not in user_of(first)
    assert existing_summary_of(second) == CHAT_SUMMARY
    assert "请在同名小节上合并更新" in user_of(second)


async def test_r_tpl_5_unstructured_summary_is_folded_into_the_template(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3)
    model.summary.append(Reply("【保留原文】无\n大家在闲聊，没有什么要紧的事。"))
    await rt.compression.compress(GROUP.id)
    await seed(rt, 3, start=3)
    await rt.compression.compress(GROUP.id)
    second = model.summary_requests()[1]
    assert existing_summary_of(second) == "大家在闲聊，没有什么要紧的事。"
    assert "请把其中的内容按意思归入「最近在聊什么」「谁有问题没回应」「关键原话要点」" in user_of(second)
    assert "旧内容里仍然成立的不要丢" in user_of(second)


async def test_r_tpl_5_summary_with_topic_sub_headings_is_merged_not_folded(env: Env) -> None:
    # R-TPL-5: 「按话题分段」 invites sub-headings and bold topic lines inside the sections.
    rt, model = env.rt, env.model
    topics = (
        "## 最近在聊什么\n### 周末爬山\n甲(1) 约大家周六爬山\n**话题：新游戏**\n乙(2) 推荐了一款游戏\n"
        "## 谁有问题没回应\n无\n## 关键原话要点\n无"
    )
    await seed(rt, 3)
    model.summary.append(Reply(f"【保留原文】无\n{topics}"))
    await rt.compression.compress(GROUP.id)
    await seed(rt, 3, start=3)
    await rt.compression.compress(GROUP.id)
    second = model.summary_requests()[1]
    assert existing_summary_of(second) == topics
    assert "请在同名小节上合并更新：旧内容里仍然成立的不要丢" in user_of(second)
    assert "按意思归入" not in user_of(second)


# ---- R-RUN-10 chunking end to end ----------------------------------------------------------------
async def test_r_run_10_chunked_requests_each_fit_and_give_one_summary(make: Make) -> None:
    window = 6000
    env = await make(summary={"context_window": window}, memsum_capacity="spec")
    rt, model = env.rt, env.model
    history = await seed(rt, 80, size=80)
    replies: list[str] = []

    def chunk_reply(body: dict[str, Any]) -> Reply:
        text = f"## 最近在聊什么\n第{len(replies) + 1}块的摘要\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
        replies.append(text)
        numbers = sorted(offered(body))
        return Reply(f"【保留原文】{numbers[-1] if numbers else '无'}\n{text}")

    model.summary_default = chunk_reply
    result = await rt.compression.compress(GROUP.id)
    requests = model.summary_requests()
    assert len(requests) >= 5
    physical_cap = window // 4  # min(4096 unknown output, 6000 / 4)
    largest = 0
    for i, body in enumerate(requests):
        summary = existing_summary_of(body)
        # R-RUN-9: 2 tokens a character besides the existing summary, which counts as the physical cap.
        characters = len(system_of(body)) + len(user_of(body)) - len(summary)
        assert 2 * characters + physical_cap + body["max_tokens"] <= window
        # R-RUN-10: the previous chunk's summary is the next request's existing summary.
        assert summary == (replies[i - 1] if i else "")
        largest = max(largest, len(conversation_of(body)))
    assert sum(len(m.content) for m in history) >= 10 * largest
    assert result.summary == replies[-1] == (await summary_of(rt) or {})["text"]
    # What the last request chose stays; everything else is archived.
    last = requests[-1]
    chosen = offered(last)[max(offered(last))]
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.content for m in active] == [chosen]
    assert result.archived == len(history) - 1


# ---- the measured capacity (issue 9) and the retry under R-RUN-9's literal rule ---------------
# OpenAI's answer to a request longer than the context, as its API reference and the openai-python
# SDK's BadRequestError carry it (code `context_length_exceeded`; message form as collected in
# pkdone/paul-genai-test-tools-ts src/llm/providers/openai/openai-error-patterns.ts).
CONTEXT_TOO_LONG = Reply(
    status=400,
    raw=json.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 6000 tokens. However, your messages"
                " resulted in 6817 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    ),
)


def literal_fit(body: dict[str, Any], window: int) -> bool:
    """R-RUN-9's literal rule: 2 × characters besides the summary + physical cap + max_tokens ≤ window."""
    characters = len(system_of(body)) + len(user_of(body)) - len(existing_summary_of(body))
    return 2 * characters + window // 4 + body["max_tokens"] <= window


def measured_fit(body: dict[str, Any], window: int) -> bool:
    """MARGIN × the request's o200k tokens (as the server would count them) + max_tokens ≤ window."""
    tokens = 3 + sum(estimate_text_tokens(m["content"]) + 3 for m in body["messages"])
    return math.ceil(MARGIN * tokens) + body["max_tokens"] <= window


async def test_measured_capacity_fills_requests_by_tokens_and_every_one_fits(make: Make) -> None:
    window = 6000
    spec = await make(summary={"context_window": window}, memsum_capacity="spec")
    measured = await make(summary={"context_window": window})
    for env in (spec, measured):
        await seed(env.rt, 80, size=80)
        await env.rt.compression.compress(GROUP.id)
    literal, by_tokens = spec.model.summary_requests(), measured.model.summary_requests()
    assert all(literal_fit(b, window) for b in literal)
    assert all(measured_fit(b, window) for b in by_tokens)
    # The same history in fewer, fuller requests: CJK runs near 1 token a character, not 2,
    # and the summary is counted at its size, not as the whole physical cap.
    assert 2 * len(by_tokens) <= len(literal)
    assert not all(literal_fit(b, window) for b in by_tokens)
    # One way of counting per run, whatever the default.
    assert spec.rt.config.memsum_capacity == "spec"
    assert measured.rt.config.memsum_capacity == "measured"


async def test_context_too_long_retries_that_request_under_the_literal_rule(make: Make) -> None:
    window = 6000
    env = await make(summary={"context_window": window})
    await seed(env.rt, 80, size=80)
    env.model.summary.append(CONTEXT_TOO_LONG)
    result = await env.rt.compression.compress(GROUP.id)
    assert result.outcome == "done"
    first, *rest = env.model.summary_requests()
    assert measured_fit(first, window)
    assert not literal_fit(first, window)
    # The refused request's conversation comes again, now sized by the literal rule.
    assert rest
    assert all(literal_fit(b, window) for b in rest)
    assert conversation_of(rest[0]).split("\n\n")[0] == conversation_of(first).split("\n\n")[0]
    assert env.phases() == [("start", None), ("done", None)]
    assert env.failure_warnings() == []


async def test_context_too_long_under_the_literal_rule_fails_the_run(make: Make) -> None:
    env = await make(summary={"context_window": 6000})
    await seed(env.rt, 80, size=80)
    env.model.summary_default = CONTEXT_TOO_LONG
    with pytest.raises(CompressionError, match="maximum context length"):
        await env.rt.compression.compress(GROUP.id)
    assert len(env.model.summary_requests()) == 2  # the measured request, then once under the rule
    assert await summary_of(env.rt) is None
