"""Schema migrations: append-only, numbered by their place in `MIGRATIONS`.

`PRAGMA user_version` holds how many have run. Pending ones run in one
`BEGIN IMMEDIATE` transaction together with the new user_version, so a crash
leaves the old schema or the new one, and two processes opening the same
file at once cannot both migrate. Never edit or reorder a released step:
append a new one.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Sequence

import aiosqlite

from nonebot_plugin_memsum.errors import SchemaTooNewError

Migration = Callable[[aiosqlite.Connection], Awaitable[None]]


async def _m001_initial(db: aiosqlite.Connection) -> None:
    # The whole first schema. Sessions, history, metadata, settings and the usage
    # ledger live in one file so the compression commit can be one transaction.
    await db.execute(
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            platform TEXT,
            kind TEXT NOT NULL,
            place TEXT,
            peer TEXT,
            parent TEXT,
            room_class TEXT CHECK (room_class IN ('room', 'direct')),
            created REAL NOT NULL
        )"""
    )
    # No foreign key to sessions: the memory must work for sessions that have no
    # record (R-TPL-3 "without session records"). AUTOINCREMENT so an id is never
    # reused and storage order stays strictly increasing for the file's life.
    await db.execute(
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'notice', 'system')),
            content TEXT NOT NULL,
            name TEXT,
            tool_calls TEXT,
            tool_call_id TEXT,
            ts REAL NOT NULL,
            metadata TEXT,
            event_marker INTEGER NOT NULL DEFAULT 0,
            archived INTEGER NOT NULL DEFAULT 0
        )"""
    )
    # One index serves both "last N active" and "last N archived" of a session as a
    # range scan in id order; a partial index on archived = 0 could not serve the
    # archive, which holds most rows of a long-lived session.
    await db.execute("CREATE INDEX messages_by_session ON messages (session_id, archived, id)")
    await db.execute(
        """CREATE TABLE metadata (
            namespace TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (namespace, key)
        ) WITHOUT ROWID"""
    )
    await db.execute(
        """CREATE TABLE settings (
            scope TEXT NOT NULL CHECK (scope IN ('place', 'session')),
            scope_key TEXT NOT NULL,
            name TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (scope, scope_key, name)
        ) WITHOUT ROWID"""
    )
    # session_id may be NULL: calls made for no session (a tool, a probe) are still
    # paid for and should show in a global total.
    await db.execute(
        """CREATE TABLE ledger (
            id INTEGER PRIMARY KEY,
            session_id TEXT,
            purpose TEXT NOT NULL,
            model TEXT NOT NULL,
            tokens_in INTEGER NOT NULL,
            tokens_out INTEGER NOT NULL,
            ts REAL NOT NULL
        )"""
    )
    await db.execute("CREATE INDEX ledger_by_session ON ledger (session_id, purpose)")


async def _m002_message_tokens(db: aiosqlite.Connection) -> None:
    # Each message's token estimate, taken once when it is stored: assembling a prompt
    # re-tokenised the whole active history after every restart, most of a cold turn.
    await db.execute("ALTER TABLE messages ADD COLUMN tokens INTEGER")


async def _m003_ledger_cached_tokens(db: aiosqlite.Connection) -> None:
    # Prompt tokens the provider served from its cache (DeepSeek `prompt_cache_hit_tokens`,
    # OpenAI `prompt_tokens_details.cached_tokens`): they are part of tokens_in but cost
    # a fraction of it, so a cost figure needs them apart. Older rows knew none: 0.
    await db.execute("ALTER TABLE ledger ADD COLUMN tokens_cached INTEGER NOT NULL DEFAULT 0")


async def _m004_search(db: aiosqlite.Connection) -> None:
    # Recall (issue 11): a full-text index over every stored message, its clear
    # watermarks, and how far an existing database still has to be indexed; the
    # indexing itself runs in the background after start-up (store/search.py).
    # content='': the messages table holds the text, the index only terms and positions;
    # unicode61 splits on the spaces store/search.py puts between its terms.
    await db.execute(
        "CREATE VIRTUAL TABLE search_index USING fts5(body, who, sess, content='',"
        " tokenize='unicode61 remove_diacritics 0')"
    )
    # Per session: every message with id <= upto was cleared and is never returned.
    await db.execute(
        "CREATE TABLE search_cleared (session_id TEXT PRIMARY KEY, upto INTEGER NOT NULL) WITHOUT ROWID"
    )
    # How far indexing got: ids <= old_upto were stored before the index (the background
    # backfill walks down from there; total_old is for the progress in the log); ids in
    # (old_upto, indexed_upto] are indexed; newer ones wait for the next batch.
    await db.execute(
        "CREATE TABLE search_state (id INTEGER PRIMARY KEY CHECK (id = 1), old_upto INTEGER NOT NULL,"
        " indexed_upto INTEGER NOT NULL, total_old INTEGER NOT NULL)"
    )
    await db.execute(
        "INSERT INTO search_state (id, old_upto, indexed_upto, total_old)"
        " SELECT 1, COALESCE(MAX(id), 0), COALESCE(MAX(id), 0), COALESCE(MAX(id), 0) FROM messages"
    )


async def _m005_compressions(db: aiosqlite.Connection) -> None:
    # The history of compression runs, one row per run, for the owner's web page: the
    # metadata namespace `compression` only holds the last run of a session.
    await db.execute(
        """CREATE TABLE compressions (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            ts REAL NOT NULL,
            outcome TEXT NOT NULL CHECK (outcome IN ('done', 'error')),
            reason TEXT,
            tokens_before INTEGER,
            tokens_after INTEGER,
            kept INTEGER NOT NULL DEFAULT 0,
            archived INTEGER NOT NULL DEFAULT 0,
            requests INTEGER NOT NULL DEFAULT 0,
            line INTEGER
        )"""
    )
    await db.execute("CREATE INDEX compressions_by_session ON compressions (session_id, id)")
    # The usage page sums the ledger by time; covering, since fetching each row of a month
    # from the table cost more than scanning it all.
    await db.execute(
        "CREATE INDEX ledger_by_time ON ledger (ts, model, purpose, tokens_in, tokens_out, tokens_cached)"
    )
    # Each session's message counts, kept by triggers in the same transaction as every write
    # of every process: counting them for the overview scanned all messages (a second over
    # a million). `active` counts conversation as R-TRIG-4 does; `archived` every row.
    await db.execute(
        """CREATE TABLE message_counts (
            session_id TEXT PRIMARY KEY,
            active INTEGER NOT NULL DEFAULT 0,
            archived INTEGER NOT NULL DEFAULT 0,
            newest_ts REAL NOT NULL DEFAULT 0
        ) WITHOUT ROWID"""
    )
    await db.execute(
        """INSERT INTO message_counts (session_id, active, archived, newest_ts)
        SELECT session_id, SUM(archived = 0 AND event_marker = 0 AND role != 'system'), SUM(archived), MAX(ts)
        FROM messages GROUP BY session_id"""
    )
    await db.execute(
        """CREATE TRIGGER messages_counted_in AFTER INSERT ON messages BEGIN
            INSERT INTO message_counts (session_id, active, archived, newest_ts)
            VALUES (NEW.session_id, NEW.archived = 0 AND NEW.event_marker = 0 AND NEW.role != 'system',
                    NEW.archived, NEW.ts)
            ON CONFLICT (session_id) DO UPDATE SET active = active + excluded.active,
                archived = archived + excluded.archived, newest_ts = max(newest_ts, excluded.newest_ts);
        END"""
    )
    await db.execute(
        """CREATE TRIGGER messages_counted_archive AFTER UPDATE OF archived ON messages
        WHEN OLD.archived != NEW.archived BEGIN
            UPDATE message_counts SET
                active = active
                    + (NEW.event_marker = 0 AND NEW.role != 'system') * (OLD.archived - NEW.archived),
                archived = archived + NEW.archived - OLD.archived
            WHERE session_id = NEW.session_id;
        END"""
    )
    await db.execute(
        """CREATE TRIGGER messages_counted_out AFTER DELETE ON messages BEGIN
            UPDATE message_counts SET
                active = active - (OLD.archived = 0 AND OLD.event_marker = 0 AND OLD.role != 'system'),
                archived = archived - OLD.archived
            WHERE session_id = OLD.session_id;
        END"""
    )


async def _m006_crash_recovery(db: aiosqlite.Connection) -> None:
    # What a restart needs to lose nothing (issue 15): the platform's message id, so a
    # message fetched again after a reconnect (backfill) is stored once; whether a
    # message asked the bot for an answer, and up to which message the session's
    # questions were answered (marked before the reply goes out), so start-up answers
    # what a crash left unanswered and never answers anything twice.
    await db.execute("ALTER TABLE messages ADD COLUMN platform_id TEXT")
    await db.execute("ALTER TABLE messages ADD COLUMN addressed INTEGER NOT NULL DEFAULT 0")
    # Partial indexes: they hold only the rows they serve, so the per-message write
    # stays cheap and old files migrate in no time (their rows have neither).
    await db.execute(
        "CREATE INDEX messages_by_platform_id ON messages (session_id, platform_id)"
        " WHERE platform_id IS NOT NULL"
    )
    await db.execute("CREATE INDEX messages_addressed ON messages (ts) WHERE addressed = 1")
    await db.execute(
        """CREATE TABLE replies (
            session_id TEXT PRIMARY KEY,
            upto INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('sending', 'sent')),
            ts REAL NOT NULL
        ) WITHOUT ROWID"""
    )


async def _m007_search_scoped(db: aiosqlite.Connection) -> None:
    # Recall latency (issue 11): every index term now carries its session's scope, so a
    # word's posting list is the session's own; the first index had a session term in
    # every row instead, and intersecting that list (as long as the session) with the
    # word's took 2 to 35 ms of a query on a million messages. columnsize=0: nothing
    # reads the column sizes (the ranking counts the words in the text). The terms are
    # part of the file format (store/search.py), so the index is rebuilt: the background
    # backfill indexes every stored message again, newest first, with progress in the
    # log (search_state), leaving out what was cleared (search_cleared stays).
    await db.execute("DROP TABLE search_index")
    await db.execute(
        "CREATE VIRTUAL TABLE search_index USING fts5(body, who, day, content='', columnsize=0,"
        " tokenize='unicode61 remove_diacritics 0')"
    )
    await db.execute(
        "UPDATE search_state SET old_upto = newest, indexed_upto = newest, total_old = newest"
        " FROM (SELECT COALESCE(MAX(id), 0) AS newest FROM messages) WHERE id = 1"
    )


async def _m008_archive_counted_by_statement(db: aiosqlite.Connection) -> None:
    # A compression archives thousands of rows in a few statements, and this trigger ran
    # an UPDATE of message_counts for each row (~17 ms of a 5,000-message compression, issue
    # 9). The store's two archiving statements (archive_span, clear) now bring the counts
    # in step with one statement each (SqliteDb.count_archived). Inserts and deletes keep
    # their triggers: they touch one row, or a session being deleted.
    await db.execute("DROP TRIGGER messages_counted_archive")


async def _m009_withdrawn(db: aiosqlite.Connection) -> None:
    # A message its sender (or an admin) withdrew on the platform (group_recall,
    # friend_recall): kept, as every message is, but recall's chat-facing paths (the
    # model's tool, /回忆, api.search by default) no longer find it; the owner's page
    # shows it marked 已撤回. A constant default: no rewrite of the table.
    await db.execute("ALTER TABLE messages ADD COLUMN withdrawn INTEGER NOT NULL DEFAULT 0")


MIGRATIONS: tuple[Migration, ...] = (
    _m001_initial,
    _m002_message_tokens,
    _m003_ledger_cached_tokens,
    _m004_search,
    _m005_compressions,
    _m006_crash_recovery,
    _m007_search_scoped,
    _m008_archive_counted_by_statement,
    _m009_withdrawn,
)


async def migrate(db: aiosqlite.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the schema up to `len(migrations)`; return the version found before.

    `db` must be in autocommit mode (`isolation_level=None`) with no transaction open.
    Raises SchemaTooNewError, leaving the file untouched, when its version is newer.
    """
    await db.execute("BEGIN IMMEDIATE")
    try:
        # Read inside the write transaction: another process cannot migrate between
        # our read and our writes.
        async with db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        found = int(row[0]) if row else 0
        if found > len(migrations):
            raise SchemaTooNewError(found, len(migrations))
        for step in migrations[found:]:
            await step(db)
        if found < len(migrations):
            await db.execute(f"PRAGMA user_version = {len(migrations):d}")
        await db.execute("COMMIT")
    except BaseException:
        # A failed statement may already have ended the transaction (SQLITE_FULL,
        # SQLITE_IOERR); then ROLLBACK finds none, which is fine.
        with contextlib.suppress(sqlite3.OperationalError):
            await db.execute("ROLLBACK")
        raise
    return found
