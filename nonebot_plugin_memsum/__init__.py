"""nonebot-plugin-memsum: LLM chat memory that survives long conversations."""

from nonebot import get_driver, require
from nonebot.log import logger
from nonebot.plugin import PluginMetadata

require("nonebot_plugin_localstore")

from .config import Config, ConfigError, parse_config

__plugin_meta__ = PluginMetadata(
    name="记忆摘要",
    description="群聊与私聊的 LLM 对话记忆：上下文快满时把历史压成结构化摘要，归档原文，之后每轮注入摘要",
    usage="",
    type="application",
    homepage="https://github.com/nonebot/nonebot-plugin-memsum",
    config=Config,
    supported_adapters={"~onebot.v11"},
)

try:
    plugin_config = parse_config(get_driver().config.model_dump())
except ConfigError as err:
    # R-CFG-1: a bad value stops start-up; load_plugin would swallow an Exception and
    # run on without us, so leave with SystemExit (a BaseException).
    logger.opt(colors=False).critical(f"nonebot-plugin-memsum: {err}")
    raise SystemExit(2) from None
