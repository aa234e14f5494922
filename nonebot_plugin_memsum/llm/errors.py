"""Errors of the LLM layer, the `LLMError` branch of the plugin's one tree (errors.py).

The hierarchy:

* LLMError
  + LLMConnectError
  + LLMTimeout
  + LLMStatusError
    - LLMAuthError
    - LLMRateLimited
    - LLMServerError
    - LLMBadRequest
      · LLMInputRefused
  + LLMStreamCut
  + LLMEmptyReply
  + LLMLengthLimit
  + LLMContentFilter
  + LLMErrorReply
  + LLMBadResponse

Messages are short, name the model id (and the HTTP status), and are built here from
plain values: never from httpx's exception text, which could carry request headers,
so the API key cannot reach a log line or a user through them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from nonebot_plugin_memsum.errors import MemsumError

if TYPE_CHECKING:
    from .client import ChatResult


# How providers word "the request is longer than the context" (the error's message; our
# client keeps `error.message`): OpenAI and DeepSeek (code `context_length_exceeded`,
# "This model's maximum context length is 8192 tokens. However, your messages resulted in
# 8545 tokens..."; forms collected in pkdone/paul-genai-test-tools-ts
# src/llm/providers/openai/openai-error-patterns.ts), vLLM (the same sentence), llama.cpp's
# server (type `exceed_context_size_error`, "request (9412 tokens) exceeds the available
# context size (8192 tokens), try increasing it"), Ollama ("the input length exceeds the
# context length"), DashScope/Qwen ("Range of input length should be [1, 30720]"), and the
# phrases crewAI's LLMContextLengthExceededException lists. Besides: Moonshot/Kimi ("Invalid
# request: Your request exceeded model token limit: 262144 (requested: 269030)", MoonshotAI/
# kimi-cli#2011; "model max length exceeded, max length:8192", MoonshotAI-Cookbook#18),
# SiliconFlow (code 20015, "length of prompt_tokens (68957) must be less than max_seq_len
# (65536).", chatboxai/chatbox#2060; "max_total_tokens (33802) must be less than or equal to
# max_seq_len (32768)", continuedev/continue#10993), vLLM's engine ("The decoder prompt (length
# 21535) is longer than the maximum model length of 16384", xorbitsai/inference#3785), SGLang
# and Together AI ("The input (9000 tokens) is longer than the model's context length (8192
# tokens).", sglang tokenizer_manager.py) and Gemini's OpenAI endpoint ("The input token count
# (3377151) exceeds the maximum number of tokens allowed (1048576)."). And: Zhipu GLM (code 1261,
# "Prompt exceeds max length", zeroclaw-labs/zeroclaw#4124), xAI/Grok ("This model's maximum prompt
# length is 131072 but the request contains 136973 tokens.", cline/cline#3120), SiliconFlow's newer
# wording ("number of input tokens (204703) has exceeded max_prompt_tokens (202752) limit.",
# leookun/cursor-byok#129) and Anthropic's, through its OpenAI-compatible endpoint ("input length
# and `max_tokens` exceed context limit: 196395 + 64000 > 204698", RooCodeInc/Roo-Code#3713).
# Said with HTTP 500 by self-hosted servers: llama.cpp's server between PR #15780 and PR #16486
# (exceed_context_size_error, code 500) and, still, "Context size has been exceeded." (ggml-org/
# llama.cpp#19774, also LM Studio's MLX engine), Xinference serving vLLM (FastAPI's {"detail": …},
# langchain-ai/deepagents#468). Baidu Qianfan's ERNIE models: "prompt tokens too long"
# (PaddlePaddle/ERNIE-SDK#336).
_CONTEXT_TOO_LONG = re.compile(
    r"context_length_exceeded|maximum context length|context length exceeded|exceed_context_size"
    r"|exceeds the available context size|input length exceeds the context length"
    r"|range of input length|context window|too many tokens|input is too long|prompt is too long"
    r"|exceeded model token limit|model max length exceeded|must be less than (?:or equal to )?max_seq_len"
    r"|longer than the maximum model length|longer than the model's context length"
    r"|exceeds the maximum number of tokens allowed|prompt exceeds max length|maximum prompt length"
    r"|exceeded max_prompt_tokens|exceed context limit|context size has been exceeded"
    r"|prompt tokens too long",
    re.IGNORECASE,
)


def is_context_too_long(status: int, message: str) -> bool:
    """Whether an HTTP error answers that the request is longer than the model's context: a 400,
    413 or 422 that says so, or a 5xx that says so (the self-hosted servers above)."""
    return (status in (400, 413, 422) or status >= 500) and _CONTEXT_TOO_LONG.search(message) is not None


# How providers word "your request's input did not pass our content review" (they review every
# request's input and refuse the whole request): Zhipu GLM (HTTP 400, code 1301, "系统检测到输入或生成
# 内容可能包含不安全或敏感内容，请您避免输入易产生敏感内容的提示语，感谢您的配合。", langchain4j/
# langchain4j#1079), DashScope/Qwen (HTTP 400, code data_inspection_failed, "Input data may contain
# inappropriate content." camel-ai/owl#432, Samueli924/chaoxing#539; "<400> InternalError.Algo.
# DataInspectionFailed: Input text data may contain inappropriate content." CommandCodeAI/
# command-code#813; the older "Input or output data may contain inappropriate content." 1Panel-dev/
# MaxKB#1085), Moonshot/Kimi (HTTP 400, type content_filter, "The request was rejected because it
# was considered high risk", 666ghj/BettaFish#368), Volcengine Ark (HTTP 400, code
# InputTextSensitiveContentDetected, "The request failed because the input text may contain
# sensitive information.", Ark's 错误码 page), Azure OpenAI (HTTP 400, code content_filter, "The
# response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
# Azure OpenAI "Content filtering" docs), DeepSeek (HTTP 400, "Content Exists Risk", 666ghj/
# BettaFish#108, deepseek-ai/DeepSeek-V2#30), MiniMax (base_resp 1026 "input new_sensitive",
# esengine/DeepSeek-Reasonix#6818) and the one-api/new-api gateways ("input contains sensitive
# words: [...]", code sensitive_words_detected, openai/openai-cookbook#1224). An output filter is
# another thing (finish_reason content_filter / sensitive: LLMContentFilter).
_INPUT_REFUSED = re.compile(
    r"可能包含不安全或敏感内容|input (?:text )?data may contain inappropriate content"
    r"|input or output data may contain inappropriate content|considered high risk"
    r"|input text may contain sensitive information|inputtextsensitivecontentdetected"
    r"|prompt triggering .{0,40}content management policy|content exists risk"
    r"|input new_sensitive|input contains sensitive words",
    re.IGNORECASE,
)


def is_input_refused(status: int, message: str) -> bool:
    """Whether an HTTP error answers that the provider's content review refused the request's
    input (a 400, 403, 422 or 451 that says so): not a refused parameter, not a context too long."""
    return status in (400, 403, 422, 451) and _INPUT_REFUSED.search(message) is not None


class LLMError(MemsumError):
    """A model request failed."""

    def __init__(self, message: str, *, model_id: str) -> None:
        super().__init__(message)
        self.model_id = model_id


class LLMConnectError(LLMError):
    """The API could not be reached, or dropped the connection before answering."""


class LLMTimeout(LLMError):
    """The request (for a stream: the whole stream) took longer than the timeout."""


class LLMStatusError(LLMError):
    """The API answered with an HTTP error status."""

    def __init__(self, message: str, *, model_id: str, status: int, retry_after: float | None = None) -> None:
        super().__init__(message, model_id=model_id)
        self.status = status
        self.retry_after = retry_after
        """Seconds the API asked us to wait (`Retry-After`, else Gemini's `retryDelay`), if it said."""


class LLMAuthError(LLMStatusError):
    """401 or 403: the API key is wrong or lacks access to the model."""


class LLMRateLimited(LLMStatusError):
    """429: too many requests, or the quota is spent."""


class LLMServerError(LLMStatusError):
    """5xx: the API failed on its side."""


class LLMBadRequest(LLMStatusError):
    """Any other 4xx: the API refused the request as sent."""

    refused: str | None = None
    """The optional request parameter (`stream_options`, `max_tokens`, …) a 400 says the API
    does not accept, when it names one."""


class LLMInputRefused(LLMBadRequest):
    """The provider's content review refused the request for something in its input
    (`is_input_refused`): the same request fails every time; what trips it must be left out."""


class LLMStreamCut(LLMError):
    """The reply broke off mid-way (no finish reason, no `[DONE]`, or a dropped connection)."""


class LLMEmptyReply(LLMError):
    """The API ended its reply without a word: no text, no tool call, no finish reason (a stream of
    only `[DONE]`, an empty body). No answer, and not the model choosing silence."""


class LLMLengthLimit(LLMError):
    """The model stopped at its output limit (finish reason `length`); `.result` holds the partial reply."""

    def __init__(self, message: str, *, model_id: str, result: ChatResult) -> None:
        super().__init__(message, model_id=model_id)
        self.result = result


class LLMContentFilter(LLMError):
    """The provider's content filter stopped the reply (finish reason `content_filter`, Zhipu's
    `sensitive`); `.result` holds what came before, which no one may see."""

    def __init__(self, message: str, *, model_id: str, result: ChatResult) -> None:
        super().__init__(message, model_id=model_id)
        self.result = result


class LLMErrorReply(LLMError):
    """The API answered 2xx with an error of its own in place of a reply, naming no HTTP status
    (one that names one is that status's LLMStatusError): the provider's words, not a bad base_url."""


class LLMBadResponse(LLMError):
    """The API answered 2xx with a body that is not a chat completion."""


def status_error(status: int, message: str, *, model_id: str, retry_after: float | None) -> LLMStatusError:
    """The error class for an HTTP status."""
    if status in (401, 403):
        cls: type[LLMStatusError] = LLMAuthError
    elif status == 429:
        cls = LLMRateLimited
    elif status >= 500:
        cls = LLMServerError
    elif status >= 400 and is_input_refused(status, message):
        cls = LLMInputRefused
    elif status >= 400:
        cls = LLMBadRequest
    else:
        cls = LLMStatusError
    return cls(message, model_id=model_id, status=status, retry_after=retry_after)


_IN_CHINESE: tuple[tuple[type[LLMError], str], ...] = (
    (LLMTimeout, "超时，没有在限定时间内给出完整回复"),
    (LLMConnectError, "连不上接口"),
    (LLMAuthError, "不认这个密钥（密钥不对，或没有这个模型的权限）"),
    (LLMRateLimited, "请求太频繁或额度已用完"),
    (LLMServerError, "服务端出错"),
    (LLMInputRefused, "的内容审核拒绝了这个请求（输入里有它认为不宜的内容）"),
    (LLMBadRequest, "拒绝了这个请求"),
    (LLMStreamCut, "回复中途断开"),
    (LLMEmptyReply, "的回复是空的（什么也没说，也没说为什么结束）"),
    (LLMLengthLimit, "输出到上限被截断"),
    (LLMContentFilter, "的回复被服务商的内容审核拦下"),
    (LLMErrorReply, "返回了错误而不是回复"),
    (LLMBadResponse, "回答不是聊天接口的格式（base_url 应是 OpenAI 兼容接口的根，通常以 /v1 结尾）"),
)


def in_chinese(err: LLMError) -> str:
    """What went wrong, for the people who read it in chat and on the web page: the model,
    a Chinese headline, and the detail (the HTTP status, the provider's own words) after it."""
    headline = next((text for cls, text in _IN_CHINESE if isinstance(err, cls)), "出错")
    if isinstance(err, LLMTimeout | LLMLengthLimit):
        return f"{err.model_id} {headline}"
    detail = str(err).removeprefix(err.model_id).removeprefix(":").strip()
    return f"{err.model_id} {headline}（{detail}）" if detail else f"{err.model_id} {headline}"
