"""bot.py under tracemalloc, for `bench/soak.py --tracemalloc 2,6,12`: at each of those
minutes after start it writes `tracemalloc-<minute>.txt` in the bot's folder: what was
allocated since the first of them, by line and by call stack (the biggest growths first),
and the traced total. Tracing starts at the first of them (imports under tracemalloc take
minutes), so what is counted is what was allocated after it and is still alive. The
minutes are read from `tracemalloc.minutes` in the folder."""

import runpy
import sys
import threading
import time
import tracemalloc
from pathlib import Path

BOT = Path(__file__).resolve().parents[1] / "bot.py"
FRAMES = 8


def _dump(minutes: list[float]) -> None:
    started = time.monotonic()
    first: tracemalloc.Snapshot | None = None
    previous: tracemalloc.Snapshot | None = None
    for minute in minutes:
        time.sleep(max(0.0, started + minute * 60 - time.monotonic()))
        if not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            ]
        )
        lines = [f"minute {minute:g}: traced {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MiB"]
        for title, base in (("since the first dump", first), ("since the previous dump", previous)):
            if base is None:
                continue
            lines.append(f"\n== by line, {title}")
            lines += [str(s) for s in snapshot.compare_to(base, "lineno")[:40]]
        if first is not None:
            lines.append("\n== by call stack, since the first dump")
            for stat in snapshot.compare_to(first, "traceback")[:12]:
                lines.append(str(stat))
                lines += ["    " + line for line in stat.traceback.format()]
        else:
            lines.append("\n== by line, everything")
            lines += [str(s) for s in snapshot.statistics("lineno")[:40]]
        Path(f"tracemalloc-{minute:g}.txt").write_text("\n".join(lines) + "\n")
        first = first or snapshot
        previous = snapshot


_minutes = [float(m) for m in Path("tracemalloc.minutes").read_text().split(",") if m.strip()]
threading.Thread(target=_dump, args=(_minutes,), daemon=True).start()
# As `python bot.py` has it: NoneBot's plugin finder looks the plugin up on sys.path, and
# finds it only beside bot.py (the editable install's own finder loads it as a plain module).
sys.path[0] = str(BOT.parent)
runpy.run_path(str(BOT), run_name="__main__")
