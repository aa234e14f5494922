"""The library face of the plugin, for other NoneBot plugins.

    from nonebot import require
    require("nonebot_plugin_memsum")
    from nonebot_plugin_memsum import api

Everything here works once NoneBot has started (the plugin's runtime exists); `tool`,
`subscribe`, `contribute` and `set_todo_provider` also before, at the plugin's import, where
NoneBot plugins register their matchers: kept, they apply at every start. A session
exists once `internal_session`, `child_session`, `record` or a chat made it: `run_turn`,
`build_prompt` and `child_session` (its parent) raise `SessionNotFound` for any other id;
the reads (`history`, `search`, `status`, `compress_at`) answer for it as for an empty
session, and `compress`, `clear` and `delete_session` have nothing to do.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.agent.events import (
    CompressionProgress,
    Outcome,
    TurnEnded,
    TurnStarted,
    UsageEvent,
)
from nonebot_plugin_memsum.agent.prompt import Prompt
from nonebot_plugin_memsum.agent.tools import TodoItem, TodoProvider, ToolContext, ToolFn, offer_todo_tool
from nonebot_plugin_memsum.agent.turn import Entry, ReplyFn
from nonebot_plugin_memsum.compression.service import CompressionResult, SessionStatus
from nonebot_plugin_memsum.errors import (
    BadToolName,
    BadToolSchema,
    CompressionCancelled,
    CompressionError,
    MemsumError,
    NotDelivered,
    NotStarted,
    SessionNotFound,
    StoreError,
    ToolNameTaken,
    TurnInProgress,
)
from nonebot_plugin_memsum.store import SearchHit, SearchQuery
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall

E = TypeVar("E")
EVENTS = (TurnStarted, TurnEnded, UsageEvent, CompressionProgress)

__all__ = [
    "BadToolName",
    "BadToolSchema",
    "CompressionCancelled",
    "CompressionError",
    "CompressionProgress",
    "CompressionResult",
    "Entry",
    "MemsumError",
    "Message",
    "NotDelivered",
    "Prompt",
    "SearchHit",
    "SessionNotFound",
    "SessionRecord",
    "SessionStatus",
    "StoreError",
    "TodoItem",
    "TodoProvider",
    "ToolCall",
    "ToolContext",
    "ToolFn",
    "ToolNameTaken",
    "TurnEnded",
    "TurnInProgress",
    "TurnStarted",
    "UsageEvent",
    "build_prompt",
    "child_session",
    "clear",
    "compress",
    "compress_at",
    "contribute",
    "delete_session",
    "history",
    "internal_session",
    "record",
    "run_turn",
    "search",
    "set_todo_provider",
    "status",
    "subscribe",
    "todos",
    "tool",
]


async def internal_session(session_id: str) -> SessionRecord:
    """A session with no birth platform (scheduled tasks, other plugins' own work)."""
    return await runtime.get().store.save_session(
        SessionRecord(id=session_id, platform=None, kind="internal", created=clock.now())
    )


async def child_session(parent_id: str, session_id: str, entry: Entry = Entry()) -> SessionRecord:
    """A session spawned from another. Creating it copies the parent's effective settings
    (R-CFG-3); a later call returns the existing child and copies nothing. Raises
    SessionNotFound when the parent does not exist (nothing is created), and ValueError when
    `session_id` is taken by a session that is not this parent's child (one history for both)."""
    rt = runtime.get()
    existing = await rt.store.get_session(session_id)
    if existing is not None:
        if existing.parent != parent_id:
            whose = f"a child of {existing.parent!r}" if existing.parent else "no child session"
            raise ValueError(
                f"api.child_session({parent_id!r}, {session_id!r}): {session_id!r} exists already and is"
                f" {whose}; choose another id"
            )
        return existing
    parent = await rt.store.get_session(parent_id)
    if parent is None:
        raise SessionNotFound(parent_id)
    child = SessionRecord(
        id=session_id,
        platform=parent.platform,
        kind="child",
        place=parent.place,
        parent=parent_id,
        created=clock.now(),
    )
    return await rt.settings.create_child(child, entry.platform, entry.platform_type)


async def record(session: SessionRecord, message: Message) -> Message:
    """Store one message in a session's history (creating the session on first use; a new
    child copies its parent's effective settings then, as `child_session` does: R-CFG-3).
    In a 仅记录 session (MEMSUM_DEFAULT_MODE=record) no turn ends to judge the lines, so the
    message is judged as the OneBot layer judges what it records: the memory still compresses.
    A session id in place of the record, or a dict in place of the Message, raises TypeError."""
    if not isinstance(session, SessionRecord):
        raise TypeError(
            f"api.record takes the SessionRecord that api.internal_session or api.child_session"
            f" returned, not {session!r}"
        )
    if not isinstance(message, Message):
        raise TypeError(f"api.record stores an api.Message(role=..., content=...), not {message!r}")
    rt = runtime.get()
    if session.parent is not None and await rt.store.get_session(session.id) is None:
        await rt.settings.create_child(session, None, None)
    stored = await rt.agent.record(session, message)
    if await rt.controls.mode(session) == "record":
        await rt.compression.judge_recorded(session.id, Entry(session.platform, session.kind))
    return stored


async def history(session_id: str, limit: float = math.inf) -> list[Message]:
    """The session's active history in storage order (the last `limit` messages)."""
    return await runtime.get().store.get_history(session_id, limit)


async def run_turn(session_id: str, reply: ReplyFn | None = None, entry: Entry = Entry()) -> Outcome:
    """Run one agent turn now: the model answers the history; `reply` gets the text.

    "silent" without a model call (and no turn events) when nothing is new to answer: no user
    message or notice stored since the last turn read the history (record one first to make
    the bot speak). Judged once the session's turn is this call's: two calls at once after
    one message get one answer ("replied", then "silent"). Raises SessionNotFound for a
    session that does not exist, and TurnInProgress when called from inside that session's
    own turn (a tool or a contribution: the turn in progress answers what is new). A `reply`
    that raises NotDelivered (the platform said the text did not go out) leaves the answer
    stored as withdrawn, not as said; any other exception from it is logged and the answer kept.

    The owner's controls of a QQ place (its mode 开 / 仅记录 / 关, `/限额`, the member
    cooldown) are the OneBot layer's, applied before it calls this: a plugin that calls
    `run_turn` itself decides whether to answer. Its calls are counted in the usage ledger
    all the same (`/用量`)."""
    await _existing(session_id)
    return await runtime.get().agent.run_turn(session_id, reply, entry, only_new=True)


async def build_prompt(session_id: str, entry: Entry = Entry()) -> Prompt:
    """The prompt the next call would send: persona, contributions (summary in `context`),
    history. Raises SessionNotFound for a session that does not exist."""
    await _existing(session_id)
    return await runtime.get().agent.build_prompt(session_id, entry)


async def _existing(session_id: str) -> SessionRecord:
    found = await runtime.get().store.get_session(session_id)
    if found is None:
        raise SessionNotFound(session_id)
    return found


def contribute(anchor: str, fn: Callable[[str], Awaitable[str | None] | str | None]) -> None:
    """Add a system part to every prompt under `anchor` (`context` is the last, before history):
    `fn(session_id)`, a coroutine function or a plain one, returns its text (None or "": none).
    Anything but a function raises TypeError: it would fail every prompt, in the log only."""
    if not callable(fn):
        raise TypeError(f"api.contribute({anchor!r}, ...): give a function of the session id, not {fn!r}")
    rt = _started()
    if rt is not None:
        rt.agent.contribute(anchor, fn)
    else:  # before start: kept for every start (runtime.Pending)
        runtime.pending.keep(lambda rt: rt.agent.contribute(anchor, fn))


def _started() -> runtime.Runtime | None:
    """The runtime, or None before NoneBot started it: registrations are kept then."""
    try:
        return runtime.get()
    except NotStarted:
        return None


def tool(
    name: str, description: str, parameters: dict[str, Any], *, replace: bool = False
) -> Callable[[ToolFn], ToolFn]:
    """Decorator offering a function to the chat model as a tool. A name already offered (the
    built-in `recall` and `todo_write`, or another plugin's tool) raises ToolNameTaken naming
    it; `replace=True` replaces that tool on purpose. A name the model APIs refuse (anything
    but 1 to 64 of a-z, A-Z, 0-9, `_` and `-`: no Chinese, spaces or dots) raises BadToolName;
    parameters they refuse (anything but a JSON Schema object of `"type": "object"`) raise
    BadToolSchema. Used before NoneBot started (at the plugin's import), the same errors are
    raised here, the taken names being the built-in ones and those registered before."""
    rt = _started()
    if rt is not None:
        return rt.tools.tool(name, description, parameters, replace=replace)
    check = runtime.pending.tools.tool(name, description, parameters, replace=replace)

    def keep(fn: ToolFn) -> ToolFn:
        check(fn)
        runtime.pending.keep(lambda rt: rt.tools.tool(name, description, parameters, replace=replace)(fn))
        return fn

    return keep


def set_todo_provider(provider: TodoProvider | None) -> None:
    """Use another plugin's todo list (the specification's todoList service) in place of the
    built-in one: the work template's 「当前任务列表状态」 is its `items(session_id)` at the moment
    of each compression (R-RUN-4), and the built-in `todo_write` tool writes through its
    `replace(session_id, items)`. None: no todo list (the summary input carries none and the
    tool is not offered). A `todo_write` tool another plugin registered itself stays."""
    rt = _started()
    if rt is not None:
        rt.use_todos(provider)
        return
    offer_todo_tool(runtime.pending.tools, provider)  # the names `api.tool` finds taken
    runtime.pending.keep(lambda rt: rt.use_todos(provider))


async def todos(session_id: str) -> list[TodoItem]:
    """The session's todo items in the list in use (empty when there is no todo list)."""
    provider = runtime.get().compression.todos
    return [] if provider is None else list(await provider.items(session_id))


def subscribe(event_type: type[E], handler: Callable[[E], Awaitable[None] | None]) -> Callable[[], None]:
    """Listen to TurnStarted, TurnEnded, UsageEvent or CompressionProgress; returns an
    unsubscribe (calling it again does nothing). Anything else raises TypeError: a handler
    of a type no one emits would never run, silently."""
    if event_type not in EVENTS:
        names = ", ".join(e.__name__ for e in EVENTS)
        raise TypeError(f"api.subscribe: {event_type!r} is no event; subscribe to one of {names}")
    rt = _started()
    if rt is not None:
        return rt.bus.subscribe(event_type, handler)
    applied: list[Callable[[], None]] = []  # the unsubscribe of the runtime it is applied to

    def step(rt: runtime.Runtime) -> None:
        applied[:] = [rt.bus.subscribe(event_type, handler)]

    drop = runtime.pending.keep(step)

    def unsubscribe() -> None:
        drop()
        for undo in applied:
            undo()

    return unsubscribe


async def compress(session_id: str) -> CompressionResult:
    """Compress now; raises CompressionError with a Chinese reason (also when called from
    inside this session's own turn), or StoreError when the commit could not be written
    (rolled back, R-RUN-11)."""
    return await runtime.get().compression.compress(session_id)


async def compress_at(
    session_id: str, platform: str | None = None, platform_type: str | None = None
) -> float | None:
    """The session's automatic compression line in force (a fraction of the window), None
    when it is 0 (R-CFG-4). `platform` / `platform_type`: the platform a session without a
    birth platform came in through, which picks its tiers (R-CFG-2); `"onebot.group"` alone,
    the type tier's name in MEMSUM_TIERS, names both."""
    return await runtime.get().compression.compress_at(session_id, platform, platform_type)


async def clear(session_id: str, kind: Literal["context", "summary"] = "context") -> None:
    """Forget the context (history and summary) or only the summary (R-MEM-2)."""
    await runtime.get().compression.clear(session_id, kind)


async def delete_session(session_id: str) -> None:
    """Delete a session (R-MEM-2): cancel its compression, wait for its running turn, then
    remove its history (archived too), summary, back-off, latest usage and own settings.
    Its usage ledger stays."""
    await runtime.get().compression.delete_session(session_id)


async def status(session_id: str) -> SessionStatus:
    """Summary, last compression, usage against the line, back-off."""
    return await runtime.get().compression.status(session_id)


async def search(
    session_id: str,
    query: str,
    *,
    speaker: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 10,
    context: int = 0,
    withdrawn: bool = False,
) -> list[SearchHit]:
    """Full-text search over the session's stored messages, active and archived (never cleared
    ones, never another session's): best match first, then the newest. `query` words must all
    occur (Chinese words of any length, QQ numbers, codes, URLs, English); `speaker` is a QQ
    number or a nickname; `since`/`until` unix times (until exclusive); `context` neighbouring
    messages either side of each hit. Messages withdrawn on the platform (撤回) are left out, as
    the `recall` tool and /回忆 leave them out; `withdrawn=True` includes them, their ids in
    `SearchHit.withdrawn` (the owner's web page marks them 已撤回)."""
    return await runtime.get().store.search(
        SearchQuery(session_id, query, speaker, since, until, limit, withdrawn), context
    )
