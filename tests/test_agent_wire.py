"""Stored messages encoded once for the wire (agent/wire.py, issue 9 item 6): what is sent is
what the history holds after every write, compression, clear and restart, and the form
lives on the message object (its memory is the history cache's, tests/test_store_cache.py).
Real SQLite file, real turns, a real server on 127.0.0.1 that parses every request it gets."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.prompt import to_openai
from nonebot_plugin_memsum.agent.wire import wire_forms
from nonebot_plugin_memsum.compression.service import INJECTION_HEAD
from nonebot_plugin_memsum.llm.client import WireMessage, encode_body
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message
from tests.fakes.agent import GROUP, GROUP_ENTRY, SUMMARY, MakeRuntime, Replies, chat_requests, user
from tests.fakes.llm_server import Reply, ScriptedLLM


def stored(i: int, text: str | None = None) -> Message:
    return Message(role="user", content=text or f"[甲(20001)] 第 {i} 句", id=i, ts=float(i))


async def turn(rt: Runtime, llm: ScriptedLLM, answer: str) -> list[dict[str, Any]]:
    """One turn; asserts its request sent exactly the active history as the store holds it
    (and the summary, if any, as the last system part: R-INJ-1); returns that history part."""
    history = [to_openai(m) for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    summary = await rt.compression.injection(GROUP.id)
    asked = len(chat_requests(llm))
    llm.push(Reply(answer))
    assert await rt.agent.run_turn(GROUP.id, Replies(), GROUP_ENTRY) == "replied"
    [request] = chat_requests(llm)[asked:]
    systems = [m["content"] for m in request["messages"] if m["role"] == "system"]
    sent = [m for m in request["messages"] if m["role"] != "system"]
    assert sent == history
    assert (systems[-1] if summary else None) == summary
    return sent


# ---- the memo -------------------------------------------------------------------------------
def test_a_message_is_encoded_once_and_a_message_read_anew_is_encoded_anew() -> None:
    first = stored(1)
    [a] = wire_forms([first])
    [b] = wire_forms([first])
    assert a is b  # the same object: no second conversion, no second encoding
    assert first.wire is a  # kept on the message: it lives and dies with it
    # The same id with other content, as SQLite may number a message again after the newest
    # rows were cleared: a new object, so its own wire form.
    [c] = wire_forms([stored(1, "[乙(20002)] 别的话")])
    assert c["content"] == "[乙(20002)] 别的话"
    assert json.loads(c.encoded) == c


def test_a_copy_without_a_stored_id_is_converted_but_carries_nothing() -> None:
    copy = Message(role="assistant", content="只有正文的副本")
    assert wire_forms([copy]) == [{"role": "assistant", "content": "只有正文的副本"}]
    assert copy.wire is None


def test_the_memo_is_no_part_of_the_message_value() -> None:
    m = stored(1)
    [w] = wire_forms([m])
    assert m == stored(1)
    assert hash(m) == hash(stored(1))
    assert "wire" not in repr(m)
    changed = replace(m, content="[甲(20001)] 改过")  # another message: no stale form
    assert changed.wire is None
    assert wire_forms([changed])[0]["content"] == "[甲(20001)] 改过" != w["content"]


def test_a_wire_message_cannot_be_changed_and_its_body_is_the_plain_encoding() -> None:
    [m] = wire_forms([stored(1)])
    with pytest.raises(TypeError):
        m["content"] = "改了"
    with pytest.raises(TypeError):
        m.update(content="改了")
    assert dict(m) == {"role": "user", "content": "[甲(20001)] 第 1 句"}
    messages = [
        {"role": "system", "content": "人设"},
        m,
        WireMessage({"role": "assistant", "content": '好\n"的"'}),
    ]
    body = {"model": "x", "messages": messages, "stream": True, "max_tokens": 5}
    assert json.loads(encode_body(body)) == json.loads(json.dumps(body))
    assert json.loads(encode_body({"messages": [m]})) == {"messages": [dict(m)]}


# ---- what is sent (R-INJ-1: the summary, then exactly the active history) -----------------------
async def test_each_request_is_the_history_after_a_write_a_compression_a_clear_and_a_restart(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    for i in range(4):
        await rt.agent.record(GROUP, user(f"第 {i} 句"))
    sent = await turn(rt, llm, "好的")
    assert sent[-1]["content"] == "[甲(20001)] 第 3 句"

    await rt.agent.record(GROUP, user("写入之后"))  # write: the next request has it
    sent = await turn(rt, llm, "收到")
    assert sent[-2:] == [
        {"role": "assistant", "content": "好的"},
        {"role": "user", "content": "[甲(20001)] 写入之后"},
    ]

    assert (await rt.compression.compress(GROUP.id)).outcome == "done"  # compress
    await rt.agent.record(GROUP, user("压缩之后"))
    injection = await rt.compression.injection(GROUP.id)
    assert injection is not None
    assert injection.startswith(f"{INJECTION_HEAD}\n\n{SUMMARY.split('【保留原文】')[0].strip()}")
    sent = await turn(rt, llm, "明白")
    assert "[甲(20001)] 第 0 句" not in [m["content"] for m in sent]

    await rt.compression.clear(GROUP.id, "context")  # clear: nothing of it is sent again
    await rt.agent.record(GROUP, user("清除之后"))
    sent = await turn(rt, llm, "嗯")
    assert sent == [{"role": "user", "content": "[甲(20001)] 清除之后"}]

    await rt.agent.record(GROUP, user("重启之前"))
    before = await turn(rt, llm, "在")
    path = rt.store.path
    await runtime.close(rt)  # restart: the same file, a new process's memory
    again = await runtime.build(rt.config, path, ["小记"], {"10001"})
    try:
        await again.agent.record(GROUP, user("重启之后"))
        after = await turn(again, llm, "还在")
    finally:
        await runtime.close(again)
    answer, asked = (
        {"role": "assistant", "content": "在"},
        {"role": "user", "content": "[甲(20001)] 重启之后"},
    )
    assert after == [*before, answer, asked]
