"""Audit 12, angle: real providers' streams, randomly segmented, and broken streams.

A seeded random driver takes each supported provider's published stream (the transcripts of
tests/fixtures/providers/, each citing its source, and the ones below, each citing its own),
rewrites it as the event-stream format allows (LF or CRLF line ends, `: keep-alive` and other
comments, `event:` / `id:` / `retry:` fields, a final `data: [DONE]` present or, where a finish
reason came, missing, the body gzip-encoded or not) and serves it from the real local HTTP
server in random HTTP chunks with random small waits (cut inside a UTF-8 character, inside
`data:`, between a CR and its LF), through the product's real `LLMClient`. Every
segmentation must give the same answer: text, reasoning, tool calls (id, name, arguments
joined), usage and finish reason, each written out below, not taken from another run.

Then broken streams (cut mid-JSON, a line that is not JSON, an error object mid-stream, a
proxy's HTML page with 200, a body that says gzip and is not, a stall longer than the timeout):
each is a typed `LLMError` (read in Chinese by `errors.in_chinese`), raised in bounded time,
and through `api.run_turn` on a real SQLite runtime the group gets the error reply, nothing of
the half answer is stored, and the question stays in the history the next turn sends.
"""

from __future__ import annotations

import gzip
import itertools
import json
import random
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.llm.client import ChatResult, LLMClient, Usage
from nonebot_plugin_memsum.llm.errors import (
    LLMBadResponse,
    LLMError,
    LLMServerError,
    LLMStreamCut,
    LLMTimeout,
    in_chinese,
)
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import Reply, ScriptedLLM, transcript

MESSAGES = [
    {"role": "system", "content": "你是群聊里的 AI 助手。"},
    {"role": "user", "content": "[小明(12345)] 今天晚上一起打游戏吗？"},
]
GROUP = SessionRecord(
    id="onebot:10000:group:12", platform="onebot", kind="group", place="group:12", room_class="room"
)
IN_GROUP = Entry("onebot", "group")


def sse(*chunks: dict[str, Any] | str, done: bool = True) -> bytes:
    """An LF event stream of these chunks (a str is sent as it is), `data: [DONE]` last."""
    events = [c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) for c in chunks]
    return "".join(f"data: {e}\n\n" for e in [*events, *(["[DONE]"] if done else [])]).encode()


# --- Published streams that tests/fixtures/providers/ does not hold ------------------------

# OpenAI chat completions, a streamed tool call: the first delta of each call carries `index`,
# `id`, `type` and the name with empty arguments, later deltas only `index` and a piece of the
# arguments ("Streaming" in https://platform.openai.com/docs/guides/function-calling, whose
# example splits `{"location":"Paris, France"}` into `{"`, `location`, `":"`, `Paris`, `,`,
# ` France`, `"}`); two calls in one answer are index 0 and 1 (parallel function calling, same
# page); finish reason `tool_calls`, then the `include_usage` chunk with `choices: []`
# (https://platform.openai.com/docs/api-reference/chat/create, stream_options). Ids ours.
_OAI = {"id": "chatcmpl-BXq0aT", "object": "chat.completion.chunk", "created": 1747000000, "model": "gpt-4.1"}


def _oai(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {**_OAI, "system_fingerprint": "fp_b3f1157249", "choices": [choice], "usage": None, **extra}


def _oai_args(index: int, piece: str) -> dict[str, Any]:
    return _oai({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


OPENAI_TOOLS = sse(
    _oai({"role": "assistant", "content": None, "refusal": None}),
    _oai(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
                    "type": "function",
                    "function": {"name": "recall", "arguments": ""},
                }
            ]
        }
    ),
    *(_oai_args(0, p) for p in ['{"', "query", '":"', "提取", "码", '","', "speaker", '":"', "小明", '"}']),
    _oai(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_9mYm1Ck2Rq0EfjbKdXwPz3Lh",
                    "type": "function",
                    "function": {"name": "todo_write", "arguments": ""},
                }
            ]
        }
    ),
    *(_oai_args(1, p) for p in ['{"items":', '[{"text":"', "周五交", "报告", '"}]}']),
    _oai({}, "tool_calls"),
    {
        **_OAI,
        "system_fingerprint": "fp_b3f1157249",
        "choices": [],
        "usage": {
            "prompt_tokens": 1213,
            "completion_tokens": 41,
            "total_tokens": 1254,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        },
    },
)

# Qwen through DashScope's compatible mode: every chunk carries `"usage": null` and a delta
# with `function_call`/`refusal`/`tool_calls` null; Qwen3's thinking arrives as
# `reasoning_content` (content null meanwhile), then the answer; the last chunk has
# `choices: []` and the usage, its `prompt_tokens_details.cached_tokens` (阿里云百炼
# 「OpenAI 兼容 - Chat」流式输出 and 「深度思考」,
# https://help.aliyun.com/zh/model-studio/compatibility-of-openai-with-dashscope and
# https://help.aliyun.com/zh/model-studio/deep-thinking). Text and figures ours.
_QWEN = {"id": "chatcmpl-e30f5ae7-3063-93c4-90fe-beb5f900bd57", "created": 1735113344, "model": "qwen-plus"}


def _qwen(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    full = {"content": None, "function_call": None, "refusal": None, "role": "assistant", "tool_calls": None}
    return {
        **_QWEN,
        "choices": [{"delta": {**full, **delta}, "finish_reason": finish, "index": 0, "logprobs": None}],
        "object": "chat.completion.chunk",
        "service_tier": None,
        "system_fingerprint": None,
        "usage": None,
    }


QWEN_THINKING = sse(
    _qwen({"content": "", "reasoning_content": ""}),
    _qwen({"reasoning_content": "小明约今晚"}),
    _qwen({"reasoning_content": "打游戏，答应他。"}),
    _qwen({"content": "好呀，"}),
    _qwen({"content": "今晚八点🎮见！"}),
    _qwen({"content": ""}, "stop"),
    {
        **_QWEN,
        "choices": [],
        "object": "chat.completion.chunk",
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "completion_tokens": 27,
            "prompt_tokens": 1560,
            "total_tokens": 1587,
            "completion_tokens_details": {"reasoning_tokens": 12},
            "prompt_tokens_details": {"audio_tokens": None, "cached_tokens": 1408},
        },
    },
)

# Gemini's OpenAI-compatible endpoint (https://ai.google.dev/gemini-api/docs/openai): the first
# chunk already carries text (no role-only chunk), `usage` on the finish chunk itself (README
# 「模型服务商兼容性」), `role` repeated in every delta, no `id` nor `system_fingerprint`; the
# chunks' shape as measured in THU-MAIC/OpenMAIC#1556 and open-webui/computer#224. Text and
# figures ours.
_GEMINI = {"created": 1760000000, "model": "gemini-2.5-flash", "object": "chat.completion.chunk"}
GEMINI_TEXT = sse(
    {**_GEMINI, "choices": [{"delta": {"content": "周五", "role": "assistant"}, "index": 0}]},
    {
        **_GEMINI,
        "choices": [{"delta": {"content": "下午三点开会，别忘了带", "role": "assistant"}, "index": 0}],
    },
    {
        **_GEMINI,
        "choices": [
            {"delta": {"content": "报告。", "role": "assistant"}, "finish_reason": "stop", "index": 0}
        ],
        "usage": {"completion_tokens": 14, "prompt_tokens": 902, "total_tokens": 916},
    },
)

# vLLM's OpenAI-compatible server with `--reasoning-parser` (https://docs.vllm.ai/en/latest/
# features/reasoning_outputs.html: the thinking in `reasoning_content` deltas, the answer in
# `content`); with `include_usage` every chunk has `"usage": null` and a last one `choices: []`
# (vllm entrypoints/openai/serving_chat.py). Model, text and figures ours.
_VLLM = {"id": "chatcmpl-7c1b8b8e5a2c4c4e", "object": "chat.completion.chunk", "created": 1745000000}


def _vllm(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    return {**_VLLM, "model": "Qwen/QwQ-32B", "choices": [choice], "usage": None}


VLLM_REASONING = sse(
    _vllm({"role": "assistant", "content": ""}),
    _vllm({"reasoning_content": "用户问"}),
    _vllm({"reasoning_content": "几点开会。"}),
    _vllm({"content": "三点。"}),
    _vllm({"content": ""}, "stop"),
    {
        **_VLLM,
        "model": "Qwen/QwQ-32B",
        "choices": [],
        "usage": {"prompt_tokens": 77, "total_tokens": 96, "completion_tokens": 19},
    },
)


# Ollama's OpenAI-compatible endpoint with two tool calls in one answer: every call a whole
# delta of its own with `"index": 0` (ollama/ollama#15457, still so for models without their own
# parser, #15497); the chunk as ollama/ollama openai/openai.go `ToChunk` writes it (role
# "assistant" and content "" in every delta, `system_fingerprint` "fp_ollama", finish reason
# `tool_calls`), then the usage chunk with `choices: []`. Ids, names and arguments ours.
_OLLAMA = {
    "id": "chatcmpl-412",
    "object": "chat.completion.chunk",
    "created": 1775700000,
    "model": "qwen3:8b",
}


def _ollama(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"role": "assistant", "content": "", **delta}, "finish_reason": finish}
    return {**_OLLAMA, "system_fingerprint": "fp_ollama", "choices": [choice]}


def _ollama_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    call = {"id": call_id, "index": 0, "type": "function", "function": {"name": name, "arguments": arguments}}
    return _ollama({"tool_calls": [call]})


OLLAMA_TOOLS = sse(
    _ollama_call("call_k3kd9xq1", "recall", '{"query":"提取码"}'),
    _ollama_call("call_7fz2m0ab", "recall", '{"query":"会议","speaker":"小红"}'),
    _ollama({}, "tool_calls"),
    {
        **_OLLAMA,
        "system_fingerprint": "fp_ollama",
        "choices": [],
        "usage": {"prompt_tokens": 412, "completion_tokens": 58, "total_tokens": 470},
    },
)

# Gemini's OpenAI endpoint calling two tools: no `index` on any tool delta, each call begun in
# a delta of its own with its `id`, the second one's arguments split over a later indexless
# delta without an id, `extra_content.google.thought_signature` beside a call, and finish
# reason `stop` with the usage (open-webui/computer#224, a representative stream of it;
# THU-MAIC/OpenMAIC#1556, a measured chunk; AstrBot#6661). Signatures and arguments ours.
_SIGNATURE = {"google": {"thought_signature": "CvMBAePx/14fa2c7e"}}
GEMINI_TOOLS = sse(
    {
        **_GEMINI,
        "choices": [
            {
                "delta": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "extra_content": _SIGNATURE,
                            "function": {"arguments": '{"query":"周五"}', "name": "recall"},
                            "id": "function-call-1",
                            "type": "function",
                        }
                    ],
                },
                "index": 0,
            }
        ],
    },
    {
        **_GEMINI,
        "choices": [
            {
                "delta": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "function": {"arguments": '{"items":[{"text":', "name": "todo_write"},
                            "id": "function-call-2",
                            "type": "function",
                        }
                    ],
                },
                "index": 0,
            }
        ],
    },
    {
        **_GEMINI,
        "choices": [
            {
                "delta": {"role": "assistant", "tool_calls": [{"function": {"arguments": '"开会"}]}'}}]},
                "finish_reason": "stop",
                "index": 0,
            }
        ],
        "usage": {"completion_tokens": 30, "prompt_tokens": 955, "total_tokens": 985},
    },
)


# --- What each stream must give ------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    content: str
    reasoning: str
    calls: tuple[tuple[str, str, str], ...]
    """(id, name, arguments) of each tool call, in order."""
    usage: Usage | None
    finish: str | None


STREAMS: dict[str, tuple[bytes, Expected]] = {
    "openai": (
        transcript("openai_stream_usage.sse"),
        Expected("晚上八点见！", "", (), Usage(2006, 6, 1920), "stop"),
    ),
    "openai-tools": (
        OPENAI_TOOLS,
        Expected(
            "",
            "",
            (
                ("call_DdmO9pD3xa9XTPNJ32zg2hcA", "recall", '{"query":"提取码","speaker":"小明"}'),
                ("call_9mYm1Ck2Rq0EfjbKdXwPz3Lh", "todo_write", '{"items":[{"text":"周五交报告"}]}'),
            ),
            Usage(1213, 41, 1024),
            "tool_calls",
        ),
    ),
    "deepseek-chat": (
        transcript("deepseek_chat_stream.sse"),
        Expected("好的，八点见。", "", (), Usage(980, 6, 896), "stop"),
    ),
    "deepseek-reasoner": (
        transcript("deepseek_reasoner_stream.sse"),
        Expected("好啊，八点上线。", "小明问晚上打不打游戏，我答应他。", (), Usage(1350, 42, 1280), "stop"),
    ),
    "moonshot": (
        transcript("moonshot_stream_usage.sse"),
        Expected("你好，八点见。", "", (), Usage(1336, 31, 1280), "stop"),
    ),
    "openrouter": (
        transcript("openrouter_stream_reasoning.sse"),
        Expected("八点见。", "先确认时间", (), Usage(812, 20, 768), "stop"),
    ),
    "ollama-r1": (
        transcript("ollama_think_stream.sse"),
        Expected("好啊，八点见。", "嗯，小明问今晚打不打游戏。", (), Usage(64, 38, 0), "stop"),
    ),
    "qwen3-thinking": (
        QWEN_THINKING,
        Expected("好呀，今晚八点🎮见！", "小明约今晚打游戏，答应他。", (), Usage(1560, 27, 1408), "stop"),
    ),
    "gemini": (
        GEMINI_TEXT,
        Expected("周五下午三点开会，别忘了带报告。", "", (), Usage(902, 14, 0), "stop"),
    ),
    "vllm-reasoning": (
        VLLM_REASONING,
        Expected("三点。", "用户问几点开会。", (), Usage(77, 19, 0), "stop"),
    ),
    "ollama-tools": (
        OLLAMA_TOOLS,
        Expected(
            "",
            "",
            (
                ("call_k3kd9xq1", "recall", '{"query":"提取码"}'),
                ("call_7fz2m0ab", "recall", '{"query":"会议","speaker":"小红"}'),
            ),
            Usage(412, 58, 0),
            "tool_calls",
        ),
    ),
    "gemini-tools": (
        GEMINI_TOOLS,
        Expected(
            "",
            "",
            (
                ("function-call-1", "recall", '{"query":"周五"}'),
                ("function-call-2", "todo_write", '{"items":[{"text":"开会"}]}'),
            ),
            Usage(955, 30, 0),
            "stop",
        ),
    ),
    "llamacpp-no-done": (
        transcript("llamacpp_no_done.sse"),
        Expected("八点见。", "", (), None, "stop"),
    ),
    "no-finish-reason": (
        transcript("done_without_finish_reason.sse"),
        Expected("八点见。", "", (), None, None),
    ),
}


def outcome(result: ChatResult) -> Expected:
    calls = tuple((c.id, c.name, c.arguments) for c in result.tool_calls)
    return Expected(result.content, result.reasoning, calls, result.usage, result.finish_reason)


# --- The random driver ---------------------------------------------------------------------

NOISE = [
    b": keep-alive\n\n",  # DeepSeek while it thinks (providers/deepseek_reasoner_stream.sse)
    b": OPENROUTER PROCESSING\n\n",  # OpenRouter (providers/openrouter_stream_reasoning.sse)
    b"event: ping\n\n",  # a field without data: no event (WHATWG HTML, server-sent events)
    b"retry: 3000\n\n",
    b"\n",  # a stray blank line
    b"data:\n\n",  # a gateway's heartbeat (NousResearch/hermes-agent#111887, netease-lcap/wave-agent#1326)
    b"data: \n\n",
]
"""Blocks a server may put between events, none of them a chunk: comments, other fields and blank
lines dispatch nothing (WHATWG HTML, "Interpreting an event stream"); a bare `data:` dispatches
an event with empty data, which gateways send as a heartbeat."""
FIELDS = [b"event: message\n", b"id: 17\n", b": chunk\n"]
"""Lines a server may put inside an event before its data (`event:` names the event type,
`id:` the last event id; sse-starlette writes `id:`/`event:` before `data:`)."""


def rewrite(body: bytes, rng: random.Random, finished: bool) -> bytes:
    """`body`'s events with random noise, fields and line ends; `[DONE]` dropped now and then
    when the stream names a finish reason (complete without it, issue 8 item 2)."""
    events = [e for e in body.split(b"\n\n") if e.strip()]
    if finished and events[-1] == b"data: [DONE]" and rng.random() < 0.3:
        events.pop()
    out = bytearray()
    for event in events:
        while rng.random() < 0.25:
            out += rng.choice(NOISE)
        if rng.random() < 0.2:
            out += rng.choice(FIELDS)
        out += event + b"\n\n"
    if rng.random() < 0.3:
        out = out[:-1]  # the last event ends with the body, without its blank line
    text = bytes(out)
    return text.replace(b"\n", b"\r\n") if rng.random() < 0.5 else text


def cut_points(body: bytes, rng: random.Random) -> list[int]:
    """Random cuts, with at least one inside a UTF-8 character, one inside `data:`, and one
    between a CR and its LF where there is one."""
    cuts = {i for i in range(1, len(body)) if rng.random() < 1 / 24}
    inside_char = [i for i in range(1, len(body)) if 0x80 <= body[i] < 0xC0]  # continuation bytes
    inside_data = [i + 2 for i in range(len(body)) if body.startswith(b"data:", i)]
    crlf = [i + 1 for i in range(len(body) - 1) if body[i : i + 2] == b"\r\n"]
    for where in (inside_char, inside_data, crlf):
        if where:
            cuts.update(rng.sample(where, min(3, len(where))))
    return sorted(cuts)


def segments(body: bytes, rng: random.Random) -> list[tuple[float, bytes]]:
    edges = [0, *cut_points(body, rng), len(body)]
    return [(rng.choice((0, 0, 0, 0.001, 0.002)), body[a:b]) for a, b in itertools.pairwise(edges)]


def random_reply(body: bytes, rng: random.Random, finished: bool) -> Reply:
    raw = rewrite(body, rng, finished)
    headers: dict[str, str] = {}
    if rng.random() < 0.3:  # a proxy that compresses the stream (nginx `gzip on` for text/event-stream)
        raw = gzip.compress(raw)
        headers["Content-Encoding"] = "gzip"
    return Reply(raw=raw, raw_segments=segments(raw, rng), headers=headers)


@pytest.fixture(autouse=True)
def _fresh(llm: ScriptedLLM) -> None:
    llm.reset()


@pytest.fixture
def model(llm: ScriptedLLM) -> ModelConfig:
    return ModelConfig(**llm.model_config())


@pytest.fixture
async def client() -> AsyncIterator[LLMClient]:
    client = LLMClient(timeout=5, max_retries=0)
    yield client
    await client.aclose()


async def chat(client: LLMClient, model: ModelConfig) -> ChatResult:
    return await client.chat(model, MESSAGES, purpose="对话", session_id=GROUP.id)


SEEDS = [1, 2, 3, 20261205]


@pytest.mark.parametrize("name", list(STREAMS))
async def test_every_segmentation_of_a_providers_stream_gives_the_same_answer(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, name: str
) -> None:
    body, expected = STREAMS[name]
    assert outcome(await _plain(client, llm, model, body)) == expected  # the stream as published
    for seed in SEEDS:
        rng = random.Random(f"{name}/{seed}")
        llm.push(random_reply(body, rng, expected.finish is not None))
        assert outcome(await chat(client, model)) == expected, f"seed {seed}"
    assert llm.connections == 1  # every stream read to its end: one kept-alive connection


async def _plain(client: LLMClient, llm: ScriptedLLM, model: ModelConfig, body: bytes) -> ChatResult:
    llm.push(Reply(raw=body))
    return await chat(client, model)


def test_the_driver_cuts_where_it_claims() -> None:
    """The driver itself: the cuts it promises happen, and the pieces add up to the body."""
    body = transcript("deepseek_reasoner_stream.sse").replace(b"\n", b"\r\n")
    rng = random.Random(7)
    parts = segments(body, rng)
    assert b"".join(p for _, p in parts) == body
    ends = {sum(len(p) for _, p in parts[: i + 1]) for i in range(len(parts))}
    assert any(0x80 <= body[e] < 0xC0 for e in ends if e < len(body))  # inside a character
    assert any(body[e - 2 : e + 3] == b"data:" for e in ends if e >= 2)  # inside `data:`
    assert any(body[e - 1 : e + 1] == b"\r\n" for e in ends if e >= 1)  # between CR and LF


# --- Broken streams -------------------------------------------------------------------------

_HEAD = transcript("openai_stream_usage.sse").split(b"\n\n")
"""The OpenAI transcript's events: role chunk, 「晚上八点」, 「见！」, finish, usage, [DONE]."""

# OpenAI sends a failure after the 200 as a data line `{"error": {...}}` (openai-python
# src/openai/_streaming.py raises APIError for a chunk with "error"; vercel/ai#1835 "handle
# error chunks when streaming"); its text as users quote it (LangBot#126: error_type=server_error,
# "The server had an error while processing your request. Sorry about that!").
MID_STREAM_ERROR = (
    b'data: {"error":{"message":"The server had an error while processing your request. Sorry about'
    b' that!","type":"server_error","param":null,"code":null}}\n\n'
)
# What an nginx in front of the API answers while its upstream is down, with 200 (a captive
# portal, a misrouted base_url): a web page, not an event stream.
PROXY_PAGE = (
    b"<!DOCTYPE html>\n<html>\n<head><title>\xe7\xbd\x91\xe7\xbb\x9c\xe8\xae\xa4\xe8\xaf\x81</title></head>\n"
    b"<body><h1>Welcome to nginx!</h1></body>\n</html>\n"
)

BROKEN: dict[str, tuple[Reply, type[LLMError], str]] = {
    # The connection dropped in the middle of a chunk's JSON (no end of body).
    "cut-mid-json": (
        Reply(raw=_HEAD[0] + b"\n\n" + _HEAD[1][:90], cut_after=0),
        LLMStreamCut,
        "中途断开",
    ),
    # The body ends cleanly in the middle of a chunk's JSON: its last event cannot be read. A
    # chunk came before it, so the address is right: a cut, never the hint to check base_url.
    "ends-mid-json": (Reply(raw=_HEAD[0] + b"\n\n" + _HEAD[1][:90]), LLMStreamCut, "中途断开"),
    # A line that is not JSON between good chunks: the same.
    "non-json-line": (
        Reply(raw=b"\n\n".join([_HEAD[0], _HEAD[1], b"data: {oops", *_HEAD[2:]])),
        LLMStreamCut,
        "中途断开",
    ),
    # The first event is not JSON: not a chat stream at all (base_url names something else).
    "first-line-not-json": (
        Reply(raw=b"\n\n".join([b"data: {oops", *_HEAD])),
        LLMBadResponse,
        "不是聊天接口的格式",
    ),
    # An error object after part of the answer: never half an answer.
    "error-mid-stream": (
        Reply(raw=b"\n\n".join([_HEAD[0], _HEAD[1]]) + b"\n\n" + MID_STREAM_ERROR),
        LLMStreamCut,
        "The server had an error",
    ),
    # The same error before any answer, with an HTTP status as its code: that status's error.
    "error-before-answer": (
        Reply(raw=_HEAD[0] + b"\n\n" + MID_STREAM_ERROR.replace(b'"code":null', b'"code":503')),
        LLMServerError,
        "服务端出错",
    ),
    # HTTP 200 with a proxy's web page.
    "html-200": (
        Reply(raw=PROXY_PAGE, headers={"Content-Type": "text/html; charset=utf-8"}),
        LLMBadResponse,
        "not an event stream",
    ),
}


def served(reply: Reply, seed: int) -> Reply:
    """`reply` as the server sends it: in the segments it names, else its `raw` in random ones
    (then the connection dropped, when it has a `cut_after`)."""
    if reply.raw is None or reply.raw_segments is not None:
        return reply
    raw = reply.raw if isinstance(reply.raw, bytes) else reply.raw.encode()
    parts = segments(raw, random.Random(seed))
    return Reply(raw=raw, raw_segments=parts, headers=reply.headers, cut_after=reply.cut_after)


@pytest.mark.parametrize("name", list(BROKEN))
async def test_a_broken_stream_is_a_clear_error_in_bounded_time(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, name: str
) -> None:
    reply, kind, said = BROKEN[name]
    for seed in (1, 2):
        llm.push(served(reply, seed))
        started = time.monotonic()
        with pytest.raises(kind) as caught:
            await chat(client, model)
        assert time.monotonic() - started < 3
        assert said in str(caught.value) or said in in_chinese(caught.value)


async def test_a_stall_longer_than_the_timeout_is_a_timeout_not_a_hang(
    llm: ScriptedLLM, model: ModelConfig
) -> None:
    client = LLMClient(timeout=0.6, max_retries=2)
    try:
        body = transcript("openai_stream_usage.sse")
        head, tail = body[:300], body[300:]
        llm.push(Reply(raw=body, raw_segments=[(0, head), (1.5, tail)]))
        started = time.monotonic()
        with pytest.raises(LLMTimeout) as caught:
            await chat(client, model)
        assert time.monotonic() - started < 1.4  # not retried, not waited out
        assert in_chinese(caught.value) == "test/model 超时，没有在限定时间内给出完整回复"
        assert len(llm.requests) == 1
    finally:
        await client.aclose()


# --- Through a turn: api.run_turn on a real SQLite runtime ----------------------------------


@pytest.fixture
async def rt(tmp_path: Path, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Runtime]:
    config = Config(
        memsum_models=[ModelConfig(**llm.model_config())],
        memsum_persona="你是群助手小记。",
        memsum_llm_timeout=1.0,
    )
    built = await runtime.build(config, tmp_path / "memsum.db", ["小记"], {"10001"})
    monkeypatch.setattr(runtime, "_current", built)  # the library API answers for this runtime
    try:
        yield built
    finally:
        await runtime.close(built)


def stored_bytes(rt: Runtime) -> bytes:
    """The database file and its write-ahead log as they are on disk."""
    path = Path(rt.store.path)
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


TURN_BREAKS = {
    **{name: reply for name, (reply, _, _) in BROKEN.items()},
    "stall": Reply(
        raw=transcript("openai_stream_usage.sse"),
        raw_segments=[
            (0, transcript("openai_stream_usage.sse")[:700]),
            (1.6, transcript("openai_stream_usage.sse")[700:]),
        ],
    ),
}


@pytest.mark.parametrize("name", list(TURN_BREAKS))
async def test_a_broken_stream_in_a_turn_sends_the_error_reply_and_keeps_the_question(
    rt: Runtime, llm: ScriptedLLM, name: str
) -> None:
    await rt.agent.record(GROUP, Message(role="user", content="[小明(12345)] @小记 今晚几点？", name="12345"))
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    broken = TURN_BREAKS[name]
    # The default answer: a 503 is tried again (RetryPolicy), and gets the same each time.
    llm.default = served(broken, 5)
    started = time.monotonic()
    assert await api.run_turn(GROUP.id, reply, IN_GROUP) == "error"
    assert time.monotonic() - started < 3
    llm.default = Reply()
    assert sent == [rt.config.memsum_error_reply]
    history = await api.history(GROUP.id)
    assert [(m.role, m.content) for m in history] == [("user", "[小明(12345)] @小记 今晚几点？")]
    # Nothing of the half answer anywhere in the file, nor in the ledger (nothing was paid for
    # that the provider reported).
    await rt.store.flush_ledger()
    with sqlite3.connect(rt.store.path) as con:
        assert con.execute("SELECT count(*) FROM ledger").fetchone() == (0,)
    assert "晚上八点".encode() not in stored_bytes(rt)
    # The question is not lost: the next turn sends it to the model, and that answer is stored.
    await rt.agent.record(GROUP, Message(role="user", content="[小明(12345)] @小记 在吗？", name="12345"))
    llm.push(Reply("八点，在的。"))
    assert await api.run_turn(GROUP.id, reply, IN_GROUP) == "replied"
    asked = [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "user"]
    assert asked[-2:] == ["[小明(12345)] @小记 今晚几点？", "[小明(12345)] @小记 在吗？"]
    assert sent[-1] == "八点，在的。"


async def test_a_randomly_segmented_stream_in_a_turn_answers_and_stores_the_answer_once(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    await rt.agent.record(GROUP, Message(role="user", content="[小明(12345)] @小记 今晚几点？", name="12345"))
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    llm.push(random_reply(QWEN_THINKING, random.Random(12), True))
    assert await api.run_turn(GROUP.id, reply, IN_GROUP) == "replied"
    assert sent == ["好呀，今晚八点🎮见！"]
    history = await api.history(GROUP.id)
    assert [(m.role, m.content) for m in history][-1] == ("assistant", "好呀，今晚八点🎮见！")
    await rt.store.flush_ledger()
    with sqlite3.connect(rt.store.path) as con:
        rows = con.execute("SELECT purpose, tokens_in, tokens_out, tokens_cached FROM ledger").fetchall()
    assert rows == [("对话", 1560, 27, 1408)]
    assert "答应他".encode() not in stored_bytes(rt)  # the thinking is neither stored nor sent


async def test_a_gateways_bare_data_heartbeat_is_no_chunk(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    """A gateway that sends `data:` with nothing after it while the model thinks (the issues in
    NOISE): read as a chunk, every reply that lasted past the first heartbeat failed with
    「回答不是聊天接口的格式」, and the group got the error reply."""
    events = transcript("openai_stream_usage.sse").split(b"\n\n")
    body = b"\n\n".join([b"data:", events[0], b"data: ", *events[1:3], b"data:", *events[3:]])
    llm.push(Reply(raw=body))
    assert outcome(await chat(client, model)) == STREAMS["openai"][1]


@pytest.mark.parametrize("cut", [1, 2, 3, 5])
async def test_a_leading_byte_order_mark_loses_no_words(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, cut: int
) -> None:
    """A stream that starts with a UTF-8 BOM (WHATWG HTML, "Interpreting an event stream": one
    leading BOM must be ignored; the same fix in openai/openai-python#3819, assistant-ui#6954),
    the BOM split over reads: Gemini's first chunk already carries words, and they were dropped
    while the rest was sent and stored as the whole answer. No provider is known to send one;
    the decoder promises the standard's reading."""
    body = "\ufeff".encode() + GEMINI_TEXT
    llm.push(Reply(raw=body, raw_segments=[(0, body[:cut]), (0.001, body[cut:])]))
    assert outcome(await chat(client, model)) == STREAMS["gemini"][1]
    # Only the first one: a BOM later in the body is data (here inside a chunk's JSON string).
    llm.push(
        Reply(raw=sse({**_GEMINI, "choices": [{"delta": {"content": "\ufeff好"}, "finish_reason": "stop"}]}))
    )
    assert (await chat(client, model)).content == "\ufeff好"


# --- A body that is not what its Content-Encoding says ---------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_a_body_labelled_gzip_that_is_not_is_a_bad_response(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, stream: bool
) -> None:
    """A proxy that adds `Content-Encoding: gzip` to a body it did not compress: httpx's
    DecodingError escaped the client, so a turn logged a traceback as if the plugin were broken
    and /压缩 said 「内部错误：DecodingError」."""
    body = transcript("openai_stream_usage.sse") if stream else json.dumps({"choices": []}).encode()
    llm.push(Reply(raw=body, headers={"Content-Encoding": "gzip"}))
    with pytest.raises(LLMBadResponse) as caught:
        await client.chat(model, MESSAGES, purpose="对话", stream=stream)
    assert "Content-Encoding (gzip)" in str(caught.value)
    assert "不是聊天接口的格式" in in_chinese(caught.value)


async def test_a_compression_on_a_body_labelled_gzip_names_the_model_not_an_internal_error(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    for i in range(4):
        await rt.agent.record(GROUP, Message(role="user", content=f"[小明(12345)] 第{i}句", name="12345"))
    llm.default = Reply(raw=b"data: plain\n\n", headers={"Content-Encoding": "gzip"})
    with pytest.raises(api.CompressionError) as caught:
        await api.compress(GROUP.id)
    llm.default = Reply()
    assert caught.value.reason.startswith("摘要模型出错：test/model 回答不是聊天接口的格式")
    assert [m.content for m in await api.history(GROUP.id)] == [f"[小明(12345)] 第{i}句" for i in range(4)]
