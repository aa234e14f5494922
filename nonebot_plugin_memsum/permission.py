"""Who may use a command, as NoneBot permission objects.

A matcher whose permission says no is never run, so a command of someone not allowed
is not handled at all: no refusal, nothing recorded, and the event goes on to other
plugins (one may have a `/摘要` of its own).
"""

from __future__ import annotations

from nonebot.adapters import Bot, Event
from nonebot.adapters.onebot.v11 import GROUP_ADMIN, GROUP_OWNER
from nonebot.permission import SUPERUSER, Permission

from . import runtime

__all__ = ["SUPERUSER", "SUPERUSER_OR_GROUP_ADMIN", "group_admin_allowed"]

_GROUP_OWNER_OR_ADMIN = GROUP_OWNER | GROUP_ADMIN


async def group_admin_allowed(bot: Bot, event: Event) -> bool:
    """A group's owner or admin in that group, when `MEMSUM_GROUP_ADMIN_COMMANDS` is on."""
    if not runtime.get().config.memsum_group_admin_commands:
        return False
    return await _GROUP_OWNER_OR_ADMIN(bot, event)


SUPERUSER_OR_GROUP_ADMIN = SUPERUSER | Permission(group_admin_allowed)
"""The bot's superusers anywhere; a group's owner and admins in their own group when
`MEMSUM_GROUP_ADMIN_COMMANDS=true`. For every command that acts on one place only."""
