"""Store benchmark: append throughput, history reads on a big file, file size.

    python bench/bench_store.py [--messages 1000000 --sessions 1000]

Everything goes to a temporary folder that is removed afterwards. Figures depend on
the machine and its page cache; they are for comparing changes, not for asserting.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nonebot

# Importing the package wires the plugin into NoneBot, which needs a driver.
nonebot.init()

from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.types import Message, ToolCall

_WORDS = "今天 周末 爬山 吃饭 代码 测试 部署 数据库 会议 好的 哈哈 明天 一起 问题 解决 谢谢".split()


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30)))


def _report(name: str, value: str) -> None:
    print(f"{name:<48} {value}")  # noqa: T201


async def _latencies(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        out.append(time.perf_counter() - start)
    return out


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms (n={len(ordered)})"


async def bench_appends(folder: Path, n: int) -> None:
    rng = random.Random(1)
    store = Store(folder / "appends.db")
    await store.open()
    try:
        msgs = [Message(role="user", content=f"[甲(10086)] {_text(rng)}") for _ in range(n)]
        start = time.perf_counter()
        for m in msgs:
            await store.append("onebot:group:1", m)
        elapsed = time.perf_counter() - start
        _report("append, one task, one transaction each", f"{n / elapsed:,.0f} messages/s")

        async def writer(sid: str, part: list[Message]) -> None:
            for m in part:
                await store.append(sid, m)

        tasks = 4
        start = time.perf_counter()
        await asyncio.gather(*(writer(f"onebot:group:{t + 2}", msgs[t::tasks]) for t in range(tasks)))
        elapsed = time.perf_counter() - start
        _report(f"append, {tasks} concurrent tasks", f"{n / elapsed:,.0f} messages/s")

        tool = Message(
            role="assistant",
            content="",
            tool_calls=(ToolCall(id="c1", name="todo", arguments='{"title": "x"}'),),
            metadata={"visibleContent": "好的"},
        )
        start = time.perf_counter()
        async with store.transaction() as tx:
            for _ in range(n):
                await tx.append("onebot:group:9", tool)
        elapsed = time.perf_counter() - start
        _report("append with tool calls, all in one transaction", f"{n / elapsed:,.0f} messages/s")
    finally:
        await store.close()


def _fill(path: Path, messages: int, sessions: int, big: int, big_size: int, big_active: int) -> float:
    """Fill with executemany on a plain sqlite3 connection (not through the Store API)."""
    rng = random.Random(2)
    big_total = min(messages, big * big_size)
    owners = [s for s in range(big) for _ in range(big_size)][:big_total]
    owners += [big + i % max(1, sessions - big) for i in range(messages - big_total)]
    rng.shuffle(owners)  # sessions interleave in storage order, as in a real bot
    base = 1_700_000_000.0
    start = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA cache_size = -262144")
        conn.execute("BEGIN")
        chunk = 50_000
        for lo in range(0, messages, chunk):
            rows = [
                (f"onebot:group:{s}", "user", f"[昵称{s}({10000 + s})] {_text(rng)}", base + (lo + i) * 0.37)
                for i, s in enumerate(owners[lo : lo + chunk])
            ]
            conn.executemany("INSERT INTO messages (session_id, role, content, ts) VALUES (?, ?, ?, ?)", rows)
        # Like a long-lived bot: most history archived by compression, a tail active.
        for s in range(sessions):
            active = big_active if s < big else 200
            conn.execute(
                "UPDATE messages SET archived = 1 WHERE session_id = ?1 AND id < ("
                " SELECT id FROM messages WHERE session_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                (f"onebot:group:{s}", active - 1),
            )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return time.perf_counter() - start


def _size(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern))


async def bench_big_file(folder: Path, messages: int, sessions: int, calls: int) -> None:
    path = folder / "big.db"
    store = Store(path)
    await store.open()  # schema through the real migrations
    await store.close()

    big, big_size, big_active = 5, 20_000, 3_000
    elapsed = await asyncio.to_thread(_fill, path, messages, sessions, big, big_size, big_active)
    _report(
        f"bulk fill {messages:,} messages / {sessions:,} sessions",
        f"{elapsed:.1f} s ({messages / elapsed:,.0f} rows/s, executemany direct, not the Store API)",
    )

    store = Store(path)
    await store.open()
    try:
        big_ids = [f"onebot:group:{s}" for s in range(big)]
        actives = [len(await store.get_history(sid)) for sid in big_ids]
        _report("active messages in each big session", ", ".join(map(str, actives)))
        turn = iter(range(10**9))

        async def history_2000() -> object:
            return await store.get_history(big_ids[next(turn) % big], 2000)

        _report("get_history(big session, 2000)", _ms(await _latencies(history_2000, calls)))

        async def history_small() -> object:
            return await store.get_history(f"onebot:group:{big + next(turn) % (sessions - big)}", 200)

        _report("get_history(small session, 200)", _ms(await _latencies(history_small, calls)))

        async def count_big() -> object:
            return await store.count_active(big_ids[next(turn) % big])

        _report("count_active(big session)", _ms(await _latencies(count_big, calls)))

        async def append_big() -> object:
            return await store.append(big_ids[0], Message(role="user", content="[甲(1)] 再来一条"))

        _report("append on the big file", _ms(await _latencies(append_big, calls)))

        start = time.perf_counter()
        archived = await store.archive_span(big_ids[1], 2000, keep=range(0, 2000, 100))
        _report(
            f"archive_span(big session, 2000), {archived} archived",
            f"{(time.perf_counter() - start) * 1000:.1f} ms",
        )
    finally:
        await store.close()
    size = await asyncio.to_thread(_size, folder, "big.db*")
    _report("file size (db + wal)", f"{size / 1e6:,.1f} MB ({size / messages:,.0f} bytes/message)")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--appends", type=int, default=5_000)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if args.sessions < 10 or args.messages < 100_000:
        parser.error("need --sessions >= 10 and --messages >= 100000 (five sessions of 20,000)")
    _report("sqlite", sqlite3.sqlite_version)
    with tempfile.TemporaryDirectory(prefix="memsum-bench-") as tmp:
        folder = Path(tmp)
        await bench_appends(folder, args.appends)
        await bench_big_file(folder, args.messages, args.sessions, args.calls)


if __name__ == "__main__":
    asyncio.run(main())
