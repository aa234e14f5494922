"""bot.py under cProfile, for `bench/soak.py --profile`: the statistics go to
`profile.out` in the bot's folder when it stops (SIGTERM, not SIGKILL)."""

import cProfile
import runpy
import signal
import sys
from pathlib import Path

BOT = Path(__file__).resolve().parents[1] / "bot.py"

profile = cProfile.Profile()


def _dump() -> None:
    profile.disable()
    profile.dump_stats("profile.out")


_raise_signal = signal.raise_signal


def _dump_then_raise(signum: int) -> None:
    # uvicorn ends its SIGTERM shutdown by raising the signal again with the default
    # handler, which ends the process before any `finally` below could run.
    _dump()
    _raise_signal(signum)


signal.raise_signal = _dump_then_raise
# As `python bot.py` has it: NoneBot's plugin finder looks the plugin up on sys.path, and
# finds it only beside bot.py (the editable install's own finder loads it as a plain module).
sys.path[0] = str(BOT.parent)
profile.enable()
try:
    runpy.run_path(str(BOT), run_name="__main__")
finally:
    _dump()
