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
  + LLMStreamCut
  + LLMLengthLimit
  + LLMContentFilter
  + LLMBadResponse

Messages are short, name the model id (and the HTTP status), and are built here from
plain values: never from httpx's exception text, which could carry request headers,
so the API key cannot reach a log line or a user through them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nonebot_plugin_memsum.errors import MemsumError

if TYPE_CHECKING:
    from .client import ChatResult


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
        """Seconds the API asked us to wait (`Retry-After`), if it said."""


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


class LLMStreamCut(LLMError):
    """The reply broke off mid-way (no finish reason, no `[DONE]`, or a dropped connection)."""


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
    (LLMBadRequest, "拒绝了这个请求"),
    (LLMStreamCut, "回复中途断开"),
    (LLMLengthLimit, "输出到上限被截断"),
    (LLMContentFilter, "的回复被服务商的内容审核拦下"),
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
