"""Audit 5 (o): PostgreSQL as an owner runs it in production (issue 13).

The bot with MEMSUM_DB_URL beside a PostgreSQL server of the owner's: roles that may
connect but not write, or not create the schema (start-up stops with one line naming the
key, as SQLite's read-only file does), the URL forms owners copy from their server's docs
(`postgres://`, `?sslmode=disable`, a unix socket, a percent-encoded password, a missing
database name), the server going away while the bot runs (idle, between messages, with a
lock held or a statement timeout on the server), and what the bot logs and stores once
it is back, without a restart of the bot.

Every test runs on the real PostgreSQL server of tests/fakes/pgserver.py (its roles are
cluster-wide: each test makes its own, and drops it).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import pytest

from nonebot_plugin_memsum.config import parse_config
from nonebot_plugin_memsum.errors import ConfigError
from nonebot_plugin_memsum.store import StoreError, open_store
from nonebot_plugin_memsum.types import Message
from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import group_sid, query, running_bot, until, wait_log
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.pgdb import fresh_database, raw
from tests.fakes.pgserver import PgServer

SID = "onebot:10000:group:1"


@pytest.fixture
async def url(pg_server: PgServer) -> AsyncIterator[str]:
    """A fresh database with the schema, owned by the test server's superuser."""
    async with fresh_database(pg_server.url()) as fresh:
        yield fresh


@pytest.fixture
def role(pg_server: PgServer) -> Iterator[tuple[str, str]]:
    """A new login role (no rights beyond PUBLIC's) and its password; dropped after."""
    name = "r_" + uuid.uuid4().hex[:12]
    password = "pw-" + uuid.uuid4().hex[:12]
    pg_server.psql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    yield name, password
    for database in pg_server.psql("SELECT datname FROM pg_database WHERE NOT datistemplate").split():
        pg_server.psql(f"REASSIGN OWNED BY {name} TO CURRENT_USER; DROP OWNED BY {name}", database)
    pg_server.psql(f"DROP ROLE {name}")


def as_role(url: str, name: str, password: str) -> str:
    parts = urlsplit(url)
    netloc = f"{quote(name, safe='')}:{quote(password, safe='')}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def dbname(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def said(text: str, ts: float = 1.0) -> Message:
    return Message(role="user", content=f"[甲(20001)] {text}", name="20001", ts=ts)


# ---- roles --------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["select_only", "read_only_transactions"])
async def test_a_role_that_can_read_but_not_write_stops_start_up_naming_the_server(
    pg_server: PgServer, url: str, role: tuple[str, str], how: str
) -> None:
    # An owner hands the bot a reporting role, or points it at a read-only replica (every
    # transaction read-only): opening must refuse, not start and then lose every message.
    name, password = role
    db = dbname(url)
    pg_server.psql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {name}", db)
    if how == "read_only_transactions":
        pg_server.psql(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name};"
            f" GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {name};"
            f" ALTER ROLE {name} SET default_transaction_read_only = on",
            db,
        )
    with pytest.raises(StoreError) as caught:
        await open_store(as_role(url, name, password))
    line = str(caught.value)
    assert line.startswith(f"cannot write postgresql://{name}@127.0.0.1:{pg_server.port}/{db}")
    assert password not in line
    assert "\n" not in line


async def test_a_role_with_only_its_tables_rights_runs_a_migrated_database(
    pg_server: PgServer, url: str, role: tuple[str, str]
) -> None:
    # Least privilege: the owner migrated once (or the first start did), then runs the bot
    # as a role that may read and write the tables but create nothing.
    name, password = role
    pg_server.psql(
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name};"
        f" GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {name}",
        dbname(url),
    )
    store = await open_store(as_role(url, name, password))
    try:
        await store.append(SID, said("一"))
        await store.append(SID, said("二", ts=2.0))
        assert [m.content for m in await store.get_history(SID)] == ["[甲(20001)] 一", "[甲(20001)] 二"]
    finally:
        await store.close()
    assert await raw(url, "SELECT COUNT(*) FROM messages WHERE session_id = ?", (SID,)) == [(2,)]


async def test_a_role_that_cannot_create_the_schema_stops_start_up_saying_so(
    pg_server: PgServer, pg_url: str, role: tuple[str, str]
) -> None:
    # PostgreSQL 15+: only the database's owner may create in `public`. A new role given
    # CONNECT on a database the owner made as postgres cannot create the tables.
    name, password = role
    with pytest.raises(StoreError) as caught:
        await open_store(as_role(pg_url, name, password))
    line = str(caught.value)
    assert line.startswith(f"cannot write postgresql://{name}@")
    assert "permission denied for schema public" in line
    assert "create" in line.split(")", 1)[1]  # what to do about it, after the server's words
    assert password not in line
    assert await raw(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == []


async def test_bot_start_up_as_a_read_only_role_is_one_line_naming_memsum_db_url(
    tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer, url: str, role: tuple[str, str]
) -> None:
    name, password = role
    pg_server.psql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {name}", dbname(url))
    bot = BotProcess(
        tmp_path_factory.mktemp("pgro"),
        env={"MEMSUM_DB_URL": as_role(url, name, password), "LOG_LEVEL": "INFO"},
    )
    with pytest.raises(BotExitedError) as exited:
        async with bot:
            pass
    lines = [line for line in exited.value.log.splitlines() if "nonebot-plugin-memsum" in line]
    assert len(lines) == 1, lines
    assert f"MEMSUM_DB_URL: cannot write postgresql://{name}@" in lines[0]
    assert password not in exited.value.log
    assert exited.value.returncode != 0


# ---- URL forms ----------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["postgres_scheme", "sslmode_disable", "socket_query", "socket_host"])
async def test_url_forms_owners_copy_are_accepted_and_shown_without_the_password(
    pg_server: PgServer, url: str, form: str
) -> None:
    parts = urlsplit(url)
    password = parts.password
    assert password
    assert pg_server._dir is not None
    socket_dir = str(pg_server._dir)  # the server also listens on a unix socket there
    written = {
        "postgres_scheme": urlunsplit(parts._replace(scheme="postgres")),
        "sslmode_disable": url + "?sslmode=disable",
        # libpq's documented socket forms: an empty host with ?host=, or the path encoded
        # as the host (https://www.postgresql.org/docs/16/libpq-connect.html#LIBPQ-CONNSTRING-URIS)
        "socket_query": f"postgresql://memsum:{password}@/{dbname(url)}?host={socket_dir}&port={parts.port}",
        "socket_host": f"postgresql://memsum:{password}@{quote(socket_dir, safe='')}:{parts.port}"
        f"/{dbname(url)}?sslmode=disable",
    }[form]
    config = parse_config({"memsum_db_url": written})
    assert password not in repr(config)
    store = await open_store(config.memsum_db_url.get_secret_value())
    try:
        assert password not in str(store)
        assert dbname(url) in str(store)
        if form == "socket_query":  # the log says which socket
            assert str(store).endswith(f"/{dbname(url)}?host={socket_dir}")
        await store.append(SID, said("连上了"))
    finally:
        await store.close()
    assert await raw(url, "SELECT content FROM messages WHERE session_id = ?", (SID,)) == [
        ("[甲(20001)] 连上了",)
    ]


async def test_a_password_with_url_characters_percent_encoded_connects(
    pg_server: PgServer, url: str, role: tuple[str, str]
) -> None:
    name, _ = role
    password = "p@ss/w#rd?:%x 中"
    pg_server.psql(f"ALTER ROLE {name} SUPERUSER PASSWORD '{password}'")
    written = as_role(url, name, password)
    assert "%40" in written
    assert "%25" in written
    config = parse_config({"memsum_db_url": written})
    store = await open_store(config.memsum_db_url.get_secret_value())
    try:
        await store.append(SID, said("密码里有符号"))
        assert quote(password, safe="") not in str(store)
        assert "p@ss" not in str(store)
    finally:
        await store.close()


@pytest.mark.parametrize(
    "written",
    [
        "postgresql://memsum:hunter2@127.0.0.1:5432",  # no database name
        "postgresql://memsum:hunter2@127.0.0.1:5432/",
        "postgresql://memsum:hunter2@/memsum",  # no host and no ?host=
    ],
)
def test_a_url_refused_is_one_line_naming_the_key_never_the_password(written: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"memsum_db_url": written})
    line = str(caught.value)
    assert line.startswith("invalid MEMSUM_DB_URL")
    assert "postgresql://user:password@host:port/dbname" in line
    assert "hunter2" not in line
    assert "\n" not in line


async def test_a_bogus_sslmode_is_refused_at_open_without_the_password() -> None:
    with pytest.raises(StoreError) as caught:
        await open_store("postgresql://memsum:hunter2@127.0.0.1:1/memsum?sslmode=bogus")
    assert "sslmode" in str(caught.value)
    assert "hunter2" not in str(caught.value)


async def test_a_password_given_as_a_query_parameter_is_never_shown(pg_server: PgServer, url: str) -> None:
    parts = urlsplit(url)
    password = parts.password
    assert password
    written = f"postgresql://memsum@127.0.0.1:{parts.port}{parts.path}?password={password}"
    config = parse_config({"memsum_db_url": written})
    store = await open_store(config.memsum_db_url.get_secret_value())
    try:
        assert password not in str(store)
    finally:
        await store.close()
    with pytest.raises(StoreError) as caught:
        await open_store(written.replace(parts.path, "/no_such_db"))
    assert password not in str(caught.value)


# ---- the server while the bot runs -------------------------------------------------------
async def test_a_lock_held_on_the_server_delays_a_message_and_loses_nothing(url: str) -> None:
    # The owner runs a maintenance statement (LOCK TABLE, VACUUM FULL, a long migration of
    # their own) while the bot records: the bot waits for it, then stores in order.
    store = await open_store(url)
    admin = await asyncpg.connect(url)
    try:
        await store.append(SID, said("一"))
        locking = admin.transaction()
        await locking.start()
        await admin.execute("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        late = asyncio.create_task(store.append(SID, said("二", ts=2.0)))
        await asyncio.sleep(0.5)
        assert not late.done()
        await locking.rollback()
        await asyncio.wait_for(late, 10)
        await store.append(SID, said("三", ts=3.0))
        assert [m.content for m in await store.get_history(SID)] == [
            "[甲(20001)] 一",
            "[甲(20001)] 二",
            "[甲(20001)] 三",
        ]
    finally:
        await admin.close()
        await store.close()


async def test_a_statement_timeout_on_the_server_fails_one_call_and_the_next_stores(
    pg_server: PgServer, url: str
) -> None:
    # The owner's server cancels statements after a while (statement_timeout): the one
    # message that waited on a lock that long is refused as a StoreError (the log line of
    # record.py), nothing half written, and the next one is stored on the same store.
    pg_server.psql(f'ALTER DATABASE "{dbname(url)}" SET statement_timeout = 300')
    store = await open_store(url)
    admin = await asyncpg.connect(url)
    try:
        await store.append(SID, said("一"))
        locking = admin.transaction()
        await locking.start()
        await admin.execute("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreError, match="statement timeout"):
            await asyncio.wait_for(store.append(SID, said("二", ts=2.0)), 10)
        await locking.rollback()
        await store.append(SID, said("三", ts=3.0))
        assert [m.content for m in await store.get_history(SID)] == ["[甲(20001)] 一", "[甲(20001)] 三"]
        assert await raw(url, "SELECT active FROM message_counts WHERE session_id = ?", (SID,)) == [(2,)]
    finally:
        await admin.close()
        await store.close()


GROUP = 992


def model(body: dict[str, object]) -> Reply:
    return Reply("收到")


async def test_the_server_going_away_while_the_bot_runs_logs_once_and_stores_again_after(
    tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer, url: str
) -> None:
    # A `docker restart` of the owner's PostgreSQL while the bot runs: the server ends the
    # bot's connections and refuses new ones for a while. Messages said meanwhile are not
    # stored (one line in the log, not a traceback each); once the server is back, the
    # next ones are, without restarting the bot, and those said meanwhile are fetched again;
    # nothing stored twice or half.
    sid = group_sid(GROUP)
    db = dbname(url)
    password = urlsplit(url).password
    assert password
    with ScriptedLLM() as llm:
        llm.on_request(model)
        settings = {
            "MEMSUM_MODELS": json.dumps([llm.model_config()]),
            "MEMSUM_DB_URL": url,
            "LOG_LEVEL": "INFO",
        }
        async with running_bot(tmp_path_factory.mktemp("pgdown"), settings) as (bot, sim):

            async def stored(n: int) -> bool:
                return len(await query(url, "SELECT id FROM messages WHERE session_id = ?", sid)) == n

            await sim.group_message(GROUP, 20001, "重启之前", nickname="小明")
            await until(lambda: stored(1), "the first message stored")
            pg_server.psql(f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS false')
            try:
                await raw(
                    pg_server.url(),
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ?",
                    (db,),
                )
                for i in range(3):
                    await sim.group_message(GROUP, 20001, f"停机时{i}", nickname="小明")
                await wait_log(bot, "cannot store messages in the database")
                await asyncio.sleep(0.5)
            finally:
                pg_server.psql(f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS true')
            await sim.group_message(GROUP, 20001, "恢复之后", nickname="小明")
            await wait_log(bot, "messages are stored again")
            await until(
                lambda: _has(url, sid, "恢复之后"),
                "the message after the outage stored",
            )
            # What was said during the outage is fetched again from the implementation's
            # history (get_group_msg_history) once the server is back.
            log = await wait_log(bot, "the store refused, fetched again and stored")
    contents = [
        c for (c,) in await query(url, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", sid)
    ]
    assert contents == [
        "[小明(20001)] 重启之前",
        "[小明(20001)] 恢复之后",  # the message that found the server back goes in first
        "[小明(20001)] 停机时0",
        "[小明(20001)] 停机时1",
        "[小明(20001)] 停机时2",
    ]
    assert f"memsum: 3 messages of {sid} the store refused, fetched again and stored" in log
    assert log.count("cannot store messages in the database") == 1  # once a minute, not once a message
    assert "Traceback" not in log
    assert password not in log


async def _has(url: str, sid: str, words: str) -> bool:
    return bool(
        await query(url, "SELECT 1 FROM messages WHERE session_id = ? AND content LIKE ?", sid, f"%{words}")
    )
