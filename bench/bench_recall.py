"""Recall benchmark (issue 11): query latency on a session of 1,000,000 stored messages,
the index's size against the messages' size, and search quality on a seeded Chinese group
log with planted facts; `--compare` measures the alternatives the method was chosen over.

    python bench/bench_recall.py [--messages 1000000] [--quality 20000] [--compare 100000] [--rounds 5]

The big file is built with the store's own schema and term function (`search.documents`)
in bulk through sqlite3 (a million `Store.append` calls would only time the appends);
queries go through `Store.search`, as the tool and /回忆 call it; each shape's median
wall and CPU time is printed (the CPU figure is the process's, the database thread's
included: on a shared machine wall time also waits for a core). Files go to a temporary
folder that is removed afterwards. Figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nonebot

nonebot.init()  # importing the package wires the plugin into NoneBot, which needs a driver

from grouplog import FACTS, Fact, group_log

from nonebot_plugin_memsum.store import SearchQuery, Store
from nonebot_plugin_memsum.store import search as search_mod
from nonebot_plugin_memsum.types import Message

SESSION = "onebot:10000:group:1"
T0 = 1_760_000_000.0
TOP = 5


def _report(name: str, value: str) -> None:
    print(f"{name:<58} {value}")  # noqa: T201


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms (n={len(ordered)})"


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _rows(log: Iterable[tuple[str, int, str]], gap: float) -> Iterable[tuple[str, str, str, str, float]]:
    for i, (name, qq, body) in enumerate(log):
        yield SESSION, "user", f"[{name}({qq})] {body}", str(qq), T0 + i * gap


def _bulk(path: Path, rows: list[tuple[str, str, str, str, float]], batch: int = 20000) -> None:
    """Messages and their index rows, as `Store.append` writes them, in big transactions."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        conn.execute("BEGIN")
        first = conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM messages").fetchone()[0]
        conn.executemany(
            "INSERT INTO messages (id, session_id, role, content, name, ts) VALUES (?, ?, ?, ?, ?, ?)",
            [(first + k, *r) for k, r in enumerate(part)],
        )
        docs = search_mod.documents(
            (first + k, sid, role, name, content, 0, ts, None)
            for k, (sid, role, content, name, ts) in enumerate(part)
        )
        conn.executemany(search_mod.INSERT, docs)
        conn.execute("COMMIT")
    conn.execute("INSERT INTO search_index (search_index) VALUES ('optimize')")
    conn.close()


def _sizes(path: Path) -> tuple[int, int]:
    """(bytes of message text, bytes of the search tables) from SQLite's dbstat."""
    conn = sqlite3.connect(path)
    try:
        text = conn.execute("SELECT SUM(length(CAST(content AS BLOB))) FROM messages").fetchone()[0]
        index = conn.execute(
            "SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'search_index%' OR name LIKE 'search_cleared%'"
        ).fetchone()[0]
        return int(text or 0), int(index or 0)
    finally:
        conn.close()


# ---- latency on a big session ------------------------------------------------------------
LATENCY_QUERIES: list[dict[str, Any]] = [
    {"text": "提取码"},
    {"text": "网盘"},
    {"text": "链接"},
    {"text": "周末"},
    {"text": "今天"},  # the most frequent word of the log
    {"text": "吃饭 游戏"},
    {"text": "狼人杀"},
    {"text": "海底捞"},
    {"text": "显卡 蓝屏"},
    {"text": "滑"},  # one character: a prefix query
    {"text": "pan.baidu.com"},
    {"text": "python"},
    {"text": "链接", "speaker": "20002"},
    {"text": "周末", "speaker": "小明"},
    {"text": "今天", "since_frac": 0.2, "until_frac": 0.21},
    {"text": "放鸽子", "since_frac": 0.5},
]


async def bench_latency(folder: Path, n: int, rounds: int = 5) -> None:
    path = folder / "big.db"
    store = Store(path)
    await store.open()  # the schema, migrations included
    await store.close()
    log, _ = group_log(n, facts=200, seed=11)
    start = time.perf_counter()
    _bulk(path, list(_rows(log, gap=30.0)))
    _report(f"build {n:,} messages + index (bulk)", f"{time.perf_counter() - start:,.1f} s")
    text, index = _sizes(path)
    _report("message text (content column)", _mib(text))
    _report("search index (FTS5 tables)", f"{_mib(index)}  = {index / text:.2f} × the text")
    _report("whole file", _mib(path.stat().st_size))

    store = Store(path)
    await store.open()
    try:
        span = n * 30.0
        queries = [
            SearchQuery(
                SESSION,
                q["text"],
                q.get("speaker"),
                T0 + span * q["since_frac"] if "since_frac" in q else None,
                T0 + span * q["until_frac"] if "until_frac" in q else None,
                limit=10,
            )
            for q in LATENCY_QUERIES
        ]
        for q in queries:  # warm the page cache once
            await store.search(q)
        samples: list[float] = []
        cpu: list[float] = []
        per_query: dict[str, tuple[list[float], list[float]]] = {}
        for _ in range(rounds):
            for q in queries:
                t, c = time.perf_counter(), time.process_time()
                await store.search(q, context=1)
                took, used = time.perf_counter() - t, time.process_time() - c
                samples.append(took)
                cpu.append(used)  # the process's CPU, the database thread's included
                shape = f"{q.text} {q.speaker or ''}{' +time' if q.since else ''}".strip()
                per_query.setdefault(shape, ([], []))[0].append(took)
                per_query[shape][1].append(used)
        _report(f"query latency, {n:,} messages, limit 10, context 1", _ms(samples))
        _report("  CPU time per query (wall time waits for a shared core)", _ms(cpu))
        for name, (took, used) in sorted(per_query.items(), key=lambda kv: -statistics.median(kv[1][0])):
            wall_ms, cpu_ms = statistics.median(took) * 1000, statistics.median(used) * 1000
            _report(f"  {name}", f"{wall_ms:.1f} ms (CPU {cpu_ms:.1f} ms)")
    finally:
        await store.close()


# ---- quality on a seeded group log ------------------------------------------------------
def _fact_queries(facts: dict[int, Fact]) -> list[tuple[int, str]]:
    return [(at, word) for at, fact in facts.items() for word in fact.words]


async def report_quality(store: Store, ids: list[int], facts: dict[int, Fact], n: int) -> None:
    """Print how often a fact's message is in the top hits: by one of its words, then with
    its speaker as the filter (`ids`: the stored id of each log line, in order)."""
    found = 0
    queries = _fact_queries(facts)
    misses: list[str] = []
    for at, word in queries:
        hits = await store.search(SearchQuery(SESSION, word, limit=TOP))
        if ids[at] in [h.message.id for h in hits]:
            found += 1
        else:
            misses.append(word)
    _report(
        f"quality: fact in top {TOP}, {len(queries)} one-word queries, {n:,} msgs",
        f"{100 * found / len(queries):.1f} %",
    )
    if misses:
        _report("  missed", " ".join(misses))
    # Who asked what: the fact's speaker as the filter, one of its words as the query.
    found = 0
    for at, fact in facts.items():
        hits = await store.search(SearchQuery(SESSION, fact.words[0], speaker=fact.speaker[0], limit=TOP))
        found += ids[at] in [h.message.id for h in hits]
    _report(
        f"quality: with the speaker's name as filter ({len(facts)} facts)",
        f"{100 * found / len(facts):.1f} %",
    )


async def bench_quality(folder: Path, n: int) -> None:
    """Every message through `Store.append` (the recording path); a query per fact word."""
    store = Store(folder / "quality.db")
    await store.open()
    try:
        log, facts = group_log(n, facts=len(FACTS), seed=3)
        ids: list[int] = []
        for i, (name, qq, body) in enumerate(log):
            msg = Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=T0 + i * 60)
            stored = await store.append(SESSION, msg)
            ids.append(stored.id or 0)
        await report_quality(store, ids, facts, n)
    finally:
        await store.close()


# ---- the alternatives ---------------------------------------------------------------------
def _quality(search: Callable[[str], list[int]], facts: dict[int, Fact]) -> float:
    queries = _fact_queries(facts)
    return 100 * sum(at + 1 in search(word)[:TOP] for at, word in queries) / len(queries)


def _timed(search: Callable[[str], list[int]], words: list[str]) -> str:
    samples = []
    for _ in range(3):
        for w in words:
            t = time.perf_counter()
            search(w)
            samples.append(time.perf_counter() - t)
    return _ms(samples)


def bench_compare(folder: Path, n: int) -> None:
    """Ours (bigrams cut in Python), FTS5 trigram (+ LIKE below 3 characters), jieba words;
    every FTS5 variant ranked the same way (bm25 × the length prior, then the newest)."""
    log, facts = group_log(n, facts=len(FACTS), seed=3)
    texts = [body for _, _, body in log]
    two = ["网盘", "链接", "周末", "年会", "签证", "门禁", "押金", "耳机"]
    three = ["提取码", "狼人杀", "海底捞", "信用卡", "路由器", "科目二"]
    text_bytes = sum(len(t.encode()) for t in texts)
    _report(f"compare on {n:,} messages ({_mib(text_bytes)} of text)", "")

    def with_messages(name: str, fts: str) -> sqlite3.Connection:
        conn = sqlite3.connect(folder / name)
        conn.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, content TEXT)")
        conn.executemany("INSERT INTO m VALUES (?, ?)", ((i + 1, t) for i, t in enumerate(texts)))
        conn.execute(f"CREATE VIRTUAL TABLE f USING fts5({fts})")
        return conn

    def ranked(conn: sqlite3.Connection, expression: str) -> list[int]:
        sql = (
            "SELECT f.rowid FROM f JOIN m ON m.id = f.rowid WHERE f MATCH ?"
            f" ORDER BY bm25(f) * min(length(m.content), {search_mod.PRIOR_CHARS}), f.rowid DESC LIMIT 10"
        )
        return [r[0] for r in conn.execute(sql, (expression,))]

    def size(conn: sqlite3.Connection) -> str:
        pages = conn.execute("SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'f%'").fetchone()[0]
        return f"{_mib(pages)} = {pages / text_bytes:.2f} × text"

    def fill(conn: sqlite3.Connection, cut: Callable[[str], Iterable[str]]) -> float:
        start = time.perf_counter()
        conn.executemany(
            "INSERT INTO f (rowid, body) VALUES (?, ?)",
            ((i + 1, " ".join(cut(t))) for i, t in enumerate(texts)),
        )
        conn.commit()
        return time.perf_counter() - start

    plain = "body, content='', tokenize='unicode61 remove_diacritics 0'"
    conn = with_messages("ours.db", plain)
    built = fill(conn, search_mod.terms)

    def ours(word: str) -> list[int]:
        return ranked(conn, search_mod.match_expression(word) or '""')

    _report("  bigrams (ours): index", f"{size(conn)}, built in {built:.1f} s")
    _report("  bigrams (ours): 2-char queries", _timed(ours, two))
    _report("  bigrams (ours): 3-char queries", _timed(ours, three))
    _report("  bigrams (ours): quality", f"{_quality(ours, facts):.1f} %")
    conn.close()

    # trigram: an index of the text itself; LIKE (a scan, no relevance) below 3 characters
    tri = with_messages("trigram.db", "content, content='m', content_rowid='id', tokenize='trigram'")
    start = time.perf_counter()
    tri.execute("INSERT INTO f (f) VALUES ('rebuild')")
    tri.commit()
    built = time.perf_counter() - start

    def trigram(word: str) -> list[int]:
        if len(word) >= 3:
            return ranked(tri, f'"{word}"')
        sql = "SELECT id FROM m WHERE content LIKE ? ORDER BY id DESC LIMIT 10"
        return [r[0] for r in tri.execute(sql, (f"%{word}%",))]

    _report("  trigram: index", f"{size(tri)}, built in {built:.1f} s")
    _report("  trigram: 2-char queries (LIKE scan)", _timed(trigram, two))
    _report("  trigram: 3-char queries", _timed(trigram, three))
    _report("  trigram: quality", f"{_quality(trigram, facts):.1f} %")
    tri.close()

    try:
        import jieba  # type: ignore[import-not-found]  # only for this comparison
    except ImportError:
        _report("  jieba", "not installed (pip install jieba to compare)")
        return
    jieba.setLogLevel(60)
    seg = with_messages("jieba.db", plain)
    built = fill(seg, lambda t: (w.lower() for w in jieba.cut_for_search(t) if w.strip()))

    def segmented(word: str) -> list[int]:
        return ranked(seg, '"' + " ".join(w for w in jieba.cut(word) if w.strip()) + '"')

    _report("  jieba (cut_for_search): index", f"{size(seg)}, built in {built:.1f} s")
    _report("  jieba: 2-char queries", _timed(segmented, two))
    _report("  jieba: 3-char queries", _timed(segmented, three))
    _report("  jieba: quality", f"{_quality(segmented, facts):.1f} %")
    seg.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description="Recall benchmark (issue 11)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages of the latency session")
    parser.add_argument("--quality", type=int, default=20_000, help="messages of the seeded quality log")
    parser.add_argument("--compare", type=int, default=100_000, help="messages for the comparison (0: skip)")
    parser.add_argument("--rounds", type=int, default=5, help="times each latency query shape is timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memsum-bench-recall-") as tmp:
        folder = Path(tmp)
        if args.quality:
            await bench_quality(folder, args.quality)
        if args.compare:
            bench_compare(folder, args.compare)
        if args.messages:
            await bench_latency(folder, args.messages, args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
