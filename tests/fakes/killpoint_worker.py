"""A fixed workload through `nonebot_plugin_memsum.api`, killed right before its Nth database
write, for the systematic crash sweep (tests/test_audit12_ck.py).

    python tests/fakes/killpoint_worker.py BASE_URL

A zygote: it imports and initialises everything once, then reads lines `N DB OUT` on stdin;
for each it forks a child that runs the workload on the SQLite file DB, reporting on the file
OUT, and `os._exit(137)`s (what a SIGKILL leaves: nothing flushed, nothing closed) from the
connection's trace callback right before the Nth write statement (INSERT / UPDATE / DELETE /
REPLACE / COMMIT) runs in SQLite; N = 0: no kill, the workload runs to its end and each write
is reported (`w N SQL`), so the parent knows how many points there are and what each is.
The zygote answers `done N STATUS` once the child is gone. Forked before any thread starts
(start-up loads the tokenizer in the zygote's only thread), so each point costs no
interpreter start. Nothing is added to the product: the count wraps the store's sqlite3
connection from outside, in the child only.

Lines on OUT, each flushed at once, state only what the api call returned:

    recorded <session id> <content>        (api.record returned)
    set                                    (the session's daily cap is stored)
    sent <session id> <text>               (inside the reply function)
    turn <outcome>
    compressing <session id>               (api.compress is called)
    compressed <session id> <archived> <kept>
    cleared <session id>
    quiet                                  (place group:3 is 仅记录; its session compresses early)
    deleted <session id>
    flushed                                (the usage ledger is written)
    end
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import nonebot

if TYPE_CHECKING:
    from nonebot_plugin_memsum.runtime import Runtime

A = "killpoint:group"
B = "killpoint:clear"
C = "killpoint:record"
D = "killpoint:child"
PERSONA = "你是崩溃点测试里的助手。"
SUMMARY = "【保留原文】1\n## 最近在聊什么\n大家在说话\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "COMMIT")


def is_write(sql: str) -> bool:
    return sql.lstrip().split(" ", 1)[0].upper() in WRITES


def config(model: str) -> dict[str, object]:
    return {
        "memsum_models": [json.loads(model)],
        "memsum_persona": PERSONA,
        "memsum_summary_budget_ratio": 0.5,
        "memsum_compress_at": 0,  # only the workload's own compressions, in order
    }


async def workload(model: str, db: Path, kill_at: int, out: TextIO) -> None:
    from nonebot_plugin_memsum import api, runtime
    from nonebot_plugin_memsum.config import Config

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    rt = await runtime.start(Config.model_validate(config(model)), db, [], set())
    written = 0

    def trace(sql: str) -> None:
        nonlocal written
        if not is_write(sql):
            return
        written += 1
        if written == kill_at:
            os._exit(137)  # before SQLite runs it: a SIGKILL at this instant
        if kill_at == 0:
            say(f"w {written} {' '.join(sql.split())[:90]}")

    rt.store._db._raw._conn.set_trace_callback(trace)  # type: ignore[union-attr]

    async def reply(text: str) -> None:
        say(f"sent {A} {text}")

    group = api.SessionRecord(id=A, platform="onebot", kind="group", place="group:1", room_class="room")
    for n in range(4):
        content = f"[成员{n}(2000{n})] 第{n}句话，说点什么"
        await api.record(
            group,
            api.Message(role="user", content=content, name=f"2000{n}", platform_id=f"p{n}", addressed=n == 3),
        )
        say(f"recorded {A} {content}")
    await rt.settings.set("daily_token_cap", "session", A, 123456)
    say("set")
    say(f"turn {await api.run_turn(A, reply, api.Entry('onebot', 'group'))}")
    await rt.store.flush_ledger()
    say("flushed")
    say(f"compressing {A}")
    done = await api.compress(A)
    say(f"compressed {A} {done.archived} {done.kept_messages}")
    for n in range(4, 6):
        content = f"[成员{n}(2000{n})] 压缩后的第{n}句话"
        await api.record(
            group, api.Message(role="user", content=content, name=f"2000{n}", platform_id=f"p{n}")
        )
        say(f"recorded {A} {content}")
    other = await api.internal_session(B)
    for n in range(3):
        content = f"[系统(0)] 要清除的第{n}条"
        await api.record(other, api.Message(role="user", content=content))
        say(f"recorded {B} {content}")
    say(f"compressing {B}")
    done = await api.compress(B)
    say(f"compressed {B} {done.archived} {done.kept_messages}")
    await api.clear(B, "context")
    say(f"cleared {B}")
    # A 仅记录 place: api.record judges the history, a background compression runs (marked due).
    quiet = api.SessionRecord(id=C, platform="onebot", kind="group", place="group:3", room_class="room")
    await rt.settings.set("mode", "place", "onebot:group:3", "record")
    await rt.settings.set("compress_at", "session", C, 0.001)
    say("quiet")
    for n in range(3):
        content = f"[成员{n}(3000{n})] 只记录的第{n}句话，" + "很长的话" * 20
        await api.record(
            quiet, api.Message(role="user", content=content, name=f"3000{n}", platform_id=f"q{n}")
        )
        say(f"recorded {C} {content}")
        await settled(rt)
    # A child session made and deleted.
    child = await api.child_session(A, D)
    await api.record(child, api.Message(role="user", content="[系统(0)] 子会话的一句"))
    say(f"recorded {D} [系统(0)] 子会话的一句")
    await api.delete_session(D)
    say(f"deleted {D}")
    await runtime.stop()  # a clean stop writes what waits in memory (the `sent` mark, usage)
    say("end")


async def settled(rt: Runtime) -> None:
    """The background compression a record started has ended: one thing at a time, so the
    writes come in the same order in every run."""
    for _ in range(2000):
        if not rt.compression._runs and not rt.compression._queue:
            return
        await asyncio.sleep(0.005)
    raise TimeoutError("the background compression did not end")


def zygote(model: str) -> None:
    from nonebot_plugin_memsum.llm.tokens import load_encoding

    load_encoding()  # before any fork: the children find it loaded and start no thread for it
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        n, db, out = line.split()
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                with open(out, "w", encoding="utf-8") as f:
                    asyncio.run(workload(model, Path(db), int(n), f))
            except BaseException as err:  # reported to the parent as a failed point
                sys.stderr.write(f"point {n}: {type(err).__name__}: {err}\n")
                status = 1
            os._exit(status)
        _, code = os.waitpid(pid, 0)
        sys.stdout.write(f"done {n} {os.waitstatus_to_exitcode(code)}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    from nonebot.log import logger

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    here = Path(os.environ.get("KILLPOINT_DIR", REPO / ".killpoint"))
    nonebot.init(
        driver="~none",
        localstore_data_dir=str(here / "data"),
        localstore_cache_dir=str(here / "cache"),
        localstore_config_dir=str(here / "config"),
    )
    zygote(sys.argv[1])
