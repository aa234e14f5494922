"""nonebot-plugin-memsum: LLM chat memory that survives long conversations."""

import os
import sys

from nonebot import get_driver, require
from nonebot.log import logger
from nonebot.plugin import PluginMetadata

from .commands import USAGE, is_memsum_command, register_commands
from .config import (
    Config,
    ConfigError,
    environment_only_keys,
    example_key_problems,
    parse_config,
    superuser_problems,
    unknown_keys,
)
from .errors import StoreError

__plugin_meta__ = PluginMetadata(
    name="记忆摘要",
    description="群聊与私聊的 LLM 对话记忆：上下文快满时把历史压成结构化摘要，归档原文，之后每轮注入摘要",
    usage=USAGE,
    type="application",
    homepage="https://github.com/nonebot/nonebot-plugin-memsum",
    config=Config,
    supported_adapters={"~onebot.v11"},
)


class StartUpRefused(SystemExit):
    """Start-up stopped after one CRITICAL line saying why (R-CFG-1): a SystemExit, which
    NoneBot's `load_plugin` does not swallow. Raised in the start-up hook, uvicorn logs the
    stack under that line; bot.py leaves it out by this name."""


def _run_as_tool() -> bool:
    """`python -m nonebot_plugin_memsum.migrate`: Python imports this package before the
    tool, with no NoneBot initialised (argv[0] is "-m" while it looks for the module); the
    tool needs none of the plugin's wiring below."""
    if sys.argv[:1] != ["-m"]:
        return False
    try:
        get_driver()
    except ValueError:
        return True
    return False


if not _run_as_tool():
    require("nonebot_plugin_localstore")
    try:
        raw_config = get_driver().config.model_dump()
        plugin_config = parse_config(raw_config)
    except ConfigError as err:
        # R-CFG-1: a bad value stops start-up; load_plugin would swallow an Exception and
        # run on without us, so leave with SystemExit (a BaseException).
        logger.opt(colors=False).critical(f"nonebot-plugin-memsum: {err}")
        raise StartUpRefused(2) from None

    for line in (
        unknown_keys(raw_config)
        + environment_only_keys(os.environ, raw_config)
        + superuser_problems(get_driver().config.superusers)
        + example_key_problems(plugin_config)
    ):
        logger.warning(f"nonebot-plugin-memsum: {line}")

    from nonebot_plugin_localstore import get_plugin_data_file

    from . import runtime, web
    from .onebot import register_matchers

    _driver = get_driver()
    register_matchers(plugin_config.memsum_chat_priority, is_memsum_command, register_commands(plugin_config))
    web.mount(_driver, plugin_config)

    @_driver.on_startup
    async def _start() -> None:
        location = plugin_config.store_location(get_plugin_data_file("memsum.db"))
        try:
            await runtime.start(
                plugin_config, location, sorted(_driver.config.nickname), set(_driver.config.superusers)
            )
        except StoreError as err:
            # R-CFG-1: a database that cannot be opened stops start-up with one line naming the key.
            key = "MEMSUM_DB_URL" if plugin_config.memsum_db_url.get_secret_value() else "MEMSUM_DB_PATH"
            logger.opt(colors=False).critical(f"nonebot-plugin-memsum: {key}: {err}")
            raise StartUpRefused(2) from None
        except ConfigError as err:  # R-CFG-1: a persona the chat model's window cannot carry
            logger.opt(colors=False).critical(f"nonebot-plugin-memsum: {err}")
            raise StartUpRefused(2) from None

    @_driver.on_shutdown
    async def _stop() -> None:
        await runtime.stop()
