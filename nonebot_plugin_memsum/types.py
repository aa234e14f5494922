"""Domain records shared by every layer: plain frozen dataclasses, no nonebot, no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["user", "assistant", "tool", "notice", "system"]
REASONING_KEY = "reasoning_content"
"""`Message.metadata` key of the reasoning an assistant message that called a tool came with,
sent back with it: DeepSeek's thinking mode (on by default) answers 400 to a later request
without it, and Kimi's and Qwen's thinking models read it. Never shown, summarised or searched."""
TOOL_EXTRA_KEY = "tool_extra_content"
"""`Message.metadata` key of the `extra_content` each tool call of an assistant message came with
(call id → object), sent back on that call: Gemini 3 puts its thought signature there and answers
400 to a later request whose call lacks it. Opaque: never shown, summarised, searched or counted."""
CONVERSATION_ROLES: frozenset[str] = frozenset({"user", "assistant", "tool", "notice"})


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call an assistant message asks for (OpenAI `tool_calls[i]`)."""

    id: str
    name: str
    arguments: str
    """The arguments as the model wrote them (JSON text, not parsed)."""


@dataclass(frozen=True, slots=True, eq=True)
class Message:
    """One history item of a session, as stored.

    `id` is the storage order (row id) once stored, None before. `ts` is a unix
    timestamp with sub-second precision. `event_marker` items (the compression
    divider, a silent turn's record) are stored as role "system" and are never sent
    to the model as conversation.
    """

    role: Role
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    ts: float = 0.0
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    event_marker: bool = False
    id: int | None = None
    tokens: int | None = field(default=None, compare=False)
    """The token estimate taken when it was stored (None: unknown), so a prompt over a
    long history does not re-tokenise it after a restart."""
    platform_id: str | None = field(default=None, compare=False)
    """The platform's id of the message (OneBot `message_id`): a message fetched again
    after a reconnect is recognised by it and stored once."""
    addressed: bool = field(default=False, compare=False)
    """The message asked the bot for an answer (@, a reply to it, its nickname, a private
    chat): start-up finds questions a crash left unanswered by it."""
    withdrawn: bool = field(default=False, compare=False)
    """Its sender (or an admin) withdrew it on the platform (QQ 撤回: `group_recall`,
    `friend_recall`). Stored as said (R-MEM-2, the owner's page shows it), but what reaches
    the model (a request, a summary, a later quote) is `shown_content`: its label and
    WITHDRAWN_TEXT. Read from the store with no `tokens`: the stored estimate is of the text."""
    wire: Any = field(default=None, init=False, repr=False, compare=False)
    """Its wire form (`llm.client.WireMessage`), made once by `agent/wire.py` when a request
    first sends it: a memo that lives and dies with this object, so it is bounded by whatever
    holds the message (the store's history cache) and what a compression, a clear or a restart
    reads anew simply has none yet. Not a value of the message: `replace` drops it."""

    @property
    def is_conversation(self) -> bool:
        """User, assistant, tool and notice messages that are not event markers."""
        return not self.event_marker and self.role in CONVERSATION_ROLES


REFUSED_KEY = "refused_by_review"
"""`Message.metadata` key, True on a message the model provider's content review refused (its
text made every request that carried it fail: llm/review.py found it). Stored as said (R-MEM-2, the
owner's page shows it marked), but what reaches the model is `shown_content`: its label and
REFUSED_TEXT, so the session's later requests (chat and summary) work again."""
REFUSED_TEXT = "（这条消息未通过模型服务商的内容审核，已略去）"
WITHDRAWN_TEXT = "（这条消息已撤回）"
"""What the model reads of a withdrawn message, after its `[昵称(ID)]` label."""
QUOTE_OF_KEY = "quote_of"
"""`Message.metadata` key of a member's reply: the platform id of the message its `[回复 …]`
quote shows the start of (onebot/record.py), so a later withdrawal of that message finds it."""
QUOTE_WITHDRAWN_KEY = "quote_withdrawn"
"""`Message.metadata` key, True on a reply whose quoted message was withdrawn after it was
stored (`Store.mark_withdrawn`): the model reads its quote as WITHDRAWN_TEXT (`unquoted`), as a
reply that arrives after the withdrawal is stored."""
_LABEL = re.compile(r"\[[^\[\]()\n]*\(\d+\)\] ")
"""A chat message's leading `[昵称(ID)] ` label (onebot/render.py `labelled`)."""
_QUOTE = re.compile(r"(\[[^\[\]()\n]*\(\d+\)\] \[回复 [^\[\]()\n]*\(\d+\)：)[^\]\n]*\] ")
"""The label and the `[回复 昵称(ID)：excerpt] ` quote after it (onebot/render.py `quote_marker`:
the excerpt is one line and holds no `]`)."""


def is_refused(m: Message) -> bool:
    """Whether the provider's content review refused this message (REFUSED_KEY)."""
    return bool(m.metadata) and m.metadata.get(REFUSED_KEY) is True


def speaker_label(m: Message) -> str:
    """A user message's `[昵称(ID)]` label (empty for none): who said it, without what."""
    label = _LABEL.match(m.content) if m.role == "user" else None
    return label.group(0).strip() if label else ""


def unquoted(m: Message) -> str:
    """The content with the quote of a message withdrawn since (QUOTE_WITHDRAWN_KEY) as
    WITHDRAWN_TEXT; as stored otherwise."""
    if not (m.metadata and m.metadata.get(QUOTE_WITHDRAWN_KEY) is True):
        return m.content
    return quote_masked(m.content)


def quote_masked(content: str) -> str:
    """A reply's content with its `[回复 …]` quote's excerpt as WITHDRAWN_TEXT."""
    return _QUOTE.sub(lambda q: f"{q.group(1)}{WITHDRAWN_TEXT}] ", content, count=1)


def shown_content(m: Message) -> str:
    """The content the model reads: as stored (a quote of a message withdrawn since as
    WITHDRAWN_TEXT, `unquoted`), or for a withdrawn message its label (the record that someone
    said something stays) and WITHDRAWN_TEXT, as QQ's clients show it; for one the provider's
    content review refused, its label and REFUSED_TEXT."""
    if not m.withdrawn and not (m.metadata and is_refused(m)):
        return unquoted(m)
    label = _LABEL.match(m.content) if m.role == "user" else None
    return (label.group(0) if label else "") + (WITHDRAWN_TEXT if m.withdrawn else REFUSED_TEXT)


RoomClass = Literal["room", "direct"]


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """Who a session is with.

    `platform` is the birth platform ("onebot"), None for internal sessions (console,
    scheduled tasks). `kind` is the platform type ("group", "private") or "internal".
    `room_class` is "room" for multi-party places (groups), "direct" for one-to-one
    chats, None for internal sessions. `peer` is the other party of a one-to-one
    chat; `place` the group; `parent` the session a child session was spawned from.
    """

    id: str
    platform: str | None
    kind: str
    place: str | None = None
    peer: str | None = None
    parent: str | None = None
    room_class: RoomClass | None = None
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class CompressionRecord:
    """One compression run as the history keeps it: `done` with its figures, or `error`
    with the reason. `line` is the compression line in tokens it ran against, if known."""

    session_id: str
    ts: float
    outcome: Literal["done", "error"]
    reason: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    kept: int = 0
    archived: int = 0
    requests: int = 0
    line: int | None = None


@dataclass(frozen=True, slots=True)
class SessionActivity:
    """What the overview shows of one session: its record (None for a
    session without one), message counts, and its last chat call's prompt size."""

    session_id: str
    record: SessionRecord | None
    active: int
    archived: int
    last_ts: float
    usage: int | None = None
    usage_model: str | None = None


@dataclass(frozen=True, slots=True)
class DailyUsage:
    """Ledger totals of one local day, model and purpose."""

    day: str
    model: str
    purpose: str
    calls: int
    tokens_in: int
    tokens_out: int
    tokens_cached: int = 0
    """Of tokens_in, those the provider served from its prompt cache."""


def tool_extra(m: Message) -> Mapping[str, Any]:
    """The `extra_content` of each tool call of `m`, by call id (empty for none)."""
    extra = m.metadata.get(TOOL_EXTRA_KEY) if m.tool_calls else None
    return extra if isinstance(extra, Mapping) else {}


def tool_reasoning(m: Message) -> str:
    """The reasoning an assistant message that called a tool is sent back with ("" for none)."""
    reasoning = m.metadata.get(REASONING_KEY) if m.tool_calls else None
    return reasoning if isinstance(reasoning, str) else ""
