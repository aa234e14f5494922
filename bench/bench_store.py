"""Store benchmark: append throughput, history reads on a big store, a compression's
commit, size on disk; on SQLite, PostgreSQL, or both in one run.

    python bench/bench_store.py [--messages 1000000 --sessions 1000]
    python bench/bench_store.py --db postgresql://user:password@host:port/db
    python bench/bench_store.py --db sqlite --db pgserver --messages 200000 --sessions 200

`--db` (repeatable): `sqlite` (the default; a temporary folder), a `postgresql://` URL
(the bench creates databases of its own on that server and drops them afterwards: the
user needs CREATEDB), or `pgserver` (a throwaway PostgreSQL 16 from the test suite's
tests/fakes/pgserver.py, `pip install -e '.[test]'`). With several, the same figures are
printed per engine and side by side at the end. Figures depend on the machine and its
caches; they are for comparing, not for asserting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nonebot

# Importing the package wires the plugin into NoneBot, which needs a driver.
nonebot.init()

from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, Location, Store, describe
from nonebot_plugin_memsum.store.engine import is_url
from nonebot_plugin_memsum.types import Message, ToolCall

DIVIDER = "〔以上对话已压缩〕"

_WORDS = "今天 周末 爬山 吃饭 代码 测试 部署 数据库 会议 好的 哈哈 明天 一起 问题 解决 谢谢".split()


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30)))


_FIGURES: dict[str, dict[str, str]] = {}
"""name -> engine -> value, for the side-by-side table."""
_ENGINE = [""]


def _report(name: str, value: str) -> None:
    _FIGURES.setdefault(name, {})[_ENGINE[0]] = value
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


class Engine:
    """Where the stores of one run live: SQLite files in a temporary folder, or fresh
    databases on a PostgreSQL server (created and dropped by the bench)."""

    def __init__(self, name: str, folder: Path, server: str | None = None) -> None:
        self.name = name
        self.folder = folder
        self.server = server
        self._made: list[str] = []

    async def location(self, name: str) -> Location:
        if self.server is None:
            return self.folder / f"{name}.db"
        import asyncpg

        db = f"memsum_bench_{os.getpid()}_{name}"
        admin = await asyncpg.connect(self.server)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            await admin.execute(f"CREATE DATABASE {db}")
        finally:
            await admin.close()
        self._made.append(db)
        return urlunsplit(urlsplit(self.server)._replace(path=f"/{db}"))

    async def drop(self) -> None:
        if self.server is None or not self._made:
            return
        import asyncpg

        admin = await asyncpg.connect(self.server)
        try:
            for db in self._made:
                await admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        finally:
            await admin.close()

    async def version(self) -> str:
        if self.server is None:
            return f"SQLite {sqlite3.sqlite_version}"
        import asyncpg

        conn = await asyncpg.connect(self.server)
        try:
            return f"PostgreSQL {await conn.fetchval('SHOW server_version')} at {describe(self.server)}"
        finally:
            await conn.close()


async def bench_appends(engine: Engine, n: int) -> None:
    rng = random.Random(1)
    store = Store(await engine.location("appends"))
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


def _fill_rows(
    messages: int, sessions: int, big: int, big_size: int
) -> Iterator[list[tuple[str, str, str, float]]]:
    """The big store's messages in chunks, the same on every engine (seeded)."""
    rng = random.Random(2)
    big_total = min(messages, big * big_size)
    owners = [s for s in range(big) for _ in range(big_size)][:big_total]
    owners += [big + i % max(1, sessions - big) for i in range(messages - big_total)]
    rng.shuffle(owners)  # sessions interleave in storage order, as in a real bot
    base = 1_700_000_000.0
    chunk = 50_000
    for lo in range(0, messages, chunk):
        yield [
            (f"onebot:group:{s}", "user", f"[昵称{s}({10000 + s})] {_text(rng)}", base + (lo + i) * 0.37)
            for i, s in enumerate(owners[lo : lo + chunk])
        ]


# Like a long-lived bot: most history archived by compression, a tail active.
_ARCHIVE_ALL_BUT = (
    "UPDATE messages SET archived = 1 WHERE session_id = ? AND id < ("
    " SELECT id FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"
)


def _fill_sqlite(path: Path, chunks: Iterator[list[tuple[str, str, str, float]]], actives: list[int]) -> None:
    """Fill with executemany on a plain sqlite3 connection (not through the Store API)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA cache_size = -262144")
        conn.execute("BEGIN")
        for rows in chunks:
            conn.executemany("INSERT INTO messages (session_id, role, content, ts) VALUES (?, ?, ?, ?)", rows)
        for s, active in enumerate(actives):
            conn.execute(_ARCHIVE_ALL_BUT, (f"onebot:group:{s}", f"onebot:group:{s}", active - 1))
        conn.execute("COMMIT")
    finally:
        conn.close()


async def _fill_postgres(
    url: str, chunks: Iterator[list[tuple[str, str, str, float]]], actives: list[int]
) -> None:
    """Fill with COPY on a plain asyncpg connection (not through the Store API); the count
    trigger off meanwhile and the counts summed once after, then ANALYZE, as a restore would."""
    import asyncpg

    from nonebot_plugin_memsum.store.engine import _numbered

    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute("ALTER TABLE messages DISABLE TRIGGER messages_counted")
            for rows in chunks:
                await conn.copy_records_to_table(
                    "messages", records=rows, columns=["session_id", "role", "content", "ts"]
                )
            for s, active in enumerate(actives):
                await conn.execute(
                    _numbered(_ARCHIVE_ALL_BUT), f"onebot:group:{s}", f"onebot:group:{s}", active - 1
                )
            await conn.execute("ALTER TABLE messages ENABLE TRIGGER messages_counted")
            await conn.execute(
                "INSERT INTO message_counts (session_id, active, archived, newest_ts)"
                " SELECT session_id, SUM(1 - archived), SUM(archived), MAX(ts) FROM messages"
                " GROUP BY session_id"
            )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def _size(location: Location) -> int:
    if isinstance(location, Path):
        return await asyncio.to_thread(
            lambda: sum(p.stat().st_size for p in location.parent.glob(location.name + "*"))
        )
    import asyncpg

    conn = await asyncpg.connect(str(location))
    try:
        return int(await conn.fetchval("SELECT pg_database_size(current_database())"))
    finally:
        await conn.close()


async def bench_big_file(engine: Engine, messages: int, sessions: int, calls: int) -> None:
    location = await engine.location("big")
    store = Store(location)
    await store.open()  # schema through the real migrations
    await store.close()

    big, big_size, big_active = 5, 20_000, 3_000
    chunks = _fill_rows(messages, sessions, big, big_size)
    actives = [big_active if s < big else 200 for s in range(sessions)]
    start = time.perf_counter()
    if isinstance(location, Path):
        await asyncio.to_thread(_fill_sqlite, location, chunks, actives)
        how = "executemany"
    else:
        await _fill_postgres(location, chunks, actives)
        how = "COPY"
    elapsed = time.perf_counter() - start
    _report(
        f"bulk fill {messages:,} messages / {sessions:,} sessions",
        f"{elapsed:.1f} s ({messages / elapsed:,.0f} rows/s, {how} direct, not the Store API)",
    )

    store = Store(location)
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

        # What the compression's commit writes in its one transaction (R-RUN-11): the summary,
        # the span archived with a few originals kept, the divider; on each big session left.
        async def commit() -> object:
            sid = big_ids[2 + next(turn) % (big - 2)]
            async with store.transaction() as tx:
                await tx.put_meta(SUMMARY_NAMESPACE, sid, {"text": "## 摘要\n" + "要点" * 200, "time": 1.0})
                done = await tx.archive_span(sid, 300, keep=range(0, 300, 60))
                await tx.append(sid, Message(role="system", content=DIVIDER, event_marker=True))
            return done

        _report("compression commit (summary, archive 300, divider)", _ms(await _latencies(commit, 9)))
    finally:
        await store.close()
    size = await _size(location)
    # SQLite: the file and its WAL; PostgreSQL: pg_database_size (tables, indexes, WAL not included).
    _report("size on disk", f"{size / 1e6:,.1f} MB ({size / messages:,.0f} bytes/message)")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--appends", type=int, default=5_000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument(
        "--db", action="append", metavar="sqlite|pgserver|postgresql://…", help="repeatable; default sqlite"
    )
    args = parser.parse_args()
    if args.sessions < 10 or args.messages < 100_000:
        parser.error("need --sessions >= 10 and --messages >= 100000 (five sessions of 20,000)")
    dbs = args.db or ["sqlite"]
    for db in dbs:
        if db not in ("sqlite", "pgserver") and not is_url(db):
            parser.error("--db must be sqlite, pgserver or a postgresql:// URL")
    with tempfile.TemporaryDirectory(prefix="memsum-bench-") as tmp:
        for db in dbs:
            async with _engine(db, Path(tmp) / db.split(":")[0]) as engine:
                _ENGINE[0] = engine.name
                print(f"\n== {engine.name}: {await engine.version()}")  # noqa: T201
                await bench_appends(engine, args.appends)
                await bench_big_file(engine, args.messages, args.sessions, args.calls)
    if len(dbs) > 1:
        names = [_engine_name(db) for db in dbs]
        print("\n| figure | " + " | ".join(names) + " |")  # noqa: T201
        print("|---|" + "---|" * len(names))  # noqa: T201
        for figure, values in _FIGURES.items():
            print(f"| {figure} | " + " | ".join(values.get(n, "") for n in names) + " |")  # noqa: T201


def _engine_name(db: str) -> str:
    return "sqlite" if db == "sqlite" else "postgresql"


@contextlib.asynccontextmanager
async def _engine(db: str, folder: Path) -> AsyncIterator[Engine]:
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    if db == "sqlite":
        yield Engine("sqlite", folder)
        return
    server = None
    if db == "pgserver":
        from tests.fakes.pgserver import PgServer

        server = PgServer().start()
        db = server.url()
    engine = Engine("postgresql", folder, db)
    try:
        yield engine
    finally:
        await engine.drop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
