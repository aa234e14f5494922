"""What the in-process agent tests share: a persona that marks the chat's requests, the
scripted summary for background compressions, message and tool-call builders, event and
reply recorders, and the token figures a test computes by hand. The `make_rt` fixture
(tests/conftest.py) builds private runtimes on a fresh database."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from nonebot_plugin_memsum.agent.events import TurnEnded, TurnStarted, UsageEvent
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.llm.tokens import (
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    estimate_text_tokens,
)
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import Reply, ScriptedLLM

PERSONA = "你是测试群里的助手小记，回答简短。"
SUMMARY = "【最近在聊什么】\n闲聊\n【谁有问题没回应】\n无\n【关键原话要点】\n无\n【保留原文】\n无"
GROUP = SessionRecord(
    id="onebot:10000:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
)
GROUP_ENTRY = Entry("onebot", "group")
MODEL_ID = "test/model"

Event = TurnStarted | TurnEnded | UsageEvent
MakeRuntime = Callable[..., Awaitable[Runtime]]


def is_chat(body: dict[str, Any]) -> bool:
    """A request of the chat agent (the persona first), not of the compression."""
    return body["messages"][0] == {"role": "system", "content": PERSONA}


def chat_requests(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [b for b in list(llm.requests) if is_chat(b)]


def summaries_only(body: dict[str, Any]) -> Reply | None:
    # A compression the count or usage line starts in the background gets its own
    # answer, so it never takes a reply a test queued for the chat.
    return None if is_chat(body) else Reply(SUMMARY)


def user(text: str, uid: int = 20001, name: str = "甲") -> Message:
    return Message(role="user", content=f"[{name}({uid})] {text}", name=str(uid))


def tool_call(cid: str, name: str, arguments: Any) -> dict[str, str]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": cid, "name": name, "arguments": args}


def openai_user(m: Message) -> dict[str, Any]:
    return {"role": "user", "content": m.content}


class Events:
    """Every turn and usage event of a bus, in order."""

    def __init__(self, rt: Runtime) -> None:
        self.items: list[Event] = []
        rt.bus.subscribe(TurnStarted, self.items.append)
        rt.bus.subscribe(TurnEnded, self.items.append)
        rt.bus.subscribe(UsageEvent, self.items.append)

    def usage(self) -> list[UsageEvent]:
        return [e for e in self.items if isinstance(e, UsageEvent)]

    def turns(self) -> list[TurnStarted | TurnEnded]:
        return [e for e in self.items if not isinstance(e, UsageEvent)]


class Replies:
    """The reply function of a turn: what the bot would have said in chat."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def __call__(self, text: str) -> None:
        self.texts.append(text)


async def fill(rt: Runtime, session: SessionRecord, messages: list[Message]) -> list[Message]:
    return [await rt.agent.record(session, m) for m in messages]


def tools_tokens(rt: Runtime) -> int:
    return estimate_text_tokens(json.dumps(rt.tools.schemas(), ensure_ascii=False))


def system_tokens(*parts: str) -> int:
    """The system messages and the request's own priming (openai-cookbook's count)."""
    return REQUEST_OVERHEAD + sum(estimate_text_tokens(p) + MESSAGE_OVERHEAD for p in parts)
