"""The compression run and service in-process (issue 4): a private runtime on a real SQLite
file, real turns through the agent, and a real OpenAI-compatible server on 127.0.0.1.

Summary requests are told from chat requests by the summariser's system prompt. A `Gate`
holds a scripted reply until the test lets it go, so "while the model has not answered"
is a state the test controls rather than a race it hopes to win.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import sqlite3
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import pytest
from nonebot.log import logger

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import (
    CompressionProgress,
    Outcome,
    TurnEnded,
    TurnStarted,
    UsageEvent,
)
from nonebot_plugin_memsum.agent.tools import TodoItem, ToolContext
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.compression.request import (
    EMPTY_SUMMARY,
    MARGIN,
    REFUSED_WINDOW,
    CompressionError,
)
from nonebot_plugin_memsum.compression.service import (
    BUSY,
    CHANGED,
    CLEARED,
    DIVIDER,
    IN_TURN,
    INJECTION_HEAD,
    STOPPED,
    STORE_FAILED,
    CompressionResult,
)
from nonebot_plugin_memsum.compression.units import build_units
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, StoreError
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall
from tests.fakes.llm_server import API_KEY, Gate, Reply, ScriptedLLM

OWNER = "10001"
CHAT_MODEL = "test/chat"
SUMMARY_MODEL = "test/sum"
SUMMARISER = "你是对话摘要员"
CHAT_SUMMARY = "## 最近在聊什么\n甲(1) 约大家周末爬山\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
NOTHING_KEPT = f"【保留原文】无\n{CHAT_SUMMARY}"
WORK_SUMMARY = "## 目标\n写周报\n## 做过的决定\n无\n## 改过的文件\n无\n## 未完成的事\n无"
OLD_SUMMARY = {
    "text": "## 最近在聊什么\n上周的旧话题\n## 谁有问题没回应\n无\n## 关键原话要点\n无",
    "template": "chat",
    "time": 1.0,
    "kept_messages": 0,
}
GROUP = SessionRecord(
    id="onebot:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
)
IN_GROUP = Entry("onebot", "group")
_CJK = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面"
    "而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性"
)


# ---- the scripted model ---------------------------------------------------------------
def usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5}


def is_summary(body: dict[str, Any]) -> bool:
    return str(body["messages"][0]["content"]).startswith(SUMMARISER)


def system_of(body: dict[str, Any]) -> str:
    return body["messages"][0]["content"]


def user_of(body: dict[str, Any]) -> str:
    return body["messages"][1]["content"]


def conversation_of(body: dict[str, Any]) -> str:
    return user_of(body).split("〔对话记录开始〕\n", 1)[1].split("\n〔对话记录结束〕", 1)[0]


def existing_summary_of(body: dict[str, Any]) -> str:
    text = user_of(body)
    if "〔已有摘要开始〕\n" not in text:
        return ""
    return text.split("〔已有摘要开始〕\n", 1)[1].split("\n〔已有摘要结束〕", 1)[0]


def offered(body: dict[str, Any]) -> dict[int, str]:
    """The numbered units of a summary request: number → rendered text without the annotation."""
    out: dict[int, str] = {}
    for part in conversation_of(body).split("\n\n"):
        m = re.match(r"#(\d+)〔约 \d+ token〕", part)
        if m:
            out[int(m.group(1))] = part[m.end() :]
    return out


Script = Reply | Gate | Callable[[dict[str, Any]], Reply]


class Model:
    """What the server answers, by kind of request; each kind has its queue and default."""

    def __init__(self, llm: ScriptedLLM) -> None:
        self.llm = llm
        self.summary: deque[Script] = deque()
        self.chat: deque[Script] = deque()
        self.summary_default: Script = Reply(NOTHING_KEPT)
        self.chat_default: Script = Reply("好的", usage=usage(100))
        self.gates: list[Gate] = []
        llm.on_request(self._answer)

    def gate(self, reply: Reply | Callable[[dict[str, Any]], Reply]) -> Gate:
        g = Gate(reply)
        self.gates.append(g)
        return g

    def hold_summary(self, reply: Reply | Callable[[dict[str, Any]], Reply] | None = None) -> Gate:
        """The next summary request waits at a gate, then gets `reply` (by default: a summary
        keeping nothing)."""
        g = self.gate(reply or Reply(NOTHING_KEPT))
        self.summary.append(g)
        return g

    def _answer(self, body: dict[str, Any]) -> Reply | None:
        summary = is_summary(body)
        queue = self.summary if summary else self.chat
        try:
            script = queue.popleft()
        except IndexError:
            script = self.summary_default if summary else self.chat_default
        if isinstance(script, Reply):
            return script
        return script(body)

    def summary_requests(self) -> list[dict[str, Any]]:
        return [b for b in self.llm.requests if is_summary(b)]

    def chat_requests(self) -> list[dict[str, Any]]:
        return [b for b in self.llm.requests if not is_summary(b)]


def keeping(*needles: str, summary: str = CHAT_SUMMARY) -> Callable[[dict[str, Any]], Reply]:
    """A summary reply that keeps the offered units whose text contains one of `needles`."""

    def answer(body: dict[str, Any]) -> Reply:
        numbers = [str(n) for n, text in offered(body).items() if any(x in text for x in needles)]
        return Reply(f"【保留原文】{'、'.join(numbers) or '无'}\n{summary}")

    return answer


# ---- the runtime ------------------------------------------------------------------------
@dataclass
class Env:
    rt: Runtime
    model: Model
    progress: list[CompressionProgress]
    warnings: list[str]

    def phases(self, session_id: str = GROUP.id) -> list[tuple[str, str | None]]:
        return [(p.phase, p.reason) for p in self.progress if p.session_id == session_id]

    def failure_warnings(self, session_id: str = GROUP.id) -> list[str]:
        return [w for w in self.warnings if f"compression of {session_id} failed" in w]


class Make(Protocol):
    def __call__(
        self,
        *,
        chat: dict[str, Any] | None = None,
        summary: dict[str, Any] | None = None,
        models: Callable[[ScriptedLLM], list[dict[str, Any]]] | None = None,
        **config: Any,
    ) -> Awaitable[Env]: ...


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    """Build private runtimes: a chat model and a summary model (the summary preference) on one server."""
    built: list[tuple[Env, ScriptedLLM, int]] = []

    async def build(
        *,
        chat: dict[str, Any] | None = None,
        summary: dict[str, Any] | None = None,
        models: Callable[[ScriptedLLM], list[dict[str, Any]]] | None = None,
        **config: Any,
    ) -> Env:
        llm = ScriptedLLM().start()
        model = Model(llm)
        if models is None:
            entries = [
                llm.model_config(CHAT_MODEL, priority=1, **(chat or {})),
                llm.model_config(SUMMARY_MODEL, **(summary or {})),
            ]
        else:
            entries = models(llm)
        cfg = Config.model_validate(
            {
                "memsum_models": entries,
                "memsum_chat_model": CHAT_MODEL,
                "memsum_summary_model": SUMMARY_MODEL,
                **config,
            }
        )
        rt = await runtime.build(cfg, tmp_path / f"memsum-{len(built)}.db", [], {OWNER})
        progress: list[CompressionProgress] = []
        rt.bus.subscribe(CompressionProgress, progress.append)
        warnings: list[str] = []
        sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
        env = Env(rt, model, progress, warnings)
        built.append((env, llm, sink))
        return env

    yield build
    for env, llm, sink in built:
        for g in env.model.gates:
            g.open()
        await runtime.close(env.rt)
        logger.remove(sink)
        llm.stop()


@pytest.fixture
async def env(make: Make) -> Env:
    return await make()


# ---- history helpers ----------------------------------------------------------------------
def talk(i: int, size: int = 12) -> str:
    """A unique group line of about `size` characters after its label."""
    rng = random.Random(i)
    return f"[用户{i}(2{i:04d})] 第{i}句：" + "".join(rng.choice(_CJK) for _ in range(size))


async def seed(
    rt: Runtime, n: int, *, record: SessionRecord = GROUP, start: int = 0, size: int = 12
) -> list[Message]:
    return [
        await rt.agent.record(record, Message(role="user", content=talk(i, size), ts=1000.0 + i))
        for i in range(start, start + n)
    ]


async def settle(rt: Runtime) -> None:
    """Wait for the background compressions that turn ends started."""
    while tasks := set(rt.compression._background):
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def committing(rt: Runtime, session_id: str = GROUP.id) -> None:
    """The run has its answer and is in the commit (waiting for the turn lock, or writing)."""
    runs = rt.compression._runs
    await until(lambda: session_id in runs and runs[session_id].committing, "the run reached its commit")


async def summary_of(rt: Runtime, session_id: str = GROUP.id) -> dict[str, Any] | None:
    return await rt.store.get_meta(SUMMARY_NAMESPACE, session_id)


def units_tokens(history: Sequence[Message]) -> int:
    """R-BUD-2/4: the text estimate of the rendered units (the span is the whole plain history here)."""
    return sum(estimate_text_tokens(u.text) for u in build_units(history))


def stated(body: dict[str, Any]) -> tuple[int, int]:
    """The budget and keep cap the summariser's system prompt states (R-BUD-7)."""
    m = re.search(r"约 (\d+) tokens（约 (\d+) 个英文字符）", system_of(body))
    assert m is not None, system_of(body)
    assert int(m.group(2)) == 4 * int(m.group(1))  # 4 English characters per token
    cap = re.search(r"保留的原文合计不超过 (\d+) tokens", system_of(body))
    return int(m.group(1)), int(cap.group(1)) if cap else 0


def due_usage(turn_id: str | None) -> UsageEvent:
    """A usage that is due by count (10 messages against a line of 2)."""
    return UsageEvent(
        session_id=GROUP.id,
        turn_id=turn_id,
        platform="onebot",
        platform_type="group",
        model_id=CHAT_MODEL,
        window=32000,
        trim_budget=30976,
        usage=100,
        trimmed=False,
        untrimmed_history=50,
        history_messages=10,
        history_limit=2,
    )


async def held_compression(
    env: Env, reply: Reply | Callable[[dict[str, Any]], Reply] | None = None
) -> tuple[asyncio.Task[CompressionResult], Gate]:
    """A manual compression of the group, once its summary request waits at a gate that
    then answers `reply` (by default: a summary keeping nothing); the run and the gate."""
    gate = env.model.hold_summary(reply)
    run = asyncio.create_task(env.rt.compression.compress(GROUP.id))
    await gate.reached()
    return run, gate


async def held_turn(env: Env, reply: Reply) -> tuple[asyncio.Task[Outcome], Gate]:
    """A turn in the group, once its chat request waits at a gate that then answers `reply`;
    the turn and the gate."""
    gate = env.model.gate(reply)
    env.model.chat.append(gate)
    turn = asyncio.create_task(env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    await gate.reached()
    return turn, gate


async def raw_sql(path: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Write to the database file through a connection of its own (another process would)."""

    def run() -> None:
        with sqlite3.connect(path, timeout=5) as db:
            db.execute(sql, params)
        db.close()

    await asyncio.to_thread(run)


# ---- R-RUN: the run and its commit --------------------------------------------------------
async def test_r_prog_1_manual_compression_start_and_done(env: Env) -> None:
    rt = env.rt
    history = await seed(rt, 6)
    result = await rt.compression.compress(GROUP.id)
    assert result.outcome == "done"
    assert result.archived == len(history)
    assert env.phases() == [("start", None), ("done", None)]
    active = await rt.store.get_history(GROUP.id)
    assert [(m.role, m.content, m.event_marker) for m in active] == [("system", DIVIDER, True)]
    assert [m.id for m in await rt.store.get_archived(GROUP.id)] == [m.id for m in history]


async def test_r_mem_1_summary_lives_in_metadata_namespace_summary(env: Env) -> None:
    rt = env.rt
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    record = await rt.store.get_meta("summary", GROUP.id)
    assert record is not None
    assert record["text"] == CHAT_SUMMARY
    assert record["template"] == "chat"
    assert record["kept_messages"] == 0
    # The divider and the summary come from the same commit (R-RUN-11).
    divider = (await rt.store.get_history(GROUP.id))[-1]
    assert divider.content == DIVIDER
    assert record["time"] == divider.ts


async def test_r_run_1_unfinished_tool_group_stays_active_with_later_results(env: Env) -> None:
    rt, model = env.rt, env.model
    plain = await seed(rt, 4)
    call = await rt.store.append(
        GROUP.id,
        Message(
            role="assistant",
            content="",
            tool_calls=(ToolCall("call_7", "todo_write", '{"items": []}'),),
            ts=2000.0,
        ),
    )
    run, gate = await held_compression(env)
    # The agent finishes its tool group while the model summarises.
    result = await rt.store.append(
        GROUP.id, Message(role="tool", content="待办已清空", tool_call_id="call_7", ts=2001.0)
    )
    later = await rt.agent.record(GROUP, Message(role="user", content=talk(99), ts=2002.0))
    gate.open()
    done = await run
    assert done.archived == len(plain)
    (request,) = model.summary_requests()
    assert "调用 todo_write" not in user_of(request)
    assert all(m.content in user_of(request) for m in plain)
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active[:3]] == [call.id, result.id, later.id]
    assert active[0] == call  # untouched
    assert [m.content for m in active[3:]] == [DIVIDER]


async def test_r_run_11_history_changed_during_the_summary_call_fails_and_restores(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    before = await rt.store.get_history(GROUP.id)
    run, gate = await held_compression(env)
    await rt.store.archive_span(GROUP.id, 1)  # a message of the span goes away (a rollback elsewhere)
    gate.open()
    with pytest.raises(CompressionError) as failed:
        await run
    assert failed.value.reason == CHANGED
    assert await summary_of(rt) == OLD_SUMMARY  # the previous summary, restored
    assert await rt.store.get_history(GROUP.id) == before[1:]  # nothing more archived, no divider
    assert env.phases() == [("start", None), ("error", CHANGED)]
    assert len(env.failure_warnings()) == 1


async def test_r_run_11_head_compared_item_by_item_content_edit_is_a_change(env: Env) -> None:
    rt = env.rt
    history = await seed(rt, 4)
    run, gate = await held_compression(env)
    # Same ids, same count: only the content of the third item differs.
    await raw_sql(rt.store.path, "UPDATE messages SET content = ? WHERE id = ?", ("改过的话", history[2].id))
    gate.open()
    with pytest.raises(CompressionError, match=CHANGED):
        await run
    assert await summary_of(rt) is None
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active] == [m.id for m in history]
    assert await rt.store.get_archived(GROUP.id) == []


async def test_r_run_11_archive_error_restores_the_summary_and_raises(env: Env) -> None:
    rt = env.rt
    history = await seed(rt, 4)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    await raw_sql(
        rt.store.path,
        "CREATE TRIGGER refuse_archive BEFORE UPDATE OF archived ON messages WHEN NEW.archived = 1"
        " BEGIN SELECT RAISE(ABORT, 'archive refused by the test'); END",
    )
    # R-RUN-11: 「归档抛错时同样把摘要回滚到写入前，原样抛出」: the store's own error.
    with pytest.raises(StoreError, match="archive refused by the test"):
        await rt.compression.compress(GROUP.id)
    assert await summary_of(rt) == OLD_SUMMARY
    assert await rt.store.get_history(GROUP.id) == history
    assert env.phases() == [("start", None), ("error", STORE_FAILED)]
    assert len(env.failure_warnings()) == 1


async def test_r_run_12_kept_originals_untouched_and_first_after_the_summary(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    first = await rt.agent.record(
        GROUP, Message(role="user", content="[甲(1)] 早上好", ts=1.0, metadata={"message_id": 11})
    )
    call = await rt.store.append(
        GROUP.id,
        Message(
            role="assistant",
            content="我记一下",
            tool_calls=(
                ToolCall("call_1", "todo_write", '{"items": [{"title": "买票", "status": "pending"}]}'),
            ),
            ts=2.0,
            metadata={"visibleContent": "我记一下"},
        ),
    )
    result = await rt.store.append(
        GROUP.id,
        Message(role="tool", content="待办已更新", name="todo_write", tool_call_id="call_1", ts=3.0),
    )
    promise = await rt.agent.record(
        GROUP, Message(role="user", content="[乙(2)] 我周六带帐篷", ts=4.0, metadata={"message_id": 12})
    )
    # A long last line makes the keep cap (a ratio of the conversation) roomy.
    last = await rt.agent.record(GROUP, Message(role="user", content=talk(50, 200), ts=5.0))
    model.summary.append(keeping("调用 todo_write", "带帐篷"))
    done = await rt.compression.compress(GROUP.id)
    assert done.kept_messages == 3  # the tool group (2 messages) and one user message
    active = await rt.store.get_history(GROUP.id)
    assert active[:3] == [call, result, promise]  # role, content, calls, ts, metadata all unchanged
    assert active[3].content == DIVIDER
    archived = await rt.store.get_archived(GROUP.id)
    assert [m.id for m in archived] == [first.id, last.id]
    assert (await summary_of(rt) or {})["kept_messages"] == 3

    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    assert messages[1]["role"] == "system"
    assert messages[1]["content"].startswith(INJECTION_HEAD)
    assert messages[2]["role"] == "assistant"
    assert messages[2]["tool_calls"][0]["id"] == "call_1"
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "待办已更新"}
    assert messages[4] == {"role": "user", "content": promise.content}
    assert len(messages) == 5
    # The divider is an event marker: never sent as conversation.
    assert all(m.get("content") != DIVIDER for m in messages)


async def test_r_inj_1_2_summary_is_one_system_message_right_before_the_history(env: Env) -> None:
    rt, model = env.rt, env.model
    archived = await seed(rt, 5)
    await rt.compression.compress(GROUP.id)
    newer = await seed(rt, 2, start=5)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    systems = [m for m in messages if m["role"] == "system"]
    assert len(systems) == 2  # the persona, then the summary
    assert messages[1] == {"role": "system", "content": f"{INJECTION_HEAD}\n\n{CHAT_SUMMARY}"}
    assert [m["content"] for m in messages[2:]] == [m.content for m in newer]
    sent = "\n".join(str(m.get("content")) for m in messages)
    assert not any(m.content in sent for m in archived)
    assert sent.count(CHAT_SUMMARY) == 1


async def test_r_inj_1_summary_is_last_though_another_plugin_contributes_to_context(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 5)
    await rt.compression.compress(GROUP.id)

    async def weather(session_id: str) -> str:
        return "天气：晴"

    async def rules(session_id: str) -> str:
        return "群规：不许刷屏"

    # Registered after the compression's injection, under the same anchor and another one.
    rt.agent.contribute("context", weather)
    rt.agent.contribute("rules", rules)
    newer = await seed(rt, 2, start=5)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    messages = model.chat_requests()[-1]["messages"]
    systems = [m["content"] for m in messages if m["role"] == "system"]
    assert systems[1:] == ["群规：不许刷屏", "天气：晴", f"{INJECTION_HEAD}\n\n{CHAT_SUMMARY}"]
    # the summary is the system message right before the history
    assert [m["content"] for m in messages[len(systems) :]] == [m.content for m in newer]
    prompt = await rt.agent.build_prompt(GROUP.id, IN_GROUP)
    assert prompt.messages[len(systems) - 1]["content"].startswith(INJECTION_HEAD)


async def test_r_inj_2_no_truncation_of_a_long_summary(env: Env) -> None:
    rt, model = env.rt, env.model
    long_summary = CHAT_SUMMARY + "\n" + "很长的摘要内容。" * 600
    await seed(rt, 3)
    model.summary.append(Reply(f"【保留原文】无\n{long_summary}"))
    await rt.compression.compress(GROUP.id)
    await seed(rt, 1, start=3)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    assert model.chat_requests()[-1]["messages"][1]["content"] == f"{INJECTION_HEAD}\n\n{long_summary}"


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
PRIVATE_OWNER = SessionRecord(
    id="onebot:private:10001", platform="onebot", kind="private", peer=OWNER, room_class="direct"
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
    assert "请在已有摘要的同名小节上合并更新" in user_of(second)


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
    assert "请在已有摘要的同名小节上合并更新：旧内容里仍然成立的不要丢" in user_of(second)
    assert "按意思归入" not in user_of(second)


# ---- R-RUN-8: replies that still succeed ------------------------------------------------------
async def test_r_run_8_no_heading_whole_reply_is_the_summary_nothing_kept_warning(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    await seed(rt, 4)
    model.summary.append(Reply(CHAT_SUMMARY))
    result = await rt.compression.compress(GROUP.id)
    assert offered(model.summary_requests()[0])  # numbers were offered
    assert result.kept_messages == 0
    assert result.archived == 4
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY
    assert env.phases() == [("start", None), ("done", None)]
    assert any("has no 【保留原文】 heading" in w for w in env.warnings)


async def test_r_run_8_numbers_not_offered_are_dropped(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    history = await seed(rt, 4)
    model.summary.append(Reply(f"【保留原文】2、99\n{CHAT_SUMMARY}"))
    result = await rt.compression.compress(GROUP.id)
    assert sorted(offered(model.summary_requests()[0])) == [1, 2, 3, 4]
    assert result.kept_messages == 1
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active if m.is_conversation] == [history[1].id]


async def test_r_run_7_annotated_and_listed_hash_numbers_keep_only_those_units(make: Make) -> None:
    # R-RUN-7: the model copies the annotations back inside a numbered list; its list
    # numbers and the token counts are no numbers to keep.
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    history = await seed(rt, 6)

    def answer(body: dict[str, Any]) -> Reply:
        annotated = re.findall(r"^#(?:2|4)〔约 \d+ token〕", conversation_of(body), re.MULTILINE)
        listed = "\n".join(f"{i}. {a}" for i, a in enumerate(annotated, 1))
        return Reply(f"【保留原文】\n{listed}\n{CHAT_SUMMARY}")

    model.summary.append(answer)
    result = await rt.compression.compress(GROUP.id)
    assert result.kept_messages == 2
    active = await rt.store.get_history(GROUP.id)
    assert [m.id for m in active if m.is_conversation] == [history[1].id, history[3].id]
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY


# ---- R-BACK-1/2 through the service -----------------------------------------------------------
async def test_r_back_1_kept_at_most_ratio_of_the_new_conversation_not_lifted_by_the_floor(
    make: Make,
) -> None:
    env = await make(memsum_summary_budget_ratio=0.2)
    rt, model = env.rt, env.model
    history = await seed(rt, 10, size=20)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, {**OLD_SUMMARY, "text": "旧摘要" * 100})
    cap = math.floor(Fraction(1, 5) * units_tokens(history))  # the old summary does not count
    model.summary.append(
        lambda body: Reply(f"【保留原文】{'、'.join(map(str, offered(body)))}\n{CHAT_SUMMARY}")
    )
    result = await rt.compression.compress(GROUP.id)
    request = model.summary_requests()[0]
    assert stated(request) == (1000, cap)  # the budget sits at the floor; the keep cap does not
    kept = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert 0 < result.kept_messages == len(kept)
    assert sum(estimate_msg_tokens(m) for m in kept) <= cap
    # The earliest go first: what stays is the latest of those asked for.
    assert kept[-1].id == history[-1].id


async def test_r_back_2_kept_cut_to_half_the_count_line_earliest_first(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5, memsum_history_limit=9)
    rt, model = env.rt, env.model
    short = await seed(rt, 6, size=2)
    await seed(rt, 4, start=6, size=150)  # long ones make the keep cap roomy
    model.summary.append(keeping(*(m.content for m in short)))
    result = await rt.compression.compress(GROUP.id)
    assert len(offered(model.summary_requests()[0])) >= 6
    # ⌊9 / 2⌋ = 4, nothing after the cut: the last 4 of the 6 asked for stay.
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [m.id for m in short[2:]]
    assert result.kept_messages == 4


async def test_r_back_2_none_kept_when_messages_after_the_cut_reach_half(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt = env.rt
    await rt.settings.set("history_limit", "session", GROUP.id, 8)  # the count line from the settings
    short = await seed(rt, 4, size=2)
    await seed(rt, 2, start=4, size=150)
    run, gate = await held_compression(env, keeping(*(m.content for m in short)))
    after = await seed(rt, 4, start=10)  # arrive during the call: 4 = ⌊8 / 2⌋
    gate.open()
    result = await run
    assert result.kept_messages == 0
    active = [m for m in await rt.store.get_history(GROUP.id) if m.is_conversation]
    assert [m.id for m in active] == [m.id for m in after]


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


# ---- R-FAIL --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    script: Script | None
    reason: str
    """A regular expression the reason must match in full."""
    config: dict[str, Any]


def _only_a_non_chat_model(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [llm.model_config("test/embedder", chat=False)]


FAILURES = {
    "http_500": Failure(
        Reply(status=500, error="upstream exploded", headers={"Retry-After": "0"}),
        r"摘要模型出错：test/sum: HTTP 500: upstream exploded",
        {},
    ),
    "timeout": Failure(
        Reply(f"【保留原文】无\n{CHAT_SUMMARY}", delay=1.5),
        r"摘要模型出错：test/sum: no complete reply within 0\.5 s",
        {"memsum_llm_timeout": 0.5},
    ),
    "stream_cut": Failure(
        Reply(f"【保留原文】无\n{CHAT_SUMMARY}", cut_after=3), r"摘要模型出错：test/sum: .*", {}
    ),
    "finish_reason_length": Failure(
        Reply(f"【保留原文】无\n{CHAT_SUMMARY}", finish_reason="length"), r"摘要在输出上限处被截断", {}
    ),
    "empty_once_the_keep_block_is_removed": Failure(
        Reply("【保留原文】1、2\n"), re.escape(EMPTY_SUMMARY), {}
    ),
    "r_fail_2_window_too_small": Failure(
        None, re.escape(REFUSED_WINDOW), {"summary": {"context_window": 1000}}
    ),
    "no_summary_model_preference_named": Failure(
        None,
        r"摘要模型 ghost/model 不可用",
        {"models": _only_a_non_chat_model, "memsum_summary_model": "ghost/model"},
    ),
    "no_summary_model_at_all": Failure(
        None, r"没有可用的摘要模型", {"models": _only_a_non_chat_model, "memsum_summary_model": None}
    ),
}


@pytest.mark.parametrize("case", list(FAILURES.values()), ids=[f"r_fail_1_{k}" for k in FAILURES])
async def test_r_fail_1_nothing_written_one_warning_error_event_reason(make: Make, case: Failure) -> None:
    env = await make(**case.config)
    rt, model = env.rt, env.model
    if case.script is not None:
        model.summary_default = case.script
    await seed(rt, 5)
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, OLD_SUMMARY)
    before = await rt.store.get_history(GROUP.id)
    with pytest.raises(CompressionError) as failed:
        await rt.compression.compress(GROUP.id)
    reason = failed.value.reason
    assert re.fullmatch(case.reason, reason), reason
    assert await summary_of(rt) == OLD_SUMMARY  # no new summary
    assert await rt.store.get_history(GROUP.id) == before  # R-FAIL-3: untouched, no divider
    assert await rt.store.get_archived(GROUP.id) == []
    assert env.phases() == [("start", None), ("error", reason)]
    assert len(env.failure_warnings()) == 1
    assert not any(API_KEY in w for w in env.warnings)
    assert API_KEY not in reason


async def test_r_cfg_5_missing_summary_preference_falls_through_to_the_next_model(make: Make) -> None:
    env = await make(memsum_summary_model="ghost/model")
    await seed(env.rt, 3)
    result = await env.rt.compression.compress(GROUP.id)
    assert result.outcome == "done"
    # No own preference that resolves, no global one: the highest priority model, the chat one.
    assert env.model.summary_requests()[0]["model"] == "chat"


# ---- R-PROG ----------------------------------------------------------------------------------------
async def test_r_prog_2_empty_history_does_nothing_without_events(env: Env) -> None:
    result = await env.rt.compression.compress(GROUP.id)
    assert result.outcome == "nothing"
    assert env.progress == []
    assert env.model.llm.requests == []


async def test_r_prog_2_only_markers_does_nothing_without_events(env: Env) -> None:
    rt = env.rt
    await seed(rt, 2)
    await rt.compression.compress(GROUP.id)
    env.progress.clear()
    await rt.store.append(
        GROUP.id, Message(role="system", content="（助手本轮选择不回复）", event_marker=True)
    )
    result = await rt.compression.compress(GROUP.id)  # the divider and a silent record only
    assert result.outcome == "nothing"
    assert env.progress == []
    assert len(env.model.summary_requests()) == 1
    assert (await summary_of(rt) or {})["text"] == CHAT_SUMMARY


async def test_r_prog_3_one_run_per_session_manual_refused_background_skips(make: Make) -> None:
    env = await make(memsum_history_limit=2)  # every turn is due by count
    rt, model = env.rt, env.model
    await seed(rt, 3)
    run, gate = await held_compression(env)
    with pytest.raises(CompressionError, match=BUSY):
        await rt.compression.compress(GROUP.id)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"  # due, but a run is going
    await settle(rt)
    gate.open()
    await run
    await settle(rt)
    assert len(model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]
    assert not rt.compression.is_running(GROUP.id)


# ---- R-MEM: clearing ---------------------------------------------------------------------------------
async def test_r_mem_2_clear_context_clears_the_summary_too(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    await seed(rt, 2, start=3)
    await rt.compression.clear(GROUP.id, "context")
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == []
    await seed(rt, 1, start=5)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    assert not any(INJECTION_HEAD in str(m["content"]) for m in model.chat_requests()[-1]["messages"])


def _session_rows(path: Path, session_id: str) -> dict[str, int]:
    """How many rows of each table belong to the session, read from the file itself."""
    queries = {
        "messages": "SELECT COUNT(*) FROM messages WHERE session_id = ?",
        "metadata": "SELECT COUNT(*) FROM metadata WHERE key = ?",
        "settings": "SELECT COUNT(*) FROM settings WHERE scope = 'session' AND scope_key = ?",
        "sessions": "SELECT COUNT(*) FROM sessions WHERE id = ?",
        "ledger": "SELECT COUNT(*) FROM ledger WHERE session_id = ?",
    }
    with sqlite3.connect(path) as db:
        counts = {table: db.execute(sql, (session_id,)).fetchone()[0] for table, sql in queries.items()}
    db.close()
    return counts


async def test_r_mem_2_delete_session_cancels_the_run_and_removes_everything(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    model.summary.append(Reply("【保留原文】无"))  # the background run fails: a back-off
    await seed(rt, 4)
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    await rt.settings.set("compress_at", "session", GROUP.id, 0.3)
    await rt.todos.replace(GROUP.id, [TodoItem("写周报", "pending")])
    status = await rt.compression.status(GROUP.id)
    assert (status.backoff_failures, status.compress_at, status.usage is not None) == (1, 0.3, True)
    other = SessionRecord(id="onebot:group:2", platform="onebot", kind="group", place="group:2")
    await seed(rt, 2, record=other, start=50)
    await rt.store.flush_ledger()  # usage rows are written in batches (issue 9)
    before = await asyncio.to_thread(_session_rows, rt.store.path, GROUP.id)
    assert all(before.values()), before

    run, gate = await held_compression(env)  # a compression waiting on the model
    await rt.compression.delete_session(GROUP.id)
    with pytest.raises(CompressionError) as failed:
        await asyncio.wait_for(run, 10)
    assert failed.value.reason == CLEARED
    assert env.phases()[-2:] == [("start", None), ("error", CLEARED)]
    # Gone from the file: history (archive too), summary, last run, todos, back-off, usage,
    # the session's own settings and its record; the usage ledger stays (it was paid).
    after = await asyncio.to_thread(_session_rows, rt.store.path, GROUP.id)
    assert after == {**dict.fromkeys(before, 0), "ledger": before["ledger"]}
    assert len(await rt.store.get_history(other.id)) == 2  # another session is untouched
    status = await rt.compression.status(GROUP.id)
    assert (status.backoff_failures, status.usage, status.compress_at) == (0, None, 0.8)
    assert await rt.store.get_session(GROUP.id) is None
    # The session starts again from nothing.
    await seed(rt, 1, start=60)
    assert [m.content for m in await rt.store.get_history(GROUP.id)] == [talk(60)]
    gate.open()


async def test_r_mem_2_delete_session_waits_for_a_running_turn(env: Env) -> None:
    rt = env.rt
    await seed(rt, 2)
    turn, chat_gate = await held_turn(env, Reply("好的", usage=usage(100)))
    deleting = asyncio.create_task(rt.compression.delete_session(GROUP.id))
    await asyncio.sleep(0.05)
    assert not deleting.done()  # the turn's answer is still to be stored
    chat_gate.open()
    assert await turn == "replied"
    await asyncio.wait_for(deleting, 10)
    await rt.store.flush_ledger()
    assert await asyncio.to_thread(_session_rows, rt.store.path, GROUP.id) == {
        "messages": 0,
        "metadata": 0,
        "settings": 0,
        "sessions": 0,
        "ledger": 1,
    }


async def test_r_mem_2_clear_summary_alone_keeps_the_history(env: Env) -> None:
    rt = env.rt
    await seed(rt, 3)
    await rt.compression.compress(GROUP.id)
    newer = await seed(rt, 2, start=3)
    history = await rt.store.get_history(GROUP.id)
    await rt.compression.clear(GROUP.id, "summary")
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == history
    assert [m.id for m in history if m.is_conversation] == [m.id for m in newer]
    assert await rt.compression.injection(GROUP.id) is None


async def test_r_mem_3_clear_before_the_model_answered_cancels_the_run(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    run, gate = await held_compression(env)
    await rt.compression.clear(GROUP.id, "context")
    with pytest.raises(CompressionError) as failed:
        await run
    assert failed.value.reason == CLEARED
    assert await summary_of(rt) is None
    assert await rt.store.get_history(GROUP.id) == []
    archived = await rt.store.get_archived(GROUP.id)
    assert DIVIDER not in [m.content for m in archived]  # no divider was ever written
    assert env.phases() == [("start", None), ("error", CLEARED)]
    gate.open()


async def test_r_mem_3_clear_during_the_commit_waits_then_deletes_the_new_summary(env: Env) -> None:
    rt = env.rt
    await seed(rt, 4)
    run, summary_gate = await held_compression(env)
    # A turn holds the session while the model answers: the commit must wait for it.
    turn, chat_gate = await held_turn(env, Reply("慢慢说", usage=usage(100)))
    summary_gate.open()
    await committing(rt)
    order: list[str] = []
    rt.bus.subscribe(CompressionProgress, lambda p: order.append(p.phase))
    clearing = asyncio.create_task(rt.compression.clear(GROUP.id, "context"))
    clearing.add_done_callback(lambda _: order.append("cleared"))
    await asyncio.sleep(0.05)
    assert not clearing.done()  # it waits for the commit, which waits for the turn
    assert await summary_of(rt) is None
    chat_gate.open()
    assert await turn == "replied"
    result = await run
    await clearing
    assert result.outcome == "done"  # the run was not cancelled: it had its answer
    assert order == ["done", "cleared"]
    assert await summary_of(rt) is None  # the new summary is deleted too
    assert await rt.store.get_history(GROUP.id) == []
    archived = await rt.store.get_archived(GROUP.id)
    assert [m.content for m in archived][-2:] == ["慢慢说", DIVIDER]


async def test_r_mem_3_clear_from_inside_the_awaited_turn_cancels_instead_of_deadlocking(env: Env) -> None:
    """A tool of the very turn the commit waits for clears the session: waiting for the
    commit would wait for itself, and the commit has written nothing yet."""
    rt, model = env.rt, env.model
    await seed(rt, 4)
    run, summary_gate = await held_compression(env)

    @rt.tools.tool("forget", "清空本会话", {"type": "object", "properties": {}})
    async def forget(ctx: ToolContext, args: dict[str, Any]) -> str:
        await rt.compression.clear(ctx.session_id, "context")
        return "已清空"

    call = [{"id": "c1", "name": "forget", "arguments": "{}"}]
    chat_gate = model.gate(Reply("", tool_calls=call, finish_reason="tool_calls", usage=usage(100)))
    model.chat.extend([chat_gate, Reply("好了", usage=usage(100))])
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    await chat_gate.reached()
    summary_gate.open()
    await committing(rt)  # the commit now waits for the turn
    chat_gate.open()  # the turn runs the tool, which clears
    assert await asyncio.wait_for(turn, 10) == "replied"
    with pytest.raises(CompressionError) as failed:
        await asyncio.wait_for(run, 10)
    assert failed.value.reason == CLEARED
    assert await summary_of(rt) is None
    assert DIVIDER not in [m.content for m in await rt.store.get_archived(GROUP.id)]


async def test_r_run_11_archive_error_in_the_background_counts_as_a_failure(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt = env.rt
    await seed(rt, 4)
    await raw_sql(
        rt.store.path,
        "CREATE TRIGGER refuse_archive BEFORE UPDATE OF archived ON messages WHEN NEW.archived = 1"
        " BEGIN SELECT RAISE(ABORT, 'archive refused by the test'); END",
    )
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert env.phases() == [("start", None), ("error", STORE_FAILED)]
    assert len(env.failure_warnings()) == 1  # no second "crashed" report
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 1


async def test_compress_from_inside_the_sessions_own_turn_refuses_and_clear_still_works(env: Env) -> None:
    """A tool or a prompt contribution of the turn compresses its own session: the commit
    would wait for the turn that waits for it. It is refused at once; nothing is held."""
    rt, model = env.rt, env.model
    await seed(rt, 4)
    refusals: list[str] = []

    @rt.tools.tool("compress_me", "压缩本会话", {"type": "object", "properties": {}})
    async def compress_me(ctx: ToolContext, args: dict[str, Any]) -> str:
        try:
            await rt.compression.compress(ctx.session_id)
        except CompressionError as err:
            refusals.append(err.reason)
            return err.reason
        return "压缩好了"

    async def contribution(session_id: str) -> str | None:
        if session_id == GROUP.id and not refusals:
            try:
                await rt.compression.compress(session_id)
            except CompressionError as err:
                refusals.append(err.reason)
        return None

    rt.agent.contribute("plugin-x", contribution)
    call = [{"id": "c1", "name": "compress_me", "arguments": "{}"}]
    model.chat.extend(
        [
            Reply("", tool_calls=call, finish_reason="tool_calls", usage=usage(100)),
            Reply("好了", usage=usage(100)),
        ]
    )
    assert await asyncio.wait_for(rt.agent.run_turn(GROUP.id, entry=IN_GROUP), 20) == "replied"
    assert refusals == [IN_TURN, IN_TURN]
    assert model.summary_requests() == []
    assert not rt.compression.is_running(GROUP.id)
    # the tool's answer reached the model as its result
    tool_results = [m for m in model.chat_requests()[-1]["messages"] if m["role"] == "tool"]
    assert tool_results[-1]["content"] == IN_TURN
    # nothing is left holding the session: a clear and a compression afterwards work
    await asyncio.wait_for(rt.compression.clear(GROUP.id, "context"), 10)
    assert await rt.store.get_history(GROUP.id) == []
    await seed(rt, 3, start=10)
    assert (await asyncio.wait_for(rt.compression.compress(GROUP.id), 20)).outcome == "done"


# ---- R-TRIG: background compression at turn end ---------------------------------------------------------
# The chat model of these: window 10000 at compress_at 0.5 → E = min(5000, 10000 − 1024) = 5000.
TRIG: dict[str, Any] = {"chat": {"context_window": 10000}, "memsum_compress_at": 0.5}


def turn_usages(env: Env) -> list[UsageEvent]:
    events: list[UsageEvent] = []
    env.rt.bus.subscribe(UsageEvent, lambda e: events.append(e) if e.turn_id else None)
    return events


async def test_r_trig_3_usage_at_the_line_with_enough_compressible_compresses(make: Make) -> None:
    env = await make(**TRIG)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    usages = turn_usages(env)
    model.chat.append(Reply("好的", usage=usage(5000)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert usages[-1].usage == 5000
    assert 2 * usages[-1].untrimmed_history >= 5000
    assert len(model.summary_requests()) == 1
    assert env.phases() == [("start", None), ("done", None)]


async def test_r_trig_3_usage_under_the_line_does_not_compress(make: Make) -> None:
    env = await make(**TRIG)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    model.chat.append(Reply("好的", usage=usage(4999)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert model.summary_requests() == []


async def test_r_trig_3_small_compressible_part_does_not_compress(make: Make) -> None:
    env = await make(**TRIG)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    usages = turn_usages(env)
    model.chat.append(Reply("好的", usage=usage(9000)))  # persona and tools, not history
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert 2 * usages[-1].untrimmed_history < 5000
    assert model.summary_requests() == []


async def test_r_trig_3_hard_trimmed_turn_counts_as_reaching_the_line(make: Make) -> None:
    # Trim budget ⌊0.3 × 10000⌋ − 1024 = 1976 = E; the model reports only 100.
    env = await make(**TRIG, memsum_trim_ratio=0.3)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    usages = turn_usages(env)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert usages[-1].trimmed
    assert usages[-1].usage == 100
    assert len(model.summary_requests()) == 1


@pytest.mark.parametrize(
    ("messages", "reply", "due"),
    [
        pytest.param(5, "好的", True, id="replied_counts_one_more"),
        pytest.param(5, "[不回复]", False, id="silent_record_not_counted"),
        pytest.param(4, "好的", False, id="under_the_line"),
    ],
)
async def test_r_trig_4_count_line(make: Make, messages: int, reply: str, due: bool) -> None:
    env = await make(memsum_history_limit=6)
    rt, model = env.rt, env.model
    await seed(rt, messages)
    model.chat.append(Reply(reply, usage=usage(100)))
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert len(model.summary_requests()) == int(due)


async def test_r_trig_4_count_line_from_the_session_setting(env: Env) -> None:
    rt, model = env.rt, env.model
    await rt.settings.set("history_limit", "session", GROUP.id, 4)
    await seed(rt, 3)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
    await settle(rt)
    assert len(model.summary_requests()) == 1


TOOL_ROUND = Reply(
    "", tool_calls=[{"id": "call_1", "name": "todo_write", "arguments": '{"items": []}'}], usage=usage(100)
)


@pytest.mark.parametrize(
    ("second", "outcome", "compressed"),
    [
        pytest.param(Reply(status=400, error="bad request"), "error", False, id="error_not_judged"),
        pytest.param(Reply("好的", usage=usage(100)), "replied", True, id="replied_judged"),
    ],
)
async def test_r_trig_2_failed_turn_is_not_judged(
    make: Make, second: Reply, outcome: str, compressed: bool
) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    model.chat.extend([TOOL_ROUND, second])  # the turn's first call is due by count
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == outcome
    await settle(rt)
    assert len(model.summary_requests()) == int(compressed)


async def test_r_trig_2_aborted_turn_is_not_judged(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    gate = model.gate(Reply("好的", usage=usage(100)))
    model.chat.extend([TOOL_ROUND, gate])
    ended: list[TurnEnded] = []
    rt.bus.subscribe(TurnEnded, ended.append)
    turn = asyncio.create_task(rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    await gate.reached()
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    await settle(rt)
    assert [e.outcome for e in ended] == ["aborted"]
    assert model.summary_requests() == []


async def test_r_trig_5_snapshot_and_left_over_usage_are_not_judged(env: Env) -> None:
    rt, model = env.rt, env.model
    bus = rt.bus
    await seed(rt, 3)
    # A snapshot only: never judged.
    await bus.emit(TurnStarted("t1", GROUP.id))
    await bus.emit(due_usage(None))
    await bus.emit(TurnEnded("t1", GROUP.id, "replied"))
    # A usage left over from t2 is not t3's.
    await bus.emit(TurnStarted("t2", GROUP.id))
    await bus.emit(TurnEnded("t2", GROUP.id, "error"))
    await bus.emit(due_usage("t2"))
    await bus.emit(TurnStarted("t3", GROUP.id))
    await bus.emit(TurnEnded("t3", GROUP.id, "replied"))
    await settle(rt)
    assert model.summary_requests() == []
    # The same usage with its own turn id is judged (the control).
    await bus.emit(TurnStarted("t4", GROUP.id))
    await bus.emit(due_usage("t4"))
    await bus.emit(TurnEnded("t4", GROUP.id, "replied"))
    await settle(rt)
    assert len(model.summary_requests()) == 1


async def test_r_trig_5_not_judged_after_a_compression_since_the_turn_started(env: Env) -> None:
    rt, model = env.rt, env.model
    bus = rt.bus
    await seed(rt, 3)
    await bus.emit(TurnStarted("t1", GROUP.id))
    await rt.compression.compress(GROUP.id)
    await seed(rt, 3, start=3)
    await bus.emit(due_usage("t1"))
    await bus.emit(TurnEnded("t1", GROUP.id, "replied"))
    await settle(rt)
    assert len(model.summary_requests()) == 1  # the manual one only


async def test_r_trig_5_not_judged_after_a_clear_since_the_turn_started(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    turn, gate = await held_turn(env, Reply("好的", usage=usage(100)))
    await rt.compression.clear(GROUP.id, "context")
    await seed(rt, 3, start=3)
    gate.open()
    assert await turn == "replied"
    await settle(rt)
    assert model.summary_requests() == []


async def test_r_trig_5_background_commit_waits_for_the_running_turn(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 3)
    summary_gate = model.hold_summary()
    assert await rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"  # due: background starts
    await summary_gate.reached()
    second, chat_gate = await held_turn(env, Reply("第二轮的回答", usage=usage(100)))
    in_turn_at_done: list[bool] = []
    rt.bus.subscribe(
        CompressionProgress,
        lambda p: in_turn_at_done.append(rt.agent.in_turn(GROUP.id)) if p.phase == "done" else None,
    )
    summary_gate.open()
    await committing(rt)
    history = await rt.store.get_history(GROUP.id)
    assert await summary_of(rt) is None
    assert DIVIDER not in [m.content for m in history]
    chat_gate.open()
    assert await second == "replied"
    await settle(rt)
    assert in_turn_at_done == [False]
    active = await rt.store.get_history(GROUP.id)
    # The second turn's reply is after the cut; the divider comes after it.
    assert [m.content for m in active] == ["第二轮的回答", DIVIDER]


# ---- R-BACK-3/4: the back-off over many turns ------------------------------------------------------
FAIL = Reply(status=500, error="summariser down", headers={"Retry-After": "0"})


async def drive(
    env: Env, turns: int, starts: list[int], *, before: Callable[[int], Any] | None = None
) -> None:
    """`turns` turns, each due by count; the numbers of the turns whose end started a run go to `starts`."""
    rt = env.rt
    first = len(await rt.store.get_history(GROUP.id)) + 1000
    for n in range(1, turns + 1):
        if before is not None:
            await before(n)
        await seed(rt, 1, start=first + n)
        seen = len(env.phases())
        await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
        await settle(rt)
        if ("start", None) in env.phases()[seen:]:
            starts.append(n)


async def test_r_back_3_retries_at_2_4_8_16_32_then_every_32(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    env.model.summary_default = FAIL
    starts: list[int] = []
    await drive(env, 96, starts)
    # First failure at turn 1; then 2, 4, 8, 16, 32, 32 judged turns later.
    assert starts == [1, 3, 7, 15, 31, 63, 95]
    assert [p for p, _ in env.phases()] == ["start", "error"] * 7
    status = await env.rt.compression.status(GROUP.id)
    assert status.backoff_failures == 7


async def test_r_back_4_success_forgets_the_back_off(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    model = env.model
    model.summary_default = FAIL
    starts: list[int] = []

    async def before(n: int) -> None:
        # Succeed once at the third attempt (turn 7), fail again afterwards.
        model.summary_default = Reply(NOTHING_KEPT) if n == 7 else FAIL

    await drive(env, 12, starts, before=before)
    assert starts == [1, 3, 7, 8, 10]
    assert [p for p, _ in env.phases()] == ["start", "error", "start", "error", "start", "done"] + [
        "start",
        "error",
    ] * 2


async def test_r_back_4_clear_forgets_the_back_off(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    env.model.summary_default = FAIL
    starts: list[int] = []

    async def before(n: int) -> None:
        if n == 2:
            await env.rt.compression.clear(GROUP.id, "context")

    await drive(env, 3, starts, before=before)
    assert starts == [1, 2]  # no wait of 2 after the clear


async def test_r_back_4_run_cancelled_by_a_clear_is_no_failure(make: Make) -> None:
    env = await make(memsum_history_limit=2)
    rt, model = env.rt, env.model
    await seed(rt, 2)
    gate = model.hold_summary()
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)  # due: the background run waits on the model
    await gate.reached()
    await rt.compression.clear(GROUP.id, "context")
    await settle(rt)
    assert env.phases() == [("start", None), ("error", CLEARED)]
    assert (await rt.compression.status(GROUP.id)).backoff_failures == 0
    await seed(rt, 1, start=10)
    await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)  # due again: runs at once
    await settle(rt)
    assert [p for p, _ in env.phases()] == ["start", "error", "start", "done"]
    gate.open()


# ---- R-CFG-4 -----------------------------------------------------------------------------------------
async def test_r_cfg_4_compress_at_is_none_for_0(make: Make) -> None:
    env = await make(memsum_compress_at=0.8, memsum_tiers={"onebot.group": {"compress_at": 0.5}})
    service, settings = env.rt.compression, env.rt.settings
    assert await service.compress_at("internal:x") == 0.8
    assert await service.compress_at("internal:x", "onebot", "group") == 0.5
    await settings.set("compress_at", "session", "internal:x", 0)
    assert await service.compress_at("internal:x", "onebot", "group") is None
    zero = await make(memsum_compress_at=0)
    assert await zero.rt.compression.compress_at(GROUP.id, "onebot") is None


# ---- review additions --------------------------------------------------------------------------
async def test_r_fail_1_an_unexpected_error_gives_one_warning_with_its_traceback(env: Env) -> None:
    rt = env.rt

    class BrokenTodos:
        """Another plugin's todo provider that fails (the work template reads it, R-RUN-4)."""

        async def items(self, session_id: str) -> list[TodoItem]:
            raise RuntimeError("todo backend down")

        async def replace(self, session_id: str, items: list[TodoItem]) -> None:
            raise RuntimeError("todo backend down")

    rt.compression.todos = BrokenTodos()
    await seed(rt, 3, record=PRIVATE_OWNER)
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(m.record["message"]), level="ERROR")
    try:
        with pytest.raises(CompressionError) as failed:
            await rt.compression.compress(PRIVATE_OWNER.id)
    finally:
        logger.remove(sink)
    assert failed.value.reason == "内部错误：RuntimeError"
    assert errors == []
    (warning,) = env.failure_warnings(PRIVATE_OWNER.id)
    assert "内部错误：RuntimeError" in warning
    assert [p for p, _ in env.phases(PRIVATE_OWNER.id)] == ["start", "error"]


async def test_r_mem_2_an_unknown_clear_kind_is_refused_and_cancels_nothing(env: Env) -> None:
    rt, model = env.rt, env.model
    await seed(rt, 3)
    gate = model.hold_summary()
    run = asyncio.create_task(rt.compression.compress(GROUP.id))
    await gate.reached()
    with pytest.raises(ValueError, match="unknown clear kind"):
        await rt.compression.clear(GROUP.id, "everything")  # type: ignore[arg-type]
    gate.open()
    assert (await run).outcome == "done"
    assert env.phases() == [("start", None), ("done", None)]


async def test_r_tpl_2_owner_written_the_nonebot_way_gets_the_work_template(tmp_path: Path) -> None:
    # SUPERUSERS=["onebot:10001"] is NoneBot's current form; the commands accept it, so the
    # template choice must too.
    llm = ScriptedLLM().start()
    rt = await runtime.build(
        Config.model_validate({"memsum_models": [llm.model_config(SUMMARY_MODEL)]}),
        tmp_path / "owner.db",
        [],
        {"onebot:10001"},
    )
    try:
        assert rt.compression.is_owner is not None
        assert rt.compression.is_owner("10001")
        assert not rt.compression.is_owner("10002")
        dm = SessionRecord(
            id="onebot:private:10001", platform="onebot", kind="private", peer="10001", room_class="direct"
        )
        await rt.agent.record(dm, Message(role="user", content="[主人(10001)] 记一下", ts=1.0))
        await rt.compression.compress(dm.id)
        (body,) = [b for b in llm.requests if is_summary(b)]
        assert "## 目标" in system_of(body)
    finally:
        await runtime.close(rt)
        llm.stop()


def test_r_inj_2_the_first_sentence_explains_the_kept_originals() -> None:
    first = INJECTION_HEAD.split("。")[0]
    assert "保留的原文" in first
    assert "按原来的时间顺序" in first
    assert "历史开头" in first
    assert "概括过" in first


# ---- QA regressions ------------------------------------------------------------------------------
async def test_shutdown_abandons_a_manual_run_waiting_on_the_model_and_leaves_the_old_state(env: Env) -> None:
    # NoneBot shields a command from cancellation: a /压缩 waiting on the model held the
    # bot's shutdown for the whole model timeout, then hit the closed store.
    rt = env.rt
    before = await seed(rt, 4)
    run, gate = await held_compression(env)
    await asyncio.wait_for(rt.compression.shutdown(), 10)  # a bound: the gate stays shut
    assert run.done()
    with pytest.raises(CompressionError, match=STOPPED):
        run.result()
    assert await rt.store.get_history(GROUP.id) == before
    assert await summary_of(rt) is None
    assert (await rt.compression.status(GROUP.id)).last_run.reason == STOPPED  # type: ignore[union-attr]
    gate.open()


# ---- issue 9: no hard trim on the turn that starts a compression ----------------------------------
async def test_r_trig_3_a_turn_expected_to_be_trimmed_next_starts_the_compression_now(make: Make) -> None:
    # Window 8000: trim budget 8000 − 1024 = 6976, line E = 6400; between two turns the history
    # grows by about 1500 tokens, more than the 576 between E and the trim budget. R-TRIG-3 alone
    # compresses once a turn was trimmed; judged against the next request as well, the
    # compression starts a turn early and no turn is ever trimmed.
    env = await make(chat={"context_window": 8000})
    env.model.chat_default = Reply("好的", usage=None)  # the usage is the plugin's own estimate
    events: list[UsageEvent] = []
    env.rt.bus.subscribe(UsageEvent, events.append)
    starts: list[UsageEvent] = []
    for n in range(40):
        await seed(env.rt, 20, start=100 * n, size=60)
        seen = len(env.phases())
        await env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
        await settle(env.rt)
        if ("start", None) in env.phases()[seen:]:
            starts.append(events[-1])
    judged = [e for e in events if e.turn_id is not None]
    assert len(starts) >= 2
    assert [e for e in judged if e.trimmed] == []
    assert all(e.line == 6400 and e.trim_budget == 6976 for e in judged)
    # At least one run started below the line: the next request was expected over the trim budget.
    assert any(e.usage < 6400 for e in starts)
    assert env.phases().count(("done", None)) == len(starts)


def test_r_trig_3_next_usage_over_the_trim_budget_counts_as_trimmed() -> None:
    from nonebot_plugin_memsum.compression.trigger import UsageFacts, usage_due

    def facts(usage: int, next_usage: int | None, untrimmed: int = 5000) -> UsageFacts:
        return UsageFacts(
            turn_id="t", usage=usage, window=8000, trim_budget=6976, trimmed=False,
            untrimmed_history=untrimmed, history_messages=10, history_limit=0,
            platform=None, platform_type=None, next_usage=next_usage,
        )  # fmt: skip

    assert not usage_due(facts(6000, None), 0.8)
    assert not usage_due(facts(6000, 6976), 0.8)  # still fits: wait for the line
    assert usage_due(facts(6000, 6977), 0.8)
    assert not usage_due(facts(6000, 7500, untrimmed=3199), 0.8)  # R-TRIG-3: E / 2 compressible
    assert not usage_due(facts(6000, 7500), 0)  # R-CFG-4: no usage line at all
