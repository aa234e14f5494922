"""What the provider audits (tests/test_audit6_p.py, tests/test_audit8_z.py) share: a group,
a two-message request, the owner's apology, the real client and a private runtime against the
scripted OpenAI-compatible server, a question asked in the group, and SSE bodies.

The fixtures are bound by name in the test modules that use them (pytest finds them there)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.llm.client import LLMClient
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import ScriptedLLM

GROUP = SessionRecord(
    id="onebot:10000:group:7", platform="onebot", kind="group", place="group:7", room_class="room"
)
MESSAGES = [
    {"role": "system", "content": "你是群聊里的 AI 助手。"},
    {"role": "user", "content": "[小明(12345)] 今天晚上一起打游戏吗？"},
]
APOLOGY = "抱歉，我这边出了点问题，请稍后再试。"


@pytest.fixture(autouse=True)
def fresh_llm(llm: ScriptedLLM) -> None:
    llm.reset()


@pytest.fixture
def model(llm: ScriptedLLM) -> ModelConfig:
    return ModelConfig(**llm.model_config())


@pytest.fixture
async def client() -> AsyncIterator[LLMClient]:
    async def no_wait(_: float) -> None:
        pass

    client = LLMClient(timeout=5, sleep=no_wait)
    yield client
    await client.aclose()


@pytest.fixture
async def rt(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[Runtime]:
    config = Config(memsum_models=[ModelConfig(**llm.model_config())], memsum_persona="你是群助手小记。")
    built = await runtime.build(config, tmp_path / "memsum.db", ["小记"], {"10001"})
    try:
        yield built
    finally:
        await runtime.close(built)


async def ask_in_group(rt: Runtime, text: str) -> tuple[str, list[str]]:
    await rt.agent.record(GROUP, Message(role="user", content=f"[小明(12345)] @小记 {text}", name="12345"))
    sent: list[str] = []

    async def reply(out: str) -> None:
        sent.append(out)

    outcome = await rt.agent.run_turn(GROUP.id, reply, Entry("onebot", "group"))
    return outcome, sent


def sse(*events: dict[str, Any] | str, end: str = "\n", compact: bool = False) -> bytes:
    """An SSE body: dicts as `data:` JSON (`compact`: without spaces, as some providers send
    it), strings as they are (comments, `[DONE]`); `end` ends each line."""
    separators = (",", ":") if compact else None
    out = []
    for e in events:
        line = (
            e if isinstance(e, str) else f"data: {json.dumps(e, ensure_ascii=False, separators=separators)}"
        )
        out.append(f"{line}{end}{end}")
    return "".join(out).encode()
