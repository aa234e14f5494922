"""The library face for other plugins, on the plugin's own running runtime."""

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.config import ModelConfig
from tests.fakes.llm_server import Reply, ScriptedLLM


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    rt = runtime.get()
    with ScriptedLLM() as server:
        rt.registry.set_models([ModelConfig(**server.model_config("api/model", context_window=16000))])
        try:
            yield server
        finally:
            rt.registry.set_models([])


async def test_record_turn_prompt_history_and_events(llm: ScriptedLLM) -> None:
    session = await api.internal_session("api:internal:1")
    assert session.platform is None
    await api.record(session, api.Message(role="user", content="[甲(1)] 今天几号？"))
    seen: list[api.UsageEvent] = []
    unsubscribe = api.subscribe(api.UsageEvent, seen.append)

    async def extra(session_id: str) -> str | None:
        return f"额外上下文 {session_id}" if session_id == session.id else None

    api.contribute("plugin-x", extra)
    llm.push(Reply("十二月二日"))
    replies: list[str] = []

    async def reply(text: str) -> None:
        replies.append(text)

    assert await api.run_turn(session.id, reply) == "replied"
    unsubscribe()
    assert replies == ["十二月二日"]
    assert [e.turn_id is None for e in seen] == [True, False]
    body = llm.requests[-1]["messages"]
    assert body[1]["content"] == "额外上下文 api:internal:1"
    assert body[-1] == {"role": "user", "content": "[甲(1)] 今天几号？"}
    contents = [m.content for m in await api.history(session.id)]
    assert contents == ["[甲(1)] 今天几号？", "十二月二日"]
    prompt = await api.build_prompt(session.id)
    assert prompt.messages[-2] == {"role": "assistant", "content": "十二月二日"}


async def test_r_cfg_3_child_session_copies_parent_values_once() -> None:
    rt = runtime.get()
    parent = await api.internal_session("api:parent")
    await rt.settings.set("compress_at", "session", parent.id, 0.4)
    child = await api.child_session(parent.id, "api:child")
    assert child.parent == parent.id
    assert (await rt.settings.effective("compress_at", child.id)).value == 0.4
    await rt.settings.set("compress_at", "session", parent.id, 0.9)
    assert (await rt.settings.effective("compress_at", child.id)).value == 0.4


async def test_r_cfg_3_a_later_child_session_call_copies_nothing() -> None:
    # R-CFG-3: the copy happens when the child is created, never on a later call.
    rt = runtime.get()
    parent = await api.internal_session("api:parent-2")
    await rt.settings.set("compress_at", "session", parent.id, 0.4)
    child = await api.child_session(parent.id, "api:child-2")
    await rt.settings.set("compress_at", "session", child.id, 0.7)  # the child's own value
    await rt.settings.set("compress_at", "session", parent.id, 0.9)
    again = await api.child_session(parent.id, child.id)
    assert again == child
    assert (await rt.settings.effective("compress_at", child.id)).value == 0.7
    # the value in the SQLite file, not only in a cache
    rows = await asyncio.to_thread(_settings_rows, rt.store.path, child.id)
    assert rows["compress_at"] == "0.7"


async def test_r_cfg_3_concurrent_calls_create_and_copy_once() -> None:
    rt = runtime.get()
    parent = await api.internal_session("api:parent-3")
    await rt.settings.set("compress_at", "session", parent.id, 0.3)
    children = await asyncio.gather(*(api.child_session(parent.id, "api:child-3") for _ in range(5)))
    assert len({c.created for c in children}) == 1
    assert (await rt.settings.effective("compress_at", "api:child-3")).value == 0.3


def _settings_rows(path: Path, session_id: str) -> dict[str, str]:
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT name, value FROM settings WHERE scope = 'session' AND scope_key = ?", (session_id,)
        ).fetchall()
    db.close()
    return dict(rows)


async def test_clear_and_status_through_the_api() -> None:
    session = await api.internal_session("api:clear")
    await api.record(session, api.Message(role="user", content="hi"))
    await api.clear(session.id, "context")
    assert await api.history(session.id) == []
    status = await api.status(session.id)
    assert status.summary is None
    assert status.active_messages == 0


async def test_r_mem_2_delete_session_through_the_api() -> None:
    rt = runtime.get()
    session = await api.internal_session("api:delete")
    await api.record(session, api.Message(role="user", content="hi"))
    await rt.settings.set("compress_at", "session", session.id, 0.5)
    await api.clear(session.id, "context")  # archived rows: deleted with the session too
    await api.record(session, api.Message(role="user", content="again"))
    await api.delete_session(session.id)
    assert await api.history(session.id) == []
    assert await rt.store.get_archived(session.id) == []
    assert await rt.store.get_session(session.id) is None
    assert await rt.store.get_settings("session", session.id) == {}
    assert (await rt.settings.effective("compress_at", session.id)).layer != "session"


async def test_search_sees_only_its_own_session_and_never_what_was_cleared() -> None:
    # Issue 11: api.search for other plugins; a child session searches itself alone, not its
    # parent (README, 回忆), and a cleared context is never found again.
    parent = await api.internal_session("api:search-parent")
    child = await api.child_session(parent.id, "api:search-child")
    said = await api.record(
        parent, api.Message(role="user", content="[甲(1)] 网盘链接的提取码 p4r3", name="1")
    )
    await api.record(parent, api.Message(role="assistant", content="收到"))
    mine = await api.record(child, api.Message(role="user", content="[乙(2)] 子会话的提取码 c5h6", name="2"))
    [hit] = await api.search(parent.id, "提取码", context=1)
    assert hit.message == said
    assert [m.content for m in hit.after] == ["收到"]
    assert [h.message for h in await api.search(child.id, "提取码", speaker="乙")] == [mine]
    assert await api.search(child.id, "p4r3") == []
    assert await api.search(parent.id, "c5h6") == []
    await api.clear(parent.id, "context")
    assert await api.search(parent.id, "提取码") == []
    assert [h.message for h in await api.search(child.id, "提取码")] == [mine]
