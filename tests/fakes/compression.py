"""Message builders and deterministic token estimates for the compression core's tests."""

from __future__ import annotations

from nonebot_plugin_memsum.compression.units import Estimators
from nonebot_plugin_memsum.types import Message, ToolCall


def text_tokens(text: str) -> int:
    return len(text)


def msg_tokens(m: Message) -> int:
    return len(m.content) + 4


EST = Estimators(text=text_tokens, msg=msg_tokens)


def user(content: str, ts: float = 0.0) -> Message:
    return Message(role="user", content=content, ts=ts)


def assistant(content: str, *calls: tuple[str, str, str]) -> Message:
    """`calls` as (id, name, arguments)."""
    return Message(role="assistant", content=content, tool_calls=tuple(ToolCall(*c) for c in calls))


def result(call_id: str, content: str = "ok", name: str | None = None) -> Message:
    return Message(role="tool", content=content, tool_call_id=call_id, name=name)


def notice(content: str) -> Message:
    return Message(role="notice", content=content)


def divider() -> Message:
    return Message(role="system", content="对话已压缩", event_marker=True)
