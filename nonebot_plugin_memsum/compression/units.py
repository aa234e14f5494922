"""Units of an archive span: grouping, rendering and numbering (R-RUN-1..3, R-RUN-6).

How the summariser tells who spoke: a user message is shown as stored (in chat
sessions it starts with its `[昵称(ID)]` label); an assistant's words start with
「助手: 」; tool calls, tool results and notices carry their own 「调用」「工具结果」
「通知:」 forms. The system prompt (templates.py) says so.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nonebot_plugin_memsum.types import REFUSED_TEXT, Message, is_refused, shown_content

CUT = 200
"""R-RUN-3: tool arguments, tool results and notices are cut hard at this many characters."""
ASSISTANT_PREFIX = "助手: "
_LINE_BREAK = re.compile("[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
"""What `str.splitlines` splits at."""


def _no_content_estimate(_: Message) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class Estimators:
    """Token estimates, injected so the core stays deterministic in tests."""

    text: Callable[[str], int]
    msg: Callable[[Message], int]
    content: Callable[[Message], int | None] = _no_content_estimate
    """`text` of a message's content as taken when it was stored, when known
    (llm.tokens.stored_content_tokens): `text_tokens` need not tokenise it again."""


@dataclass(frozen=True, slots=True)
class Unit:
    """One message, or an assistant's tool calls with their results (R-RUN-2)."""

    indexes: tuple[int, ...]
    """Positions of its messages in the span (storage order); keeping and archiving go by them."""
    messages: tuple[Message, ...]
    complete: bool
    """False for a tool group missing results and for a lone tool result."""
    text: str
    """The rendered text (R-RUN-3), without numbering."""


@dataclass(frozen=True, slots=True)
class Part:
    """What a request carries for a unit: the unit whole, or one piece of a split unit."""

    unit: Unit
    number: int | None
    """Its number when it may be kept (R-RUN-6); pieces and unnumbered units have none."""
    cost: int
    """N: tokens the unit's stored messages take kept verbatim."""
    text: str
    """As written in the request: 「#编号〔约 N token〕」 + text when numbered."""
    tokens: int
    """Estimated o200k tokens of `text` (the measured capacity rule counts these)."""


@dataclass(frozen=True, slots=True)
class _Groups:
    results: Mapping[int, tuple[int, ...]]
    """Head index of each assistant with tool calls → indexes of the results answering it."""
    complete: Mapping[int, bool]
    member: Mapping[int, int]
    """Index of every head and result → its head."""


def _group_tool_calls(messages: Sequence[Message]) -> _Groups:
    # Like groupToolCalls: a result belongs to the latest earlier call with its id
    # that is still unanswered; a result answering no open call stays alone.
    results: dict[int, list[int]] = {}
    wanted: dict[int, set[str]] = {}
    open_calls: dict[str, int] = {}
    member: dict[int, int] = {}
    for i, m in enumerate(messages):
        if not m.is_conversation:
            continue
        if m.role == "assistant" and m.tool_calls:
            results[i] = []
            wanted[i] = {c.id for c in m.tool_calls}
            member[i] = i
            for c in m.tool_calls:
                open_calls[c.id] = i
        elif m.role == "tool" and m.tool_call_id is not None and m.tool_call_id in open_calls:
            head = open_calls.pop(m.tool_call_id)
            results[head].append(i)
            wanted[head].discard(m.tool_call_id)
            member[i] = head
    return _Groups(
        results={h: tuple(r) for h, r in results.items()},
        complete={h: not w for h, w in wanted.items()},
        member=member,
    )


def cut_point(snapshot: Sequence[Message]) -> int:
    """R-RUN-1: where the archive span ends.

    The end of the snapshot, unless its last item is the call or a result of a tool
    group still missing results (the snapshot was read between the agent's writes
    of that group): then right before the group's assistant message.
    """
    if not snapshot:
        return 0
    groups = _group_tool_calls(snapshot)
    head = groups.member.get(len(snapshot) - 1)
    if head is not None and not groups.complete[head]:
        return head
    return len(snapshot)


def cut_before_question(snapshot: Sequence[Message], question: int) -> int:
    """Issue 9: the cut of a run inside a turn, before that turn's earliest unanswered
    question (the stored message with id `question`), so the question and everything after
    it stay active and reach the model verbatim.

    Never later than R-RUN-1's cut, and never inside a tool group (R-RUN-1, R-RUN-2): a
    group whose call is before the cut and a result after it moves the cut before its
    assistant message, as an unfinished group at the end does.
    """
    end = next((i for i, m in enumerate(snapshot) if m.id is not None and m.id >= question), len(snapshot))
    end = min(end, cut_point(snapshot))
    groups = _group_tool_calls(snapshot)
    while split := [h for h, results in groups.results.items() if h < end and any(r >= end for r in results)]:
        end = min(split)
    return end


def visible_text(m: Message) -> str:
    """An assistant's words: `visibleContent` when the stored content is a JSON envelope."""
    if m.content.lstrip().startswith("{"):
        try:
            envelope = json.loads(m.content)
        except ValueError:
            return m.content
        visible = m.metadata.get("visibleContent")
        if isinstance(envelope, dict) and isinstance(visible, str):
            return visible
    return m.content


def indent_continuation(text: str) -> str:
    """A text's own line breaks followed by two blanks.

    Only the first line of a record starts at the margin, so a member's message cannot
    open a line that reads as the assistant's words, a notice or another speaker.
    """
    if _LINE_BREAK.search(text) is None:  # most messages: one line, nothing to split
        return text
    return "\n  ".join(text.splitlines())


def render_message(m: Message, tool_names: Mapping[str, str]) -> str:
    """One message as the summariser reads it (R-RUN-3); a withdrawn one (撤回), or one the
    provider's content review refused, as its label and a placeholder, so its text never enters
    a summary written after the withdrawal (or the refusal)."""
    if m.role == "assistant":
        text = shown_content(m) if m.withdrawn or is_refused(m) else visible_text(m)
        lines = [f"{ASSISTANT_PREFIX}{indent_continuation(text)}"] if text.strip() or not m.tool_calls else []
        # A refused call's arguments held what the provider's review refused: its placeholder.
        args = [REFUSED_TEXT if is_refused(m) else c.arguments[:CUT] for c in m.tool_calls]
        lines += [f"调用 {c.name}({indent_continuation(a)})" for c, a in zip(m.tool_calls, args, strict=True)]
        return "\n".join(lines)
    if m.role == "tool":
        name = tool_names.get(m.tool_call_id or "") or m.name or "未知工具"
        return f"工具结果({name}): {indent_continuation(shown_content(m)[:CUT])}"
    if m.role == "notice":
        return f"通知: {indent_continuation(shown_content(m)[:CUT])}"
    return indent_continuation(shown_content(m))


# A record's first line, at the margin, and the head that says whose it is (`render_message`):
# a member's label, the assistant's, a tool result's or a notice's prefix; none for the rest.
_RECORD = re.compile(r"^(?=\S)(\[[^\[\]\n]*\(\d+\)\] |助手: |工具结果\([^)\n]*\): |通知: )?", re.M)
CONTINUED = "（接上文）"


@dataclass(frozen=True, slots=True)
class Heads:
    """Where each record of a unit's text starts, and its head (R-RUN-10 cuts a long unit in pieces)."""

    starts: tuple[int, ...]
    heads: tuple[str, ...]

    @classmethod
    def of(cls, text: str) -> Heads:
        found = [(m.start(), m.group(1) or "") for m in _RECORD.finditer(text)]
        return cls(tuple(s for s, _ in found), tuple(h for _, h in found))

    @property
    def longest(self) -> str:
        """The most a piece's head can add (`continued`)."""
        head = max(self.heads, key=len, default="")
        return f"{head}{CONTINUED}\n" if head else ""

    def continued(self, text: str, start: int) -> str:
        """What the piece `text[start:]` opens with: the head of the record it goes on with and
        「（接上文）」, so a piece read alone (or after a blank line) still says whose words these
        are; nothing when it starts a record of its own."""
        i = bisect_right(self.starts, start) - 1
        if i < 0 or self.starts[i] == start or not self.heads[i]:
            return ""
        indented = text[start : start + 1].isspace()  # it starts on a line under the record
        return self.heads[i] + CONTINUED + ("\n" if indented else "")


def render_unit(messages: Sequence[Message], tool_names: Mapping[str, str]) -> str:
    """A unit's text: its messages rendered, one after another."""
    return "\n".join(render_message(m, tool_names) for m in messages)


def build_units(span: Sequence[Message]) -> list[Unit]:
    """R-RUN-2: the units of an archive span, in time order.

    A tool group stands at its assistant's place; messages written between the call
    and its results come after it, each a unit of its own. System messages and event
    markers are not units.
    """
    # R-RUN-3: the tool name comes from the span's calls (a grouped result's from the call it
    # answers, a lone one's from the latest call with its id stored before it: a provider
    # may reuse ids across turns, "call_0"); a result's own name is the fallback.
    earlier: dict[str, str] = {}
    groups = _group_tool_calls(span)
    units: list[Unit] = []
    for i, m in enumerate(span):
        if not m.is_conversation:
            continue
        results = groups.results.get(i)
        if results is not None:
            indexes = (i, *results)
            messages = tuple(span[j] for j in indexes)
            names = {c.id: c.name for c in m.tool_calls}
            earlier.update(names)
            units.append(Unit(indexes, messages, groups.complete[i], render_unit(messages, names)))
        elif i not in groups.member:  # else a result, already in its group
            # A lone tool result cannot be kept verbatim.
            units.append(Unit((i,), (m,), m.role != "tool", render_message(m, earlier)))
    return units


def _stored_text_tokens(u: Unit, est: Estimators) -> int | None:
    """A unit's text estimate when it is shown exactly as its one message's stored content
    (a one-line user message): the estimate of that text taken when it was stored."""
    if len(u.messages) != 1 or u.text != u.messages[0].content:
        return None
    return est.content(u.messages[0])


def text_tokens(units: Sequence[Unit], est: Estimators) -> int:
    """R-BUD-2: the text estimate of the rendered units, summed.

    A unit shown exactly as its one message's stored content (a one-line user message)
    counts the estimate of that same text taken when it was stored (`est.content`), so
    a 5,000-message history is not tokenised again; the rest are estimated here.
    """
    total = 0
    for u in units:
        known = _stored_text_tokens(u, est)
        total += known if known is not None else est.text(u.text)
    return total


def stored_text_tokens(units: Sequence[Unit], est: Estimators) -> int:
    """The part of `text_tokens` the stored estimates give, without tokenising anything: at
    most `text_tokens`, and all of it when every unit is a one-line user message."""
    return sum(known for u in units if (known := _stored_text_tokens(u, est)) is not None)


def has_conversation(units: Sequence[Unit]) -> bool:
    """Whether there is anything to summarise (R-PROG-2: not when only markers are left)."""
    return bool(units)


def annotate(number: int, cost: int, text: str) -> str:
    """R-RUN-6: a numbered unit's text in a request."""
    return f"#{number}〔约 {cost} token〕{text}"


def number_units(
    units: Sequence[Unit], *, keep_cap: int, capacity: int, est: Estimators, measured: bool = False
) -> list[Part]:
    """R-RUN-6: number the units that may be kept verbatim, 1, 2, … in time order.

    Not numbered: incomplete shapes, a unit costing more than the keep cap kept
    verbatim, a unit whose annotated text is over half the request capacity
    (characters, or with `measured` estimated tokens). With a keep cap of 0 nothing
    is numbered (R-BUD-4: ratio 0 keeps nothing).

    A part's tokens come from the estimates the store keeps per message (each covers
    its message's framing, which pays for the separator and the 「助手: 」 prefix; a
    line break in the rendering adds one for its indentation), so a long history is
    not tokenised again.
    """
    parts: list[Part] = []
    number = 1
    annotation = est.text(annotate(99999, 99999, ""))
    msg = est.msg
    for u in units:
        messages = u.messages
        cost = msg(messages[0]) if len(messages) == 1 else sum(map(msg, messages))
        tokens = cost + u.text.count("\n")
        if u.complete and 0 < keep_cap and cost <= keep_cap:
            annotated = annotate(number, cost, u.text)
            if 2 * (tokens + annotation if measured else len(annotated)) <= capacity:
                parts.append(Part(u, number, cost, annotated, tokens + annotation))
                number += 1
                continue
        parts.append(Part(u, None, cost, u.text, tokens))
    return parts
