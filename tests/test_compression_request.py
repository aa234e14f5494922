"""Requests, capacity and chunking (R-RUN-4, R-RUN-9, R-RUN-10, R-FAIL-1/2)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from nonebot_plugin_memsum.compression.budget import Budget, compute_budget
from nonebot_plugin_memsum.compression.keep import apply_count_rule
from nonebot_plugin_memsum.compression.parse import ParsedReply, parse_reply
from nonebot_plugin_memsum.compression.request import (
    EMPTY_SUMMARY,
    REFUSED_WINDOW,
    CapacityRule,
    ChunkPlan,
    CompressionError,
    SummaryRequest,
    capacity,
)
from nonebot_plugin_memsum.compression.templates import CHAT, WORK, Template
from nonebot_plugin_memsum.compression.units import Unit, build_units, cut_point
from tests.fakes.compression import EST, assistant, divider, result, user

# physical cap and max_tokens fixed at 100: capacity = ⌊(window − 200) / 2⌋ − prompt characters
BUDGET = Budget(line=None, budget=Fraction(1000), keep_cap=500, physical_cap=Fraction(100), max_tokens=100)
PROBE_WINDOW = 1_000_000


def start(
    units: Sequence[Unit],
    window: int,
    *,
    template: Template = WORK,
    summary: str = "",
    todos: Sequence[tuple[str, str]] | None = None,
    budget: Budget = BUDGET,
    rule: CapacityRule = "spec",
) -> ChunkPlan:
    return ChunkPlan.start(
        units=units,
        template=template,
        budget=budget,
        summary_window=window,
        existing_summary=summary,
        todos=todos,
        est=EST,
        rule=rule,
    )


def window_for(units: Sequence[Unit], chars: int, **kw) -> int:
    """The summary window that gives a request capacity of exactly `chars` characters."""
    prompt_chars = (PROBE_WINDOW - 200) // 2 - start(units, PROBE_WINDOW, **kw).capacity
    return 2 * (prompt_chars + chars) + 200


def user_text(req: SummaryRequest) -> str:
    assert [m["role"] for m in req.messages] == ["system", "user"]
    return req.messages[1]["content"]


def keep(*numbers: int, summary: str = "## 目标\n摘要") -> ParsedReply:
    return ParsedReply(summary, numbers, block_unreadable=False)


def test_r_run_9_capacity_formula() -> None:
    budget = Budget(
        line=None, budget=Fraction(2730), keep_cap=0, physical_cap=Fraction(4096), max_tokens=4096
    )
    # (20000 − 4096 − 4096) / 2 − 1000 = 5904 − 1000
    assert capacity(summary_window=20_000, budget=budget, prompt_chars=1000) == 4904
    # window 10002: cap 2500.5, max 2500 → (10002 − 2500.5 − 2500) / 2 = 2500.75 → 2500 − 300
    odd = Budget(
        line=None, budget=Fraction(1667), keep_cap=0, physical_cap=Fraction(5001, 2), max_tokens=2500
    )
    assert capacity(summary_window=10_002, budget=odd, prompt_chars=300) == 2200


def test_r_run_9_request_fits_the_window() -> None:
    units = build_units([user("[甲(1)] " + "话" * 50) for _ in range(30)])
    window = window_for(units, 400, summary="旧摘要" * 10)
    plan = start(units, window, summary="旧摘要" * 10)
    assert plan.capacity == 400
    while not plan.done:
        req = plan.next_request()
        summary_chars = len(plan.summary) if plan.summary.strip() else 0
        chars = sum(len(m["content"]) for m in req.messages) - summary_chars
        assert 2 * chars + BUDGET.physical_cap + req.max_tokens <= window
        plan = plan.after_reply(keep())


def test_r_fail_2_refused_under_4_characters() -> None:
    units = build_units([user("a")])
    window = window_for(units, 4)
    assert start(units, window).capacity == 4
    with pytest.raises(CompressionError) as err:
        start(units, window - 1)  # capacity 3
    assert err.value.reason == REFUSED_WINDOW == "摘要模型的窗口装不下提示词、已有摘要与输出上限"


def test_r_run_10_one_request_when_everything_fits() -> None:
    units = build_units([user("[甲(1)] 一"), assistant("二")])
    plan = start(units, PROBE_WINDOW)
    req = plan.next_request()
    assert req.is_last
    assert sorted(req.offered) == [1, 2]
    assert "#1〔约 12 token〕[甲(1)] 一\n\n#2〔约 5 token〕助手: 二" in user_text(req)
    assert req.max_tokens == 100
    plan = plan.after_reply(keep(2))
    assert plan.done
    res = plan.result()
    assert res.summary == "## 目标\n摘要"
    assert res.kept == (units[1],)
    assert res.requests == 1


def test_r_run_10_chunks_resend_kept_and_drop_earliest_kept_for_the_head() -> None:
    # each unit: cost 24, annotated "#n〔约 24 token〕" (14) + 20 = 34 characters; capacity 100
    units = build_units([user(letter * 20) for letter in "abcde"])
    plan = start(units, window_for(units, 100))
    assert plan.capacity == 100

    req = plan.next_request()  # 34 + 2 + 34 = 70; a third would make 106
    assert (sorted(req.offered), req.is_last) == ([1, 2], False)
    assert "〔已有摘要开始〕" not in user_text(req)
    plan = plan.after_reply(keep(2, summary="## 目标\n第一块"))

    req = plan.next_request()  # #2 re-sent with its number, then #3
    assert (sorted(req.offered), req.is_last) == ([2, 3], False)
    text = user_text(req)
    assert text.index("#2〔约 24 token〕" + "b" * 20) < text.index("#3〔约 24 token〕" + "c" * 20)
    assert "〔已有摘要开始〕\n## 目标\n第一块\n〔已有摘要结束〕" in text  # the previous result
    plan = plan.after_reply(keep(2, 3, summary="## 目标\n第二块"))

    req = plan.next_request()  # #2 #3 + #4 = 106: the earliest kept (#2) goes for the head
    assert (sorted(req.offered), req.is_last) == ([3, 4], False)
    plan = plan.after_reply(keep(summary="## 目标\n第三块"))

    req = plan.next_request()
    assert (sorted(req.offered), req.is_last) == ([5], True)
    plan = plan.after_reply(keep(5, summary="## 目标\n终稿"))
    res = plan.result()
    assert (res.summary, res.kept, res.requests) == ("## 目标\n终稿", (units[4],), 4)


def test_r_run_10_unit_over_half_capacity_split_into_unnumbered_pieces() -> None:
    units = build_units([user("x" * 120), user("y" * 10)])
    plan = start(units, window_for(units, 100))
    assert [len(p.text) for p in plan.queue] == [50, 50, 20, 24]
    assert [p.number for p in plan.queue] == [None, None, None, 1]

    req = plan.next_request()  # 50 + 2 + 50 = 102 > 100
    assert ("x" * 50, req.offered, req.is_last) == (
        user_text(req).split("〔对话记录开始〕\n")[1][:50],
        {},
        False,
    )
    plan = plan.after_reply(keep())
    req = plan.next_request()  # 50 + 2 + 20 + 2 + 24 = 98
    assert (sorted(req.offered), req.is_last) == ([1], True)
    assert "x" * 50 + "\n\n" + "x" * 20 + "\n\n#1〔约 14 token〕" + "y" * 10 in user_text(req)


def test_r_run_4_work_template_ends_with_todo_state() -> None:
    units = build_units([user("写个函数")])
    todos = [("in_progress", "写测试"), ("pending", "发布")]
    req = start(units, PROBE_WINDOW, todos=todos).next_request()
    assert user_text(req).endswith("\n\n当前任务列表状态\n- [in_progress] 写测试\n- [pending] 发布")


def test_r_run_4_no_todo_part_without_items_or_in_chat() -> None:
    units = build_units([user("[甲(1)] 在吗")])
    for plan in (
        start(units, PROBE_WINDOW, todos=[]),
        start(units, PROBE_WINDOW, todos=None),
        start(units, PROBE_WINDOW, template=CHAT, todos=[("pending", "x")]),
    ):
        assert "当前任务列表状态" not in user_text(plan.next_request())


def test_r_fail_1_empty_summary_fails() -> None:
    plan = start(build_units([user("a")]), PROBE_WINDOW)
    with pytest.raises(CompressionError) as err:
        plan.after_reply(parse_reply("【保留原文】1\n"))
    assert err.value.reason == EMPTY_SUMMARY == "摘要为空"


def test_r_run_8_warnings_reach_the_result() -> None:
    plan = start(build_units([user("a")]), PROBE_WINDOW).after_reply(parse_reply("## 目标\n无"))
    assert len(plan.result().warnings) == 1
    plan = start(build_units([user("a")]), PROBE_WINDOW).after_reply(
        parse_reply("【保留原文】第一条\n## 目标")
    )
    assert len(plan.result().warnings) == 1


def test_pure_core_end_to_end() -> None:
    snapshot = [
        divider(),
        user("[甲(1)] 帮我查北京天气"),
        assistant("", ("c1", "weather", '{"city":"北京"}')),
        result("c1", "晴"),
        assistant("北京晴"),
        user("[乙(2)] 明天十点开会，别忘了"),
        assistant("", ("c2", "weather", "{}")),  # unanswered: stays active
    ]
    cut = cut_point(snapshot)
    assert cut == 6
    span = snapshot[:cut]
    units = build_units(span)
    budget = compute_budget(
        line=None,
        ratio=0.5,
        summary_window=128_000,
        summary_max_output=None,
        existing_summary_tokens=0,
        units_tokens=sum(EST.text(u.text) for u in units),
    )
    plan = start(units, 128_000, template=CHAT, budget=budget)
    req = plan.next_request()
    assert sorted(req.offered) == [1, 2, 3, 4]
    reply = (
        "【保留原文】#4、#2\n## 最近在聊什么\n甲(1) 问天气\n"
        "## 谁有问题没回应\n无\n## 关键原话要点\n乙(2) 十点开会"
    )
    res = plan.after_reply(parse_reply(reply)).result()
    assert [u.indexes for u in res.kept] == [(2, 3), (5,)]
    # R-BACK-2 at commit: limit 4 → half 2; one message after the cut leaves room for one
    assert apply_count_rule(res.kept, 1, 4) == (res.kept[1],)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=700), min_size=1, max_size=40),
    window=st.integers(min_value=3_000, max_value=40_000),
    max_output=st.one_of(st.none(), st.integers(min_value=20, max_value=8_000)),
    line=st.one_of(st.none(), st.integers(min_value=1_000, max_value=200_000)),
    ratio=st.sampled_from([0, 0.05, 0.1, 0.5]),
    summary_len=st.integers(min_value=0, max_value=2_000),
    template=st.sampled_from([CHAT, WORK]),
    data=st.data(),
)
def test_r_run_9_10_chunked_requests_always_fit(
    sizes: list[int],
    window: int,
    max_output: int | None,
    line: int | None,
    ratio: float,
    summary_len: int,
    template: Template,
    data: st.DataObject,
) -> None:
    span = [user("u" * n) if k % 3 else assistant("a" * n) for k, n in enumerate(sizes)]
    units = build_units(span)
    existing = "旧" * summary_len
    budget = compute_budget(
        line=None if line is None else Fraction(line),
        ratio=ratio,
        summary_window=window,
        summary_max_output=max_output,
        existing_summary_tokens=EST.text(existing),
        units_tokens=sum(EST.text(u.text) for u in units),
    )
    try:
        plan = start(
            units, window, template=template, summary=existing, todos=[("pending", "t")], budget=budget
        )
    except CompressionError:
        event("refused")
        return
    assert plan.capacity >= 4
    queued = len(plan.queue)
    for _ in range(queued):
        req = plan.next_request()
        text = user_text(req)
        summary_chars = len(plan.summary) if plan.summary.strip() else 0
        chars = len(req.messages[0]["content"]) + len(text) - summary_chars
        assert 2 * chars + budget.physical_cap + req.max_tokens <= window  # R-RUN-9
        resent = [p.number for p in plan.kept if p.text in text]
        assert resent == [p.number for p in plan.kept][len(plan.kept) - len(resent) :]  # earliest dropped
        assert all(p.text in text for p in req.offered.values())
        numbers = data.draw(st.lists(st.sampled_from(sorted(req.offered) or [0]), max_size=5))
        summary = "## 标题\n" + "s" * data.draw(st.integers(min_value=1, max_value=3_000))
        before = len(plan.queue)
        plan = plan.after_reply(keep(*numbers, summary=summary))
        assert len(plan.queue) < before  # every request carries something new
        assert all(p.number in req.offered for p in plan.kept)
        if req.is_last:
            break
    assert plan.done
    assert all(u in units for u in plan.result().kept)
    event(f"requests: {min(plan.requests, 3)}")


# ---- issue 9: chunk boundaries and the measured rule --------------------------------------------
def test_r_run_10_a_long_unit_is_cut_at_line_then_sentence_then_word_boundaries() -> None:
    from nonebot_plugin_memsum.compression.request import cut_at, split_text

    lines = "第一行说完了\n第二行也说完了\n第三行"
    assert cut_at(lines, 12) == lines.index("\n") + 1  # after the last line break that fits
    assert cut_at(lines, 16) == lines.index("\n", 7) + 1
    sentences = "今天天气很好。我们去爬山吧！好不好"
    assert cut_at(sentences, 15) == sentences.index("！") + 1
    english = "please remember the meeting tomorrow afternoon"
    end = cut_at(english, 20)
    assert english[:end] == "please remember the "
    assert cut_at("短", 10) == 1
    # One word longer than the piece: cut hard, nothing lost.
    word = "x" * 50
    assert split_text(word, lambda t: len(t) <= 20, 20) == ["x" * 20, "x" * 20, "x" * 10]
    paste = "\n".join(f'File "bot{i}.py", line {i}, in handler' for i in range(40))
    pieces = split_text(paste, lambda t: len(t) <= 200, 200)
    assert "".join(pieces) == paste
    assert all(len(p) <= 200 for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-1])  # every cut at a line end


@given(st.text(alphabet="ab 。\n中文", min_size=1, max_size=300), st.integers(1, 60))
def test_r_run_10_pieces_join_back_and_fit(text: str, size: int) -> None:
    from nonebot_plugin_memsum.compression.request import split_text

    pieces = split_text(text, lambda t: len(t) <= size, size)
    assert "".join(pieces) == text
    assert all(1 <= len(p) <= size for p in pieces)


def test_measured_rule_splits_a_paste_at_lines_and_every_request_fits() -> None:
    from nonebot_plugin_memsum.compression.request import MARGIN

    paste = user("\n".join(f"第{i}行：日志内容 value={i}" for i in range(400)))
    units = build_units([user("开头"), paste, user("结尾")])
    window = 4000
    plan = ChunkPlan.start(
        units=units,
        template=CHAT,
        budget=BUDGET,
        summary_window=window,
        existing_summary="",
        todos=None,
        est=EST,
        rule="measured",
    )
    texts: list[str] = []
    while not plan.done:
        req = plan.next_request()
        tokens = 3 + sum(EST.text(m["content"]) + 3 for m in req.messages)
        assert MARGIN * tokens + req.max_tokens <= window
        texts.append(req.messages[1]["content"])
        plan = plan.after_reply(keep(summary="## 最近在聊什么\n摘要"))
    assert len(texts) > 2
    for text in texts:
        body = text.split("〔对话记录开始〕\n", 1)[1].split("\n〔对话记录结束〕", 1)[0]
        for piece in body.split("\n\n"):
            piece = re.sub(r"^#\d+〔约 \d+ token〕", "", piece).strip()
            assert piece in ("开头", "结尾") or piece.startswith("第"), piece[:20]  # cut at line starts
    # under the literal rule from here: the same queue, smaller requests
    spec = ChunkPlan.start(
        units=units,
        template=CHAT,
        budget=BUDGET,
        summary_window=window,
        existing_summary="",
        todos=None,
        est=EST,
        rule="measured",
    ).under_spec_rule()
    assert spec.rule == "spec"
    assert spec.capacity == start(units, window, template=CHAT).capacity


def test_r_run_10_each_plan_works_out_its_own_request() -> None:
    # A plan remembers its next request's parts between next_request and after_reply; the
    # plan after a reply, and one sized again under the literal rule, work out their own.
    from dataclasses import replace

    units = build_units([user(letter * 20) for letter in "abcdefghij"])
    window = window_for(units, 100)
    plan = start(units, window)
    first = plan.next_request()
    assert plan.next_request() == first
    assert sorted(plan.after_reply(keep(2)).next_request().offered) == [2, 3]

    measured = start(units, window, rule="measured")
    sent = measured.next_request()
    spec = measured.under_spec_rule()
    assert spec.next_request() == replace(spec).next_request() != sent
