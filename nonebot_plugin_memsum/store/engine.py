"""The two engines under the store, behind one small connection interface.

`Store` and `Tx` (store.py) write their SQL once, in the subset SQLite and PostgreSQL
share (`?` placeholders, `INSERT ... ON CONFLICT`, `CASE`, `COALESCE`); a `Db` runs it:

- `SqliteDb`: one aiosqlite connection in autocommit mode, `BEGIN IMMEDIATE`, WAL, one
  file (store/migrations.py); the only writer is this process. A message's own write runs
  on the event loop's thread when nothing else is on the connection (`_write`), the rest
  in aiosqlite's thread.
- `PostgresDb`: one asyncpg connection (`?` become `$1..$n`), reconnected when the server
  dropped it; schema in store/postgres.py. Other processes write beside this one
  (`shared`), so what a process remembers must be checked against the database, and a
  compression holds a per-session advisory lock on a connection of its own
  (`exclusive`): it is freed when that process dies.

Only what cannot be written once differs here: DDL and migrations, the search index
(FTS5 against a tsvector), the day arithmetic of the ledger, and locks. Driver errors
leave as `StoreError`, cause chained. asyncpg is imported only when a URL asks for it,
so SQLite users need not install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import os
import re
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

import aiosqlite
from nonebot.log import logger

from nonebot_plugin_memsum.errors import SchemaTooNewError, StoreError
from nonebot_plugin_memsum.types import unquoted

from . import pg_search, search
from .migrations import migrate

if TYPE_CHECKING:
    import asyncpg

    from nonebot_plugin_memsum.types import Message

Row = tuple[Any, ...]
T = TypeVar("T")
Location = Path | str
"""Where the store lives: a SQLite file, or a `postgresql://user:password@host:port/db` URL."""

URL_SCHEMES = ("postgresql", "postgres")

# NORMAL is durable across application crashes in WAL mode and only risks the last
# commits on power loss; busy_timeout waits out another process's write lock instead
# of failing at once. No automatic checkpoint: it runs in whichever thread commits, and
# a message's write may run on the event loop's (`SqliteDb._write`); CHECKPOINT_EVERY.
_BUSY_TIMEOUT_MS = 5000
WAL_SIZE_LIMIT = 16 << 20
"""Bytes the WAL is cut back to once a checkpoint let SQLite start it over (`journal_size_limit`):
without it the WAL keeps the largest size it ever had, which a reader in another process (a DB
browser, a backup) holding its snapshot lets grow with every message (~17 KB each)."""
_SQLITE_PRAGMAS = (
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}",
    "PRAGMA wal_autocheckpoint = 0",
    f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}",
)
CHECKPOINT_EVERY = 256
"""Writes between two checkpoints of the WAL into the file, each run in aiosqlite's thread
after a write (a message's write takes ~5 pages: about SQLite's default of 1,000 pages)."""
FILE_CHECK_SECONDS = 10.0
"""At most this often a message's write checks that the path still names the file the bot
has open: an owner deleting memsum.db to start over while the bot runs (Linux, macOS)."""


def is_url(location: Location) -> bool:
    return isinstance(location, str) and urlsplit(location).scheme in URL_SCHEMES


def describe(location: Location) -> str:
    """The location for logs and errors: a URL without its password."""
    if not is_url(location):
        return str(location)
    parts = urlsplit(str(location))
    host = parts.hostname or ""
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    # The query may hold a password; only a unix socket's folder (libpq's `?host=`) is shown.
    socket = parse_qs(parts.query).get("host", [""])[0] if not host else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}" + (f"?host={socket}" if socket else "")


class Db(ABC):
    """One open connection of the store, used behind the store's lock."""

    shared: ClassVar[bool]
    """Other processes may write the same data: nothing read earlier may be trusted."""

    @abstractmethod
    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    @abstractmethod
    async def insert(self, sql: str, params: Sequence[Any]) -> int:
        """Run an INSERT into a table with an `id` key; the new row's id."""

    @abstractmethod
    async def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        """A statement whose answer nobody reads; inside a transaction it may wait to go
        with the next statement (its error then comes from that one, or the COMMIT)."""

    @abstractmethod
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    async def write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """`executemany` whose answer nobody reads: inside a transaction it may wait, as `write`."""
        await self.executemany(sql, rows)

    @abstractmethod
    async def begin(self) -> None:
        """Start a write transaction."""

    @abstractmethod
    async def commit(self) -> None: ...

    @abstractmethod
    async def rollback(self) -> None:
        """End the transaction without its writes; quiet when none is open."""

    @abstractmethod
    async def close(self) -> None: ...

    async def ready(self) -> None:
        """Before a call: reconnect if the connection was lost."""

    @abstractmethod
    def day(self, ts: str) -> str:
        """SQL of the whole number of days in `ts` (seconds) + a `?` offset."""

    @contextlib.asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[bool]:
        """Hold `key` against every other process while inside; yields False when another
        holds it. One process alone uses a SQLite file: always True."""
        yield True

    async def hold(self, session_id: str) -> None:
        """Inside a transaction: no other connection writes the session's messages until it
        ends, and every write begun before is committed or gone (the compression's re-read)."""

    async def count_archived(self, session_id: str, rows: int) -> None:
        """`rows` active messages of the session were just archived: `message_counts` follows.
        PostgreSQL's trigger counted them as each row changed."""

    # ---- the search index (store/search.py, store/pg_search.py) ----
    @abstractmethod
    async def insert_message(
        self, sql: str, params: Sequence[Any], session_id: str, msg: Message, ts: float
    ) -> int:
        """Run the message's INSERT (and on PostgreSQL index it for search); its id."""

    async def insert_message_unless(
        self,
        found: tuple[str, Sequence[Any]],
        sql: str,
        params: Sequence[Any],
        session_id: str,
        msg: Message,
        ts: float,
    ) -> int | None:
        """`insert_message`, unless the query `found` returns a row: None then."""
        if await self.fetch(*found):
            return None
        return await self.insert_message(sql, params, session_id, msg, ts)

    async def insert_message_with(
        self,
        sql: str,
        params: Sequence[Any],
        session_id: str,
        msg: Message,
        ts: float,
        writes: Sequence[tuple[str, Sequence[Any]]],
    ) -> int:
        """In one transaction of its own: `insert_message`, then `writes`; the message's id."""
        await self.begin()
        try:
            new_id = await self.insert_message(sql, params, session_id, msg, ts)
            for write in writes:
                await self.write(*write)
            await self.commit()
        except BaseException:
            await self.rollback()
            raise
        return new_id

    @abstractmethod
    async def forget(self, session_id: str) -> None:
        """Everything the session stored so far leaves the search index for good."""

    @abstractmethod
    async def requote(self, session_id: str, reply: Message) -> None:
        """Inside a transaction: the quote of this reply (as it reads now) was just marked
        withdrawn; the search index holds it as it reads now, without the quoted words."""

    @abstractmethod
    async def search(self, query: search.SearchQuery, columns: str, context: int) -> list[Row]:
        """The query's best hits and their neighbours, as (hit id, side, score, *columns) rows:
        side 0 a hit, −1 and 1 up to `context` conversation messages before and after it."""


def _identity(path: Path) -> tuple[int, int]:
    """Which file the path names: (device, inode)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _cannot_open(path: Path, err: sqlite3.Error) -> StoreError:
    """SQLite's error opening the file, with the cause its "unable to open database file"
    leaves out: mostly a folder the bot may not write (made by another user, `sudo mkdir`)."""
    if err.sqlite_errorcode & 0xFF == sqlite3.SQLITE_CANTOPEN:
        return StoreError(
            f"cannot open {path} ({err}): the bot needs to create and write files in its folder"
            f" {Path(path).parent} (the database, its -wal and -shm files)"
        )
    return StoreError(f"cannot open {path}: {err}")


class SqliteDb(Db):
    shared = False

    def __init__(self, db: aiosqlite.Connection, path: Path, identity: tuple[int, int]) -> None:
        self._raw = db
        self._path = path
        self._identity: tuple[int, int] | None = identity
        """The open file's (device, inode); None once it was found gone (`_check_file`)."""
        self._checked = time.monotonic()
        self._queued: list[tuple[str, Sequence[Any], bool]] = []
        """Statements nobody reads an answer of (a BEGIN, a write inside a transaction; `True`:
        one statement over many rows), sent with the next statement that answers: each trip
        to aiosqlite's thread wakes it and the event loop once (issue 9)."""
        self._in_tx = False
        self._sent = 0
        """Calls handed to aiosqlite's thread (`_call`); `_ran` counts those it finished, there:
        equal when the connection is idle, also after an awaiting task was cancelled."""
        self._ran = 0
        self._writes = 0
        """Writes since the last checkpoint (CHECKPOINT_EVERY)."""

    @classmethod
    async def connect(cls, path: Path, *, writes: bool = True) -> SqliteDb:
        """Open the file, set the pragmas, migrate; StoreError naming the file when it cannot
        (`writes`: also when it cannot be written; the migration tool only reads it)."""
        try:
            # Used from the event loop's thread too (`_write`), never at the same time as
            # from aiosqlite's.
            db = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as err:
            if await asyncio.to_thread(Path(path).is_dir):  # MEMSUM_DB_PATH=data, the folder
                raise StoreError(
                    f"cannot open {path}: it is a folder; name the database file in it, e.g."
                    f" {Path(path) / 'memsum.db'}"
                ) from err
            raise _cannot_open(path, err) from err
        try:
            for pragma in _SQLITE_PRAGMAS:
                await db.execute_fetchall(pragma)
            await migrate(db)
            # After the version check, so a refused file is left as found. WAL lets
            # readers in other processes (a backup, the sqlite3 shell) run beside us.
            await db.execute_fetchall("PRAGMA journal_mode = WAL")
            # A file the bot may read but not write opens without complaint, and then every
            # message failed to store with a traceback: refused here with one line instead.
            if writes:
                [(version,)] = await db.execute_fetchall("PRAGMA user_version")
                await db.execute_fetchall(f"PRAGMA user_version = {int(version)}")
        except BaseException as err:
            await db.close()
            if isinstance(err, SchemaTooNewError):
                raise StoreError(
                    f"{path} was written by a newer nonebot-plugin-memsum (schema version"
                    f" {err.found}, this version knows {err.known}); upgrade the plugin"
                ) from err
            if isinstance(err, sqlite3.Error) and err.sqlite_errorcode & 0xFF == sqlite3.SQLITE_READONLY:
                raise StoreError(
                    f"cannot write {path} ({err}): the bot needs to write the file, its -wal and"
                    " -shm files and its folder"
                ) from err
            if isinstance(err, sqlite3.Error):
                raise _cannot_open(path, err) from err
            raise
        return cls(db, path, await asyncio.to_thread(_identity, path))

    async def raw(self) -> aiosqlite.Connection:
        """The aiosqlite connection, for SQL of its own (the search index), with every
        queued statement run first."""
        if self._queued:
            await self._call(lambda conn: None, "write")
        return self._raw

    async def _call(self, last: Callable[[sqlite3.Connection], T], what: str) -> T:
        """The queued statements, then `last`, in one trip to the connection's thread; then
        a checkpoint when one is due and no transaction is open."""
        queued, self._queued = self._queued, []
        if what == "write":
            self._writes += 1

        def run() -> T:
            try:
                conn = self._raw._conn  # inside aiosqlite's thread, as its own helpers do
                for sql, params, many in queued:
                    if many:
                        conn.executemany(sql, params)
                    else:
                        conn.execute(sql, params)
                out = last(conn)
                if self._writes >= CHECKPOINT_EVERY and not conn.in_transaction:
                    self._writes = 0
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                return out
            finally:
                self._ran += 1

        self._sent += 1
        try:
            return await self._raw._execute(run)
        except sqlite3.Error as err:
            raise StoreError(f"store {what} failed: {err}") from err

    def _check_file(self) -> None:
        """Say once when the path no longer names the open file. The bot then wrote on into a
        deleted (or moved) file: it still remembered everything, and what it stored from then
        on was gone at the next start without a word in the log."""
        now = time.monotonic()
        if self._identity is None or now - self._checked < FILE_CHECK_SECONDS:
            return
        self._checked = now
        try:
            if _identity(self._path) == self._identity:
                return
        except OSError:
            pass
        self._identity = None
        logger.error(
            f"memsum: the database file {self._path} was deleted, moved or replaced while the bot"
            " runs: the bot goes on with the file it opened, and what it stores from now on will not"
            " be in that path at its next start; to start over with an empty memory, stop the bot"
            " first, then delete the file with its -wal and -shm files"
        )

    async def _write(self, run: Callable[[sqlite3.Connection], T]) -> T:
        """A message's write (a statement or two, ~0.07 ms of SQLite) on the event loop's
        thread when the connection is idle: a trip to aiosqlite's thread costs about as much
        CPU again in wake-ups, on every message recorded (issue 9). Through that thread when
        a transaction is open or queued, a call is still running there (its awaiting task may
        have been cancelled), or a checkpoint is due (it may take an fsync: never on the loop);
        and when another process holds the write lock, which we wait for there, not here."""
        self._check_file()
        conn = self._raw._conn
        if (
            self._queued
            or self._in_tx
            or self._sent != self._ran
            or self._writes >= CHECKPOINT_EVERY
            or conn.in_transaction
        ):
            return await self._call(run, "write")
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            out = run(conn)
            self._writes += 1
            return out
        except sqlite3.OperationalError as err:
            if err.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise StoreError(f"store write failed: {err}") from err
        except sqlite3.Error as err:
            raise StoreError(f"store write failed: {err}") from err
        finally:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        # Another process holds the write lock and nothing was written: wait for it there.
        return await self._call(run, "write")

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        # No row_factory: plain tuples.
        return await self._call(lambda conn: conn.execute(sql, params).fetchall(), "query")

    async def insert(self, sql: str, params: Sequence[Any]) -> int:
        new_id = await self._call(lambda conn: conn.execute(sql, params).lastrowid, "write")
        assert new_id is not None  # an INSERT into a rowid table always sets it
        return int(new_id)

    async def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        if self._in_tx:  # its error, if any, comes with the next statement or the COMMIT
            self._queued.append((sql, params, False))
        else:
            await self._call(lambda conn: conn.execute(sql, params), "write")

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._call(lambda conn: conn.executemany(sql, rows), "write")

    async def write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self._in_tx:  # as `write`: with the next statement or the COMMIT
            self._queued.append((sql, list(rows), True))
        else:
            await self.executemany(sql, rows)

    async def begin(self) -> None:
        self._queued.append(("BEGIN IMMEDIATE", (), False))  # a BUSY error comes with the first statement
        self._in_tx = True

    async def commit(self) -> None:
        self._in_tx = False
        await self._call(lambda conn: conn.execute("COMMIT"), "write")

    async def rollback(self) -> None:
        self._in_tx = False
        queued, self._queued = self._queued, []
        if queued and queued[0][0] == "BEGIN IMMEDIATE":
            return  # never sent: no transaction was opened
        # A failed statement may already have ended the transaction (SQLITE_FULL,
        # SQLITE_IOERR), and a BEGIN that failed never started one.
        with contextlib.suppress(sqlite3.OperationalError):
            await self._raw._execute(lambda: self._raw._conn.execute("ROLLBACK"))

    async def close(self) -> None:
        try:
            await self._raw.close()
        except sqlite3.Error as err:
            raise StoreError(f"closing the database failed: {err}") from err

    def day(self, ts: str) -> str:
        return f"CAST(({ts} + ?) / 86400 AS INTEGER)"  # truncation: times are positive

    async def count_archived(self, session_id: str, rows: int) -> None:
        # One statement for all of them (migration 8 dropped the per-row trigger, which took
        # ~17 ms of a 5,000-message compression): the archived count goes up by `rows`, the
        # active ones are counted again (after a compression or a clear few are left).
        await self.write(
            "UPDATE message_counts SET archived = archived + ?, active = (SELECT COUNT(*) FROM messages"
            " WHERE session_id = ? AND archived = 0 AND event_marker = 0 AND role != 'system')"
            " WHERE session_id = ?",
            (rows, session_id, session_id),
        )

    async def insert_message(
        self, sql: str, params: Sequence[Any], session_id: str, msg: Message, ts: float
    ) -> int:
        """The INSERT alone: the runtime's background batches index new messages
        (store/search.py), and a search first indexes what still waits."""
        new_id = await self._write(lambda conn: conn.execute(sql, params).lastrowid)
        assert new_id is not None  # an INSERT into a rowid table always sets it
        return int(new_id)

    async def insert_message_unless(
        self,
        found: tuple[str, Sequence[Any]],
        sql: str,
        params: Sequence[Any],
        session_id: str,
        msg: Message,
        ts: float,
    ) -> int | None:
        # The check and the INSERT in one go (`_write`): every message recorded live takes
        # this path (issue 15). Nothing else runs on the connection in between.
        def run(conn: sqlite3.Connection) -> int | None:
            if conn.execute(*found).fetchone() is not None:
                return None
            return conn.execute(sql, params).lastrowid

        return await self._write(run)

    async def insert_message_with(
        self,
        sql: str,
        params: Sequence[Any],
        session_id: str,
        msg: Message,
        ts: float,
        writes: Sequence[tuple[str, Sequence[Any]]],
    ) -> int:
        # BEGIN to COMMIT in one go (`_write`; a turn's answer and its reply mark: two trips
        # to aiosqlite's thread as a transaction, which needs the INSERT's id before its COMMIT).
        def run(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                new_id = conn.execute(sql, params).lastrowid
                for write in writes:
                    conn.execute(*write)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            assert new_id is not None  # an INSERT into a rowid table always sets it
            return new_id

        return await self._write(run)

    async def forget(self, session_id: str) -> None:
        try:
            await search.forget(await self.raw(), session_id)
        except sqlite3.Error as err:
            raise StoreError(f"store write failed: {err}") from err

    async def requote(self, session_id: str, reply: Message) -> None:
        try:
            await search.requote(await self.raw(), session_id, reply)
        except sqlite3.Error as err:
            raise StoreError(f"store write failed: {err}") from err

    async def search(self, query: search.SearchQuery, columns: str, context: int) -> list[Row]:
        statement = search.search_statement(query, columns, context)
        if statement is None:
            return []
        sql, params = statement
        return await self._call(lambda conn: conn.execute(sql, params).fetchall(), "query")


def _bounds(query: search.SearchQuery) -> tuple[float, float]:
    return (
        -math.inf if query.since is None else query.since,
        math.inf if query.until is None else query.until,
    )


_PLACEHOLDER = re.compile(r"\?")


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1..$n` (our SQL has no `?` inside a literal)."""
    count = iter(range(1, sql.count("?") + 1))
    return _PLACEHOLDER.sub(lambda _: f"${next(count)}", sql)


def _number(text: str) -> int | float:
    # SUM over bigint answers numeric: the ledger's sums come back as ints, as from SQLite.
    return int(text) if text.lstrip("-").isdigit() else float(text)


def no_nul(params: Sequence[Any]) -> list[Any]:
    """PostgreSQL text cannot hold NUL (SQLite's can): a message carrying one is stored with
    U+FFFD in its place rather than refused and lost."""
    return [p.replace("\x00", "\ufffd") if isinstance(p, str) and "\x00" in p else p for p in params]


def lock_key(name: str) -> int:
    """A 64-bit advisory lock key for a name (a session id)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


class PostgresDb(Db):
    shared = True
    # Seconds a statement may go unanswered. A link gone silent (a NAT or firewall that
    # forgot the connection, a fail-over) otherwise hangs a statement for the kernel's
    # ~15 minutes of retransmits, and every group waits behind it; a healthy server answers
    # the slowest statement in milliseconds. Migrations run unbounded (a big first upgrade).
    STATEMENT_TIMEOUT = 60.0

    def __init__(self, url: str, conn: asyncpg.Connection) -> None:
        self._url = url
        self._conn = conn
        self._timeout: float | None = self.STATEMENT_TIMEOUT

    @staticmethod
    async def _connect(url: str) -> asyncpg.Connection:
        try:
            import asyncpg
        except ImportError as err:
            raise StoreError(
                "MEMSUM_DB_URL names PostgreSQL but asyncpg is not installed:"
                " pip install 'nonebot-plugin-memsum[postgres]'"
            ) from err
        try:
            # Custom plans always: a generic plan of the search (its tsquery unknown) walks
            # the whole index in id order instead of asking GIN (measured: 3 ms -> 90 ms).
            conn = await asyncpg.connect(
                url, timeout=10, server_settings={"plan_cache_mode": "force_custom_plan"}
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as err:
            # The driver's text never holds the password, but say which server, not the URL.
            raise StoreError(f"cannot connect to {describe(url)}: {type(err).__name__}: {err}") from err
        await conn.set_type_codec("numeric", encoder=str, decoder=_number, schema="pg_catalog", format="text")
        return conn

    @classmethod
    async def connect(cls, url: str) -> PostgresDb:
        from . import postgres

        db = cls(url, await cls._connect(url))
        db._timeout = None
        try:
            await postgres.migrate(db)
        except BaseException as err:
            await db.close()
            if isinstance(err, SchemaTooNewError):
                raise StoreError(
                    f"{describe(url)} was written by a newer nonebot-plugin-memsum (schema version"
                    f" {err.found}, this version knows {err.known}); upgrade the plugin"
                ) from err
            state = getattr(err.__cause__, "sqlstate", None)
            if isinstance(err, StoreError) and state in ("42501", "25006"):  # no right; read-only
                raise StoreError(
                    f"cannot write {describe(url)} ({err.__cause__}): the bot's role must be able"
                    " to write its tables, and to create them on the first start (the database's"
                    " owner, or GRANT CREATE ON SCHEMA public)"
                ) from err
            raise
        db._timeout = db.STATEMENT_TIMEOUT
        return db

    def _errors(self) -> tuple[type[BaseException], ...]:
        import asyncpg

        return (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)

    def _failed(self, err: BaseException, what: str) -> StoreError:
        """The driver's error as a StoreError; a connection that broke (the server went away,
        was restarted, or ended it) is dropped, so the next call connects again."""
        import asyncpg

        state = getattr(err, "sqlstate", None) or ""
        if not isinstance(err, asyncpg.PostgresError) or state[:2] in ("08", "57"):
            self._conn.terminate()
        if isinstance(err, TimeoutError):
            return StoreError(f"store {what} timed out: no answer from the server in {self._timeout:g} s")
        return StoreError(f"store {what} failed: {err}")

    async def ready(self) -> None:
        if self._conn.is_closed():
            self._conn = await self._connect(self._url)

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        try:
            return [tuple(r) for r in await self._conn.fetch(_numbered(sql), *params, timeout=self._timeout)]
        except self._errors() as err:
            raise self._failed(err, "query") from err

    async def insert(self, sql: str, params: Sequence[Any]) -> int:
        try:
            new_id = await self._conn.fetchval(
                _numbered(sql) + " RETURNING id", *no_nul(params), timeout=self._timeout
            )
        except self._errors() as err:
            raise self._failed(err, "write") from err
        return int(cast(int, new_id))

    async def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        try:
            await self._conn.execute(_numbered(sql), *no_nul(params), timeout=self._timeout)
        except self._errors() as err:
            raise self._failed(err, "write") from err

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        try:
            await self._conn.executemany(_numbered(sql), rows, timeout=self._timeout)
        except self._errors() as err:
            raise self._failed(err, "write") from err

    async def begin(self) -> None:
        await self.fetch("BEGIN")

    async def commit(self) -> None:
        await self.fetch("COMMIT")

    async def rollback(self) -> None:
        # Outside a transaction PostgreSQL only warns; a dead connection has none left.
        with contextlib.suppress(StoreError):
            await self.fetch("ROLLBACK")

    async def close(self) -> None:
        with contextlib.suppress(*self._errors()):
            await self._conn.close(timeout=5)

    def day(self, ts: str) -> str:
        return f"CAST(FLOOR(({ts} + ?) / 86400) AS BIGINT)"  # CAST alone rounds

    @contextlib.asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[bool]:
        # A session-level lock on a connection of its own: the store's connection runs
        # other transactions meanwhile, and a process that dies drops the connection and
        # with it the lock, so no other process waits for a dead one.
        conn = await self._connect(self._url)
        try:
            got = bool(
                await conn.fetchval(
                    "SELECT pg_try_advisory_lock($1)", lock_key(key), timeout=self.STATEMENT_TIMEOUT
                )
            )
        except self._errors() as err:
            await conn.close()
            raise StoreError(f"store query failed: {err}") from err
        try:
            yield got
        finally:
            with contextlib.suppress(*self._errors()):
                await conn.close(timeout=5)  # the lock goes with the connection

    async def hold(self, session_id: str) -> None:
        # The session's counter row: every write of its messages updates it (the trigger),
        # so this waits for writes in flight and holds off new ones until our COMMIT.
        await self.fetch("SELECT 1 FROM message_counts WHERE session_id = ? FOR UPDATE", (session_id,))

    async def insert_message(
        self, sql: str, params: Sequence[Any], session_id: str, msg: Message, ts: float
    ) -> int:
        if not search.indexable(msg.role, msg.event_marker, msg.content):
            return await self.insert(sql, params)
        # The message and its terms in one statement: atomic without a transaction, one
        # trip to the server.
        doc = pg_search.document(session_id, msg.role, msg.name, unquoted(msg), ts)
        both = (
            f"WITH m AS ({sql} RETURNING id), i AS (INSERT INTO search_index (id, doc)"
            " SELECT id, CAST(CAST(? AS TEXT) AS tsvector) FROM m) SELECT id FROM m"
        )
        rows = await self.fetch(both, (*no_nul(params), doc))
        return int(rows[0][0])

    async def forget(self, session_id: str) -> None:
        await self.fetch(pg_search.FORGET, (session_id,))
        await self.fetch(pg_search.MARK_CLEARED, (session_id, session_id))

    async def requote(self, session_id: str, reply: Message) -> None:
        # A cleared reply has no row in the index: nothing to update.
        doc = pg_search.document(session_id, reply.role, reply.name, unquoted(reply), reply.ts)
        await self.fetch(pg_search.REQUOTE, (doc, reply.id))

    async def search(self, query: search.SearchQuery, columns: str, context: int) -> list[Row]:
        """The newest CANDIDATES matches ranked in Python (`pg_search.relevance`), then the
        hits' rows and their neighbours."""
        expression = pg_search.tsquery(query)
        if expression is None or query.limit <= 0:
            return []
        rows = await self.fetch("SELECT upto FROM search_cleared WHERE session_id = ?", (query.session_id,))
        wm = int(rows[0][0]) if rows else 0
        since, until = _bounds(query)
        found = await self.fetch(
            pg_search.select_candidates(query.withdrawn),
            (expression, query.session_id, wm, since, until, search.CANDIDATES),
        )
        words = search.query_words(query.text)
        ranked = sorted(
            ((pg_search.relevance(words, role, content), msg_id) for msg_id, role, content in found),
            key=lambda sc: (-sc[0], -sc[1]),
        )[: query.limit]
        if not ranked:
            return []
        marks = ",".join("?" * len(ranked))
        by_id = {
            row[0]: row
            for row in await self.fetch(
                f"SELECT {columns} FROM messages WHERE id IN ({marks})", tuple(i for _, i in ranked)
            )
        }
        out: list[Row] = [(i, 0, score, *by_id[i]) for score, i in ranked]
        if context > 0:
            # One statement whatever the number of hits (an array), so it is planned once.
            for row in await self.fetch(
                pg_search.neighbours(columns, query.withdrawn),
                ([i for _, i in ranked], *[query.session_id, wm, context] * 4),
            ):
                out.append((ranked[row[0] // 2][1], 1 if row[0] % 2 else -1, None, *row[1:]))
        return out


async def connect(location: Location) -> Db:
    """Open the engine `location` names, migrated; StoreError (no password in it) when it cannot."""
    if is_url(location):
        return await PostgresDb.connect(str(location))
    return await SqliteDb.connect(Path(location))
