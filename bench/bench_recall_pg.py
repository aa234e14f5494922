"""Recall on PostgreSQL (issue 13): the same measurements as bench_recall.py, on a
PostgreSQL server, for the method the store uses there (the store's bigram terms in a
tsvector with a GIN index, store/pg_search.py) and the one it was chosen over (pg_trgm's
trigram GIN index with LIKE, which cannot use its index for a two-character word).

    python bench/bench_recall_pg.py --db postgresql://user:password@host:port/postgres
        [--messages 200000] [--quality 20000] [--compare 100000]

A database `memsum_bench_recall` is created on that server for the run and dropped after.
The big session is loaded in bulk (COPY) with the store's own document function; the
quality log goes through `Store.append`, as recording does; queries go through
`Store.search`, as the tool and /回忆 call it. Figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nonebot

nonebot.init()  # importing the package wires the plugin into NoneBot, which needs a driver

import asyncpg
from bench_recall import LATENCY_QUERIES, SESSION, T0, TOP, _fact_queries, _mib, _ms, _report, report_quality
from grouplog import FACTS, group_log

from nonebot_plugin_memsum.store import SearchQuery, open_store, pg_search
from nonebot_plugin_memsum.store import search as search_mod
from nonebot_plugin_memsum.types import Message

DATABASE = "memsum_bench_recall"


def _at(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


async def _fresh(url: str) -> str:
    admin = await asyncpg.connect(_at(url, "postgres"))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await admin.close()
    return _at(url, DATABASE)


async def _drop(url: str) -> None:
    admin = await asyncpg.connect(_at(url, "postgres"))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    finally:
        await admin.close()


async def bench_quality(url: str, n: int) -> None:
    store = await open_store(url)
    try:
        log, facts = group_log(n, facts=len(FACTS), seed=3)
        ids: list[int] = []
        start = time.perf_counter()
        for i, (name, qq, body) in enumerate(log):
            msg = Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=T0 + i * 60)
            ids.append((await store.append(SESSION, msg)).id or 0)
        _report(f"Store.append on PostgreSQL, {n:,} messages", f"{n / (time.perf_counter() - start):,.0f} /s")
        await report_quality(store, ids, facts, n)
    finally:
        await store.close()


async def _load(url: str, n: int, seed: int = 11, facts: int = 200) -> tuple[list[str], asyncpg.Connection]:
    """A session of n messages, 30 s apart, loaded with COPY; the texts and a connection."""
    log, _ = group_log(n, facts=facts, seed=seed)
    rows = [
        (i + 1, SESSION, "user", f"[{name}({qq})] {body}", str(qq), T0 + i * 30.0)
        for i, (name, qq, body) in enumerate(log)
    ]
    conn = await asyncpg.connect(url)
    await conn.copy_records_to_table(
        "messages", records=rows, columns=["id", "session_id", "role", "content", "name", "ts"]
    )
    docs = [(r[0], pg_search.document(r[1], r[2], r[4], r[3], r[5])) for r in rows]
    await conn.executemany(pg_search.INSERT.replace("?", "$1", 1).replace("?", "$2", 1), docs)
    await conn.execute("SELECT setval(pg_get_serial_sequence('messages', 'id'), $1)", n)
    await conn.execute("VACUUM ANALYZE")
    return [r[3] for r in rows], conn


async def bench_latency(url: str, n: int) -> None:
    store = await open_store(url)  # the schema, migrated
    await store.close()
    start = time.perf_counter()
    texts, conn = await _load(url, n)
    _report(f"build {n:,} messages + tsvector index (bulk)", f"{time.perf_counter() - start:,.1f} s")
    text = sum(len(t.encode()) for t in texts)
    index = int(await conn.fetchval("SELECT pg_total_relation_size('search_index')") or 0)
    await conn.close()
    _report("message text", _mib(text))
    _report("search index (table + GIN)", f"{_mib(index)}  = {index / text:.2f} × the text")
    store = await open_store(url)
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
        for q in queries:
            await store.search(q)
        samples: list[float] = []
        per: dict[str, list[float]] = {}
        for _ in range(5):
            for q in queries:
                t = time.perf_counter()
                await store.search(q, context=1)
                took = time.perf_counter() - t
                samples.append(took)
                per.setdefault(f"{q.text} {q.speaker or ''}".strip(), []).append(took)
        _report(f"query latency, {n:,} messages, limit 10, context 1", _ms(samples))
        for name, took in sorted(per.items(), key=lambda kv: -sorted(kv[1])[len(kv[1]) // 2])[:3]:
            _report(f"  slowest: {name}", f"{sorted(took)[len(took) // 2] * 1000:.1f} ms")
    finally:
        await store.close()


async def bench_compare(url: str, n: int) -> None:
    """Ours against pg_trgm on the same messages: index size, 2- and 3-character queries
    (newest 1,000 matches ranked as the store ranks them), quality."""
    await (await open_store(url)).close()  # the schema, migrated
    texts, conn = await _load(url, n, seed=3, facts=len(FACTS))
    _, facts = group_log(n, facts=len(FACTS), seed=3)
    two = ["网盘", "链接", "周末", "年会", "签证", "门禁", "押金", "耳机"]
    three = ["提取码", "狼人杀", "海底捞", "信用卡", "路由器", "科目二"]
    text = sum(len(t.encode()) for t in texts)
    _report(f"compare on {n:,} messages ({_mib(text)} of text)", "")

    async def ranked(sql: str, arg: str) -> list[int]:
        rows = await conn.fetch(sql, arg)
        words = search_mod.query_words(arg if "%" not in arg else arg.strip("%"))
        scored = sorted(
            ((pg_search.relevance(words, "user", r[1]), r[0]) for r in rows), key=lambda s: (-s[0], -s[1])
        )
        return [i for _, i in scored[:10]]

    async def timed(search, words: list[str]) -> str:  # type: ignore[no-untyped-def]
        samples = []
        for _ in range(3):
            for w in words:
                t = time.perf_counter()
                await search(w)
                samples.append(time.perf_counter() - t)
        return _ms(samples)

    async def quality(search) -> float:  # type: ignore[no-untyped-def]
        queries = _fact_queries(facts)
        return 100 * sum([at + 1 in (await search(w))[:TOP] for at, w in queries]) / len(queries)

    ours_sql = (
        "SELECT m.id, m.content FROM search_index s JOIN messages m ON m.id = s.id"
        " WHERE s.doc @@ CAST($1 AS tsquery) ORDER BY s.id DESC LIMIT 1000"
    )

    async def ours(word: str) -> list[int]:
        q = pg_search.tsquery(SearchQuery(SESSION, word))
        return await ranked(ours_sql, q or "''") if q else []

    size = int(await conn.fetchval("SELECT pg_total_relation_size('search_index')") or 0)
    _report("  bigram tsvector + GIN (ours): index", f"{_mib(size)} = {size / text:.2f} × text")
    _report("  ours: 2-char queries", await timed(ours, two))
    _report("  ours: 3-char queries", await timed(ours, three))
    _report("  ours: quality", f"{await quality(ours):.1f} %")

    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except asyncpg.PostgresError as err:
        _report("  pg_trgm", f"not available on this server ({err})")
        return
    start = time.perf_counter()
    await conn.execute("CREATE INDEX messages_trgm ON messages USING GIN (content gin_trgm_ops)")
    built = time.perf_counter() - start
    size = int(await conn.fetchval("SELECT pg_relation_size('messages_trgm')") or 0)
    like_sql = "SELECT id, content FROM messages WHERE content LIKE $1 ORDER BY id DESC LIMIT 1000"

    async def trigram(word: str) -> list[int]:
        return await ranked(like_sql, f"%{word}%")

    plan2 = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + like_sql.replace("$1", "'%网盘%'")))
    plan3 = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + like_sql.replace("$1", "'%提取码%'")))
    _report("  pg_trgm GIN + LIKE: index", f"{_mib(size)} = {size / text:.2f} × text, built in {built:.1f} s")
    _report(
        "  pg_trgm: 2-char queries",
        await timed(trigram, two) + (" (index unused)" if "messages_trgm" not in plan2 else ""),
    )
    _report(
        "  pg_trgm: 3-char queries",
        await timed(trigram, three) + (" (index used)" if "messages_trgm" in plan3 else ""),
    )
    _report("  pg_trgm: quality", f"{await quality(trigram):.1f} %")
    await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description="Recall benchmark on PostgreSQL (issue 13)")
    parser.add_argument("--db", required=True, help="postgresql://user:password@host:port/anydb")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--quality", type=int, default=20_000)
    parser.add_argument("--compare", type=int, default=100_000)
    args = parser.parse_args()
    server = (await asyncpg.connect(args.db)).get_server_version()
    _report("PostgreSQL", f"{server.major}.{server.minor}")
    try:
        if args.quality:
            await bench_quality(await _fresh(args.db), args.quality)
        if args.compare:
            await bench_compare(await _fresh(args.db), args.compare)
        if args.messages:
            await bench_latency(await _fresh(args.db), args.messages)
    finally:
        await _drop(args.db)


if __name__ == "__main__":
    asyncio.run(main())
