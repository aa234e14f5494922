"""The chat client against a real OpenAI-compatible server on 127.0.0.1."""

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm import tokens
from nonebot_plugin_memsum.llm.client import ChatResult, LLMClient, RetryPolicy, Usage
from nonebot_plugin_memsum.llm.errors import (
    LLMAuthError,
    LLMBadRequest,
    LLMBadResponse,
    LLMConnectError,
    LLMError,
    LLMLengthLimit,
    LLMRateLimited,
    LLMServerError,
    LLMStatusError,
    LLMStreamCut,
    LLMTimeout,
    in_chinese,
    status_error,
)
from nonebot_plugin_memsum.types import ToolCall
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.ports import free_port

MESSAGES = [
    {"role": "system", "content": "你是群聊里的 AI 助手。"},
    {"role": "user", "content": "[小明(12345)] 今天晚上一起打游戏吗？"},
]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


class Ledger(list[tuple[str | None, str, str, int, int, int]]):
    async def __call__(
        self, session_id: str | None, purpose: str, model_id: str, t_in: int, t_out: int, t_cached: int
    ) -> None:
        self.append((session_id, purpose, model_id, t_in, t_out, t_cached))


class Sleeps(list[float]):
    """Records the back-off instead of waiting it out."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


@pytest.fixture
def llm(server: ScriptedLLM) -> ScriptedLLM:
    server.reset()
    return server


@pytest.fixture
def model(llm: ScriptedLLM) -> ModelConfig:
    return ModelConfig(**llm.model_config())


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def client(ledger: Ledger, sleeps: Sleeps) -> AsyncIterator[LLMClient]:
    client = LLMClient(timeout=5, ledger=ledger, sleep=sleeps)
    yield client
    await client.aclose()


@pytest.fixture
def logs() -> Iterator[list[str]]:
    with captured("DEBUG") as lines:
        yield lines


async def chat(client: LLMClient, model: ModelConfig, **kw: Any) -> ChatResult:
    return await client.chat(model, MESSAGES, purpose="chat", session_id="onebot:group:1", **kw)


# --- success --------------------------------------------------------------------------


async def test_stream_content_usage_and_request(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    llm.push(
        Reply(
            "你好，晚上八点见！记得带耳机。",
            reasoning="先想想",
            usage={"prompt_tokens": 31, "completion_tokens": 9},
        )
    )
    result = await chat(client, model)
    assert result == ChatResult(
        content="你好，晚上八点见！记得带耳机。",
        tool_calls=(),
        finish_reason="stop",
        usage=Usage(31, 9),
        model_id="test/model",
        reasoning="先想想",
        reasoning_content="先想想",  # the field DeepSeek wants back on a tool call
    )
    body = llm.requests[0]
    assert body["model"] == "model"
    assert body["messages"] == MESSAGES
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "reasoning_effort" not in body
    assert "max_tokens" not in body
    assert "tools" not in body
    assert llm.request_headers[0]["authorization"] == f"Bearer {API_KEY}"
    assert ledger == [("onebot:group:1", "chat", "test/model", 31, 9, 0)]


async def test_stream_tool_calls(client: LLMClient, llm: ScriptedLLM, model: ModelConfig) -> None:
    calls = [
        {"id": "call_1", "name": "weather", "arguments": '{"city": "北京", "date": "2024-06-01"}'},
        {
            "id": "call_2",
            "name": "todo_write",
            "arguments": '{"items": [{"title": "买票", "status": "pending"}]}',
        },
    ]
    llm.push(Reply("", tool_calls=calls, finish_reason="tool_calls"))
    result = await chat(client, model, tools=TOOLS)
    assert result.tool_calls == tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in calls)
    assert result.finish_reason == "tool_calls"
    assert result.content == ""
    assert llm.requests[0]["tools"] == TOOLS


async def test_plain_json_content_tool_calls_usage(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    calls = [{"id": "call_9", "name": "weather", "arguments": '{"city": "上海"}'}]
    llm.push(
        Reply(
            "我查一下", tool_calls=calls, reasoning="嗯", usage={"prompt_tokens": 40, "completion_tokens": 12}
        )
    )
    result = await chat(client, model, stream=False, tools=TOOLS)
    assert result == ChatResult(
        content="我查一下",
        tool_calls=(ToolCall("call_9", "weather", '{"city": "上海"}'),),
        finish_reason="stop",
        usage=Usage(40, 12),
        model_id="test/model",
        reasoning="嗯",
        reasoning_content="嗯",
    )
    body = llm.requests[0]
    assert body["stream"] is False
    assert "stream_options" not in body
    assert ledger == [("onebot:group:1", "chat", "test/model", 40, 12, 0)]


async def test_reasoning_effort_and_max_tokens_are_sent(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    await client.chat(model, MESSAGES, purpose="摘要", reasoning_effort="low", max_tokens=1500)
    body = llm.requests[0]
    assert body["reasoning_effort"] == "low"
    assert body["max_tokens"] == 1500


async def test_no_authorization_header_without_key(client: LLMClient, llm: ScriptedLLM) -> None:
    keyless = ModelConfig(**{**llm.model_config(), "api_key": ""})
    await chat(client, keyless)
    assert "authorization" not in llm.request_headers[0]


@pytest.mark.parametrize("stream", [True, False])
async def test_ledger_gets_estimates_when_the_api_reports_no_usage(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger, stream: bool
) -> None:
    llm.push(Reply("好的，晚上见。", usage=None))
    result = await chat(client, model, stream=stream)
    assert result.usage is None
    est = tokens.estimate_text_tokens
    expected_in = sum(tokens.MESSAGE_OVERHEAD + est(m["content"]) for m in MESSAGES)
    assert ledger == [("onebot:group:1", "chat", "test/model", expected_in, est("好的，晚上见。"), 0)]


# The two spellings of a prompt-cache hit: OpenAI's `prompt_tokens_details.cached_tokens`
# (https://platform.openai.com/docs/guides/prompt-caching) and DeepSeek's
# `prompt_cache_hit_tokens` (https://api-docs.deepseek.com/guides/kv_cache).
@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 2006, "completion_tokens": 300, "prompt_tokens_details": {"cached_tokens": 1920}},
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "prompt_cache_hit_tokens": 1920,
            "prompt_cache_miss_tokens": 86,
        },
    ],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_cached_prompt_tokens_reach_the_ledger(
    client: LLMClient,
    llm: ScriptedLLM,
    model: ModelConfig,
    ledger: Ledger,
    usage: dict[str, Any],
    stream: bool,
) -> None:
    llm.push(Reply("好的", usage=usage))
    result = await chat(client, model, stream=stream)
    assert result.usage == Usage(2006, 300, 1920)
    assert ledger == [("onebot:group:1", "chat", "test/model", 2006, 300, 1920)]


async def test_a_failing_ledger_does_not_fail_the_call(
    llm: ScriptedLLM, model: ModelConfig, logs: list[str]
) -> None:
    async def broken(*args: Any) -> None:
        raise RuntimeError("database is locked")

    client = LLMClient(timeout=5, ledger=broken)
    try:
        result = await chat(client, model)
    finally:
        await client.aclose()
    assert result.content == "好的"
    assert any("ledger" in line and "database is locked" in line for line in logs)


async def test_one_http_client_is_reused_and_closed(client: LLMClient, model: ModelConfig) -> None:
    await chat(client, model)
    first = client._http
    await chat(client, model)
    assert client._http is first
    await client.aclose()
    assert client._http is None
    assert first is not None
    assert first.is_closed


async def test_first_requests_at_once_share_one_pool(
    client: LLMClient, model: ModelConfig, llm: ScriptedLLM
) -> None:
    # The pool is made off the loop (httpx reads the CA bundle), so they all wait for it.
    results = await asyncio.gather(*(chat(client, model) for _ in range(4)))
    assert [r.content for r in results] == [results[0].content] * 4
    assert len(llm.requests) == 4
    first = client._http
    await chat(client, model)
    assert client._http is first


async def test_a_client_closed_while_its_pool_is_made_opens_none(
    llm: ScriptedLLM, model: ModelConfig
) -> None:
    client = LLMClient(timeout=5)
    request = asyncio.create_task(chat(client, model, stream=False))
    await asyncio.sleep(0)  # the request now waits for its pool, made in a thread
    await client.aclose()
    with pytest.raises(LLMConnectError, match="closed"):
        await request
    assert llm.requests == []
    assert client._http is None


# --- errors by status -----------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_are_not_retried_and_never_show_the_key(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger, logs: list[str], status: int
) -> None:
    # Some APIs echo the key they got in the error message.
    llm.push(Reply(status=status, error=f"Incorrect API key provided: {API_KEY}"))
    with pytest.raises(LLMAuthError) as caught:
        await chat(client, model)
    err = caught.value
    assert err.status == status
    assert err.model_id == "test/model"
    assert f"HTTP {status}" in str(err)
    assert "test/model" in str(err)
    assert "Incorrect API key provided" in str(err)
    assert API_KEY not in str(err)
    assert API_KEY not in repr(err.args)
    assert len(llm.requests) == 1
    assert ledger == []
    assert any("LLMAuthError" in line and "test/model" in line for line in logs)
    assert not any(API_KEY in line for line in logs)


async def test_429_honours_retry_after_then_succeeds(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, sleeps: Sleeps, ledger: Ledger
) -> None:
    llm.push(Reply(status=429, error="rate limited", headers={"Retry-After": "3"}), Reply("来了"))
    result = await chat(client, model)
    assert result.content == "来了"
    assert sleeps == [3.0]
    assert len(llm.requests) == 2
    assert len(ledger) == 1


async def test_retry_after_is_capped(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, sleeps: Sleeps
) -> None:
    llm.push(Reply(status=429, headers={"Retry-After": "3600"}))
    await chat(client, model)
    assert sleeps == [RetryPolicy().retry_after_cap]


async def test_500_is_retried_then_succeeds(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, sleeps: Sleeps
) -> None:
    llm.push(Reply(status=500), Reply(status=503), Reply("好了"))
    result = await chat(client, model)
    assert result.content == "好了"
    assert len(llm.requests) == 3
    assert len(sleeps) == 2
    assert 0.375 <= sleeps[0] <= 0.5
    assert 0.75 <= sleeps[1] <= 1.0


async def test_500_until_retries_run_out(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger, logs: list[str]
) -> None:
    llm.default = Reply(status=500, error="upstream overloaded")
    with pytest.raises(LLMServerError) as caught:
        await chat(client, model)
    assert caught.value.status == 500
    assert "upstream overloaded" in str(caught.value)
    assert len(llm.requests) == 3  # the first try and max_retries=2
    assert ledger == []
    failures = [line for line in logs if "LLMServerError" in line]
    assert len(failures) == 3
    assert all("test/model" in line for line in failures)


async def test_max_retries_zero_tries_once(llm: ScriptedLLM, model: ModelConfig, sleeps: Sleeps) -> None:
    llm.default = Reply(status=502)
    client = LLMClient(timeout=5, max_retries=0, sleep=sleeps)
    try:
        with pytest.raises(LLMServerError):
            await chat(client, model)
    finally:
        await client.aclose()
    assert len(llm.requests) == 1
    assert sleeps == []


@pytest.mark.parametrize(("status", "tries"), [(400, 1), (404, 1), (422, 1), (408, 2), (409, 2)])
async def test_other_4xx_are_bad_requests_retried_only_for_408_409(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, status: int, tries: int
) -> None:
    llm.push(Reply(status=status, error="context_length_exceeded"))
    if tries == 1:
        with pytest.raises(LLMBadRequest) as caught:
            await chat(client, model)
        assert caught.value.status == status
    else:
        assert (await chat(client, model)).content == "好的"
    assert len(llm.requests) == tries


def test_status_classes() -> None:
    from nonebot_plugin_memsum.llm.errors import status_error

    expected = {401: LLMAuthError, 403: LLMAuthError, 429: LLMRateLimited, 500: LLMServerError}
    expected |= {599: LLMServerError, 400: LLMBadRequest, 404: LLMBadRequest, 302: LLMStatusError}
    for status, cls in expected.items():
        err = status_error(status, "m", model_id="x/y", retry_after=None)
        assert type(err) is cls
        assert isinstance(err, LLMError)


# --- errors of the connection ---------------------------------------------------------


async def test_connection_refused_is_retried_then_fails(
    client: LLMClient, sleeps: Sleeps, logs: list[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    dead = ModelConfig.model_validate(
        {"id": "dead/model", "base_url": url, "api_key": API_KEY, "context_window": 8000}
    )
    with pytest.raises(LLMConnectError) as caught:
        await chat(client, dead)
    assert "dead/model" in str(caught.value)
    assert API_KEY not in str(caught.value)
    assert len(sleeps) == 2
    assert sum("LLMConnectError" in line for line in logs) == 3
    assert not any(API_KEY in line for line in logs)


async def test_timeout_is_not_retried(llm: ScriptedLLM, model: ModelConfig, sleeps: Sleeps) -> None:
    llm.push(Reply(), Reply(delay=1.0))
    client = LLMClient(timeout=5, sleep=sleeps)
    try:
        await chat(client, model)  # the pool is warm: 0.2 s is not spent on creating it under load
        client._timeout = 0.2
        with pytest.raises(LLMTimeout) as caught:
            await chat(client, model)
    finally:
        await client.aclose()
    assert "test/model" in str(caught.value)
    assert len(await llm.wait_requests_async(2)) == 2
    assert sleeps == []


async def test_timeout_covers_the_whole_stream(llm: ScriptedLLM, model: ModelConfig) -> None:
    # Every chunk comes well within the timeout; the stream as a whole does not.
    llm.push(Reply("一二三四五六七八九十" * 4, chunk_chars=2, chunk_delay=0.03))
    client = LLMClient(timeout=0.3)
    try:
        with pytest.raises(LLMTimeout):
            await chat(client, model)
    finally:
        await client.aclose()


@pytest.mark.parametrize("stream", [True, False])
async def test_connection_dropped_mid_reply_is_a_cut(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger, stream: bool
) -> None:
    llm.push(Reply("这是一段很长的回答，说到一半连接就断了。", cut_after=2))
    with pytest.raises(LLMStreamCut, match="dropped mid-reply"):
        await chat(client, model, stream=stream)
    assert len(llm.requests) == 1
    assert ledger == []


async def test_stream_with_finish_reason_but_no_done_is_complete(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    llm.push(Reply("说完了", done=False, usage={"prompt_tokens": 20, "completion_tokens": 3}))
    result = await chat(client, model)
    assert (result.content, result.finish_reason, result.usage) == ("说完了", "stop", Usage(20, 3))
    assert len(ledger) == 1


async def test_stream_with_done_but_no_finish_reason_is_complete(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    llm.push(Reply("说完了", finish_reason=None))
    result = await chat(client, model)
    assert (result.content, result.finish_reason) == ("说完了", None)


async def test_stream_ending_with_neither_finish_reason_nor_done_is_a_cut(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger
) -> None:
    llm.push(Reply("说完了吗", finish_reason=None, done=False))
    with pytest.raises(LLMStreamCut, match=r"no finish reason, no \[DONE\]"):
        await chat(client, model)
    assert ledger == []


async def test_error_event_mid_stream_is_a_cut(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "半"}, "finish_reason": None}]}
    error = {"error": {"message": f"provider overloaded for {API_KEY}"}}
    llm.push(Reply(raw=f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(error)}\n\n"))
    with pytest.raises(LLMStreamCut, match="provider overloaded") as caught:
        await chat(client, model)
    assert API_KEY not in str(caught.value)


# --- length and malformed replies -----------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_length_stop_raises_with_the_partial_reply(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, ledger: Ledger, stream: bool
) -> None:
    llm.push(Reply("## 最近在聊什么\n大家在讨论", finish_reason="length"))
    with pytest.raises(LLMLengthLimit) as caught:
        await chat(client, model, stream=stream)
    assert caught.value.result.content == "## 最近在聊什么\n大家在讨论"
    assert caught.value.result.finish_reason == "length"
    assert len(llm.requests) == 1
    assert len(ledger) == 1  # the model did answer: it is charged


@pytest.mark.parametrize(
    ("stream", "raw"),
    [
        (False, "<html>502 Bad Gateway</html>"),
        (False, '{"object": "list", "data": []}'),
        (False, ""),
        (True, "data: {not json\n\n"),
        (True, 'data: {"choices": [{"index": 0, "delta": "text"}]}\n\n'),
    ],
)
async def test_unreadable_bodies_are_bad_responses(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, stream: bool, raw: str
) -> None:
    llm.push(Reply(raw=raw))
    with pytest.raises(LLMBadResponse, match="test/model"):
        await chat(client, model, stream=stream)
    assert len(llm.requests) == 1


async def test_sse_fields_comments_and_split_data_lines(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    first = {
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "你"}, "finish_reason": None}]
    }
    calls = [
        # The name repeated in every delta (some APIs), the id only in the first.
        {"index": 0, "id": "call_a", "function": {"name": "weather", "arguments": '{"ci'}},
        {"index": 0, "function": {"name": "weather", "arguments": 'ty": "广州"}'}},
    ]
    split = json.dumps(
        {"choices": [{"index": 0, "delta": {"content": "好"}, "finish_reason": None}]}, indent=1
    )
    events = [
        ": keep-alive comment",
        "event: message",
        f"data: {json.dumps(first)}",
        "",
        "\n".join(f"data: {line}" for line in split.splitlines()),
        "",
        *(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'tool_calls': [c]}}]})}\n" for c in calls),
        f"data: {json.dumps({'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'tool_calls'}]})}",
        "",
        f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 5, 'completion_tokens': 3}})}",
        "",
        "data: [DONE]",
        "",
    ]
    llm.push(Reply(raw="\n".join(events) + "\n"))
    result = await chat(client, model)
    assert result.content == "你好"
    assert result.tool_calls == (ToolCall("call_a", "weather", '{"city": "广州"}'),)
    assert result.usage == Usage(5, 3)


# --- the retry policy as data ---------------------------------------------------------


def test_retry_policy_backoff_is_exponential_with_jitter_and_capped() -> None:
    policy = RetryPolicy()
    assert [policy.delay(n, None, 0.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert policy.delay(0, None, 0.999) == pytest.approx(0.375, abs=0.001)
    assert policy.delay(3, 2.5, 0.5) == 2.5
    assert policy.delay(0, 45.0, 0.5) == 20.0


def test_retry_policy_decides_by_error() -> None:
    policy = RetryPolicy()

    def status(code: int) -> LLMStatusError:
        from nonebot_plugin_memsum.llm.errors import status_error

        return status_error(code, "m", model_id="x/y", retry_after=None)

    retried = [LLMConnectError("m", model_id="x/y"), *(status(c) for c in (408, 409, 429, 500, 502, 599))]
    assert all(policy.retryable(e) for e in retried)
    result = ChatResult("", (), "length", None, "x/y")
    refused: list[LLMError] = [
        *(status(c) for c in (400, 401, 403, 404, 422)),
        LLMTimeout("m", model_id="x/y"),
        LLMStreamCut("m", model_id="x/y"),
        LLMBadResponse("m", model_id="x/y"),
        LLMLengthLimit("m", model_id="x/y", result=result),
    ]
    assert not any(policy.retryable(e) for e in refused)


# --- the scripted server itself -------------------------------------------------------


async def test_scripted_server_responders_queue_and_waiting(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig
) -> None:
    def summariser(body: dict[str, Any]) -> Reply | None:
        first = body["messages"][0]
        return Reply("## 摘要") if "摘要" in first["content"] else None

    llm.on_request(summariser)
    llm.push(Reply("一"), Reply("二"))
    llm.default = Reply("默认")
    summary = [{"role": "system", "content": "请写摘要"}]
    answers = [
        (await chat(client, model)).content,
        (await client.chat(model, summary, purpose="摘要")).content,
        (await chat(client, model)).content,
        (await chat(client, model)).content,
    ]
    assert answers == ["一", "## 摘要", "二", "默认"]
    arrived = await llm.wait_requests_async(4)
    assert [r["messages"][0]["content"] for r in arrived] == ["你是群聊里的 AI 助手。", "请写摘要"] + [
        "你是群聊里的 AI 助手。"
    ] * 2
    with pytest.raises(TimeoutError):
        llm.wait_requests(5, timeout=0.05)
    cfg = llm.model_config("other/x", priority=3)
    assert cfg["base_url"] == llm.base_url
    assert cfg["priority"] == 3
    assert ModelConfig(**cfg).model == "x"


@pytest.mark.parametrize("stream", [True, False])
async def test_tool_calls_without_ids_get_distinct_ids(
    client: LLMClient, llm: ScriptedLLM, model: ModelConfig, stream: bool
) -> None:
    llm.push(
        Reply(
            "",
            tool_calls=[
                {"id": "", "name": "a", "arguments": "{}"},
                {"id": "", "name": "b", "arguments": "{}"},
            ],
            finish_reason="tool_calls",
        )
    )
    result = await chat(client, model, stream=stream)
    ids = [c.id for c in result.tool_calls]
    assert all(ids)
    assert len(set(ids)) == 2


async def test_a_closed_client_refuses_instead_of_opening_a_new_pool(
    llm: ScriptedLLM, model: ModelConfig
) -> None:
    client = LLMClient(timeout=5)
    await client.aclose()
    with pytest.raises(LLMConnectError, match="closed"):
        await chat(client, model, stream=False)
    assert llm.requests == []


@pytest.mark.parametrize(
    ("err", "shown"),
    [
        (
            LLMTimeout("m/x: no complete reply within 60 s", model_id="m/x"),
            "m/x 超时，没有在限定时间内给出完整回复",
        ),
        (
            status_error(401, "m/x: HTTP 401: Invalid API key", model_id="m/x", retry_after=None),
            "m/x 不认这个密钥（密钥不对，或没有这个模型的权限）（HTTP 401: Invalid API key）",
        ),
        (
            status_error(429, "m/x: HTTP 429", model_id="m/x", retry_after=None),
            "m/x 请求太频繁或额度已用完（HTTP 429）",
        ),
        (
            LLMConnectError("m/x: cannot reach the API (ConnectError)", model_id="m/x"),
            "m/x 连不上接口（cannot reach the API (ConnectError)）",
        ),
        (LLMError("m/x", model_id="m/x"), "m/x 出错"),
    ],
)
def test_a_model_error_reads_in_chinese_with_its_detail(err: LLMError, shown: str) -> None:
    # What /压缩, the web page and a progress subscriber show of a failed summary request.
    assert in_chinese(err) == shown
