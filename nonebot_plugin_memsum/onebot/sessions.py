"""Sessions from OneBot places: one per group and one per private peer, per bot account."""

from __future__ import annotations

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.types import SessionRecord

PLATFORM = "onebot"


def group_session_id(self_id: int | str, group_id: int | str) -> str:
    return f"{PLATFORM}:{self_id}:group:{group_id}"


def private_session_id(self_id: int | str, user_id: int | str) -> str:
    return f"{PLATFORM}:{self_id}:private:{user_id}"


def group_record(self_id: int | str, group_id: int | str) -> SessionRecord:
    """A group is a multi-party `room`; memory is per bot account."""
    return SessionRecord(
        id=group_session_id(self_id, group_id),
        platform=PLATFORM,
        kind="group",
        place=f"group:{group_id}",
        room_class="room",
        created=clock.now(),
    )


def private_record(self_id: int | str, user_id: int | str) -> SessionRecord:
    return SessionRecord(
        id=private_session_id(self_id, user_id),
        platform=PLATFORM,
        kind="private",
        peer=str(user_id),
        room_class="direct",
        created=clock.now(),
    )


def entry_of(record: SessionRecord) -> Entry:
    return Entry(record.platform, record.kind)
