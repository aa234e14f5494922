"""Audit 8 (z): the providers the sixth audit did not replay.

Zhipu GLM, Volcengine Ark (Doubao), MiniMax, Google Gemini's OpenAI-compatible endpoint, Azure
OpenAI, xAI/Grok, Anthropic's OpenAI-compatible endpoint and SiliconFlow's newer wording, replayed
byte for byte by the scripted server through the real client, the real SQLite store and the real
compression service: what reaches the group (the answer; on failure the owner's
MEMSUM_ERROR_REPLY and a log line with the provider's own reason), what is stored, whether each
provider's "context too long" is known as one (R-RUN-9's retry under the literal rule), content
filters, rate limits, and whether the configuration can reach the provider at all (Azure's
`api-key` header and `api-version` query). Each fixture cites where its bytes come from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.errors import CompressionError
from nonebot_plugin_memsum.llm.client import LLMClient, Usage
from nonebot_plugin_memsum.llm.errors import (
    LLMAuthError,
    LLMBadRequest,
    LLMRateLimited,
    LLMServerError,
    in_chinese,
    is_context_too_long,
)
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message
from tests.fakes import providers
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import connected, wait_log
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.onebot import SEND_ACTIONS
from tests.fakes.providers import APOLOGY, GROUP, MESSAGES, ask_in_group, sse
from tests.fakes.service import GROUP as SERVICE_GROUP
from tests.fakes.service import Make, seed
from tests.test_compression_service_request import literal_fit

# The shared fixtures, bound here so that pytest finds them.
fresh_llm, model, client, rt = providers.fresh_llm, providers.model, providers.client, providers.rt


def sse_compact(*events: dict[str, Any] | str) -> bytes:
    """`sse` with JSON as these providers send it: without spaces."""
    return sse(*events, compact=True)


def glm_chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One chunk of Zhipu's stream (docs.bigmodel.cn, 对话补全 "流式响应" example: id, created, model,
    choices[0].delta with role and content, finish_reason only on the last, usage beside it)."""
    d: dict[str, Any] = {"role": "assistant"}
    if content is not None:
        d["content"] = content
    choice: dict[str, Any] = {"index": 0, "delta": {**d, **extra}}
    if finish is not None:
        choice["finish_reason"] = finish
    return {"id": "2025082014350212345", "created": 1755671702, "model": "glm-4.5", "choices": [choice]}


GLM_USAGE = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}


# ---- context too long, in the words of more providers (R-RUN-9's retry) ---------------------------
# Zhipu GLM: zeroclaw-labs/zeroclaw#4124 (HTTP 400, {"error":{"code":"1261","message":"Prompt exceeds
# max length"}}, glm-4.5-air at open.bigmodel.cn), tashfeenahmed/freellmapi#873 (the same 400).
# xAI/Grok: cline/cline#3120 (400 "This model's maximum prompt length is 131072 but the request
# contains 136973 tokens."), in OpenAI's error shape.
# SiliconFlow's newer wording: leookun/cursor-byok#129 (400, {"code":20015,"message":"number of input
# tokens (204703) has exceeded max_prompt_tokens (202752) limit.","data":null}).
# Anthropic's OpenAI-compatible endpoint passes its own validation message through (Anthropic docs
# "OpenAI SDK compatibility": errors keep OpenAI's shape): "input length and `max_tokens` exceed
# context limit: 196395 + 64000 > 204698, decrease input length or `max_tokens` and try again"
# (RooCodeInc/Roo-Code#3713, stackblitz/bolt.new#8383).
# MiniMax: earendil-works/pi#6061 ("invalid params, context window exceeds limit (2013)").
# Baidu Qianfan: "prompt tokens too long" (PaddlePaddle/ERNIE-SDK#336, the ERNIE models' 400), here in
# the v2 endpoint's OpenAI error shape (qianfan.baidubce.com/v2: {"error": {code, message, type}, "id"}).
# Gemini's OpenAI endpoint answers errors as a JSON array of one error (FuzzAnything/PromptFuzz#42,
# SuzumiyaAkizuki/ComfyUI-NewBie-LLM-Formatter#3); its message as arkavo-org/arkavo-edge#371 quotes it.
CONTEXT_ERRORS: dict[str, Any] = {
    "zhipu-1261": {"error": {"code": "1261", "message": "Prompt exceeds max length"}},
    "xai": {
        "code": "Client specified an invalid argument",
        "error": "This model's maximum prompt length is 6000 but the request contains 6817 tokens.",
    },
    "siliconflow-max-prompt-tokens": {
        "code": 20015,
        "message": "number of input tokens (6817) has exceeded max_prompt_tokens (6000) limit.",
        "data": None,
    },
    "anthropic-openai-compat": {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 5217 + 1600 > 6000, decrease"
            " input length or `max_tokens` and try again",
        },
    },
    "qianfan-v2": {
        "error": {
            "code": "invalid_argument",
            "message": "prompt tokens too long",
            "type": "invalid_request_error",
        },
        "id": "as-bcmt5ct4td",
    },
    "minimax-2013": {
        "error": {
            "message": "invalid params, context window exceeds limit (2013)",
            "type": "bad_request_error",
            "param": "",
            "code": None,
        }
    },
    "gemini-array": [
        {
            "error": {
                "code": 400,
                "message": "The input token count exceeds the maximum number of tokens allowed (6000).",
                "status": "INVALID_ARGUMENT",
            }
        }
    ],
}


@pytest.mark.parametrize("provider", sorted(CONTEXT_ERRORS))
async def test_each_providers_context_error_is_known_as_one(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, provider: str
) -> None:
    llm.push(Reply(status=400, raw=json.dumps(CONTEXT_ERRORS[provider], ensure_ascii=False)))
    with pytest.raises(LLMBadRequest) as caught:
        await client.chat(model, MESSAGES, purpose="摘要")
    assert is_context_too_long(caught.value.status, str(caught.value))
    assert len(llm.requests) == 1


@pytest.mark.parametrize("provider", sorted(CONTEXT_ERRORS))
async def test_r_run_9_each_providers_context_error_retries_under_the_literal_rule(
    make: Make, provider: str
) -> None:
    window = 6000
    env = await make(summary={"context_window": window})
    await seed(env.rt, 80, size=80)
    raw = json.dumps(CONTEXT_ERRORS[provider], ensure_ascii=False)
    env.model.summary.append(Reply(status=400, raw=raw))
    result = await env.rt.compression.compress(SERVICE_GROUP.id)
    assert result.outcome == "done"
    first, *rest = env.model.summary_requests()
    assert not literal_fit(first, window)
    assert rest
    assert all(literal_fit(b, window) for b in rest)


# ---- Gemini: an error body that is a JSON array ----------------------------------------------------
# generativelanguage.googleapis.com/v1beta/openai answers `[{"error": {...}}]` (FuzzAnything/
# PromptFuzz#42; MinLL/SkyrimNet-GamePlugin#77 shows the 400 of an unknown field). Its 429 as
# google-gemini/gemini-cli reports quote it ("RESOURCE_EXHAUSTED").
GEMINI_429 = [
    {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
]


async def test_gemini_error_array_reads_as_its_message(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # Before: the reason was the array's JSON, cut at 200 characters, in the log and in /压缩's answer.
    llm.push(*[Reply(status=429, raw=json.dumps(GEMINI_429))] * 3)
    with pytest.raises(LLMRateLimited) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    assert str(caught.value) == (
        "test/model: HTTP 429: You exceeded your current quota, please check your plan and billing details."
    )
    assert "[{" not in in_chinese(caught.value)
    assert len(llm.requests) == 3  # a 429 is retried


async def test_gemini_unknown_field_array_is_a_refused_parameter(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # The same array shape naming a field the endpoint does not know (its "Unknown name" wording,
    # SuzumiyaAkizuki/ComfyUI-NewBie-LLM-Formatter#3): asked again without it.
    refused = [
        {
            "error": {
                "code": 400,
                "message": "Invalid JSON payload received."
                ' Unknown name "reasoning_effort": Cannot find field.',
                "status": "INVALID_ARGUMENT",
            }
        }
    ]
    llm.push(Reply(status=400, raw=json.dumps(refused)), Reply("好的"))
    result = await client.chat(model, MESSAGES, purpose="摘要", reasoning_effort="low")
    assert result.content == "好的"
    assert "reasoning_effort" in llm.requests[0]
    assert "reasoning_effort" not in llm.requests[1]


# ---- a reply the provider stopped itself: content filters, inference errors -----------------------
# Zhipu's finish reasons (docs.bigmodel.cn, 对话补全, choices.finish_reason): "stop", "length",
# "tool_calls", "sensitive" (模型推理内容被安全审核接口拦截; 请用户自行判断并决定是否撤回已公开的内容)
# and "network_error" (模型推理异常). A GLM stream that ends with network_error and no content:
# NousResearch/hermes-agent#92161 ("terminate a chat-completions stream cleanly with finish_reason:
# network_error and zero content").
GLM_SENSITIVE = sse_compact(
    glm_chunk("关于这件事，"),
    glm_chunk("我可以告诉你"),
    glm_chunk("", finish="sensitive") | {"usage": GLM_USAGE},
    "data: [DONE]",
)
GLM_NETWORK_ERROR = sse_compact(glm_chunk("", finish="network_error") | {"usage": GLM_USAGE}, "data: [DONE]")
# Azure OpenAI (learn.microsoft.com, "Content filtering", streaming: a first chunk with
# `prompt_filter_results` and empty choices, `content_filter_results` on each chunk, and
# finish_reason "content_filter" when the completion is filtered; the same reason at OpenAI).
AZURE_FILTERED = sse_compact(
    {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [
            {"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False, "severity": "safe"}}}
        ],
    },
    {
        "choices": [
            {
                "content_filter_results": {},
                "delta": {"content": "", "role": "assistant"},
                "finish_reason": None,
                "index": 0,
            }
        ],
        "created": 1717000000,
        "id": "chatcmpl-9Uaz",
        "model": "gpt-4o-2024-05-13",
        "object": "chat.completion.chunk",
    },
    {
        "choices": [
            {
                "content_filter_results": {"violence": {"filtered": False, "severity": "low"}},
                "delta": {"content": "他们打起来以后"},
                "finish_reason": None,
                "index": 0,
            }
        ],
        "created": 1717000000,
        "id": "chatcmpl-9Uaz",
        "model": "gpt-4o-2024-05-13",
        "object": "chat.completion.chunk",
    },
    {
        "choices": [
            {
                "content_filter_results": {"violence": {"filtered": True, "severity": "medium"}},
                "delta": {},
                "finish_reason": "content_filter",
                "index": 0,
            }
        ],
        "created": 1717000000,
        "id": "chatcmpl-9Uaz",
        "model": "gpt-4o-2024-05-13",
        "object": "chat.completion.chunk",
    },
    "data: [DONE]",
)


@pytest.mark.parametrize(
    ("body", "reason", "said"),
    [
        pytest.param(GLM_SENSITIVE, "sensitive", "我可以告诉你", id="zhipu-sensitive"),
        pytest.param(AZURE_FILTERED, "content_filter", "他们打起来以后", id="azure-content-filter"),
    ],
)
async def test_a_filtered_reply_never_reaches_the_group_nor_the_history(
    rt: Runtime, llm: ScriptedLLM, body: bytes, reason: str, said: str
) -> None:
    # Before: the part the filter let through went to the group as the answer and into the memory.
    llm.push(Reply(raw=body))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "那天到底发生了什么？")
    assert (outcome, sent) == ("error", [APOLOGY])
    assert any(reason in line for line in lines)
    assert not any(said in m.content for m in await rt.store.get_history(GROUP.id))
    assert len(llm.requests) == 1  # the same question would be filtered again


async def test_a_glm_network_error_is_a_failure_not_silence(rt: Runtime, llm: ScriptedLLM) -> None:
    # Before: the empty reply was taken for the model choosing to stay silent: no answer, no log line.
    llm.push(Reply(raw=GLM_NETWORK_ERROR))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "在吗")
    assert (outcome, sent) == ("error", [APOLOGY])
    assert any("network_error" in line for line in lines)


async def test_a_filtered_summary_is_not_stored(rt: Runtime, llm: ScriptedLLM) -> None:
    for i in range(4):
        await rt.agent.record(GROUP, Message(role="user", content=f"[小明(12345)] 第{i}句", name="12345"))
    partial = sse_compact(
        glm_chunk("【最近在聊什么】\n小明在"), glm_chunk("", finish="sensitive"), "data: [DONE]"
    )
    llm.push(Reply(raw=partial))
    with pytest.raises(CompressionError) as caught:
        await rt.compression.compress(GROUP.id)
    assert "内容审核" in caught.value.reason
    assert await rt.store.get_meta(SUMMARY_NAMESPACE, GROUP.id) is None
    assert len(await rt.store.get_history(GROUP.id)) == 4  # nothing archived


# ---- Azure OpenAI's deployment URL: `api-key` header, `api-version` query ---------------------------
# learn.microsoft.com, "Azure OpenAI in Azure AI Foundry Models REST API reference" (data plane
# inference): POST {endpoint}/openai/deployments/{deployment-id}/chat/completions?api-version=
# 2024-10-21, authenticated by an `api-key: <key>` header (a Bearer token is for Microsoft Entra
# ID); Azure China (docs.azure.cn) documents the same form. The v1 API (/openai/v1, no api-version)
# takes the key as a Bearer token, as the README already says.
AZURE_401 = {
    "error": {
        "code": "401",
        "message": "Access denied due to invalid subscription key or wrong API endpoint. Make sure to"
        " provide a valid key for an active subscription and use a correct regional API endpoint for"
        " your resource.",
    }
}


def azure_model(llm: ScriptedLLM) -> ModelConfig:
    origin = llm.base_url.removesuffix("/v1")
    return ModelConfig(
        **llm.model_config(
            "azure/gpt-4o-mini",
            base_url=f"{origin}/openai/deployments/gpt-4o-mini?api-version=2024-10-21",
            api_key_header="api-key",
        )
    )


async def test_azure_deployment_url_and_api_key_header_reach_it(llm: ScriptedLLM, tmp_path: Path) -> None:
    # Before: the bot appended /chat/completions after the query (…?api-version=2024-10-21/chat/
    # completions) and sent the key as a Bearer token: an Azure deployment could not be reached.
    config = Config(memsum_models=[azure_model(llm)], memsum_persona="你是群助手小记。")
    rt = await runtime.build(config, tmp_path / "memsum.db", ["小记"], {"10001"})
    try:
        llm.push(Reply("八点开黑。"))
        outcome, sent = await ask_in_group(rt, "今晚几点？")
    finally:
        await runtime.close(rt)
    assert (outcome, sent) == ("replied", ["八点开黑。"])
    assert llm.request_paths == ["/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21"]
    headers = llm.request_headers[0]
    assert headers["api-key"] == API_KEY
    assert "authorization" not in headers


async def test_azure_wrong_key_is_said_without_the_key(client: LLMClient, llm: ScriptedLLM) -> None:
    llm.push(Reply(status=401, raw=json.dumps(AZURE_401)))
    with captured("INFO") as lines, pytest.raises(LLMAuthError) as caught:
        await client.chat(azure_model(llm), MESSAGES, purpose="对话")
    assert "invalid subscription key" in in_chinese(caught.value)
    assert lines
    assert not any(API_KEY in line for line in lines)
    assert len(llm.requests) == 1  # a 401 is not retried


def test_the_key_header_is_one_header_name() -> None:
    base = {
        "id": "azure/gpt-4o",
        "base_url": "https://x.openai.azure.com/openai/v1",
        "context_window": 128000,
    }
    assert ModelConfig(**base).api_key_header == "Authorization"
    for bad in ("api key", "api-key:", "", "api-key\\n"):
        with pytest.raises(ValidationError):
            ModelConfig(**base, api_key_header=bad)


# ---- MiniMax: errors in `base_resp` with HTTP 200, thinking in the content -------------------------
# MiniMax's OpenAI-compatible chat completion (api.minimaxi.com/v1) can answer HTTP 200 with no
# choices and the error in `base_resp` (MiniMax-AI/MiniMax-01#15: status_code 1039, "token limit";
# its code table, platform.minimaxi.com "错误码", as ENTERPILOT/GoModel#640 maps it: 1002/1039 rate
# limits, 1004 authentication, 1008 insufficient balance, 1026 sensitive input, 2013 parameters).
def minimax_error(code: int, msg: str) -> str:
    return json.dumps(
        {
            "id": "03e19de25d5cdd89c3c8364c5be8d1c9",
            "choices": None,
            "created": 1737648866,
            "model": "MiniMax-Text-01",
            "object": "chat.completion",
            "usage": {"total_tokens": 0, "total_characters": 0},
            "input_sensitive": False,
            "output_sensitive": False,
            "input_sensitive_type": 0,
            "output_sensitive_type": 0,
            "output_sensitive_int": 0,
            "base_resp": {"status_code": code, "status_msg": msg},
        }
    )


async def test_minimax_rate_limit_in_base_resp_is_retried(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # Before: "not a chat completion", not retried, and the owner told to check base_url.
    llm.push(Reply(raw=minimax_error(1039, "token limit")), Reply("好的"))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert result.content == "好的"
    assert len(llm.requests) == 2


async def test_minimax_insufficient_balance_is_said_as_such(rt: Runtime, llm: ScriptedLLM) -> None:
    llm.default = Reply(raw=minimax_error(1008, "insufficient balance"))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "在吗")
    assert (outcome, sent) == ("error", [APOLOGY])
    warning = next(line for line in lines if "turn of" in line)
    assert "insufficient balance" in warning
    assert "base_url" not in warning
    assert "not a chat completion" not in warning


async def test_minimax_sensitive_input_is_a_refusal(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(raw=minimax_error(1026, "input new_sensitive")))
    with pytest.raises(LLMBadRequest) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    assert "new_sensitive" in in_chinese(caught.value)
    assert len(llm.requests) == 1


async def test_minimax_base_resp_error_as_a_stream_event_is_not_an_empty_answer(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    # The same error body sent as the one event of a stream (a relay that streams whatever it gets):
    # without a look at `base_resp` it read as an empty reply, i.e. the bot choosing silence.
    body = f"data: {minimax_error(1004, 'login fail: Please carry the API secret key')}\n\ndata: [DONE]\n\n"
    llm.push(Reply(raw=body))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "在吗")
    assert (outcome, sent) == ("error", [APOLOGY])
    assert any("HTTP 401" in line and "login fail" in line for line in lines)


# ---- Gemini 3: a tool call's thought signature goes back with it ---------------------------------
# ai.google.dev/gemini-api/docs/thought-signatures, "OpenAI compatibility": the signature of a
# function call comes in `tool_calls[i].extra_content.google.thought_signature`, and Gemini 3 models
# require it back on that assistant message, else HTTP 400 "Function call is missing a
# thought_signature in functionCall parts…" (as lbjlaq/Antigravity-Manager#938 and TokenRhythm/
# opensquilla#225 quote it, the latter in the endpoint's JSON-array error shape). The stream: the
# whole call in one delta, finish reason and usage on the same last chunk, then [DONE].
SIGNATURE = "CiQBjz1rX7Ym0ZyOHbDNc3yZ5hPq2QdC4X0gmfY1c5r0pQ1s4GQKZQGPPWtfO8Nw+2Zb5iY"
GEMINI_TOOL_CALL = sse_compact(
    {
        "choices": [
            {
                "delta": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "extra_content": {"google": {"thought_signature": SIGNATURE}},
                            "function": {"arguments": '{"query":"开黑"}', "name": "recall"},
                            "id": "function-call-4117452751496781512",
                            "index": 0,
                            "type": "function",
                        }
                    ],
                },
                "finish_reason": "tool_calls",
                "index": 0,
            }
        ],
        "created": 1763900000,
        "id": "Wj0jacLTLrTez7IPkYyq8Qg",
        "model": "gemini-3-flash-preview",
        "object": "chat.completion.chunk",
        "usage": {"completion_tokens": 18, "prompt_tokens": 980, "total_tokens": 1120},
    },
    "data: [DONE]",
)
MISSING_SIGNATURE = [
    {
        "error": {
            "code": 400,
            "message": "Function call is missing a thought_signature in functionCall parts. This is required"
            " for tools to work correctly, and missing thought_signature may lead to degraded model"
            " performance. Additional data, function call `default_api:recall` , position 2. Please refer"
            " to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.",
            "status": "INVALID_ARGUMENT",
        }
    }
]


def gemini_3(body: dict[str, Any]) -> Reply:
    """Gemini 3's check: every assistant tool call sent back carries its signature."""
    calls = [c for m in body["messages"] if m.get("role") == "assistant" for c in m.get("tool_calls") or ()]
    if not calls:
        return Reply(raw=GEMINI_TOOL_CALL)
    if any(
        (c.get("extra_content") or {}).get("google", {}).get("thought_signature") != SIGNATURE for c in calls
    ):
        return Reply(status=400, raw=json.dumps(MISSING_SIGNATURE))
    return Reply("上周六晚上八点开黑过。")


async def test_gemini_3_tool_call_goes_back_with_its_thought_signature(rt: Runtime, llm: ScriptedLLM) -> None:
    # Before: the signature was dropped, the second round got the 400, and every question that
    # made the model search the archive (the built-in recall tool) got the apology.
    llm.on_request(gemini_3)
    outcome, sent = await ask_in_group(rt, "我们上次开黑是什么时候？")
    assert (outcome, sent) == ("replied", ["上周六晚上八点开黑过。"])
    assert len(llm.requests) == 2
    # Stored with the call, so a later turn that sends the same history back passes too.
    llm.reset()
    llm.on_request(gemini_3)
    outcome, sent = await ask_in_group(rt, "那再上一次呢？")
    assert (outcome, sent) == ("replied", ["上周六晚上八点开黑过。"])
    assert len(llm.requests) == 1


# MiniMax-M2 through the OpenAI-compatible API (MiniMax-AI/MiniMax-M2 README, "Tool calling / Thinking":
# the model's thinking comes in the content wrapped in <think>...</think> unless `reasoning_split` is
# asked for); the last chunk carries `base_resp` with status_code 0, as MiniMax's answers do.
MINIMAX_M2_STREAM = sse_compact(
    *(
        {
            "id": "0508a2b0c6d1",
            "choices": [{"index": 0, "delta": {"content": piece, "role": "assistant"}}],
            "created": 1761700000,
            "model": "MiniMax-M2",
            "object": "chat.completion.chunk",
        }
        for piece in ("<think>\n小明问今晚", "打不打游戏，群里说过八点。\n</think>\n\n", "八点老地方见！")
    ),
    {
        "id": "0508a2b0c6d1",
        "choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
        "created": 1761700000,
        "model": "MiniMax-M2",
        "object": "chat.completion.chunk",
        "usage": {"total_tokens": 90, "prompt_tokens": 60, "completion_tokens": 30},
        "base_resp": {"status_code": 0, "status_msg": ""},
    },
    "data: [DONE]",
)


async def test_minimax_m2_thinking_in_the_content_never_reaches_the_group(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    llm.push(Reply(raw=MINIMAX_M2_STREAM))
    outcome, sent = await ask_in_group(rt, "今晚打游戏吗")
    assert (outcome, sent) == ("replied", ["八点老地方见！"])
    assert (await rt.store.get_history(GROUP.id))[-1].content == "八点老地方见！"


# ---- more of each provider's everyday shapes (coverage) --------------------------------------------
# GLM-4.5+ thinking (docs.bigmodel.cn, "深度思考": `thinking: {"type": "enabled"}` by default on
# GLM-4.5; the stream sends `reasoning_content` deltas before the `content` ones).
GLM_THINKING = sse_compact(
    glm_chunk(reasoning_content="小明问晚上"),
    glm_chunk(reasoning_content="打不打游戏，先看群里约的时间。"),
    glm_chunk("八点"),
    glm_chunk("上线。"),
    glm_chunk("", finish="stop") | {"usage": GLM_USAGE},
    "data: [DONE]",
)


async def test_glm_thinking_reaches_neither_the_group_nor_the_history(rt: Runtime, llm: ScriptedLLM) -> None:
    llm.push(Reply(raw=GLM_THINKING))
    outcome, sent = await ask_in_group(rt, "今晚打游戏吗")
    assert (outcome, sent) == ("replied", ["八点上线。"])
    history = await rt.store.get_history(GROUP.id)
    assert history[-1].content == "八点上线。"
    assert not any("先看群里" in m.content for m in history)
    await rt.store.flush_ledger()
    assert (await rt.store.usage_totals(GROUP.id))["对话"][:2] == (40, 12)  # GLM's own usage


# Zhipu's input review (docs.bigmodel.cn "错误码": 1301, HTTP 400) and its rate limit (1302, HTTP 429,
# "您当前使用该API的并发数过高，请降低并发，或联系客服增加限额。"), in its {"error": {code, message}} shape.
ZHIPU_1301 = {
    "error": {
        "code": "1301",
        "message": "系统检测到输入或生成内容可能包含不安全或敏感内容，"
        "请您避免输入易产生敏感内容的提示语，感谢您的配合。",
    }
}
ZHIPU_1302 = {
    "error": {"code": "1302", "message": "您当前使用该API的并发数过高，请降低并发，或联系客服增加限额。"}
}


async def test_zhipu_input_review_refusal_apologises_and_names_it(rt: Runtime, llm: ScriptedLLM) -> None:
    llm.push(Reply(status=400, raw=json.dumps(ZHIPU_1301, ensure_ascii=False)))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "说点什么")
    assert (outcome, sent) == ("error", [APOLOGY])
    assert any("HTTP 400" in line and "不安全或敏感内容" in line for line in lines)
    # The refused request, and one probe of the history alone (audit 8 m, tests/test_audit8_m.py:
    # a refused input is searched for); the probe passes and there is no summary to leave out.
    assert len(llm.requests) == 2


async def test_zhipu_concurrency_limit_is_retried(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(status=429, raw=json.dumps(ZHIPU_1302, ensure_ascii=False)), Reply("好的"))
    assert (await client.chat(model, MESSAGES, purpose="对话")).content == "好的"
    assert len(llm.requests) == 2


# Anthropic's OpenAI-compatible endpoint (docs.anthropic.com "OpenAI SDK compatibility"; rate limits:
# "429 error … with a retry-after header indicating how long to wait"), error body in its own shape.
async def test_anthropic_429_retry_after_is_waited_for(llm: ScriptedLLM, model: ModelConfig) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    client = LLMClient(timeout=5, sleep=sleep)
    body = {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed your organization's rate limit",
        },
    }
    llm.push(Reply(status=429, raw=json.dumps(body), headers={"retry-after": "7"}), Reply("好的"))
    try:
        assert (await client.chat(model, MESSAGES, purpose="对话")).content == "好的"
    finally:
        await client.aclose()
    assert waits == [7.0]


# Volcengine Ark (www.volcengine.com/docs/82379, "Chat API"): base_url https://ark.cn-beijing.volces.com/
# api/v3, `model` is the endpoint id (ep-…) or the model id; doubao-seed thinking in `reasoning_content`;
# usage in a last chunk with empty choices when stream_options.include_usage is set.
ARK_STREAM = sse_compact(
    *(
        {
            "choices": [{"delta": d, "index": 0}],
            "created": 1751000000,
            "id": "021751000000abcdef",
            "model": "doubao-seed-1-6-250615",
            "service_tier": "default",
            "object": "chat.completion.chunk",
            "usage": None,
        }
        for d in (
            {"content": "", "reasoning_content": "群友问周末", "role": "assistant"},
            {"content": "", "reasoning_content": "去哪玩。", "role": "assistant"},
            {"content": "周末去爬山吧！", "role": "assistant"},
        )
    ),
    {
        "choices": [{"delta": {"content": "", "role": "assistant"}, "finish_reason": "stop", "index": 0}],
        "created": 1751000000,
        "id": "021751000000abcdef",
        "model": "doubao-seed-1-6-250615",
        "object": "chat.completion.chunk",
        "usage": None,
    },
    {
        "choices": [],
        "created": 1751000000,
        "id": "021751000000abcdef",
        "model": "doubao-seed-1-6-250615",
        "object": "chat.completion.chunk",
        "usage": {
            "completion_tokens": 20,
            "prompt_tokens": 70,
            "total_tokens": 90,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 12},
        },
    },
    "data: [DONE]",
)


async def test_ark_endpoint_id_is_sent_and_doubao_thinking_stays_out(
    client: LLMClient, llm: ScriptedLLM
) -> None:
    model = ModelConfig(**llm.model_config("ark/doubao-seed", model="ep-20250601123456-abcde"))
    llm.push(Reply(raw=ARK_STREAM))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert llm.requests[0]["model"] == "ep-20250601123456-abcde"
    assert (result.content, result.usage) == ("周末去爬山吧！", Usage(70, 20))
    assert result.reasoning == "群友问周末去哪玩。"


# Gemini's OpenAI endpoint streams usage on the last content chunk, beside its finish reason
# (ai.google.dev/gemini-api/docs/openai, "Streaming"; continuedev/continue#8865's recorded chunks).
async def test_gemini_usage_on_the_finishing_chunk(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    body = sse_compact(
        {
            "choices": [{"delta": {"content": "周六", "role": "assistant"}, "index": 0}],
            "created": 1763900000,
            "id": "Wj0jacLT",
            "model": "gemini-2.5-flash",
            "object": "chat.completion.chunk",
        },
        {
            "choices": [
                {"delta": {"content": "见！", "role": "assistant"}, "finish_reason": "stop", "index": 0}
            ],
            "created": 1763900000,
            "id": "Wj0jacLT",
            "model": "gemini-2.5-flash",
            "object": "chat.completion.chunk",
            "usage": {"completion_tokens": 3, "prompt_tokens": 41, "total_tokens": 60},
        },
        "data: [DONE]",
    )
    llm.push(Reply(raw=body))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert (result.content, result.usage) == ("周六见！", Usage(41, 3))


async def test_a_zhipu_context_error_in_a_chat_turn_apologises_and_names_it(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    # The chat has no retry of its own for a context too long (its trim budget keeps the request
    # inside the configured window); the owner reads GLM's reason in the warning.
    llm.push(Reply(status=400, raw=json.dumps(CONTEXT_ERRORS["zhipu-1261"])))
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "总结一下")
    assert (outcome, sent) == ("error", [APOLOGY])
    assert any("Prompt exceeds max length" in line for line in lines)


# ---- a context too long said with HTTP 500 (self-hosted servers) ------------------------------------
# llama.cpp's server from PR #15780 ("server: add exceed_context_size_error type", 2025-09-03) until
# PR #16486 made it a 400: code 500 with that type; its other path, still in 2026 (ggml-org/llama.cpp
# #19774, "sometimes the reply is 500"): {"error":{"code":500,"message":"Context size has been
# exceeded.","type":"server_error"}}; Xinference serving vLLM (langchain-ai/deepagents#468: "Error
# code: 500 - {'detail': '... The decoder prompt (length 66501) is longer than the maximum model
# length of 65536 ...'}").
CONTEXT_ERRORS_500: dict[str, Any] = {
    "llama.cpp-15780": {
        "error": {
            "code": 500,
            "message": "the request exceeds the available context size. try increasing the context size or"
            " enable context shift",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 6817,
            "n_ctx": 6000,
        }
    },
    "llama.cpp-19774": {
        "error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}
    },
    "xinference": {
        "detail": "[address=0.0.0.0:43769, pid=1065] The decoder prompt (length 6817) is longer than the"
        " maximum model length of 6000. Make sure that `max_model_len` is no smaller than the number of"
        " text tokens."
    },
}


@pytest.mark.parametrize("server", sorted(CONTEXT_ERRORS_500))
async def test_a_500_saying_context_too_long_is_known_and_not_retried(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, server: str
) -> None:
    # Before: retried twice (the same too-long request, each a full prompt for a local GPU), then
    # taken for a server failure.
    llm.default = Reply(status=500, raw=json.dumps(CONTEXT_ERRORS_500[server]))
    with pytest.raises(LLMServerError) as caught:
        await client.chat(model, MESSAGES, purpose="摘要")
    assert is_context_too_long(caught.value.status, str(caught.value))
    assert len(llm.requests) == 1


@pytest.mark.parametrize("server", sorted(CONTEXT_ERRORS_500))
async def test_r_run_9_a_500_saying_context_too_long_retries_under_the_literal_rule(
    make: Make, server: str
) -> None:
    window = 6000
    env = await make(summary={"context_window": window})
    await seed(env.rt, 80, size=80)
    env.model.summary.append(Reply(status=500, raw=json.dumps(CONTEXT_ERRORS_500[server])))
    result = await env.rt.compression.compress(SERVICE_GROUP.id)
    assert result.outcome == "done"
    first, *rest = env.model.summary_requests()
    assert not literal_fit(first, window)
    assert rest
    assert all(literal_fit(b, window) for b in rest)


async def test_a_plain_500_is_still_retried(client: LLMClient, llm: ScriptedLLM, model: ModelConfig) -> None:
    llm.push(
        Reply(status=500, raw=json.dumps({"error": {"code": 500, "message": "internal error"}})),
        Reply("好的"),
    )
    assert (await client.chat(model, MESSAGES, purpose="对话")).content == "好的"
    assert len(llm.requests) == 2


# ---- xAI names a refused parameter in camelCase --------------------------------------------------
# BerriAI/litellm#16265 (HTTP 400, {"code":"Client specified an invalid argument","error":"Model
# grok-4-latest does not support parameter reasoningEffort."}); chenyme/grok2api#814 (the same with
# "code":"invalid-argument"); only some Grok models take `reasoning_effort` (hermes-agent#23435).
async def test_xai_refusing_reasoning_effort_in_camel_case_is_asked_again_without_it(
    client: LLMClient, llm: ScriptedLLM
) -> None:
    # Before: not known as a refused parameter: every summary of a Grok 4 model configured with
    # thinking_levels failed, and compression backed off for good.
    model = ModelConfig(**llm.model_config("xai/grok-4", thinking_levels=["low", "high"]))
    refused = {
        "code": "Client specified an invalid argument",
        "error": "Model grok-4-latest does not support parameter reasoningEffort.",
    }
    llm.push(Reply(status=400, raw=json.dumps(refused)), Reply("【最近在聊什么】\n周末爬山"))
    with captured("WARNING") as lines:
        result = await client.chat(model, MESSAGES, purpose="摘要", reasoning_effort="low")
    assert result.content.startswith("【最近在聊什么】")
    assert [("reasoning_effort" in r) for r in llm.requests] == [True, False]
    assert any("does not accept `reasoning_effort`" in line for line in lines)
    await client.chat(model, MESSAGES, purpose="摘要", reasoning_effort="low")
    assert "reasoning_effort" not in llm.requests[-1]  # remembered


# ---- the whole bot: an Azure deployment from .env, a filtered reply, over the real WebSocket ---------
@pytest.mark.e2e
async def test_bot_with_an_azure_deployment_answers_and_keeps_a_filtered_reply_out_of_qq(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    origin = llm.base_url.removesuffix("/v1")
    model = llm.model_config(
        "azure/gpt-4o-mini",
        base_url=f"{origin}/openai/deployments/gpt-4o-mini?api-version=2024-10-21",
        api_key_header="api-key",
    )
    llm.push(Reply("八点开黑。"), Reply(raw=AZURE_FILTERED))
    env = {"MEMSUM_MODELS": json.dumps([model])}
    async with BotProcess(tmp_path, env=env, log_level="INFO") as bot, connected(bot) as sim:
        await sim.group_message(7, 12345, "小记 今晚几点？")
        await sim.wait_call(set(SEND_ACTIONS))
        before = len(sim.calls)
        await sim.group_message(7, 12345, "小记 那天到底发生了什么？")
        await sim.wait_call(set(SEND_ACTIONS), after=before)
        texts = sim.sent_texts()
        log = await wait_log(bot, "content_filter")
    assert texts == ["八点开黑。", APOLOGY]
    assert set(llm.request_paths) == {
        "/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21"
    }
    assert all(h.get("api-key") == API_KEY and "authorization" not in h for h in llm.request_headers)
    assert API_KEY not in log
