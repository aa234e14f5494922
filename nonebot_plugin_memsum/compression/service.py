"""The compression service: the full compression run, its trigger at turn end, the
back-off, clearing and the summary's injection. I/O around the pure core.

One run per session at a time (R-PROG-3). The commit (write summary, re-read and check
the history head, count rule, archive, divider) is ONE SQLite transaction, taken under
the session's turn lock so history never changes under a running turn; a crash at any
instant leaves the old state or the new one (R-RUN-11).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from nonebot.log import logger

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.agent.events import (
    CompressionProgress,
    EventBus,
    TurnEnded,
    TurnStarted,
    UsageEvent,
)
from nonebot_plugin_memsum.agent.prompt import Prompt
from nonebot_plugin_memsum.agent.tools import TodoProvider
from nonebot_plugin_memsum.agent.turn import Agent, Entry
from nonebot_plugin_memsum.compression.budget import budget_over_units, compression_line
from nonebot_plugin_memsum.compression.keep import apply_count_rule
from nonebot_plugin_memsum.compression.parse import parse_reply
from nonebot_plugin_memsum.compression.request import ChunkPlan, SummaryRequest
from nonebot_plugin_memsum.compression.templates import choose_template
from nonebot_plugin_memsum.compression.trigger import Backoff, UsageFacts, compression_due, usage_due
from nonebot_plugin_memsum.compression.units import (
    Estimators,
    Part,
    Unit,
    build_units,
    cut_before_question,
    cut_point,
    has_conversation,
    stored_text_tokens,
    text_tokens,
)
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.errors import CompressionCancelled, CompressionError
from nonebot_plugin_memsum.llm import (
    LLMClient,
    LLMError,
    LLMInputRefused,
    LLMLengthLimit,
    LLMStatusError,
    Registry,
    in_chinese,
    is_context_too_long,
)
from nonebot_plugin_memsum.llm.review import (
    PROBE_MAX_TOKENS,
    REVIEW_ROUNDS,
    ProbeLimit,
    find_refused,
    refused_by_review,
)
from nonebot_plugin_memsum.llm.tokens import estimate_stored, estimate_text_tokens, stored_content_tokens
from nonebot_plugin_memsum.lru import LRU, SESSIONS_KEPT, BoundedCache, KeyedLocks
from nonebot_plugin_memsum.settings import Settings
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, Store, StoreError
from nonebot_plugin_memsum.types import REFUSED_KEY, CompressionRecord, Message

RUNS_NAMESPACE = "compression"
BACKOFF_NAMESPACE = "backoff"
USAGE_NAMESPACE = "usage"
"""The back-off and the latest usage of a session, kept across restarts: a restart must not
hit a failing model again at once, and /摘要 shows the line it knew."""
USAGE_WRITE_DELAY = 1.0
"""Seconds the latest usage waits in memory before it is written (with every other session's)."""
CLEARS_NAMESPACE = "cleared"
"""With other processes on the database: a mark each clear writes in its own transaction, so
a run in another process sees at its commit that the session was cleared meanwhile (R-MEM-3)."""
DUE_NAMESPACE = "compression_due"
"""A compression that is queued or running; the mark outlives a crash, so start-up resumes it."""
DIVIDER = "对话已压缩"
BUSY = "这个会话正在压缩"
CLEARED = "压缩期间会话被清空"
CHANGED = "压缩期间历史被改动"
STOPPED = "机器人正在关闭，压缩已取消"
ABANDONED = "压缩被中途取消"
IN_TURN = "不能在本会话正在进行的回合里压缩它，请在回合结束后再压缩"
STORE_FAILED = "存储出错，压缩已回滚"
SUMMARY_REFUSED = "已有摘要未通过模型服务商的内容审核（对话本身可以通过），请用「/清除 摘要」清掉它"
TODOS_REFUSED = "任务列表未通过模型服务商的内容审核，摘要请求发不出去"
REFUSED_UNFOUND = "模型服务商的内容审核拒绝了摘要请求，但找不出是哪条消息"
# R-INJ-2: fixed, whatever the session.
INJECTION_HEAD = (
    "保留的原文（如有）按原来的时间顺序排在之后的历史开头，已在下面的摘要里概括过，不是摘要之后发生的。"
    "本会话较早对话的摘要："
)


SUMMARY_CACHE_BYTES = 8 << 20
"""What the summaries kept in memory may take (counted as `_summary_bytes`)."""


def _summary_bytes(record: dict[str, Any] | None) -> int:
    # The record's dict and its small fields, and the text (CJK: 2 bytes a character).
    return 400 + 2 * len(str((record or {}).get("text", "")))


async def conversation_end(read: Callable[[int], Awaitable[list[Message]]], want: int) -> list[Message]:
    """At least `want` conversation messages (or all there are) from `read(n)`, one end of
    the active history `n` messages long: n grows until enough of them are conversation."""
    if want <= 0:
        return []
    n = want * 2 + 8
    while True:
        got = await read(n)
        talk = [m for m in got if m.is_conversation]
        if len(talk) >= want or len(got) < n:
            return talk
        n *= 4


def run_estimators() -> Estimators:
    """The estimates of one compression run: the keep cost N (R-RUN-6), the measured
    capacity and the text estimate of one-line user messages (R-BUD-2) use the estimates
    stored per message. Its units are rendered for this run only, so
    their texts are remembered for the run (the plan estimates some several times), not
    in the shared estimate cache, where at a thousand groups they pushed out the texts
    that come back (issue 15)."""
    memo: dict[str, int] = {}

    def text(t: str) -> int:
        tokens = memo.get(t)
        if tokens is None:
            tokens = memo[t] = estimate_text_tokens(t, keep=False)
        return tokens

    return Estimators(text=text, msg=estimate_stored, content=stored_content_tokens)


class _ContextTooLong(Exception):
    """The provider refused a summary request as longer than its context."""

    def __init__(self, cause: LLMError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _InputRefused(Exception):
    """The provider's content review refused a summary request for its input."""

    def __init__(self, cause: LLMError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Cleared(Exception):
    """The session was cleared (R-MEM-3), or the bot shuts down, while the model had not answered."""


@dataclass(frozen=True, slots=True)
class CompressionResult:
    session_id: str
    outcome: Literal["done", "nothing"]
    tokens_before: int = 0
    tokens_after: int = 0
    kept_messages: int = 0
    archived: int = 0
    summary: str = ""


@dataclass(frozen=True, slots=True)
class LastRun:
    time: float
    outcome: Literal["done", "error"]
    reason: str | None
    kept_messages: int
    archived: int


@dataclass(frozen=True, slots=True)
class SessionStatus:
    summary: str | None
    summary_time: float | None
    kept_messages: int
    last_run: LastRun | None
    running: bool
    usage: int | None
    line: int | None
    window: int | None
    compress_at: float
    history_limit: int
    active_messages: int
    backoff_failures: int
    backoff_turns_left: int
    compress_at_layer: str = "global"
    history_limit_layer: str = "global"
    """Where `compress_at` and `history_limit` come from (a key of settings.LAYER_LABELS)."""


@dataclass(slots=True)
class _Run:
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    committing: bool = False
    reason: str = CLEARED
    """Why `cancelled` was set: a clear (R-MEM-3) or the shutdown."""
    deleted: bool = False
    """Cancelled by the session's deletion: the run leaves no trace in the store."""
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    requests: int = 0
    line: int | None = None
    """The compression line the run's budget was taken from, for its history row."""
    in_turn: bool = False
    """Run by the session's own turn, which holds the turn lock (`make_room`)."""
    question: int | None = None
    """In a turn (or a run resumed at start-up): the stored id of its earliest unanswered
    question; the span ends before it."""
    entry: Entry | None = None
    """In a turn: the entry of the request it makes room for."""
    clear_mark: Any = None
    """The session's clear mark when the run began (CLEARS_NAMESPACE; shared stores only)."""
    reading: bool = False
    """It has begun to read its snapshot: a clear or deletion committed after that overtook it."""


def _facts(usage: UsageEvent, turn_id: str | None = None) -> UsageFacts:
    """What the trigger judges of a usage event (`turn_id`: in place of the event's own)."""
    return UsageFacts(
        turn_id=turn_id or usage.turn_id,
        usage=usage.usage,
        window=usage.window,
        trim_budget=usage.trim_budget,
        trimmed=usage.trimmed,
        untrimmed_history=usage.untrimmed_history,
        history_messages=usage.history_messages,
        history_limit=usage.history_limit,
        platform=usage.platform,
        platform_type=usage.platform_type,
    )


def same_item(a: Message, b: Message) -> bool:
    """R-RUN-11: timestamp, role, content, tool call ids and whether it was withdrawn (a
    withdrawal during the run: the summary may hold its text, so the run fails once and the
    next renders it withdrawn). The very same object: both reads came from the history cache,
    which holds what the database holds."""
    return a is b or (
        a.id == b.id
        and a.withdrawn == b.withdrawn
        and a.ts == b.ts
        and a.role == b.role
        and a.content == b.content
        and [c.id for c in a.tool_calls] == [c.id for c in b.tool_calls]
    )


def kept_indexes(units: Sequence[Unit]) -> list[int]:
    return sorted(i for u in units for i in u.indexes)


@dataclass
class CompressionService:
    store: Store
    client: LLMClient
    registry: Registry
    bus: EventBus
    config: Config
    settings: Settings
    agent: Agent
    todos: TodoProvider | None
    is_owner: Callable[[str], bool] | None
    # Per session and bounded (lru.py): an evicted session starts again as after a restart
    # (no usage yet: R-BUD-6; no back-off; its next turn is not judged once).
    _latest_turn_usage: LRU[str, UsageEvent] = field(default_factory=LRU)
    _latest_usage: LRU[str, UsageEvent] = field(default_factory=LRU)
    _summaries: BoundedCache[str, tuple[dict[str, Any] | None]] = field(
        default_factory=lambda: BoundedCache(
            max_entries=SESSIONS_KEPT,
            max_bytes=SUMMARY_CACHE_BYTES,
            idle_seconds=math.inf,
            size=lambda _, record: _summary_bytes(record[0]),
        )
    )
    """Summary records read lately (`summary`), bounded in bytes: a summary's length follows
    the model's window, not a constant (the record in a 1-tuple: None is a cached answer)."""
    _unsaved_usage: dict[str, UsageEvent] = field(default_factory=dict)
    """Turn usages not written yet (`write_usage`)."""
    _usage_timer: asyncio.TimerHandle | None = None
    _usage_writes: set[asyncio.Task[None]] = field(default_factory=set)
    _epoch: LRU[str, int] = field(default_factory=LRU)
    _turn_epoch: dict[str, int] = field(default_factory=dict)
    _backoff: LRU[str, Backoff] = field(default_factory=LRU)
    """Back-offs read or written so far (a fresh `Backoff()` when the store has none)."""
    _runs: dict[str, _Run] = field(default_factory=dict)
    _commit_locks: KeyedLocks = field(default_factory=KeyedLocks)
    _background: set[asyncio.Task[Any]] = field(default_factory=set)
    _judging: set[str] = field(default_factory=set)
    """仅记录 sessions whose stored history is being judged (judge_recorded)."""
    _queue: list[tuple[float, str]] = field(default_factory=list)
    """Due compressions waiting for a free slot: a heap, oldest due first."""
    _queued: dict[str, int] = field(default_factory=dict)
    """The queued sessions and their epoch then: a compression or clear since makes the
    queued run needless (R-TRIG-5: a usage overtaken by a compression or clear is not judged)."""
    _marked: set[str] = field(default_factory=set)
    """Sessions whose due mark is stored."""
    _resumed: set[str] = field(default_factory=set)
    """Sessions whose run `resume` queued again: it ends before the questions the stop or
    crash left unanswered (issue 15: answered as if the process had not died)."""
    _slots: int = 0
    """Queue workers running (at most memsum_compress_concurrency)."""

    def attach(self) -> None:
        """Listen to the agent's events and inject the summary into its prompts."""
        self.bus.subscribe(UsageEvent, self._on_usage)
        self.bus.subscribe(TurnStarted, self._on_turn_started)
        self.bus.subscribe(TurnEnded, self._on_turn_ended)
        self.agent.inject_summary(self.injection)
        self.agent.on_trim(self.make_room)

    async def shutdown(self) -> None:
        """Abandon the runs still waiting on the model and wait for every run to end, as
        the store closes next. NoneBot shields a command from cancellation, so a manual
        run left alone would hold the shutdown for the whole model timeout."""
        self._queue.clear()
        self._queued.clear()
        for run in self._runs.values():
            if not run.committing:
                run.reason = STOPPED
                run.cancelled.set()
        if self._usage_timer is not None:
            self._usage_timer.cancel()
            self._usage_timer = None
        await asyncio.gather(*self._usage_writes, return_exceptions=True)
        await self.write_usage()
        tasks = list(self._background)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(run.finished.wait() for run in list(self._runs.values())))

    # ---- public API ------------------------------------------------------------------
    def is_running(self, session_id: str) -> bool:
        return session_id in self._runs

    async def compress(self, session_id: str) -> CompressionResult:
        """Manual compression (R-PROG-3: refused while one runs).

        Refused from inside this session's own turn (a tool, a prompt contribution): its
        commit waits for the turn to end (R-TRIG-5), and the turn waits for this call.
        A StoreError of the commit comes out as it is, after the rollback (R-RUN-11).
        """
        if self.agent.is_turn_task(session_id):
            raise CompressionError(IN_TURN)
        if session_id in self._runs:
            raise CompressionError(BUSY)
        return await self._run(session_id, _Run())

    async def resume(self, prefix: str = "") -> int:
        """Queue again the compressions a stop or a crash interrupted (of the sessions whose
        id starts with `prefix`); how many."""
        due = {k: v for k, v in (await self.store.list_meta(DUE_NAMESPACE)).items() if k.startswith(prefix)}
        for session_id, mark in sorted(due.items(), key=lambda kv: float(kv[1].get("due", 0))):
            self._marked.add(session_id)
            self._resumed.add(session_id)
            self._enqueue(session_id, float(mark.get("due", 0)))
        return len(due)

    async def compress_at(
        self, session_id: str, platform: str | None = None, platform_type: str | None = None
    ) -> float | None:
        """R-CFG-4: the session's effective compress_at, None when it is 0."""
        resolved = await self.settings.effective(
            "compress_at", session_id, entry_platform=platform, entry_type=platform_type
        )
        return float(resolved.value) or None

    async def clear(self, session_id: str, kind: Literal["context", "summary"]) -> None:
        """R-MEM-2/3: cancel a run still waiting on the model; wait for a commit in progress."""
        if kind not in ("context", "summary"):  # before a run is cancelled for nothing
            raise ValueError(f"unknown clear kind {kind!r}; allowed: context, summary")
        run = self._runs.get(session_id)
        # Called from inside this session's turn (a tool, another plugin): a commit then
        # waits for this very turn and has written nothing, so it is cancelled, not
        # awaited; waiting for it would wait forever.
        inside_turn = self.agent.is_turn_task(session_id)
        if run is not None and (not run.committing or inside_turn):
            run.cancelled.set()
        if kind == "context":
            await self._forget_usage(session_id)  # none written after the clear's commit
        if inside_turn:
            await self._clear_store(session_id, kind)
            self._cancel_overtaken(session_id, run)
        else:
            async with self._commit_locks.hold(session_id):
                await self._clear_store(session_id, kind)
                self._cancel_overtaken(session_id, run)
            if run is not None and not run.cancelled.is_set():
                await run.finished.wait()  # the run whose commit it waited for has reported `done`
        self._summaries.pop(session_id)
        self._epoch[session_id] = self._epoch.get(session_id, 0) + 1
        self._backoff[session_id] = Backoff()  # R-BACK-4 (the stored one went with the clear)
        self._latest_turn_usage.pop(session_id, None)
        if kind == "context":
            self._latest_usage.pop(session_id, None)
            self.agent.context_cleared(session_id)

    async def _clear_store(self, session_id: str, kind: Literal["context", "summary"]) -> None:
        """The clear in the store, in one commit with what it forgets: the back-off (R-BACK-4)
        and, with the context, the latest usage; a crash just after it leaves neither behind.
        With other processes on the database, with a new clear mark too: their runs of this
        session cannot be cancelled from here, so their commits check it."""
        async with self.store.transaction() as tx:
            await tx.clear(session_id, kind)
            await tx.delete_meta(BACKOFF_NAMESPACE, session_id)
            if kind == "context":
                await tx.delete_meta(USAGE_NAMESPACE, session_id)
            if self.store.shared:
                await tx.put_meta(CLEARS_NAMESPACE, session_id, uuid.uuid4().hex)

    async def delete_session(self, session_id: str) -> None:
        """R-MEM-2/3, R-BACK-4: cancel a run still waiting on the model (wait for one that
        commits), wait for a running turn, then delete the session and all it stored: history,
        summary, back-off, usage, its own settings."""
        run = self._runs.get(session_id)
        inside_turn = self.agent.is_turn_task(session_id)
        if run is not None:
            run.deleted = True
            if not run.committing or inside_turn:
                run.cancelled.set()
            if not inside_turn:  # it writes its outcome after the commit: let it end first
                await run.finished.wait()
        if inside_turn:
            await self._forget_usage(session_id)
            await self.store.delete_session(session_id)
            self._cancel_overtaken(session_id, run, deleted=True)
        else:
            async with self._commit_locks.hold(session_id), self.agent.turn_lock(session_id):
                await self._forget_usage(session_id)
                await self.store.delete_session(session_id)
                self._cancel_overtaken(session_id, run, deleted=True)
        self._summaries.pop(session_id)
        self._epoch[session_id] = self._epoch.get(session_id, 0) + 1
        self._backoff.pop(session_id, None)
        self._latest_turn_usage.pop(session_id, None)
        self._latest_usage.pop(session_id, None)
        self.settings.forget_session(session_id)

    def _cancel_overtaken(self, session_id: str, seen: _Run | None, *, deleted: bool = False) -> None:
        """R-MEM-3: a run that began while this clear or deletion waited (for a commit, for the
        turn) and has read its snapshot holds what was just removed: cancelled as a clear
        cancels one, so it sends none of it to the summariser and commits nothing (not failed
        with 「压缩期间历史被改动」, which backs off, nor a trace of a deleted session)."""
        later = self._runs.get(session_id)
        if later is None or later is seen or not later.reading or later.committing:
            return
        later.deleted = later.deleted or deleted
        later.cancelled.set()

    async def kept_originals(self, session_id: str, kept: int) -> list[Message]:
        """The originals the summary in force kept (R-RUN-12): the first `kept` conversation
        messages of the active history (the compression archived the rest of what it read; what
        was said while it ran comes after them, and was never read). `kept` is the summary's own
        count (`status().kept_messages`): 0 once the summary is cleared."""
        head = await conversation_end(lambda n: self.store.first_active(session_id, n), kept)
        return head[:kept]

    async def summary(self, session_id: str) -> dict[str, Any] | None:
        """The stored summary record; kept in memory between its writes (every prompt injects
        it), unless other processes write the same memory."""
        if not self.store.shared and (cached := self._summaries.get(session_id)) is not None:
            return cached[0]
        record = await self.store.get_meta(SUMMARY_NAMESPACE, session_id)
        self._summaries.put(session_id, (record,), math.inf)
        return record

    async def injection(self, session_id: str) -> str | None:
        """R-INJ-1/2: the whole summary, with the fixed first sentence; never cut."""
        record = await self.summary(session_id)
        if not record or not record.get("text"):
            return None
        return f"{INJECTION_HEAD}\n\n{record['text']}"

    async def status(self, session_id: str) -> SessionStatus:
        record = await self.summary(session_id) or {}
        raw_run = await self.store.get_meta(RUNS_NAMESPACE, session_id)
        last = LastRun(**raw_run) if raw_run else None
        usage = await self._usage(session_id)
        entry = (usage.platform, usage.platform_type) if usage else (None, None)
        compress_at = await self.settings.effective(
            "compress_at", session_id, entry_platform=entry[0], entry_type=entry[1]
        )
        limit = await self.settings.effective(
            "history_limit", session_id, entry_platform=entry[0], entry_type=entry[1]
        )
        line = None
        if usage is not None:
            e = compression_line(compress_at.value, usage.window, usage.trim_budget)
            line = int(e) if e is not None and compress_at.value else None
        backoff = await self._backoff_of(session_id)
        return SessionStatus(
            summary=record.get("text"),
            summary_time=record.get("time"),
            kept_messages=int(record.get("kept_messages", 0)),
            last_run=last,
            running=self.is_running(session_id),
            usage=usage.usage if usage else None,
            line=line,
            window=usage.window if usage else None,
            compress_at=float(compress_at.value),
            history_limit=int(limit.value),
            active_messages=await self.store.count_active(session_id),
            backoff_failures=backoff.failures,
            backoff_turns_left=max(0, backoff.wait - backoff.turns_waited) if backoff.failures else 0,
            compress_at_layer=compress_at.layer,
            history_limit_layer=limit.layer,
        )

    # ---- the trigger (R-TRIG) ----------------------------------------------------------
    async def _on_usage(self, event: UsageEvent) -> None:
        if event.turn_id is not None:
            self._latest_turn_usage[event.session_id] = event
        await self._keep_usage(event)

    async def _keep_usage(self, event: UsageEvent) -> None:
        """The session's latest usage, a request's snapshot too (R-TRIG-1: every usage, for
        the budget; /摘要 shows it): the one stored, so that a clear or a deletion in another
        process forgets it with the rest, and a restart reads what was read before it."""
        self._latest_usage[event.session_id] = event
        if self.store.shared:  # other processes read it at once (`_usage`)
            await self.store.put_meta(USAGE_NAMESPACE, event.session_id, asdict(event))
            return
        # Kept for a restart (R-BUD-6's line, /摘要), written within a second with every
        # other session's: no trip to the database per model call (issue 9).
        self._unsaved_usage[event.session_id] = event
        if self._usage_timer is None:
            loop = asyncio.get_running_loop()
            self._usage_timer = loop.call_later(USAGE_WRITE_DELAY, self._write_usage_soon)

    def _write_usage_soon(self) -> None:
        self._usage_timer = None
        task = asyncio.create_task(self.write_usage(), name="memsum-usage-write")
        self._usage_writes.add(task)
        task.add_done_callback(self._usage_writes.discard)

    async def write_usage(self) -> None:
        """Write the usages waiting in memory, in one transaction."""
        pending, self._unsaved_usage = self._unsaved_usage, {}
        if not pending:
            return
        try:
            async with self.store.transaction() as tx:
                for session_id, event in pending.items():
                    await tx.put_meta(USAGE_NAMESPACE, session_id, asdict(event))
        except Exception as err:  # only a restart's figure is lost
            logger.warning(f"memsum: could not write the latest usage: {type(err).__name__}: {err}")

    async def _forget_usage(self, session_id: str) -> None:
        """Before the stored usage is deleted: none waiting, none being written after it."""
        self._unsaved_usage.pop(session_id, None)
        await asyncio.gather(*self._usage_writes, return_exceptions=True)

    async def _on_turn_started(self, event: TurnStarted) -> None:
        self._turn_epoch[event.turn_id] = self._epoch.get(event.session_id, 0)

    async def _on_turn_ended(self, event: TurnEnded) -> None:
        sid = event.session_id
        epoch_at_start = self._turn_epoch.pop(event.turn_id, None)
        if event.outcome in ("aborted", "error"):  # R-TRIG-2
            return
        usage = self._latest_turn_usage.get(sid)
        # R-TRIG-5: a usage from an earlier turn, or a turn overtaken by a compression or clear
        if usage is None or usage.turn_id != event.turn_id or epoch_at_start != self._epoch.get(sid, 0):
            return
        if sid in self._runs:
            return
        backoff = await self._set_backoff(sid, (await self._backoff_of(sid)).on_judged_turn())
        compress_at = await self.compress_at(sid, usage.platform, usage.platform_type)
        if not compression_due(_facts(usage), compress_at, event.outcome) or not backoff.may_run():
            return
        await self._start_background(sid)

    async def make_room(self, session_id: str, entry: Entry, prompt: Prompt, question: int | None) -> bool:
        """Issue 9: a turn about to send a hard-trimmed request compresses first, when
        R-TRIG-3 would start a compression after it anyway (the usage line on, E / 2
        compressible, no back-off waiting): the same run one request earlier, so the
        turn that compresses is not the turn that is trimmed. The turn waits for it.

        Unlike a background run (R-RUN-1: the span ends at the snapshot's end), this run
        ends its span before `question`, the turn's earliest unanswered question: the
        reason for the turn must reach the model verbatim, not only through the summary.
        R-TRIG-3's E / 2 is judged on what lies before that cut, since only that can be
        compressed; below it the turn is sent hard-trimmed instead (the trim keeps the
        newest messages, so the question is sent) and its end is judged as usual.
        """
        model = self.registry.resolve("chat")
        if model is None or session_id in self._runs:
            return False  # a background run commits after this turn
        if not (await self._backoff_of(session_id)).may_run():
            return False
        history = await self.store.get_history(session_id)
        end = cut_point(history) if question is None else cut_before_question(history, question)
        compressible = sum(estimate_stored(m) for m in history[:end] if m.is_conversation)
        at = await self.compress_at(session_id, entry.platform, entry.platform_type)
        line = compression_line(at, model.context_window, self.agent.trim_budget_of(model))
        record = await self.summary(session_id) or {}
        summary_tokens = estimate_text_tokens(str(record.get("text", "")))
        if line is not None and 2 * summary_tokens >= line:
            # A summary written under a larger line (a smaller chat model now, a lower
            # compress_at) is itself what no longer fits: a run rewrites it within this line's
            # budget (≤ E / 4, max_tokens ≤ 1.5 × that, so under E / 2: no second run for
            # it). Left alone, the hard trim cut every question down to nothing.
            compressible += summary_tokens
        facts = UsageFacts(
            turn_id="make_room",
            usage=prompt.estimate,
            window=model.context_window,
            trim_budget=self.agent.trim_budget_of(model),
            trimmed=True,
            untrimmed_history=compressible,
            history_messages=0,
            history_limit=None,
            platform=entry.platform,
            platform_type=entry.platform_type,
        )
        if not usage_due(facts, at):
            return False
        if session_id in self._runs:  # R-PROG-3: a run (a /压缩) began while this turn decided
            return False
        result = await self._run_counted(session_id, _Run(in_turn=True, question=question, entry=entry))
        return result is not None and result.outcome == "done"

    async def _start_background(self, sid: str) -> None:
        """Queue a due compression, marked first so a crash cannot forget it."""
        if sid in self._queued:
            return
        await self._mark_due(sid, clock.now())
        self._enqueue(sid, clock.now())

    # ---- the queue: at most memsum_compress_concurrency runs at once, oldest due first ----
    def _enqueue(self, session_id: str, due: float) -> None:
        if session_id in self._queued:
            return
        self._queued[session_id] = self._epoch.get(session_id, 0)
        heapq.heappush(self._queue, (due, session_id))
        while self._slots < self.config.memsum_compress_concurrency and self._slots < len(self._queue):
            self._slots += 1
            task = asyncio.create_task(self._drain_queue(), name="memsum-compress-queue")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _drain_queue(self) -> None:
        try:
            while self._queue:
                _, session_id = heapq.heappop(self._queue)
                epoch = self._queued.pop(session_id)
                if epoch == self._epoch.get(session_id, 0):
                    await self._background_run(session_id)
                elif session_id not in self._runs:  # done or cleared meanwhile: a request saved
                    await self._unmark_due(session_id)
        finally:
            self._slots -= 1

    async def _mark_due(self, session_id: str, due: float) -> None:
        if session_id in self._marked:
            return
        try:
            await self.store.put_meta(DUE_NAMESPACE, session_id, {"due": due})
            self._marked.add(session_id)
        except Exception as err:  # the run still happens; only a crash would forget it
            logger.warning(f"memsum: could not mark the compression of {session_id} as due: {err}")

    async def _unmark_due(self, session_id: str) -> None:
        if session_id not in self._marked:
            return
        try:
            await self.store.delete_meta(DUE_NAMESPACE, session_id)
            self._marked.discard(session_id)
        except Exception as err:  # a stale mark only costs one needless run after a restart
            logger.warning(f"memsum: could not clear the compression mark of {session_id}: {err}")

    async def judge_recorded(self, session_id: str, entry: Entry) -> None:
        """A 仅记录 place has no turns, so no turn end judges it: judge its stored history
        after each recorded message as a turn would see it, the prompt's estimate standing
        in for the usage a model would report (R-TRIG-3/4; the back-off as for a turn)."""
        model = self.registry.resolve("chat")
        if model is None or session_id in self._runs or session_id in self._judging:
            return
        self._judging.add(session_id)  # a burst needs one judgement at a time, not one each
        try:
            prompt = await self.agent.build_prompt(session_id, entry, with_tools=False)
            compress_at = await self.compress_at(session_id, entry.platform, entry.platform_type)
            trim_budget = self.agent.trim_budget_of(model)
            line = compression_line(compress_at, model.context_window, trim_budget)
            # The estimate stands in for the usage of the budget too, as a snapshot would
            # (R-TRIG-1): the run it starts, or a /压缩 after it, writes to the line that
            # judged it (R-BUD-1), not to ⅔ of the summary model's cap (R-BUD-6).
            usage = UsageEvent(
                session_id=session_id,
                turn_id=None,
                platform=entry.platform,
                platform_type=entry.platform_type,
                model_id=model.id,
                window=model.context_window,
                trim_budget=trim_budget,
                usage=prompt.estimate,
                trimmed=prompt.trimmed,
                untrimmed_history=prompt.untrimmed_history,
                history_messages=await self.store.count_active(session_id),
                history_limit=await self.agent.history_limit(session_id, entry),
                line=int(line) if line is not None and compress_at else None,
            )
            await self._keep_usage(usage)
            facts = _facts(usage, turn_id="recorded")
            backoff = await self._set_backoff(
                session_id, (await self._backoff_of(session_id)).on_judged_turn()
            )
            if compression_due(facts, compress_at, "silent") and backoff.may_run():
                await self._start_background(session_id)
        finally:
            self._judging.discard(session_id)

    async def _background_run(self, session_id: str) -> None:
        question = await self._left_unanswered(session_id) if session_id in self._resumed else None
        self._resumed.discard(session_id)
        # R-PROG-3: the background skips. Asked after the await above, with nothing awaited
        # before `_run` takes the session: a /压缩 begun meanwhile is the session's one run.
        if session_id in self._runs:
            return
        await self._run_counted(session_id, _Run(question=question))

    async def _left_unanswered(self, session_id: str) -> int | None:
        """The earliest question within the resume window the session has no answer to yet.
        A run cut by a stop or crash took its snapshot before such a question came; run again
        at start-up it ends before it (as a turn's own run does), so the question stays active
        for the turn that answers it (`Store.pending_questions` reads active messages only):
        archived, it was never answered."""
        window = self.config.memsum_resume_window
        if window <= 0:
            return None
        try:
            found = await self.store.pending_questions(clock.now() - window, session_id)
        except StoreError:
            return None  # the run reads the history next and reports the store's failure
        return next((m.id for sid, m in found if sid == session_id and m.id is not None), None)

    async def _run_counted(self, session_id: str, run: _Run) -> CompressionResult | None:
        """A run nobody awaits the error of: a failure backs off (R-BACK-3); None then."""
        try:
            return await self._run(session_id, run)
        except (CompressionError, StoreError) as err:  # warned about in the run already
            # R-BACK-4: a run cancelled by a clear is no failure; a deleted session keeps nothing
            if not isinstance(err, CompressionCancelled) and not run.deleted:
                await self._set_backoff(session_id, (await self._backoff_of(session_id)).on_failure())
        except Exception:
            logger.exception(f"memsum: background compression of {session_id} crashed")
            await self._set_backoff(session_id, (await self._backoff_of(session_id)).on_failure())
        return None

    # ---- the run (R-RUN, R-FAIL, R-PROG) ------------------------------------------------
    async def _run(self, session_id: str, run: _Run) -> CompressionResult:
        self._runs[session_id] = run
        started = time.perf_counter()
        try:
            # R-PROG-3 across processes: one run per session among all processes on one
            # database (PostgreSQL), held until the run ends, freed if this process dies.
            async with self.store.exclusive(session_id) as mine:
                if not mine:  # skipped in the background (no failure), refused when manual
                    logger.debug(f"memsum: {session_id} is being compressed by another process")
                    raise CompressionCancelled(BUSY)
                result = await self._marked_run(session_id, run)
        finally:
            self._runs.pop(session_id, None)
            run.finished.set()
        if result.outcome == "done":  # the one INFO line of a compression (failures warn)
            logger.info(
                f"memsum: compression {session_id} done in {(time.perf_counter() - started) * 1000:.0f} ms:"
                f" {result.archived} archived, {result.kept_messages} kept,"
                f" tokens {result.tokens_before} -> {result.tokens_after}"
            )
        return result

    async def _marked_run(self, session_id: str, run: _Run) -> CompressionResult:
        """The run, marked as due while it lasts: a crash leaves the mark, and the next start
        queues it again."""
        try:
            await self._mark_due(session_id, clock.now())  # a manual run resumes after a crash too
            result = await self._run_inner(session_id, run)
        except CompressionError as err:
            if str(err) != STOPPED:  # a stopped run resumes at the next start
                await self._unmark_due(session_id)
            raise
        await self._unmark_due(session_id)
        return result

    async def _run_inner(self, session_id: str, run: _Run) -> CompressionResult:
        try:
            run.reading = True  # from here a clear or deletion that commits overtakes it
            if self.store.shared:  # R-MEM-3 across processes: a clear there changes the mark
                run.clear_mark = await self.store.get_meta(CLEARS_NAMESPACE, session_id)
            snapshot = await self.store.get_history(session_id)  # R-RUN-1
        except Exception as err:  # R-PROG-2: failing before start: no events
            logger.warning(f"memsum: cannot read the history of {session_id}: {err}")
            raise CompressionError("读不出会话历史") from err
        # R-RUN-1; a run inside a turn ends before the turn's question (make_room). The commit's
        # check (R-RUN-11: the re-read head equals the span) and its count after the cut
        # (R-BACK-2: the question and what follows) hold for the shorter span as they are.
        end = cut_point(snapshot) if run.question is None else cut_before_question(snapshot, run.question)
        span = snapshot[:end]
        # Rendering a long span is CPU in one go (5,000 messages: ~90 ms): off the loop.
        units = await asyncio.to_thread(build_units, span)
        if not has_conversation(units):  # R-PROG-2: nothing to do, no events
            return CompressionResult(session_id, "nothing")
        await self.bus.emit(CompressionProgress(session_id, "start"))
        try:
            result = await self._summarise_and_commit(session_id, run, snapshot, span, units)
        except CompressionError as err:
            await self._failed(session_id, run, str(err))
            raise
        except _Cleared:
            await self._failed(session_id, run, run.reason)
            raise CompressionCancelled(run.reason) from None
        except asyncio.CancelledError:
            # R-PROG-1: a run that reported `start` and did not succeed ends with `error`, also
            # when the task running it is cancelled (a turn aborted as the bot stops, a caller's
            # timeout); the commit's transaction has rolled back. No back-off: no failure.
            await self._failed(session_id, run, run.reason if run.cancelled.is_set() else ABANDONED)
            raise
        except StoreError as err:  # R-RUN-11: rolled back; the store's own error, as it is
            await self._failed(session_id, run, STORE_FAILED, err)
            raise
        except Exception as err:
            reason = f"内部错误：{type(err).__name__}"
            await self._failed(session_id, run, reason, err)
            raise CompressionError(reason) from err
        self._epoch[session_id] = self._epoch.get(session_id, 0) + 1
        await self._set_backoff(session_id, Backoff())  # R-BACK-4
        await self._remember_run(
            session_id, LastRun(clock.now(), "done", None, result.kept_messages, result.archived), run, result
        )
        await self.bus.emit(CompressionProgress(session_id, "done"))
        return result

    async def _failed(
        self,
        session_id: str,
        run: _Run,
        reason: str,
        err: BaseException | None = None,
    ) -> None:
        """R-FAIL-1: one warning (with the traceback of an unexpected error), an `error` event."""
        logger.opt(exception=err).warning(f"memsum: compression of {session_id} failed: {reason}")
        if not run.deleted and self.store.shared:  # deleted by another process meanwhile?
            with contextlib.suppress(Exception):  # a store that fails now fails the next write too
                async with self.store.transaction() as tx:  # not the record cached here
                    run.deleted = await tx.get_session(session_id) is None  # then no trace
        if not run.deleted:
            await self._remember_run(session_id, LastRun(clock.now(), "error", reason, 0, 0), run)
        await self.bus.emit(CompressionProgress(session_id, "error", reason))

    async def _remember_run(
        self, session_id: str, last: LastRun, run: _Run, result: CompressionResult | None = None
    ) -> None:
        """The last run (for /摘要) and a row of the compression history (for the web page)."""
        try:
            # One transaction: the row and the last run agree, and a clear waiting for this
            # run's commit (R-MEM-3) comes after both.
            async with self.store.transaction() as tx:
                await tx.record_compression(
                    CompressionRecord(
                        session_id,
                        last.time,
                        last.outcome,
                        last.reason,
                        result.tokens_before if result else None,
                        result.tokens_after if result else None,
                        last.kept_messages,
                        last.archived,
                        run.requests,
                        run.line,
                    )
                )
                await tx.put_meta(
                    RUNS_NAMESPACE,
                    session_id,
                    {
                        "time": last.time,
                        "outcome": last.outcome,
                        "reason": last.reason,
                        "kept_messages": last.kept_messages,
                        "archived": last.archived,
                    },
                )
        except Exception as err:
            logger.warning(f"memsum: could not record the compression outcome: {err}")

    async def _summarise_and_commit(
        self, session_id: str, run: _Run, snapshot: list[Message], span: list[Message], units: list[Unit]
    ) -> CompressionResult:
        model = self.registry.resolve("summary")
        if model is None:  # R-FAIL-1: name the preference that points nowhere
            missing = self.registry.missing_preferences("summary")
            raise CompressionError(f"摘要模型 {missing[0]} 不可用" if missing else "没有可用的摘要模型")
        old = await self.summary(session_id) or {}
        old_text = str(old.get("text", ""))
        record = await self.store.get_session(session_id)
        template = choose_template(record, self.is_owner)
        todos = None
        if template.name == "work" and self.todos is not None:  # R-RUN-4
            todos = [(i.status, i.title) for i in await self.todos.items(session_id)]
        usage = await self._usage(session_id)
        chat = self.registry.resolve("chat")
        line = None
        if run.entry is not None and chat is not None:
            # In a turn: the request the run makes room for is the latest usage (R-TRIG-1's
            # snapshot, not emitted yet). Before a new model's first usage the line would
            # otherwise be the old model's, or none at all (R-BUD-6: up to ⅔ of the summary
            # model's cap), and the summary written could itself pass the new line.
            at = await self.compress_at(session_id, run.entry.platform, run.entry.platform_type)
            line = compression_line(at, chat.context_window, self.agent.trim_budget_of(chat))
        elif usage is not None:  # R-BUD-1/6: the line of the latest usage, if any
            at = await self.compress_at(session_id, usage.platform, usage.platform_type)
            line = compression_line(at, usage.window, usage.trim_budget)
        run.line = int(line) if line is not None else None
        est = run_estimators()

        def start_plan() -> ChunkPlan:  # estimates and numbering of the whole span: off the loop
            budget = budget_over_units(
                least_units_tokens=stored_text_tokens(units, est),
                units_tokens=lambda: text_tokens(units, est),
                line=line,
                ratio=self.config.memsum_summary_budget_ratio,
                summary_window=model.context_window,
                summary_max_output=model.max_output_tokens,
                existing_summary_tokens=estimate_text_tokens(old_text),
            )
            return ChunkPlan.start(
                units=units,
                template=template,
                budget=budget,
                summary_window=model.context_window,
                existing_summary=old_text,
                todos=todos,
                est=est,
                rule=self.config.memsum_capacity,
            )

        plan = await asyncio.to_thread(start_plan)
        effort = model.thinking_levels[0] if model.thinking_levels else None  # R-RUN-5: shallowest
        rounds = 0
        while not plan.done:
            request = plan.next_request()
            try:
                reply = await self._ask(run, model, request.messages, request.max_tokens, effort, session_id)
            except _InputRefused as err:
                # The provider's content review refused something in it: find the message(s),
                # send them as a placeholder from now on (also in chat), and start again.
                rounds += 1
                if rounds > REVIEW_ROUNDS:
                    raise CompressionError(f"摘要模型出错：{in_chinese(err.cause)}") from None
                marked = await self._leave_out_refused(session_id, run, model, plan, request, effort)
                span = [marked.get(m.id, m) if m.id is not None else m for m in span]
                units = await asyncio.to_thread(build_units, span)
                plan = await asyncio.to_thread(start_plan)
                continue
            except _ContextTooLong as err:
                if plan.rule == "spec":
                    raise CompressionError(f"摘要模型出错：{in_chinese(err.cause)}") from None
                # The provider's tokenizer counts more than the margin allows: that request
                # again, and the rest of the run, under R-RUN-9's literal rule.
                logger.info(f"memsum: {session_id}: {err}; retrying under the literal capacity rule")
                plan = plan.under_spec_rule()
                continue
            plan = plan.after_reply(parse_reply(reply))
        outcome = plan.result()
        for warning in outcome.warnings:
            logger.warning(f"memsum: {session_id}: {warning}")
        before = estimate_text_tokens(old_text) + sum(
            estimate_stored(m) for m in snapshot if m.is_conversation
        )
        return await self._commit(session_id, run, before, span, template.name, outcome.summary, outcome.kept)

    async def _leave_out_refused(
        self,
        session_id: str,
        run: _Run,
        model: Any,
        plan: ChunkPlan,
        request: SummaryRequest,
        effort: str | None,
    ) -> dict[int, Message]:
        """The messages of `request` the provider's content review refuses, each alone (a
        bisection of its parts, llm/review.py), marked in the store (REFUSED_KEY) so every later
        request sends a placeholder for them; the marked messages by id. CompressionError when
        it is the existing summary, or no message alone is refused."""

        async def refused(parts: Sequence[Part], with_summary: bool = False) -> bool:
            if run.cancelled.is_set() or await self._cleared_elsewhere(session_id, run):
                raise _Cleared
            run.requests += 1  # in the run's count and, answered, in the ledger like any call
            probe = plan.probe(parts, with_summary=with_summary)
            call = self.client.chat(
                model,
                probe,
                purpose="摘要",
                session_id=session_id,
                max_tokens=PROBE_MAX_TOKENS,
                reasoning_effort=effort,
            )
            try:
                return await refused_by_review(call)
            except LLMError as err:
                raise CompressionError(f"摘要模型出错：{in_chinese(err)}") from err

        parts = list(request.parts)
        if plan.summary.strip() and not await refused(parts):
            raise CompressionError(SUMMARY_REFUSED)  # the conversation alone passes
        if plan.todos and await refused([]):  # R-RUN-4: every probe carries the todo list
            raise CompressionError(TODOS_REFUSED)
        try:
            culprits = await find_refused(parts, refused)
        except ProbeLimit as stopped:
            culprits = [p for p in stopped.found if isinstance(p, Part)]
            logger.warning(
                f"memsum: {session_id}: the search for refused messages stopped at its probe limit"
            )
        messages = {m.id: m for p in culprits for m in p.unit.messages if m.id is not None}
        if not messages:
            raise CompressionError(REFUSED_UNFOUND)
        await self.agent.mark_refused(session_id, [messages[i] for i in sorted(messages)])
        # As the store reads them back: marked, and no stored estimate (that was of the text).
        flag = {REFUSED_KEY: True}
        return {i: replace(m, metadata={**m.metadata, **flag}, tokens=None) for i, m in messages.items()}

    async def _cleared_elsewhere(self, session_id: str, run: _Run) -> bool:
        """R-MEM-2/3 across processes (shared store): another process cleared the session (a new
        clear mark) or deleted it since the run began. Its clear cannot cancel this run, so the
        run asks before each request, and sends nothing cleared there to the summariser."""
        if not self.store.shared:
            return False
        async with self.store.transaction() as tx:  # not the session record cached here
            if await tx.get_session(session_id) is None:
                run.deleted = True  # then no trace, as after a local deletion
                return True
            return await tx.get_meta(CLEARS_NAMESPACE, session_id) != run.clear_mark

    async def _ask(
        self,
        run: _Run,
        model: Any,
        messages: list[dict[str, str]],
        max_tokens: int,
        effort: str | None,
        sid: str,
    ) -> str:
        """One summary request, abandoned as soon as the session is cleared (R-MEM-3)."""
        if run.cancelled.is_set() or await self._cleared_elsewhere(sid, run):
            raise _Cleared  # cleared before it was sent: nothing of it goes out
        run.requests += 1
        call = asyncio.ensure_future(
            self.client.chat(
                model,
                messages,
                purpose="摘要",
                session_id=sid,
                max_tokens=max_tokens,
                reasoning_effort=effort,
            )
        )
        cleared = asyncio.ensure_future(run.cancelled.wait())
        try:
            await asyncio.wait({call, cleared}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cleared.cancel()
        if not call.done():
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            raise _Cleared
        try:
            result = call.result()
        except LLMLengthLimit:
            raise CompressionError("摘要在输出上限处被截断") from None  # R-FAIL-1
        except LLMError as err:
            if isinstance(err, LLMStatusError) and is_context_too_long(err.status, str(err)):
                raise _ContextTooLong(err) from err
            if isinstance(err, LLMInputRefused):
                raise _InputRefused(err) from err
            raise CompressionError(f"摘要模型出错：{in_chinese(err)}") from err
        if run.cancelled.is_set():
            raise _Cleared
        return result.content

    async def _commit(
        self,
        session_id: str,
        run: _Run,
        tokens_before: int,
        span: list[Message],
        template: str,
        summary: str,
        kept: Sequence[Unit],
    ) -> CompressionResult:
        """R-RUN-11 in one transaction, never under a running turn, never beside a clear."""
        async with self._commit_locks.hold(session_id):
            if run.cancelled.is_set():
                raise _Cleared
            # R-MEM-3: the model has answered, so from here a clear waits for this commit,
            # also while the commit itself waits for a running turn to end (R-TRIG-5).
            run.committing = True
            async with contextlib.nullcontext() if run.in_turn else self.agent.turn_lock(session_id):
                if run.cancelled.is_set():  # cleared from inside the turn it waited for
                    raise _Cleared
                entry = await self._entry(session_id, run)
                limit = int((await self.settings.effective("history_limit", session_id, **entry)).value)
                now = clock.now()
                # One transaction: its steps are invisible to everyone else until COMMIT, so
                # the summary is written once the kept count is known; a failed check rolls
                # everything back, the previous summary included.
                try:
                    async with self.store.transaction() as tx:
                        # The history cache answers when it holds the session and no other
                        # connection wrote to the file since (it is kept in step with every write
                        # of this one, and this transaction holds the store).
                        current = await self.store.history_in(tx, session_id)
                        if self.store.shared:  # R-MEM-3: another process cleared or deleted it
                            mark = await tx.get_meta(CLEARS_NAMESPACE, session_id)
                            # A deletion takes the mark and the history with it (a clear leaves
                            # a new mark): then the run leaves no trace, as after a local one.
                            if mark is None and not current:
                                run.deleted = True
                                raise _Cleared
                            if mark != run.clear_mark:
                                raise _Cleared
                        head = current[: len(span)]
                        if len(head) != len(span) or not all(map(same_item, head, span)):
                            raise CompressionError(CHANGED)
                        after = sum(m.is_conversation for m in current[len(span) :])
                        final = apply_count_rule(kept, after, limit)  # R-BACK-2
                        kept_count = sum(m.is_conversation for u in final for m in u.messages)
                        await tx.put_meta(
                            SUMMARY_NAMESPACE,
                            session_id,
                            {"text": summary, "template": template, "time": now, "kept_messages": kept_count},
                        )
                        kept_at = kept_indexes(final)
                        archived = await tx.archive_span(session_id, len(span), kept_at)
                        await tx.append(
                            session_id, Message(role="system", content=DIVIDER, event_marker=True, ts=now)
                        )
                finally:  # committed or rolled back: the next reader reads it again
                    self._summaries.pop(session_id)
        remaining = [current[i] for i in kept_at] + current[len(span) :]
        after_tokens = estimate_text_tokens(summary) + sum(
            estimate_stored(m) for m in remaining if m.is_conversation
        )
        return CompressionResult(
            session_id,
            "done",
            tokens_before=tokens_before,
            tokens_after=after_tokens,
            kept_messages=kept_count,
            archived=archived,
            summary=summary,
        )

    async def _entry(self, session_id: str, run: _Run | None = None) -> dict[str, str | None]:
        """The entry platform the count line is resolved for (R-TRIG-1: the latest usage's). A
        turn's own run takes its turn's: that turn's usage is not emitted yet, and before a
        session's first usage (or after a clear) there is none, so an internal session that
        came in through a tier would lose the tier's count line (R-BACK-2)."""
        if run is not None and run.entry is not None:
            return {"entry_platform": run.entry.platform, "entry_type": run.entry.platform_type}
        usage = await self._usage(session_id)
        return {
            "entry_platform": usage.platform if usage else None,
            "entry_type": usage.platform_type if usage else None,
        }

    # ---- what survives a restart ------------------------------------------------------------
    async def _usage(self, session_id: str) -> UsageEvent | None:
        """The latest usage: this process's, else the one stored before a restart; with
        other processes on the database (store.shared), the stored one: the latest request
        may have been another process's, and a clear there forgot this process's."""
        usage = None if self.store.shared else self._latest_usage.get(session_id)
        if usage is None:
            stored = await self.store.get_meta(USAGE_NAMESPACE, session_id)
            try:
                usage = UsageEvent(**stored) if stored else None
            except TypeError:  # written by a version with other fields: no usage then
                usage = None
            if usage is not None:
                usage = self._as_configured(usage)
                if not self.store.shared:
                    self._latest_usage.setdefault(session_id, usage)
        return usage

    def _as_configured(self, usage: UsageEvent) -> UsageEvent:
        """A usage stored before a restart, read in the configuration of this one. The owner
        moved to a chat model of another window (MEMSUM_MODELS edited, or another model in
        the old one's place): no request will carry the old window again, and the next
        one's snapshot carries the new one (R-TRIG-1), so the line is the chat model's now
        and the summary is written for the model that will read it (R-BUD-1)."""
        chat = self.registry.resolve("chat")
        known = self.registry.get(usage.model_id)
        if chat is None or (known is not None and known.context_window == usage.window):
            return usage
        return replace(
            usage, model_id=chat.id, window=chat.context_window, trim_budget=self.agent.trim_budget_of(chat)
        )

    async def _backoff_of(self, session_id: str) -> Backoff:
        """The session's back-off: remembered here, read from the store the first time; with
        other processes on the database (store.shared) read every time, so a process taking
        a session over continues where the other left it (R-BACK-3)."""
        backoff = None if self.store.shared else self._backoff.get(session_id)
        if backoff is None:
            stored = await self.store.get_meta(BACKOFF_NAMESPACE, session_id) or {}
            backoff = Backoff(int(stored.get("failures", 0)), int(stored.get("turns_waited", 0)))
            self._backoff[session_id] = backoff
        return backoff

    async def _set_backoff(self, session_id: str, backoff: Backoff) -> Backoff:
        """Remember the back-off here and in the store; a fresh one is deleted there."""
        if self._backoff.get(session_id) == backoff and not self.store.shared:  # another process may differ
            return backoff
        self._backoff[session_id] = backoff
        if backoff.failures:
            value = {"failures": backoff.failures, "turns_waited": backoff.turns_waited}
            await self.store.put_meta(BACKOFF_NAMESPACE, session_id, value)
        else:
            await self.store.delete_meta(BACKOFF_NAMESPACE, session_id)
        return backoff
