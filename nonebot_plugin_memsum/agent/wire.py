"""Each stored message's wire form (its OpenAI dict and that dict's JSON), made once.

A turn sends the session's whole active history, and converting and JSON-encoding every
message again for each call was most of the cost of building a request (about 0.5 ms for
300 messages). The form is kept on the message object itself (`Message.wire`): stored
messages are frozen, and the store's history cache hands out the same objects until the
history changes, so what a compression, a clear or a restart changes is read anew as new
objects without one; nothing needs invalidating, and the memo takes no memory of its own
beyond the objects' lifetime (issue 15: a separate cache keyed by message held 32 MiB of
messages the history cache had already let go at a thousand groups, and took minutes to fill).
"""

from __future__ import annotations

from collections.abc import Sequence

from nonebot_plugin_memsum.llm.client import WireMessage
from nonebot_plugin_memsum.types import Message

from .prompt import to_openai

_set_wire = getattr(Message, "wire").__set__  # the slot's own setter: Message is frozen


def wire_forms(messages: Sequence[Message]) -> list[WireMessage]:
    """The messages' wire forms, in order (this runs over every history sent, so the common
    case, a form already made, is one attribute read). Messages without a stored id (copies
    made for one prompt) are converted each time and carry nothing."""
    return [m.wire if m.wire is not None else _made(m) for m in messages]


def _made(m: Message) -> WireMessage:
    wire = WireMessage(to_openai(m))
    if m.id is not None:
        _set_wire(m, wire)
    return wire


__all__ = ["wire_forms"]
