"""Outside audit 11 (fa): concurrency through the library API, seeded and random, checked
against the specification's invariants.

Another plugin's author calls `nonebot_plugin_memsum.api` from several tasks at once:
`record`, `run_turn`, `compress`, `clear` (context and summary), `delete_session`,
`child_session`, `search`, settings changes of compress_at and history_limit (what
/压缩线 and /条数线 write), and listens to `CompressionProgress`. A seeded driver runs
such tasks concurrently on a private runtime (a real SQLite file; and two runtimes on one
PostgreSQL database, standing for two bot processes) against the scripted
OpenAI-compatible server, with small windows and count lines so compressions are
frequent, random model delays and some failing model calls. After every round and at the
end it checks:

- R-PROG-1/3: at most one compression per session at a time (across both runtimes on
  PostgreSQL); every run reports `start` then exactly one of `done` / `error`; a refused
  manual run names one of the reasons of the specification;
- R-RUN-11 / R-MEM-1: the stored summary is one a run reported `done` with, and it covers
  only messages archived or kept before its divider (never half a commit);
- R-MEM-2/3: after a context clear (or a deletion) returns, no request of that process to
  the model carries a message cleared (nor a summary of them); the other process's runs
  check the clear before each summary request (a request sent as the clear commits there
  cannot be recalled, and its turns are not told: see the report of audit 11);
- R-INJ-1: every chat request carries the summary at most once, as the last system part,
  right before the history;
- R-BUD / R-RUN-9: every request's input estimate + max_tokens ≤ the model's window;
- nothing recorded is lost: every message `api.record` returned is active or archived,
  once, in order, unless a clear or deletion that began after it removed it;
- no deadlock: every task ends within a timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.agent.events import CompressionProgress
from nonebot_plugin_memsum.agent.prompt import tools_tokens
from nonebot_plugin_memsum.compression.service import (
    BUSY,
    CHANGED,
    CLEARED,
    DIVIDER,
    INJECTION_HEAD,
    RUNS_NAMESPACE,
)
from nonebot_plugin_memsum.llm.tokens import REQUEST_OVERHEAD, estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, open_store
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import Reply
from tests.fakes.pgdb import raw
from tests.fakes.seeds import seeds
from tests.fakes.service import GROUP as SERVICE_GROUP
from tests.fakes.service import Env, Make, held_turn, is_summary, seed, settle, until, user_of

GROUP = SessionRecord(
    id="onebot:group:771", platform="onebot", kind="group", place="group:771", room_class="room"
)
TASK = SessionRecord(id="plugin:report:1", platform=None, kind="internal")
CHILD = SessionRecord(id="plugin:report:1:sub", platform=None, kind="child", parent=TASK.id)
SESSIONS = (GROUP, TASK, CHILD)
CHAT_WINDOW = 4000
SUMMARY_WINDOW = 6000
TAG = re.compile(r"\bt(\d+)x\b")
SECTIONS = {
    "chat": "## 谁有问题没回应\n无\n## 关键原话要点\n无",
    "work": "## 做过的决定\n无\n## 改过的文件\n无\n## 未完成的事\n无",
}
# What a refused manual run may say (R-PROG-3, R-MEM-3, R-RUN-11, R-FAIL-1).
REASONS = (BUSY, CLEARED, CHANGED, "摘要模型出错")
TOPICS = ("周末去爬山", "服务器又重启了", "发布说明还没写完", "团建改到农家乐", "报销单要签字")

_current: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar("memsum_fa_runtime", default=None)


@pytest.fixture
def per_task_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """`api` calls `runtime.get()`: here it answers the runtime the calling task chose, so
    one test drives two runtimes (two bot processes) through the library API."""
    original = runtime.get

    def get() -> Runtime:
        rt = _current.get()
        return rt if rt is not None else original()

    monkeypatch.setattr(runtime, "get", get)


def request_tokens(body: dict[str, Any]) -> int:
    """A request's input as the plugin estimates it, plus the output it reserves (as in
    tests/test_audit10_fz.py)."""
    total = REQUEST_OVERHEAD + tools_tokens(body.get("tools") or [], estimate_text_tokens)
    for m in body["messages"]:
        total += estimate_msg_tokens(Message(role=m["role"], content=str(m.get("content") or "")), keep=False)
    return total + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)


def tags(text: str) -> set[int]:
    return {int(t) for t in TAG.findall(text)}


def body_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body["messages"])


# ---- the scripted models: random delays, some failures -------------------------------------
@dataclass
class Models:
    """Replies for both kinds of request, from a seeded generator shared by the server's
    threads (the order in which threads draw is the only thing the seed does not fix)."""

    rng: random.Random
    fail: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    summaries: int = 0

    def summary(self, body: dict[str, Any]) -> Reply:
        text = user_of(body)
        with self.lock:
            delay = self.rng.random() * 0.12
            if self.rng.random() < self.fail:
                return Reply(status=400, error="scripted summariser failure", delay=delay)
            self.summaries += 1
            n = self.summaries
            offered = re.findall(r"^#(\d+)〔", text, re.MULTILINE)
            keep = [x for x in offered if self.rng.random() < 0.3]
        # A summary names what it summarised: the tags of the conversation it was given
        # (the existing summary's too, so a stale one would show).
        covered = " ".join(f"t{t}x" for t in sorted(tags(text))[-40:])
        template = "chat" if "最近在聊什么" in body["messages"][0]["content"] else "work"
        head = "## 最近在聊什么" if template == "chat" else "## 目标"
        summary = f"{head}\n摘要S{n}: {covered}\n{SECTIONS[template]}"
        return Reply(f"【保留原文】{'、'.join(keep) or '无'}\n{summary}", delay=delay)

    def chat(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            delay = self.rng.random() * 0.08
            roll = self.rng.random()
        if roll < self.fail:
            return Reply(status=400, error="scripted chat failure", delay=delay)
        last = body["messages"][-1]
        if roll < 0.15 and body.get("tools") and last.get("role") == "user":
            call = {"id": f"call{int(roll * 1e6)}", "name": "recall", "arguments": '{"query": "爬山"}'}
            return Reply("", tool_calls=[call], finish_reason="tool_calls", delay=delay)
        return Reply("好的，记下了", delay=delay)


# ---- what the driver saw ----------------------------------------------------------------------
@dataclass
class Seen:
    """Shared by every task and both runtimes."""

    recorded: dict[str, list[Message]] = field(default_factory=dict)
    """Per session, every message `api.record` returned, in the order returned."""
    gone_upto: dict[str, int] = field(default_factory=dict)
    """Per session, the last tag a context clear or deletion may have removed: every tag
    handed out before it returned (a record running beside it may land on either side)."""
    cleared_tags: list[tuple[int, set[int], str]] = field(default_factory=list)
    """(`calls` made when a clear returned, the tags it removed, which clear)."""
    cleared_by: list[str] = field(default_factory=list)
    """The runtime of each clear in `cleared_tags`."""
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    """Every model call as the runtime made it, in the event loop's order: (purpose, session,
    the text of its messages). The server's arrival order can lag behind it (its threads)."""
    running: dict[str, str] = field(default_factory=dict)
    """Session → the runtime whose run reported `start` and no end yet."""
    done_summaries: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    next_tag: int = 0

    def fail(self, what: str) -> None:
        self.failures.append(what)


@dataclass
class World:
    envs: list[Env]
    seen: Seen
    rng: random.Random

    def requests(self) -> list[dict[str, Any]]:
        return [b for env in self.envs for b in list(env.model.llm.requests)]

    def count(self) -> int:
        return sum(len(env.model.llm.requests) for env in self.envs)


def watch(world: World, env: Env, name: str) -> None:
    seen = world.seen
    client = env.rt.client
    chat = client.chat

    async def recorded_chat(model: Any, messages: Any, **kw: Any) -> Any:
        text = "\n".join(str(m.get("content") or "") for m in messages)
        seen.calls.append((kw.get("purpose", ""), f"{name}:{kw.get('session_id')}", text))
        return await chat(model, messages, **kw)

    client.chat = recorded_chat  # type: ignore[method-assign]

    async def on_progress(p: CompressionProgress) -> None:
        sid = p.session_id
        if p.phase == "start":
            if sid in seen.running:  # R-PROG-3 (across processes too)
                seen.fail(f"{name}: start of {sid} while {seen.running[sid]}'s run is in flight")
            seen.running[sid] = name
            return
        if seen.running.get(sid) != name:  # R-PROG-1: exactly one end after each start
            seen.fail(f"{name}: {p.phase} of {sid} without its start ({seen.running.get(sid)})")
        seen.running.pop(sid, None)
        if p.phase == "done":
            record = await env.rt.store.get_meta(SUMMARY_NAMESPACE, sid)
            if record is not None:
                seen.done_summaries.add(record["text"])

    env.rt.bus.subscribe(CompressionProgress, on_progress)


# ---- the tasks ------------------------------------------------------------------------------------
async def actor(world: World, env: Env, name: str, steps: int) -> None:
    _current.set(env.rt)
    rng = random.Random(world.rng.random())
    seen = world.seen
    for _ in range(steps):
        await asyncio.sleep(rng.random() * 0.02)
        session = rng.choices(SESSIONS, weights=[3, 2, 1])[0]  # most of it in the group
        sid = session.id
        op = rng.choices(
            ["record", "turn", "compress", "clear", "summary", "delete", "search", "setting"],
            weights=[40, 14, 8, 3, 3, 1, 4, 4],
        )[0]
        seen.trace.append(f"{name} {op} {sid}")
        if op == "record":
            for _ in range(rng.randint(1, 4)):
                seen.next_tag += 1
                who = rng.randint(1, 5)
                text = f"[用户{who}(2000{who})] t{seen.next_tag}x {rng.choice(TOPICS)}" + "嗯" * rng.randint(
                    0, 60
                )
                stored = await api.record(session, Message(role="user", content=text, name=f"2000{who}"))
                seen.recorded.setdefault(sid, []).append(stored)
        elif op == "turn":
            try:
                await api.run_turn(
                    sid, entry=api.Entry("onebot", "group") if session is GROUP else api.Entry()
                )
            except api.SessionNotFound:
                pass  # deleted meanwhile (or never recorded yet)
        elif op == "compress":
            # R-PROG-3: refused with 「这个会话正在压缩」 exactly when a run of the session is in
            # flight (in this runtime; on PostgreSQL the other one's run is refused the same way).
            running = env.rt.compression.is_running(sid)
            try:
                await api.compress(sid)
            except api.CompressionError as err:
                if not str(err).startswith(REASONS):
                    seen.fail(f"{name}: manual compression of {sid} refused with {err!s}")
                busy = str(err) == BUSY
                if (running and not busy) or (busy and not running and len(world.envs) == 1):
                    seen.fail(f"{name}: compression of {sid} refused {err!s} with a run in flight: {running}")
            else:
                if running:
                    seen.fail(f"{name}: a manual compression of {sid} ran beside another")
        elif op in ("clear", "delete"):
            # Certainly removed: what was recorded (returned) before the clear began.
            before_tags = {t for m in seen.recorded.get(sid, []) for t in tags(m.content)}
            if op == "clear":
                await api.clear(sid, "context")
            else:
                await api.delete_session(sid)
            seen.gone_upto[sid] = seen.next_tag
            seen.cleared_tags.append((len(seen.calls), before_tags, f"{name} {op} {sid}"))
            seen.cleared_by.append(name.split(".")[0])
            if op == "delete" and session is CHILD and await _exists(TASK.id):
                await api.child_session(TASK.id, CHILD.id)
        elif op == "summary":
            await api.clear(sid, "summary")
        elif op == "search":
            mine = seen.recorded.get(sid, [])
            if mine:
                tag = next(iter(tags(rng.choice(mine).content)))
                for hit in await api.search(sid, f"t{tag}x", limit=5):
                    if hit.message.content not in {m.content for m in mine}:
                        seen.fail(f"{name}: search of {sid} found another session's {hit.message.content!r}")
        else:
            if rng.random() < 0.5:
                await env.rt.settings.set("history_limit", "session", sid, rng.choice([6, 10, 16, 0]))
            else:
                await env.rt.settings.set("compress_at", "session", sid, rng.choice([0.3, 0.5, 0.8, 0.0]))


async def _exists(sid: str) -> bool:
    return await runtime.get().store.get_session(sid) is not None


# ---- the invariants ----------------------------------------------------------------------------------
async def check_store(world: World) -> None:
    """After a round, with nothing running: the stored state against what was recorded."""
    seen = world.seen
    store = world.envs[0].rt.store
    for session in SESSIONS:
        sid = session.id
        active = await store.get_history(sid)
        archived = await store.get_archived(sid)
        ids = [m.id for m in archived] + [m.id for m in active]
        if len(ids) != len(set(ids)):
            seen.fail(f"{sid}: a message stored twice: {ids}")
        if [m.id for m in active] != sorted(m.id or 0 for m in active):
            seen.fail(f"{sid}: active history out of order")
        by_id = {m.id: m for m in [*archived, *active]}
        for m in seen.recorded.get(sid, []):
            if max(tags(m.content)) <= seen.gone_upto.get(sid, 0):
                continue
            found = by_id.get(m.id)
            if found is None or found.content != m.content:
                seen.fail(f"{sid}: recorded message {m.id} {m.content[:12]!r} lost")
        record = await store.get_meta(SUMMARY_NAMESPACE, sid)
        if record is None:
            continue
        text = record["text"]
        if text not in seen.done_summaries:  # R-RUN-11: only a run that reported done wrote it
            seen.fail(f"{sid}: stored summary {text[:30]!r} of no run that reported done")
        dividers = [m.id or 0 for m in active if m.event_marker and m.content == DIVIDER]
        if not dividers:
            seen.fail(f"{sid}: a summary without its divider")
            continue
        covered = {t for m in archived for t in tags(m.content)}
        covered |= {t for m in active if (m.id or 0) < dividers[-1] for t in tags(m.content)}
        # What a clear removed may have been summarised into a summary the clear removed too.
        if extra := tags(text) - covered:
            seen.fail(f"{sid}: the summary covers {sorted(extra)}, neither archived nor kept")
        kept = sum(1 for m in active if m.is_conversation and (m.id or 0) < dividers[-1])
        if record.get("kept_messages", 0) > kept:
            seen.fail(f"{sid}: summary says {record['kept_messages']} kept, {kept} are")


def check_requests(world: World) -> None:
    seen = world.seen
    everything = world.requests()
    # Both servers' requests in one list: on one runtime it is arrival order; with two,
    # each clear's index counts both servers' requests then, a lower bound per server.
    index = 0
    for env in world.envs:
        for i, body in enumerate(list(env.model.llm.requests)):
            window = SUMMARY_WINDOW if is_summary(body) else CHAT_WINDOW
            if request_tokens(body) > window:  # R-BUD, R-RUN-9
                seen.fail(
                    f"request {index + i}: {request_tokens(body)} tokens over the window {window}:"
                    f" {[(m['role'], len(str(m.get('content')))) for m in body['messages']]}"
                    f" max_tokens {body.get('max_tokens')}, tools {len(body.get('tools') or [])}"
                )
            if is_summary(body):
                continue
            messages = body["messages"]
            where = [j for j, m in enumerate(messages) if INJECTION_HEAD in str(m.get("content"))]
            if len(where) > 1:
                seen.fail(f"request {index + i}: the summary injected {len(where)} times")
            if where:
                j = where[0]
                if not all(m["role"] == "system" for m in messages[:j]) or (
                    j + 1 < len(messages) and messages[j + 1]["role"] == "system"
                ):
                    seen.fail(f"request {index + i}: the summary is not the last system part")
        index += len(env.model.llm.requests)
    # R-MEM-2/3: nothing cleared reaches a model call made after the clear returned, by the
    # process that cleared. Another process's turn or run that read the history before the
    # clear is told only through the database: its runs ask before each summary request
    # (R-MEM-3), but a request sent just as the clear commits there cannot be recalled.
    for (after, removed, what), by in zip(seen.cleared_tags, seen.cleared_by, strict=True):
        for i, (purpose, sid, text) in enumerate(seen.calls[after:], after):
            if not sid.startswith(f"{by}:"):
                continue
            if leaked := tags(text) & removed:
                seen.fail(
                    f"{purpose} call {i} of {sid} after {what} (at {after}) carries cleared messages"
                    f" {sorted(leaked)[:5]}: {text[text.find(f't{min(leaked)}x') - 200 :][:400]!r}"
                )
    del everything


async def drive(make: Make, seed: int, location: Path | str | None, runtimes: int) -> Seen:
    models = Models(random.Random(seed), fail=0.12)
    envs = []
    for _ in range(runtimes):
        env = await make(
            chat={"context_window": CHAT_WINDOW, "max_output_tokens": 400},
            summary={"context_window": SUMMARY_WINDOW, "max_output_tokens": 1500},
            location=location,
            memsum_compress_at=0.5,
            memsum_history_limit=12,
            memsum_reply_max_tokens=400,
            memsum_persona="你是测试插件的助手。",
        )
        env.model.summary_default = models.summary
        env.model.chat_default = models.chat
        envs.append(env)
    world = World(envs, Seen(), random.Random(seed))
    for i, env in enumerate(envs):
        watch(world, env, f"rt{i}")
    await api_session_setup(envs[0])
    for round_no in range(4):
        actors = [actor(world, envs[i % len(envs)], f"rt{i % len(envs)}.a{i}", 12) for i in range(6)]
        try:
            await asyncio.wait_for(asyncio.gather(*actors), timeout=25)
        except TimeoutError:
            pytest.fail(f"seed {seed} round {round_no}: deadlock; last steps {world.seen.trace[-12:]}")
        for env in envs:
            await asyncio.wait_for(settle(env.rt), timeout=15)
        await check_store(world)
        if world.seen.running:
            world.seen.fail(f"round {round_no}: runs never ended: {world.seen.running}")
        for env in envs:
            for session in SESSIONS:
                if (await env.rt.compression.status(session.id)).running:
                    world.seen.fail(f"round {round_no}: {session.id} still shown as compressing")
        check_requests(world)
        if world.seen.failures:
            break
    return world.seen


async def api_session_setup(env: Env) -> None:
    _current.set(env.rt)
    await api.internal_session(TASK.id)
    await api.child_session(TASK.id, CHILD.id)


@pytest.mark.parametrize("seed", seeds([11, 90], [23, 47]))
async def test_random_api_tasks_on_sqlite_keep_the_invariants(
    make: Make, per_task_runtime: None, tmp_path: Path, seed: int
) -> None:
    seen = await drive(make, seed, tmp_path / "fa.db", runtimes=1)
    assert seen.failures == [], (seen.failures[:8], seen.trace[-20:])
    assert seen.done_summaries  # the run compressed at all


@pytest.mark.parametrize("seed", seeds([5, 31], [64]))
async def test_random_api_tasks_of_two_processes_on_postgresql_keep_the_invariants(
    pg_url: str, make: Make, per_task_runtime: None, seed: int
) -> None:
    # `pg_url` first: the runtimes close before the database is dropped.
    seen = await drive(make, seed, pg_url, runtimes=2)
    assert seen.failures == [], (seen.failures[:8], seen.trace[-20:])
    assert seen.done_summaries


# ---- regressions the random driver found, shrunk -------------------------------------------------
async def test_r_mem_3_a_run_begun_while_a_deletion_waited_for_the_turn_sends_nothing_deleted(
    make: Make, per_task_runtime: None
) -> None:
    # Another plugin deletes a session while its turn runs: the deletion waits for the turn.
    # Meanwhile a compression begins (a /压缩, or the background one the turn's end starts) and
    # reads the history, still whole. Once the deletion returned, that run must not send the
    # deleted conversation to the summariser, and ends as cancelled by the deletion
    # (「压缩期间会话被清空」), leaving no trace of the session. Before: it sent them, failed
    # with 「压缩期间历史被改动」 and wrote a compression record for the deleted session.
    env = await make()
    rt = env.rt
    _current.set(rt)
    await seed(rt, 6, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    turn, chat_gate = await held_turn(env, Reply("好的"))
    with chat_gate:
        deleting = asyncio.create_task(api.delete_session(sid))
        await until(lambda: rt.compression._commit_locks.locked(sid), "the deletion waits for the turn")
        started, release = asyncio.Event(), asyncio.Event()

        async def hold_start(p: CompressionProgress) -> None:
            if p.phase == "start":
                started.set()
                await release.wait()

        rt.bus.subscribe(CompressionProgress, hold_start)
        run = asyncio.create_task(api.compress(sid))
        await asyncio.wait_for(started.wait(), 10)  # its snapshot is read: the whole history
        chat_gate.open()
        await turn
        await asyncio.wait_for(deleting, 10)
    asked = len(env.model.summary_requests())
    release.set()
    with pytest.raises(api.CompressionError) as refused:
        await asyncio.wait_for(run, 10)
    assert str(refused.value) == CLEARED
    assert env.model.summary_requests()[asked:] == []
    assert await rt.store.get_meta(RUNS_NAMESPACE, sid) is None
    assert await rt.store.get_meta(SUMMARY_NAMESPACE, sid) is None
    assert await rt.store.get_history(sid) == []
    assert env.phases(sid)[-2:] == [("start", None), ("error", CLEARED)]


async def test_r_mem_2_a_clear_while_a_turn_builds_its_prompt_keeps_the_cleared_history_from_the_model(
    make: Make, per_task_runtime: None
) -> None:
    # Another plugin's prompt contribution takes a moment (it looks something up); meanwhile
    # the owner clears the context (/清除 上下文, api.clear) and the clear returns. The turn had
    # read the history before: it must not send the cleared conversation to the model now;
    # the question went with the clear, so the turn says nothing (as when the clear comes
    # while the model answers).
    env = await make()
    rt = env.rt
    _current.set(rt)
    said = await seed(rt, 4, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_weather(session_id: str) -> str:
        entered.set()
        await release.wait()
        return "今天晴"

    api.contribute("weather", slow_weather)
    replies: list[str] = []

    async def reply(text: str) -> None:
        replies.append(text)

    turn = asyncio.create_task(api.run_turn(sid, reply, api.Entry("onebot", "group")))
    await asyncio.wait_for(entered.wait(), 10)
    asked = len(env.model.chat_requests())
    await api.clear(sid, "context")
    release.set()
    outcome = await asyncio.wait_for(turn, 10)
    sent = [body_text(b) for b in env.model.chat_requests()[asked:]]
    assert not [t for t in sent if any(m.content in t for m in said)], sent
    assert outcome == "silent"
    assert replies == []
    assert await rt.store.get_history(sid) == []


async def test_r_mem_2_a_tool_result_that_comes_back_after_a_clear_is_not_stored(
    make: Make, per_task_runtime: None
) -> None:
    # The model asked for a tool (recall, or another plugin's lookup) and the tool takes a
    # moment; meanwhile the owner clears the context and the clear returns. The tool's result
    # answers a call the clear removed and holds what was read before it: it must not land
    # in the cleared history, where the next turn or compression would send it to the model.
    env = await make()
    rt = env.rt
    _current.set(rt)
    said = await seed(rt, 4, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    entered, release = asyncio.Event(), asyncio.Event()

    @api.tool("look_up", "查资料", {"type": "object", "properties": {}})
    async def look_up(ctx: api.ToolContext, args: dict[str, Any]) -> str:
        entered.set()
        await release.wait()
        return f"查到：{said[0].content}"

    call = {"id": "call_1", "name": "look_up", "arguments": "{}"}
    env.model.chat.append(Reply("", tool_calls=[call], finish_reason="tool_calls"))
    turn = asyncio.create_task(api.run_turn(sid, entry=api.Entry("onebot", "group")))
    await asyncio.wait_for(entered.wait(), 10)
    await api.clear(sid, "context")
    release.set()
    assert await asyncio.wait_for(turn, 10) == "silent"
    assert await rt.store.get_history(sid) == []
    # What comes next carries nothing of it.
    await api.record(SERVICE_GROUP, Message(role="user", content="[乙(20002)] 新话题"))
    asked = len(env.model.chat_requests())
    await api.run_turn(sid, entry=api.Entry("onebot", "group"))
    [request] = env.model.chat_requests()[asked:]
    assert said[0].content not in body_text(request)


@pytest.mark.parametrize("how", ["clear", "delete"])
async def test_r_mem_3_a_run_in_another_process_sends_nothing_cleared_there(
    pg_url: str, make: Make, per_task_runtime: None, how: str
) -> None:
    # Two bot processes on one PostgreSQL memory. One has begun compressing the group and read
    # its history; before its summary request goes out, the owner clears the group's context
    # (or a plugin deletes the session) through the other process, and that returns. The run
    # cannot be cancelled from there, but it must not send the cleared conversation to the
    # summariser afterwards: it ends cancelled (「压缩期间会话被清空」), having written nothing.
    first = await make(location=pg_url)
    second = await make(location=pg_url)
    _current.set(first.rt)
    said = await seed(first.rt, 6, record=SERVICE_GROUP)
    sid = SERVICE_GROUP.id
    started, release = asyncio.Event(), asyncio.Event()

    async def hold_start(p: CompressionProgress) -> None:
        if p.phase == "start":
            started.set()
            await release.wait()

    second.rt.bus.subscribe(CompressionProgress, hold_start)
    run = asyncio.create_task(second.rt.compression.compress(sid))
    await asyncio.wait_for(started.wait(), 10)  # it read the whole history
    if how == "clear":
        await api.clear(sid, "context")
    else:
        await api.delete_session(sid)
    release.set()
    with pytest.raises(api.CompressionError) as refused:
        await asyncio.wait_for(run, 10)
    assert str(refused.value) == CLEARED
    sent = [body_text(b) for b in second.model.summary_requests()]
    assert not [t for t in sent if any(m.content in t for m in said)]
    assert await first.rt.store.get_meta(SUMMARY_NAMESPACE, sid) is None
    assert await first.rt.store.get_history(sid) == []
    if how == "delete":  # no trace of the deleted session
        assert await first.rt.store.get_meta(RUNS_NAMESPACE, sid) is None


async def test_a_deletion_beside_another_process_s_commit_waits_for_it_not_a_deadlock(pg_url: str) -> None:
    # Two bot processes on one PostgreSQL memory: one commits a compression of the group (it
    # holds the session, then archives its messages) while a plugin in the other deletes the
    # session. The deletion waits for the commit and then removes everything; before, it began
    # deleting the messages without waiting, and PostgreSQL ended one of the two with
    # "deadlock detected" (api.delete_session raised StoreError).
    first, second = await open_store(pg_url), await open_store(pg_url)
    try:
        await first.save_session(SERVICE_GROUP)
        sid = SERVICE_GROUP.id
        for i in range(6):
            await first.append(sid, Message(role="user", content=f"[甲(20001)] 第{i}句", ts=1.0 + i))
        async with first.transaction() as tx:
            await tx._live().hold(sid)  # as the commit does (store.history_in)
            deleting = asyncio.create_task(second.delete_session(sid))
            for _ in range(200):  # until the deletion waits for a lock
                if deleting.done() or await raw(
                    pg_url,
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'",
                ):
                    break
                await asyncio.sleep(0.01)
            await tx.archive_span(sid, 6)
            await tx.put_meta(SUMMARY_NAMESPACE, sid, {"text": "摘要"})
        await asyncio.wait_for(deleting, 10)
        assert await first.get_history(sid) == []
        assert await first.get_archived(sid) == []
        assert await first.get_meta(SUMMARY_NAMESPACE, sid) is None
    finally:
        await first.close()
        await second.close()
