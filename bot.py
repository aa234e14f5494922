"""The complete bot: NoneBot2 + OneBot v11 (reverse WebSocket) + this plugin.

Run from the folder that holds `.env` (copy `.env.example`): `python bot.py`. Other
plugins listed under `[tool.nonebot]` of a `pyproject.toml` in that folder (where
`nb plugin install` puts them) are loaded too.
"""

import sys
from pathlib import Path

import nonebot
from nonebot.adapters.onebot.v11 import Adapter as OneBotV11Adapter

nonebot.init()
nonebot.get_driver().register_adapter(OneBotV11Adapter)
project = Path("pyproject.toml")
if project.is_file() and "[tool.nonebot" in project.read_text("utf-8"):
    sys.path.insert(0, str(Path.cwd()))  # its plugin_dirs are folders of this one
    nonebot.load_from_toml(str(project))
if nonebot.get_plugin("nonebot_plugin_memsum") is None:
    nonebot.load_plugin("nonebot_plugin_memsum")

if __name__ == "__main__":
    nonebot.run()
