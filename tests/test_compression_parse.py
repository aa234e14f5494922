"""Reading the summariser's reply (R-RUN-7)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from nonebot_plugin_memsum.compression.parse import ParsedReply, parse_reply

BODY = "## 最近在聊什么\n甲(1) 说 #3 号方案最好\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


def test_r_run_7_block_first() -> None:
    assert parse_reply(f"【保留原文】3、5\n{BODY}") == ParsedReply(BODY, (3, 5), block_unreadable=False)


def test_r_run_7_block_last() -> None:
    assert parse_reply(f"{BODY}\n\n【保留原文】#2，#7") == ParsedReply(BODY, (2, 7), block_unreadable=False)


def test_r_run_7_markdown_markers_before_heading() -> None:
    for heading in (
        "## 【保留原文】",
        "**【保留原文】**",
        "> 【保留原文】",
        "- 【保留原文】",
        "＃ 【保留原文】",
        "* 【保留原文】",
    ):
        parsed = parse_reply(f"{heading}：4\n{BODY}")
        assert parsed.numbers == (4,), heading
        assert parsed.summary == BODY


def test_r_run_7_numbers_on_following_lines_until_another_line() -> None:
    reply = f"【保留原文】\n1\n２、 3;\n\n无\n{BODY}\n9"
    parsed = parse_reply(reply)
    assert parsed.numbers == (1, 2, 3)
    assert parsed.summary == f"{BODY}\n9"  # the 9 after the body is summary, not a number


def test_r_run_7_annotation_copied_back_is_no_number() -> None:
    listed_forms = (
        "#3〔约 12 token〕",
        "#3 〔约12token〕",
        "#3（约 12 tokens）",
        "3〔约 12 token〕",
        "#3 (12 token)",
    )
    for listed in listed_forms:
        assert parse_reply(f"【保留原文】{listed}\n{BODY}").numbers == (3,), listed


def test_r_run_7_numbered_list_of_hash_numbers_keeps_the_hash_numbers() -> None:
    reply = f"【保留原文】\n1. #3\n2. ＃５\n{BODY}"
    assert parse_reply(reply) == ParsedReply(BODY, (3, 5), block_unreadable=False)


def test_r_run_7_annotated_number_lines_do_not_end_the_block() -> None:
    reply = f"【保留原文】\n- #3〔约 12 token〕\n- #7〔约 40 token〕\n\n{BODY}"
    assert parse_reply(reply) == ParsedReply(BODY, (3, 7), block_unreadable=False)


def test_r_run_7_once_a_hash_number_is_present_only_hash_numbers_count() -> None:
    reply = f"【保留原文】#1、2\n3.\n＃４\n{BODY}"
    assert parse_reply(reply).numbers == (1, 4)


def test_r_run_7_a_quoted_original_after_the_number_ends_the_block() -> None:
    # The line has words beyond the annotation: it is summary, and its (1) is not a number.
    reply = f"【保留原文】#2\n#3〔约 12 token〕[甲(1)] 周六八点集合\n{BODY}"
    parsed = parse_reply(reply)
    assert parsed.numbers == (2,)
    assert parsed.summary == f"#3〔约 12 token〕[甲(1)] 周六八点集合\n{BODY}"


def test_r_run_7_none_keeps_nothing() -> None:
    for reply in (f"【保留原文】无\n{BODY}", f"【保留原文】：无。\n{BODY}", f"【保留原文】\n无\n{BODY}"):
        assert parse_reply(reply) == ParsedReply(BODY, (), block_unreadable=False)


def test_r_run_7_hash_number_in_body_is_not_a_number() -> None:
    parsed = parse_reply(f"【保留原文】无\n{BODY}")
    assert parsed.numbers == ()
    assert "#3" in parsed.summary


def test_r_run_7_last_of_several_blocks_counts_and_none_is_stored() -> None:
    parsed = parse_reply(f"【保留原文】1、2\n{BODY}\n【保留原文】5")
    assert parsed.numbers == (5,)
    assert parsed.summary == BODY
    assert "保留原文" not in parsed.summary


def test_r_run_7_no_heading_whole_reply_is_summary() -> None:
    assert parse_reply(f"\n{BODY}\n") == ParsedReply(BODY, None, block_unreadable=False)


def test_r_run_7_heading_inside_a_sentence_is_no_heading() -> None:
    text = "- 甲(1) 问【保留原文】是什么 3"
    assert parse_reply(text) == ParsedReply(text, None, block_unreadable=False)


def test_r_run_7_block_with_words_but_no_number_is_unreadable() -> None:
    parsed = parse_reply(f"【保留原文】见上文的承诺\n{BODY}")
    assert parsed == ParsedReply(BODY, (), block_unreadable=True)


def test_r_run_7_block_only_is_empty_summary() -> None:
    assert parse_reply("【保留原文】2\n\n") == ParsedReply("", (2,), block_unreadable=False)


def _digit_runs(text: str) -> set[int]:
    return {int(r) for r in re.findall(r"[0-9０-９]+", text)}


@settings(max_examples=200)
@given(st.text())
def test_r_run_7_parser_never_raises_and_invents_no_number(text: str) -> None:
    parsed = parse_reply(text)
    assert set(parsed.numbers or ()) <= _digit_runs(text)
    assert all(
        not line.lstrip("#＃*->  \t").startswith("【保留原文】") for line in parsed.summary.splitlines()
    )


heading_like = st.sampled_from(["【保留原文】", "## 【保留原文】", "\n", "3、5", "无", "#2", "正文"])


@settings(max_examples=200)
@given(st.lists(st.one_of(heading_like, st.text(max_size=20)), max_size=12))
def test_r_run_7_parser_on_reply_like_text(lines: list[str]) -> None:
    text = "\n".join(lines)
    parsed = parse_reply(text)
    assert set(parsed.numbers or ()) <= _digit_runs(text)
    if "【保留原文】" not in text:
        assert parsed.numbers is None


body_chars = st.characters(
    blacklist_categories=("Cs",), blacklist_characters="【\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
)


@settings(max_examples=200)
@given(st.lists(st.integers(min_value=1, max_value=999), max_size=6), st.text(body_chars, max_size=200))
def test_r_run_7_written_numbers_come_back_exactly(numbers: list[int], body: str) -> None:
    listed = "、".join(f"#{n}" for n in numbers) or "无"
    summary = f"## 目标\n{body}"
    parsed = parse_reply(f"【保留原文】{listed}\n{summary}")
    assert parsed.numbers == tuple(dict.fromkeys(numbers))
    assert parsed.summary == summary.strip()
    assert not parsed.block_unreadable
