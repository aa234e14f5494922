"""OneBot name cache benchmark: what a bot in thousands of groups keeps in memory.

    python bench/bench_onebot_names.py [--groups 5000 --members 200]

Every member of every group is named once (as if each had spoken), which a real bot
never reaches; the cache must stay within its bounds, and its own byte estimate must
be honest. Prints the entries kept, the estimate, the bytes tracemalloc measured, and
the cost of a put and a get. Figures are for comparing changes, not for asserting.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nonebot

# Importing the package wires the plugin into NoneBot, which needs a driver.
nonebot.init()

from nonebot_plugin_memsum.onebot.state import NAME_BYTES, NAME_ENTRIES, NameCache


def say(line: str) -> None:
    print(line)  # noqa: T201


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=5000)
    parser.add_argument("--members", type=int, default=200)
    args = parser.parse_args()
    scopes = [f"onebot:10000:group:{700000000 + g}" for g in range(args.groups)]
    offered = args.groups * args.members

    def fill(cache: NameCache) -> None:
        for g, scope in enumerate(scopes):
            for m in range(args.members):
                # Fresh strings, as each event brings its own.
                cache.put(scope, str(2000000000 + g * 1000 + m), f"群成员名字{m:03d}")

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fill(traced := NameCache())
    measured = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    started = time.perf_counter()
    fill(cache := NameCache())  # timed without tracemalloc, which slows every allocation
    put_us = (time.perf_counter() - started) / offered * 1e6
    last = args.groups - 1
    recent = [(scopes[last], str(2000000000 + last * 1000 + m)) for m in range(args.members)] * 100
    started = time.perf_counter()
    hits = sum(cache.get(scope, uid) is not None for scope, uid in recent)
    get_us = (time.perf_counter() - started) / len(recent) * 1e6
    assert len(traced) == len(cache)
    say(f"names offered      {offered:>12,}")
    say(f"entries kept       {len(cache):>12,}   (bound {NAME_ENTRIES:,})")
    say(f"estimated bytes    {cache.bytes:>12,}   (bound {NAME_BYTES:,})")
    say(f"measured bytes     {measured:>12,}   (tracemalloc, the cache's own objects)")
    say(f"put                {put_us:>12.2f} µs")
    say(f"get (recent)       {get_us:>12.2f} µs   ({hits:,} of {len(recent):,} hit)")


if __name__ == "__main__":
    main()
