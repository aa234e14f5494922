"""The chat agent: one turn at a time per session, the tool loop, usage and turn events.

A message that arrives while its session is in a turn is recorded at once and taken
into the next turn (requests during a turn coalesce into one more turn): nothing is
lost and nothing interleaves. Different sessions run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import tzinfo
from typing import Any

from nonebot.log import logger

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.compression.budget import compression_line
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.errors import (
    ClearedMeanwhile,
    NoChatModel,
    NotDelivered,
    StoreError,
    TurnInProgress,
)
from nonebot_plugin_memsum.llm import (
    ChatResult,
    LLMClient,
    LLMError,
    LLMInputRefused,
    LLMLengthLimit,
    Registry,
)
from nonebot_plugin_memsum.llm.review import (
    PROBE_MAX_TOKENS,
    REVIEW_ROUNDS,
    ProbeLimit,
    find_refused,
    refused_by_review,
)
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.lru import LRU, KeyedLocks
from nonebot_plugin_memsum.settings import Resolved, Settings, place_key, tier_keys
from nonebot_plugin_memsum.store import RecallMask, ReplyState, Store
from nonebot_plugin_memsum.types import (
    REASONING_KEY,
    TOOL_EXTRA_KEY,
    Message,
    SessionRecord,
    ToolCall,
    is_refused,
    speaker_label,
)

from .events import EventBus, Outcome, TurnEnded, TurnStarted, UsageEvent
from .prompt import Prompt, assemble, contribution_order, cut_text, now_line, tools_tokens, trim_budget
from .tools import ToolContext, ToolRegistry
from .wire import wire_forms

ReplyFn = Callable[[str], Awaitable[None] | None]
"""How a turn hands its answer out: a coroutine function, or a plain one (`print`, a list's `append`)."""
OWN_SEND: ContextVar[bool] = ContextVar("memsum_own_send", default=False)
"""True while the plugin sends something of its own (a turn's answer through its reply
function, whoever wrote that; the OneBot layer's replies): what the bot account says then
is not stored as something another plugin said (onebot/said.py)."""


@contextlib.contextmanager
def own_send() -> Iterator[None]:
    """What is sent inside is the plugin's own (`OWN_SEND`)."""
    token = OWN_SEND.set(True)
    try:
        yield
    finally:
        OWN_SEND.reset(token)


Contribution = Callable[[str], Awaitable[str | None] | str | None]
MakeRoom = Callable[[str, "Entry", Prompt, "int | None"], Awaitable[bool]]
"""Called from inside a turn whose prompt would be hard-trimmed, with the stored id of the
turn's earliest unanswered question (`Agent.first_question`); True when it compressed."""
SILENT_MARK = "[不回复]"
SILENT_RECORD = "（助手本轮选择不回复）"
WITHDRAWN_RECORD = "（提问已撤回，助手未回复）"
# Models imitate the `[昵称(ID)] ` labels they see; the bot never labels itself.
_ECHOED_LABEL = re.compile(r"^\s*\[[^\[\]\n]{0,64}\(\d+\)\]\s*")


@dataclass(frozen=True, slots=True)
class Entry:
    """The platform a turn came in through (tiers of sessions without one use it). Given by its
    type tier's name alone (`Entry("onebot.group")`, as MEMSUM_TIERS names it), it is that
    platform and type."""

    platform: str | None = None
    platform_type: str | None = None

    def __post_init__(self) -> None:
        if self.platform_type is None and self.platform and "." in self.platform:
            platform, platform_type = self.platform.split(".", 1)
            object.__setattr__(self, "platform", platform)
            object.__setattr__(self, "platform_type", platform_type)


@dataclass(slots=True)
class _Worker:
    task: asyncio.Task[None]
    pending: bool = False
    reply: ReplyFn | None = None
    trigger: int | None = None
    """The newest stored message that asked for the pending turn (None: unknown)."""
    allowed: Callable[[], Awaitable[bool]] | None = None
    """Asked once more when the pending turn's time comes (the daily cap reached meanwhile)."""
    read: int = -1
    """The newest message id the latest turn put into a prompt."""


@dataclass(slots=True)
class _TurnStats:
    """What the turn's INFO line reports."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    model_seconds: float = 0.0
    read: int | None = None
    """The newest message id a prompt of this turn held: the turn answers everything up to it."""


@dataclass
class Agent:
    """Records messages, runs turns, assembles prompts."""

    store: Store
    client: LLMClient
    registry: Registry
    bus: EventBus
    config: Config
    settings: Settings
    tools: ToolRegistry
    zone: tzinfo | None = None
    """The bot's time zone (`MEMSUM_TIMEZONE`, None: the system's), for `now_line`."""
    _locks: KeyedLocks = field(default_factory=KeyedLocks)
    _workers: dict[str, _Worker] = field(default_factory=dict)
    """Sessions with a turn running or queued; a worker leaves when its session is idle."""
    _contributions: dict[str, list[Contribution]] = field(default_factory=dict)
    _summary: Contribution | None = None
    """The summary's injection: the last system part, whoever else contributes (R-INJ-1)."""
    _make_room: MakeRoom | None = None
    """The compression's way to avoid a hard trim (issue 9); see `on_trim`."""
    _turn_tasks: dict[str, asyncio.Task[Any] | None] = field(default_factory=dict)
    _fences: dict[str, int] = field(default_factory=dict)
    """Sessions with a turn running → the store's count of their clears the turn read the
    history under (`Store.clears`; see `_was_cleared`)."""
    _tool_running: dict[str, list[tuple[str, RecallMask]]] = field(default_factory=dict)
    """Sessions with a tool running → the withdrawals that came meanwhile (`mark_withdrawn`)."""
    _tools_cost: tuple[list[dict[str, Any]], int] = ([], 0)
    """The latest tool schemas offered and their `tools_tokens` (see `_tools_tokens`)."""
    _fitted: LRU[tuple[str, str, str], str] = field(default_factory=LRU)
    """(where, model id, persona) → the persona as sent, for personas too big for the model
    (`fit_persona`): each is logged once."""
    draining: bool = False
    """Shutting down: turns in flight finish, no new one starts (their questions are
    stored unanswered, so the next start answers them)."""

    # ---- public API -------------------------------------------------------------
    def contribute(self, anchor: str, fn: Contribution) -> None:
        """Add a system part under `anchor`; `context` is always the last one (R-INJ-1)."""
        self._contributions.setdefault(anchor, []).append(fn)

    def inject_summary(self, fn: Contribution) -> None:
        """The summary's source, always the last system part, right before the history (R-INJ-1)."""
        self._summary = fn

    def on_trim(self, fn: MakeRoom) -> None:
        """Before a request that would be hard-trimmed, once per turn, `fn` may compress the
        session (the turn holds its lock; the history and the summary are read again after)."""
        self._make_room = fn

    def turn_lock(self, session_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held for the whole of a turn; the compression commit waits on it."""
        return self._locks.hold(session_id)

    def in_turn(self, session_id: str) -> bool:
        return self._locks.locked(session_id)

    def is_turn_task(self, session_id: str) -> bool:
        """Whether the caller runs inside this session's turn (a tool, a contribution)."""
        return self._turn_tasks.get(session_id) is asyncio.current_task()

    def context_cleared(self, session_id: str) -> None:
        """The session's context was cleared (R-MEM-2) from inside its running turn (its own
        tool): the turn goes on after it. A turn cleared from outside sends and stores nothing
        more (`_was_cleared`)."""
        if self.is_turn_task(session_id):
            self._fences[session_id] = self.store.clears(session_id)

    def _was_cleared(self, session_id: str) -> bool:
        """R-MEM-2: the session's context was cleared, or the session deleted, from outside
        its running turn since the turn began: no next call after its tools, no answer, no
        error reply; what it was asked is no longer in the context. The store counts a clear
        as it commits, and checks the count again as it stores the turn's messages
        (ClearedMeanwhile): a write that waited behind the clear is not stored after it."""
        return self._fences.get(session_id) != self.store.clears(session_id)

    async def mark_withdrawn(self, session_id: str, platform_id: str, mask: RecallMask) -> None:
        """`Store.mark_withdrawn`. One that comes while a tool of the session runs is made
        again once the tool's result is stored: a recall result read before the withdrawal
        and stored after it was not there to be masked."""
        if (meanwhile := self._tool_running.get(session_id)) is not None:
            meanwhile.append((platform_id, mask))
        await self.store.mark_withdrawn(session_id, platform_id, mask)

    async def record(self, session: SessionRecord, msg: Message) -> Message:
        """Store one message of a session (creating the session record on first use)."""
        await self.store.save_session(session)
        return await self._append(session.id, msg)

    async def record_once(self, session: SessionRecord, msg: Message) -> Message | None:
        """`record`, unless a message with the same `platform_id` is stored already: None."""
        await self.store.save_session(session)
        return await self.store.append_once(session.id, _estimated(msg))

    def request_turn(
        self,
        session_id: str,
        reply: ReplyFn,
        entry: Entry = Entry(),
        *,
        trigger: int | None = None,
        allowed: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Answer this session soon: now, or right after the turn in progress.

        `trigger`: the stored id of the message asking; a queued turn is dropped when the
        turn in progress already read its trigger (a burst gets one answer, not two).
        `allowed`: asked again when a queued turn's time comes; False drops it (the turn
        in progress used up the place's daily cap: no answer after the cap notice).
        """
        if self.draining:
            return
        worker = self._workers.get(session_id)
        if worker is not None and not worker.task.done():
            if not worker.pending:
                worker.trigger = trigger
            elif worker.trigger is not None:
                worker.trigger = None if trigger is None else max(worker.trigger, trigger)
            worker.pending, worker.reply, worker.allowed = True, reply, allowed
            return
        task = asyncio.create_task(self._work(session_id, reply, entry), name=f"memsum-turn-{session_id}")
        self._workers[session_id] = _Worker(task)

    async def wait_idle(self, session_id: str) -> None:
        """Wait until no turn of this session runs or is queued."""
        while (w := self._workers.get(session_id)) is not None and not w.task.done():
            await asyncio.wait({w.task})

    async def drain(self, grace: float) -> int:
        """Start no new turn; let those in flight finish for up to `grace` seconds.
        Returns how many were still running then."""
        self.draining = True
        tasks = {w.task for w in self._workers.values() if not w.task.done()}
        if not tasks:
            return 0
        _, running = await asyncio.wait(tasks, timeout=grace)
        return len(running)

    async def shutdown(self) -> None:
        """Abort running turns (their outcome is `aborted`)."""
        self.draining = True
        tasks = [w.task for w in self._workers.values() if not w.task.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def system_parts(
        self,
        session_id: str,
        entry: Entry = Entry(),
        persona: str | None = None,
        *,
        without_summary: bool = False,
    ) -> list[str]:
        """Persona (a layered setting; `persona`: already resolved by the caller), the date
        when `MEMSUM_DATE_IN_PROMPT` is on (`now_line`), contributions by anchor in
        registration order, `context` last, the summary last of all (R-INJ-1);
        `without_summary`: for a turn the provider's content review refused with it."""
        if persona is None:
            resolved = await self.settings.effective(
                "persona", session_id, entry_platform=entry.platform, entry_type=entry.platform_type
            )
            persona = str(resolved.value)
        parts = [persona]
        if self.config.memsum_date_in_prompt:
            parts.append(now_line(clock.now(), self.zone))
        for anchor, fn in contribution_order(self._contributions, self._summary):
            if without_summary and fn is self._summary:
                continue
            try:
                text = await _contributed(fn, session_id)
            except Exception:
                logger.exception(f"memsum: contribution to {anchor!r} failed")
                continue
            if text:
                parts.append(text)
        return parts

    async def build_prompt(
        self, session_id: str, entry: Entry = Entry(), *, with_tools: bool = True
    ) -> Prompt:
        """The prompt the next call of this session would send (anchors filled, trimmed)."""
        model = self.registry.resolve("chat")
        if model is None:
            raise NoChatModel
        settings = await self.settings.effective_all(
            session_id, entry_platform=entry.platform, entry_type=entry.platform_type
        )
        limit = int(settings["history_limit"].value)
        persona = await self._persona_for(session_id, entry, settings["persona"], model)
        tools = self.tools.schemas() if with_tools else []
        _, prompt = await self._read_prompt(
            session_id, entry, limit, persona, self.trim_budget_of(model), tools
        )
        return prompt

    def _append(self, session_id: str, msg: Message, fence: int | None = None) -> Awaitable[Message]:
        return self.store.append(session_id, _estimated(msg), fence)

    async def _append_answer(
        self, session_id: str, msg: Message, upto: int | None, state: ReplyState
    ) -> Message:
        """The turn's answer and the mark that it answers everything up to `upto`, in one commit."""
        msg, fence = _estimated(msg), self._fences.get(session_id)
        if upto is None:
            return await self.store.append(session_id, msg, fence)
        return await self.store.append_marking(session_id, msg, upto, state, fence)

    async def history_limit(self, session_id: str, entry: Entry) -> int:
        resolved = await self.settings.effective(
            "history_limit", session_id, entry_platform=entry.platform, entry_type=entry.platform_type
        )
        return int(resolved.value)

    def reply_reserve(self, max_output: int | None) -> int:
        cap = self.config.memsum_reply_max_tokens
        return min(max_output, cap) if max_output else cap

    def persona_overflow(self, persona: str, model: ModelConfig) -> tuple[int, int] | None:
        """(its tokens, `model`'s trim budget) when `persona` takes more than half of what a
        request of `model` may carry: it goes with every request, so the conversation would
        get less than it (or nothing, over the window). None when it fits."""
        budget = self.trim_budget_of(model)
        tokens = estimate_text_tokens(persona)
        return (tokens, budget) if tokens > budget // 2 else None

    def fit_persona(self, persona: str, model: ModelConfig, where: str) -> str:
        """The persona as sent to `model`. One over `persona_overflow` (set with /人设 under a
        model with a larger window: only .env personas are refused at start-up) is cut to half
        the budget, so the conversation keeps the other half and the request fits the window;
        said once per place and model in the log."""
        key = (where, model.id, persona)
        if (fitted := self._fitted.get(key)) is not None:
            return fitted
        if (over := self.persona_overflow(persona, model)) is None:
            return persona
        tokens, budget = over
        fitted = self._fitted[key] = cut_text(persona, budget // 2, estimate_text_tokens)
        logger.warning(
            f"memsum: the persona of {where} takes {tokens} tokens, more than half of the {budget}"
            f" a request of the chat model {model.id} may carry; only its first {len(fitted)} of"
            f" {len(persona)} characters are sent (set a shorter one with /人设)"
        )
        return fitted

    async def _persona_for(
        self, session_id: str, entry: Entry, resolved: Resolved, model: ModelConfig
    ) -> str:
        """`fit_persona` for a session's persona, naming where it was set (the place, the
        session, or the `.env` key)."""
        persona = str(resolved.value)
        if self.persona_overflow(persona, model) is None:
            return persona  # every turn but those of a persona too big: no look-up
        where = "MEMSUM_PERSONA"
        if resolved.layer != "global":
            record = await self.store.get_session(session_id)
            platform, platform_type = tier_keys(record, entry.platform, entry.platform_type)
            key = place_key(record) if record is not None else None
            where = {
                "place": f"place {key}",
                "session": f"session {session_id}",
                "platform": f"MEMSUM_TIERS[{platform}].persona",
            }.get(resolved.layer, f"MEMSUM_TIERS[{platform_type}].persona")
        return self.fit_persona(persona, model, where)

    def trim_budget_of(self, model) -> int:
        return trim_budget(
            model.context_window,
            self.config.memsum_trim_ratio,
            model.max_output_tokens,
            self.config.memsum_reply_max_tokens,
        )

    async def run_turn(
        self,
        session_id: str,
        reply: ReplyFn | None = None,
        entry: Entry = Entry(),
        *,
        only_new: bool = False,
        requested: bool = False,
    ) -> Outcome:
        """One turn now (waiting for the session's turn in progress, if any).

        `only_new`: "silent" without a model call or turn events when, once the turn is this
        caller's, no user message or notice came in since the last turn read the history (a
        turn that ran while this one waited may have answered it: api.run_turn).
        `requested`: the turn answers the messages stored as asking the bot (`request_turn`); when
        its answer is ready and every one it read was withdrawn (撤回) meanwhile, the answer
        is not sent (nor stored): the turn is "silent"."""
        if self.is_turn_task(session_id):
            raise TurnInProgress(session_id)  # the lock is this very task's: it would wait forever
        turn_id = uuid.uuid4().hex
        async with self.turn_lock(session_id):
            if only_new and not await self._has_new(session_id):
                return "silent"
            self._turn_tasks[session_id] = asyncio.current_task()
            self._fences[session_id] = self.store.clears(session_id)
            started = time.perf_counter()
            stats = _TurnStats()
            await self.bus.emit(TurnStarted(turn_id, session_id))
            outcome: Outcome = "error"
            try:
                outcome = await self._turn(turn_id, session_id, reply, entry, stats, requested)
            except asyncio.CancelledError:
                outcome = "aborted"
                raise
            except ClearedMeanwhile:
                outcome = "silent"  # R-MEM-2: what it made of the history went with the clear
            except NoChatModel:
                # R-CFG-5: the registry warns once when no chat model is left; not every turn.
                logger.info("memsum: no chat model is configured; cannot answer")
            except LLMError as err:
                logger.warning(f"memsum: turn of {session_id} failed: {err}")
            except StoreError as err:  # a full disk, the database server gone: no traceback
                logger.error(f"memsum: turn of {session_id} failed: the database refused it ({err})")
            except Exception:
                logger.exception(f"memsum: turn of {session_id} failed")
            finally:
                if outcome == "error" and reply is not None and not self._was_cleared(session_id):
                    # The error reply answers nothing when every question was withdrawn (撤回)
                    # meanwhile (a refused one, say, while its search ran): nothing goes out.
                    if not (requested and await self._questions_withdrawn(session_id, stats.read)):
                        await self._send_answer(session_id, stats.read, reply, self.config.memsum_error_reply)
                if (worker := self._workers.get(session_id)) is not None and stats.read is not None:
                    worker.read = stats.read
                # The one INFO line of a turn: no message text (logs outlive /清除).
                logger.info(
                    f"memsum: turn {session_id} {outcome} in {(time.perf_counter() - started) * 1000:.0f} ms"
                    f" (model {stats.model_seconds * 1000:.0f} ms, {stats.calls} calls),"
                    f" tokens {stats.tokens_in} in / {stats.tokens_out} out"
                )
                await self.bus.emit(TurnEnded(turn_id, session_id, outcome))
                self._turn_tasks.pop(session_id, None)
                self._fences.pop(session_id, None)
        return outcome

    async def _has_new(self, session_id: str) -> bool:
        """Whether a user message or notice was stored after what the last turn answered."""
        answered = await self.store.answered_upto(session_id)
        history = await self.store.get_history(session_id)
        # Storage order is id order: read from the end back to what was answered, not the whole history.
        for m in reversed(history):
            if m.id is None:
                continue
            if m.id <= answered:
                return False
            if m.role in ("user", "notice"):
                return True
        return False

    async def _send_answer(self, session_id: str, upto: int | None, reply: ReplyFn, text: str) -> None:
        """Send an answer to the questions up to message `upto`, marked as being sent first:
        a crash after the mark never answers them again; one before it leaves them for
        the next start (issue 15: at most once)."""
        if upto is None:
            await _quietly(reply, text, session_id)
            return
        try:
            await self.store.mark_reply(session_id, upto, "sending")
        except StoreError:
            # The database refuses writes (a full disk): the answer goes out unmarked, so a
            # restart may still answer the questions properly; silence would be worse.
            await _quietly(reply, text, session_id)
            return
        await _quietly(reply, text, session_id)
        self.store.mark_sent(session_id, upto)

    # ---- the turn ---------------------------------------------------------------
    async def _work(self, session_id: str, reply: ReplyFn, entry: Entry) -> None:
        try:
            while True:
                if await self._questions_withdrawn(session_id):
                    return  # every message that asked was withdrawn (撤回) before its turn
                await self.run_turn(session_id, reply, entry, requested=True)
                worker = self._workers[session_id]
                if not worker.pending or self.draining:
                    return
                worker.pending = False
                if worker.trigger is not None and worker.trigger <= worker.read:
                    return  # the turn that just ended already had the message that asked
                if worker.allowed is not None and not await worker.allowed():
                    return
                reply = worker.reply or reply
        finally:
            if (w := self._workers.get(session_id)) is not None and w.task is asyncio.current_task():
                del self._workers[session_id]

    async def _turn(
        self,
        turn_id: str,
        session_id: str,
        reply: ReplyFn | None,
        entry: Entry,
        stats: _TurnStats,
        requested: bool = False,
    ) -> Outcome:
        model = self.registry.resolve("chat")
        if model is None:
            raise NoChatModel
        settings = await self.settings.effective_all(
            session_id, entry_platform=entry.platform, entry_type=entry.platform_type
        )
        limit, compress_at = int(settings["history_limit"].value), settings["compress_at"]
        persona = await self._persona_for(session_id, entry, settings["persona"], model)
        budget = self.trim_budget_of(model)
        reserve = self.reply_reserve(model.max_output_tokens)
        line = None
        if compress_at.value:  # R-CFG-4: 0 means no usage line
            line = compression_line(compress_at.value, model.context_window, budget)

        ctx = ToolContext(session_id)
        made_room = False
        searched = 0  # searches for messages the provider's content review refuses, this turn
        no_summary = False
        for round_no in range(self.config.memsum_max_tool_rounds + 1):
            offer_tools = round_no < self.config.memsum_max_tool_rounds
            tools = self.tools.schemas() if offer_tools else []
            history, prompt = await self._read_prompt(
                session_id, entry, limit, persona, budget, tools, no_summary
            )
            if prompt.trimmed and not made_room and self._make_room is not None:
                # Issue 9: compress now rather than send a trimmed request, at most once a turn.
                made_room = True
                question = await self.first_question(session_id, history)
                await self._make_room(session_id, entry, prompt, question)
                # Read again whatever became of the run: it compressed, or a clear cancelled it
                # (R-MEM-2/3), and what was cleared meanwhile is no longer sent to the model.
                history, prompt = await self._read_prompt(
                    session_id, entry, limit, persona, budget, tools, no_summary
                )
                if not prompt.conversation:
                    return "silent"  # the context was cleared: nothing is left to answer
            if history and history[-1].id is not None:
                stats.read = history[-1].id
            # R-TRIG-4: the active count at turn start plus the turn's tool calls and results
            # and the inputs that came in meanwhile: all of it is in this read.
            count = prompt.conversation
            facts = {
                "session_id": session_id,
                "platform": entry.platform,
                "platform_type": entry.platform_type,
                "model_id": model.id,
                "window": model.context_window,
                "trim_budget": budget,
                "trimmed": prompt.trimmed,
                "untrimmed_history": prompt.untrimmed_history,
                "history_messages": count,
                "history_limit": limit,
                "line": math.floor(line) if line is not None else None,
            }
            await self.bus.emit(UsageEvent(turn_id=None, usage=prompt.estimate, **facts))
            if self._was_cleared(session_id):
                # R-MEM-2: cleared after the history was read (while a contribution or the
                # summary was read): what was read must not reach the model, and the question
                # went with the clear.
                return "silent"
            asked = time.perf_counter()
            try:
                result = await self._ask(model, prompt, session_id, tools, reserve, stats)
            except LLMInputRefused as first:
                # Something in it is refused by the provider's content review, and would be in
                # every later request too: find it, send it as a placeholder from now on, and ask
                # again (an error reply when it is the very question, llm/review.py). A spam
                # wave holds more than one search finds: a few rounds, each finding some.
                refusal = first
                while True:
                    if searched >= REVIEW_ROUNDS:
                        raise refusal
                    searched += 1
                    without = await self._leave_out_refused(session_id, model, prompt, stats, refusal)
                    if without and no_summary:
                        raise refusal  # already without the summary: nothing more to leave out
                    no_summary = without
                    history, prompt = await self._read_prompt(
                        session_id, entry, limit, persona, budget, tools, no_summary
                    )
                    if history and history[-1].id is not None:
                        stats.read = history[-1].id
                    try:
                        result = await self._ask(model, prompt, session_id, tools, reserve, stats)
                        break
                    except LLMInputRefused as again:
                        refusal = again
            finally:
                stats.model_seconds += time.perf_counter() - asked
            if result.usage is not None:
                stats.tokens_in += result.usage.prompt_tokens
                stats.tokens_out += result.usage.completion_tokens
            # A usage without prompt tokens (some APIs report only the completion) is no measure.
            reported = result.usage.prompt_tokens if result.usage else 0
            used = reported or prompt.estimate
            await self.bus.emit(UsageEvent(turn_id=turn_id, usage=used, **facts))
            if self._was_cleared(session_id):
                return "silent"  # cleared while the model answered: its answer or call answers nothing now
            if result.tool_calls and offer_tools:
                # The reasoning goes back with the call: DeepSeek's thinking mode requires it;
                # so do Gemini 3's thought signatures (the calls' `extra_content`).
                thought: dict[str, Any] = (
                    {REASONING_KEY: result.reasoning_content} if result.reasoning_content else {}
                )
                if result.tool_extra:
                    thought[TOOL_EXTRA_KEY] = dict(result.tool_extra)
                await self._append(
                    session_id,
                    Message(
                        role="assistant",
                        content=result.content,
                        tool_calls=result.tool_calls,
                        ts=clock.now(),
                        metadata=thought,
                    ),
                    self._fences.get(session_id),
                )
                for call in result.tool_calls:
                    if self._was_cleared(session_id):
                        break  # R-MEM-2: the calls went with the clear
                    await self._run_tool(ctx, call)
                if self._was_cleared(session_id):
                    return "silent"  # cleared while its tools ran: the question is gone
                continue
            text = _ECHOED_LABEL.sub("", result.content.strip())
            withdrawn = requested and await self._questions_withdrawn(session_id, stats.read)
            if not text or text == SILENT_MARK or withdrawn:
                said = WITHDRAWN_RECORD if withdrawn else SILENT_RECORD
                marker = Message(role="system", content=said, event_marker=True, ts=clock.now())
                await self._append_answer(session_id, marker, stats.read, "sent")
                return "silent"
            answer = Message(role="assistant", content=text, ts=clock.now())
            answer = await self._append_answer(session_id, answer, stats.read, "sending")
            if reply is not None and not await _quietly(reply, text, session_id) and answer.id is not None:
                # The group never saw it (the bot muted, say): read back as withdrawn, not as
                # said. Its questions stay answered: sending again would fail again.
                await self.store.mark_unsent(session_id, answer.id)
            if stats.read is not None:
                self.store.mark_sent(session_id, stats.read)
            return "replied"
        raise RuntimeError("unreachable: the last round offers no tools")

    async def _ask(
        self,
        model: ModelConfig,
        prompt: Prompt,
        session_id: str,
        tools: list[dict[str, Any]],
        reserve: int,
        stats: _TurnStats,
    ) -> ChatResult:
        """The turn's chat request; a reply cut at the limit is still a reply."""
        stats.calls += 1
        try:
            return await self.client.chat(
                model,
                prompt.messages,
                purpose="对话",
                session_id=session_id,
                tools=tools or None,
                max_tokens=reserve,
            )
        except LLMLengthLimit as cut:
            return cut.result

    async def _leave_out_refused(
        self,
        session_id: str,
        model: ModelConfig,
        prompt: Prompt,
        stats: _TurnStats,
        refusal: LLMInputRefused,
    ) -> bool:
        """After the provider's content review refused the turn's request: the history
        messages it refuses, each alone (llm/review.py, the history sent as plain user
        messages, without the persona and system parts), marked in the store so every later
        request sends a placeholder for them. True when the history passes and the summary is
        what is refused: the turn goes on without it. Re-raises the refusal when nothing can be
        left out (the persona or another part is refused), or when a refused message is the very
        question being asked (the owner's MEMSUM_ERROR_REPLY then; later turns work)."""
        history = prompt.history
        # The system parts come first; the history never holds a system message (conversation()).
        start = next((i for i, m in enumerate(prompt.messages) if m.get("role") != "system"), 0)
        sent = prompt.messages[start : start + len(history)]

        async def refused(indexes: Sequence[int]) -> bool:
            stats.calls += 1
            probe = [{"role": "user", "content": _probe_text(sent[i])} for i in indexes]
            return await refused_by_review(
                self.client.chat(
                    model, probe, purpose="对话", session_id=session_id, max_tokens=PROBE_MAX_TOKENS
                )
            )

        candidates = [i for i, m in enumerate(history) if m.id is not None and not is_refused(m)]
        if not candidates or not await refused(candidates):
            if await self._has_summary(session_id):
                logger.warning(
                    f"memsum: {session_id}: the provider's content review refused the request with the"
                    " summary and takes the history without it: this turn goes without the summary"
                )
                return True
            raise refusal
        try:
            found = await find_refused(candidates, refused)
        except ProbeLimit as stopped:
            found = [i for i in stopped.found if isinstance(i, int)]
        culprits = [history[i] for i in found]
        if not culprits:
            raise refusal
        await self.mark_refused(session_id, culprits)
        # The question itself: the provider will not discuss it. Another member's question read
        # in the same turn is still answered (the refused one reads as the placeholder).
        refused_ids = {m.id for m in culprits}
        answered = await self.store.answered_upto(session_id)
        questions = [m for m in history if m.addressed and (m.id or 0) > answered]
        if questions:
            if all(m.id in refused_ids or is_refused(m) for m in questions):
                raise refusal
            return False
        if await self.first_question(session_id, list(history)) in refused_ids:
            raise refusal
        return False

    async def mark_refused(self, session_id: str, messages: Sequence[Message]) -> None:
        """Messages the provider's content review refuses (llm/review.py), found by a turn or a
        compression run: marked in the store (`Store.mark_refused`), so every later request
        sends their placeholder, and named in one WARNING (id and speaker, never the text)."""
        await self.store.mark_refused(session_id, [m.id for m in messages if m.id is not None])
        who = ", ".join(f"{m.id} {speaker_label(m) or m.role}" for m in messages)
        logger.warning(
            f"memsum: {session_id}: the provider's content review refused message(s) {who};"
            " they are sent as a placeholder from now on"
        )

    async def _has_summary(self, session_id: str) -> bool:
        """Whether the summary's injection gives this session a system part."""
        if self._summary is None:
            return False
        try:
            return bool(await _contributed(self._summary, session_id))
        except Exception:
            return False

    async def _questions_withdrawn(self, session_id: str, upto: int | None = None) -> bool:
        """`Store.questions_withdrawn`; False when the database cannot tell (an answer too
        many is better than a question left unanswered)."""
        try:
            return await self.store.questions_withdrawn(session_id, upto)
        except StoreError:
            return False

    async def first_question(self, session_id: str, history: list[Message]) -> int | None:
        """The stored id of the earliest message this turn answers: the session's oldest
        active message that asked the bot after its last answer (`Store.pending_questions`);
        when none is marked as asking (a turn run through `api.run_turn`), the newest user or
        notice message the turn read. None when the history holds neither."""
        if not history:
            return None
        since = min(m.ts for m in history)  # the active history's questions only: a short index range
        for sid, m in await self.store.pending_questions(since, session_id):
            if sid == session_id and m.id is not None:  # the prefix also matches longer ids
                return m.id
        asked = (m.id for m in reversed(history) if m.role in ("user", "notice") and not m.event_marker)
        return next(asked, None)

    async def _read_prompt(
        self,
        session_id: str,
        entry: Entry,
        limit: int,
        persona: str,
        budget: int,
        tools: list[dict[str, Any]],
        without_summary: bool = False,
    ) -> tuple[list[Message], Prompt]:
        history = await self.store.get_history(session_id)
        prompt = assemble(
            await self.system_parts(session_id, entry, persona, without_summary=without_summary),
            history,
            history_limit=limit,
            trim_budget=budget,
            tools_tokens=self._tools_tokens(tools),
            estimate_msg=estimate_msg_tokens,
            estimate_text=estimate_text_tokens,
            wire=wire_forms,
        )
        return history, prompt

    def _tools_tokens(self, tools: list[dict[str, Any]]) -> int:
        """`tools_tokens`, taken again only when the schemas differ from the last ones (a tool
        registered since): encoding them to JSON was ~20 µs of every turn. No tools (a turn's
        last round, a prompt built without them) leave the kept ones alone."""
        if not tools:
            return 0
        last, tokens = self._tools_cost
        if tools != last:
            tokens = tools_tokens(tools, estimate_text_tokens)
            self._tools_cost = (tools, tokens)
        return tokens

    async def _run_tool(self, ctx: ToolContext, call: ToolCall) -> None:
        meanwhile = self._tool_running[ctx.session_id] = []
        try:
            output = await self.tools.call(ctx, call.name, call.arguments)
            if self._was_cleared(ctx.session_id):
                # R-MEM-2: cleared (from outside the turn) while the tool ran: its call went with
                # the clear, and what it read may have gone too; stored, a later request would carry it.
                return
            await self._append(
                ctx.session_id,
                Message(role="tool", content=output, name=call.name, tool_call_id=call.id, ts=clock.now()),
                self._fences.get(ctx.session_id),
            )
        finally:
            del self._tool_running[ctx.session_id]
        for platform_id, mask in meanwhile:
            await self.store.mark_withdrawn(ctx.session_id, platform_id, mask)  # now it masks this result


async def _contributed(fn: Contribution, session_id: str) -> str | None:
    """A contribution's text: a plain function contributes too, as a tool may be one."""
    text = fn(session_id)
    return await text if inspect.isawaitable(text) else text


def _probe_text(sent: Any) -> str:
    """A history message as a probe's plain user text: its content, and its tool calls'
    arguments and reasoning (a probe of a few messages cannot carry calls without their results)."""
    text = sent.get("content") or ""
    calls = sent.get("tool_calls") or ()
    args = [str(c.get("function", {}).get("arguments", "")) for c in calls]
    if calls and sent.get(REASONING_KEY):
        args.append(str(sent[REASONING_KEY]))
    return "\n".join([str(text), *args]) if args else str(text)


def _estimated(msg: Message) -> Message:
    """A message about to be stored, with its token estimate taken once here (Message.tokens):
    prompts read that, so its text stays out of the estimate cache (issue 15: at a thousand
    groups those one-off texts filled it for minutes and pushed out what comes back)."""
    return replace(msg, tokens=estimate_msg_tokens(msg, keep=False))


async def _quietly(reply: ReplyFn, text: str, session_id: str) -> bool:
    """Sending may fail (the connection dropped); what was said is already stored. False
    when the platform said it did not go out (NotDelivered), with one WARNING line. Nothing
    is sent for a blank text (`MEMSUM_ERROR_REPLY=` empty: say nothing when a turn fails)."""
    if not text.strip():
        return True
    try:
        with own_send():
            sent = reply(text)
            if inspect.isawaitable(sent):
                await sent
    except Exception as err:
        logger.warning(f"memsum: could not send a reply to {session_id}: {type(err).__name__}: {err}")
        return not isinstance(err, NotDelivered)
    return True
