"""Audit 16 (llm): answers of the OpenAI-compatible client that ended in a misleading message.

An error sent with HTTP 200 as the whole body (a gateway, a vLLM wrapper, a server that ignored
`stream: true`) was "not a chat completion" and the owner was told to check base_url; a stream
of only `data: [DONE]` was an empty answer, and the turn ended silent as if the model chose to.
Each fixture cites where its bytes come from; all go through the real client against the
scripted server, the real SQLite store and the real compression service.
"""

from __future__ import annotations

import json

import pytest

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.errors import CompressionError
from nonebot_plugin_memsum.llm.client import LLMClient
from nonebot_plugin_memsum.llm.errors import (
    LLMBadRequest,
    LLMEmptyReply,
    LLMErrorReply,
    LLMRateLimited,
    LLMServerError,
    in_chinese,
    is_context_too_long,
)
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from tests.fakes import providers
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.providers import APOLOGY, GROUP, MESSAGES, ask_in_group, sse
from tests.fakes.service import GROUP as SERVICE_GROUP
from tests.fakes.service import Make, seed
from tests.test_audit6_p import (
    test_r_run_9_streamed_context_error_retries_under_the_literal_rule as literal_retry,
)

# The shared fixtures, bound here so that pytest finds them.
fresh_llm, model, client, rt = providers.fresh_llm, providers.model, providers.client, providers.rt

BASE_URL_HINT = "base_url"


# ---- an error as the whole body, with HTTP 200 ----------------------------------------------------
# A gateway that answers an upstream's failure with 200 and the error object, its status in
# `code` (azrtydxb/Fastllm-proxy#28, quoted: HTTP=200, this body, "5 of 8 concurrent calls came
# back this way").
FASTLLM_UPSTREAM_502 = json.dumps(
    {
        "error": {
            "message": "Upstream error from Nvidia: ResourceExhausted: Worker local total request limit"
            " reached (1)",
            "code": 502,
        }
    }
)
# vLLM's ErrorResponse at the top level, as RunPod's worker-vllm answered it with HTTP 200
# (runpod-workers/worker-vllm#57, quoted: "HTTP/2 200", this body for a model that does not exist).
VLLM_WORKER_404 = json.dumps(
    {
        "code": 404,
        "message": "The model `a model that does not exist` does not exist.",
        "object": "error",
        "param": None,
        "type": "NotFoundError",
    }
)
# The same worker and shape for a prompt longer than the context: vLLM's own sentence for it
# ("This model's maximum context length is … tokens. However, you requested … tokens (… in the
# messages, … in the completion). Please reduce the length of the messages or completion.",
# vllm/entrypoints/openai/serving_engine.py `_validate_input`), its code 400.
VLLM_WORKER_CONTEXT_400 = json.dumps(
    {
        "code": 400,
        "message": "This model's maximum context length is 6000 tokens. However, you requested 7120 tokens"
        " (6120 in the messages, 1000 in the completion). Please reduce the length of the messages or"
        " completion.",
        "object": "error",
        "param": None,
        "type": "BadRequestError",
    }
)
# one-api before its fix for songquanpeng/one-api#193 ("错误响应码均为200", June 2023) answered every
# error with 200; the body is its errorWrapper's (controller/relay.go: type "one_api_error", the code
# a name, not a status), here wrapping the upstream's 401 text, which quotes the key it was given
# (OpenAI's "Incorrect API key provided: … You can find your API key at …").
ONE_API_NO_STATUS = json.dumps(
    {
        "error": {
            "message": f"Incorrect API key provided: {API_KEY}. You can find your API key at"
            " https://platform.openai.com/account/api-keys.",
            "type": "one_api_error",
            "param": "",
            "code": "invalid_api_key",
        }
    }
)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream-ignored"])
async def test_a_5xx_said_in_a_200_body_is_retried_as_that_status(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, stream: bool
) -> None:
    # Before: LLMBadResponse "not a chat completion", not retried. With `stream: true` the server
    # ignored it and answered the same JSON (text/event-stream, no event).
    llm.push(Reply(raw=FASTLLM_UPSTREAM_502), Reply("八点见。"))
    result = await client.chat(model, MESSAGES, purpose="对话", stream=stream)
    assert result.content == "八点见。"
    assert len(llm.requests) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream-ignored"])
async def test_a_5xx_said_in_a_200_body_tells_the_provider_s_words(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, stream: bool
) -> None:
    llm.default = Reply(raw=FASTLLM_UPSTREAM_502)
    with pytest.raises(LLMServerError) as caught:
        await client.chat(model, MESSAGES, purpose="对话", stream=stream)
    assert caught.value.status == 502
    said = in_chinese(caught.value)
    assert "服务端出错" in said
    assert "Worker local total request limit" in said
    assert BASE_URL_HINT not in said
    assert len(llm.requests) == 3  # the first try and the client's two retries


async def test_vllm_s_bare_error_response_with_200_is_its_status(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(raw=VLLM_WORKER_404))
    with pytest.raises(LLMBadRequest) as caught:
        await client.chat(model, MESSAGES, purpose="对话", stream=False)
    assert caught.value.status == 404
    said = in_chinese(caught.value)
    assert "拒绝了这个请求" in said
    assert "does not exist" in said
    assert BASE_URL_HINT not in said
    assert len(llm.requests) == 1


async def test_a_context_too_long_said_with_200_is_known_as_one(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(raw=VLLM_WORKER_CONTEXT_400))
    with pytest.raises(LLMBadRequest) as caught:
        await client.chat(model, MESSAGES, purpose="对话", stream=False)
    assert is_context_too_long(caught.value.status, str(caught.value))
    assert len(llm.requests) == 1  # the same request gets the same answer


async def test_r_run_9_a_context_too_long_said_with_200_retries_under_the_literal_rule(make: Make) -> None:
    # The check of a context error said inside a stream, for this one said as the whole body.
    await literal_retry(make, Reply(raw=VLLM_WORKER_CONTEXT_400))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream-ignored"])
async def test_an_error_with_200_and_no_status_is_the_provider_s_error_without_the_key(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, stream: bool
) -> None:
    llm.push(Reply(raw=ONE_API_NO_STATUS))
    with pytest.raises(LLMErrorReply) as caught:
        await client.chat(model, MESSAGES, purpose="对话", stream=stream)
    said = in_chinese(caught.value)
    assert "Incorrect API key provided" in said
    assert BASE_URL_HINT not in said
    assert API_KEY not in said
    assert API_KEY not in str(caught.value)
    assert len(llm.requests) == 1  # no status to go by: not retried


async def test_the_owner_reads_the_provider_s_words_not_the_base_url_hint(
    rt: Runtime, llm: ScriptedLLM
) -> None:
    llm.default = Reply(raw=ONE_API_NO_STATUS)
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "在吗")
    assert (outcome, sent) == ("error", [APOLOGY])
    warning = next(line for line in lines if "turn of" in line)
    assert "Incorrect API key provided" in warning
    assert BASE_URL_HINT not in warning
    assert "not a chat completion" not in warning
    assert not any(API_KEY in line for line in lines)
    assert [m.role for m in await rt.store.get_history(GROUP.id)] == ["user"]


# The same without a status, as the first event of a stream: a provider API that streams HTTP 200
# and this chunk (CommandCodeAI/command-code#834, quoted; its non-streamed twin is an HTTP 503).
# Before: "回复中途断开", a cut, though nothing had been said; now the one reading of such an error.
COMMAND_CODE_STREAM_ERROR = sse(
    {
        "id": "gen_01k4x0x8w2",
        "error": {"code": "error", "message": "Stream error occurred"},
        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
    },
    "data: [DONE]",
)


async def test_an_error_event_before_any_answer_without_a_status_is_the_provider_s_error(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply(raw=COMMAND_CODE_STREAM_ERROR))
    with pytest.raises(LLMErrorReply) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    said = in_chinese(caught.value)
    assert "Stream error occurred" in said
    assert "中途断开" not in said
    assert len(llm.requests) == 1


# ---- a status said as a string ----------------------------------------------------------------------
# LiteLLM's proxy sends a streamed request's 200 before the upstream answered (BerriAI/litellm#9035:
# "the `200/OK` response headers are sent out the door before the headers are received from the
# remote"), then the upstream's error as an event; its errors carry the status as a string
# (BerriAI/litellm#37599 quotes `"code": "400"`; its own proxy reads such codes back with int(),
# litellm/proxy/common_request_processing.py `_parse_event_data_for_error`). The message is the one
# of #9035's OpenRouter free-model 429.
LITELLM_STREAMED_429 = sse(
    {
        "error": {
            "message": "litellm.RateLimitError: RateLimitError: OpenrouterException -"
            " deepseek/deepseek-chat:free is temporarily rate-limited upstream. Please retry shortly.",
            "type": None,
            "param": None,
            "code": "429",
        }
    },
    "data: [DONE]",
)


async def test_a_status_said_as_a_string_in_the_stream_is_that_status(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # Before: "回复中途断开", a cut, not retried.
    llm.push(Reply(raw=LITELLM_STREAMED_429), Reply("八点见。"))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert result.content == "八点见。"
    assert len(llm.requests) == 2


async def test_a_status_said_as_a_string_is_read_as_that_status(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.default = Reply(raw=LITELLM_STREAMED_429)
    with pytest.raises(LLMRateLimited) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    assert caught.value.status == 429
    assert "rate-limited upstream" in in_chinese(caught.value)


# ---- a reply that said nothing ----------------------------------------------------------------------
# A gateway whose upstream failed after its own 200 ends the stream having said nothing: `[DONE]`
# and zero tokens (chenyme/grok2api#980: "After `response.completed` or Chat `[DONE]` with zero
# tokens"), or a zero-byte body (decolua/9router#3051: "`HTTP 200` with a zero-byte body", a
# Claude account whose OAuth had expired). Other clients retry such streams (NousResearch/
# hermes-agent#64552, ayunis-core/ayunis-core#1270). The role chunk and the usage chunk are
# OpenAI's chunk shapes (its "The chat completion chunk object" reference).
ONLY_DONE = b"data: [DONE]\n\n"
ROLE_USAGE_DONE = sse(
    {
        "id": "chatcmpl-empty",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
    },
    {
        "id": "chatcmpl-empty",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 31, "completion_tokens": 0, "total_tokens": 31},
    },
    "data: [DONE]",
)
EMPTY_BODIES = [
    pytest.param(ONLY_DONE, id="only-done"),
    pytest.param(ROLE_USAGE_DONE, id="role-usage-done"),
    pytest.param(b"", id="zero-bytes"),
]


@pytest.mark.parametrize("body", EMPTY_BODIES)
async def test_a_stream_that_said_nothing_is_retried(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, body: bytes
) -> None:
    # Before: an answer "" (the turn's silence), not retried.
    llm.push(Reply(raw=body), Reply("八点见。"))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert result.content == "八点见。"
    assert len(llm.requests) == 2


@pytest.mark.parametrize("body", EMPTY_BODIES)
async def test_a_stream_that_always_says_nothing_fails_as_an_empty_reply(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, body: bytes
) -> None:
    llm.default = Reply(raw=body)
    with pytest.raises(LLMEmptyReply) as caught:
        await client.chat(model, MESSAGES, purpose="对话")
    assert "的回复是空的" in in_chinese(caught.value)
    assert len(llm.requests) == 3  # the first try and the client's two retries


async def test_a_finish_reason_with_no_text_is_still_an_answer(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    # The model ended its turn itself: its empty answer is its own (the turn reads it as silence).
    llm.push(Reply("", usage=None))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert (result.content, result.finish_reason) == ("", "stop")
    assert len(llm.requests) == 1


async def test_a_turn_whose_model_says_nothing_is_an_error_not_silence(rt: Runtime, llm: ScriptedLLM) -> None:
    llm.default = Reply(raw=ONLY_DONE)
    with captured("WARNING") as lines:
        outcome, sent = await ask_in_group(rt, "在吗")
    assert (outcome, sent) == ("error", [APOLOGY])
    assert any("empty reply" in line for line in lines)
    # No 「（助手本轮选择不回复）」 marker: the question is still unanswered.
    assert [m.role for m in await rt.store.get_history(GROUP.id)] == ["user"]


async def test_a_summary_model_that_once_says_nothing_is_asked_again(make: Make) -> None:
    # Before: 「摘要为空」, the model blamed for a summary it never wrote, and no retry.
    env = await make()
    await seed(env.rt, 12)
    env.model.summary.append(Reply(raw=ONLY_DONE))
    result = await env.rt.compression.compress(SERVICE_GROUP.id)
    assert result.outcome == "done"
    assert len(env.model.summary_requests()) == 2
    assert env.failure_warnings() == []


async def test_a_summary_model_that_always_says_nothing_fails_with_that_reason(make: Make) -> None:
    env = await make()
    await seed(env.rt, 12)
    env.model.summary_default = Reply(raw=ONLY_DONE)
    with pytest.raises(CompressionError) as failed:
        await env.rt.compression.compress(SERVICE_GROUP.id)
    assert "的回复是空的" in failed.value.reason
    assert len(env.model.summary_requests()) == 3
    assert await env.rt.store.get_meta(SUMMARY_NAMESPACE, SERVICE_GROUP.id) is None


# ---- Mistral's content as a list of blocks ----------------------------------------------------------
# magistral (and mistral-large-2512 on) answer `content` as blocks, a `thinking` block of text blocks
# then `text` blocks (docs.mistral.ai "Reasoning"; NousResearch/hermes-agent#4748: "in both streaming
# deltas and non-streaming responses"). The streamed thinking deltas are BerriAI/litellm#16272's, as
# quoted there; the text deltas the same blocks (hermes-agent#4748). Text and thoughts are ours.
def mistral_chunk(content: list[dict[str, object]] | None, finish: str | None = None) -> dict[str, object]:
    delta: dict[str, object] = {} if content is None else {"content": content}
    return {
        "id": "c3c77283055240cbbaf6f01d384cfccb",
        "object": "chat.completion.chunk",
        "created": 1762355135,
        "model": "magistral-medium-2509",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def thinking(text: str) -> dict[str, object]:
    return {"type": "thinking", "thinking": [{"type": "text", "text": text}]}


def text_block(text: str) -> dict[str, object]:
    return {"type": "text", "text": text}


MAGISTRAL_STREAM = sse(
    mistral_chunk([thinking("他问几点集合，")]),
    mistral_chunk([thinking("群里说过八点。")]),
    mistral_chunk([text_block("八点")]),
    mistral_chunk([text_block("见。")]),
    mistral_chunk(None, "stop"),
    "data: [DONE]",
)
MAGISTRAL_COMPLETION = json.dumps(
    {
        "id": "cmpl-e5cc70bb28c444948073e77776eb30ef",
        "object": "chat.completion",
        "created": 1762355135,
        "model": "magistral-medium-2509",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": [thinking("他问几点集合，群里说过八点。"), text_block("八点见。")],
                    "tool_calls": None,
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 31, "completion_tokens": 40, "total_tokens": 71},
    },
    ensure_ascii=False,
)


@pytest.mark.parametrize(
    "body",
    [pytest.param(MAGISTRAL_STREAM, id="stream"), pytest.param(MAGISTRAL_COMPLETION, id="stream-ignored")],
)
async def test_mistral_content_blocks_are_read_as_the_answer_and_its_thinking(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, body: str | bytes
) -> None:
    # Before: the stream's answer was dropped (an empty answer), the plain one "not a chat completion".
    llm.push(Reply(raw=body))
    result = await client.chat(model, MESSAGES, purpose="对话")
    assert result.content == "八点见。"
    assert result.reasoning == "他问几点集合，群里说过八点。"
    assert result.reasoning_content == ""  # not DeepSeek's field: nothing to send back


async def test_a_mistral_answer_reaches_the_group_without_its_thinking(rt: Runtime, llm: ScriptedLLM) -> None:
    llm.push(Reply(raw=MAGISTRAL_STREAM))
    outcome, sent = await ask_in_group(rt, "几点集合？")
    assert (outcome, sent) == ("replied", ["八点见。"])
    history = await rt.store.get_history(GROUP.id)
    assert [m.content for m in history if m.role == "assistant"] == ["八点见。"]
