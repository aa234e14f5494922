"""A process that records, answers, backfills and compresses forever, for the crash test to
SIGKILL at any instant.

    python tests/fakes/crash_worker.py DB SLOT [settle]

DB: a SQLite file, or a `postgresql://` URL. It builds a runtime on DB whose model is a
ScriptedLLM served by this process, resumes what the last run left (interrupted
compressions, unanswered questions: what start-up does), then keeps several sessions of
its own busy at once (ids from SLOT, so workers of different slots may share DB).
Each session works in order, forever:
- members say a few things (some with a platform message id, some asking the bot);
- a backfill: a batch fetched "again" from the platform, half of it already stored,
  recorded through the same store-once path as a reconnect's backfill;
- a turn for the questions not yet answered, whose reply marks itself before it is sent;
- a compression.
Lines on stdout, each flushed at once, state only what has committed:

    ready
    appended <session id> <content>
    sent <session id> <upto>            (inside the reply function: the mark is committed)
    compressed <session id> <archived> <kept>
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import nonebot

if TYPE_CHECKING:
    from nonebot_plugin_memsum.runtime import Runtime
    from nonebot_plugin_memsum.types import Message, SessionRecord

SESSIONS = 3
SUMMARY = "【保留原文】1、2\n## 最近在聊什么\n大家在说话\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
PERSONA = "你是崩溃测试里的助手。"


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def record_of(slot: int, session_no: int) -> SessionRecord:
    from nonebot_plugin_memsum.types import SessionRecord

    group = slot * 100 + session_no
    return SessionRecord(
        id=f"onebot:group:{group}", platform="onebot", kind="group", place=f"group:{group}", room_class="room"
    )


def replier(session_id: str, upto: list[int | None]):
    async def reply(text: str) -> None:
        # The turn marked its answer (committed) before calling this.
        say(f"sent {session_id} {upto[0]}")

    return reply


async def answer_pending(rt: Runtime, session_id: str) -> None:
    """A turn for the session's unanswered questions, as start-up and a burst do it."""
    from nonebot_plugin_memsum.agent.turn import Entry

    pending = [m for sid, m in await rt.store.pending_questions(0, prefix=session_id) if sid == session_id]
    if not pending:
        return
    upto: list[int | None] = [None]
    history = await rt.store.get_history(session_id)
    upto[0] = history[-1].id if history else None
    await rt.agent.run_turn(session_id, replier(session_id, upto), Entry("onebot", "group"))


async def churn(rt: Runtime, slot: int, session_no: int, token: str) -> None:
    from nonebot_plugin_memsum import clock
    from nonebot_plugin_memsum.compression.request import CompressionError
    from nonebot_plugin_memsum.types import Message

    record = record_of(slot, session_no)
    rng = random.Random(f"{token}-{session_no}")
    n = 0
    fetched: list[Message] = []
    while True:
        for _ in range(rng.randint(2, 8)):
            content = f"[用户{n}(2{n:04d})] {token}-{record.id}-{n} " + "说点什么" * rng.randint(1, 30)
            msg = Message(
                role="user",
                content=content,
                ts=clock.now(),
                platform_id=f"{token}-{n}" if rng.random() < 0.7 else None,
                addressed=rng.random() < 0.3,
            )
            if await rt.agent.record_once(record, msg) is not None:
                say(f"appended {record.id} {content}")
                if msg.platform_id is not None:
                    fetched.append(msg)
            n += 1
        # A backfill: the platform hands back some of what is stored plus what is not.
        batch = rng.sample(fetched, min(len(fetched), 3))
        for _ in range(rng.randint(1, 4)):
            content = f"[用户{n}(2{n:04d})] {token}-{record.id}-{n} 补录"
            batch.append(Message(role="user", content=content, ts=clock.now(), platform_id=f"{token}-{n}"))
            n += 1
        for msg in batch:
            if await rt.agent.record_once(record, msg) is not None:
                say(f"appended {record.id} {msg.content}")
        await answer_pending(rt, record.id)
        try:
            result = await rt.compression.compress(record.id)
        except CompressionError as err:
            say(f"failed {record.id} {err.reason}")
            continue
        say(f"compressed {record.id} {result.archived} {result.kept_messages}")


async def resume(rt: Runtime, slot: int) -> None:
    """What start-up does: interrupted compressions run again; unanswered questions get a turn."""
    from nonebot_plugin_memsum.compression.service import DUE_NAMESPACE

    # Only its own sessions: the other worker shares the file (one bot process never does).
    await rt.compression.resume(prefix=f"onebot:group:{slot}")
    for _ in range(600):
        marks = await rt.store.list_meta(DUE_NAMESPACE)
        if not any(sid.startswith(f"onebot:group:{slot}") for sid in marks):
            break
        await asyncio.sleep(0.05)
    for i in range(1, SESSIONS + 1):
        await answer_pending(rt, record_of(slot, i).id)


async def main(db: Path | str, slot: int, settle: bool) -> None:
    from nonebot_plugin_memsum import runtime
    from nonebot_plugin_memsum.config import Config
    from tests.fakes.llm_server import Reply, ScriptedLLM

    llm = ScriptedLLM().start()
    # Keep two originals when they are offered (the first numbers of each request).
    llm.default = Reply(SUMMARY)
    llm.on_request(lambda body: Reply("好的") if body["messages"][0]["content"] == PERSONA else None)
    config = Config.model_validate(
        {
            "memsum_models": [llm.model_config()],
            "memsum_summary_budget_ratio": 0.5,
            "memsum_persona": PERSONA,
            "memsum_compress_at": 0,  # only this worker's own compressions, in order
        }
    )
    rt = await runtime.build(config, db, [], set())
    await resume(rt, slot)
    token = uuid.uuid4().hex[:8]
    say("ready")
    if settle:  # only what start-up does, then a clean exit
        await runtime.close(rt)
        llm.stop()
        return
    await asyncio.gather(*(churn(rt, slot, i, token) for i in range(1, SESSIONS + 1)))


if __name__ == "__main__":
    from nonebot.log import logger

    # NoneBot logs to stdout, which is for the parent's facts only.
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    url = sys.argv[1].startswith("postgresql://")
    # localstore's folders beside the file; for a database, in the temp dir (nothing is kept there).
    folder = (
        Path(tempfile.gettempdir()) / "memsum-crash-worker" if url else Path(sys.argv[1]).resolve().parent
    )
    # The package needs NoneBot initialised; the plugin's own runtime is never started.
    nonebot.init(
        driver="~none",
        localstore_data_dir=str(folder / "data"),
        localstore_cache_dir=str(folder / "cache"),
        localstore_config_dir=str(folder / "config"),
    )
    asyncio.run(main(sys.argv[1] if url else Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["settle"]))
