"""A fresh database per test on either engine, and raw reads beside the store.

PostgreSQL (the server of tests/fakes/pgserver.py): every test gets its own database,
created from a template that holds the migrated schema (CREATE DATABASE ... TEMPLATE
copies files: milliseconds), dropped after.
`raw` reads what is really stored through a second connection of its own, so a test
checks the database, not the store's memory of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

_names = itertools.count()
TEMPLATE = "memsum_template"
_templates: set[str] = set()


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _create_template(url: str) -> None:
    from nonebot_plugin_memsum.store import Store

    if url in _templates:
        return
    admin = await asyncpg.connect(with_database(url, "postgres"))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await admin.close()
    store = Store(with_database(url, TEMPLATE))
    await store.open()  # the schema, migrated once for every test
    await store.close()
    _templates.add(url)


@contextlib.asynccontextmanager
async def fresh_database(url: str, *, blank: bool = False) -> AsyncIterator[str]:
    """The URL of a new database on `url`'s server (migrated, unless `blank`), dropped afterwards."""
    if not blank:
        await _create_template(url)
    name = f"memsum_t{os.getpid()}_{next(_names)}"
    admin = await asyncpg.connect(with_database(url, "postgres"))
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {'template0' if blank else TEMPLATE}")
        yield with_database(url, name)
    finally:
        with contextlib.suppress(asyncpg.PostgresError):
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


async def raw(location: Path | str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run `sql` (`?` placeholders) on a connection of its own: what is really stored."""
    if isinstance(location, Path):

        def read() -> list[tuple[Any, ...]]:
            conn = sqlite3.connect(location)
            try:
                with conn:
                    return conn.execute(sql, tuple(params)).fetchall()
            finally:
                conn.close()

        return await asyncio.to_thread(read)
    from nonebot_plugin_memsum.store.engine import _numbered

    conn = await asyncpg.connect(location)
    try:
        return [tuple(r) for r in await conn.fetch(_numbered(sql), *params)]
    finally:
        await conn.close()
