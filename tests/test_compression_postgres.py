"""Several bot processes on one PostgreSQL database (issue 13), at the level of the
compression service: two runtimes, each with its own store connection, stand for two
processes (the two-`bot.py` test runs real ones).

- R-PROG-3 across processes: a second process's manual /压缩 of a session being compressed
  elsewhere is refused with 「这个会话正在压缩」, its background run skips without counting
  a failure (R-BACK-3), and the one run commits once;
- back-off, the latest usage and the settings are read from the database, so a process
  taking a session over continues where the other left it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nonebot_plugin_memsum.compression.service import BUSY, CompressionError
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes.llm_server import Reply
from tests.fakes.pgdb import fresh_database
from tests.fakes.pgserver import PgServer
from tests.fakes.service import GROUP, IN_GROUP, Make, held_compression, seed, settle

FAIL = Reply(status=500, error="summariser down", headers={"Retry-After": "0"})


@pytest.fixture
async def url(pg_server: PgServer) -> AsyncIterator[str]:
    """A fresh database; requested before `make`, so it is dropped after the runtimes close."""
    async with fresh_database(pg_server.url()) as fresh:
        yield fresh


async def test_r_prog_3_one_compression_per_session_across_processes(url: str, make: Make) -> None:
    first = await make(location=url, memsum_history_limit=2)
    second = await make(location=url, memsum_history_limit=2)  # every turn is due by count
    await seed(first.rt, 6)
    before = await second.rt.store.get_history(GROUP.id)  # cached by the second process
    run, gate = await held_compression(first)
    with pytest.raises(CompressionError) as refused:
        await second.rt.compression.compress(GROUP.id)
    assert refused.value.reason == BUSY == "这个会话正在压缩"
    # Due by count in the second process too: its background run skips, no failure.
    assert await second.rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(second.rt)
    assert second.model.summary_requests() == []
    assert (await second.rt.compression.status(GROUP.id)).backoff_failures == 0
    gate.open()
    assert (await run).outcome == "done"
    assert second.phases() == []
    # The second process sees the new state at once: summary, and its cached history reloaded.
    assert (await second.rt.store.get_meta(SUMMARY_NAMESPACE, GROUP.id) or {}).get("text")
    after = await second.rt.store.get_history(GROUP.id)
    assert len(after) < len(before) + 2
    assert after == await first.rt.store.get_history(GROUP.id)
    assert (await second.rt.compression.compress(GROUP.id)).outcome in ("done", "nothing")  # free again


async def test_back_off_and_usage_carry_over_to_the_process_taking_over(url: str, make: Make) -> None:
    first = await make(location=url, memsum_history_limit=2)
    first.model.summary_default = FAIL
    await seed(first.rt, 3)
    assert await first.rt.agent.run_turn(GROUP.id, entry=IN_GROUP) == "replied"  # due: fails
    await settle(first.rt)
    assert (await first.rt.compression.status(GROUP.id)).backoff_failures == 1
    second = await make(location=url, memsum_history_limit=2)
    status = await second.rt.compression.status(GROUP.id)
    assert status.backoff_failures == 1  # R-BACK-3 goes on in the process taking over
    assert status.usage is not None  # the first process's latest turn
    # A later failure there counts on from the first's, and the first sees it.
    second.model.summary_default = FAIL
    for _ in range(2):  # two judged turns: the wait after the first failure
        await second.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
        await settle(second.rt)
    assert (await second.rt.compression.status(GROUP.id)).backoff_failures == 2
    assert (await first.rt.compression.status(GROUP.id)).backoff_failures == 2


async def test_settings_written_by_one_process_are_read_by_the_other(url: str, make: Make) -> None:
    first, second = await make(location=url), await make(location=url)
    assert (await second.rt.settings.effective("history_limit", GROUP.id)).value == 0  # read (and kept)
    await first.rt.settings.set("history_limit", "session", GROUP.id, 40)
    resolved = await second.rt.settings.effective("history_limit", GROUP.id)
    assert (resolved.value, resolved.layer) == (40, "session")
    await first.rt.settings.reset("history_limit", "session", GROUP.id)
    assert (await second.rt.settings.effective("history_limit", GROUP.id)).value == 0
