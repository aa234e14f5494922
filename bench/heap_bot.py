"""bot.py with a heap census, for `bench/soak.py --heap 2,6,12`: at each of those minutes
after start it writes `heap-<minute>.txt` in the bot's folder: resident memory, the C heap
(glibc `mallinfo2`: SQLite's page cache and every malloc outside Python's small-object
allocator), Python's allocated blocks, the number of live objects of each type and their
shallow size (objects the garbage collector tracks: containers and instances, not strings;
growth since the first census first), and the length of every sized attribute of the
plugin's runtime and its parts (caches, per-session tables). A census costs one pass over
the live objects; tracemalloc slowed a 1,000-group bot past keeping up. The minutes are
read from `heap.minutes` in the folder."""

import ctypes
import gc
import runpy
import sys
import threading
import time
from collections import Counter
from pathlib import Path

BOT = Path(__file__).resolve().parents[1] / "bot.py"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _c_heap() -> str:
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return "C heap: mallinfo2 not available"
    mallinfo2.restype = _Mallinfo2
    m = mallinfo2()
    mib = 2**20
    return (
        f"C heap: {m.uordblks / mib:.1f} MiB in use, {m.fordblks / mib:.1f} MiB free in the arenas,"
        f" {m.hblkhd / mib:.1f} MiB mmapped"
    )


def _rss() -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return f"RSS {int(line.split()[1]) / 1024:.1f} MiB"
    return "RSS ?"


def _types() -> dict[str, tuple[int, int]]:
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for o in gc.get_objects():
        name = f"{type(o).__module__}.{type(o).__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(o)
    return {name: (counts[name], sizes[name]) for name in counts}


def _runtime_lengths() -> list[str]:
    """Every attribute of the runtime and of its parts that has a length (one level down)."""
    try:
        from nonebot_plugin_memsum import runtime
        from nonebot_plugin_memsum.llm.tokens import estimate_cache

        rt = runtime.get()
    except Exception as err:
        return [f"runtime: {type(err).__name__}"]
    cache = estimate_cache()
    lines = [f"estimate cache: {len(cache)} texts, {cache.bytes / 2**20:.1f} MiB counted"]
    for part_name, part in vars(rt).items():
        for name, value in [(part_name, part), *((f"{part_name}.{k}", v) for k, v in _attrs(part))]:
            if isinstance(value, str):
                continue
            try:
                size = len(value)
            except Exception:
                continue
            extra = f", {value.size_bytes / 2**20:.1f} MiB counted" if hasattr(value, "size_bytes") else ""
            extra += (
                f", {value.bytes / 2**20:.1f} MiB counted"
                if isinstance(getattr(value, "bytes", None), int)
                else ""
            )
            lines.append(f"{name}: {size}{extra}")
    return lines


def _attrs(obj: object) -> list[tuple[str, object]]:
    try:
        return list(vars(obj).items())
    except TypeError:
        return [(k, getattr(obj, k)) for k in getattr(type(obj), "__slots__", ()) if hasattr(obj, k)]


def _census(minutes: list[float]) -> None:
    started = time.monotonic()
    first: dict[str, tuple[int, int]] | None = None
    for minute in minutes:
        time.sleep(max(0.0, started + minute * 60 - time.monotonic()))
        types = _types()
        lines = [f"minute {minute:g}: {_rss()}; {_c_heap()}; Python blocks {sys.getallocatedblocks()}"]
        lines += _runtime_lengths()
        base = first or {}
        grown = sorted(types, key=lambda n: types[n][1] - base.get(n, (0, 0))[1], reverse=True)
        lines.append("\nobjects by type (count, shallow bytes; change since the first census):")
        for name in grown[:40]:
            (count, size), (count0, size0) = types[name], base.get(name, (0, 0))
            change = (size - size0) / 2**20
            lines.append(f"  {name}: {count} ({count - count0:+}), {size / 2**20:.2f} MiB ({change:+.2f})")
        Path(f"heap-{minute:g}.txt").write_text("\n".join(lines) + "\n")
        first = first or types


threading.Thread(
    target=_census,
    args=([float(m) for m in Path("heap.minutes").read_text().split(",") if m.strip()],),
    daemon=True,
).start()
# As `python bot.py` has it: NoneBot's plugin finder looks the plugin up on sys.path, and
# finds it only beside bot.py (the editable install's own finder loads it as a plain module).
sys.path[0] = str(BOT.parent)
runpy.run_path(str(BOT), run_name="__main__")
