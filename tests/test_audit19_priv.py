"""Outside audit (audit19-priv): private chats as the real OneBot implementations deliver them.

Group temporary sessions (临时会话) in each implementation's shape, the owner's words from
another client on the bot's account, live and fetched on reconnect, the owner's commands in
private, and the backfill of a temp-session partner the implementation will not give the
history of. bot.py runs as a real process with the OneBot simulator on its reverse
WebSocket; what the bot remembered is read from its SQLite file, what it sent from the
simulator's calls. Each payload cites the implementation source it is built from.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, away, back, group_sid, private_sid, rows, until, wait_rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import OneBotSim, text

PERSONA = "你是审计十九私聊里的助手小记。"
ANSWER = "小记私聊收到"


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def env(llm: ScriptedLLM) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}


@pytest.fixture(scope="module")
async def answering(llm: ScriptedLLM) -> AsyncIterator[ScriptedLLM]:
    llm.reset()
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    yield llm
    llm.reset()


# ---- 2b. the owner's words fetched on reconnect ------------------------------------------
# The simulator answers the history actions as NapCat does (OneBotSim._history cites it): the
# account's own messages with `post_type: "message_sent"` and, in a private chat, no
# `target_id` (NapCat sets it only on live events, packages/napcat-onebot/index.ts `handleMsg`).
async def test_what_the_owner_typed_while_the_bot_was_down_is_fetched_as_the_bots_words_where_said(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    peer, group = 20391, 79201
    sid = private_sid(peer)
    async with BotProcess(tmp_path / "bot", env=env(answering)) as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        try:
            await back(bot, sim, restart=False, backfill=False)
            await sim.private_message(peer, "明天几点出发", nickname="阿伟")
            await sim.group_message(group, 20392, "周末谁组织", nickname="群友")
            await wait_rows(bot, sid, 2)
            await wait_rows(bot, group_sid(group), 1)
            await away(bot, sim)
            # The owner answers on the phone, on the bot's account.
            sim._store("private", sim._self_sender(), [text("八点，别迟到")], None, user_id=peer)
            await sim.group_message(group, SELF_ID, "我来组织")
            await back(bot, sim)
            await sim.private_message(peer, "好的", nickname="阿伟")

            async def answered() -> bool:
                found = await rows(bot, sid)
                return len(found) >= 4 and found[-1] == ("assistant", ANSWER)

            await until(answered, "the answer to 好的")
            await asyncio.sleep(0.8)
            stored = await rows(bot, sid)
            in_group = await rows(bot, group_sid(group))
            alone = await rows(bot, private_sid(SELF_ID))
        finally:
            await sim.close()
    # Stored once, as the bot's, where it was said; the owner's words ask nothing.
    assert stored == [
        ("user", "[阿伟(20391)] 明天几点出发"),
        ("assistant", ANSWER),
        ("assistant", "八点，别迟到"),
        ("user", "[阿伟(20391)] 好的"),
        ("assistant", ANSWER),
    ]
    assert in_group == [("user", "[群友(20392)] 周末谁组织"), ("assistant", "我来组织")]
    assert alone == []  # never a chat of the bot with itself
