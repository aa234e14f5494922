"""R-RUN-11 atomicity and issue 15 under SIGKILL: workers that record, backfill, answer and
compress in a loop are killed at random moments (during turns, reply sends, backfills and
compressions), again and again, on the same database file; each start resumes what the
last one left, as the bot's start-up does.

Two workers share the file (sessions of their own), each killed and restarted in turn,
so a kill also lands while the other process holds or waits for the write lock. The same
runs on a PostgreSQL database (issue 13; a real server, tests/fakes/pgserver.py), where a
kill also lands inside a transaction the server must roll back and while a compression
holds its session's advisory lock. After every kill, and at the end:
- SQLite: `PRAGMA integrity_check` is ok;
- no message is lost: every message a worker reported as appended (it reports after the
  commit) is stored exactly once, active or archived, and no platform message id twice in
  a session (a backfill fetches what is stored again);
- no question is answered twice: the replies of a session (reported from inside the reply
  function, after the mark) cover strictly increasing message ranges; after a last start
  every question is covered by its session's reply mark;
- every session is in an old or a new state, never a mixture: without a summary nothing is
  archived and no divider exists; with one, exactly one active divider, whose timestamp is
  the summary's time (both written in one commit), every archived message is older than
  it, and the active conversation before it is exactly the summary's kept originals.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import pytest

from nonebot_plugin_memsum.store.engine import _numbered

WORKER = Path(__file__).parent / "fakes" / "crash_worker.py"
REPO = Path(__file__).resolve().parents[1]
DIVIDER = "对话已压缩"
KILLS_PER_WORKER = 16
WORKERS = 2
AWAITED = (("compressed", 1), ("sent", 1), ("appended", 10))
"""What each start waits to see reported before its SIGKILL, in turn: a kill comes after
real work whatever the machine's load, so the counts asserted at the end follow from
the kills themselves, not from a wall-clock budget."""
DELAY = (0.0, 0.3)
"""Seconds after that: the kill lands anywhere in what the worker does next."""
PROGRESS = 120.0
"""Seconds a worker may go without reporting anything new before it counts as stuck."""


@dataclass
class Reports:
    """What the workers said has committed, shared by the threads that drive them."""

    appended: dict[str, str] = field(default_factory=dict)
    """content → session id"""
    compressions: int = 0
    sent: dict[str, list[int]] = field(default_factory=dict)
    """session id → the `upto` of each reply, in the order sent"""
    failures: list[str] = field(default_factory=list)
    """Compressions that failed: none should (each session works in order)."""
    kills: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, lines: list[str]) -> None:
        with self.lock:
            for line in lines:
                kind, _, rest = line.partition(" ")
                if kind == "appended":
                    sid, _, content = rest.partition(" ")
                    assert content not in self.appended, f"a worker reused the content {content!r}"
                    self.appended[content] = sid
                elif kind == "compressed":
                    self.compressions += 1
                elif kind == "sent":
                    sid, _, upto = rest.partition(" ")
                    self.sent.setdefault(sid, []).append(int(upto))
                elif kind == "failed":
                    self.failures.append(rest)

    def snapshot(self) -> dict[str, str]:
        with self.lock:
            return dict(self.appended)


class Worker:
    """One worker process; its stdout lines are collected by a thread until EOF."""

    def __init__(self, db: Path | str, slot: int, log: Path, *mode: str) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._changed = threading.Condition()
        self._ended = False
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(db), str(slot), *mode],
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=REPO,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode().rstrip("\n")
            if line == "ready":
                self.ready.set()
            else:
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        self.ready.set()  # EOF: it will not become ready any more
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def reported(self, kind: str, count: int) -> bool:
        """Wait until the worker has reported `count` lines of `kind`; False if it ended
        first or reported nothing new for PROGRESS seconds."""
        with self._changed:
            while (seen := sum(line.startswith(kind + " ") for line in self.lines)) < count:
                before = len(self.lines)
                if self._ended or not self._changed.wait_for(
                    lambda: self._ended or len(self.lines) > before, PROGRESS
                ):
                    return False
            return seen >= count

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)


def log_tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:])


def lineage(db: Path | str, slot: int, log: Path, reports: Reports, seed: int) -> None:
    """Start, kill at a random moment, check; again and again on the same file."""
    rng = random.Random(seed)
    for n in range(KILLS_PER_WORKER):
        worker = Worker(db, slot, log)
        try:
            started = worker.ready.wait(PROGRESS) and worker.proc.poll() is None
            assert started, f"worker {slot} did not start:\n{log_tail(log)}"
            kind, count = AWAITED[n % len(AWAITED)]
            assert worker.reported(kind, count), f"worker {slot} never reported {kind}:\n{log_tail(log)}"
            time.sleep(rng.uniform(*DELAY))
            assert worker.proc.poll() is None, f"worker {slot} died on its own:\n{log_tail(log)}"
        finally:
            worker.kill()
        assert worker.proc.returncode == -signal.SIGKILL
        reports.take(worker.lines)
        with reports.lock:
            reports.kills += 1
        check(db, reports.snapshot())
    # A last start answers what the last kill left unanswered, and stops.
    worker = Worker(db, slot, log, "settle")
    try:
        assert worker.proc.wait(120) == 0, f"worker {slot} did not settle:\n{log_tail(log)}"
    finally:
        worker.kill()
    reports.take(worker.lines)


class Reader(Protocol):
    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...


class _SqliteReader:
    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, params).fetchall()


class _PgReader:
    """A connection of its own on an event loop of this thread (the checks run in threads)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, con: asyncpg.Connection) -> None:
        self.loop, self.con = loop, con

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.loop.run_until_complete(self.con.fetch(_numbered(sql), *params))]


@contextlib.contextmanager
def reading(db: Path | str) -> Iterator[Reader]:
    """One snapshot for the whole check, though the other worker writes."""
    if isinstance(db, str):
        loop = asyncio.new_event_loop()
        try:
            pg = loop.run_until_complete(asyncpg.connect(db))
            try:
                loop.run_until_complete(pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"))
                yield _PgReader(loop, pg)
            finally:
                loop.run_until_complete(pg.close())
        finally:
            loop.close()
        return
    con = sqlite3.connect(db, timeout=10)
    try:
        con.execute("BEGIN")
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        yield _SqliteReader(con)
    finally:
        con.close()


def check(db: Path | str, appended: dict[str, str]) -> None:
    with reading(db) as con:
        stored: dict[str, int] = {}
        for (content,) in con.rows("SELECT content FROM messages"):
            stored[content] = stored.get(content, 0) + 1
        lost = [c for c in appended if stored.get(c) != 1]
        assert not lost, f"{len(lost)} reported messages missing or duplicated, e.g. {lost[:3]}"
        # In order: a session's messages were reported in the order they committed.
        ids = dict(con.rows("SELECT content, id FROM messages"))
        for sid in set(appended.values()):
            order = [ids[c] for c, s in appended.items() if s == sid]
            assert order == sorted(order), f"{sid}: messages stored out of the order they were said"
        twice = con.rows(
            "SELECT session_id, platform_id FROM messages WHERE platform_id IS NOT NULL"
            " GROUP BY session_id, platform_id HAVING COUNT(*) > 1"
        )
        assert not twice, f"platform ids stored twice: {twice[:3]}"
        for sid in sorted(set(appended.values())):
            check_session(con, sid)


def check_session(con: Reader, sid: str) -> None:
    row = con.rows("SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", (sid,))
    summary = json.loads(row[0][0]) if row else None
    dividers = con.rows(
        "SELECT id, ts, archived FROM messages WHERE session_id = ? AND event_marker = 1 AND content = ?",
        (sid, DIVIDER),
    )
    archived = [
        r[0] for r in con.rows("SELECT id FROM messages WHERE session_id = ? AND archived = 1", (sid,))
    ]
    if summary is None:
        assert not dividers, f"{sid}: a divider without a summary"
        assert not archived, f"{sid}: archived messages without a summary"
        return
    active = [(i, ts) for i, ts, was_archived in dividers if not was_archived]
    assert len(active) == 1, f"{sid}: {len(active)} active dividers beside a summary"
    divider_id, divider_ts = active[0]
    assert divider_ts == summary["time"], f"{sid}: the summary and the divider are from different commits"
    assert all(i < divider_id for i in archived), f"{sid}: archived a message newer than the divider"
    kept = con.rows(
        "SELECT COUNT(*) FROM messages WHERE session_id = ? AND archived = 0 AND event_marker = 0"
        " AND role != 'system' AND id < ?",
        (sid, divider_id),
    )[0][0]
    assert kept == summary["kept_messages"], f"{sid}: {kept} active before the divider, summary says kept"


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_r_run_11_sigkill_at_random_moments_leaves_the_old_or_the_new_state(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    db: Path | str = tmp_path / "crash.db" if engine == "sqlite" else request.getfixturevalue("pg_url")
    reports = Reports()
    seed = random.randrange(2**32)
    with ThreadPoolExecutor(WORKERS) as pool:
        runs = [
            pool.submit(lineage, db, slot, tmp_path / f"worker{slot}.log", reports, seed + slot)
            for slot in range(1, WORKERS + 1)
        ]
        for run in runs:
            try:
                run.result()
            except AssertionError as err:
                raise AssertionError(f"(random seed {seed}) {err}") from err
    check(db, reports.snapshot())
    check_answers(db, reports)
    assert reports.kills == WORKERS * KILLS_PER_WORKER >= 30
    assert reports.failures == []
    # The kills hit a workload that really compresses, answers and appends: each start
    # waited for one of those (AWAITED) before its kill.
    waits = {
        kind: WORKERS * len(range(i, KILLS_PER_WORKER, len(AWAITED))) for i, (kind, _) in enumerate(AWAITED)
    }
    assert reports.compressions >= waits["compressed"] >= 10, f"seed {seed}"
    assert sum(map(len, reports.sent.values())) >= waits["sent"] >= 10, f"seed {seed}"
    assert len(reports.appended) >= 10 * waits["appended"], f"seed {seed}"


def check_answers(db: Path | str, reports: Reports) -> None:
    """At most once: each reply of a session covers messages after the previous reply's.
    And every question is covered by a reply (sent, or marked as being sent when killed)."""
    for sid, uptos in reports.sent.items():
        assert all(a < b for a, b in itertools.pairwise(uptos)), f"{sid} answered twice: {uptos}"
    with reading(db) as con:
        open_questions = con.rows(
            "SELECT m.session_id, m.id FROM messages AS m"
            " LEFT JOIN replies AS r ON r.session_id = m.session_id"
            " WHERE m.addressed = 1 AND m.archived = 0 AND m.id > COALESCE(r.upto, 0)"
        )
    assert not open_questions, f"questions never answered: {open_questions[:5]}"
