"""Prompt assembly for the chat agent: pure functions, no I/O.

The prompt is the persona, then the contributions by anchor (`context`, where the
summary goes, is always the last system part, right before the history: R-INJ-1), then
the history. History is cut twice: count trimming (at most `history_limit` messages,
dropped in segments so the prefix stays stable between turns and prompt caches hit),
then hard trimming to the trim budget. Neither ever splits a tool-call group or leaves
a tool result without its call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo
from typing import Any, TypeVar

from nonebot_plugin_memsum.compression.budget import exact
from nonebot_plugin_memsum.llm.tokens import MESSAGE_OVERHEAD, NOTICE_PREFIX, REQUEST_OVERHEAD
from nonebot_plugin_memsum.types import (
    CONVERSATION_ROLES,
    REASONING_KEY,
    REFUSED_KEY,
    REFUSED_TEXT,
    Message,
    is_refused,
    shown_content,
    tool_extra,
    tool_reasoning,
)

CONTEXT_ANCHOR = "context"
C = TypeVar("C")
ANSWERED_LAST = (
    "[通知] 最后一条是你已经发出的回复；它之前到达、你还没有回应的消息请接着回应，没有就只回复 [不回复]。"
)


_WEEKDAYS = "一二三四五六日"
_PERIODS = ((5, "凌晨"), (8, "早上"), (11, "上午"), (13, "中午"), (17, "下午"), (19, "傍晚"), (24, "晚上"))
"""(the hour a part of the day ends at, its name)."""


def now_line(ts: float, zone: tzinfo | None) -> str:
    """The system part after the persona that tells the model the date: 「现在是 2026年12月5日
    星期六 下午（UTC+08:00）。」. The part of the day, not the minute: the line sits before
    the history, and a line that changed every turn would spoil the providers' prompt
    cache of the whole history (issue 9); this one changes seven times a day."""
    at = datetime.fromtimestamp(ts, zone).astimezone(zone)
    period = next(name for end, name in _PERIODS if at.hour < end)
    offset = at.strftime("%z")
    return (
        f"现在是 {at.year}年{at.month}月{at.day}日 星期{_WEEKDAYS[at.weekday()]} {period}"
        f"（UTC{offset[:3]}:{offset[3:]}）。"
    )


def contribution_order(contributions: Mapping[str, Sequence[C]], summary: C | None) -> list[tuple[str, C]]:
    """The system parts' sources in prompt order, with their anchors: anchors in registration
    order, `context` last, and the summary last of all, after what other plugins put under
    `context`, so it sits right before the history (R-INJ-1)."""
    anchors = [a for a in contributions if a != CONTEXT_ANCHOR]
    anchors += [CONTEXT_ANCHOR] if CONTEXT_ANCHOR in contributions else []
    ordered = [(anchor, fn) for anchor in anchors for fn in contributions[anchor]]
    return [*ordered, (CONTEXT_ANCHOR, summary)] if summary is not None else ordered


def conversation(history: Sequence[Message]) -> list[Message]:
    """What may reach the model: no event markers, no stored system items."""
    # `Message.is_conversation` spelled out: a property call per message was a third of
    # the filter's time, and every turn filters the whole active history.
    return [m for m in history if m.role in CONVERSATION_ROLES and not m.event_marker]


def _group_spans(history: Sequence[Message]) -> list[tuple[int, int]]:
    """(first, last) index of every tool-call group: the call and the results that answer it.

    One pass from the end (the latest result of each call id so far), so trimming a
    long history stays linear.
    """
    spans: list[tuple[int, int]] = []
    latest: dict[str, int] = {}
    for i in range(len(history) - 1, -1, -1):
        m = history[i]
        if m.role == "tool" and m.tool_call_id is not None:
            latest.setdefault(m.tool_call_id, i)
        elif m.role == "assistant" and m.tool_calls:
            spans.append((i, max(i, *(latest.get(c.id, i) for c in m.tool_calls))))
    spans.reverse()
    return spans


def _jumps(history: Sequence[Message]) -> list[int]:
    """For each index inside a group (after its call), the index right after the group."""
    firsts = dict(_group_spans(history))
    jump = list(range(len(history) + 1))
    if not firsts:  # no tool-call group: every index is a safe start
        return jump
    reach = -1
    for k in range(1, len(history)):
        reach = max(reach, firsts.get(k - 1, -1))
        if reach >= k:
            jump[k] = reach + 1
    return jump


def _safe_start(history: Sequence[Message], start: int, jump: list[int]) -> int:
    i = max(0, start)
    while i < len(history):
        if jump[i] != i:
            i = jump[i]
        elif history[i].role == "tool":  # its call lies before the start: it would be orphaned
            i += 1
        else:
            break
    return min(i, len(history))


def safe_start(history: Sequence[Message], start: int) -> int:
    """The first index ≥ start where the list may begin without splitting a group."""
    return _safe_start(history, start, _jumps(history))


def count_trim(history: Sequence[Message], limit: int) -> list[Message]:
    """At most `limit` conversation messages, dropping the earliest in segments (R-CFG-6).

    The segment is half the limit: the cut point moves only every limit/2 messages, so
    the sent prefix stays the same between most turns.
    """
    return _count_trim(conversation(history), limit)


def _count_trim(conv: list[Message], limit: int) -> list[Message]:
    if limit <= 0 or len(conv) <= limit:
        return conv
    segment = max(1, limit // 2)
    excess = len(conv) - limit
    drop = -(-excess // segment) * segment
    return conv[safe_start(conv, drop) :]


def hard_trim(
    history: Sequence[Message],
    fixed_tokens: int,
    budget: int,
    estimate: Callable[[Message], int],
    costs: Sequence[int] | None = None,
) -> tuple[list[Message], bool]:
    """Drop the oldest history until fixed parts + history fit `budget`; report whether it dropped.

    `costs`, when given, are the estimates of `history` already made.
    """
    kept = list(history)
    costs = [estimate(m) for m in kept] if costs is None else costs
    total = fixed_tokens + sum(costs)
    if total <= budget:  # most turns: nothing to drop, no need of the groups' spans
        return kept, False
    jump = _jumps(kept)
    start = 0
    while total > budget and start < len(kept):
        nxt = _safe_start(kept, start + 1, jump)
        total -= sum(costs[start:nxt])
        start = nxt
    return kept[start:], start > 0


def sendable(history: Sequence[Message]) -> list[Message]:
    """Drop what an OpenAI-compatible API would reject: calls without all their results
    (a turn that crashed mid-way) and results without their call; a message stored between
    a call and its results goes after the group."""
    if not _has_tool_messages(history):  # most histories: nothing to check
        return list(history)
    return _sendable_checked(history)


def _sendable_checked(history: Sequence[Message]) -> list[Message]:
    """`sendable` without its shortcut: every call and result checked.

    A result answers the latest earlier call with its id that is still open (as the
    compression groups them). A message stored between a call and its results (a member
    spoke while the tool ran) is sent after the group, as R-RUN-2 places it for the
    summariser: providers refuse anything between the calls and their results.
    """
    results: dict[int, list[Message]] = {}
    wanted: dict[int, set[str]] = {}
    open_calls: dict[str, int] = {}
    for i, m in enumerate(history):
        if m.role == "assistant" and m.tool_calls:
            results[i], wanted[i] = [], {c.id for c in m.tool_calls}
            open_calls.update((c.id, i) for c in m.tool_calls)
        elif m.role == "tool" and m.tool_call_id is not None and m.tool_call_id in open_calls:
            head = open_calls.pop(m.tool_call_id)
            results[head].append(m)
            wanted[head].discard(m.tool_call_id)
    out: list[Message] = []
    for i, m in enumerate(history):
        if m.role == "assistant" and m.tool_calls:
            if not wanted[i]:
                out += [m, *results[i]]  # the group whole, at its call's place
            elif m.content:
                # No id: the copy is not the stored message (estimates are cached by id). A
                # refused one stays its placeholder (its words were what the review refused).
                refused = {REFUSED_KEY: True} if is_refused(m) else {}
                out.append(
                    Message(
                        role="assistant", content=m.content, ts=m.ts, withdrawn=m.withdrawn, metadata=refused
                    )
                )
        elif m.role != "tool":  # a result went out with its whole group, or not at all
            out.append(m)
    return out


def _has_tool_messages(history: Sequence[Message]) -> bool:
    """Whether any message is a tool call or a tool result."""
    for m in history:  # a plain loop: stops at the first, and beats any() over a generator
        if m.tool_calls or m.role == "tool":
            return True
    return False


def to_openai(m: Message) -> dict[str, Any]:
    """One stored message as an OpenAI chat message. Notices go in as user turns; a withdrawn
    message (撤回) as its label and a placeholder (`shown_content`), never its text."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": shown_content(m)}
    if m.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": shown_content(m) or None}
        if m.tool_calls:
            # A call the provider's review refused keeps its id and name (its result answers it)
            # but not its arguments or reasoning: they held what was refused (llm/review.py).
            refused = is_refused(m)
            extra = tool_extra(m)
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": "{}" if refused else c.arguments},
                }
                | ({"extra_content": extra[c.id]} if c.id in extra else {})
                for c in m.tool_calls
            ]
            if reasoning := tool_reasoning(m):
                out[REASONING_KEY] = REFUSED_TEXT if refused else reasoning
        return out
    if m.role == "system":
        return {"role": "system", "content": m.content}
    if m.role == "notice":
        return {"role": "user", "content": f"{NOTICE_PREFIX}{shown_content(m)}"}
    return {"role": "user", "content": shown_content(m)}


@dataclass(frozen=True, slots=True)
class Prompt:
    """An assembled prompt and the figures the usage event reports."""

    messages: list[dict[str, Any]]
    history: list[Message]
    estimate: int
    untrimmed_history: int
    trimmed: bool
    conversation: int = 0
    """Conversation messages in the history before any trimming (R-TRIG-4's count)."""


def assemble(
    system_parts: Sequence[str],
    history: Sequence[Message],
    *,
    history_limit: int,
    trim_budget: int,
    tools_tokens: int = 0,
    estimate_msg: Callable[[Message], int],
    estimate_text: Callable[[str], int],
    wire: Callable[[Sequence[Message]], Sequence[dict[str, Any]]] | None = None,
) -> Prompt:
    """System parts (persona, contributions, `context` last), then the trimmed history.
    A message's cost is the estimate stored with it (`Message.tokens`), else `estimate_msg`'s.
    `tools_tokens`: the size of the tools offered with the request (`tools_tokens()`).
    `wire`: the history messages as sent (default to_openai each; agent/wire.py keeps each made once)."""
    conv = conversation(history)
    counted = sendable(_count_trim(conv, history_limit))
    fixed = REQUEST_OVERHEAD + tools_tokens
    fixed += sum(estimate_text(p) + MESSAGE_OVERHEAD for p in system_parts if p)
    # Messages that came in while the last answer was being written are stored before it;
    # some APIs refuse a prompt that ends with the assistant, and the model would read the
    # question as answered: a notice follows it, counted before the trim so the request fits.
    answered_last = bool(counted) and counted[-1].role == "assistant" and not counted[-1].tool_calls
    notice = estimate_text(ANSWERED_LAST) + MESSAGE_OVERHEAD if answered_last else 0
    fixed += notice
    # The stored estimate read here, not through a call per message: every turn costs the
    # whole active history.
    costs = [m.tokens if m.tokens is not None else estimate_msg(m) for m in counted]
    untrimmed = sum(costs)
    kept, trimmed = hard_trim(counted, fixed, trim_budget, estimate_msg, costs)
    kept_tokens = sum(costs[len(counted) - len(kept) :])  # kept is a tail of counted
    if not kept and counted and counted[-1].role in ("user", "notice"):
        kept = [_cut_to_fit(counted[-1], trim_budget - fixed, estimate_msg)]
        kept_tokens = estimate_msg(kept[0])
    messages = [{"role": "system", "content": p} for p in system_parts if p]
    messages += [to_openai(m) for m in kept] if wire is None else wire(kept)
    if answered_last and kept:  # kept is a tail of counted: it ends with that answer
        messages.append({"role": "user", "content": ANSWERED_LAST})
    return Prompt(
        messages=messages,
        history=kept,
        estimate=fixed + kept_tokens - (0 if kept else notice),
        untrimmed_history=untrimmed,
        trimmed=trimmed,
        conversation=len(conv),
    )


def tools_tokens(tools: Sequence[dict[str, Any]], estimate_text: Callable[[str], int]) -> int:
    """What the tools' schemas add to a request: they are sent as JSON."""
    return estimate_text(json.dumps(list(tools), ensure_ascii=False)) if tools else 0


def _cut_to_fit(m: Message, tokens: int, estimate: Callable[[Message], int]) -> Message:
    """The newest message alone is over the budget: send its head rather than nothing.

    Characters per token vary by script (rare CJK takes ~2 tokens a character, emoji up
    to 4), so the head is measured, shrinking in proportion until it fits; the stored
    message stays whole.
    """

    def head(keep: int) -> Message:
        return replace(m, content=m.content[:keep] + "…（消息过长，已截断）", id=None, tokens=None)

    return head(_longest_head(len(m.content), tokens, lambda keep: estimate(head(keep))))


def cut_text(text: str, tokens: int, estimate_text: Callable[[str], int]) -> str:
    """The longest head of `text` that takes at most `tokens` (measured as `_cut_to_fit` does)."""
    return text[: _longest_head(len(text), tokens, lambda keep: estimate_text(text[:keep]))]


def _longest_head(length: int, tokens: int, cost_of: Callable[[int], int]) -> int:
    """How many of `length` characters to keep so that `cost_of(kept)` ≤ `tokens` (0 at
    worst), shrinking in proportion to the overshoot until it fits."""
    keep = min(length, max(0, tokens))
    while True:
        cost = cost_of(keep)
        if cost <= tokens or keep == 0:
            return keep
        keep = min(keep - 1, keep * tokens // cost)


def trim_budget(window: int, trim_ratio: float, model_max_output: int | None, reply_max_tokens: int) -> int:
    """⌊trim_ratio × window⌋ − the reply reserve (the model's max output, capped by ours).

    The ratio is read as the decimal it is written as (`exact`), as the compression line is:
    in binary floats 0.29 × 200000 is 57999.99…, a token short."""
    reserve = min(model_max_output, reply_max_tokens) if model_max_output else reply_max_tokens
    return max(0, math.floor(exact(trim_ratio) * window) - reserve)
