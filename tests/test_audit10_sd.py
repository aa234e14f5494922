"""Audit 10, angle SD: the services DESIGN.md and the specification promise an outside caller,
read literally, as someone who has read only spec/plugin-memory-summary.zh.md,
spec/REQUIREMENTS.md and DESIGN.md would call them through the library face
(`nonebot_plugin_memsum.api`): the compression service's `compress_at(session, platform)`,
compress and clear, the usage, turn and progress events, the session record (parent, room
class, one-to-one peer, birth platform), the owner check (SUPERUSERS) and the todo list the
work template reads (DESIGN: "todoList | a todo provider interface, with a built-in todo
tool"). Each runs on a private runtime over a real SQLite file, with the real HTTP client
against the scripted OpenAI-compatible server (tests/fakes/llm_server.py); the library API is
pointed at that runtime as the plugin's own would be."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.compression.service import DIVIDER
from nonebot_plugin_memsum.runtime import owner_check
from tests.fakes.agent import tool_call
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    CHAT_SUMMARY,
    OWNER,
    WORK_SUMMARY,
    Env,
    Make,
    system_of,
    user_of,
)

WORK_REPLY = Reply(f"【保留原文】无\n{WORK_SUMMARY}")
CHAT_REPLY = Reply(f"【保留原文】无\n{CHAT_SUMMARY}")
CHAT_TITLES = ("「## 最近在聊什么」", "「## 谁有问题没回应」", "「## 关键原话要点」")
WORK_TITLES = ("「## 目标」", "「## 做过的决定」", "「## 改过的文件」", "「## 未完成的事」")


@pytest.fixture
def on_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point the library API at a test's own runtime (it answers for the plugin's runtime)."""

    def use(env: Env) -> Env:
        monkeypatch.setattr(runtime, "_current", env.rt)
        return env

    return use


def template_of(body: dict[str, Any]) -> str:
    """Which template a summary request's system prompt asks for."""
    system = system_of(body)
    chat = all(t in system for t in CHAT_TITLES)
    work = all(t in system for t in WORK_TITLES)
    assert chat != work, system
    return "chat" if chat else "work"


async def summarise(env: Env, record: api.SessionRecord, reply: Reply) -> dict[str, Any]:
    """Record one line into `record`'s session, compress it through the API; its request."""
    await api.record(record, api.Message(role="user", content="[甲(20001)] 明天下午三点开会"))
    env.model.summary.append(reply)
    result = await api.compress(record.id)
    assert result.outcome == "done"
    return env.model.summary_requests()[-1]


# ---- R-TPL-3: 「只认会话记录里的多方标记与一对一的对端，不读平台类型名」 ----------------------------
async def test_r_tpl_3_a_room_on_any_platform_is_a_chat_and_a_group_named_record_without_room_is_work(
    make: Make, on_env: Any
) -> None:
    # Another plugin's sessions: a Discord channel it marks as a room (multi-party) gets the chat
    # template though no OneBot name is in sight; a record whose platform type is called
    # "group" but carries no room class is not a room (the type's name is not read).
    env = on_env(await make())
    channel = api.SessionRecord(id="discord:channel:7", platform="discord", kind="channel", room_class="room")
    named_group = api.SessionRecord(id="myplugin:group:8", platform="myplugin", kind="group")
    assert template_of(await summarise(env, channel, CHAT_REPLY)) == "chat"
    assert template_of(await summarise(env, named_group, WORK_REPLY)) == "work"
    # What was stored is the record as given: its room class and birth platform.
    stored = await env.rt.store.get_session(channel.id)
    assert stored is not None
    assert replace(stored, created=0.0) == channel


async def test_r_tpl_3_an_owner_peer_written_as_onebot_colon_id_gets_the_work_template(
    make: Make, on_env: Any
) -> None:
    # SUPERUSERS=["onebot:10001"] (NoneBot's current form) makes 10001 the owner: the
    # owner's own private chat is a work session; a stranger's is a chat.
    env = on_env(await make())
    env.rt.compression.is_owner = owner_check({f"onebot:{OWNER}"})
    mine = api.SessionRecord(
        id=f"onebot:private:{OWNER}", platform="onebot", kind="private", peer=OWNER, room_class="direct"
    )
    theirs = api.SessionRecord(
        id="onebot:private:20001", platform="onebot", kind="private", peer="20001", room_class="direct"
    )
    assert template_of(await summarise(env, mine, WORK_REPLY)) == "work"
    assert template_of(await summarise(env, theirs, CHAT_REPLY)) == "chat"


async def test_r_tpl_3_without_any_superuser_every_one_to_one_peer_counts_as_not_an_owner(
    make: Make, on_env: Any
) -> None:
    # 「没有权限服务时按不是 owner」: no SUPERUSERS at all, and the peer who would be the owner
    # is just a peer: the chat template.
    env = on_env(await make())
    env.rt.compression.is_owner = owner_check(set())
    dm = api.SessionRecord(
        id=f"onebot:private:{OWNER}", platform="onebot", kind="private", peer=OWNER, room_class="direct"
    )
    assert template_of(await summarise(env, dm, CHAT_REPLY)) == "chat"


# ---- R-PROG-2 through the API -----------------------------------------------------------------
async def test_r_prog_2_a_session_left_with_only_its_divider_compresses_to_nothing_without_events(
    make: Make, on_env: Any
) -> None:
    env = on_env(await make())
    session = await api.internal_session("sd:divider-only")
    await api.record(session, api.Message(role="user", content="写周报"))
    env.model.summary.append(WORK_REPLY)
    assert (await api.compress(session.id)).outcome == "done"
    left = await api.history(session.id)
    assert [(m.role, m.content, m.event_marker) for m in left] == [("system", DIVIDER, True)]
    seen: list[api.CompressionProgress] = []
    api.subscribe(api.CompressionProgress, seen.append)
    again = await api.compress(session.id)
    assert again.outcome == "nothing"
    assert seen == []
    assert len(env.model.summary_requests()) == 1  # no model call for nothing
    assert (await api.status(session.id)).summary == WORK_SUMMARY


# ---- R-TRIG-1: 「agent 每次调用模型之后发 token:usage … 所有用量（含 token:request 的快照）」 ---------
async def test_r_trig_1_each_call_of_a_tool_turn_is_a_snapshot_then_a_usage_with_the_turns_id(
    make: Make, on_env: Any
) -> None:
    env = on_env(await make())
    session = await api.internal_session("sd:usage")
    await api.record(session, api.Message(role="user", content="[甲(20001)] 查一下待办"))
    events: list[object] = []
    for kind in (api.TurnStarted, api.UsageEvent, api.TurnEnded):
        api.subscribe(kind, events.append)
    env.model.chat.append(Reply("", tool_calls=[tool_call("c1", "todo_write", {"items": []})]))
    env.model.chat.append(Reply("没有待办"))
    assert await api.run_turn(session.id, entry=api.Entry("onebot", "group")) == "replied"
    started, *rest, ended = events
    assert isinstance(started, api.TurnStarted)
    assert isinstance(ended, api.TurnEnded)
    assert ended.turn_id == started.turn_id
    assert ended.outcome == "replied"
    usages = [u for u in rest if isinstance(u, api.UsageEvent)]
    assert len(usages) == len(rest) == 4  # two calls: a snapshot, then the usage, each
    assert [u.turn_id for u in usages] == [None, started.turn_id, None, started.turn_id]
    for u in usages:
        assert (u.session_id, u.platform, u.platform_type) == (session.id, "onebot", "group")


# ---- R-RUN-4 / DESIGN "todoList | a todo provider interface": another plugin's todo list -------
class PluginTodos:
    """Another plugin's todo list (its own storage), as the spec's todoList service: the work
    template's 「未完成的事」 follows its items at the moment of the compression."""

    def __init__(self, **items: list[api.TodoItem]) -> None:
        self.items_of: dict[str, list[api.TodoItem]] = dict(items)
        self.written: list[tuple[str, list[api.TodoItem]]] = []

    async def items(self, session_id: str) -> list[api.TodoItem]:
        return list(self.items_of.get(session_id, []))

    async def replace(self, session_id: str, items: list[api.TodoItem]) -> None:
        self.written.append((session_id, list(items)))
        self.items_of[session_id] = list(items)


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


async def test_r_run_4_a_todo_list_another_plugin_provides_is_the_work_templates_task_state(
    make: Make, on_env: Any
) -> None:
    env = on_env(await make())
    session = await api.internal_session("sd:todos")
    todos = PluginTodos(
        **{session.id: [api.TodoItem("写周报", "in_progress"), api.TodoItem("发邮件", "pending")]}
    )
    api.set_todo_provider(todos)
    assert await api.todos(session.id) == [
        api.TodoItem("写周报", "in_progress"),
        api.TodoItem("发邮件", "pending"),
    ]
    request = await summarise(env, session, WORK_REPLY)
    assert user_of(request).endswith("当前任务列表状态\n- [in_progress] 写周报\n- [pending] 发邮件")
    # The list as it is at the next compression, not as it was: 「此刻的待办」.
    todos.items_of[session.id] = [api.TodoItem("写周报", "done")]
    request = await summarise(env, session, WORK_REPLY)
    assert user_of(request).endswith("当前任务列表状态\n- [done] 写周报")
    # A chat session's summary carries no task list, whatever the provider holds.
    room = api.SessionRecord(
        id="sd:room", platform="onebot", kind="group", place="group:9", room_class="room"
    )
    todos.items_of[room.id] = [api.TodoItem("别出现", "pending")]
    assert "当前任务列表状态" not in user_of(await summarise(env, room, CHAT_REPLY))


async def test_r_run_4_the_built_in_todo_tool_writes_to_the_list_another_plugin_provides(
    make: Make, on_env: Any
) -> None:
    env = on_env(await make())
    session = await api.internal_session("sd:todo-tool")
    todos = PluginTodos()
    api.set_todo_provider(todos)
    await api.record(session, api.Message(role="user", content="记一下：周六买票"))
    items = {"items": [{"title": "周六买票", "status": "pending"}]}
    env.model.chat.append(Reply("", tool_calls=[tool_call("c1", "todo_write", items)]))
    env.model.chat.append(Reply("记下了"))
    assert await api.run_turn(session.id) == "replied"
    assert todos.written == [(session.id, [api.TodoItem("周六买票", "pending")])]
    assert await api.todos(session.id) == [api.TodoItem("周六买票", "pending")]
    assert await env.rt.todos.items(session.id) == []  # the built-in list was not written


async def test_r_run_4_without_a_todo_list_the_summary_has_no_task_state_and_no_todo_tool_is_offered(
    make: Make, on_env: Any
) -> None:
    # 「待办插件不在或没有待办时不写」: a plugin that takes the todo list away (None) leaves the
    # work template without one, and the model is no longer offered a tool writing nowhere.
    env = on_env(await make())
    session = await api.internal_session("sd:no-todos")
    await env.rt.todos.replace(session.id, [api.TodoItem("旧的待办", "pending")])
    api.set_todo_provider(None)
    assert await api.todos(session.id) == []
    assert "当前任务列表状态" not in user_of(await summarise(env, session, WORK_REPLY))
    await api.record(session, api.Message(role="user", content="在吗"))
    assert await api.run_turn(session.id) == "replied"
    assert "todo_write" not in tool_names(env.model.chat_requests()[-1])
    assert "recall" in tool_names(env.model.chat_requests()[-1])
    # A list given again brings the tool back.
    api.set_todo_provider(PluginTodos())
    await api.record(session, api.Message(role="user", content="还在吗"))
    assert await api.run_turn(session.id) == "replied"
    assert "todo_write" in tool_names(env.model.chat_requests()[-1])


async def test_r_run_4_a_todo_write_tool_another_plugin_put_in_place_is_left_alone(
    make: Make, on_env: Any
) -> None:
    env = on_env(await make())

    @api.tool("todo_write", "另一个插件自己的待办工具", {"type": "object", "properties": {}}, replace=True)
    def own_todo_write(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        return "另一个插件记下了"

    api.set_todo_provider(PluginTodos())
    api.set_todo_provider(None)
    session = await api.internal_session("sd:own-tool")
    await api.record(session, api.Message(role="user", content="记一下"))
    env.model.chat.append(Reply("", tool_calls=[tool_call("c1", "todo_write", {})]))
    env.model.chat.append(Reply("好"))
    assert await api.run_turn(session.id) == "replied"
    results = [m for m in await api.history(session.id) if m.role == "tool"]
    assert [m.content for m in results] == ["另一个插件记下了"]


# ---- R-CFG-4 / R-CFG-2: compress_at(session, platform) with the tier named as MEMSUM_TIERS names it
async def test_r_cfg_4_compress_at_takes_the_platform_type_tier_written_as_its_tier_name(
    make: Make, on_env: Any
) -> None:
    # The service is `compress_at(session, platform)`; R-CFG-2 calls the type tier `onebot.group`,
    # and so does MEMSUM_TIERS. A platformless session asked about with "onebot.group" is
    # answered from that tier (here 0: None), not from the global value.
    env = on_env(
        await make(memsum_tiers={"onebot": {"compress_at": 0.6}, "onebot.group": {"compress_at": 0}})
    )
    session = await api.internal_session("sd:platformless")
    assert await api.compress_at(session.id, "onebot", "group") is None
    assert await api.compress_at(session.id, "onebot.group") is None
    assert await api.compress_at(session.id, "onebot.private") == 0.6
    assert await api.compress_at(session.id, "onebot") == 0.6
    assert await api.compress_at(session.id) == 0.8
    # The same name as the entry of a turn: its usage event carries the line of that tier.
    seen: list[api.UsageEvent] = []
    api.subscribe(api.UsageEvent, seen.append)
    await api.record(session, api.Message(role="user", content="在吗"))
    assert await api.run_turn(session.id, entry=api.Entry("onebot.group")) == "replied"
    assert {(u.platform, u.platform_type, u.line) for u in seen} == {("onebot", "group", None)}
    assert env.rt is runtime.get()


# ---- R-MEM-3 / R-PROG-3 through the API: 「清理发生在压缩途中（模型尚未返回）时，这次压缩作废」
async def test_r_mem_3_api_clear_while_api_compress_waits_on_the_model_cancels_it_with_the_reason(
    make: Make, on_env: Any
) -> None:
    env = on_env(await make())
    session = await api.internal_session("sd:clear-mid-run")
    for i in range(3):
        await api.record(session, api.Message(role="user", content=f"第{i}件事"))
    seen: list[api.CompressionProgress] = []
    api.subscribe(api.CompressionProgress, seen.append)
    gate = env.model.hold_summary(WORK_REPLY)
    run = asyncio.create_task(api.compress(session.id))
    await gate.reached()
    with pytest.raises(api.CompressionError) as busy:  # R-PROG-3: one run per session
        await api.compress(session.id)
    assert busy.value.reason == "这个会话正在压缩"
    assert (await api.status(session.id)).running
    await api.clear(session.id, "summary")
    gate.open()
    with pytest.raises(api.CompressionError) as cancelled:
        await run
    assert cancelled.value.reason == "压缩期间会话被清空"
    assert [(p.phase, p.reason) for p in seen] == [("start", None), ("error", "压缩期间会话被清空")]
    status = await api.status(session.id)
    assert (status.summary, status.running, status.backoff_failures) == (None, False, 0)
    # Only the summary was cleared: the history stays whole, without a divider.
    assert [m.content for m in await api.history(session.id)] == ["第0件事", "第1件事", "第2件事"]
