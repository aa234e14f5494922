"""Outside audit 12 (dp): SQLite and PostgreSQL must behave the same (issue 13), seeded and
differential.

An owner who moves the memory from the SQLite file to PostgreSQL (MEMSUM_DATABASE_URL, and
the migration tool) expects the bot to go on exactly as before. A seeded driver runs one
random sequence of library calls (`nonebot_plugin_memsum.api`: messages from several
speakers with cards, turns, compressions, clears of the context and of the summary,
deletions, child sessions, withdrawals, settings of compress_at / history_limit / mode,
searches with speakers, times and neighbours, usage queries) **sequentially** on a runtime
over a real SQLite file and on one over a fresh PostgreSQL database (tests/fakes/pgserver.py),
each against its own scripted OpenAI-compatible server (tests/fakes/llm_server.py) scripted
from the same seed: small windows so compressions are frequent, some failing model calls,
some recall tool calls. The clock is the same fake one on both sides (one instant per step).

After every step it compares everything observable, normalised only for row ids (messages
are named by their place in the session's storage order): active and archived history
(content, speaker, order, token estimates, withdrawn marks), the summary record, status,
the compression line, settings, compression records, the requests each model server
received (identical), the answers and outcomes, the errors (type and Chinese text), search
hits with their order, scores and neighbours, and the usage figures the commands and the
web page read (ledger totals, per place, per day, series, overview). Halfway it migrates
the SQLite file to a fresh PostgreSQL database (store/migrate.py) and goes on there: the
migrated store must keep matching.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.store import SearchQuery, open_store
from nonebot_plugin_memsum.types import Message, SessionRecord

GROUP = SessionRecord(
    id="onebot:group:6001", platform="onebot", kind="group", place="group:6001", room_class="room"
)
T0 = 1_780_000_000.0


# ---- regressions the differential driver found, shrunk ----------------------------------------
async def _both(tmp_path: Path, pg_url: str, messages: list[Message], query: SearchQuery) -> list[list[Any]]:
    """The same messages stored in a SQLite file and in PostgreSQL; each one's answer to `query`
    as (content, score) in order."""
    answers = []
    for location in (tmp_path / "both.db", pg_url):
        store = await open_store(location)
        try:
            await store.save_session(GROUP)
            for m in messages:
                await store.append(GROUP.id, m)
            answers.append([(h.message.content, h.score) for h in await store.search(query)])
        finally:
            await store.close()
    return answers


async def test_recall_ranks_full_width_letters_alike_on_sqlite_and_postgresql(
    tmp_path: Path, pg_url: str
) -> None:
    # A member pastes a code in full-width letters (a Chinese input method's 全角), another
    # repeats it in plain letters. Both engines find both (the index takes NFKC), but SQLite's
    # ranking counts the words in the text as SQLite's lower() sees it (ASCII letters, no NFKC)
    # while PostgreSQL counted them after NFKC: 「ＡＢＣ」 counted there, not here, so /回忆 and
    # the recall tool put the two messages in a different order after the move.
    pad = "，" + "好" * 60
    messages = [
        Message(role="user", content=f"[阿明(20001)] ＡＢＣ abc ＡＢＣ 测试跑通了{pad}", name="20001", ts=T0),
        Message(role="user", content=f"[小红(20002)] abc 和 abc 都对{pad}", name="20002", ts=T0 + 1),
    ]
    sqlite, postgres = await _both(tmp_path, pg_url, messages, SearchQuery(GROUP.id, "abc"))
    assert [c[12:14] for c, _ in sqlite] == ["ab", "ＡＢ"]
    assert postgres == sqlite


async def test_recall_scores_a_label_and_its_spaces_alike_on_sqlite_and_postgresql(
    tmp_path: Path, pg_url: str
) -> None:
    # The ranking's length prior counts the text without its label: SQLite drops every space
    # after the label, PostgreSQL dropped one; a short message scored differently.
    messages = [Message(role="user", content="[阿明(20001)]   爬山 周六", name="20001", ts=T0)]
    sqlite, postgres = await _both(tmp_path, pg_url, messages, SearchQuery(GROUP.id, "爬山"))
    assert sqlite == [("[阿明(20001)]   爬山 周六", pytest.approx(5 / 60))]  # 「爬山 周六」
    assert postgres == sqlite
