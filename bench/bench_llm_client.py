"""LLM client benchmark: TCP connections and time per streamed call against a local server.

    python bench/bench_llm_client.py [--calls 50]

The real client against the tests' scripted server on 127.0.0.1 (kept-alive connections,
as a real API keeps them), each reply one of the recorded provider transcripts of
tests/fixtures/providers/ in turn. It prints how many TCP connections the calls opened
(one, when each stream is read to its end and its connection goes back to the pool; one
per call otherwise, which in production is a TLS handshake per message) and the median
and p99 time per call. Figures depend on the machine and its load: for comparing changes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

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


async def run(calls: int) -> None:
    with ScriptedLLM() as llm:
        replies = [Reply(raw=transcript(name)) for name in STREAMS]
        llm.on_request(lambda _: replies[(len(llm.requests) - 1) % len(replies)])
        model = ModelConfig(**llm.model_config())
        client = LLMClient(timeout=30)
        times: list[float] = []
        try:
            for _ in range(calls):
                start = time.perf_counter()
                await client.chat(model, [{"role": "user", "content": "今晚打游戏吗"}], purpose="bench")
                times.append(time.perf_counter() - start)
        finally:
            await client.aclose()
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"{calls} streamed calls: {llm.connections} TCP connection(s)")  # noqa: T201
        print(  # noqa: T201
            f"per call: median {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    asyncio.run(run(parser.parse_args().calls))


if __name__ == "__main__":
    main()
