"""Events and deliveries through NoneBot's test app (nonebug), shared by the tests that
drive the plugin in-process: message factories in the nonebot-plugin-template style
(pydantic `create_model`, so a test states only what matters), matchers for answers,
and what a test reads back.

The plugin runs as tests/conftest.py starts it (temporary database, superuser 10001, no
model); each test works in a group or private chat of its own (`new_group`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any, Literal, Self

import pytest
from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, PrivateMessageEvent
from nonebot.adapters.onebot.v11 import Message as OBMessage
from nonebot.adapters.onebot.v11.event import Sender
from nonebug import App
from pydantic import create_model

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import UsageEvent
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.types import Message

SELF_ID = "10000"
SUPERUSER_ID = 10001
_places = itertools.count(700_001)


def new_group() -> int:
    """A group (or private peer) id no other test uses."""
    return next(_places)


# What every message event has and no test needs to state.
_MESSAGE_DEFAULTS: dict[str, Any] = {
    "time": (int, 1_700_000_000),
    "self_id": (int, int(SELF_ID)),
    "post_type": (Literal["message"], "message"),
    "message_id": (int, 1),
    "raw_message": (str, ""),
    "font": (int, 0),
}
_GroupEvent = create_model(
    "_GroupEvent",
    __base__=GroupMessageEvent,
    message_type=(Literal["group"], "group"),
    sub_type=(str, "normal"),
    **_MESSAGE_DEFAULTS,
)
_PrivateEvent = create_model(
    "_PrivateEvent",
    __base__=PrivateMessageEvent,
    message_type=(Literal["private"], "private"),
    sub_type=(str, "friend"),
    **_MESSAGE_DEFAULTS,
)


# Each event its own message id, as QQ gives them.
_message_ids = itertools.count(1)


def group_msg(text: str, group: int, *, user: int = SUPERUSER_ID, role: str = "member") -> GroupMessageEvent:
    sender = Sender(user_id=user, nickname=f"用户{user}", card="", role=role)
    fields = {
        "user_id": user,
        "group_id": group,
        "message": OBMessage(text),
        "raw_message": text,
        "message_id": next(_message_ids),
    }
    return _GroupEvent.model_validate({**fields, "sender": sender})


def private_msg(text: str, user: int = SUPERUSER_ID) -> PrivateMessageEvent:
    sender = Sender(user_id=user, nickname=f"用户{user}")
    fields = {
        "user_id": user,
        "message": OBMessage(text),
        "raw_message": text,
        "message_id": next(_message_ids),
    }
    return _PrivateEvent.model_validate({**fields, "sender": sender})


class Like(str):
    """Equal to any text the pattern matches (nonebug compares expected != actual)."""

    seen: str | None = None

    def __new__(cls, pattern: str) -> Self:
        return super().__new__(cls, pattern)

    def __eq__(self, other: object) -> bool:
        if re.fullmatch(str(self), str(other), re.S) is None:
            return False
        self.seen = str(other)
        return True

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


class Satisfies:
    """Equal to any value the predicate accepts."""

    def __init__(self, predicate: Callable[[Any], bool]) -> None:
        self.predicate = predicate

    def __eq__(self, other: object) -> bool:
        return self.predicate(other)

    def __ne__(self, other: object) -> bool:
        return not self.predicate(other)

    __hash__ = None  # type: ignore[assignment]


def forwarded_text(nodes: Any) -> str:
    """The text of a merged-forward message's nodes."""
    return "".join(seg["data"]["text"] for n in nodes for seg in n["data"]["content"])


async def forwarded(app: App, group: int, command: str) -> list[str]:
    """The texts of the merged-forward nodes the bot answers `command` in `group` with."""
    nodes: list[Any] = []

    def keep(sent: Any) -> bool:
        nodes.extend(sent)
        return True

    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, group_msg(command, group))
        ctx.should_call_api(
            "send_group_forward_msg", {"group_id": group, "messages": Satisfies(keep)}, result={}
        )
    return [seg["data"]["text"] for n in nodes for seg in n["data"]["content"]]


async def run(app: App, event: Any, expect: str | None) -> None:
    """Deliver `event`; the bot answers exactly `expect` (None: it says nothing). A long
    answer in a group goes out as a merged-forward message holding exactly that text."""
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        threshold = runtime.get().config.memsum_forward_threshold
        if expect is None:
            return
        if isinstance(event, GroupMessageEvent) and not isinstance(expect, Like) and len(expect) > threshold:
            ctx.should_call_api(
                "send_group_forward_msg",
                {"group_id": event.group_id, "messages": Satisfies(lambda n: forwarded_text(n) == expect)},
                result={},
            )
        else:
            ctx.should_call_send(event, expect, result={"message_id": 1})


async def history(session_id: str) -> list[Message]:
    return await runtime.get().store.get_history(session_id)


def seeded_line(i: int) -> str:
    return f"[用户2000{i}(2000{i})] 第 {i} 句：周末去爬山吗"


async def seed(session_id: str, group: int, n: int) -> None:
    record = group_record(SELF_ID, group)
    for i in range(n):
        await runtime.get().agent.record(record, Message(role="user", content=seeded_line(i), ts=1.0 + i))
    assert record.id == session_id


async def turns_requested(app: App, event: Any) -> list[str]:
    """Deliver a message (nothing said back); the sessions it asked the agent to answer
    (recorded instead of run: a turn without a model would answer with an apology)."""
    asked: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime.get().agent, "request_turn", lambda sid, *a, **k: asked.append(sid))
        await run(app, event, None)
    return asked


def to_me(event: GroupMessageEvent) -> GroupMessageEvent:
    return event.model_copy(update={"to_me": True})


async def usage_event(session_id: str, used: int, window: int = 64000, trim_budget: int = 60000) -> None:
    """What the agent reports before a model call, as the compression service hears it."""
    await runtime.get().bus.emit(
        UsageEvent(
            session_id=session_id,
            turn_id="turn-1",
            platform="onebot",
            platform_type="group",
            model_id="test/model",
            window=window,
            trim_budget=trim_budget,
            usage=used,
            trimmed=False,
            untrimmed_history=0,
            history_messages=0,
            history_limit=0,
        )
    )
