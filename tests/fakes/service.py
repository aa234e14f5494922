"""What the in-process compression service tests share: the scripted summary and chat
models, the private runtime (`Env`; the `make` and `env` fixtures are in
tests/conftest.py), and history helpers."""

from __future__ import annotations

import asyncio
import random
import re
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nonebot_plugin_memsum.agent.events import (
    CompressionProgress,
    Outcome,
    UsageEvent,
)
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.compression.service import (
    CompressionResult,
)
from nonebot_plugin_memsum.compression.units import build_units
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM

OWNER = "10001"
CHAT_MODEL = "test/chat"
SUMMARY_MODEL = "test/sum"
SUMMARISER = "你是对话摘要员"
CHAT_SUMMARY = "## 最近在聊什么\n甲(1) 约大家周末爬山\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
NOTHING_KEPT = f"【保留原文】无\n{CHAT_SUMMARY}"
WORK_SUMMARY = "## 目标\n写周报\n## 做过的决定\n无\n## 改过的文件\n无\n## 未完成的事\n无"
OLD_SUMMARY = {
    "text": "## 最近在聊什么\n上周的旧话题\n## 谁有问题没回应\n无\n## 关键原话要点\n无",
    "template": "chat",
    "time": 1.0,
    "kept_messages": 0,
}
GROUP = SessionRecord(
    id="onebot:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
)
IN_GROUP = Entry("onebot", "group")
PRIVATE_OWNER = SessionRecord(
    id="onebot:private:10001", platform="onebot", kind="private", peer=OWNER, room_class="direct"
)
_CJK = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面"
    "而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性"
)


# ---- the scripted model ---------------------------------------------------------------
def usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5}


def is_summary(body: dict[str, Any]) -> bool:
    return str(body["messages"][0]["content"]).startswith(SUMMARISER)


def system_of(body: dict[str, Any]) -> str:
    return body["messages"][0]["content"]


def user_of(body: dict[str, Any]) -> str:
    return body["messages"][1]["content"]


def conversation_of(body: dict[str, Any]) -> str:
    return user_of(body).split("〔对话记录开始〕\n", 1)[1].split("\n〔对话记录结束〕", 1)[0]


def existing_summary_of(body: dict[str, Any]) -> str:
    text = user_of(body)
    if "〔已有摘要开始〕\n" not in text:
        return ""
    return text.split("〔已有摘要开始〕\n", 1)[1].split("\n〔已有摘要结束〕", 1)[0]


def offered(body: dict[str, Any]) -> dict[int, str]:
    """The numbered units of a summary request: number → rendered text without the annotation."""
    out: dict[int, str] = {}
    for part in conversation_of(body).split("\n\n"):
        m = re.match(r"#(\d+)〔约 \d+ token〕", part)
        if m:
            out[int(m.group(1))] = part[m.end() :]
    return out


Script = Reply | Gate | Callable[[dict[str, Any]], Reply]


class Model:
    """What the server answers, by kind of request; each kind has its queue and default."""

    def __init__(self, llm: ScriptedLLM) -> None:
        self.llm = llm
        self.summary: deque[Script] = deque()
        self.chat: deque[Script] = deque()
        self.summary_default: Script = Reply(NOTHING_KEPT)
        self.chat_default: Script = Reply("好的", usage=usage(100))
        self.gates: list[Gate] = []
        llm.on_request(self._answer)

    def gate(self, reply: Reply | Callable[[dict[str, Any]], Reply]) -> Gate:
        g = Gate(reply)
        self.gates.append(g)
        return g

    def hold_summary(self, reply: Reply | Callable[[dict[str, Any]], Reply] | None = None) -> Gate:
        """The next summary request waits at a gate, then gets `reply` (by default: a summary
        keeping nothing)."""
        g = self.gate(reply or Reply(NOTHING_KEPT))
        self.summary.append(g)
        return g

    def _answer(self, body: dict[str, Any]) -> Reply | None:
        summary = is_summary(body)
        queue = self.summary if summary else self.chat
        try:
            script = queue.popleft()
        except IndexError:
            script = self.summary_default if summary else self.chat_default
        if isinstance(script, Reply):
            return script
        return script(body)

    def summary_requests(self) -> list[dict[str, Any]]:
        return [b for b in self.llm.requests if is_summary(b)]

    def chat_requests(self) -> list[dict[str, Any]]:
        return [b for b in self.llm.requests if not is_summary(b)]


def keeping(*needles: str, summary: str = CHAT_SUMMARY) -> Callable[[dict[str, Any]], Reply]:
    """A summary reply that keeps the offered units whose text contains one of `needles`."""

    def answer(body: dict[str, Any]) -> Reply:
        numbers = [str(n) for n, text in offered(body).items() if any(x in text for x in needles)]
        return Reply(f"【保留原文】{'、'.join(numbers) or '无'}\n{summary}")

    return answer


# ---- the runtime ------------------------------------------------------------------------
@dataclass
class Env:
    rt: Runtime
    model: Model
    progress: list[CompressionProgress]
    warnings: list[str]

    def phases(self, session_id: str = GROUP.id) -> list[tuple[str, str | None]]:
        return [(p.phase, p.reason) for p in self.progress if p.session_id == session_id]

    def failure_warnings(self, session_id: str = GROUP.id) -> list[str]:
        return [w for w in self.warnings if f"compression of {session_id} failed" in w]


class Make(Protocol):
    def __call__(
        self,
        *,
        chat: dict[str, Any] | None = None,
        summary: dict[str, Any] | None = None,
        models: Callable[[ScriptedLLM], list[dict[str, Any]]] | None = None,
        location: Path | str | None = None,
        **config: Any,
    ) -> Awaitable[Env]: ...


# ---- history helpers ----------------------------------------------------------------------
def talk(i: int, size: int = 12) -> str:
    """A unique group line of about `size` characters after its label."""
    rng = random.Random(i)
    return f"[用户{i}(2{i:04d})] 第{i}句：" + "".join(rng.choice(_CJK) for _ in range(size))


async def seed(
    rt: Runtime, n: int, *, record: SessionRecord = GROUP, start: int = 0, size: int = 12
) -> list[Message]:
    return [
        await rt.agent.record(record, Message(role="user", content=talk(i, size), ts=1000.0 + i))
        for i in range(start, start + n)
    ]


async def settle(rt: Runtime) -> None:
    """Wait for the background compressions that turn ends started."""
    while tasks := set(rt.compression._background):
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def committing(rt: Runtime, session_id: str = GROUP.id) -> None:
    """The run has its answer and is in the commit (waiting for the turn lock, or writing)."""
    runs = rt.compression._runs
    await until(lambda: session_id in runs and runs[session_id].committing, "the run reached its commit")


async def summary_of(rt: Runtime, session_id: str = GROUP.id) -> dict[str, Any] | None:
    return await rt.store.get_meta(SUMMARY_NAMESPACE, session_id)


def units_tokens(history: Sequence[Message]) -> int:
    """R-BUD-2/4: the text estimate of the rendered units (the span is the whole plain history here)."""
    return sum(estimate_text_tokens(u.text) for u in build_units(history))


def stated(body: dict[str, Any]) -> tuple[int, int]:
    """The budget and keep cap the summariser's system prompt states (R-BUD-7)."""
    m = re.search(r"约 (\d+) tokens（约 (\d+) 个英文字符）", system_of(body))
    assert m is not None, system_of(body)
    assert int(m.group(2)) == 4 * int(m.group(1))  # 4 English characters per token
    cap = re.search(r"保留的原文合计不超过 (\d+) tokens", system_of(body))
    return int(m.group(1)), int(cap.group(1)) if cap else 0


def due_usage(turn_id: str | None) -> UsageEvent:
    """A usage that is due by count (10 messages against a line of 2)."""
    return UsageEvent(
        session_id=GROUP.id,
        turn_id=turn_id,
        platform="onebot",
        platform_type="group",
        model_id=CHAT_MODEL,
        window=32000,
        trim_budget=30976,
        usage=100,
        trimmed=False,
        untrimmed_history=50,
        history_messages=10,
        history_limit=2,
    )


async def held_compression(
    env: Env, reply: Reply | Callable[[dict[str, Any]], Reply] | None = None
) -> tuple[asyncio.Task[CompressionResult], Gate]:
    """A manual compression of the group, once its summary request waits at a gate that
    then answers `reply` (by default: a summary keeping nothing); the run and the gate."""
    gate = env.model.hold_summary(reply)
    run = asyncio.create_task(env.rt.compression.compress(GROUP.id))
    await gate.reached()
    return run, gate


async def held_turn(env: Env, reply: Reply) -> tuple[asyncio.Task[Outcome], Gate]:
    """A turn in the group, once its chat request waits at a gate that then answers `reply`;
    the turn and the gate."""
    gate = env.model.gate(reply)
    env.model.chat.append(gate)
    turn = asyncio.create_task(env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP))
    await gate.reached()
    return turn, gate


async def raw_sql(path: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Write to the database file through a connection of its own (another process would)."""

    def run() -> None:
        with sqlite3.connect(path, timeout=5) as db:
            db.execute(sql, params)
        db.close()

    await asyncio.to_thread(run)
