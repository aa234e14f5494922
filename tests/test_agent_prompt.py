"""Count trimming, hard trimming and assembly of the chat agent's prompt (pure)."""

from hypothesis import given
from hypothesis import strategies as st

from nonebot_plugin_memsum.agent.prompt import (
    ANSWERED_LAST,
    Prompt,
    _sendable_checked,
    assemble,
    contribution_order,
    conversation,
    count_trim,
    hard_trim,
    safe_start,
    sendable,
    to_openai,
    trim_budget,
)
from nonebot_plugin_memsum.llm.tokens import MESSAGE_OVERHEAD, REQUEST_OVERHEAD
from nonebot_plugin_memsum.types import CONVERSATION_ROLES, Message, ToolCall


def user(i: int) -> Message:
    return Message(role="user", content=f"[u(1)] m{i}", id=i)


def call(cid: str) -> Message:
    return Message(role="assistant", content="", tool_calls=(ToolCall(cid, "todo_write", "{}"),))


def result(cid: str) -> Message:
    return Message(role="tool", content="ok", tool_call_id=cid, name="todo_write")


def est(m: Message) -> int:
    return 10


def test_r_cfg_6_count_trim_keeps_at_most_limit_in_segments() -> None:
    history = [user(i) for i in range(25)]
    # limit 10, segment 5: 25 - 10 = 15 excess -> drop 15 -> keep 10
    assert [m.id for m in count_trim(history, 10)] == list(range(15, 25))
    # 26 messages: excess 16 -> drop 20 (4 segments) -> keep 6; the prefix moves only every 5 messages
    history26 = [user(i) for i in range(26)]
    assert [m.id for m in count_trim(history26, 10)] == list(range(20, 26))
    for n in range(27, 31):
        assert count_trim([user(i) for i in range(n)], 10)[0].id == 20


def test_r_cfg_6_count_trim_off_at_zero_and_skips_event_markers() -> None:
    marker = Message(role="system", content="对话已压缩", event_marker=True)
    history = [user(0), marker, user(1)]
    assert count_trim(history, 0) == [user(0), user(1)]


def test_count_trim_never_splits_a_tool_group() -> None:
    history = [user(0), user(1), call("a"), result("a"), user(4), user(5)]
    # limit 3, segment 1: drop 3 would start at the result -> move past the group
    kept = count_trim(history, 3)
    assert kept[0].role == "user"
    assert all(not (m.role == "tool") or any(c.role == "assistant" for c in kept) for m in kept)
    assert kept == [user(4), user(5)]


def test_safe_start_skips_lone_results() -> None:
    history = [result("x"), user(1)]
    assert safe_start(history, 0) == 1


def test_hard_trim_drops_oldest_whole_groups_and_reports() -> None:
    history = [user(0), call("a"), result("a"), user(3)]
    kept, trimmed = hard_trim(history, fixed_tokens=5, budget=25, estimate=est)
    assert trimmed is True
    assert kept == [user(3)]
    kept, trimmed = hard_trim(history, fixed_tokens=5, budget=45, estimate=est)
    assert kept == history
    assert trimmed is False


def test_sendable_drops_unfinished_calls_and_orphans() -> None:
    history = [call("a"), user(1), result("zz"), call("b"), result("b")]
    out = sendable(history)
    assert [m.role for m in out] == ["user", "assistant", "tool"]


def test_sendable_cleans_one_dangling_call_or_orphan_in_a_plain_history() -> None:
    # Most histories hold no tool message and are passed through as they are (issue 9: a
    # cheap turn); one crashed turn's call or a lone result must still be found and cleaned.
    plain = [user(0), Message(role="assistant", content="好", id=1), user(2)]
    assert sendable(plain) == plain
    said = Message(role="assistant", content="我查一下", tool_calls=(ToolCall("a", "recall", "{}"),), id=3)
    out = sendable([*plain, said, user(4)])
    assert out == [*plain, Message(role="assistant", content="我查一下"), user(4)]
    assert out[3].id is None  # a copy, not the stored message
    assert sendable([*plain, call("a"), user(4)]) == [*plain, user(4)]
    assert sendable([user(0), result("a"), user(2)]) == [user(0), user(2)]


_call_ids = st.sampled_from(["a", "b", "c"])
_messages = st.one_of(
    st.builds(
        lambda role, marker, text: Message(role=role, content=text, event_marker=marker),
        st.sampled_from(["user", "assistant", "notice", "system"]),
        st.booleans(),
        st.text("xy", max_size=3),
    ),
    st.builds(
        lambda ids, text: Message(
            role="assistant", content=text, tool_calls=tuple(ToolCall(i, "f", "{}") for i in ids)
        ),
        st.lists(_call_ids, min_size=1, max_size=2),
        st.text("xy", max_size=3),
    ),
    st.builds(
        lambda cid, marker: Message(role="tool", content="ok", tool_call_id=cid, event_marker=marker),
        st.one_of(st.none(), _call_ids),
        st.booleans(),
    ),
)


@given(history=st.lists(_messages, max_size=12))
def test_the_shortcuts_keep_what_the_general_rules_keep(history: list[Message]) -> None:
    assert sendable(history) == _sendable_checked(history)
    assert conversation(history) == [m for m in history if m.is_conversation]
    assert all(m.role in CONVERSATION_ROLES for m in conversation(history))


def test_assemble_counts_the_stored_estimate_and_estimates_the_rest() -> None:
    stored = Message(role="user", content="[u(1)] 存过的", id=1, tokens=7)
    prompt = assemble(
        ["p"], [stored, user(2)], history_limit=0, trim_budget=10_000, estimate_msg=est, estimate_text=len
    )
    assert prompt.untrimmed_history == 7 + 10


def test_to_openai_shapes() -> None:
    assert to_openai(call("a"))["tool_calls"][0]["function"]["name"] == "todo_write"
    assert to_openai(result("a")) == {"role": "tool", "tool_call_id": "a", "content": "ok"}
    assert to_openai(Message(role="notice", content="甲(1) 加入了本群")) == {
        "role": "user",
        "content": "[通知] 甲(1) 加入了本群",
    }


def test_trim_budget_reserves_the_reply() -> None:
    assert trim_budget(32000, 1.0, 4096, 1024) == 32000 - 1024
    assert trim_budget(32000, 0.5, 512, 1024) == 16000 - 512
    assert trim_budget(32000, 1.0, None, 1024) == 32000 - 1024


def test_r_inj_1_context_is_the_last_system_part_before_history() -> None:
    prompt = assemble(
        ["persona", "other", "SUMMARY"],
        [user(0), user(1)],
        history_limit=0,
        trim_budget=10_000,
        estimate_msg=est,
        estimate_text=len,
    )
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system", "system", "system", "user", "user"]
    assert prompt.messages[2]["content"] == "SUMMARY"
    # 3 system parts: len + 4 each = 11 + 9 + 11 = 31; two messages of 10
    assert prompt.estimate == 31 + 20
    assert prompt.untrimmed_history == 20
    assert prompt.trimmed is False


def test_huge_newest_message_is_cut_for_the_prompt_not_dropped() -> None:
    huge = Message(role="user", content="字" * 50_000)
    prompt = assemble(
        ["persona"],
        [user(0), huge],
        history_limit=0,
        trim_budget=1000,
        estimate_msg=lambda m: len(m.content),
        estimate_text=len,
    )
    assert prompt.trimmed is True
    last = prompt.messages[-1]["content"]
    assert last.startswith("字" * 100)
    assert len(last) < 1000


def test_a_prompt_never_ends_with_the_assistants_own_answer() -> None:
    answered = Message(role="assistant", content="第一个的答案", id=9)
    prompt = assemble(
        ["persona"],
        [user(0), user(1), answered],
        history_limit=0,
        trim_budget=10_000,
        estimate_msg=est,
        estimate_text=len,
    )
    assert prompt.messages[-2] == {"role": "assistant", "content": "第一个的答案"}
    assert prompt.messages[-1] == {"role": "user", "content": ANSWERED_LAST}
    ends_with_user = assemble(
        ["p"], [answered, user(2)], history_limit=0, trim_budget=10_000, estimate_msg=est, estimate_text=len
    )
    assert ends_with_user.messages[-1]["role"] == "user"
    assert ANSWERED_LAST not in [m["content"] for m in ends_with_user.messages]


def test_r_bud_the_notice_after_the_bots_own_answer_is_counted_before_the_trim() -> None:
    """The notice that follows a history ending with the bot's answer was added after the
    trim: a history that just fit went out over the budget by the notice's size (audit 11's
    random driver saw a request 14 tokens over a 4,000-token window)."""
    answered = Message(role="assistant", content="答", id=9)
    history = [*map(user, range(12)), answered]
    notice = len(ANSWERED_LAST) + MESSAGE_OVERHEAD
    exact = REQUEST_OVERHEAD + len("persona") + MESSAGE_OVERHEAD + sum(est(m) for m in history)

    def at(budget: int) -> Prompt:
        return assemble(
            ["persona"], history, history_limit=0, trim_budget=budget, estimate_msg=est, estimate_text=len
        )

    roomy = at(exact + notice)
    assert (roomy.trimmed, roomy.estimate, roomy.messages[-1]["content"]) == (
        False,
        exact + notice,
        ANSWERED_LAST,
    )
    tight = at(exact)  # fit without the notice: the oldest message goes to make room for it
    assert tight.trimmed
    assert tight.estimate <= exact
    assert tight.history[-1] is answered
    assert tight.messages[-1]["content"] == ANSWERED_LAST
    sent = REQUEST_OVERHEAD + len("persona") + MESSAGE_OVERHEAD + est(answered) * len(tight.history) + notice
    assert tight.estimate == sent


def test_r_inj_1_summary_last_after_every_context_contribution() -> None:
    contributions = {"context": ["weather", "news"], "rules": ["rules"]}
    assert contribution_order(contributions, "summary") == [
        ("rules", "rules"),
        ("context", "weather"),
        ("context", "news"),
        ("context", "summary"),
    ]
    assert contribution_order(contributions, None)[-1] == ("context", "news")
    assert contribution_order({}, "summary") == [("context", "summary")]
