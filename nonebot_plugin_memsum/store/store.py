"""The plugin's memory: sessions, history, metadata, settings and the usage ledger, in
one SQLite file or one PostgreSQL database (store/engine.py runs the SQL on either).

One long-lived connection in autocommit mode; every transaction is an explicit
`BEGIN` (SQLite: `BEGIN IMMEDIATE`) taken behind one asyncio lock, because all
coroutines share that connection and so share its transaction state.
`Store.transaction()` hands out a `Tx` for several steps that must commit together
(the compression commit, R-RUN-11); every other `Store` method is one transaction
of its own. Driver errors leave this module as `StoreError`, cause chained.

The SQL here is written once, in what both engines understand. On PostgreSQL other
processes write the same sessions: a cached history is checked against its session's
write counter before it is served, and `exclusive` keeps one compression per session
across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import math
import unicodedata
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from nonebot.log import logger

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.errors import ClearedMeanwhile, StoreError
from nonebot_plugin_memsum.lru import LRU
from nonebot_plugin_memsum.types import (
    QUOTE_OF_KEY,
    QUOTE_WITHDRAWN_KEY,
    REFUSED_KEY,
    CompressionRecord,
    DailyUsage,
    Message,
    SessionActivity,
    SessionRecord,
    ToolCall,
)

from . import search
from .cache import HistoryCache
from .engine import Db, Location, SqliteDb, connect, describe, is_url
from .search import SearchHit, SearchQuery

SUMMARY_NAMESPACE = "summary"
"""Metadata namespace of the summaries, key = session id (R-MEM-1)."""

ClearKind = Literal["context", "summary"]
RecallMask = Callable[[str, Sequence[Message]], str]
"""A stored recall result with what it shows of these messages masked: the withdrawn ones, and
the replies whose quote of them now reads as withdrawn (QUOTE_WITHDRAWN_KEY)."""
ReplyState = Literal["sending", "sent"]

_MESSAGE_COLUMNS = (
    "id, role, content, name, tool_calls, tool_call_id, ts, metadata, event_marker, tokens,"
    " platform_id, addressed, withdrawn"
)
_INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, role, content, name, tool_calls, tool_call_id, ts, metadata,"
    " event_marker, tokens, platform_id, addressed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The same message fetched twice (live and by a backfill after a reconnect) is stored
# once. Platform ids are not unique for ever (go-cqhttp's are 32-bit hashes), so only
# a recent namesake counts: one stored within DEDUP_SECONDS of this one.
SPEAKER_LABELS = 50
"""Messages read to learn who a speaker's name stands for (`Tx._speaker_ids`): the newest."""
SPEAKER_SCAN = 2000
"""Messages of each range (active, archived) read for a speaker whose name has no term to
search (`Store._named`): the newest."""
DEDUP_SECONDS = 8 * 24 * 3600.0
"""How far back a platform message id is checked for a duplicate (> the longest backfill)."""
_SESSION_COLUMNS = "id, platform, kind, place, peer, parent, room_class, created"
_COMPRESSION_COLUMNS = (
    "session_id, ts, outcome, reason, tokens_before, tokens_after, kept, archived, requests, line"
)


LEDGER_DELAY = 1.0
"""Seconds a usage row waits in memory for others to be written with (`Store.record_usage`)."""
_LEDGER_INSERT = (
    "INSERT INTO ledger (session_id, purpose, model, tokens_in, tokens_out, tokens_cached, ts)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""`json.dumps` with these options builds an encoder per call: every recorded message's metadata."""


def _dump_json(value: Any, what: str) -> str:
    try:
        return _JSON.encode(value)
    except (TypeError, ValueError) as err:
        raise StoreError(f"{what} is not JSON-serialisable: {err}") from err


_LIKE_ESCAPE = "!"


def _like_literal(text: str) -> str:
    """`text` as a LIKE pattern matching itself under `ESCAPE '!'`: `%` and `_` are wildcards
    on both engines, and without an explicit ESCAPE PostgreSQL reads `\\` as one (JSON writes
    a platform id's `\\` and `"` with it)."""
    return text.translate({ord(c): _LIKE_ESCAPE + c for c in (_LIKE_ESCAPE, "%", "_")})


def _message_params(session_id: str, msg: Message, ts: float) -> tuple[Any, ...]:
    tool_calls = (
        _dump_json(
            [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in msg.tool_calls], "tool_calls"
        )
        if msg.tool_calls
        else None
    )
    metadata = _dump_json(dict(msg.metadata), "message metadata") if msg.metadata else None
    return (
        session_id,
        msg.role,
        msg.content,
        msg.name,
        tool_calls,
        msg.tool_call_id,
        ts,
        metadata,
        int(msg.event_marker),
        msg.tokens,
        msg.platform_id,
        int(msg.addressed),
    )


def _reply_mark(session_id: str, upto: int, state: ReplyState) -> tuple[str, tuple[Any, ...]]:
    """The statement of `Tx.mark_reply`: the mark only moves forward."""
    return (
        "INSERT INTO replies (session_id, upto, state, ts) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (session_id) DO UPDATE SET upto = CASE WHEN excluded.upto > replies.upto"
        " THEN excluded.upto ELSE replies.upto END,"
        " state = excluded.state, ts = excluded.ts",
        (session_id, upto, state, clock.now()),
    )


# A row becomes a Message without going through its frozen __init__, which sets each
# of the 13 fields through object.__setattr__: setting the slots directly decodes a
# 5,000-message history about 4 times faster (~24 -> ~6 ms), and a compression or a cold
# prompt reads thousands. Every field is named here; a field added to Message and not
# here stops the import (and tests/test_store.py compares both ways of building one).
_ROW_FIELDS = (
    "id",
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "ts",
    "metadata",
    "event_marker",
    "tokens",
    "platform_id",
    "addressed",
    "withdrawn",
    "wire",  # not stored: the wire form's memo (agent/wire.py) starts empty
)
if set(_ROW_FIELDS) != {f.name for f in dataclasses.fields(Message)}:
    raise RuntimeError("store._ROW_FIELDS must name every field of Message")
_ROW_SETTERS = tuple(getattr(Message, name).__set__ for name in _ROW_FIELDS)


def _message_from_row(row: tuple[Any, ...]) -> Message:
    # Positional unpacking: this runs for every message of every prompt.
    msg_id, role, content, name, calls, call_id, ts, metadata, marker, tokens, pid, addressed, gone = row
    meta = json.loads(metadata) if metadata else {}
    if meta and meta.get(REFUSED_KEY) is True:
        tokens = None  # as for a withdrawn one: the model reads a placeholder, not the text
    values = (
        msg_id,
        role,
        content,
        name,
        tuple(ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in json.loads(calls))
        if calls
        else (),
        call_id,
        ts,
        meta,
        bool(marker),
        None if gone else tokens,  # the estimate of its text: not what is sent of it
        pid,
        bool(addressed),
        bool(gone),
        None,
    )
    msg = object.__new__(Message)
    for set_field, value in zip(_ROW_SETTERS, values):
        set_field(msg, value)
    return msg


def _session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    sid, platform, kind, place, peer, parent, room_class, created = row
    return SessionRecord(
        id=sid,
        platform=platform,
        kind=kind,
        place=place,
        peer=peer,
        parent=parent,
        room_class=room_class,
        created=created,
    )


_NO_LIMIT = 2**62
"""A LIMIT (or an id bound) both engines read as none (PostgreSQL refuses SQLite's -1)."""


def _sql_limit(limit: float) -> int:
    """`limit` as a LIMIT: math.inf takes all; NaN and non-positive take nothing."""
    if limit >= _NO_LIMIT:  # math.inf, or too big for an SQL integer anyway
        return _NO_LIMIT
    return int(limit) if limit > 0 else 0


def _check_scope(scope: str) -> None:
    if scope not in ("place", "session"):
        raise StoreError(f"unknown setting scope {scope!r}; allowed: place, session")


class Tx:
    """The steps of one open transaction; valid only inside `Store.transaction()`.

    It notes which sessions' messages it wrote, so the store's history cache stays
    true: a method that changes rows of `messages` adds the session to `_touched` (or, for a plain
    append, `_appended`), nothing else is needed.
    """

    __slots__ = ("_appended", "_cleared", "_db", "_ledger", "_named_answers", "_open", "_touched")

    def __init__(self, db: Db, ledger: list[tuple[Any, ...]] | None = None) -> None:
        self._db = db
        self._open = True
        self._ledger = [] if ledger is None else ledger
        """The store's usage rows not written yet: any statement on the ledger writes them first."""
        self._appended: list[tuple[str, Message]] = []
        """Messages appended, in order: the cache extends a cached history with them."""
        self._touched: set[str] = set()
        """Sessions whose rows changed otherwise: their cached history is dropped."""
        self._named_answers: list[tuple[str, str, str]] = []
        """(session, text, platform id) of `name_answer`: the cached answer gets its id."""
        self._cleared: set[str] = set()
        """Sessions whose context it cleared, or which it deleted (`Store.clears`)."""

    def _end(self) -> None:
        self._open = False

    def _live(self) -> Db:
        if not self._open:
            raise StoreError("transaction already ended: use the Tx only inside its `async with`")
        return self._db

    async def _fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        db = self._live()
        if self._ledger and "ledger" in sql:
            await self.write_ledger()
        return await db.fetch(sql, params)

    async def _write(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        """A write whose answer nobody reads: inside a transaction it goes to the database
        with the next statement or the COMMIT (one trip fewer, Db.write)."""
        await self._live().write(sql, params)

    async def data_version(self) -> int:
        """SQLite's counter of commits that other connections made to the file."""
        return int((await self._fetch("PRAGMA data_version"))[0][0])

    async def version(self, session_id: str) -> int:
        """The session's write counter (PostgreSQL: bumped by every write of its messages)."""
        rows = await self._fetch("SELECT version FROM message_counts WHERE session_id = ?", (session_id,))
        return int(rows[0][0]) if rows else 0

    async def save_session(self, rec: SessionRecord) -> SessionRecord:
        """Insert the record if its id is new; return the stored one (the first write wins)."""
        await self.insert_session(rec)
        stored = await self.get_session(rec.id)
        assert stored is not None  # inserted or already there, inside this transaction
        return stored

    async def insert_session(self, rec: SessionRecord) -> None:
        """Insert the record if its id is new."""
        await self._fetch(
            f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO NOTHING",
            (
                rec.id,
                rec.platform,
                rec.kind,
                rec.place,
                rec.peer,
                rec.parent,
                rec.room_class,
                rec.created or clock.now(),
            ),
        )

    async def get_session(self, session_id: str) -> SessionRecord | None:
        rows = await self._fetch(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,))
        return _session_from_row(rows[0]) if rows else None

    async def append(self, session_id: str, msg: Message) -> Message:
        """Store `msg` at the end of the session's history; return it with its id (and ts if it had none)."""
        ts = msg.ts or clock.now()
        db = self._live()
        # Recall (issue 11): PostgreSQL indexes it in the same statement (Db.insert_message).
        new_id = await db.insert_message(
            _INSERT_MESSAGE, _message_params(session_id, msg, ts), session_id, msg, ts
        )
        return self._stored(session_id, msg, new_id, ts)

    def _stored(self, session_id: str, msg: Message, new_id: int, ts: float) -> Message:
        """The message as stored, noted for the history cache."""
        stored = replace(msg, id=new_id, ts=ts)
        self._appended.append((session_id, stored))
        return stored

    async def append_once(self, session_id: str, msg: Message) -> Message | None:
        """`append`, unless a message with the same `platform_id` is stored already
        (within DEDUP_SECONDS): then None. A message without a platform id is always stored."""
        if msg.platform_id is None:
            return await self.append(session_id, msg)
        ts = msg.ts or clock.now()
        found = (
            "SELECT 1 FROM messages WHERE session_id = ? AND platform_id = ? AND ts >= ? LIMIT 1",
            (session_id, msg.platform_id, ts - DEDUP_SECONDS),
        )
        new_id = await self._live().insert_message_unless(
            found, _INSERT_MESSAGE, _message_params(session_id, msg, ts), session_id, msg, ts
        )
        return None if new_id is None else self._stored(session_id, msg, new_id, ts)

    async def by_platform_id(self, session_id: str, platform_id: str) -> Message | None:
        """The newest message of the session (active or archived) stored under this platform
        id: what a reply quotes when the implementation no longer holds the quoted message."""
        rows = await self._fetch(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND platform_id = ?"
            " ORDER BY id DESC LIMIT 1",
            (session_id, platform_id),
        )
        return _message_from_row(rows[0]) if rows else None

    async def name_answer(self, session_id: str, text: str, platform_id: str) -> None:
        """The platform id the session's newest answer went out under, when `text` is that
        answer (an apology or a notice sent without storing one names nothing). Its newest
        assistant message without a platform id: what another plugin said meanwhile has its
        own (onebot/said.py). The cached history's copy gets the id too (HistoryCache.name)."""
        self._named_answers.append((session_id, text, platform_id))
        await self._write(
            "UPDATE messages SET platform_id = ? WHERE id = (SELECT MAX(id) FROM messages"
            " WHERE session_id = ? AND role = 'assistant' AND platform_id IS NULL) AND content = ?",
            (platform_id, session_id, text),
        )

    async def mark_withdrawn(self, session_id: str, platform_id: str, mask: RecallMask | None = None) -> None:
        """The session's messages stored under this platform id were withdrawn on the platform
        (group_recall, friend_recall): kept, but found by a search only when it asks for them
        (`SearchQuery.withdrawn`), and read back as `Message.withdrawn` (the model reads a
        placeholder): the session's cached history is read again. `mask`: what an active
        `recall` tool result stored after them holds of them, rewritten the same way
        (agent/recall.py `mask_withdrawn`), so the model does not read the text there either.
        Replies stored before that quote them (QUOTE_OF_KEY) get QUOTE_WITHDRAWN_KEY: their quote
        reads as withdrawn from now on (`types.unquoted`), in the results too."""
        self._touched.add(session_id)
        await self._write(
            "UPDATE messages SET withdrawn = 1 WHERE session_id = ? AND platform_id = ?",
            (session_id, platform_id),
        )
        gone = [
            _message_from_row(r)
            for r in await self._fetch(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND platform_id = ?"
                " ORDER BY id",
                (session_id, platform_id),
            )
        ]
        quoting = await self._mark_quotes_withdrawn(session_id, platform_id, gone[0].id if gone else None)
        gone += quoting
        if mask is None or not gone:
            return
        results = await self._fetch(
            "SELECT id, content FROM messages WHERE session_id = ? AND archived = 0 AND id > ?"
            " AND role = 'tool' AND name = 'recall'",
            (session_id, gone[0].id),
        )
        for msg_id, content in results:
            if (masked := mask(content, gone)) != content:
                # The stored estimate was of the old text: read back without one (recomputed).
                await self._write(
                    "UPDATE messages SET content = ?, tokens = NULL WHERE id = ?", (masked, msg_id)
                )

    async def mark_unsent(self, session_id: str, msg_id: int) -> None:
        """The session's answer stored as message `msg_id` never reached the chat (the platform
        refused the send): read back as withdrawn (`mark_withdrawn`), not as said. It had no
        platform id, so nothing quotes it."""
        self._touched.add(session_id)
        await self._write(
            "UPDATE messages SET withdrawn = 1 WHERE session_id = ? AND id = ?", (session_id, msg_id)
        )

    async def _mark_quotes_withdrawn(
        self, session_id: str, platform_id: str, after: int | None
    ) -> list[Message]:
        """QUOTE_WITHDRAWN_KEY on the session's replies quoting this platform id; those replies,
        as now read (their stored estimate was of the quote's text: read back without one).
        Only what came after the message's id `after` (a reply follows what it quotes): a
        withdrawal in a session of a million messages reads its tail, not every row's metadata;
        a message never stored (None: said before the bot came), the active history."""
        fragment = _dump_json({QUOTE_OF_KEY: platform_id}, "quote")[1:-1]
        rows = await self._fetch(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
            + (" AND archived IN (0, 1) AND id > ?" if after is not None else " AND archived = 0")
            + f" AND role = 'user' AND metadata LIKE ? ESCAPE '{_LIKE_ESCAPE}' ORDER BY id",
            (session_id, *((after,) if after is not None else ()), f"%{_like_literal(fragment)}%"),
        )
        out: list[Message] = []
        for row in rows:
            m = _message_from_row(row)
            if m.metadata.get(QUOTE_OF_KEY) != platform_id or m.metadata.get(QUOTE_WITHDRAWN_KEY) is True:
                continue
            metadata = {**m.metadata, QUOTE_WITHDRAWN_KEY: True}
            await self._write(
                "UPDATE messages SET metadata = ?, tokens = NULL WHERE id = ?",
                (_dump_json(metadata, "message metadata"), m.id),
            )
            m = replace(m, metadata=metadata, tokens=None)
            await self._live().requote(session_id, m)  # a search no longer finds the quoted words
            out.append(m)
        return out

    async def session_of_platform_id(self, prefix: str, platform_id: str) -> str | None:
        """The session, among those whose id starts with `prefix`, that stored a message under
        this platform id (the newest such message's); None when none did. One index look-up per
        session of the prefix (messages_by_platform_id): for a rare event, not for every message."""
        rows = await self._fetch(
            "SELECT m.session_id FROM sessions AS s JOIN messages AS m ON m.session_id = s.id"
            " WHERE substr(s.id, 1, ?) = ? AND m.platform_id = ? ORDER BY m.id DESC LIMIT 1",
            (len(prefix), prefix, platform_id),
        )
        return str(rows[0][0]) if rows else None

    async def mark_refused(self, session_id: str, ids: Sequence[int]) -> None:
        """The model provider's content review refused these messages of the session
        (llm/review.py): their metadata gets REFUSED_KEY, so what reaches the model from now on
        is a placeholder (`shown_content`); the text stays stored (R-MEM-2). The session's
        cached history is read again."""
        if not ids:
            return
        self._touched.add(session_id)
        marks = ", ".join("?" * len(ids))
        rows = await self._fetch(
            f"SELECT id, metadata FROM messages WHERE session_id = ? AND id IN ({marks})", (session_id, *ids)
        )
        for msg_id, metadata in rows:
            value = json.loads(metadata) if metadata else {}
            value[REFUSED_KEY] = True
            await self._write(
                "UPDATE messages SET metadata = ? WHERE id = ?",
                (_dump_json(value, "message metadata"), msg_id),
            )

    async def stored_platform_ids(self, session_id: str, said: Mapping[str, float]) -> set[str]:
        """Those of the platform ids in `said` (id → when it was said) the session stored
        already, as `append_once` counts them: a backfill skips them in one trip, not one each."""
        if not said:
            return set()
        marks = ", ".join("?" * len(said))
        rows = await self._fetch(
            f"SELECT platform_id, MAX(ts) FROM messages WHERE session_id = ? AND platform_id IN ({marks})"
            " AND ts >= ? GROUP BY platform_id",
            (session_id, *said, min(said.values()) - DEDUP_SECONDS),
        )
        return {str(pid) for pid, ts in rows if ts >= said[str(pid)] - DEDUP_SECONDS}

    async def recent_sessions(self, prefix: str, since: float) -> list[tuple[str, float]]:
        """Sessions whose id starts with `prefix` and whose newest stored message (active
        or archived) is from `since` on: (session id, that message's time), oldest first."""
        # The newest time is kept per session by the message_counts triggers: no scan.
        rows = await self._fetch(
            "SELECT s.id, c.newest_ts FROM sessions AS s JOIN message_counts AS c ON c.session_id = s.id"
            " WHERE substr(s.id, 1, ?) = ? AND c.newest_ts >= ? AND c.active + c.archived > 0"
            " ORDER BY c.newest_ts",
            (len(prefix), prefix, since),
        )
        return [(r[0], float(r[1])) for r in rows]

    async def pending_questions(self, since: float, prefix: str = "") -> list[tuple[str, Message]]:
        """(session id, message) of the active messages that asked the bot, said from
        `since` on, after the last answer of their session, in storage order; a withdrawn
        (撤回) one asks nothing any more."""
        rows = await self._fetch(
            f"SELECT m.session_id, {', '.join('m.' + c for c in _MESSAGE_COLUMNS.split(', '))}"
            " FROM messages AS m LEFT JOIN replies AS r ON r.session_id = m.session_id"
            " WHERE m.addressed = 1 AND m.withdrawn = 0 AND m.ts >= ? AND m.archived = 0"
            " AND m.id > COALESCE(r.upto, 0)"
            " AND substr(m.session_id, 1, ?) = ? ORDER BY m.id",
            (since, len(prefix), prefix),
        )
        return [(r[0], _message_from_row(r[1:])) for r in rows]

    async def questions_withdrawn(self, session_id: str, upto: int | None = None) -> bool:
        """Whether messages of the session (up to id `upto`) asked the bot after its last
        answer, and every one of them was withdrawn (撤回) since."""
        rows = await self._fetch(
            "SELECT MIN(withdrawn) FROM messages WHERE session_id = ? AND archived IN (0, 1)"
            " AND addressed = 1 AND id > COALESCE((SELECT upto FROM replies WHERE session_id = ?), 0)"
            " AND id <= ?",  # `archived IN`: both ranges of messages_by_session
            (session_id, session_id, _NO_LIMIT if upto is None else upto),
        )
        return bool(rows and rows[0][0])

    async def answered_upto(self, session_id: str) -> int:
        """The id of the last message the session's last turn read (0: no turn yet)."""
        rows = await self._fetch("SELECT upto FROM replies WHERE session_id = ?", (session_id,))
        return int(rows[0][0]) if rows else 0

    async def mark_reply(self, session_id: str, upto: int, state: ReplyState) -> None:
        """The session's questions up to message `upto` are answered: `sending` is written
        before the reply goes out (so a crash after it never answers them again), `sent` after."""
        await self._write(*_reply_mark(session_id, upto, state))

    async def append_marking(self, session_id: str, msg: Message, upto: int, state: ReplyState) -> Message:
        """`append`, then `mark_reply`, as one transaction of their own (`Db.insert_message_with`)."""
        ts = msg.ts or clock.now()
        new_id = await self._live().insert_message_with(
            _INSERT_MESSAGE,
            _message_params(session_id, msg, ts),
            session_id,
            msg,
            ts,
            [_reply_mark(session_id, upto, state)],
        )
        return self._stored(session_id, msg, new_id, ts)

    async def get_history(self, session_id: str, limit: float = math.inf) -> list[Message]:
        """The last `limit` active messages of the session, in storage order."""
        return await self._tail(session_id, archived=False, limit=limit)

    async def first_active(self, session_id: str, limit: int) -> list[Message]:
        """The first `limit` active messages of the session, in storage order (the web
        page's kept originals, without reading a long history whole)."""
        rows = await self._fetch(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND archived = 0"
            " ORDER BY id LIMIT ?",
            (session_id, limit),
        )
        return [_message_from_row(r) for r in rows]

    async def _tail(self, session_id: str, *, archived: bool, limit: float) -> list[Message]:
        # Newest first so LIMIT takes the tail; the index makes it a short range scan.
        rows = await self._fetch(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND archived = ?"
            " ORDER BY id DESC LIMIT ?",
            (session_id, int(archived), _sql_limit(limit)),
        )
        return [_message_from_row(r) for r in reversed(rows)]

    async def count_active(self, session_id: str) -> int:
        """Active conversation messages: event markers and system messages do not count (R-TRIG-4)."""
        rows = await self._fetch(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND archived = 0"
            " AND event_marker = 0 AND role != 'system'",
            (session_id,),
        )
        return int(rows[0][0])

    async def archive_span(self, session_id: str, count: int, keep: Collection[int] = ()) -> int:
        """Archive the first `count` active messages except those at the 0-based span indexes in `keep`.

        Returns how many were archived. A span longer than the active history, or a
        keep index outside the span, is refused before anything changes.
        """
        if count < 0:
            raise StoreError(f"archive span length must not be negative, got {count}")
        kept = set(keep)
        outside = sorted(i for i in kept if not 0 <= i < count)
        if outside:
            raise StoreError(f"keep index {outside[0]} is outside the archive span of {count}")
        rows = await self._fetch(
            "SELECT id FROM messages WHERE session_id = ? AND archived = 0 ORDER BY id LIMIT ?",
            (session_id, count),
        )
        if len(rows) < count:
            raise StoreError(f"archive span of {count} messages, but the session has only {len(rows)} active")
        self._touched.add(session_id)
        # R-RUN-12: kept originals are not written to at all. The span between two kept ones
        # is one statement over an id range (the active messages in it are exactly those of
        # `rows`), not one per message: thousands of rows in a few statements (issue 9).
        runs: list[tuple[str, int, int]] = []
        start = 0
        for stop in [*sorted(kept), count]:
            if start < stop:
                runs.append((session_id, rows[start][0], rows[stop - 1][0]))
            start = stop + 1
        await self._live().write_many(
            "UPDATE messages SET archived = 1 WHERE session_id = ? AND archived = 0 AND id BETWEEN ? AND ?",
            runs,
        )
        await self._live().count_archived(session_id, count - len(kept))
        return count - len(kept)

    async def get_archived(self, session_id: str, limit: float = math.inf) -> list[Message]:
        """The last `limit` archived messages of the session, in storage order."""
        return await self._tail(session_id, archived=True, limit=limit)

    async def get_meta(self, namespace: str, key: str) -> Any | None:
        rows = await self._fetch(
            "SELECT value FROM metadata WHERE namespace = ? AND key = ?", (namespace, key)
        )
        return json.loads(rows[0][0]) if rows else None

    async def put_meta(self, namespace: str, key: str, value: Any) -> None:
        await self._write(
            "INSERT INTO metadata (namespace, key, value) VALUES (?, ?, ?)"
            " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value",
            (namespace, key, _dump_json(value, f"metadata {namespace}/{key}")),
        )

    async def meta_values(self, namespace: str) -> dict[str, Any]:
        """Every value of a metadata namespace, by key."""
        rows = await self._fetch("SELECT key, value FROM metadata WHERE namespace = ?", (namespace,))
        return {key: json.loads(value) for key, value in rows}

    async def delete_meta(self, namespace: str, key: str) -> None:
        await self._write("DELETE FROM metadata WHERE namespace = ? AND key = ?", (namespace, key))

    async def list_meta(self, namespace: str) -> dict[str, Any]:
        """Every key of a namespace with its value."""
        rows = await self._fetch("SELECT key, value FROM metadata WHERE namespace = ?", (namespace,))
        return {key: json.loads(value) for key, value in rows}

    async def clear(self, session_id: str, kind: ClearKind) -> None:
        """R-MEM-2: "context" archives all active history and drops the summary; "summary" drops it alone."""
        if kind not in ("context", "summary"):
            raise StoreError(f"unknown clear kind {kind!r}; allowed: context, summary")
        # R-MEM-3 across processes: a compression committing in another one holds the session
        # from its clear-mark check to its COMMIT; wait for it, so its summary is cleared too.
        await self._live().hold(session_id)
        if kind == "context":
            self._touched.add(session_id)
            self._cleared.add(session_id)
            rows = await self._fetch(
                "SELECT COUNT(*) FROM messages WHERE session_id = ? AND archived = 0", (session_id,)
            )
            await self._fetch(
                "UPDATE messages SET archived = 1 WHERE session_id = ? AND archived = 0", (session_id,)
            )
            await self._live().count_archived(session_id, int(rows[0][0]))
            await self._live().forget(session_id)  # what was cleared is never found again
        await self.delete_meta(SUMMARY_NAMESPACE, session_id)

    async def delete_session(self, session_id: str) -> None:
        """R-MEM-2: everything of one session: its messages (active and archived), every
        metadata entry keyed by its id (summary, last run, todos, back-off, usage), its own
        settings and its record. The usage ledger stays: it is what was paid. Its rows leave
        the search index first (their terms are read from the rows being deleted)."""
        # As a clear (R-MEM-3): wait for a compression committing in another process, which
        # holds the session and then writes its messages; deleting them first deadlocked with it.
        await self._live().hold(session_id)
        self._touched.add(session_id)
        self._cleared.add(session_id)
        await self._live().forget(session_id)
        for sql in (
            "DELETE FROM messages WHERE session_id = ?",
            "DELETE FROM metadata WHERE key = ?",
            "DELETE FROM settings WHERE scope = 'session' AND scope_key = ?",
            "DELETE FROM sessions WHERE id = ?",
        ):
            await self._fetch(sql, (session_id,))

    async def search(self, query: SearchQuery, context: int = 0) -> list[SearchHit]:
        """The session's stored messages (active and archived, never cleared ones) matching
        `query`, best first, each with up to `context` conversation messages either side
        (`Db.search`: one statement on SQLite)."""
        who = (query.speaker or "").strip()
        if who and not query.speaker_ids and not who.isdigit():
            # A name without a searchable character (a card of emoji or punctuation: 🌸, 。)
            # is matched whole against the labels; nobody by that name finds nothing.
            termless = search.match_expression(who) is None
            ids = await (self._named(query) if termless else self._speaker_ids(query))
            if termless and not ids:
                return []
            query = dataclasses.replace(query, speaker_ids=ids)
        hits: list[tuple[float, Message]] = []
        near: dict[tuple[int, int], list[Message]] = {}
        for row in await self._live().search(query, _MESSAGE_COLUMNS, context):
            hit_id, side, score, msg = row[0], row[1], row[2], _message_from_row(row[3:])
            if side == 0:
                hits.append((float(score), msg))
            else:
                near.setdefault((hit_id, side), []).append(msg)

        def closest(hit_id: int, side: int) -> tuple[Message, ...]:
            # Up to `context` from each of the archived and active ranges: the nearest of both.
            rows = sorted(near.get((hit_id, side), []), key=lambda m: m.id or 0)
            return tuple(rows[-context:] if side < 0 else rows[:context])

        hits.sort(key=lambda h: (-h[0], -(h[1].id or 0)))
        return [
            SearchHit(msg, score, closest(msg.id or 0, -1), closest(msg.id or 0, 1)) for score, msg in hits
        ]

    async def _speaker_ids(self, query: SearchQuery) -> tuple[str, ...]:
        """The QQ numbers of the session's members whose label held the speaker's name, in
        their newest SPEAKER_LABELS messages: a card change renames only later lines, and
        the owner (or the model) knows one name, old or new."""
        names = dataclasses.replace(
            query, text="", since=None, until=None, limit=SPEAKER_LABELS, withdrawn=True, speaker_ids=()
        )
        rows = await self._live().search(names, "id, role, name", 0)
        return tuple(sorted({str(r[5]) for r in rows if r[4] == "user" and str(r[5] or "").isdigit()}))

    async def _named(self, query: SearchQuery) -> tuple[str, ...]:
        """The QQ numbers labelled exactly with the speaker's name (one with no term to index),
        in the session's newest SPEAKER_SCAN messages, active and archived."""
        name = unicodedata.normalize("NFKC", (query.speaker or "").strip())
        found: set[str] = set()
        for archived in (0, 1):
            rows = await self._fetch(
                "SELECT content FROM messages WHERE session_id = ? AND archived = ? AND role = 'user'"
                " ORDER BY id DESC LIMIT ?",
                (query.session_id, archived, SPEAKER_SCAN),
            )
            for (content,) in rows:
                nick, qq, _ = search.split_label(str(content))
                if qq and nick is not None and unicodedata.normalize("NFKC", nick.strip()) == name:
                    found.add(qq)
        return tuple(sorted(found))

    async def get_settings(self, scope: str, scope_key: str) -> dict[str, Any]:
        """Every setting stored for one scope key, by name."""
        rows = await self._fetch(
            "SELECT name, value FROM settings WHERE scope = ? AND scope_key = ?", (scope, scope_key)
        )
        return {name: json.loads(value) for name, value in rows}

    async def set_setting(self, scope: str, scope_key: str, name: str, value: Any) -> None:
        _check_scope(scope)
        await self._fetch(
            "INSERT INTO settings (scope, scope_key, name, value) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (scope, scope_key, name) DO UPDATE SET value = excluded.value",
            (scope, scope_key, name, _dump_json(value, f"setting {name}")),
        )

    async def delete_setting(self, scope: str, scope_key: str, name: str) -> None:
        await self._fetch(
            "DELETE FROM settings WHERE scope = ? AND scope_key = ? AND name = ?", (scope, scope_key, name)
        )

    async def write_ledger(self) -> None:
        """Write the usage rows waiting in memory, in one statement."""
        db = self._live()
        rows = list(self._ledger)
        self._ledger.clear()
        try:
            await db.executemany(_LEDGER_INSERT, rows)
        except StoreError:
            self._ledger[:0] = rows  # kept for the next attempt
            raise

    async def usage_totals(self, session_id: str) -> dict[str, tuple[int, int]]:
        """Tokens in and out per purpose for the session."""
        rows = await self._fetch(
            "SELECT purpose, SUM(tokens_in), SUM(tokens_out) FROM ledger WHERE session_id = ?"
            " GROUP BY purpose",
            (session_id,),
        )
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    async def usage_rows(self, place: str | None, since: float | None) -> list[UsageRow]:
        """The ledger since `since` (None: ever), summed per usage place, purpose and model;
        one place's rows, or every place's when `place` is None."""
        where, params = _usage_filter(place, since, "l.")
        rows = await self._fetch(
            "SELECT COALESCE(s.platform || ':' || s.place, l.session_id, ''), l.purpose, l.model,"
            " COUNT(*), SUM(l.tokens_in), SUM(l.tokens_out), SUM(l.tokens_cached)"
            f" FROM ledger l LEFT JOIN sessions s ON s.id = l.session_id{where}"
            " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            params,
        )
        return [UsageRow(*r[:3], *(int(n) for n in r[3:])) for r in rows]

    async def activity(self, place: str, since: float | None, divider: str) -> Activity:
        """Answers stored (assistant messages that are not tool calls) and compressions
        (their `divider` markers) of a usage place since `since`, archive included."""
        where, params = _usage_filter(place, since, "")
        rows = await self._fetch(
            "SELECT COALESCE(SUM(CASE WHEN role = 'assistant' AND tool_calls IS NULL THEN 1 ELSE 0 END), 0),"
            " COALESCE(SUM(CASE WHEN role = 'system' AND event_marker = 1 AND content = ?"
            " THEN 1 ELSE 0 END), 0)"
            f" FROM messages{where}",
            (divider, *params),
        )
        return Activity(answers=int(rows[0][0]), compressions=int(rows[0][1]))

    async def record_compression(self, run: CompressionRecord) -> None:
        await self._write(
            f"INSERT INTO compressions ({_COMPRESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.session_id,
                run.ts,
                run.outcome,
                run.reason,
                run.tokens_before,
                run.tokens_after,
                run.kept,
                run.archived,
                run.requests,
                run.line,
            ),
        )

    async def compressions(self, session_id: str, limit: int = 200) -> list[CompressionRecord]:
        """The session's compression runs, newest first."""
        rows = await self._fetch(
            f"SELECT {_COMPRESSION_COLUMNS} FROM compressions WHERE session_id = ? ORDER BY id DESC LIMIT ?",
            (session_id, limit),
        )
        return [CompressionRecord(*r) for r in rows]

    async def last_compressions(self) -> dict[str, CompressionRecord]:
        """Every session's latest compression run."""
        rows = await self._fetch(
            f"SELECT {_COMPRESSION_COLUMNS} FROM compressions WHERE id IN"
            " (SELECT MAX(id) FROM compressions GROUP BY session_id)"
        )
        return {r[0]: CompressionRecord(*r) for r in rows}

    async def session_overview(self, usage_purpose: str) -> list[SessionActivity]:
        """Every session with stored history or a record: its record, active conversation
        messages (as R-TRIG-4 counts them), archived messages, the time of its newest
        message and the prompt size of its last `usage_purpose` call in the ledger. A
        session with a record and nothing stored (a group set to 关 by its first command)
        is listed with zeros: the owner's page shows it and its controls. By session id,
        sorted here: the same order on both engines (PostgreSQL's text collation is not
        SQLite's, and without an order it lists rows as its plan reads them)."""
        # The last call per session is one seek on (session_id, purpose), ids in order.
        counts = await self._fetch(
            "SELECT c.session_id, c.active, c.archived, c.newest_ts, l.tokens_in, l.model"
            " FROM message_counts c LEFT JOIN ledger l ON l.id = (SELECT id FROM ledger"
            " WHERE session_id = c.session_id AND purpose = ? ORDER BY id DESC LIMIT 1)"
            " WHERE c.active > 0 OR c.archived > 0",
            (usage_purpose,),
        )
        records = {
            r[0]: _session_from_row(r) for r in await self._fetch(f"SELECT {_SESSION_COLUMNS} FROM sessions")
        }
        listed = [
            SessionActivity(
                session_id=sid,
                record=records.get(sid),
                active=int(n_active),
                archived=int(n_archived),
                last_ts=float(newest_ts),
                usage=usage,
                usage_model=model,
            )
            for sid, n_active, n_archived, newest_ts, usage, model in counts
        ]
        seen = {a.session_id for a in listed}
        listed += [
            SessionActivity(sid, record, 0, 0, 0.0, None, None)
            for sid, record in records.items()
            if sid not in seen
        ]
        return sorted(listed, key=lambda a: a.session_id)

    async def all_settings(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every stored setting, by (scope, scope key), then by name."""
        result: dict[tuple[str, str], dict[str, Any]] = {}
        for scope, key, name, value in await self._fetch(
            "SELECT scope, scope_key, name, value FROM settings"
        ):
            result.setdefault((scope, key), {})[name] = json.loads(value)
        return result

    async def usage_by_day(
        self,
        since: float = 0.0,
        session_id: str | None = None,
        utc_offset: int = 0,
        until: float | None = None,
    ) -> list[DailyUsage]:
        """Ledger totals per day, model and purpose from `since` on (before `until`), oldest
        day first; of one session, or of every call. Days start at midnight `utc_offset`
        seconds east of UTC (integer arithmetic: SQLite's 'localtime' modifier per row cost a
        second over 100k rows; a zone with daylight saving asks per span, `usage.offset_spans`)."""
        where = "ts >= ?" + (" AND ts < ?" if until is not None else "")
        where += " AND session_id = ?" if session_id is not None else ""
        params: tuple[Any, ...] = (utc_offset, since) + ((until,) if until is not None else ())
        params += (session_id,) if session_id is not None else ()
        rows = await self._fetch(
            f"SELECT {self._live().day('ts')} AS day, model, purpose, COUNT(*), SUM(tokens_in),"
            f" SUM(tokens_out), SUM(tokens_cached) FROM ledger WHERE {where}"
            " GROUP BY day, model, purpose ORDER BY day, model, purpose",
            params,
        )
        epoch = datetime.date(1970, 1, 1)
        return [DailyUsage(str(epoch + datetime.timedelta(days=day)), *rest) for day, *rest in rows]

    async def usage_series(self, session_id: str, purpose: str, limit: int = 500) -> list[tuple[float, int]]:
        """(time, tokens in) of the session's last `limit` calls for `purpose`, oldest first."""
        rows = await self._fetch(
            "SELECT ts, tokens_in FROM ledger WHERE session_id = ? AND purpose = ? ORDER BY id DESC LIMIT ?",
            (session_id, purpose, limit),
        )
        return [(float(ts), int(n)) for ts, n in reversed(rows)]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Ledger sums of one usage place, purpose and model."""

    place: str
    """A group's `platform:place` (all its sessions, one per bot account), else the
    session id; empty for calls made for no session."""
    purpose: str
    model: str
    calls: int
    tokens_in: int
    tokens_out: int
    tokens_cached: int
    """The part of tokens_in the provider's cache served."""


@dataclass(frozen=True, slots=True)
class Activity:
    answers: int
    compressions: int


def _usage_filter(place: str | None, since: float | None, alias: str) -> tuple[str, tuple[Any, ...]]:
    """WHERE clause selecting a usage place's rows (through the session index) and a period."""
    clauses: list[str] = []
    params: list[Any] = []
    if place is not None:
        clauses.append(
            f"{alias}session_id IN (SELECT id FROM sessions WHERE place IS NOT NULL"
            " AND platform || ':' || place = ? UNION SELECT ?)"
        )
        params += [place, place]
    if since is not None:
        clauses.append(f"{alias}ts >= ?")
        params.append(since)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


class Store:
    """One SQLite file or PostgreSQL database; `open()` at start-up, `close()` at shutdown
    (both idempotent). `location`: a path, or a `postgresql://` URL (engine.Location)."""

    def __init__(self, location: Location) -> None:
        self._location: Location = location if is_url(location) else Path(location)
        self._db: Db | None = None
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[Any] | None = None
        """The task inside `transaction()`, to refuse a nested call that would wait on itself."""
        self._sessions: LRU[str, SessionRecord] = LRU()
        """Session records seen lately; they never change once written."""
        self._history = HistoryCache()
        """Active histories, kept in step by every write that goes through a Tx."""
        self._clears: dict[str, int] = {}
        """Session → its context clears and deletions in this process (`clears`); an owner's
        action, a few a day: not bounded (a count forgotten would fail a turn's fence)."""
        self._ledger: list[tuple[Any, ...]] = []
        """Usage rows not written yet (`record_usage`)."""
        self._sent: dict[str, int] = {}
        """Sessions whose reply up to this message id went out, the `sent` mark not written yet
        (`mark_sent`)."""
        self._ledger_timer: asyncio.TimerHandle | None = None
        self._ledger_task: asyncio.Task[None] | None = None

    @property
    def location(self) -> Location:
        return self._location

    @property
    def path(self) -> Path:
        """The SQLite file (a PostgreSQL store has none)."""
        if not isinstance(self._location, Path):
            raise StoreError(f"{describe(self._location)} is not a file")
        return self._location

    def __str__(self) -> str:
        """Where the store lives, for logs: a URL without its password."""
        return describe(self._location)

    @property
    def shared(self) -> bool:
        """Other processes write the same memory (PostgreSQL): what this process remembers
        of a session (back-off, latest usage, settings) must be read again, not reused."""
        return is_url(self._location)

    def _refuse_nested(self) -> None:
        if self._owner is not None and self._owner is asyncio.current_task():
            raise StoreError(
                "Store method called inside store.transaction(): it would wait for its own lock;"
                " call the method on the Tx instead"
            )

    async def open(self) -> None:
        """Connect and migrate the schema; a no-op when already open."""
        self._refuse_nested()
        async with self._lock:
            if self._db is not None:
                return
            if isinstance(self._location, Path):
                try:
                    await asyncio.to_thread(self._location.parent.mkdir, parents=True, exist_ok=True)
                except OSError as err:
                    raise StoreError(f"cannot create the folder of {self._location}: {err}") from err
            self._db = await connect(self._location)
            if not self.shared:  # what the history cache matches: `history_in`
                self._history.data_version = await Tx(self._db).data_version()

    async def close(self) -> None:
        """Wait for the running transaction, then close; a no-op when not open."""
        self._refuse_nested()
        async with self._lock:
            if self._ledger_timer is not None:
                self._ledger_timer.cancel()
                self._ledger_timer = None
            if self._db is not None and (self._ledger or self._sent):
                await self._write_batched(Tx(self._db, self._ledger))  # never lost on shutdown
            db, self._db = self._db, None
            if db is None:
                return
            self._history = HistoryCache()
            await db.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """One write transaction: COMMIT on exit, ROLLBACK on any exception, then re-raise.

        Cancellation rolls back too. A cancellation that arrives while COMMIT is
        already running cannot undo it: the commit completes and CancelledError
        still propagates.
        """
        async with self._held() as db:
            tx = Tx(db, self._ledger)
            committed = False
            try:
                await db.begin()
                yield tx
                tx._end()
                await db.commit()
                committed = True
            except BaseException:
                tx._end()
                # The single worker thread runs queued statements in order, so this
                # ROLLBACK lands after whatever a cancelled await had already queued.
                await db.rollback()
                raise
            finally:
                # Not known to be committed (a COMMIT interrupted by cancellation may still
                # land): the next read of a session this wrote comes from the database.
                self._forget(tx, applied=committed)

    @contextlib.asynccontextmanager
    async def exclusive(self, session_id: str) -> AsyncIterator[bool]:
        """While inside, no other process holds the session (one compression per session
        across processes): yields False when another one does. Freed on exit, or when this
        process dies. Not behind the store's lock: other calls go on meanwhile."""
        db = self._db
        if db is None:
            raise StoreError("store is not open")
        async with db.exclusive(f"memsum:{session_id}") as got:
            yield got

    @contextlib.asynccontextmanager
    async def _statement(self) -> AsyncIterator[Tx]:
        """One statement behind the lock, outside any explicit transaction.

        In autocommit mode a lone statement is atomic and durable on its own (a write
        commits as it ends); the lock keeps it from seeing or joining another
        coroutine's open transaction on the shared connection. Skipping BEGIN and
        COMMIT saves two trips to the database thread on the per-message path.
        """
        async with self._held() as db:
            tx = Tx(db, self._ledger)
            applied = False
            try:
                yield tx
                applied = True
            finally:
                tx._end()
                self._forget(tx, applied=applied)

    def _forget(self, tx: Tx, *, applied: bool) -> None:
        """Bring the history cache in step with what `tx` wrote.

        `applied`: its appends are durable (a lone statement that completed), so a
        cached history is extended with them; else their sessions are dropped.
        """
        for session_id, msg in tx._appended:
            if applied:
                self._history.append(session_id, msg)  # its write counter: one more
            else:
                self._history.drop(session_id)
        for session_id, text, platform_id in tx._named_answers:
            if applied:
                self._history.name(session_id, text, platform_id)
            else:
                self._history.drop(session_id)
        for session_id in tx._touched:
            self._history.drop(session_id)
        for session_id in tx._cleared:  # counted even when not known committed: a write waits
            self._clears[session_id] = self._clears.get(session_id, 0) + 1

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[Db]:
        """The open connection, behind the one lock, owned by the calling task."""
        self._refuse_nested()
        async with self._lock:
            db = self._db
            if db is None:
                raise StoreError("store is not open")
            self._owner = asyncio.current_task()
            try:
                await db.ready()
                yield db
            finally:
                self._owner = None

    async def save_session(self, rec: SessionRecord) -> SessionRecord:
        # Records are never changed once written (the first write wins), so a known
        # one needs no write: recording a message costs one transaction, not two.
        known = self._sessions.get(rec.id)
        if known is not None:
            if self.shared:  # another process may have deleted it since: then it is written again
                async with self._statement() as tx:
                    await tx.insert_session(known)  # as this process knows it
            return known
        async with self.transaction() as tx:
            stored = await tx.save_session(rec)
        self._sessions[rec.id] = stored
        return stored

    async def get_session(self, session_id: str) -> SessionRecord | None:
        known = self._sessions.get(session_id)
        if known is not None and not self.shared:  # shared: another process may have deleted it
            return known
        async with self._statement() as tx:
            stored = await tx.get_session(session_id)
        if stored is not None:
            self._sessions[session_id] = stored
        else:
            self._sessions.pop(session_id, None)
        return stored

    async def append(self, session_id: str, msg: Message, fence: int | None = None) -> Message:
        """`fence`: the session's `clears` count its writer read the history under; when a
        clear came since, nothing is stored (ClearedMeanwhile)."""
        async with self._statement() as tx:
            self._check_fence(session_id, fence)
            return await tx.append(session_id, msg)

    def clears(self, session_id: str) -> int:
        """How many times this process cleared the session's context or deleted it: counted
        as each commits, while the store is still held, so a write that waited behind one
        sees it (R-MEM-2: a turn stores nothing it made from the history before a clear)."""
        return self._clears.get(session_id, 0)

    def _check_fence(self, session_id: str, fence: int | None) -> None:
        if fence is not None and fence != self._clears.get(session_id, 0):
            raise ClearedMeanwhile(session_id)

    async def get_history(self, session_id: str, limit: float = math.inf) -> list[Message]:
        """From the history cache when the session is in it; a whole read fills it."""
        async with self._statement() as tx:
            return await self._cached_history(tx, session_id, limit)

    async def history_in(self, tx: Tx, session_id: str) -> list[Message]:
        """The whole active history as the database holds it, inside `tx`: from the history
        cache unless `tx` wrote the session or another connection wrote to the file since
        the cache was filled (R-RUN-11's re-read at a compression's commit, without
        decoding thousands of rows again)."""
        await tx._live().hold(session_id)  # PostgreSQL: no other process writes it until COMMIT
        if session_id in tx._touched or any(s == session_id for s, *_ in (*tx._appended, *tx._named_answers)):
            return await tx.get_history(session_id)
        if not self.shared:  # PostgreSQL: the session's own write counter tells
            version = await tx.data_version()
            if version != self._history.data_version:
                self._history.clear()
                self._history.data_version = version
        return await self._cached_history(tx, session_id, math.inf)

    async def _cached_history(self, tx: Tx, session_id: str, limit: float) -> list[Message]:
        cached = self._history.get(session_id)
        version = 0
        if self.shared:  # another process may have written it: one read to know
            version = await tx.version(session_id)
            if cached is not None and self._history.version(session_id) != version:
                cached = None
        if cached is None:
            if limit != math.inf:
                return await tx.get_history(session_id, limit)
            # The counter read first: a write in between makes the next check reload.
            cached = await tx.get_history(session_id)
            self._history.put(session_id, cached, version)
        n = _sql_limit(limit)
        return cached[-n:] if 0 < n < len(cached) else list(cached) if n else []

    async def first_active(self, session_id: str, limit: int) -> list[Message]:
        async with self._statement() as tx:
            return await tx.first_active(session_id, limit)

    async def count_active(self, session_id: str) -> int:
        async with self._statement() as tx:
            return await tx.count_active(session_id)

    async def archive_span(self, session_id: str, count: int, keep: Collection[int] = ()) -> int:
        async with self.transaction() as tx:
            return await tx.archive_span(session_id, count, keep)

    async def get_archived(self, session_id: str, limit: float = math.inf) -> list[Message]:
        async with self._statement() as tx:
            return await tx.get_archived(session_id, limit)

    async def get_meta(self, namespace: str, key: str) -> Any | None:
        async with self._statement() as tx:
            return await tx.get_meta(namespace, key)

    async def put_meta(self, namespace: str, key: str, value: Any) -> None:
        async with self._statement() as tx:
            await tx.put_meta(namespace, key, value)

    async def meta_values(self, namespace: str) -> dict[str, Any]:
        async with self._statement() as tx:
            return await tx.meta_values(namespace)

    async def delete_meta(self, namespace: str, key: str) -> None:
        async with self._statement() as tx:
            await tx.delete_meta(namespace, key)

    async def list_meta(self, namespace: str) -> dict[str, Any]:
        async with self._statement() as tx:
            return await tx.list_meta(namespace)

    async def clear(self, session_id: str, kind: ClearKind) -> None:
        async with self.transaction() as tx:
            await tx.clear(session_id, kind)

    async def delete_session(self, session_id: str) -> None:
        """One transaction: the session and everything it stored, gone (see Tx.delete_session)."""
        async with self.transaction() as tx:
            await tx.delete_session(session_id)
        self._sessions.pop(session_id, None)

    async def search(self, query: SearchQuery, context: int = 0) -> list[SearchHit]:
        while await self.index_search(new_only=True) is not None:
            pass  # what was stored since the last batch is searchable too
        async with self._statement() as tx:
            return await tx.search(query, context)

    async def search_state(self) -> search.IndexState:
        async with self._statement() as tx:
            db = tx._live()
            # PostgreSQL indexes each message as it is stored: nothing ever waits.
            if not isinstance(db, SqliteDb):
                return search.IndexState(0, 0, 0)
            return await search.state(await db.raw())

    async def index_search(self, batch: int = 2000, *, new_only: bool = False) -> search.IndexState | None:
        """Index the next batch of messages the search index does not hold yet (new ones
        first, then those of a file from before the index); None when nothing waits. Terms
        are cut off the event loop and outside the lock; the write re-checks clears that
        happened meanwhile."""
        async with self._statement() as tx:
            db = tx._live()
            if not isinstance(db, SqliteDb):
                return None
            found = await search.next_batch(await db.raw(), batch, new_only=new_only)
        if found is None:
            return None
        docs = await asyncio.to_thread(search.documents, found.rows)
        async with self.transaction() as tx:
            db = tx._live()
            assert isinstance(db, SqliteDb)
            return await search.commit_batch(await db.raw(), found, docs)

    async def get_settings(self, scope: str, scope_key: str) -> dict[str, Any]:
        async with self._statement() as tx:
            return await tx.get_settings(scope, scope_key)

    async def set_setting(self, scope: str, scope_key: str, name: str, value: Any) -> None:
        async with self._statement() as tx:
            await tx.set_setting(scope, scope_key, name, value)

    async def delete_setting(self, scope: str, scope_key: str, name: str) -> None:
        async with self._statement() as tx:
            await tx.delete_setting(scope, scope_key, name)

    async def append_once(self, session_id: str, msg: Message) -> Message | None:
        async with self._statement() as tx:
            return await tx.append_once(session_id, msg)

    async def by_platform_id(self, session_id: str, platform_id: str) -> Message | None:
        async with self._statement() as tx:
            return await tx.by_platform_id(session_id, platform_id)

    async def name_answer(self, session_id: str, text: str, platform_id: str) -> None:
        async with self._statement() as tx:
            await tx.name_answer(session_id, text, platform_id)

    async def mark_withdrawn(self, session_id: str, platform_id: str, mask: RecallMask | None = None) -> None:
        async with self.transaction() as tx:
            await tx.mark_withdrawn(session_id, platform_id, mask)

    async def mark_unsent(self, session_id: str, msg_id: int) -> None:
        async with self._statement() as tx:
            await tx.mark_unsent(session_id, msg_id)

    async def session_of_platform_id(self, prefix: str, platform_id: str) -> str | None:
        async with self._statement() as tx:
            return await tx.session_of_platform_id(prefix, platform_id)

    async def mark_refused(self, session_id: str, ids: Sequence[int]) -> None:
        async with self.transaction() as tx:
            await tx.mark_refused(session_id, ids)

    async def stored_platform_ids(self, session_id: str, said: Mapping[str, float]) -> set[str]:
        async with self._statement() as tx:
            return await tx.stored_platform_ids(session_id, said)

    async def recent_sessions(self, prefix: str, since: float) -> list[tuple[str, float]]:
        async with self._statement() as tx:
            return await tx.recent_sessions(prefix, since)

    async def pending_questions(self, since: float, prefix: str = "") -> list[tuple[str, Message]]:
        async with self._statement() as tx:
            return await tx.pending_questions(since, prefix)

    async def questions_withdrawn(self, session_id: str, upto: int | None = None) -> bool:
        async with self._statement() as tx:
            return await tx.questions_withdrawn(session_id, upto)

    async def answered_upto(self, session_id: str) -> int:
        async with self._statement() as tx:
            return await tx.answered_upto(session_id)

    async def mark_reply(self, session_id: str, upto: int, state: ReplyState) -> None:
        async with self._statement() as tx:
            await tx.mark_reply(session_id, upto, state)

    async def append_marking(
        self, session_id: str, msg: Message, upto: int, state: ReplyState, fence: int | None = None
    ) -> Message:
        """A turn's answer and the mark that it answers the questions up to `upto`, committed
        together: on SQLite one trip to the database thread, not two (a transaction's INSERT
        and then its COMMIT). `fence`: as `append`'s."""
        async with self._statement() as tx:
            self._check_fence(session_id, fence)
            return await tx.append_marking(session_id, msg, upto, state)

    def mark_sent(self, session_id: str, upto: int) -> None:
        """The reply to the questions up to `upto` went out: its `sent` mark is written with
        the usage rows, within LEDGER_DELAY seconds (or at close), not in a trip of its own.
        A crash before that leaves it `sending`, as a crash during the send would: reported
        at the next start, never sent again."""
        self._sent[session_id] = max(upto, self._sent.get(session_id, 0))
        self._write_soon()

    async def replies_being_sent(self) -> list[tuple[str, int]]:
        """(session id, upto) of the replies marked `sending` and never `sent`: a crash came
        between the mark and the send's end; they are not sent again."""
        await self.flush_ledger()
        async with self._statement() as tx:
            rows = await tx._fetch("SELECT session_id, upto FROM replies WHERE state = 'sending'")
        return [(r[0], int(r[1])) for r in rows]

    async def record_usage(
        self,
        session_id: str | None,
        purpose: str,
        model: str,
        tokens_in: int,
        tokens_out: int,
        tokens_cached: int = 0,
    ) -> None:
        """Kept in memory and written with the others within LEDGER_DELAY seconds (or before
        any query of the ledger, or at close): a model call costs no trip to the database.
        A crash (not a shutdown) can lose the last second's rows."""
        self._ledger.append((session_id, purpose, model, tokens_in, tokens_out, tokens_cached, clock.now()))
        self._write_soon()

    def _write_soon(self) -> None:
        if self._ledger_timer is None:
            self._ledger_timer = asyncio.get_running_loop().call_later(LEDGER_DELAY, self._flush_ledger_soon)

    def _flush_ledger_soon(self) -> None:
        self._ledger_timer = None
        self._ledger_task = asyncio.ensure_future(self.flush_ledger())

    async def _write_batched(self, tx: Tx) -> None:
        if self._sent:
            sent, self._sent = self._sent, {}
            try:
                # Only the mark it was for: a newer reply of the session may be `sending` now.
                await tx._live().executemany(
                    "UPDATE replies SET state = 'sent' WHERE session_id = ? AND upto = ?", list(sent.items())
                )
            except StoreError:
                self._sent = sent | self._sent  # kept for the next attempt
                raise
        if self._ledger:
            await tx.write_ledger()

    async def flush_ledger(self) -> None:
        """Write the usage rows and `sent` marks waiting in memory now."""
        if not (self._ledger or self._sent) or self._db is None:
            return
        try:
            async with self._statement() as tx:
                await self._write_batched(tx)
        except StoreError as err:
            # Kept for the next flush or the close; the ledger is bookkeeping, never a turn's failure.
            logger.warning(f"memsum: writing the usage ledger failed: {err}")

    async def usage_totals(self, session_id: str) -> dict[str, tuple[int, int]]:
        async with self._statement() as tx:
            return await tx.usage_totals(session_id)

    async def usage_rows(self, place: str | None, since: float | None) -> list[UsageRow]:
        async with self._statement() as tx:
            return await tx.usage_rows(place, since)

    async def record_compression(self, run: CompressionRecord) -> None:
        async with self._statement() as tx:
            await tx.record_compression(run)

    async def compressions(self, session_id: str, limit: int = 200) -> list[CompressionRecord]:
        async with self._statement() as tx:
            return await tx.compressions(session_id, limit)

    async def last_compressions(self) -> dict[str, CompressionRecord]:
        async with self._statement() as tx:
            return await tx.last_compressions()

    async def session_overview(self, usage_purpose: str) -> list[SessionActivity]:
        # One transaction: the counts, times and usage are of one moment.
        async with self.transaction() as tx:
            return await tx.session_overview(usage_purpose)

    async def all_settings(self) -> dict[tuple[str, str], dict[str, Any]]:
        async with self._statement() as tx:
            return await tx.all_settings()

    async def usage_by_day(
        self,
        since: float = 0.0,
        session_id: str | None = None,
        utc_offset: int = 0,
        until: float | None = None,
    ) -> list[DailyUsage]:
        async with self._statement() as tx:
            return await tx.usage_by_day(since, session_id, utc_offset, until)

    async def usage_series(self, session_id: str, purpose: str, limit: int = 500) -> list[tuple[float, int]]:
        async with self._statement() as tx:
            return await tx.usage_series(session_id, purpose, limit)

    async def activity(self, place: str, since: float | None, divider: str) -> Activity:
        async with self._statement() as tx:
            return await tx.activity(place, since, divider)


__all__ = [
    "SUMMARY_NAMESPACE",
    "Activity",
    "ClearKind",
    "ReplyState",
    "Store",
    "StoreError",
    "Tx",
    "UsageRow",
]
