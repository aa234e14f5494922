"""bot.py under cProfile, for `bench/soak.py --profile`: the statistics go to
`profile.out` in the bot's folder when it stops (SIGTERM, not SIGKILL)."""

import cProfile
import runpy
from pathlib import Path

BOT = Path(__file__).resolve().parents[1] / "bot.py"

profile = cProfile.Profile()
profile.enable()
try:
    runpy.run_path(str(BOT), run_name="__main__")
finally:
    profile.disable()
    profile.dump_stats("profile.out")
