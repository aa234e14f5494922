"""What the end-to-end tests share: bot.py started with the OneBot simulator connected,
and the bot's log and database (SQLite file or PostgreSQL) read while it runs.

Every wait here is a bound on waiting, never an assertion on speed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.fakes.botproc import BotProcess
from tests.fakes.onebot import OneBotSim

SELF_ID = 10000
"""The bot's QQ number, as the simulator reports it."""


def group_sid(group: int, self_id: int = SELF_ID) -> str:
    return f"onebot:{self_id}:group:{group}"


def private_sid(user: int, self_id: int = SELF_ID) -> str:
    return f"onebot:{self_id}:private:{user}"


async def until(
    check: Callable[[], Awaitable[bool]],
    what: str,
    within: float = 20,
    *,
    progress: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Wait until `check()` holds. With `progress` (a count of work done so far, say),
    `within` bounds the wait for the next step rather than the whole: a long task on a
    busy machine is slow, not stuck, while its count still moves."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    seen = await progress() if progress is not None else None
    while not await check():
        if progress is not None and (now := await progress()) != seen:
            seen, deadline = now, loop.time() + within
        if loop.time() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def wait_log(bot: BotProcess, needle: str, within: float = 20) -> str:
    """The bot's log (of its current run) once it contains `needle`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while needle not in (log := bot.log()):
        if not bot.running or loop.time() >= deadline:
            tail = "\n".join(log.splitlines()[-40:])
            raise AssertionError(f"{needle!r} not in the bot's log; tail:\n{tail}")
        await asyncio.sleep(0.05)
    return log


@asynccontextmanager
async def connected(bot: BotProcess, self_id: int = SELF_ID) -> AsyncIterator[OneBotSim]:
    """The simulator connected to a running bot, once the bot has registered it."""
    async with OneBotSim(bot.ws_url, self_id=self_id, access_token=bot.access_token) as sim:
        await wait_log(bot, f"Bot {self_id} connected")
        yield sim


@asynccontextmanager
async def running_bot(
    workdir: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[BotProcess, OneBotSim]]:
    """bot.py started in `workdir` with the simulator connected; both stopped on the way out."""
    async with BotProcess(workdir, env=env) as bot, connected(bot) as sim:
        yield bot, sim


async def restart(bot: BotProcess, sim: OneBotSim, stop: Callable[[], Awaitable[int]] | None = None) -> None:
    """Restart bot.py on the same folder and port, and connect the simulator again. `stop`: how
    it goes down (`bot.kill`, `bot.terminate`); SIGINT, as Ctrl-C, by default."""
    await (stop or bot.stop)()
    await bot.start()
    await asyncio.wait_for(sim.disconnected.wait(), 15)
    await sim.connect()
    await wait_log(bot, f"Bot {sim.self_id} connected")


async def away(bot: BotProcess, sim: OneBotSim, stop: Callable[[], Awaitable[int]] | None = None) -> None:
    """bot.py down (`stop`; killed by default): what is said now, the simulator keeps for its
    history actions."""
    await (stop or bot.kill)()
    await asyncio.wait_for(sim.disconnected.wait(), 15)


async def back(bot: BotProcess, sim: OneBotSim, *, restart: bool = True, backfill: bool = True) -> None:
    """bot.py started again (or only the connection renewed) and its backfill done."""
    if restart:
        await bot.start()
    runs = bot.log().count("memsum: backfill of")
    await sim.connect()
    await wait_log(bot, f"Bot {sim.self_id} connected")

    async def backfilled() -> bool:
        return bot.log().count("memsum: backfill of") > runs

    if backfill:
        await until(backfilled, "the backfill")


def _query(db: Path, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    # Read-only, so a test can never change what the bot stored.
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, params).fetchall()


async def query(db: Path | str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of the bot's database (a SQLite file, read off the event loop, or a PostgreSQL URL)."""
    if isinstance(db, str):
        from tests.fakes.pgdb import raw

        return await raw(db, sql, params)
    return await asyncio.to_thread(_query, db, sql, params)


async def rows(bot: BotProcess, sid: str) -> list[tuple[str, str]]:
    """(role, content) of every message the bot stored in the session, in storage order."""
    sql = "SELECT role, content FROM messages WHERE session_id = ? ORDER BY id"
    return [(str(r[0]), str(r[1])) for r in await query(bot.db_path, sql, sid)]


async def wait_rows(bot: BotProcess, sid: str, n: int, within: float = 20) -> list[tuple[str, str]]:
    """`rows` once the session holds at least `n` messages."""
    found: list[tuple[str, str]] = []

    async def enough() -> bool:
        found[:] = await rows(bot, sid)
        return len(found) >= n

    await until(enough, f"{n} messages stored in {sid}", within)
    return found


# Another process (an owner's DB browser, the sqlite3 shell) that takes the file's write lock,
# says so, and keeps it until told.
_WRITE_LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("released", flush=True)
"""


@asynccontextmanager
async def write_lock_held(db: Path) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Another process holds the SQLite file's write lock from the start of the block until
    the `release()` it yields is awaited (or the block is left)."""
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WRITE_LOCK_HOLDER, str(db), stdin=PIPE, stdout=PIPE
    )
    assert holder.stdout is not None
    assert holder.stdin is not None
    stdin, stdout = holder.stdin, holder.stdout

    async def release() -> None:
        stdin.write(b"\n")
        assert await stdout.readline() == b"released\n"

    try:
        assert await stdout.readline() == b"locked\n"
        yield release
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()
