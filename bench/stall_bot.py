"""bot.py with an event-loop stall probe, for `bench/soak.py --stalls`: a heartbeat task on
the bot's loop wakes every 5 ms and measures how late it woke (how long a ready callback
waited); while it is late by more than 35 ms a thread samples the loop thread's stack every
5 ms. Every wake-up later than 50 ms is written to `stalls-<pid>.txt` in the bot's folder
(every 2 s, so a SIGKILL loses little): seconds since the process started, the lag, the
garbage collector's time inside it (`gc.callbacks`, each collection's generation), and the
stack samples. The file ends with the counts of late wake-ups and every full collection.
A thread holding the GIL (a collection, a C call) cannot be sampled until it lets go: its
stall shows one late sample, or none."""

import asyncio
import gc
import os
import runpy
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nonebot

_OTHER = Path("stall.bot")
"""In the bot's folder (soak.py writes it): the bot.py to run, maybe another checkout's."""
BOT = Path(_OTHER.read_text()) if _OTHER.exists() else Path(__file__).resolve().parents[1] / "bot.py"
BEAT = 0.005
REPORTED = 0.05
SAMPLED = 0.035

_t0 = time.perf_counter()
_collections: list[tuple[float, float, int]] = []
"""(start, seconds, generation) of every collection, start since the process started."""
_collecting = [0.0]
_beat = [time.perf_counter()]
_late: dict[str, int] = {">20 ms": 0, ">50 ms": 0, ">100 ms": 0}
_stalls: list[tuple[float, float, float, list[str]]] = []
_samples: dict[float, list[str]] = {}
_listening = [float("inf")]
"""When start-up was done (the server listens right after): earlier stalls delay no one."""
_loop_thread = threading.get_ident()  # the main thread: uvicorn runs its loop there


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _collecting[0] = time.perf_counter()
    else:
        now = time.perf_counter()
        _collections.append((_collecting[0] - _t0, now - _collecting[0], info["generation"]))


def _gc_within(start: float, end: float) -> float:
    a, b = start - _t0, end - _t0
    return sum(min(s + d, b) - max(s, a) for s, d, _ in _collections[-50:] if s + d > a and s < b)


async def _heartbeat() -> None:
    while True:
        sent = time.perf_counter()
        _beat[0] = sent
        await asyncio.sleep(BEAT)
        now = time.perf_counter()
        lag = now - sent - BEAT
        for name, limit in ((">20 ms", 0.02), (">50 ms", 0.05), (">100 ms", 0.1)):
            _late[name] += lag > limit
        samples = _samples.pop(sent, [])
        if lag > REPORTED:
            _stalls.append((sent - _t0, lag, _gc_within(sent, now), samples))


def _stack(frame: object) -> str:
    frames = traceback.extract_stack(frame)[-12:]  # type: ignore[arg-type]
    return " <- ".join(f"{Path(f.filename).name}:{f.name}:{f.lineno}" for f in reversed(frames))


def _watch() -> None:
    out = Path(f"stalls-{os.getpid()}.txt")
    written, flushed = 0, time.perf_counter()
    while True:
        time.sleep(BEAT)
        now = time.perf_counter()
        beat = _beat[0]
        if now - beat > SAMPLED and (frame := sys._current_frames().get(_loop_thread)) is not None:
            _samples.setdefault(beat, []).append(f"+{(now - beat) * 1000:.0f} ms {_stack(frame)}")
        if now - flushed < 2:
            continue
        flushed = now
        stalls = _stalls[:]
        lines = []
        for at, lag, in_gc, samples in stalls[written:]:
            when = " (start-up)" if at < _listening[0] else ""
            lines.append(f"stall at {at:.2f} s{when}: {lag * 1000:.0f} ms, in gc {in_gc * 1000:.0f} ms")
            lines += [f"    {s}" for s in samples]
        written = len(stalls)
        with out.open("a") as f:
            f.write("".join(f"{line}\n" for line in lines))
        full = ", ".join(f"{s:.1f} s {d * 1000:.0f} ms" for s, d, g in _collections if g == 2)
        Path(f"stalls-{os.getpid()}.summary").write_text(
            f"{now - _t0:.0f} s (start-up done at {_listening[0]:.1f} s): late wake-ups {_late};"
            f" full collections: {full}\n"
        )


_MakeLoop = Callable[[], asyncio.AbstractEventLoop]


def _with_heartbeat(make_loop: _MakeLoop) -> _MakeLoop:
    def new_event_loop() -> asyncio.AbstractEventLoop:
        loop = make_loop()
        loop.call_soon(lambda: loop.create_task(_heartbeat()))
        return loop

    return new_event_loop


try:  # uvicorn's loop: uvloop when it is installed (looked up when the server starts)
    import uvloop

    uvloop.new_event_loop = _with_heartbeat(uvloop.new_event_loop)
except ImportError:
    asyncio.new_event_loop = _with_heartbeat(asyncio.new_event_loop)
gc.callbacks.append(_on_collection)


def _run_marked(*args: Any, **kwargs: Any) -> None:
    # Registered last: runs after every start-up hook, just before the server listens.
    nonebot.get_driver().on_startup(lambda: _listening.__setitem__(0, time.perf_counter() - _t0))
    _run(*args, **kwargs)


_run, nonebot.run = nonebot.run, _run_marked
threading.Thread(target=_watch, daemon=True, name="stall-probe").start()
# As `python bot.py` has it: NoneBot's plugin finder looks the plugin up on sys.path, and
# finds it only beside bot.py (the editable install's own finder loads it as a plain module).
sys.path[0] = str(BOT.parent)
runpy.run_path(str(BOT), run_name="__main__")
