"""Seventh outside audit (u): a withdrawn (撤回) message no longer reaches the model.

Last round a `group_recall` / `friend_recall` notice marked the stored message and recall
stopped repeating it (tests/test_audit6_t.py), but its text still went to the model: in the
active history of every chat request, in the summariser's request at the next compression
(so into the summary), and in the quote of a later reply to it. A QQ group owner expects
what QQ's own clients show: the text is gone, the record that something was withdrawn stays.

- The chat request: the message as its `[昵称(ID)]` label and 「（这条消息已撤回）」; the token
  estimate of what is sent, not of the text; the history cache and the per-message wire memo
  (agent/wire.py) learn of the withdrawal.
- The summariser's request (R-RUN-3): the same placeholder; a withdrawal while the summary
  is being written fails that run once (R-RUN-11), and the next run renders it withdrawn.
- A later reply quoting it: the placeholder in its `[回复 …]` quote, whether the OneBot
  implementation still returns the message from `get_msg` or has forgotten it.
- The stored row keeps its text (R-MEM-2) and the owner's page still shows it, marked.

bot.py runs as a real process with the OneBot simulator over the real reverse WebSocket and
the scripted model on real HTTP; the store scenarios run on a real SQLite file and on
PostgreSQL (the `location` fixture); compression runs the real service against the scripted
model over HTTP (tests/fakes/service.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from nonebot_plugin_memsum.agent.prompt import assemble
from nonebot_plugin_memsum.agent.wire import wire_forms
from nonebot_plugin_memsum.compression.service import CHANGED, CompressionError
from nonebot_plugin_memsum.llm.tokens import MESSAGE_OVERHEAD, estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.types import Message
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, private_sid, query, running_bot, wait_rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import (
    FORWARD_ACTIONS,
    SEND_ACTIONS,
    OneBotSim,
    as_segments,
    at,
    plain_text,
    reply,
    text,
)
from tests.fakes.service import GROUP, Make, conversation_of, held_compression, summary_of

SUPERUSER = 10001
WITHDRAWN_TEXT = "（这条消息已撤回）"
"""What the model reads instead of a withdrawn message's text (types.WITHDRAWN_TEXT)."""
PERSONA = "你是撤回审计群里的助手小记。"
WEB_TOKEN = "web-token-audit7-u-0123456789"
PHONE = "13812345678"
MISTAKE = f"我的手机号是 {PHONE}，快递到了打我电话"
PLACEHOLDER = f"[阿洁(20042)] {WITHDRAWN_TEXT}"


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0].get("content") == PERSONA


def sent_text(body: dict[str, Any]) -> str:
    return json.dumps(body["messages"], ensure_ascii=False)


@pytest.fixture(scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[BotProcess, OneBotSim, ScriptedLLM]]:
    with ScriptedLLM() as llm:
        settings = {
            "MEMSUM_MODELS": json.dumps([llm.model_config()]),
            "MEMSUM_PERSONA": PERSONA,
            "MEMSUM_WEB_TOKEN": WEB_TOKEN,
        }
        async with running_bot(tmp_path_factory.mktemp("audit7u"), settings) as (bot, sim):
            yield bot, sim, llm


async def next_send(sim: OneBotSim, after: int) -> str:
    call = await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=after, timeout=30)
    return plain_text(as_segments(call.params.get("messages") or call.params.get("message") or []))


async def test_a_withdrawn_message_reaches_neither_the_chat_nor_a_quote_nor_the_summary(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    """A member pastes their phone number by mistake and withdraws it. Before: every later
    chat request still carried the number, a member's reply quoting it showed it again in
    its quote, and /压缩 handed it to the summariser. Now all three read the placeholder;
    the stored row keeps the text and the owner's page shows it marked 已撤回."""
    bot, sim, llm = env
    llm.reset()
    group = 97001
    sid = group_sid(group)
    sim.add_member(group, 20042, "阿洁")
    await sim.group_message(group, 20041, "谁的快递放门口了", nickname="小林")
    mistake = await sim.group_message(group, 20042, MISTAKE)
    await wait_rows(bot, sid, 2)
    # OneBot v11 event/notice.md 群消息撤回 {group_id, user_id, operator_id, message_id};
    # NapCat OB11GroupRecallNoticeEvent.ts sends the same fields (by oneself: operator = user).
    await sim.notice("group_recall", group_id=group, user_id=20042, operator_id=20042, message_id=mistake)
    await wait_rows(bot, sid, 3)

    # A reply quoting it while the implementation still returns it from get_msg (go-cqhttp's
    # database and Lagrange's cache keep a recalled message), and one after NapCat's cache
    # let it go (NapNeko/NapCatQQ issue #1777: get_msg fails, the quote is read from our store).
    await sim.group_message(group, 20043, [reply(mistake), text("刚才那条是啥")], nickname="小周")
    sim.forget(mistake)
    await sim.group_message(group, 20044, [reply(mistake), text("我也没看清")], nickname="小吴")
    stored = await wait_rows(bot, sid, 5)
    assert stored[3][1] == f"[小周(20043)] [回复 阿洁(20042)：{WITHDRAWN_TEXT}] 刚才那条是啥"
    assert stored[4][1] == f"[小吴(20044)] [回复 阿洁(20042)：{WITHDRAWN_TEXT}] 我也没看清"

    # The chat request: the label stays (someone said something), the text does not.
    llm.push(Reply("好的，不外传"))
    mark = len(sim.calls)
    await sim.group_message(group, 20041, [at(SELF_ID), text(" 刚才发生了什么")], nickname="小林")
    assert await next_send(sim, mark) == "好的，不外传"
    [chat] = [b for b in llm.requests if is_chat(b)]
    assert PHONE not in sent_text(chat)
    assert {"role": "user", "content": PLACEHOLDER} in chat["messages"]

    # The summariser's request (/压缩, the owner's command): the placeholder, never the number.
    llm.push(
        Reply(
            "【保留原文】无\n## 最近在聊什么\n有人撤回了一条消息\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
        )
    )
    mark = len(sim.calls)
    await sim.group_message(group, SUPERUSER, "/压缩")
    assert (await next_send(sim, mark)).startswith("压缩完成")
    [summarising] = [b for b in llm.requests if not is_chat(b)]
    assert PHONE not in sent_text(summarising)
    assert PLACEHOLDER in summarising["messages"][-1]["content"]

    # Nothing is deleted (R-MEM-2): the row keeps its text, marked; the owner's page shows it.
    rows = await query(
        bot.db_path, "SELECT content, withdrawn FROM messages WHERE platform_id = ?", str(mistake)
    )
    assert rows == [(f"[阿洁(20042)] {MISTAKE}", 1)]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{bot.port}/memsum", timeout=10) as owner:
        assert (await owner.post("/api/login", json={"token": WEB_TOKEN})).status_code == 200
        [hit] = (await owner.get(f"/api/sessions/{sid}/search", params={"q": PHONE})).json()["results"]
    assert hit["hit"]["content"].endswith(MISTAKE)
    assert hit["hit"]["withdrawn"] is True


async def test_a_message_withdrawn_in_a_private_chat_is_sent_as_the_placeholder_next_turn(
    env: tuple[BotProcess, OneBotSim, ScriptedLLM],
) -> None:
    """In a private chat the owner sends a password by mistake, the bot answers, the owner
    withdraws it: the next turn's request holds the label and the placeholder, and the
    notice that something was withdrawn."""
    bot, sim, llm = env
    llm.reset()
    llm.push(Reply("记下了"), Reply("好的"))
    user = 10077
    sid = private_sid(user)
    mark = len(sim.calls)
    oops = await sim.private_message(user, "服务器 root 密码是 Qw3rty!2026", nickname="老王")
    assert await next_send(sim, mark) == "记下了"
    # OneBot v11 event/notice.md 好友消息撤回: {notice_type: friend_recall, user_id, message_id}.
    await sim.notice("friend_recall", user_id=user, message_id=oops)
    await wait_rows(bot, sid, 3)
    mark = len(sim.calls)
    await sim.private_message(user, "刚才那条别记", nickname="老王")
    assert await next_send(sim, mark) == "好的"
    last = [b for b in llm.requests if is_chat(b)][-1]
    assert "Qw3rty" not in sent_text(last)
    users = [m["content"] for m in last["messages"] if m["role"] == "user"]
    assert users[0] == f"[老王({user})] {WITHDRAWN_TEXT}"
    assert any("老王" in u and "撤回了一条消息" in u for u in users[1:])


# ---- the store, the cache, the wire memo, the estimates: both engines -------------------
def said(name: str, qq: int, body: str, ts: float, platform_id: str) -> Message:
    msg = Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=ts, platform_id=platform_id)
    return replace(msg, tokens=estimate_msg_tokens(msg, keep=False))  # as the agent stores it


def prompt_of(history: list[Message]) -> tuple[list[dict[str, Any]], int]:
    p = assemble(
        ["人设"],
        history,
        history_limit=0,
        trim_budget=100_000,
        estimate_msg=estimate_msg_tokens,
        estimate_text=estimate_text_tokens,
        wire=wire_forms,
    )
    return p.messages, p.untrimmed_history


async def test_the_cached_history_and_its_wire_memo_learn_of_a_withdrawal(store: Store) -> None:
    """The history is cached and each message's wire form made once (a busy group's turns
    read both); a withdrawal then must reach the next request: the cache is read again, the
    new object has no memo, and the estimate is of what is sent (the label and placeholder)."""
    sid = "onebot:10000:group:97100"
    long_text = "我的身份证号和家庭住址如下，" + "这是一段很长的个人信息" * 30
    await store.append(sid, said("小林", 20041, "早上好", 1000.0, "601"))
    gone = await store.append(sid, said("阿洁", 20042, long_text, 1001.0, "602"))
    await store.append(sid, said("小周", 20043, "早", 1002.0, "603"))
    before, cost_before = prompt_of(await store.get_history(sid))  # fills the cache and the memos
    assert any(long_text in str(m["content"]) for m in before)

    await store.mark_withdrawn(sid, "602")
    history = await store.get_history(sid)
    assert [m.withdrawn for m in history] == [False, True, False]
    assert history[1] == gone  # the same message (R-MEM-2): its text kept, only marked
    assert history[1].content == gone.content
    after, cost_after = prompt_of(history)
    assert after[2] == {"role": "user", "content": f"[阿洁(20042)] {WITHDRAWN_TEXT}"}
    assert all(long_text not in str(m["content"]) for m in after)
    placeholder_cost = MESSAGE_OVERHEAD + estimate_text_tokens(f"[阿洁(20042)] {WITHDRAWN_TEXT}")
    assert cost_before - cost_after == (gone.tokens or 0) - placeholder_cost
    assert cost_after < cost_before / 3


async def test_a_bot_answer_an_admin_withdrew_is_sent_as_the_placeholder(store: Store) -> None:
    """An admin withdraws the bot's own answer (its platform id noted when it went out,
    `name_answer`): the model no longer reads what it had said there either."""
    sid = "onebot:10000:group:97101"
    await store.append(sid, said("小林", 20041, "群主电话多少", 1000.0, "611"))
    await store.append(sid, Message(role="assistant", content="群主电话是 13700001111", ts=1001.0))
    await store.name_answer(sid, "群主电话是 13700001111", "612")
    await store.mark_withdrawn(sid, "612")
    sent, _ = prompt_of(await store.get_history(sid))
    assert sent[-2] == {"role": "assistant", "content": WITHDRAWN_TEXT}
    assert "13700001111" not in json.dumps(sent, ensure_ascii=False)


# ---- the compression: R-RUN-3 rendering, R-RUN-11 re-read ------------------------------
async def test_r_run_11_a_withdrawal_during_the_summary_call_fails_once_and_the_next_run_leaves_it_out(
    location: Path | str,
    make: Make,  # the database outlives the runtime
) -> None:
    """The summariser already read the text when the member withdrew it: committing that
    summary would keep the text for ever, so the run fails (R-RUN-11: the span changed), and
    the next run, reading the history again, sends the placeholder and succeeds (a withdrawal
    must neither fail every run nor be lost to the cache)."""
    env = await make(location=location)
    rt = env.rt
    await rt.agent.record(GROUP, said("小林", 20041, "周末去哪玩", 1000.0, "701"))
    await rt.agent.record(GROUP, said("阿洁", 20042, MISTAKE, 1001.0, "702"))
    await rt.agent.record(GROUP, said("小周", 20043, "去爬山吧", 1002.0, "703"))

    run, gate = await held_compression(env)
    assert PHONE in conversation_of(env.model.summary_requests()[0])  # read before the withdrawal
    await rt.store.mark_withdrawn(GROUP.id, "702")
    gate.open()
    with pytest.raises(CompressionError) as failed:
        await run
    assert failed.value.reason == CHANGED
    assert await summary_of(rt) is None

    done = await rt.compression.compress(GROUP.id)
    assert done.outcome == "done"
    again = conversation_of(env.model.summary_requests()[1])
    assert PHONE not in again
    assert f"[阿洁(20042)] {WITHDRAWN_TEXT}" in again
    rows = await rt.store.get_archived(GROUP.id)
    assert [(m.content.endswith(MISTAKE), m.withdrawn) for m in rows] == [
        (False, False),
        (True, True),
        (False, False),
    ]


async def test_r_run_3_a_message_withdrawn_before_the_run_is_rendered_as_the_placeholder(
    make: Make,
) -> None:
    env = await make()
    rt = env.rt
    await rt.agent.record(GROUP, said("阿洁", 20042, MISTAKE, 1000.0, "801"))
    await rt.agent.record(GROUP, said("小周", 20043, "收到", 1001.0, "802"))
    await rt.store.mark_withdrawn(GROUP.id, "801")
    await asyncio.wait_for(rt.compression.compress(GROUP.id), 20)
    [request] = env.model.summary_requests()
    assert PHONE not in json.dumps(request, ensure_ascii=False)
    assert f"[阿洁(20042)] {WITHDRAWN_TEXT}" in conversation_of(request)
