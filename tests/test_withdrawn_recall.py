"""A message withdrawn (撤回) after the model looked it up with `recall` stays out of the model's
reach there too.

The README promises that once a member withdraws a message, later chat requests and
summary requests show it only as 「[昵称(QQ)] （这条消息已撤回）」 (tests/test_audit7_u.py). A
`recall` result stored before the withdrawal still held the text: the tool group is part of
the active history (R-RUN-2), so every later chat request and the next compression's
summary request (R-RUN-3) carried the phone number the member had taken back. The
withdrawal now rewrites the lines of the session's active recall results that show the
message, as the model reads the message itself; the message's own row and the archive keep
the text (R-MEM-2), and archived tool groups are never sent again so stay as they were.

The pure rewrite runs on `render`'s real output; the store scenario on a real SQLite file and
on PostgreSQL (the `location` fixture); the whole path through bot.py as a real process, the
OneBot simulator over the reverse WebSocket and the scripted model over HTTP.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC
from typing import Any

import pytest

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.agent.recall import excerpt, mask_withdrawn, render
from nonebot_plugin_memsum.agent.tools import ToolContext
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.store import SearchHit, Store
from nonebot_plugin_memsum.types import WITHDRAWN_TEXT, Message, ToolCall
from tests.fakes.agent import GROUP, GROUP_ENTRY, MakeRuntime, Replies, chat_requests, fill, tool_call, user
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, query, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, at, plain_text, text

UTC = UTC
PHONE = "13812345678"


def estimated(msg: Message) -> Message:
    return replace(msg, tokens=estimate_msg_tokens(msg, keep=False))  # as the agent stores it


def said(name: str, qq: int, body: str, ts: float, platform_id: str | None = None) -> Message:
    msg = Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=ts, platform_id=platform_id)
    return estimated(msg)


def hit(m: Message, before: tuple[Message, ...] = (), after: tuple[Message, ...] = ()) -> SearchHit:
    return SearchHit(message=m, score=1.0, before=before, after=after)


# ---- the pure rewrite ----------------------------------------------------------------
def test_lines_that_show_a_withdrawn_message_read_as_withdrawn() -> None:
    """Its line as a hit (→) and as a neighbour; the other lines, and another message of the same
    speaker in the same minute with other words, stay as they were."""
    a = replace(said("小林", 20041, "谁有阿洁电话", 1_000_000.0), id=1)
    gone = replace(said("阿洁", 20042, f"我的手机号是 {PHONE}", 1_000_005.0), id=2)
    same_minute = replace(said("阿洁", 20042, "快递到了打我电话", 1_000_010.0), id=3)
    b = replace(said("小周", 20043, "收到", 1_000_015.0), id=4)
    result = render(
        [hit(gone, before=(a,), after=(same_minute,)), hit(b)], 1500, estimate_text_tokens, UTC, ["手机号"]
    )
    assert PHONE in result

    masked = mask_withdrawn(result, [gone], UTC)
    assert PHONE not in masked
    assert f"→ 1970-01-12 13:46 [阿洁(20042)] {WITHDRAWN_TEXT}" in masked.splitlines()
    assert masked.replace(f"[阿洁(20042)] {WITHDRAWN_TEXT}", f"[阿洁(20042)] 我的手机号是 {PHONE}") == result
    for kept in ("快递到了打我电话", "谁有阿洁电话", "收到"):
        assert kept in masked

    # As a neighbour of another hit: the same rewrite, with the neighbour's indent.
    around = render([hit(a, after=(gone,))], 1500, estimate_text_tokens, UTC)
    assert f"  1970-01-12 13:46 [阿洁(20042)] {WITHDRAWN_TEXT}" in mask_withdrawn(around, [gone], UTC)
    # Nothing of it in the result: unchanged.
    assert mask_withdrawn(render([hit(b)], 1500, estimate_text_tokens, UTC), [gone], UTC) == render(
        [hit(b)], 1500, estimate_text_tokens, UTC
    )


def test_an_excerpt_of_a_long_withdrawn_message_is_masked_too() -> None:
    """A hit too long for the result comes as the part around the query word (`excerpt`), marked
    cut at either end: that part is masked; a multi-line message's line breaks (⏎) too."""
    long = said(
        "阿洁", 20042, "家里地址如下\n" + "这是一段很长的个人信息" * 40 + f"\n电话 {PHONE}", 2_000_000.0
    )
    cut = excerpt(long, ["电话"], 120, UTC)
    assert PHONE in cut
    assert cut.startswith("→ 1970-01-24 03:33 [阿洁(20042)] …")
    assert mask_withdrawn(cut, [long], UTC) == f"→ 1970-01-24 03:33 [阿洁(20042)] {WITHDRAWN_TEXT}"
    whole = render([hit(long)], 10_000, estimate_text_tokens, UTC)
    assert " ⏎ " in whole
    assert PHONE not in mask_withdrawn(whole, [long], UTC)


def test_the_rewrite_needs_the_zone_the_result_was_written_in() -> None:
    """A line's time is part of what identifies it: the same words at another minute (or read in
    another zone) are another message's."""
    gone = said("阿洁", 20042, "好的", 3_000_000.0)
    other = said("阿洁", 20042, "好的", 3_000_000.0 + 3600)
    result = render([hit(other)], 1500, estimate_text_tokens, UTC)
    assert mask_withdrawn(result, [gone], UTC) == result


# ---- the store: both engines ----------------------------------------------------------
def recall_group(call_id: str, result: str, ts: float) -> tuple[Message, Message]:
    call = Message(
        role="assistant", content="", ts=ts, tool_calls=(ToolCall(call_id, "recall", '{"query": "手机号"}'),)
    )
    return estimated(call), estimated(
        Message(role="tool", content=result, name="recall", tool_call_id=call_id, ts=ts)
    )


async def test_withdrawal_masks_the_active_recall_results_in_the_store(store: Store) -> None:
    """The session's active recall result is rewritten in the same transaction as the mark; the
    cached history is read again (the next request is built from it) and the estimate is of the
    new text; the withdrawn row keeps its text; another session's result is untouched."""
    sid, other = "onebot:10000:group:98100", "onebot:10000:group:98101"
    mask = functools.partial(mask_withdrawn, zone=UTC)
    gone = await store.append(sid, said("阿洁", 20042, f"我的手机号是 {PHONE}", 1_000_010.0, "701"))
    await store.append(sid, said("小林", 20041, "@小记 阿洁电话多少", 1_000_020.0, "702"))
    result = render([hit(gone)], 1500, estimate_text_tokens, UTC, ["手机号"])
    for m in recall_group("call_1", result, 1_000_021.0):
        await store.append(sid, m)
    await store.append(sid, Message(role="assistant", content="找到了，在上面", ts=1_000_022.0))
    for m in recall_group("call_2", result, 1_000_021.0):  # the same text in another group
        await store.append(other, m)
    before = await store.get_history(sid)  # cached now
    assert PHONE in before[3].content
    assert before[3].tokens

    await store.mark_withdrawn(sid, "701", mask)
    history = await store.get_history(sid)
    assert history[0].withdrawn
    assert history[0].content == gone.content  # R-MEM-2: kept
    tool = history[3]
    assert tool.role == "tool"
    assert PHONE not in tool.content
    assert f"[阿洁(20042)] {WITHDRAWN_TEXT}" in tool.content
    assert tool.tokens is None  # the stored estimate was of the old text: the prompt counts anew
    assert PHONE in (await store.get_history(other))[1].content

    # A store opened afresh (a restart) reads the same.
    reopened = Store(store.location)
    await reopened.open()
    try:
        assert PHONE not in (await reopened.get_history(sid))[3].content
    finally:
        await reopened.close()


async def test_an_archived_recall_result_is_left_as_it_was(store: Store) -> None:
    """Archived tool groups are never sent to a model again: the archive keeps what was said and
    done (R-MEM-2), so only the active range is rewritten."""
    sid = "onebot:10000:group:98102"
    mask = functools.partial(mask_withdrawn, zone=UTC)
    gone = await store.append(sid, said("阿洁", 20042, f"我的手机号是 {PHONE}", 1_000_010.0, "711"))
    result = render([hit(gone)], 1500, estimate_text_tokens, UTC)
    for m in recall_group("call_3", result, 1_000_011.0):
        await store.append(sid, m)
    await store.append(sid, Message(role="assistant", content="找到了", ts=1_000_012.0))
    assert await store.archive_span(sid, 4, []) == 4
    await store.mark_withdrawn(sid, "711", mask)
    archived = await store.get_archived(sid)
    assert PHONE in archived[2].content


# ---- the whole path: bot.py, OneBot simulator, scripted model ------------------------------
def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def model(body: dict[str, Any]) -> Reply:
    """With no recall result in its history the chat model looks the number up; after that it
    answers from what it has."""
    if tool_results(body):
        return Reply("我看到的就是上面这些")
    call = {"id": "call_recall_w", "name": "recall", "arguments": json.dumps({"query": "手机号"})}
    return Reply("", tool_calls=[call], finish_reason="tool_calls")


@pytest.fixture(scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[BotProcess, OneBotSim, ScriptedLLM]]:
    with ScriptedLLM() as llm:
        llm.on_request(model)
        models = json.dumps([llm.model_config()])
        async with running_bot(tmp_path_factory.mktemp("wrecall"), {"MEMSUM_MODELS": models}) as (bot, sim):
            yield bot, sim, llm


async def answer_to(sim: OneBotSim, after: int) -> str:
    call = await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=after, timeout=30)
    return plain_text(call.params.get("messages") or call.params.get("message") or [])


async def test_a_number_withdrawn_after_the_model_looked_it_up_is_gone_from_later_requests(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    bot, sim, llm = env
    group = 98200
    sid = group_sid(group)
    sim.add_member(group, 20042, "阿洁")
    mistake = await sim.group_message(
        group, 20042, f"我的手机号是 {PHONE}，快递到了打我电话", nickname="阿洁"
    )

    mark, asked = len(sim.calls), len(llm.requests)
    await sim.group_message(group, 20041, [at(SELF_ID), text(" 阿洁的手机号多少")], nickname="小林")
    assert await answer_to(sim, mark) == "我看到的就是上面这些"
    [result] = tool_results(llm.requests[-1])
    assert PHONE in result  # the model was given it while it was there to see
    assert len(llm.requests) - asked == 2

    # OneBot v11 event/notice.md 群消息撤回 {group_id, user_id, operator_id, message_id};
    # NapCat's OB11GroupRecallNoticeEvent sends the same fields (by oneself: operator = user).
    await sim.notice("group_recall", group_id=group, user_id=20042, operator_id=20042, message_id=mistake)

    async def marked() -> bool:
        rows = await query(bot.db_path, "SELECT withdrawn FROM messages WHERE platform_id = ?", str(mistake))
        return rows == [(1,)]

    await until(marked, "the withdrawal stored")
    [(stored,)] = await query(
        bot.db_path, "SELECT content FROM messages WHERE session_id = ? AND role = 'tool'", sid
    )
    assert PHONE not in stored
    assert f"[阿洁(20042)] {WITHDRAWN_TEXT}" in stored

    mark, asked = len(sim.calls), len(llm.requests)
    await sim.group_message(group, 20043, [at(SELF_ID), text(" 刚才阿洁说了啥")], nickname="小周")
    assert await answer_to(sim, mark) == "我看到的就是上面这些"
    [chat] = llm.requests[asked:]
    assert PHONE not in json.dumps(chat["messages"], ensure_ascii=False)
    [result] = tool_results(chat)
    assert f"[阿洁(20042)] {WITHDRAWN_TEXT}" in result


# ---- a withdrawal while the recall tool runs ---------------------------------------------
async def test_a_withdrawal_that_lands_while_recall_runs_masks_its_result_too(
    make_rt: MakeRuntime, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race audit 16 left: the tool read the number, the member withdrew it before the
    result was stored (so the withdrawal found no result to mask), and the result kept it for
    every later request. The withdrawal is made again once the result is stored."""
    rt = await make_rt()
    await fill(
        rt, GROUP, [replace(user(f"我的手机号是 {PHONE}", 20042, "阿洁"), platform_id="555", ts=clock.now())]
    )
    await fill(rt, GROUP, [user("@小记(10000) 阿洁的手机号多少", 20041, "小林")])
    search = rt.tools.call

    async def withdrawn_meanwhile(ctx: ToolContext, name: str, arguments: str) -> str:
        output = await search(ctx, name, arguments)
        assert PHONE in output  # read before the withdrawal
        await rt.mark_withdrawn(GROUP.id, "555")  # group_recall handled before the result is stored
        return output

    monkeypatch.setattr(rt.tools, "call", withdrawn_meanwhile)
    llm.push(Reply("", tool_calls=[tool_call("r1", "recall", {"query": "手机号"})]), Reply("查不到了。"))
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"

    [(stored,)] = await query(rt.store.location, "SELECT content FROM messages WHERE role = 'tool'")
    assert PHONE not in stored
    assert f"[阿洁(20042)] {WITHDRAWN_TEXT}" in stored
    await fill(rt, GROUP, [user("@小记(10000) 再说一遍", 20041, "小林")])
    llm.push(Reply("没有了。"))
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    later = chat_requests(llm)[-1]
    assert PHONE not in json.dumps(later["messages"], ensure_ascii=False)
