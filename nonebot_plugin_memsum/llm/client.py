"""OpenAI-compatible chat completions over one shared httpx client.

Streaming (SSE) or plain JSON; finish reasons, tool calls, reasoning text and usage;
typed errors (errors.py); retries by one policy; a usage ledger fed on success.

Decisions:
- `timeout` bounds one attempt as a whole: connect, send, and the entire reply (for a
  stream, every chunk until `[DONE]`), not merely each read.
- Timeouts are not retried: a model that used the whole budget once will most likely
  do it again, and the user is waiting already. Nor are cut streams, length stops and
  bad bodies: the request reached the model, so a retry costs a full reply again.
- A stream is complete when it ends with `[DONE]` (even if no chunk named a finish
  reason: some servers never do) or when its body ends after a chunk with a finish
  reason (llama.cpp server and several gateways send no `[DONE]`). A body that ends
  before either is a cut (R-FAIL-1: the partial output is thrown away).
- A stream that said nothing at all (only `[DONE]`, or an empty body: no text, no reasoning,
  no tool call, no finish reason) is no answer but a gateway whose upstream failed
  (decolua/9router#3051, chenyme/grok2api#980): an error (LLMEmptyReply), never an empty
  answer, which a turn would take for the model choosing silence. Retried, unlike a cut:
  nothing was generated to be paid for twice.
- A stream is read to the end of its body, also after `[DONE]`, so the connection goes
  back to the pool: otherwise every call pays a new TCP and TLS handshake.
- A provider that answers 400 naming a parameter it does not accept (`stream_options` on
  older Azure api-versions and some gateways; `max_tokens` on OpenAI reasoning models;
  `reasoning_effort`) is asked again once without it, and the model is not sent it again
  for the life of the process. Usage then comes from the estimate when none is reported.
- An error sent with HTTP 200 (an event in a stream before any answer, or the whole body in
  place of a completion) whose `code` is an HTTP status (llama.cpp and SGLang answer 200 and
  then say that the prompt is longer than the context; gateways and vLLM wrappers answer their
  errors with 200) is that status's error, not a cut stream nor a bad body: a 400 stays a 400
  (R-RUN-9's retry knows it), a 429 or 5xx is retried. Without a status it is the provider's
  own error (LLMErrorReply), never the hint to check base_url.
- Reasoning never reaches the caller's text: `reasoning_content` / `reasoning` and a
  leading `<think>` block go to `ChatResult.reasoning` (reasoning.py).
- A reply the provider ended itself (finish reason `content_filter`, Zhipu's `sensitive` and
  `network_error`, `error`) is a failure, never an answer: a half-said filtered text must not
  reach a group, and an empty one is not the model choosing silence. Not retried.
- Failed calls record nothing in the ledger, except `length` and content-filter stops: the
  model did answer (it is billed), and the agent even uses a `length` reply. A ledger that fails is logged and
  does not fail the call (the reply is already paid for).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from nonebot.log import logger

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.types import ToolCall

from .errors import (
    LLMBadRequest,
    LLMBadResponse,
    LLMConnectError,
    LLMContentFilter,
    LLMEmptyReply,
    LLMError,
    LLMErrorReply,
    LLMLengthLimit,
    LLMStatusError,
    LLMStreamCut,
    LLMTimeout,
    is_context_too_long,
    status_error,
)
from .reasoning import split_think
from .tokens import MESSAGE_OVERHEAD, estimate_text_tokens

LedgerFn = Callable[[str | None, str, str, int, int, int], Awaitable[None]]
"""(session_id, purpose, model_id, tokens_in, tokens_out, tokens_cached), awaited after each
successful call; tokens_cached is the part of tokens_in the provider's prompt cache served."""

POOL_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=30.0)
"""httpx's pool, but an idle connection stays 30 s instead of 5: a group asks every few seconds
to minutes, and each new connection to an API is a TLS handshake. A connection the server
closed meanwhile is noticed by the pool before it is used. Not more than httpx's 20 kept:
the pool checks every kept connection (a system call each) at every request and release,
which cost more CPU in bench_ingest at 100 than the reconnects it saved."""
_DETAIL_CHARS = 200
_DRAIN_SECONDS = 2.0
"""How long a stream's body may go on after `[DONE]` before we stop reading and drop the connection."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens the API reports for one call."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    """Part of prompt_tokens served from the provider's prompt cache (cheaper)."""


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One model reply."""

    content: str
    """The answer, without any reasoning (no leading `<think>` block)."""
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    """As the API reported it; None when it did not."""
    model_id: str
    reasoning: str = ""
    """Thinking text: `reasoning_content` / `reasoning`, and a `<think>` block taken from the content.
    For accounting only: never sent to a chat nor stored."""
    reasoning_content: str = ""
    """The `reasoning_content` field alone: what DeepSeek's thinking mode (and Kimi's, Qwen's)
    requires back on an assistant message that called a tool (agent/turn.py keeps it there
    and only there)."""
    tool_extra: Mapping[str, Any] = field(default_factory=dict)
    """The `extra_content` of each tool call that came with one, by call id: Gemini 3's thought
    signatures, required back on the call (agent/turn.py keeps them with it)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which failed attempts are tried again and after how long (after openai-python's)."""

    statuses: frozenset[int] = frozenset({408, 409, 429})
    """Statuses retried besides every 5xx."""
    base: float = 0.5
    """Seconds before the first retry; doubled for each later one."""
    cap: float = 8.0
    """Longest computed wait."""
    retry_after_cap: float = 20.0
    """Longest wait a `Retry-After` header (or Gemini's `retryDelay`) can ask for: a longer one
    waits this long and tries once more (a user is waiting; a quota that is out for minutes
    fails the call after the retries, as any 429 does)."""

    def retryable(self, err: LLMError) -> bool:
        if isinstance(err, LLMConnectError | LLMEmptyReply):
            return True
        if isinstance(err, LLMStatusError):
            if is_context_too_long(err.status, str(err)):
                return False  # the same request gets the same answer (a 5xx from a self-hosted server)
            return err.status in self.statuses or err.status >= 500
        return False

    def delay(self, retry: int, retry_after: float | None, jitter: float) -> float:
        """Seconds before retry number `retry` (from 0); `jitter` is uniform in [0, 1)."""
        if retry_after is not None:
            return min(retry_after, self.retry_after_cap)
        return min(self.base * 2**retry, self.cap) * (1 - 0.25 * jitter)


class LLMClient:
    """Chat completions against any model of the registry, with one connection pool."""

    def __init__(
        self,
        *,
        timeout: float = 120,
        ledger: LedgerFn | None = None,
        max_retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._timeout = timeout
        self._ledger = ledger
        self._max_retries = max_retries
        self._transport = transport
        self._retry = retry
        self._sleep = sleep
        self._http: httpx.AsyncClient | None = None
        self._closed = False
        self._refused: dict[str, dict[str, str | None]] = {}
        self._reasoning_back: set[str] = set()
        """Models that asked for `reasoning_content` on every assistant message that called a
        tool (`_with_reasoning_back`)."""
        """model id → parameter it refused → the name to send instead (None: leave it out)."""

    async def aclose(self) -> None:
        """Close the connection pool; a call after this fails instead of opening another."""
        self._closed = True
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

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
        """One chat completion; raises an LLMError subclass (errors.py) when it fails."""
        if self._closed:  # not retried: nothing will reopen it
            raise LLMConnectError(f"{model.id}: the model client is closed", model_id=model.id)
        body: dict[str, Any] = {"model": model.model, "messages": list(messages), "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = list(tools)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if reasoning_effort is not None:
            body["reasoning_effort"] = reasoning_effort
        body = _without_refused(body, self._refused.get(model.id, {}))
        if model.id in self._reasoning_back:
            body = _with_reasoning_back(body)
        attempt = 0
        while True:
            try:
                result = await self._attempt(model, body, stream=stream)
            except LLMError as err:
                refused = err.refused if isinstance(err, LLMBadRequest) else None
                if refused is not None and refused in body:
                    # Not counted as a retry: each parameter is refused once, then it is gone.
                    body = self._refuse(model, refused, body)
                    continue
                if (
                    isinstance(err, LLMBadRequest)
                    and model.id not in self._reasoning_back
                    and _REASONING_BACK.search(str(err))
                ):
                    self._reasoning_back.add(model.id)
                    logger.warning(
                        f"memsum: {model.id} wants reasoning back on every tool call (thinking mode):"
                        " sending an empty one where none was kept, for the life of the process"
                    )
                    body = _with_reasoning_back(body)
                    continue
                again = attempt < self._max_retries and self._retry.retryable(err)
                # INFO: the caller reports the failure once, as the one warning (R-FAIL-1).
                logger.info(
                    f"memsum: {purpose} call to {model.id} failed (attempt {attempt + 1}): "
                    f"{type(err).__name__}: {err}{'; retrying' if again else ''}"
                )
                if not again:
                    if isinstance(err, LLMLengthLimit | LLMContentFilter):
                        await self._record(session_id, purpose, messages, err.result)  # it was paid for
                    raise
                retry_after = err.retry_after if isinstance(err, LLMStatusError) else None
                await self._sleep(self._retry.delay(attempt, retry_after, random.random()))
                attempt += 1
                continue
            await self._record(session_id, purpose, messages, result)
            return result

    def _refuse(self, model: ModelConfig, param: str, body: dict[str, Any]) -> dict[str, Any]:
        """Remember that `model` refuses `param` and return `body` without it."""
        instead = _REPLACEMENTS.get(param)
        if instead in self._refused.get(model.id, {}) or instead in body:
            instead = None  # the replacement was refused already, or is sent already
        self._refused.setdefault(model.id, {})[param] = instead
        then = f"sending `{instead}` instead" if instead else "leaving it out"
        if param == "stream_options":
            then += "; its usage now comes from our estimate unless it reports some"
        # WARNING, once per model and parameter: the operator may want to fix the config.
        logger.warning(f"memsum: {model.id} does not accept `{param}`: {then}, for the life of the process")
        return _without_refused(body, self._refused[model.id])

    async def _client(self, model: ModelConfig) -> httpx.AsyncClient:
        if self._http is None:
            # Made off the loop: httpx builds its TLS context (reads the CA bundle, ~50 ms of
            # CPU) with the client, and the first request after every start stalled the loop.
            try:
                http = await asyncio.to_thread(
                    httpx.AsyncClient,
                    transport=self._transport,
                    timeout=httpx.Timeout(self._timeout),
                    limits=POOL_LIMITS,
                )
            except (ImportError, ValueError) as err:
                # The proxy of the environment (ALL_PROXY=socks5://… without socksio, or a URL
                # httpx cannot read): say so, as a model error, not a traceback per message. A
                # ValueError's text quotes the proxy URL, which may hold a password: not shown.
                why = _detail(err, model) if isinstance(err, ImportError) else "the proxy URL is not usable"
                raise LLMConnectError(
                    f"{model.id}: cannot make the HTTP client from the proxy settings (ALL_PROXY, "
                    f"HTTPS_PROXY): {why}",
                    model_id=model.id,
                ) from None
            if self._closed:  # closed meanwhile: nothing may reopen it
                await http.aclose()
                raise LLMConnectError(f"{model.id}: the model client is closed", model_id=model.id)
            if self._http is None:
                self._http = http
            else:  # another request made one meanwhile
                await http.aclose()
        return self._http

    async def _attempt(self, model: ModelConfig, body: dict[str, Any], *, stream: bool) -> ChatResult:
        key = model.api_key.get_secret_value()
        headers = {"Content-Type": "application/json"}
        if key:
            if model.api_key_header.lower() == "authorization":
                headers["Authorization"] = f"Bearer {key}"
            else:
                headers[model.api_key_header] = key
        url = endpoint(model.base_url)
        try:
            async with asyncio.timeout(self._timeout):
                result = await self._exchange(model, url, headers, body, stream=stream)
        except (TimeoutError, httpx.TimeoutException):
            raise LLMTimeout(
                f"{model.id}: no complete reply within {self._timeout:g} s", model_id=model.id
            ) from None
        if result.finish_reason == "length":
            raise LLMLengthLimit(
                f"{model.id}: reply stopped at the output limit", model_id=model.id, result=result
            )
        stopped = _STOPPED_BY_PROVIDER.get(result.finish_reason or "")
        if stopped is LLMContentFilter:
            raise LLMContentFilter(
                f"{model.id}: the provider's content filter stopped the reply (finish reason"
                f" {result.finish_reason})",
                model_id=model.id,
                result=result,
            )
        if stopped is not None:
            raise stopped(
                f"{model.id}: the provider stopped the reply (finish reason {result.finish_reason})",
                model_id=model.id,
            )
        return result

    async def _exchange(
        self, model: ModelConfig, url: str, headers: dict[str, str], body: dict[str, Any], *, stream: bool
    ) -> ChatResult:
        try:
            content = encode_body(body)
            http = await self._client(model)
            async with http.stream("POST", url, content=content, headers=headers) as resp:
                try:
                    if not resp.is_success:
                        await resp.aread()
                        raise _status_error(model, resp, body)
                    if stream:
                        return await _read_stream(model, resp)
                    await resp.aread()
                except httpx.TimeoutException:
                    raise
                except httpx.DecodingError:
                    # A body that is not what its Content-Encoding says (a proxy that labels a
                    # plain stream gzip): httpx's own error is no LLMError, and was reported as
                    # an internal error of the plugin, with a traceback.
                    encoding = resp.headers.get("content-encoding", "?")
                    raise LLMBadResponse(
                        f"{model.id}: the body cannot be decoded as its Content-Encoding ({encoding}) says",
                        model_id=model.id,
                    ) from None
                except httpx.TransportError as err:
                    raise LLMStreamCut(
                        f"{model.id}: connection dropped mid-reply ({_detail(err, model)})", model_id=model.id
                    ) from None
        except httpx.TimeoutException:
            raise
        except httpx.TransportError as err:
            raise LLMConnectError(
                f"{model.id}: cannot reach the API ({_detail(err, model)})", model_id=model.id
            ) from None
        return _parse_completion(model, resp.content)

    async def _record(
        self, session_id: str | None, purpose: str, messages: Sequence[Mapping[str, Any]], result: ChatResult
    ) -> None:
        if self._ledger is None:
            return
        cached = 0
        if result.usage is not None:
            tokens_in, tokens_out = result.usage.prompt_tokens, result.usage.completion_tokens
            cached = result.usage.cached_tokens
        else:
            tokens_in = sum(_estimate_message(m) for m in messages)
            tokens_out = estimate_text_tokens(result.content) + estimate_text_tokens(result.reasoning)
            tokens_out += sum(estimate_text_tokens(c.name + c.arguments) for c in result.tool_calls)
        try:
            await self._ledger(session_id, purpose, result.model_id, tokens_in, tokens_out, cached)
        except Exception as err:
            logger.warning(f"memsum: usage ledger failed for {result.model_id}: {type(err).__name__}: {err}")


@functools.cache  # once per configured model: every call asks for it
def endpoint(base_url: str) -> str:
    """The chat completions URL of an API root: `/chat/completions` after its path, before its
    query (Azure's `…/openai/deployments/<name>?api-version=…`)."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions"))


def _dumps(value: Any) -> bytes:
    """JSON, compact and in UTF-8 (what httpx's `json=` sends)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class WireMessage(dict[str, Any]):
    """A chat message whose JSON is made once, when a request first sends it (`encoded`), so a
    request of many such messages is mostly joined pre-encoded pieces. Shared between requests,
    so it cannot be changed: copy it (`dict(m)`) to make a different message."""

    __slots__ = ("_encoded",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self._encoded: bytes | None = None

    @property
    def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = _dumps(self)
        return self._encoded

    def _frozen(self, *_: Any, **__: Any) -> Any:
        raise TypeError("a WireMessage is shared between requests: change a copy, dict(message)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _frozen  # type: ignore[assignment]


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The request as JSON; its WireMessages go in as they were encoded."""
    messages = body.get("messages") or ()
    if not any(isinstance(m, WireMessage) for m in messages):
        return _dumps(body)  # one call: cheaper than one per message
    rest = _dumps({k: v for k, v in body.items() if k != "messages"})
    # The memo read directly, the property called only to make it: a call per message was
    # half the time of joining a long history.
    joined = b",".join(
        [(m._encoded or m.encoded) if isinstance(m, WireMessage) else _dumps(m) for m in messages]
    )
    return b'{"messages":[' + joined + (b"]," + rest[1:] if len(rest) > 2 else b"]}")


def _estimate_message(msg: Mapping[str, Any]) -> int:
    total = MESSAGE_OVERHEAD
    content = msg.get("content")
    if isinstance(content, str):
        total += estimate_text_tokens(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                total += estimate_text_tokens(part["text"])
    for call in msg.get("tool_calls") or ():
        function = call.get("function") or {}
        total += estimate_text_tokens(f"{function.get('name', '')}{function.get('arguments', '')}")
    return total


def _detail(text: object, model: ModelConfig) -> str:
    """Provider or transport text, short and with the API key masked, should it echo it."""
    out = str(text) or type(text).__name__
    key = model.api_key.get_secret_value()
    if key:
        out = out.replace(key, "***")
    return out if len(out) <= _DETAIL_CHARS else out[:_DETAIL_CHARS] + "…"


def _status_error(model: ModelConfig, resp: httpx.Response, body: Mapping[str, Any]) -> LLMStatusError:
    message = f"{model.id}: HTTP {resp.status_code}"
    retry_after = _retry_after(resp.headers.get("retry-after"))
    provider = _error_text(resp.content)
    if provider:
        message += f": {_detail(provider, model)}"
    err = status_error(
        resp.status_code,
        message,
        model_id=model.id,
        retry_after=_retry_info(resp.content) if retry_after is None else retry_after,
    )
    if type(err) is LLMBadRequest and resp.status_code == 400:  # not a content review's refusal
        err.refused = refused_parameter(body, resp.content.decode("utf-8", "replace"))
    return err


_OPTIONAL = ("stream_options", "max_tokens", "max_completion_tokens", "reasoning_effort")
"""Parameters a request can do without: a provider that refuses one is asked again without it."""
_REPLACEMENTS = {"max_tokens": "max_completion_tokens"}
"""OpenAI's reasoning models refuse `max_tokens` and take the same cap as `max_completion_tokens`."""
_REFUSAL = re.compile(
    r"unrecogni[sz]ed|unknown|unsupported|not supported|does not support|not permitted|not allowed"
    r"|extra (?:inputs|fields)|invalid (?:request )?(?:argument|parameter)",
    re.IGNORECASE,
)


def refused_parameter(body: Mapping[str, Any], error: str) -> str | None:
    """The optional parameter of `body` that a 400 error text says the provider does not accept.

    The text must name it (also in camelCase, as xAI does) and say it is not accepted: "Invalid
    max_tokens value, the valid range is [1, 8192]" is about the value, and leaving the cap out
    would not be a fix.
    """
    if not _REFUSAL.search(error):
        return None
    named = [p for p in _OPTIONAL if p in body and re.search(rf"\b(?:{p}|{_camel(p)})\b", error)]
    return named[0] if named else None  # several: one now, the next on the next answer


def _camel(param: str) -> str:
    """`reasoning_effort` as xAI names it in its refusals: `reasoningEffort` ("Model grok-4-latest
    does not support parameter reasoningEffort.", BerriAI/litellm#16265)."""
    head, *rest = param.split("_")
    return head + "".join(word.title() for word in rest)


_REASONING_BACK = re.compile(r"reasoning_content\W.*\bpassed back\b", re.IGNORECASE | re.DOTALL)
"""DeepSeek's thinking mode, when an assistant message that called a tool comes without its
reasoning (its 400, reported in e.g. anomalyco/opencode#24722, the-open-agent/openagent#2206:
"The `reasoning_content` in the thinking mode must be passed back to the API.")."""


def _with_reasoning_back(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` with an empty `reasoning_content` on each assistant message that called a tool and
    kept none: one stored before the reasoning was kept, or a call the model made without
    thinking (DeepSeek's adaptive thinking), which the API wants the field on all the same."""
    messages = [
        {**m, "reasoning_content": ""}
        if m.get("role") == "assistant" and m.get("tool_calls") and "reasoning_content" not in m
        else m
        for m in body.get("messages") or ()
    ]
    return {**body, "messages": messages}


def _without_refused(body: Mapping[str, Any], refused: Mapping[str, str | None]) -> dict[str, Any]:
    out = dict(body)
    for param, instead in refused.items():
        if param in out:
            value = out.pop(param)
            if instead is not None and instead not in refused:
                out[instead] = value
    return out


def _error_text(body: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's text."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()
    return _message(data)


def _message(data: object) -> str:
    """The message of an error body read as JSON, else the JSON itself."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]  # Gemini's OpenAI endpoint: `[{"error": {...}}]`
    if (failed := _base_resp(data)) is not None:
        return failed[1]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"] + _upstream(error.get("metadata"))
        if isinstance(error, str):
            return error
        if isinstance(data.get("detail"), str):
            return data["detail"]  # FastAPI's error shape (Xinference, LiteLLM proxies)
    return json.dumps(data, ensure_ascii=False)


_BASE_RESP_STATUS = {1000: 500, 1001: 504, 1002: 429, 1004: 401, 1008: 429, 1013: 500, 1039: 429}
"""MiniMax's error codes (platform.minimaxi.com "错误码"; as ENTERPILOT/GoModel#640 maps them) as the
HTTP status they mean: 1000 unknown, 1001 timeout, 1002 requests and 1039 tokens per minute, 1004
authentication, 1008 insufficient balance, 1013 internal error; any other (1026/1027 sensitive
content, 2013 bad parameters) is a refusal of the request: 400."""


def _said_error(data: object) -> tuple[int | None, str] | None:
    """(HTTP status, text) of an error a provider sent with HTTP 200 in place of a completion or
    a chunk: `{"error": …}`, vLLM's bare ErrorResponse (`"object": "error"`), MiniMax's `base_resp`.
    The status is the error's `code` when that is a 4xx or 5xx (a number, or digits in a string),
    else None; None when there is no error."""
    if (failed := _base_resp(data)) is not None:
        return failed
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if not error and data.get("object") != "error":
        return None
    code = (error if isinstance(error, dict) else data).get("code")
    if isinstance(code, str) and code.isascii() and code.isdigit():
        code = int(code)  # LiteLLM's proxy says its statuses as strings ("429")
    status = code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600 else None
    return status, _message(data)


def _error_reply(
    model: ModelConfig, said: tuple[int | None, str], where: str, *, answered: bool = False
) -> LLMError:
    """The error for what `_said_error` read (`where`: "in the stream", "with HTTP 200"). Before any
    answer, a server that sent its 200 before it looked at the request (llama.cpp before PR #16486,
    SGLang before PR #21900, gateways) says its status in the body: taken as that status, so a
    context too long is known as one (R-RUN-9's retry) and a 429 or 5xx is retried; without a
    status it is still the provider's own error, not a bad base_url. After part of an answer: a cut."""
    status, text = said
    detail = _detail(text, model)
    if answered:
        return LLMStreamCut(f"{model.id}: error mid-stream: {detail}", model_id=model.id)
    if status is not None:
        return status_error(
            status, f"{model.id}: HTTP {status} ({where}): {detail}", model_id=model.id, retry_after=None
        )
    return LLMErrorReply(f"{model.id}: error {where}: {detail}", model_id=model.id)


def _base_resp(data: object) -> tuple[int, str] | None:
    """(HTTP status, text) of an error MiniMax reports in `base_resp` beside an HTTP 200
    (MiniMax-AI/MiniMax-01#15: `"choices": null`, `"base_resp": {"status_code": 1039, "status_msg":
    "token limit"}`); None when there is none (status_code 0 on every good answer)."""
    resp = data.get("base_resp") if isinstance(data, dict) else None
    code = resp.get("status_code") if isinstance(resp, dict) else None
    if not isinstance(code, int) or isinstance(code, bool) or code == 0:
        return None
    said = resp.get("status_msg") if isinstance(resp, dict) else None
    text = f"{said} ({code})" if isinstance(said, str) and said else f"error {code}"
    return _BASE_RESP_STATUS.get(code, 400), text


def _upstream(metadata: object) -> str:
    """The upstream provider's own error behind a gateway's (OpenRouter: "Provider returned
    error" with `metadata.provider_name` and the upstream body in `metadata.raw`, its docs'
    "Errors and Debugging"), so the owner reads it and the retries that read error texts
    (context too long, DeepSeek's reasoning) recognise it; "" when there is none."""
    if not isinstance(metadata, dict) or not isinstance(raw := metadata.get("raw"), str) or not raw:
        return ""
    name = metadata.get("provider_name")
    said = _error_text(raw.encode())
    return f" ({name}: {said})" if isinstance(name, str) else f" ({said})"


def _retry_after(value: str | None) -> float | None:
    # Seconds only; an HTTP date falls back to our own back-off.
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?)s\s*")
"""A `google.protobuf.Duration` in JSON: seconds with an "s", fractions allowed ("37s", "1.5s")."""


def _retry_info(body: bytes) -> float | None:
    """Seconds a Google API's error asks us to wait: the `retryDelay` of a `google.rpc.RetryInfo`
    among its `details` (googleapis/googleapis google/rpc/error_details.proto), as Gemini's 429
    says it, also in the array its OpenAI-compatible endpoint answers (`[{"error": {...}}]`).
    Honoured as `Retry-After` is (RetryPolicy.delay), within the same bound; None when it names none."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            found = _DURATION.fullmatch(str(detail.get("retryDelay", "")))
            return float(found.group(1)) if found else None
    return None


def _parse_completion(model: ModelConfig, body: bytes) -> ChatResult:
    try:
        data = json.loads(body)
        if (said := _said_error(data)) is not None:
            raise _error_reply(model, said, "with HTTP 200")
        choice = data["choices"][0]
        message = choice["message"]
        raw_calls = message.get("tool_calls") or ()
        calls = tuple(
            ToolCall(
                id=c.get("id") or _call_id(),
                name=c["function"]["name"],
                arguments=c["function"].get("arguments") or "",
            )
            for c in raw_calls
        )
        text, thinking = _parts(message.get("content"))
        return _result(
            tool_extra=_extras(calls, [c.get("extra_content") for c in raw_calls]),
            content=text,
            reasoning=message.get("reasoning_content") or message.get("reasoning") or thinking,
            reasoning_content=_text(message.get("reasoning_content")),
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
            usage=_usage(data.get("usage")),
            model_id=model.id,
        )
    except (ValueError, LookupError, TypeError, AttributeError):
        detail = _detail(_error_text(body), model) if body else "empty body"
        raise LLMBadResponse(f"{model.id}: not a chat completion ({detail})", model_id=model.id) from None


def _result(
    *,
    content: str,
    reasoning: str,
    tool_calls: tuple[ToolCall, ...],
    finish_reason: str | None,
    usage: Usage | None,
    model_id: str,
    reasoning_content: str = "",
    tool_extra: Mapping[str, Any] | None = None,
) -> ChatResult:
    """The reply with any `<think>` block moved from the answer to the reasoning."""
    answer, thought = split_think(content)
    return ChatResult(
        content=answer,
        tool_calls=tool_calls,
        finish_reason=finish_reason,
        usage=usage,
        model_id=model_id,
        reasoning="\n\n".join(t for t in (reasoning, thought) if t),
        reasoning_content=reasoning_content,
        tool_extra=tool_extra or {},
    )


def _extras(calls: Sequence[ToolCall], extras: Sequence[object]) -> dict[str, Any]:
    """Each call's `extra_content` object, by call id; calls without one are left out."""
    return {c.id: e for c, e in zip(calls, extras, strict=True) if isinstance(e, dict) and e}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _parts(content: object) -> tuple[str, str]:
    """(text, thinking) of a message's or a delta's `content`: a string, or Mistral's list of
    blocks, `{"type": "text", "text": …}` and `{"type": "thinking", "thinking": [text blocks]}`
    (docs.mistral.ai "Reasoning"; magistral and mistral-large-2512 on, streamed too:
    NousResearch/hermes-agent#4748, BerriAI/litellm#16272). Read as text only, the list was
    "not a chat completion", and in a stream the answer was dropped: an empty answer, silence."""
    if content is None or isinstance(content, str):
        return content or "", ""
    if not isinstance(content, list):
        raise TypeError("content is neither text nor a list of blocks")  # an unreadable reply
    text: list[str] = []
    thinking: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            text.append(_text(block.get("text")))
        elif block.get("type") == "thinking":
            inner = block.get("thinking")
            thinking.append(_text(inner) or _parts(inner)[0])
    return "".join(text), "".join(thinking)


def _usage(raw: object) -> Usage | None:
    """A `usage` object in any provider's spelling; None when it holds no token count."""
    if not isinstance(raw, dict):
        return None
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    if not isinstance(prompt, int) and not isinstance(completion, int):
        return None
    details = raw.get("prompt_tokens_details")
    cached = next(
        (
            n
            for n in (
                details.get("cached_tokens") if isinstance(details, dict) else None,  # OpenAI
                raw.get("prompt_cache_hit_tokens"),  # DeepSeek
                raw.get("cached_tokens"),  # Moonshot
            )
            if isinstance(n, int)
        ),
        0,
    )
    return Usage(
        prompt if isinstance(prompt, int) else 0, completion if isinstance(completion, int) else 0, cached
    )


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""
    extra: object = None


@dataclass
class _Stream:
    """What the chunks of one streamed reply add up to."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_content: list[str] = field(default_factory=list)
    """The `reasoning_content` deltas alone (ChatResult.reasoning_content)."""
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    """Each call in the order it began."""
    slots: dict[int, int] = field(default_factory=dict)
    """The provider's `index` of a call delta (its place in the delta's list when it sends none)
    → the call it continues now."""
    finish_reason: str | None = None
    usage: Usage | None = None
    done: bool = False
    chunks: int = 0
    """Chunks read whole so far."""

    def feed(self, chunk: Mapping[str, Any]) -> None:
        self._feed_usage(chunk.get("usage"))
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            self._feed_usage(choice.get("usage"))  # Moonshot puts it in the finishing choice
            delta = choice.get("delta") or {}
            text, thinking = _parts(delta.get("content"))
            self.content.append(text)
            thought = delta.get("reasoning_content") or delta.get("reasoning") or thinking
            if isinstance(thought, str):
                self.reasoning.append(thought)
                if thought is delta.get("reasoning_content"):
                    self.reasoning_content.append(thought)
            for pos, part in enumerate(delta.get("tool_calls") or ()):
                index = part.get("index")
                self._feed_call(index if isinstance(index, int) else pos, part)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    @property
    def answered(self) -> bool:
        """Whether any of the answer came: text, reasoning or a tool call (a role chunk's "" is none)."""
        return any(self.content) or any(self.reasoning) or bool(self.calls)

    def _feed_usage(self, raw: object) -> None:
        usage = _usage(raw)
        if usage is not None:
            self.usage = usage

    def _feed_call(self, index: int, part: Mapping[str, Any]) -> None:
        # A delta with an id other than its index's call begins a new call: Ollama sends every
        # call as `index: 0` (ollama/ollama#15457, #15497), Gemini's OpenAI endpoint and some
        # proxies send no index at all (open-webui/computer#224, AstrBot#6661), `null` others
        # (chatanywhere/GPT_API_free#254). Joined by index, two calls became one named
        # "get_weatherget_time" with arguments `{…}{…}`. A delta without an id continues the
        # call its index began last.
        slot = self.slots.get(index)
        new_id = part.get("id") or ""
        if slot is None or (new_id and self.calls[slot].id not in ("", new_id)):
            slot = self.slots[index] = len(self.calls)
        call = self.calls.setdefault(slot, _PartialCall())
        call.id = call.id or part.get("id") or ""
        function = part.get("function") or {}
        name = function.get("name") or ""
        # Some APIs repeat the whole name in every delta; others split it.
        if name and name != call.name:
            call.name += name
        call.arguments += function.get("arguments") or ""
        if isinstance(part.get("extra_content"), dict):
            call.extra = part["extra_content"]

    def result(self, model_id: str) -> ChatResult:
        partial = [c for _, c in sorted(self.calls.items())]
        calls = tuple(ToolCall(c.id or _call_id(), c.name, c.arguments) for c in partial)
        return _result(
            tool_extra=_extras(calls, [c.extra for c in partial]),
            content="".join(self.content),
            reasoning="".join(self.reasoning),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=self.usage,
            model_id=model_id,
            reasoning_content="".join(self.reasoning_content),
        )


_STOPPED_BY_PROVIDER: dict[str, type[LLMError]] = {
    "content_filter": LLMContentFilter,  # OpenAI, Azure (its "Content filtering" docs), Ark, Gemini
    "sensitive": LLMContentFilter,  # Zhipu: 模型推理内容被安全审核接口拦截
    "network_error": LLMStreamCut,  # Zhipu: 模型推理异常 (hermes-agent#92161: ends with no content)
    "error": LLMStreamCut,  # OpenRouter, when the upstream failed mid-reply
}
"""Finish reasons that say the provider, not the model, ended the reply: what came before is not
an answer (a filtered text half said, or nothing, which would pass for choosing silence)."""

_PLAIN_LIMIT = 1 << 20
"""Bytes of a streamed body without events kept to read it as one completion."""
_SSE_LINE = re.compile(rb"(?::|data\b|event\b|id\b|retry\b)")
"""How an event stream's first line starts: a comment or a field (WHATWG HTML, server-sent events)."""


async def _read_stream(model: ModelConfig, resp: httpx.Response) -> ChatResult:
    acc = _Stream()
    events = SSEDecoder()
    chunks = resp.aiter_bytes()
    plain = bytearray()
    """The body while no event came: a server that ignores `stream` answers one JSON completion."""
    seen = False
    try:
        async for chunk in chunks:
            if not seen and len(plain) < _PLAIN_LIMIT:
                plain += chunk
            for payload in events.feed(chunk):
                seen = True
                _dispatch(model, acc, payload)
                if acc.done:
                    break
            if acc.done:
                break
        else:
            for payload in events.close():
                seen = True
                _dispatch(model, acc, payload)
    except httpx.TimeoutException:
        raise
    except httpx.TransportError:
        if acc.finish_reason is None:
            raise
        # The answer was whole; only what follows it (usage, [DONE]) was lost.
        return acc.result(model.id)
    if acc.done:
        await _drain(chunks)
    elif not seen and plain.lstrip().startswith(b"{"):
        # `stream: true` ignored (some gateways and self-hosted servers): one plain completion,
        # or a JSON error sent with 200, which _parse_completion names.
        return _parse_completion(model, bytes(plain))
    elif not seen and plain.strip() and not _SSE_LINE.match(plain.lstrip()):
        # A body that is no event stream at all was not cut: a web page (a base_url naming a
        # site, not its API) or a proxy's notice. Say so, with its start, not "ended early".
        detail = _detail(plain[:_DETAIL_CHARS].decode("utf-8", "replace").strip(), model)
        ctype = resp.headers.get("content-type", "?")
        raise LLMBadResponse(
            f"{model.id}: the answer is not an event stream ({ctype}: {detail}); check base_url",
            model_id=model.id,
        )
    elif acc.finish_reason is None and (seen or plain.strip()):
        raise LLMStreamCut(f"{model.id}: stream ended early (no finish reason, no [DONE])", model_id=model.id)
    if acc.finish_reason is None and not acc.answered:
        said = "only [DONE]" if acc.done else "an empty body"
        raise LLMEmptyReply(
            f"{model.id}: an empty reply ({said}: no text, no tool call, no finish reason)", model_id=model.id
        )
    return acc.result(model.id)


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what follows `[DONE]` to the end of the body, so the connection can be reused."""
    try:
        async with asyncio.timeout(_DRAIN_SECONDS):
            async for _ in chunks:
                pass
    except (TimeoutError, httpx.TransportError):
        pass  # the answer is whole; leaving the block closes this connection instead


class SSEDecoder:
    """Server-sent events from the bytes of a body, as they arrive: the `data` of each whole event.

    After the WHATWG HTML standard, "Interpreting an event stream"
    (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):
    a line ends at CRLF, LF or CR; `data:` lines (one space after the colon dropped) gather into
    one event, joined by LF, until a blank line; comments (`:`) and other fields are ignored,
    except llama.cpp's `error:` line (`_field_error`).
    Split on bytes and decoded per event (json.loads takes UTF-8 bytes), so a chunk boundary
    inside a line, inside a CRLF or inside a multi-byte character changes nothing, and a
    provider's one-event-per-token stream costs one split per chunk, not a text decoder and a
    line iterator per line.
    """

    def __init__(self) -> None:
        self._tail = b""
        """The last line so far, not ended yet (or ended by a CR whose LF may come next)."""
        self._data: list[bytes] = []
        self._begun = False
        """Whether the body's first bytes were seen (and a leading BOM dropped)."""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of the events this chunk completes."""
        data = self._tail + chunk
        if not self._begun:
            # "One leading U+FEFF BYTE ORDER MARK character must be ignored if any are present"
            # (same section): kept, it made the first line an unknown field and its chunk was
            # lost, the first words of a Gemini answer, say, which starts in its first chunk.
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._tail = data  # the BOM may be split over reads
                return []
            self._begun = True
            data = data.removeprefix(_BOM)
        lines = data.splitlines(keepends=True)
        self._tail = lines.pop() if lines and not _ended(lines[-1]) else b""
        return self._events(lines)

    def close(self) -> list[bytes]:
        """At the end of the body: an event not closed by a blank line still counts (a
        server that ends with `data: [DONE]` and no blank line)."""
        tail, self._tail = self._tail, b""
        out = self._events([tail]) if tail else []
        if self._data:
            out.append(b"\n".join(self._data))
            self._data = []
        return out

    def _events(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for line in lines:
            line = line.rstrip(b"\r\n")
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"error:"):
                out.append(_field_error(line[6:].strip()))
            elif not line and self._data:
                out.append(b"\n".join(self._data))
                self._data = []
        return out


_BOM = "\ufeff".encode()


def _field_error(value: bytes) -> bytes:
    """llama.cpp's server before PR #16486 (October 2025) streams an error as an `error:` line,
    no standard field, after its 200 (a prompt longer than the context, above all): given as
    the event `{"error": …}` that other servers send as `data`."""
    try:
        error = json.loads(value)
    except ValueError:
        error = value.decode("utf-8", "replace")
    return _dumps({"error": error or "error"})


def _ended(line: bytes) -> bool:
    """A line is over at LF; at a CR only once more bytes came (it may be the CR of a CRLF)."""
    return line.endswith(b"\n")


def _dispatch(model: ModelConfig, acc: _Stream, payload: bytes) -> None:
    if not payload.strip():
        # A bare `data:` line: the heartbeat of some gateways (NousResearch/hermes-agent#111887,
        # Growth-Circle/cadis#362), no chunk. Read as one, it failed the whole reply.
        return
    if payload.strip() == b"[DONE]":
        acc.done = True
        return
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise _unreadable(model, acc) from None
    if not isinstance(chunk, dict):
        raise _unreadable(model, acc)
    if (said := _said_error(chunk)) is not None:
        raise _error_reply(model, said, "in the stream", answered=acc.answered)
    try:
        acc.feed(chunk)
    except (LookupError, TypeError, AttributeError):
        raise _unreadable(model, acc) from None
    acc.chunks += 1


def _unreadable(model: ModelConfig, acc: _Stream) -> LLMError:
    """An event that is no chunk. As the first one: not a chat stream (read in Chinese with the
    hint to check base_url). After a chunk was read the address is right and the stream broke
    off (a body that ends inside a chunk's JSON, a proxy's garbage between events): a cut, its
    partial reply thrown away (R-FAIL-1)."""
    if acc.chunks:
        return LLMStreamCut(
            f"{model.id}: unreadable stream chunk after {acc.chunks} good ones", model_id=model.id
        )
    return LLMBadResponse(f"{model.id}: unreadable stream chunk", model_id=model.id)


def _call_id() -> str:
    """An id for a tool call the provider sent without one: results are matched by it."""
    return f"call_{uuid.uuid4().hex[:24]}"
