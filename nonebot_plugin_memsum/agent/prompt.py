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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nonebot_plugin_memsum.types import Message

CONTEXT_ANCHOR = "context"


def conversation(history: Sequence[Message]) -> list[Message]:
    """What may reach the model: no event markers, no stored system items."""
    return [m for m in history if m.is_conversation]


def _group_spans(history: Sequence[Message]) -> list[tuple[int, int]]:
    """(first, last) index of every tool-call group: the call and the results that answer it."""
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(history):
        if m.role == "assistant" and m.tool_calls:
            ids = {c.id for c in m.tool_calls}
            last = i
            for j in range(i + 1, len(history)):
                if history[j].role == "tool" and history[j].tool_call_id in ids:
                    last = j
            spans.append((i, last))
    return spans


def safe_start(history: Sequence[Message], start: int) -> int:
    """The first index ≥ start where the list may begin without splitting a group."""
    spans = _group_spans(history)
    i = start
    moved = True
    while moved and i < len(history):
        moved = False
        for first, last in spans:
            if first < i <= last:
                i, moved = last + 1, True
        # a result whose call lies before the start would be orphaned
        while i < len(history) and history[i].role == "tool":
            i, moved = i + 1, True
    return min(i, len(history))


def count_trim(history: Sequence[Message], limit: int) -> list[Message]:
    """At most `limit` conversation messages, dropping the earliest in segments (R-CFG-6).

    The segment is half the limit: the cut point moves only every limit/2 messages, so
    the sent prefix stays the same between most turns.
    """
    conv = conversation(history)
    if limit <= 0 or len(conv) <= limit:
        return conv
    segment = max(1, limit // 2)
    excess = len(conv) - limit
    drop = -(-excess // segment) * segment
    return conv[safe_start(conv, drop) :]


def hard_trim(
    history: Sequence[Message], fixed_tokens: int, budget: int, estimate: Callable[[Message], int]
) -> tuple[list[Message], bool]:
    """Drop the oldest history until fixed parts + history fit `budget`; report whether it dropped."""
    kept = list(history)
    costs = [estimate(m) for m in kept]
    total = fixed_tokens + sum(costs)
    start = 0
    while total > budget and start < len(kept):
        nxt = safe_start(kept, start + 1)
        total -= sum(costs[start:nxt])
        start = nxt
    return kept[start:], start > 0


def sendable(history: Sequence[Message]) -> list[Message]:
    """Drop what an OpenAI-compatible API would reject: calls without all their results
    (a turn that crashed mid-way) and results without their call."""
    answered = {m.tool_call_id for m in history if m.role == "tool"}
    called: set[str] = set()
    out: list[Message] = []
    for m in history:
        if m.role == "assistant" and m.tool_calls:
            if all(c.id in answered for c in m.tool_calls):
                called.update(c.id for c in m.tool_calls)
                out.append(m)
            elif m.content:
                out.append(Message(role="assistant", content=m.content, ts=m.ts, id=m.id))
        elif m.role == "tool":
            if m.tool_call_id in called:
                out.append(m)
        else:
            out.append(m)
    return out


def to_openai(m: Message) -> dict[str, Any]:
    """One stored message as an OpenAI chat message. Notices go in as user turns."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": m.content or None}
        if m.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
        return out
    if m.role == "system":
        return {"role": "system", "content": m.content}
    if m.role == "notice":
        return {"role": "user", "content": f"[通知] {m.content}"}
    return {"role": "user", "content": m.content}


@dataclass(frozen=True, slots=True)
class Prompt:
    """An assembled prompt and the figures the usage event reports."""

    messages: list[dict[str, Any]]
    history: list[Message]
    estimate: int
    untrimmed_history: int
    trimmed: bool


def assemble(
    system_parts: Sequence[str],
    history: Sequence[Message],
    *,
    history_limit: int,
    trim_budget: int,
    tools: Sequence[dict[str, Any]] = (),
    estimate_msg: Callable[[Message], int],
    estimate_text: Callable[[str], int],
) -> Prompt:
    """System parts (persona, contributions, `context` last), then the trimmed history."""
    counted = sendable(count_trim(history, history_limit))
    fixed = sum(estimate_text(p) + 4 for p in system_parts if p)
    if tools:
        fixed += estimate_text(json.dumps(list(tools), ensure_ascii=False))
    untrimmed = sum(estimate_msg(m) for m in counted)
    kept, trimmed = hard_trim(counted, fixed, trim_budget, estimate_msg)
    if not kept and counted and counted[-1].role in ("user", "notice"):
        kept = [_cut_to_fit(counted[-1], trim_budget - fixed)]
    messages = [{"role": "system", "content": p} for p in system_parts if p]
    messages += [to_openai(m) for m in kept]
    return Prompt(
        messages=messages,
        history=kept,
        estimate=fixed + sum(estimate_msg(m) for m in kept),
        untrimmed_history=untrimmed,
        trimmed=trimmed,
    )


def _cut_to_fit(m: Message, tokens: int) -> Message:
    """The newest message alone is over the budget: send its head rather than nothing.

    One character per token undercounts no script (CJK is ~0.8 token a character), so
    the cut text fits; the stored message stays whole.
    """
    keep = max(0, tokens - 16)
    return replace(m, content=m.content[:keep] + "…（消息过长，已截断）")


def trim_budget(window: int, trim_ratio: float, model_max_output: int | None, reply_max_tokens: int) -> int:
    """⌊trim_ratio × window⌋ − the reply reserve (the model's max output, capped by ours)."""
    reserve = min(model_max_output, reply_max_tokens) if model_max_output else reply_max_tokens
    return max(0, int(trim_ratio * window) - reserve)
