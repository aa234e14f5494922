"""Audit 6 (p): real LLM providers, as QQ-bot owners configure them.

DeepSeek, DashScope/Qwen, Ollama, llama.cpp's server, vLLM/SGLang, SiliconFlow, Moonshot/Kimi,
OpenRouter and one-api-style relays, replayed byte for byte by the scripted server through
the real client, the real SQLite store and the real compression service: what reaches the
group, the stored history and the summary, whether each provider's "context too long" is
known as one (R-RUN-9's retry under the literal rule, issue 9), and the stream's edge cases.
Each provider fixture cites where its bytes come from.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm.client import LLMClient, Usage
from nonebot_plugin_memsum.llm.errors import LLMBadRequest, LLMStatusError, LLMStreamCut, is_context_too_long
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message
from tests.fakes import providers
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.providers import APOLOGY, GROUP, MESSAGES, ask_in_group, sse
from tests.fakes.service import GROUP as SERVICE_GROUP
from tests.fakes.service import Make, seed
from tests.test_compression_service_request import literal_fit, measured_fit

# The shared fixtures, bound here so that pytest finds them.
fresh_llm, model, client, rt = providers.fresh_llm, providers.model, providers.client, providers.rt


def delta(content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {} if content is None else {"content": content}
    return {
        "id": "gen-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {**d, **extra}, "finish_reason": finish}],
    }


# ---- a context too long, said after a 200 inside the stream --------------------------------------
# llama.cpp's server before PR #16486 ("server : return HTTP 400 if prompt exceeds context length",
# merged 2025-10-09: "In streaming mode when prompt exceeds context length, the server returns HTTP
# 200 status code with a JSON error in the body") writes the error with its own
# `server_sent_event(sink, "error", error_data)`, i.e. an `error: {…}` line, then `data: [DONE]`
# (tools/server/server.cpp, handle_completions_impl); the body as oobabooga/textgen#7257 quotes it.
LLAMACPP_STREAMED_CONTEXT_ERROR = (
    b'error: {"code":400,"message":"the request exceeds the available context size. try increasing the'
    b' context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":14429,'
    b'"n_ctx":8192}\n\ndata: [DONE]\n\n'
)
# SGLang before PR #21900 ("Return HTTP 400 for streaming validation errors"; sgl-project/sglang#12081:
# "token-exceeding return 400 error code in body but 200 in http status"): a `data:` event holding
# vLLM's ErrorResponse shape under `error`, with the message of sglang's tokenizer_manager.py.
SGLANG_STREAMED_CONTEXT_ERROR = sse(
    {
        "error": {
            "object": "error",
            "message": "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    },
    "data: [DONE]",
)


async def test_llamacpp_context_error_after_200_is_a_400_not_an_empty_answer(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(raw=LLAMACPP_STREAMED_CONTEXT_ERROR))
    with pytest.raises(LLMBadRequest) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    assert caught.value.status == 400
    assert "exceeds the available context size" in str(caught.value)
    assert is_context_too_long(caught.value.status, str(caught.value))
    assert len(llm.requests) == 1  # a 400 is not retried


async def test_sglang_context_error_after_200_is_a_400(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(raw=SGLANG_STREAMED_CONTEXT_ERROR))
    with pytest.raises(LLMBadRequest) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    assert caught.value.status == 400
    assert "longer than the model's context length" in str(caught.value)


async def test_a_chat_turn_against_llamacpp_context_error_apologises_and_tells_the_owner(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    # Before: the turn took the empty stream for an answer of nothing: no reply in the group,
    # a "silent" marker stored, and not one line in the log.
    llm.push(Reply(raw=LLAMACPP_STREAMED_CONTEXT_ERROR))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "在吗")
    assert outcome == "error"
    assert sent == [APOLOGY]
    assert any("HTTP 400" in line and "exceeds the available context size" in line for line in lines)
    stored = await rt.store.get_history(GROUP.id)
    assert [m.role for m in stored] == ["user"]


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(raw=LLAMACPP_STREAMED_CONTEXT_ERROR), id="llama.cpp"),
        pytest.param(Reply(raw=SGLANG_STREAMED_CONTEXT_ERROR), id="sglang"),
    ],
)
async def test_r_run_9_streamed_context_error_retries_under_the_literal_rule(
    make: Make, reply: Reply
) -> None:
    window = 6000
    env = await make(summary={"context_window": window})
    await seed(env.rt, 80, size=80)
    env.model.summary.append(reply)
    result = await env.rt.compression.compress(SERVICE_GROUP.id)
    assert result.outcome == "done"
    first, *rest = env.model.summary_requests()
    assert measured_fit(first, window)
    assert not literal_fit(first, window)
    assert rest
    assert all(literal_fit(b, window) for b in rest)
    assert env.failure_warnings() == []


async def test_a_numbered_5xx_before_any_answer_is_retried_like_the_status(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # OpenRouter, docs "Errors and Debugging": "the returned HTTP response status will be 200 and any
    # error occurred while the LLM is producing the output will be emitted ... as an SSE data event",
    # shaped {"error": {"code": number, "message": string}}; 502 "Your chosen model is down".
    down = sse(
        ": OPENROUTER PROCESSING",
        {"error": {"code": 502, "message": "Provider returned error"}, "choices": []},
        "data: [DONE]",
    )
    llm.push(Reply(raw=down), Reply("八点见。"))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert result.content == "八点见。"
    assert len(llm.requests) == 2


async def test_an_error_after_part_of_the_answer_stays_a_cut_and_nothing_reaches_the_group(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    # OpenRouter's documented mid-stream error ("Handling Errors During Streaming"): HTTP 200 already
    # sent, a chunk with a top-level `error` and `finish_reason: "error"`.
    body = sse(
        ": OPENROUTER PROCESSING",
        delta("今晚八点", role="assistant"),
        {
            "id": "gen-1",
            "object": "chat.completion.chunk",
            "error": {"code": "server_error", "message": "Provider disconnected unexpectedly"},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
        },
    )
    llm.push(Reply(raw=body))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "几点？")
    assert (outcome, sent) == ("error", [APOLOGY])
    assert any("error mid-stream" in line and "Provider disconnected" in line for line in lines)
    assert not any("今晚八点" in m.content for m in await rt.store.get_history(GROUP.id))
    assert len(llm.requests) == 1  # the model answered in part: not paid for twice


async def test_a_cut_stream_error_is_not_retried_even_with_a_status_code(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    body = sse(delta("今晚"), {"error": {"code": 503, "message": "overloaded"}})
    llm.push(Reply(raw=body))
    with pytest.raises(LLMStreamCut):
        await client.chat(model, MESSAGES, purpose="对话")
    assert len(llm.requests) == 1


# ---- context too long, as more providers word it (R-RUN-9's retry) --------------------------------
# Moonshot/Kimi: MoonshotAI/kimi-cli#2011 (400, {'error': {'message': 'Invalid request: Your request
# exceeded model token limit: 262144 (requested: 269030)', 'type': 'invalid_request_error'}}) and
# MoonshotAI/MoonshotAI-Cookbook#18 ('model max length exceeded, max length:8192').
# SiliconFlow: chatboxai/chatbox#2060 (400, {"code":20015,"message":"length of prompt_tokens (68957)
# must be less than max_seq_len (65536).","data":null}); continuedev/continue#10993 (400,
# "max_total_tokens (33802) must be less than or equal to max_seq_len (32768)").
# vLLM's engine: xorbitsai/inference#3785 ("The decoder prompt (length 21535) is longer than the
# maximum model length of 16384").
# DashScope compatible mode: "Range of input length should be [1, 30720]" (already known; kept as
# a regression check with its InvalidParameter prefix).
PROVIDER_CONTEXT_ERRORS = {
    "moonshot": {
        "error": {
            "message": "Invalid request: Your request exceeded model token limit: 6000 (requested: 6817)",
            "type": "invalid_request_error",
        }
    },
    "moonshot-v1": {
        "error": {"message": "model max length exceeded, max length:6000", "type": "invalid_request_error"}
    },
    "siliconflow": {
        "code": 20015,
        "message": "length of prompt_tokens (6817) must be less than max_seq_len (6000).",
        "data": None,
    },
    "siliconflow-total": {
        "code": 20015,
        "message": "max_total_tokens (6817) must be less than or equal to max_seq_len (6000)",
        "data": None,
    },
    "vllm-engine": {
        "object": "error",
        "message": "The decoder prompt (length 6817) is longer than the maximum model length of 6000."
        " Make sure that `max_model_len` is no smaller than the number of text tokens.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    },
    "dashscope": {
        "error": {
            "code": "invalid_parameter_error",
            "param": None,
            "message": "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 6000]",
            "type": "invalid_request_error",
        }
    },
}


@pytest.mark.parametrize("provider", sorted(PROVIDER_CONTEXT_ERRORS))
async def test_r_run_9_each_providers_context_error_retries_under_the_literal_rule(
    make: Make, provider: str
) -> None:
    window = 6000
    env = await make(summary={"context_window": window})
    await seed(env.rt, 80, size=80)
    env.model.summary.append(Reply(status=400, raw=json.dumps(PROVIDER_CONTEXT_ERRORS[provider])))
    result = await env.rt.compression.compress(SERVICE_GROUP.id)
    assert result.outcome == "done"
    first, *rest = env.model.summary_requests()
    assert not literal_fit(first, window)
    assert rest
    assert all(literal_fit(b, window) for b in rest)


# ---- reasoning never reaches the group, the history nor the summary ------------------------------
# DeepSeek deepseek-reasoner (api-docs.deepseek.com/guides/reasoning_model): `reasoning_content`
# deltas before `content` ones, usage with prompt_cache_hit_tokens in the last chunk (choices: []).
async def test_r_run_7_a_summary_whose_reasoning_talks_in_section_headings_stores_the_content_only(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    for i in range(4):
        await rt.agent.record(GROUP, Message(role="user", content=f"[小明(12345)] 第{i}句", name="12345"))
    summary = "【最近在聊什么】\n小明在数数\n【谁有问题没回应】\n无\n【关键原话要点】\n无"
    thought = "先列【最近在聊什么】\n草稿：小红在唱歌\n【保留原文】\n#1 #2 #3 #4"
    llm.push(Reply(f"{summary}\n【保留原文】\n无", reasoning=thought))
    await rt.compression.compress(GROUP.id)
    stored = await rt.store.get_meta(SUMMARY_NAMESPACE, GROUP.id)
    assert stored is not None
    assert stored["text"] == summary
    history = await rt.store.get_history(GROUP.id)
    assert not any("小红在唱歌" in m.content for m in history)
    assert not any(m.content.startswith("[小明(12345)] 第") for m in history)  # none kept verbatim


async def test_a_reasoner_answer_in_qq_and_its_estimate_hold_no_thinking(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    thought = "他问几点，我查一下……" * 50
    llm.push(Reply("八点见。", reasoning=thought, usage=None))
    outcome, sent = await ask_in_group(rt, "几点？")
    assert (outcome, sent) == ("replied", ["八点见。"])
    answer = (await rt.store.get_history(GROUP.id))[-1]
    assert answer.content == "八点见。"
    # The stored estimate (what the next prompt is sized by) is of the answer alone.
    assert answer.tokens is not None
    assert answer.tokens < 20
    # The ledger counts the thinking, which the provider bills.
    await rt.store.flush_ledger()
    totals = await rt.store.usage_totals(GROUP.id)
    assert totals["对话"][1] > 100


# ---- the stream's edge cases, as real providers send them ---------------------------------------
async def test_openrouter_comments_crlf_usage_after_empty_choices_split_utf8(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # OpenRouter's keep-alive comments (docs "Streaming": ": OPENROUTER PROCESSING"), an Azure-style
    # first chunk with `choices: []` (prompt_filter_results), the finish reason only in the last
    # content chunk, usage in a final chunk with empty choices (OpenAI `stream_options.include_usage`),
    # CRLF line ends, and 5-byte HTTP chunks that split every CJK character's UTF-8 bytes.
    body = sse(
        ": OPENROUTER PROCESSING",
        {"id": "gen-1", "object": "chat.completion.chunk", "choices": [], "prompt_filter_results": []},
        delta("", role="assistant"),
        ": OPENROUTER PROCESSING",
        delta("今晚八点，"),
        delta("老地方见🎮", finish="stop"),
        {
            "id": "gen-1",
            "choices": [],
            "usage": {"prompt_tokens": 52, "completion_tokens": 9, "total_tokens": 61},
        },
        "data: [DONE]",
        end="\r\n",
    )
    llm.push(Reply(raw=body, raw_chunk_bytes=5))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert result.content == "今晚八点，老地方见🎮"
    assert (result.finish_reason, result.usage) == ("stop", Usage(52, 9))


async def test_dashscope_asked_for_usage_and_reports_it_without_done_missing(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # DashScope compatible mode (help.aliyun.com, "OpenAI 兼容-Chat"): usage only when
    # stream_options.include_usage is set, then in a last chunk with "choices": [].
    llm.push(Reply("好的", usage={"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32}))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert llm.requests[-1]["stream_options"] == {"include_usage": True}
    assert result.usage == Usage(30, 2)


# ---- relays: HTML 502 pages, plain text, 429 with Retry-After, a wrong key -----------------------
# one-api / new-api behind nginx: nginx's own 502 page when the upstream is down.
NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway"
    "</h1></center>\r\n<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n"
)


async def test_a_relays_html_502_is_retried_then_answers(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(status=502, raw=NGINX_502, headers={"Content-Type": "text/html"}), Reply("好的"))
    assert (await client.chat(model, MESSAGES, purpose="对话")).content == "好的"
    assert len(llm.requests) == 2


async def test_a_429_retry_after_is_waited_for(llm: ScriptedLLM, model: ModelConfig) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    client = LLMClient(timeout=5, sleep=sleep)
    try:
        # new-api's quota message, in its OpenAI-shaped body, with the Retry-After it relays.
        body = json.dumps(
            {"error": {"message": "当前分组上游负载已饱和，请稍后再试", "type": "new_api_error"}}
        )
        llm.push(Reply(status=429, raw=body, headers={"Retry-After": "3"}), Reply("好的"))
        assert (await client.chat(model, MESSAGES, purpose="对话")).content == "好的"
    finally:
        await client.aclose()
    assert waits == [3.0]


async def test_a_wrong_key_at_a_relay_is_logged_without_the_key(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # one-api's 401 for an unknown token echoes it (songquanpeng/one-api middleware/auth.go:
    # "无效的令牌" in an OpenAI-shaped error); here with the whole key, as a careless relay would.
    body = json.dumps(
        {"error": {"message": f"无效的令牌 {API_KEY} (request id: 2024)", "type": "one_api_error"}}
    )
    llm.push(Reply(status=401, raw=body))
    with captured("INFO") as lines, pytest.raises(LLMStatusError) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    assert caught.value.status == 401
    assert "无效的令牌" in str(caught.value)
    assert API_KEY not in str(caught.value)
    assert lines
    assert not any(API_KEY in line for line in lines)
    assert len(llm.requests) == 1  # a wrong key is not asked again
