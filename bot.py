"""The complete bot: NoneBot2 + OneBot v11 (reverse WebSocket) + this plugin.

Run from the folder that holds `.env` (copy `.env.example`): `python bot.py`. Other
plugins listed under `[tool.nonebot]` of a `pyproject.toml` in that folder (where
`nb plugin install` puts them) are loaded too.
"""

import os
import sys
from pathlib import Path

import nonebot
from nonebot.adapters.onebot.v11 import Adapter as OneBotV11Adapter
from nonebot.log import default_filter, default_format, logger, logger_id

# NoneBot logs every event with its text (SUCCESS) and every matcher run (INFO): at a
# thousand groups that is most of the log, and what /清除 removed would live on in it.
# Those lines show at LOG_LEVEL=DEBUG only; their warnings and errors stay.
# NoneBot names every record "nonebot"; the file tells them apart.
_PER_EVENT = (
    os.path.join("nonebot", "message.py"),
    os.path.join("nonebot", "internal", "matcher", "matcher.py"),
)


def _log_filter(record) -> bool:
    if record["file"].path.endswith(_PER_EVENT) and record["level"].no < logger.level("WARNING").no:
        configured = record["extra"].get("nonebot_log_level", "INFO")
        level = logger.level(configured).no if isinstance(configured, str) else configured
        return level <= logger.level("DEBUG").no
    return default_filter(record)


def _log_to_stdout(level: int | str) -> int:
    return logger.add(sys.stdout, level=level, diagnose=False, filter=_log_filter, format=default_format)


logger.remove(logger_id)
_handler = _log_to_stdout(0)  # until nonebot.init() has read LOG_LEVEL
nonebot.init()
# At the configured level, not 0: below every handler's level loguru returns before it
# builds a record, and NoneBot's debug and trace lines for each event and matcher cost
# about 5 % of the bot's CPU at a thousand groups when only the filter dropped them.
logger.remove(_handler)
_log_to_stdout(nonebot.get_driver().config.log_level)
nonebot.get_driver().register_adapter(OneBotV11Adapter)
project = Path("pyproject.toml")
if project.is_file() and "[tool.nonebot" in project.read_text("utf-8"):
    sys.path.insert(0, str(Path.cwd()))  # its plugin_dirs are folders of this one
    nonebot.load_from_toml(str(project))
if nonebot.get_plugin("nonebot_plugin_memsum") is None:
    nonebot.load_plugin("nonebot_plugin_memsum")

if __name__ == "__main__":
    nonebot.run()
