"""LLM client benchmark: TCP connections, time and CPU per streamed call against a local server.

    python bench/bench_llm_client.py [--calls 50] [--history 300] [--events 200]

The real client against the tests' scripted server on 127.0.0.1 (kept-alive connections,
as a real API keeps them). Three runs:

- recorded: each reply one of the recorded provider transcripts of tests/fixtures/providers/
  in turn, a one-message request;
- long request: a `--history`-message request (a busy group's prompt) answered in a few events;
- token stream: a short request answered in `--events` events of one or two characters, as a
  real provider streams a reply token by token.

Each prints how many TCP connections the calls opened (one, when each stream is read to its
end and its connection goes back to the pool; one per call otherwise, which in production is
a TLS handshake per message), the median and p99 time per call, and the client's CPU per call
(the event loop thread's CPU time: the server runs in threads of its own). Figures depend on
the machine and its load: for comparing changes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nonebot

nonebot.init()

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm import LLMClient
from tests.fakes.llm_server import Reply, ScriptedLLM, transcript

STREAMS = [
    "openai_stream_usage.sse",
    "deepseek_chat_stream.sse",
    "deepseek_reasoner_stream.sse",
    "moonshot_stream_usage.sse",
    "llamacpp_no_done.sse",
    "done_without_finish_reason.sse",
    "openrouter_stream_reasoning.sse",
    "ollama_think_stream.sse",
]


def _history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "你是群里的助手。" * 20}]
    for i in range(n):
        if i % 5 == 4:
            out.append({"role": "assistant", "content": f"好的，第 {i} 条我记下了，周末一起去爬山。"})
        else:
            text = f"[成员{i % 7}({20000 + i % 7})] 今天天气不错 #{i}，下午去爬山吧"
            out.append({"role": "user", "content": text})
    return out


async def _calls(name: str, calls: int, reply: Any, messages: list[dict[str, Any]]) -> None:
    with ScriptedLLM() as llm:
        llm.on_request(reply(llm))
        model = ModelConfig(**llm.model_config())
        client = LLMClient(timeout=30)
        times: list[float] = []
        cpu: list[float] = []
        try:
            for _ in range(calls):
                start, cpu_start = time.perf_counter(), time.thread_time()
                await client.chat(model, messages, purpose="bench")
                cpu.append(time.thread_time() - cpu_start)
                times.append(time.perf_counter() - start)
        finally:
            await client.aclose()
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(  # noqa: T201
            f"{name}: {calls} streamed calls, {llm.connections} TCP connection(s);"
            f" per call: median {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms,"
            f" CPU median {statistics.median(cpu) * 1000:.3f} ms"
        )


async def run(calls: int, history: int, events: int) -> None:
    replies = [Reply(raw=transcript(name)) for name in STREAMS]
    await _calls(
        "recorded",
        calls,
        lambda llm: lambda _: replies[(len(llm.requests) - 1) % len(replies)],
        [{"role": "user", "content": "今晚打游戏吗"}],
    )
    await _calls(
        f"long request ({history} messages)",
        calls,
        lambda llm: lambda _: Reply("好的，收到。", chunk_chars=4),
        _history(history),
    )
    text = "好的，我们下午三点在山脚下集合，记得带水和外套。" * (events // 20 + 1)
    await _calls(
        f"token stream ({events} events)",
        calls,
        lambda llm: lambda _: Reply(text[: events * 2], chunk_chars=2),
        [{"role": "user", "content": "今晚打游戏吗"}],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--history", type=int, default=300, help="messages in the long request")
    parser.add_argument("--events", type=int, default=200, help="events in the token stream")
    args = parser.parse_args()
    asyncio.run(run(args.calls, args.history, args.events))


if __name__ == "__main__":
    main()
