"""Display names as a place sees them, from the runtime's bounded name cache, looked up
through the OneBot API when not known yet."""

from __future__ import annotations

from collections.abc import Iterable

from nonebot.adapters.onebot.v11 import Bot
from nonebot.log import logger

from nonebot_plugin_memsum import runtime

from .render import clean_name
from .state import UNKNOWN_NAME_TTL


def bot_name() -> str:
    nicknames = runtime.get().nicknames
    return next(iter(nicknames)) if nicknames else "机器人"


def remember(scope: str, user_id: int | str, name: str | None) -> str:
    """A name seen on an event (a sender's card or nickname): cached and returned clean."""
    cleaned = clean_name(name, str(user_id))
    runtime.get().onebot.names.put(scope, user_id, cleaned)
    return cleaned


def known(bot: Bot, scope: str, user_ids: Iterable[int | str]) -> dict[str, str]:
    """The names already known for these ids; the bot is known by its nickname."""
    cache = runtime.get().onebot.names
    out: dict[str, str] = {}
    for uid in map(str, user_ids):
        name = bot_name() if uid == bot.self_id else cache.get(scope, uid)
        if name is not None:
            out[uid] = name
    return out


async def look_up(bot: Bot, scope: str, group_id: int | None, user_ids: Iterable[str]) -> dict[str, str]:
    """Names for these ids: cached, else asked of the implementation (a member's card,
    else nickname; a stranger's nickname), else the number itself for a while."""
    cache = runtime.get().onebot.names
    out: dict[str, str] = {}
    for qq in user_ids:
        if qq in out or not qq.isdigit():
            continue
        if qq == bot.self_id:
            out[qq] = bot_name()
            continue
        if (name := cache.get(scope, qq)) is not None:
            out[qq] = name
            continue
        name = await _ask(bot, group_id, int(qq))
        if name:
            out[qq] = remember(scope, qq, name)
        else:
            out[qq] = qq
            cache.put(scope, qq, qq, UNKNOWN_NAME_TTL)
    return out


async def _ask(bot: Bot, group_id: int | None, user_id: int) -> str | None:
    """The implementation's answer: in a group the member's card, else nickname; someone
    who already left (or a private peer) by their account's nickname."""
    if group_id is not None:
        try:
            info = await bot.get_group_member_info(group_id=group_id, user_id=user_id)
            if name := info.get("card") or info.get("nickname"):
                return str(name)
        except Exception as err:
            logger.debug(f"memsum: no member info for {user_id} in {group_id}: {err}")
    try:
        info = await bot.get_stranger_info(user_id=user_id)
        return str(info.get("nickname") or "") or None
    except Exception as err:
        logger.debug(f"memsum: no name for {user_id}: {err}")
        return None
