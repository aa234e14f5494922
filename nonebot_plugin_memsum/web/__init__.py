"""The owner's web page at /memsum/ on NoneBot's own FastAPI server (`MEMSUM_WEB_TOKEN`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from nonebot import get_bots
from nonebot.adapters.onebot.v11 import Bot as OneBotV11Bot
from nonebot.drivers import Driver
from nonebot.log import logger

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.config import Config

from .app import create_app

PREFIX = "/memsum"
NAMES_SECONDS = 300
RETRY_SECONDS = 5
"""After a read of names that reached no bot."""


def mount(driver: Driver, config: Config) -> None:
    """Mount the page on the driver's server app when a token is set; say once at start-up
    whether it is on."""
    token = config.memsum_web_token.get_secret_value()
    app = getattr(driver, "server_app", None)
    if not token:
        message = "memsum: web page off (MEMSUM_WEB_TOKEN is empty)"
    elif app is None or not hasattr(app, "mount"):
        message = (
            f"memsum: web page off: the {driver.type} driver serves no FastAPI app (use DRIVER=~fastapi)"
        )
    else:
        app.mount(PREFIX, create_app(runtime.get, token, _OneBotNames()))
        access = logging.getLogger("uvicorn.access")
        if not any(isinstance(f, _NoQueryInAccessLog) for f in access.filters):
            access.addFilter(_NoQueryInAccessLog())
        message = f"memsum: web page at {page_url(str(driver.config.host), driver.config.port)}"

    @driver.on_startup
    async def _say() -> None:
        logger.info(message)


def page_url(host: str, port: int, path: str = f"{PREFIX}/", scheme: str = "http") -> str:
    """The link a start-up line gives the owner (the page's, bot.py's reverse WebSocket). A bot
    bound to every address (HOST=0.0.0.0 or ::, so that a phone on the home network reaches it)
    is opened at 127.0.0.1 on its own machine and at the machine's address from others:
    http://0.0.0.0:… is no address to open (Chromium refuses it)."""
    if host in ("0.0.0.0", "::"):
        return f"{scheme}://127.0.0.1:{port}{path} (HOST={host}: from another device, this machine's address)"
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address in a URL
    return f"{scheme}://{host}:{port}{path}"


class _NoQueryInAccessLog(logging.Filter):
    """uvicorn's access log writes every URL at INFO, the page's search words with it, which
    would then outlive a /清除 in the log files (issue 15: no message text at INFO): the
    page's URLs are logged without their query."""

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn: '%s - "%s %s HTTP/%s" %d' % (client, method, path with query, version, status)
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(path := args[2], str):
            if path.startswith(PREFIX + "/") and "?" in path:
                record.args = (*args[:2], path.split("?", 1)[0] + "?…", *args[3:])
        return True


class _OneBotNames:
    """Group names and friends' nicknames from the connected OneBot bots, re-read every
    few minutes; a bot that does not answer just leaves numbers on the page. A read that
    reached no bot (the page opened before the QQ client connected) is not kept: the next
    look, a few seconds later, asks again."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._next = 0.0

    async def __call__(self) -> Mapping[str, str]:
        if time.monotonic() < self._next:
            return self._names
        names: dict[str, str] = {}
        answered = False
        for bot in get_bots().values():
            if not isinstance(bot, OneBotV11Bot):
                continue
            try:
                for group in await bot.get_group_list():
                    names[f"group:{group['group_id']}"] = str(group.get("group_name") or "")
                answered = True
                for friend in await bot.get_friend_list():
                    label = friend.get("remark") or friend.get("nickname") or ""
                    names[f"private:{friend['user_id']}"] = str(label)
            except Exception as err:
                logger.debug(f"memsum: could not read names from bot {bot.self_id}: {err}")
        if not answered:
            self._next = time.monotonic() + RETRY_SECONDS
            return self._names
        self._names, self._next = names, time.monotonic() + NAMES_SECONDS
        return names
