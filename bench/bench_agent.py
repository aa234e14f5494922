"""Agent benchmark: the chat agent's own overhead per turn, the model's time excluded.

    python bench/bench_agent.py [--messages 1000000 --sessions 1000 --active 200 --turns 2000]

One turn = record a user message (session record + append) and `Agent.run_turn`: the
settings layers, reading the history, the anchors (the compression's summary injection
included), count and hard trimming over token estimates, the usage and turn events
with the compression listening, storing the reply and the ledger entry. The model is
a stub client that answers at once (here only: the tests use the real HTTP client
against a real server).

The file is filled with executemany, as bench/bench_store.py does: sessions
interleaved, the last `--active` messages of each active and the rest archived, as
compression leaves a long-lived bot (`--active 0`: nothing archived, every turn sends
the whole history). Then turns on random sessions (a cold history each time), and on
ten busy sessions (estimates remembered). Figures depend on the machine, its load and
its page cache; they are for comparing changes, not for asserting.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nonebot

# Importing the package wires the plugin into NoneBot, which needs a driver.
nonebot.init()

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import UsageEvent
from nonebot_plugin_memsum.agent.prompt import hard_trim
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.llm import ChatResult, LedgerFn, LLMClient, Usage, estimate_msg_tokens
from nonebot_plugin_memsum.store import search
from nonebot_plugin_memsum.types import Message, ToolCall

_WORDS = "今天 周末 爬山 吃饭 代码 测试 部署 数据库 会议 好的 哈哈 明天 一起 问题 解决 谢谢".split()
_ENTRY = Entry("onebot", "group")


class InstantClient(LLMClient):
    """Answers every call at once with a fixed reply; still feeds the usage ledger."""

    def __init__(self, ledger: LedgerFn) -> None:
        super().__init__()
        self._ledger_fn = ledger

    async def chat(
        self,
        model: ModelConfig,
        messages: Sequence[Mapping[str, Any]],
        *,
        purpose: str,
        session_id: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int | None = None,
        reasoning_effort: str | None = None,
        stream: bool = True,
    ) -> ChatResult:
        await self._ledger_fn(session_id, purpose, model.id, 1000, 5, 0)
        return ChatResult("好的，收到。", (), "stop", Usage(1000, 5), model.id)


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30)))


def _sid(s: int) -> str:
    return f"onebot:10000:group:{s}"


def _report(name: str, value: str) -> None:
    print(f"{name:<52} {value}")  # noqa: T201


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms (n={len(ordered)})"


def _fill(path: Path, messages: int, sessions: int, active: int) -> float:
    """Sessions interleaved in storage order, as in a real bot; the last `active` of each unarchived."""
    rng = random.Random(2)
    owners = [i % sessions for i in range(messages)]
    rng.shuffle(owners)
    base = 1_700_000_000.0
    start = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA cache_size = -262144")
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO sessions (id, platform, kind, place, room_class, created) VALUES (?, ?, ?, ?, ?, ?)",
            [(_sid(s), "onebot", "group", f"group:{s}", "room", base) for s in range(sessions)],
        )
        chunk = 50_000
        for lo in range(0, messages, chunk):
            rows = []
            for i, s in enumerate(owners[lo : lo + chunk]):
                if rng.random() < 0.2:
                    role, content = "assistant", _text(rng)
                else:
                    role, content = "user", f"[昵称{s}({10000 + s})] {_text(rng)}"
                # The estimate the agent stores with every message it records (Message.tokens).
                tokens = estimate_msg_tokens(Message(role=role, content=content))
                rows.append((_sid(s), role, content, base + (lo + i) * 0.37, tokens))
            conn.executemany(
                "INSERT INTO messages (session_id, role, content, ts, tokens) VALUES (?, ?, ?, ?, ?)", rows
            )
        if active < messages // sessions:
            for s in range(sessions):
                conn.execute(
                    "UPDATE messages SET archived = 1 WHERE session_id = ?1 AND id < ("
                    " SELECT id FROM messages WHERE session_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                    (_sid(s), active - 1),
                )
        # The search index as the store keeps it (issue 11): built here, or the background
        # indexer would rebuild a million rows while the turns are timed.
        rows = conn.execute(
            "SELECT id, session_id, role, name, content, event_marker, ts, metadata FROM messages"
        )
        conn.executemany(search.INSERT, search.documents(rows))
        conn.execute("UPDATE search_state SET indexed_upto = (SELECT MAX(id) FROM messages) WHERE id = 1")
        conn.execute("COMMIT")
    finally:
        conn.close()
    return time.perf_counter() - start


async def _turns(
    path: Path, config: Config, label: str, session_ids: list[int], turns: int, rng: random.Random
) -> None:
    """`turns` turns, each on a session drawn from `session_ids`, in one fresh runtime."""
    rt = await runtime.build(config, path, ["小记"], {"10001"})
    rt.agent.client = InstantClient(rt.store.record_usage)
    sent: list[int] = []
    rt.bus.subscribe(UsageEvent, lambda e: sent.append(e.history_messages) if e.turn_id else None)

    async def reply(text: str) -> None:
        pass

    try:
        samples: list[float] = []
        for n in range(turns):
            s = rng.choice(session_ids)
            session = await rt.store.get_session(_sid(s))
            assert session is not None
            msg = Message(role="user", content=f"[昵称{s}({10000 + s})] @小记(10000) {_text(rng)} #{n}")
            start = time.perf_counter()
            await rt.agent.record(session, msg)
            await rt.agent.run_turn(session.id, reply, _ENTRY)
            samples.append(time.perf_counter() - start)
        _report(f"turn overhead, {label}", _ms(samples))
        _report("  active history per turn", f"mean {statistics.mean(sent):,.0f} messages")
    finally:
        await runtime.close(rt)


def _bench_hard_trim(n: int) -> None:
    """Hard trim of a long history, a tenth of it in tool-call groups, down to its last 100."""
    history: list[Message] = []
    for i in range(n):
        if i % 10 == 5:
            history.append(Message(role="assistant", content="", tool_calls=(ToolCall(f"c{i}", "f", "{}"),)))
        elif i % 10 == 6:
            history.append(Message(role="tool", content="ok", tool_call_id=f"c{i - 1}"))
        else:
            history.append(Message(role="user", content=f"[甲(1)] {i}"))
    start = time.perf_counter()
    kept, _ = hard_trim(history, 0, 1000, lambda m: 10)
    _report(f"hard_trim {n:,} messages to {len(kept)}", f"{(time.perf_counter() - start) * 1000:.1f} ms")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--turns", type=int, default=2_000)
    parser.add_argument(
        "--active",
        type=int,
        default=200,
        help="active (unarchived) messages per session, the rest archived as compression leaves it;"
        " 0: nothing archived",
    )
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the random-session turns")
    parser.add_argument(
        "--reuse",
        type=Path,
        help="keep the filled file here (filled the first time) and run on a copy of it: before/after"
        " runs then skip the minutes of the bulk fill",
    )
    args = parser.parse_args()
    per_session = args.messages // args.sessions
    active = min(args.active or per_session, per_session)
    _report("sqlite", sqlite3.sqlite_version)
    _bench_hard_trim(3_000)
    model = ModelConfig(
        id="bench/model", base_url="http://127.0.0.1:9/v1", context_window=128_000, max_output_tokens=8192
    )
    config = Config(memsum_models=[model])
    with tempfile.TemporaryDirectory(prefix="memsum-bench-agent-") as tmp:
        path = Path(tmp) / "agent.db"
        if args.reuse is None or not args.reuse.exists():
            target = args.reuse or path
            rt = await runtime.build(config, target, ["小记"], {"10001"})
            await runtime.close(rt)  # the schema through the real migrations
            elapsed = await asyncio.to_thread(_fill, target, args.messages, args.sessions, active)
            _report(
                f"bulk fill {args.messages:,} messages / {args.sessions:,} sessions",
                f"{elapsed:.1f} s, {active:,} active per session",
            )
        if args.reuse is not None:
            shutil.copyfile(args.reuse, path)
            _report("file", f"a copy of {args.reuse}")
        rng = random.Random(7)
        everyone = list(range(args.sessions))
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        # Every turn on a random session: its history is cold (read and estimated afresh).
        await _turns(path, config, "random sessions", everyone, args.turns, rng)
        if profiler is not None:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        # A few busy groups: what a live bot mostly does; estimates are remembered.
        await _turns(path, config, "10 busy sessions", everyone[:10], args.turns, rng)


if __name__ == "__main__":
    asyncio.run(main())
