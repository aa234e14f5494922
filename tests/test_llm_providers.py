"""Real providers' replies, replayed byte for byte by the local server, through the real client.

Each transcript under tests/fixtures/providers/ starts with `#` lines citing where its shape
comes from (the provider's docs, an SDK's fixtures, a public bug report). Issue 8, items 1-5.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.events import UsageEvent
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.llm import tokens
from nonebot_plugin_memsum.llm.client import ChatResult, LLMClient, Usage, refused_parameter
from nonebot_plugin_memsum.llm.errors import LLMBadRequest, LLMLengthLimit, LLMStreamCut
from nonebot_plugin_memsum.llm.reasoning import split_think
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import API_KEY, FIXTURES, Reply, ScriptedLLM, transcript
from tests.fakes.logs import captured
from tests.test_llm_client import Ledger

MESSAGES = [
    {"role": "system", "content": "你是群聊里的 AI 助手。"},
    {"role": "user", "content": "[小明(12345)] 今天晚上一起打游戏吗？"},
]
GROUP = SessionRecord(
    id="onebot:10000:group:7", platform="onebot", kind="group", place="group:7", room_class="room"
)


@pytest.fixture(autouse=True)
def _fresh(llm: ScriptedLLM) -> None:
    """The module's server (conftest's `llm`) forgets the previous test's requests and replies."""
    llm.reset()


@pytest.fixture
def model(llm: ScriptedLLM) -> ModelConfig:
    return ModelConfig(**llm.model_config())


@pytest.fixture
async def client(ledger: Ledger) -> AsyncIterator[LLMClient]:
    client = LLMClient(timeout=5, ledger=ledger)
    yield client
    await client.aclose()


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


async def chat(client: LLMClient, model: ModelConfig, **kw: Any) -> ChatResult:
    return await client.chat(model, MESSAGES, purpose="对话", session_id=GROUP.id, **kw)


def replay(name: str, **kw: Any) -> Reply:
    return Reply(raw=transcript(name), **kw)


def estimate_in() -> int:
    return sum(tokens.MESSAGE_OVERHEAD + tokens.estimate_text_tokens(m["content"]) for m in MESSAGES)


def test_every_transcript_cites_its_source() -> None:
    files = sorted(FIXTURES.iterdir())
    assert len(files) >= 10
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        header = lines[: next(i for i, x in enumerate(lines) if not x.startswith("#"))]
        assert any("https://" in line for line in header), path.name


# --- 1. usage in every shape --------------------------------------------------------------

USAGE_SHAPES = [
    # A trailing usage-only chunk with "choices": [] (OpenAI, also OpenRouter and Ollama).
    pytest.param("openai_stream_usage.sse", "晚上八点见！", Usage(2006, 6, 1920), "", id="openai"),
    # Top-level usage on the finish chunk itself (DeepSeek chat).
    pytest.param("deepseek_chat_stream.sse", "好的，八点见。", Usage(980, 6, 896), "", id="deepseek-chat"),
    # A trailing usage-only chunk with DeepSeek's spelling of a cache hit, and reasoning_content deltas.
    pytest.param(
        "deepseek_reasoner_stream.sse",
        "好啊，八点上线。",
        Usage(1350, 42, 1280),
        "小明问晚上打不打游戏，我答应他。",
        id="deepseek-reasoner",
    ),
    # Inside the finishing choice, choices[0].usage (Moonshot/Kimi).
    pytest.param("moonshot_stream_usage.sse", "你好，八点见。", Usage(1336, 31, 1280), "", id="moonshot"),
    # `reasoning` instead of `reasoning_content`, SSE comments (OpenRouter).
    pytest.param(
        "openrouter_stream_reasoning.sse", "八点见。", Usage(812, 20, 768), "先确认时间", id="openrouter"
    ),
    # The thinking inside the content, as a <think> block (DeepSeek-R1 through Ollama).
    pytest.param(
        "ollama_think_stream.sse",
        "好啊，八点见。",
        Usage(64, 38, 0),
        "嗯，小明问今晚打不打游戏。",
        id="ollama-r1",
    ),
]


@pytest.mark.parametrize(("name", "content", "usage", "reasoning"), USAGE_SHAPES)
async def test_usage_in_every_shape_reaches_the_result_and_the_ledger(
    client: LLMClient,
    llm: ScriptedLLM,
    model: ModelConfig,
    ledger: Ledger,
    name: str,
    content: str,
    usage: Usage,
    reasoning: str,
) -> None:
    llm.push(replay(name))
    result = await chat(client, model)
    assert (result.content, result.usage, result.finish_reason) == (content, usage, "stop")
    assert result.reasoning == reasoning
    u = usage
    assert ledger == [(GROUP.id, "对话", "test/model", u.prompt_tokens, u.completion_tokens, u.cached_tokens)]


async def test_no_usage_at_all_falls_back_to_the_estimate(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    llm.push(replay("llamacpp_no_done.sse"))
    result = await chat(client, model)
    assert result.usage is None
    assert ledger == [
        (GROUP.id, "对话", "test/model", estimate_in(), tokens.estimate_text_tokens("八点见。"), 0)
    ]


# --- 2. how a stream ends -----------------------------------------------------------------


async def test_finish_reason_without_done_is_complete(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(replay("llamacpp_no_done.sse"))
    result = await chat(client, model)
    assert (result.content, result.finish_reason) == ("八点见。", "stop")


async def test_done_without_finish_reason_is_complete(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(replay("done_without_finish_reason.sse"))
    result = await chat(client, model)
    assert (result.content, result.finish_reason) == ("八点见。", None)


async def test_a_body_that_ends_before_either_is_a_cut(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    # The OpenAI transcript's first three events, then a clean end of the body.
    head = b"".join(transcript("openai_stream_usage.sse").split(b"\n\n")[i] + b"\n\n" for i in range(3))
    llm.push(Reply(raw=head))
    with pytest.raises(LLMStreamCut, match=r"no finish reason, no \[DONE\]"):
        await chat(client, model)
    # The same three events, then the connection dropped.
    llm.push(replay("openai_stream_usage.sse", cut_after=3))
    with pytest.raises(LLMStreamCut, match="dropped mid-reply"):
        await chat(client, model)
    assert ledger == []


async def test_a_connection_dropped_after_the_finish_chunk_still_gives_the_answer(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # Finish chunk sent, then the usage chunk and [DONE] lost with the connection.
    llm.push(replay("openai_stream_usage.sse", cut_after=4))
    result = await chat(client, model)
    assert (result.content, result.finish_reason, result.usage) == ("晚上八点见！", "stop", None)


# --- 3. parameters a provider refuses -----------------------------------------------------


async def test_stream_options_refused_retried_once_without_it_and_remembered(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    llm.push(replay("azure_stream_options_400.json", status=400), Reply("八点见。"), Reply("好的"))
    with captured("WARNING") as warnings:
        first = await chat(client, model)
        second = await chat(client, model)
    assert (first.content, second.content) == ("八点见。", "好的")
    sent = llm.requests
    assert [("stream_options" in body) for body in sent] == [True, False, False]
    assert all(body["stream"] is True for body in sent)
    # Azure then streams without usage: the ledger takes the estimate.
    assert first.usage is None
    assert ledger[0] == (
        GROUP.id,
        "对话",
        "test/model",
        estimate_in(),
        tokens.estimate_text_tokens("八点见。"),
        0,
    )
    refusals = [w for w in warnings if "stream_options" in w]
    assert len(refusals) == 1
    assert "test/model" in refusals[0]
    assert not any(API_KEY in w for w in warnings)


async def test_max_tokens_refused_is_sent_as_max_completion_tokens(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(replay("openai_max_tokens_400.json", status=400))
    await chat(client, model, max_tokens=1500)
    await chat(client, model, max_tokens=800)
    sent = [{k: b.get(k) for k in ("max_tokens", "max_completion_tokens")} for b in llm.requests]
    assert sent == [
        {"max_tokens": 1500, "max_completion_tokens": None},
        {"max_tokens": None, "max_completion_tokens": 1500},
        {"max_tokens": None, "max_completion_tokens": 800},
    ]


async def test_reasoning_effort_refused_is_left_out_for_that_model_only(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    other = ModelConfig(**llm.model_config("test/other"))
    llm.push(replay("openai_reasoning_effort_400.json", status=400))
    await chat(client, model, reasoning_effort="low")
    await chat(client, model, reasoning_effort="low")
    await chat(client, other, reasoning_effort="low")
    assert [b.get("reasoning_effort") for b in llm.requests] == ["low", None, None, "low"]


async def test_a_400_about_a_value_is_not_a_refusal(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    llm.push(replay("deepseek_max_tokens_value_400.json", status=400))
    with pytest.raises(LLMBadRequest, match="valid range"):
        await chat(client, model, max_tokens=20000)
    assert len(llm.requests) == 1
    assert ledger == []


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        # https://github.com/agno-agi/agno/issues/1066
        ("Unknown parameter: 'stream_options'.", "stream_options"),
        # https://github.com/songquanpeng/one-api/issues/1423 (through a gateway)
        (
            "relay error (channel #1): Unrecognized request argument supplied: stream_options.",
            "stream_options",
        ),
        ("Invalid max_tokens value, the valid range of max_tokens is [1, 8192]", None),
        ("Unsupported parameter: 'temperature' is not supported with this model.", None),  # not sent by us
        ("This model's maximum context length is 8192 tokens.", None),
    ],
)
def test_refused_parameter_needs_a_sent_name_and_a_refusal(error: str, refused: str | None) -> None:
    body = {"model": "m", "messages": [], "stream_options": {"include_usage": True}, "max_tokens": 10}
    assert refused_parameter(body, error) == refused


# --- 4. reasoning never reaches the group or the memory -----------------------------------


@pytest.mark.parametrize(
    ("text", "answer", "thought"),
    [
        ("<think>\n想一想\n</think>\n\n八点见。", "八点见。", "想一想"),
        ("<think>\n\n</think>\n\n八点见。", "八点见。", ""),
        ("  \n<think>想</think>八点见。", "八点见。", "想"),
        ("<think>\n还没想完", "", "还没想完"),  # stopped at the output limit mid-thought
        ("八点见。", "八点见。", ""),
        ("我们聊聊 <think> 标签吧", "我们聊聊 <think> 标签吧", ""),  # not at the head: said, not thought
        ("有人发了 </think> 这个", "有人发了 </think> 这个", ""),
    ],
)
def test_split_think(text: str, answer: str, thought: str) -> None:
    assert split_think(text) == (answer, thought)


async def test_empty_think_block_of_a_plain_json_reply_is_removed(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(replay("qwen3_empty_think.json"))
    result = await chat(client, model, stream=False)
    assert (result.content, result.reasoning, result.usage) == ("好啊，八点见。", "", Usage(52, 12))


async def test_a_length_stop_inside_the_thinking_leaves_no_answer(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply("<think>\n先想想今晚的安排，再想想", finish_reason="length"))
    with pytest.raises(LLMLengthLimit) as caught:
        await chat(client, model)
    assert caught.value.result.content == ""
    assert caught.value.result.reasoning == "先想想今晚的安排，再想想"


@pytest.fixture
async def rt(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[Runtime]:
    config = Config(memsum_models=[ModelConfig(**llm.model_config())], memsum_persona="你是群助手小记。")
    built = await runtime.build(config, tmp_path / "memsum.db", ["小记"], {"10001"})
    try:
        yield built
    finally:
        await runtime.close(built)


@pytest.mark.parametrize(
    ("name", "answer", "thought"),
    [
        ("ollama_think_stream.sse", "好啊，八点见。", "小明问今晚"),  # a <think> block in the content
        ("deepseek_reasoner_stream.sse", "好啊，八点上线。", "我答应他"),  # reasoning_content deltas
        ("openrouter_stream_reasoning.sse", "八点见。", "先确认时间"),  # reasoning deltas
    ],
)
async def test_the_group_and_the_history_never_see_the_thinking(
    rt: Runtime, llm: ScriptedLLM, name: str, answer: str, thought: str
) -> None:
    await rt.agent.record(
        GROUP, Message(role="user", content="[小明(12345)] @小记 今晚打游戏吗", name="12345")
    )
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    llm.push(replay(name))
    assert await rt.agent.run_turn(GROUP.id, reply, Entry("onebot", "group")) == "replied"
    assert sent == [answer]
    stored = await rt.store.get_history(GROUP.id)
    assert (stored[-1].role, stored[-1].content) == ("assistant", answer)
    assert not any(thought in m.content for m in stored)
    # Nor does the model see it again on the next turn.
    await rt.agent.record(GROUP, Message(role="user", content="[小明(12345)] @小记 几点？", name="12345"))
    await rt.agent.run_turn(GROUP.id, reply, Entry("onebot", "group"))
    sent_back = json.dumps(llm.requests[-1]["messages"], ensure_ascii=False)
    assert "think" not in sent_back
    assert thought not in sent_back


async def test_a_summary_with_thinking_is_stored_without_it(rt: Runtime, llm: ScriptedLLM) -> None:
    for i in range(4):
        await rt.agent.record(GROUP, Message(role="user", content=f"[小明(12345)] 第{i}句", name="12345"))
    summary = "【最近在聊什么】\n小明在数数\n【谁有问题没回应】\n无\n【关键原话要点】\n无"
    # Streamed four characters a chunk: the closing tag arrives split over chunks.
    llm.push(Reply(f"<think>\n先看看都说了什么。\n</think>\n\n{summary}\n【保留原文】\n无"))
    await rt.compression.compress(GROUP.id)
    stored = await rt.store.get_meta(SUMMARY_NAMESPACE, GROUP.id)
    assert stored is not None
    assert stored["text"] == summary


async def test_the_compression_line_uses_the_providers_prompt_tokens(rt: Runtime, llm: ScriptedLLM) -> None:
    # Moonshot reports usage inside choices[0]: the turn's usage event must carry it, not the estimate.
    await rt.agent.record(GROUP, Message(role="user", content="[小明(12345)] @小记 你好", name="12345"))
    events: list[UsageEvent] = []
    rt.bus.subscribe(UsageEvent, events.append)
    llm.push(replay("moonshot_stream_usage.sse"))
    await rt.agent.run_turn(GROUP.id, None, Entry("onebot", "group"))
    assert [e.usage for e in events if e.turn_id is not None] == [1336]
    # The real store's ledger keeps the cache hit apart (written in batches: flushed here).
    await rt.store.flush_ledger()
    with sqlite3.connect(rt.store.path) as con:
        rows = con.execute("SELECT purpose, tokens_in, tokens_out, tokens_cached FROM ledger").fetchall()
    assert rows == [("对话", 1336, 31, 1280)]


@pytest.mark.parametrize(
    "replies",
    [
        pytest.param(["llamacpp_no_done.sse"], id="no-done"),
        pytest.param(["done_without_finish_reason.sse"], id="no-finish-reason"),
        pytest.param(
            ["azure_stream_options_400.json", "done_without_finish_reason.sse"], id="stream-options-400"
        ),
    ],
)
async def test_a_turn_answers_instead_of_apologising(
    rt: Runtime, llm: ScriptedLLM, replies: list[str]
) -> None:
    # Each of these made every turn end in the apology before.
    await rt.agent.record(GROUP, Message(role="user", content="[小明(12345)] @小记 几点？", name="12345"))
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    llm.push(*(replay(n, status=400 if n.endswith("400.json") else 200) for n in replies))
    assert await rt.agent.run_turn(GROUP.id, reply, Entry("onebot", "group")) == "replied"
    assert sent == ["八点见。"]


# --- 5. connections are reused ------------------------------------------------------------


async def test_streamed_calls_share_one_connection(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    names = [
        "openai_stream_usage.sse",
        "deepseek_reasoner_stream.sse",
        "moonshot_stream_usage.sse",
        "llamacpp_no_done.sse",
        "done_without_finish_reason.sse",
        "openrouter_stream_reasoning.sse",
    ]
    llm.push(*(replay(n) for n in names))
    for _ in names:
        await chat(client, model)
    await chat(client, model, stream=False)
    assert len(llm.requests) == len(names) + 1
    assert llm.connections == 1


async def test_a_connection_idle_longer_than_httpx_keeps_one_is_reused(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    """Issue 9 item 6: a quiet group's next question, 6 s later, goes over the same connection
    (httpx drops idle connections after 5 s: a TLS handshake per question)."""
    await chat(client, model)
    await asyncio.sleep(6)
    await chat(client, model)
    assert llm.connections == 1
