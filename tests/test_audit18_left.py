"""Audit 18 (left): what the last session noticed and left alone.

- A withdrawal finds the replies quoting the message by a LIKE over their metadata: a platform
  id holding `\\`, `"`, `%`, `_` or `!` must match literally, on SQLite and on PostgreSQL (whose
  LIKE takes `\\` as its escape by default).
"""

from __future__ import annotations

from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.types import (
    QUOTE_OF_KEY,
    QUOTE_WITHDRAWN_KEY,
    WITHDRAWN_TEXT,
    Message,
    shown_content,
)

SID = "onebot:10000:group:93181"


def _reply(text: str, quoted: str, ts: float) -> Message:
    return Message(
        role="user",
        content=f"[乙(20002)] [回复 甲(20001)：{text}] 收到",
        name="20002",
        ts=ts,
        metadata={QUOTE_OF_KEY: quoted},
    )


async def test_a_platform_id_with_like_characters_marks_its_replies_and_only_those(store: Store) -> None:
    # JSON writes `\` as `\\` and `"` as `\"`, which PostgreSQL's LIKE read as escapes; `%`
    # and `_` are LIKE's wildcards on both engines: `decoy` matches them as a pattern.
    odd = 'x\\y"z%w_v!'
    decoy = 'x\\y"zAAw-v!'
    await store.append(SID, Message(role="user", content="[甲(20001)] 奇怪的编号", ts=1.0, platform_id=odd))
    await store.append(SID, Message(role="user", content="[甲(20001)] 另一条", ts=2.0, platform_id=decoy))
    await store.append(SID, _reply("奇怪的编号", odd, 3.0))
    await store.append(SID, _reply("另一条", decoy, 4.0))

    await store.mark_withdrawn(SID, odd)
    history = await store.get_history(SID)
    assert [m.metadata.get(QUOTE_WITHDRAWN_KEY) for m in history[2:]] == [True, None]
    assert shown_content(history[2]) == f"[乙(20002)] [回复 甲(20001)：{WITHDRAWN_TEXT}] 收到"
    assert shown_content(history[3]) == "[乙(20002)] [回复 甲(20001)：另一条] 收到"

    # A message never stored (said before the bot came) is looked for in the active history.
    unknown = '%"\\_'
    await store.append(SID, _reply("早先的话", unknown, 5.0))
    await store.mark_withdrawn(SID, unknown)
    history = await store.get_history(SID)
    assert [m.metadata.get(QUOTE_WITHDRAWN_KEY) for m in history[2:]] == [True, None, True]
