"""A process that appends and compresses forever, for the crash test to SIGKILL at any instant.

    python tests/fakes/crash_worker.py DB SLOT

It builds a runtime on DB whose summary model is a ScriptedLLM served by this process,
then keeps several sessions of its own busy at once (ids from SLOT, so workers of
different slots may share DB): each appends a few messages with unique
contents, then compresses, then again, forever. Each session works in order (append,
append, …, compress), so after a commit its active history is the kept originals and
the divider. Lines on stdout, each flushed at once, state only what has committed:

    ready
    appended <session id> <content>
    compressed <session id> <archived> <kept>
"""

from __future__ import annotations

import asyncio
import random
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import nonebot

if TYPE_CHECKING:
    from nonebot_plugin_memsum.runtime import Runtime

SESSIONS = 3


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def churn(rt: Runtime, slot: int, session_no: int, token: str) -> None:
    from nonebot_plugin_memsum import clock
    from nonebot_plugin_memsum.compression.request import CompressionError
    from nonebot_plugin_memsum.types import Message, SessionRecord

    group = slot * 100 + session_no
    record = SessionRecord(
        id=f"onebot:group:{group}", platform="onebot", kind="group", place=f"group:{group}", room_class="room"
    )
    rng = random.Random(f"{token}-{session_no}")
    n = 0
    while True:
        for _ in range(rng.randint(2, 12)):
            content = f"[用户{n}(2{n:04d})] {token}-{group}-{n} " + "说点什么" * rng.randint(1, 30)
            await rt.agent.record(record, Message(role="user", content=content, ts=clock.now()))
            say(f"appended {record.id} {content}")
            n += 1
        try:
            result = await rt.compression.compress(record.id)
        except CompressionError as err:
            say(f"failed {record.id} {err.reason}")
            continue
        say(f"compressed {record.id} {result.archived} {result.kept_messages}")


async def main(db: Path, slot: int) -> None:
    from nonebot_plugin_memsum import runtime
    from nonebot_plugin_memsum.config import Config
    from tests.fakes.llm_server import Reply, ScriptedLLM

    llm = ScriptedLLM().start()
    # Keep two originals when they are offered (the first numbers of each request).
    llm.default = Reply(
        "【保留原文】1、2\n## 最近在聊什么\n大家在说话\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
    )
    config = Config.model_validate(
        {"memsum_models": [llm.model_config()], "memsum_summary_budget_ratio": 0.5}
    )
    rt = await runtime.build(config, db, [], set())
    token = uuid.uuid4().hex[:8]
    say("ready")
    await asyncio.gather(*(churn(rt, slot, i, token) for i in range(1, SESSIONS + 1)))


if __name__ == "__main__":
    from nonebot.log import logger

    # NoneBot logs to stdout, which is for the parent's facts only.
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    folder = Path(sys.argv[1]).resolve().parent
    # The package needs NoneBot initialised; the plugin's own runtime is never started.
    nonebot.init(
        driver="~none",
        localstore_data_dir=str(folder / "data"),
        localstore_cache_dir=str(folder / "cache"),
        localstore_config_dir=str(folder / "config"),
    )
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
