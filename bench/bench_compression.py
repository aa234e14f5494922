"""Compression benchmark: the engine's own time to compress a long session, the model excluded.

    python bench/bench_compression.py [--messages 5000 --repeat 5 --window 32000]

One group session with `--messages` active messages (Chinese chat with `[昵称(ID)]`
labels, assistant answers, a few long pastes and tool calls) in a real SQLite file, then
`CompressionService.compress`: reading the history, units and rendering, the budget, the
request plan (numbering, chunking), parsing each reply, the one-transaction commit. The
model is a stub client that answers each summary request at once with a fixed summary,
so the time is the plugin's. Printed: wall and CPU time per compression (median of
`--repeat` fresh sessions), requests per compression, for both capacity rules.
Figures depend on the machine and its load: compare runs made together.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nonebot

nonebot.init(log_level="ERROR")

from nonebot.log import logger

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.llm import ChatResult, LLMClient, Usage
from nonebot_plugin_memsum.types import Message, SessionRecord, ToolCall

logger.remove()
_WORDS = (
    "今天 周末 爬山 吃饭 代码 测试 部署 数据库 会议 好的 哈哈 明天 一起 问题 解决 谢谢 😂 [doge] OK".split()
)
SUMMARY = "【保留原文】无\n## 最近在聊什么\n大家在聊爬山。\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


class InstantClient(LLMClient):
    """Answers every summary request at once; counts them."""

    requests = 0

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
        InstantClient.requests += 1
        return ChatResult(SUMMARY, (), "stop", Usage(1000, 50), model.id)


def _history(rng: random.Random, n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        roll = rng.random()
        text = "".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 25)))
        if roll < 0.005:
            text = "\n".join(f'  File "bot.py", line {j}, in handle: {text}' for j in range(40))
            out.append(
                Message(role="user", content=f"[阿强({10000 + i % 12})] {text}", name=str(10000 + i % 12))
            )
        elif roll < 0.01:
            call = ToolCall(f"call_{i}", "todo_write", '{"items": [{"title": "爬山", "status": "pending"}]}')
            out.append(Message(role="assistant", content="", tool_calls=(call,)))
            out.append(Message(role="tool", content="待办已更新", name="todo_write", tool_call_id=call.id))
        elif roll < 0.15:
            out.append(Message(role="assistant", content=text))
        else:
            out.append(Message(role="user", content=f"[昵称{i % 12}({10000 + i % 12})] {text}", name=str(i)))
    return out[:n]


async def _run(
    messages: int, repeat: int, window: int, rule: str, profile: cProfile.Profile | None = None
) -> tuple[list[float], list[float], int]:
    tmp = Path(tempfile.mkdtemp(prefix="memsum-bench-compress-"))
    model = ModelConfig.model_validate(
        {"id": "bench/stub", "base_url": "http://127.0.0.1:9/v1", "context_window": window}
    )
    config = Config(memsum_models=[model], memsum_capacity=rule)  # type: ignore[arg-type]
    rt = await runtime.build(config, tmp / "memsum.db", [], set())
    rt.compression.client = InstantClient()
    walls: list[float] = []
    cpus: list[float] = []
    InstantClient.requests = 0
    try:
        for r in range(repeat):
            record = SessionRecord(
                id=f"onebot:1:group:{r}",
                platform="onebot",
                kind="group",
                place=f"group:{r}",
                room_class="room",
            )
            for m in _history(random.Random(r), messages):
                await rt.agent.record(record, m)
            # The search index catches up first: the background indexer would otherwise cut
            # these 5,000 messages into terms (in a thread of this process) while the
            # compression is timed, and its CPU is no part of the compression's.
            while await rt.store.index_search() is not None:
                pass
            wall, cpu = time.perf_counter(), time.process_time()
            if profile is not None:
                profile.enable()
            await rt.compression.compress(record.id)
            if profile is not None:
                profile.disable()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    finally:
        await runtime.close(rt)
    return walls, cpus, InstantClient.requests // repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--window", type=int, default=32000)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the measured-rule runs")
    args = ap.parse_args()
    for rule in ("measured", "spec"):
        profile = cProfile.Profile() if args.profile and rule == "measured" else None
        walls, cpus, requests = asyncio.run(_run(args.messages, args.repeat, args.window, rule, profile))
        print(  # noqa: T201
            f"compress {args.messages} messages, W={args.window}, capacity {rule:<8}: "
            f"median {statistics.median(walls) * 1000:.1f} ms wall, "
            f"{statistics.median(cpus) * 1000:.1f} ms CPU, "
            f"{requests} requests"
        )
        if profile is not None:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
