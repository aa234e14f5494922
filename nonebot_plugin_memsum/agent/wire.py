"""Each stored message's wire form (its OpenAI dict and that dict's JSON), made once.

A turn sends the session's whole active history, and converting and JSON-encoding every
message again for each call was most of the cost of building a request (about 0.5 ms for
300 messages). Entries are keyed by the message object: stored messages are frozen, and
the store's history cache hands out the same objects until the history changes, so what a
compression, a clear or a restart changes is read anew as new objects and simply misses;
nothing here needs invalidating. An entry holds its message, so its key cannot be reused
while it lives. Bounded in bytes, least recently used first out (not lru.BoundedCache: its
clock read per lookup would cost more than the conversion it saves, hundreds of times a call).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from nonebot_plugin_memsum.llm.client import WireMessage
from nonebot_plugin_memsum.store.cache import message_bytes
from nonebot_plugin_memsum.types import Message

from .prompt import to_openai

MAX_BYTES = 32 << 20
_PER_ENTRY = 400
"""Bytes an entry costs beyond its message and its JSON: the dict, the tuple, the order links."""


class WireCache:
    """Message → its WireMessage; messages without a stored id (copies made for one
    prompt) are converted each time and not kept."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, tuple[Message, WireMessage, int]] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __call__(self, messages: Sequence[Message]) -> list[WireMessage]:
        """The messages' wire forms, in order (one pass: this runs over every history sent)."""
        entries = self._entries
        out: list[WireMessage] = []
        for m in messages:
            entry = entries.get(id(m))  # holding its message, an entry keeps that id its own
            if entry is None:
                out.append(self._add(m))
            else:
                entries.move_to_end(id(m))
                out.append(entry[1])
        return out

    def _add(self, m: Message) -> WireMessage:
        wire = WireMessage(to_openai(m))
        # The message and its JSON (3 UTF-8 bytes a CJK character against the decoded text's 2):
        # at most 2.5 times the message alone; counted before the JSON is made, as a prompt that
        # is only built (api.build_prompt) never encodes it.
        size = message_bytes(m) * 5 // 2 + _PER_ENTRY
        if m.id is None or size > self.max_bytes:
            return wire  # a copy made for one prompt, or one message over the bound
        self._entries[id(m)] = (m, wire, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped
        return wire


__all__ = ["MAX_BYTES", "WireCache"]
