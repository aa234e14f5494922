"""The complete bot: NoneBot2 + OneBot v11 (reverse WebSocket) + this plugin.

Run from the folder that holds `.env` (copy `.env.example`): `python bot.py`.
"""

import nonebot
from nonebot.adapters.onebot.v11 import Adapter as OneBotV11Adapter

nonebot.init()
nonebot.get_driver().register_adapter(OneBotV11Adapter)
nonebot.load_plugin("nonebot_plugin_memsum")

if __name__ == "__main__":
    nonebot.run()
