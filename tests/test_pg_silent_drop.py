"""PostgreSQL behind a link that goes silent (no FIN, no RST): what the bot does.

A NAT or firewall between the bot and the owner's server drops an idle connection's state,
a cloud database fails over, a VPN tunnel stalls: packets then vanish and neither side
hears of it. Linux retransmits for ~15 minutes before the socket errors, so a statement
sent on such a link waited that long, and every message, turn and command of every group
waited behind it (one connection, one lock). The store now gives each statement
`STATEMENT_TIMEOUT` seconds; a timed-out statement drops the connection, fails as a
StoreError (the refused-message path of record.py), and the next call connects again.

The link is a real TCP proxy in front of the real test server (tests/fakes/pgserver.py)
that stops forwarding on demand and keeps both sockets open, which is what a silent drop
looks like to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Self
from urllib.parse import urlsplit, urlunsplit

import pytest

from nonebot_plugin_memsum.store import StoreError, open_store
from nonebot_plugin_memsum.store.engine import PostgresDb
from nonebot_plugin_memsum.types import Message
from tests.fakes.pgdb import fresh_database
from tests.fakes.pgserver import PgServer

SID = "onebot:10000:group:1"


class SilentLink:
    """127.0.0.1:port -> the server; `silent = True` swallows every byte both ways from
    then on (on every connection, new ones too) and never closes a socket."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.silent = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        pumps = [
            asyncio.create_task(self._pump(client_r, server_w)),
            asyncio.create_task(self._pump(server_r, client_w)),
        ]
        self._tasks.update(pumps)
        with contextlib.suppress(Exception):
            await asyncio.gather(*pumps)
        for w in (client_w, server_w):
            w.close()

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(65536):
            if self.silent:
                continue  # swallowed: the sender hears nothing, not even a reset
            w.write(data)
            await w.drain()


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def said(text: str, ts: float) -> Message:
    return Message(role="user", content=f"[甲(20001)] {text}", name="20001", ts=ts)


@pytest.fixture
async def url(pg_server: PgServer) -> AsyncIterator[str]:
    async with fresh_database(pg_server.url()) as fresh:
        yield fresh


async def test_a_statement_on_a_silent_link_fails_in_bounded_time_and_the_next_call_reconnects(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PostgresDb, "STATEMENT_TIMEOUT", 1.0)
    parts = urlsplit(url)
    assert parts.hostname
    assert parts.port
    async with SilentLink(parts.hostname, parts.port) as link:
        store = await open_store(through(url, link.port))
        try:
            await store.append(SID, said("一", 1.0))
            link.silent = True
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(StoreError, match="timed out"):
                # Without the store's own bound this waits for the kernel (~15 minutes).
                await asyncio.wait_for(store.append(SID, said("二", 2.0)), 30)
            assert loop.time() - started < 10
            link.silent = False
            await asyncio.wait_for(store.append(SID, said("三", 3.0)), 30)
            history = [m.content for m in await store.get_history(SID)]
            assert history == ["[甲(20001)] 一", "[甲(20001)] 三"]
        finally:
            link.silent = False
            await store.close()


async def test_the_default_bound_is_a_minute_and_migrations_have_none(url: str) -> None:
    # A minute: far above any statement of a healthy server (the slowest, a recall on a
    # million-message session, takes milliseconds), far below the kernel's quarter hour.
    # A first start migrating a big database may take longer, so migrations are unbounded.
    assert PostgresDb.STATEMENT_TIMEOUT == 60.0
    store = await open_store(url)
    try:
        await store.append(SID, said("一", 1.0))
        assert [m.content for m in await store.get_history(SID)] == ["[甲(20001)] 一"]
    finally:
        await store.close()
