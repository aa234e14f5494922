"""Moving a SQLite memory into PostgreSQL: copy every table, then verify it (the tool is
`python -m nonebot_plugin_memsum.migrate`; this module holds its SQL).

Both sides are opened as the store opens them, so both are migrated to the same schema
version first (one version number means one schema on both engines, store/postgres.py).
Every row keeps its key (message, ledger and compression ids too, so the cleared-search
watermarks, the reply marks and the order of the history stay true), then the identity
sequences are moved past the copied ids so the next message a bot stores gets a larger one.

Rerun-safe: a table is read in key order in chunks from both sides and only the rows
the target lacks or holds differently are written, each chunk in one transaction; so a
second run writes nothing, and a run interrupted midway (killed, server gone) leaves
whole chunks and is finished by the next. Rows that never change once written (a
message's speaker, text and time; ledger and compression rows; session records) found
different in the target mean it holds another memory: the tool stops before writing
that chunk. `message_counts` is not copied: PostgreSQL's trigger counts the messages as
they arrive, and the verification compares it. The recall index is rebuilt from the
messages in the same transaction as they are copied (PostgreSQL's tsvector documents,
store/pg_search.py), leaving out what a clear of the context took out of search.

Verification reads both sides again, in one read transaction of the SQLite file, and
compares per table the row count and a SHA-256 over the rows in key order.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import pg_search, search
from .engine import Db, PostgresDb, Row, SqliteDb, no_nul

CHUNK = 5000
"""Rows per chunk of an id-keyed table by default: one transaction of the target each."""


@dataclass(frozen=True)
class Table:
    name: str
    key: tuple[str, ...]
    columns: tuple[str, ...]
    """Key first."""
    fixed: tuple[str, ...] = ()
    """Columns a row never changes once written: a difference there is another memory."""
    where: str = ""
    numbered: bool = False
    """Keyed by an integer id: read in chunks, in id order on both engines."""

    def select(self) -> str:
        return f"SELECT {', '.join(self.columns)} FROM {self.name}{self.where}"


_MESSAGE_COLUMNS = (
    "id",
    "session_id",
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "ts",
    "metadata",
    "event_marker",
    "archived",
    "tokens",
    "platform_id",
    "addressed",
    "withdrawn",
)
# Copied in this order: the clear watermarks before the messages they keep out of search.
TABLES = (
    Table(
        "sessions",
        ("id",),
        ("id", "platform", "kind", "place", "peer", "parent", "room_class", "created"),
        fixed=("id", "platform", "kind", "place", "peer", "parent", "room_class", "created"),
    ),
    Table("settings", ("scope", "scope_key", "name"), ("scope", "scope_key", "name", "value")),
    Table("metadata", ("namespace", "key"), ("namespace", "key", "value")),
    Table("replies", ("session_id",), ("session_id", "upto", "state", "ts")),
    Table("search_cleared", ("session_id",), ("session_id", "upto")),
    Table(
        "messages",
        ("id",),
        _MESSAGE_COLUMNS,
        fixed=("id", "session_id", "role", "content", "ts"),
        numbered=True,
    ),
    Table(
        "ledger",
        ("id",),
        ("id", "session_id", "purpose", "model", "tokens_in", "tokens_out", "tokens_cached", "ts"),
        fixed=("id", "session_id", "purpose", "model", "tokens_in", "tokens_out", "tokens_cached", "ts"),
        numbered=True,
    ),
    Table(
        "compressions",
        ("id",),
        (
            "id",
            "session_id",
            "ts",
            "outcome",
            "reason",
            "tokens_before",
            "tokens_after",
            "kept",
            "archived",
            "requests",
            "line",
        ),
        fixed=("id", "session_id", "ts", "outcome"),
        numbered=True,
    ),
)
COUNTS = Table(
    "message_counts",
    ("session_id",),
    ("session_id", "active", "archived", "newest_ts"),
    where=" WHERE active + archived > 0",  # a deleted session's row stays behind at zero
)
"""Derived from the messages on both engines: verified, not copied."""
SEQUENCES = ("messages", "ledger", "compressions")


class MigrateError(Exception):
    """The target holds another memory, or the copy does not verify."""


@dataclass
class TableReport:
    name: str
    rows: int = 0
    """Rows in the source."""
    copied: int = 0
    """Rows written to the target by this run (missing or different there)."""
    verified: bool | None = None
    problem: str = ""


@dataclass
class Report:
    tables: list[TableReport]

    @property
    def verified(self) -> bool:
        return all(t.verified for t in self.tables)

    def lines(self) -> list[str]:
        out = [f"{'table':<16}{'rows':>12}{'copied':>12}  check"]
        for t in self.tables:
            check = "ok" if t.verified else f"MISMATCH: {t.problem}" if t.verified is False else "-"
            out.append(f"{t.name:<16}{t.rows:>12,}{t.copied:>12,}  {check}")
        return out


Progress = Callable[[str], None]


def _as_stored(rows: Sequence[Row]) -> list[Row]:
    """The file's rows as PostgreSQL stores them: a NUL in a text becomes U+FFFD there, as the
    store writes it (engine.no_nul), so such a row is copied once and verifies."""
    return [tuple(no_nul(row)) for row in rows]


def _checksum(rows: Sequence[Row], digest: Any) -> None:
    for row in rows:
        # repr: ints, exact floats, str and None read the same from both engines.
        digest.update(repr(tuple(row)).encode())
        digest.update(b"\n")


def _upsert(table: Table) -> str:
    cols = ", ".join(table.columns)
    marks = ", ".join("?" * len(table.columns))
    rest = [c for c in table.columns if c not in table.key]
    action = "DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in rest) if rest else "DO NOTHING"
    return f"INSERT INTO {table.name} ({cols}) VALUES ({marks}) ON CONFLICT ({', '.join(table.key)}) {action}"


def _foreign(table: Table, mine: Row, theirs: Row) -> bool:
    """The target's row differs where rows never change: it is not a copy of ours."""
    idx = [table.columns.index(c) for c in table.fixed]
    return [mine[i] for i in idx] != [theirs[i] for i in idx]


def _search_docs(rows: Sequence[Row], cleared: dict[str, int]) -> list[tuple[int, str]]:
    """(id, tsvector literal) of the messages recall finds: indexable and not cleared."""
    docs = []
    for msg_id, sid, role, content, name, _calls, _cid, ts, meta, marker, *_ in rows:
        if msg_id > cleared.get(sid, 0) and search.indexable(role, marker, content):
            docs.append(
                (msg_id, pg_search.document(sid, role, name, search.indexed_content(content, meta), ts))
            )
    return docs


async def _copy_rows(
    target: Db, table: Table, mine: Sequence[Row], theirs: Sequence[Row], cleared: dict[str, int]
) -> int:
    """Write what the target lacks or holds differently, in one transaction; how many."""
    n = len(table.key)
    have = {tuple(r[:n]): r for r in theirs}
    todo = []
    for row in mine:
        other = have.get(tuple(row[:n]))
        if other is None or tuple(other) != tuple(row):
            if other is not None and _foreign(table, row, other):
                raise MigrateError(
                    f"the target's {table.name} row {row[:n]} differs from the file's: it holds"
                    " another memory; migrate into an empty database"
                )
            todo.append(row)
    index: list[tuple[int, str]] = []
    stale: set[int] = set()
    if table.name == "messages":
        wanted = await asyncio.to_thread(_search_docs, mine, cleared)
        lo, hi = mine[0][0], mine[-1][0]
        present = {
            r[0]
            for r in await target.fetch("SELECT id FROM search_index WHERE id >= ? AND id <= ?", (lo, hi))
        }
        changed = {r[0] for r in todo}
        index = [d for d in wanted if d[0] not in present or d[0] in changed]
        stale = present - {d[0] for d in wanted}
    if not todo and not index and not stale:
        return 0
    await target.begin()
    try:
        await target.executemany(_upsert(table), todo)
        if table.name == "messages":
            await target.executemany("DELETE FROM search_index WHERE id = ?", [(i,) for i in stale])
            await target.executemany(
                pg_search.INSERT + " ON CONFLICT (id) DO UPDATE SET doc = excluded.doc", index
            )
        await target.commit()
    except BaseException:
        await target.rollback()
        raise
    return len(todo)


async def _copy_table(
    source: Db, target: Db, table: Table, cleared: dict[str, int], chunk: int
) -> TableReport:
    report = TableReport(table.name)
    if not table.numbered:
        mine = sorted(_as_stored(await source.fetch(table.select())))
        theirs = await target.fetch(table.select())
        report.rows = len(mine)
        report.copied = await _copy_rows(target, table, mine, theirs, cleared)
        return report
    after = 0
    while True:
        mine = _as_stored(
            await source.fetch(f"{table.select()} WHERE id > ? ORDER BY id LIMIT ?", (after, chunk))
        )
        if not mine:
            return report
        last = mine[-1][0]
        theirs = await target.fetch(f"{table.select()} WHERE id > ? AND id <= ?", (after, last))
        report.rows += len(mine)
        report.copied += await _copy_rows(target, table, mine, theirs, cleared)
        after = last


async def _digest(db: Db, table: Table) -> tuple[int, str]:
    """Rows and the SHA-256 of the table in key order."""
    digest = hashlib.sha256()
    if not table.numbered:
        rows = sorted(_as_stored(await db.fetch(table.select())))
        _checksum(rows, digest)
        return len(rows), digest.hexdigest()
    count, after = 0, 0
    while True:
        rows = await db.fetch(f"{table.select()} WHERE id > ? ORDER BY id LIMIT ?", (after, CHUNK * 4))
        if not rows:
            return count, digest.hexdigest()
        _checksum(_as_stored(rows), digest)
        count += len(rows)
        after = rows[-1][0]


async def _expected_index(source: Db, cleared: dict[str, int]) -> tuple[int, str]:
    """The ids recall must find on the target: every indexable message not cleared."""
    digest = hashlib.sha256()
    count, after = 0, 0
    while True:
        rows = await source.fetch(
            f"SELECT {', '.join(_MESSAGE_COLUMNS)} FROM messages WHERE id > ? ORDER BY id LIMIT ?",
            (after, CHUNK * 4),
        )
        if not rows:
            return count, digest.hexdigest()
        ids = [(r[0],) for r in rows if r[0] > cleared.get(r[1], 0) and search.indexable(r[2], r[9], r[3])]
        _checksum(ids, digest)
        count += len(ids)
        after = rows[-1][0]


async def _verify(source: Db, target: Db, reports: list[TableReport], cleared: dict[str, int]) -> None:
    by_name = {r.name: r for r in reports}
    for table in (*TABLES, COUNTS):
        report = by_name.setdefault(table.name, TableReport(table.name))
        if table is COUNTS:
            reports.append(report)
        (rows, mine), (theirs_rows, theirs) = await _digest(source, table), await _digest(target, table)
        report.rows = rows
        report.verified = rows == theirs_rows and mine == theirs
        if rows != theirs_rows:
            report.problem = f"{theirs_rows:,} rows in the target"
        elif mine != theirs:
            report.problem = "same count, different rows"
    report = TableReport("search_index")
    reports.append(report)
    rows, mine = await _expected_index(source, cleared)
    theirs_rows, theirs = await _digest(target, Table("search_index", ("id",), ("id",), numbered=True))
    report.rows = rows
    report.verified = rows == theirs_rows and mine == theirs
    if not report.verified:
        report.problem = f"{theirs_rows:,} messages indexed in the target"


async def _advance_sequences(target: Db) -> None:
    """Identity columns do not move when ids are given: the next id a bot takes must be
    past every copied one."""
    for name in SEQUENCES:
        await target.fetch(
            f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), COALESCE(MAX(id), 0) + 1, false)"
            f" FROM {name}"
        )


async def migrate(
    source_path: Path, target_url: str, progress: Progress | None = None, chunk: int = CHUNK
) -> Report:
    """Copy the SQLite file at `source_path` into the PostgreSQL database at `target_url`, then
    verify; StoreError when either cannot be opened, MigrateError when the target holds
    another memory. The report says per table what was copied and whether it verified."""
    say = progress or (lambda _: None)
    source = await SqliteDb.connect(source_path, writes=False)  # a read-only backup will do
    try:
        target = await PostgresDb.connect(target_url)
        try:
            return await _run(source, target, say, chunk)
        finally:
            await target.close()
    finally:
        await source.close()


async def _refuse_moved_on(source: Db, target: Db) -> None:
    """A target holding ids past the file's was written by a bot since the copy: copying the
    file's rows again would undo its work (archived messages active again, an old summary
    back), so nothing is written."""
    for name in SEQUENCES:
        mine = (await source.fetch(f"SELECT COALESCE(MAX(id), 0) FROM {name}"))[0][0]
        theirs = (await target.fetch(f"SELECT COALESCE(MAX(id), 0) FROM {name}"))[0][0]
        if theirs > mine:
            raise MigrateError(
                f"the target's {name} go past the file's (id {theirs} > {mine}): a bot has written"
                " it since the copy; nothing was written (migrate into an empty database)"
            )


async def _run(source: SqliteDb, target: PostgresDb, say: Progress, chunk: int) -> Report:
    reports: list[TableReport] = []
    # One read transaction of the file: every table read from one moment of it.
    await source.fetch("BEGIN")
    try:
        cleared = {
            sid: int(upto) for sid, upto in await source.fetch("SELECT session_id, upto FROM search_cleared")
        }
        await _refuse_moved_on(source, target)
        for table in TABLES:
            say(f"copying {table.name}")
            reports.append(await _copy_table(source, target, table, cleared, chunk))
        await _advance_sequences(target)
        say("verifying")
        await _verify(source, target, reports, cleared)
    finally:
        await source.fetch("COMMIT")
    return Report(reports)
