"""The LLM layer: model registry and preferences, the chat client, token estimates."""

from .client import ChatResult, LedgerFn, LLMClient, RetryPolicy, Usage
from .errors import (
    LLMAuthError,
    LLMBadRequest,
    LLMBadResponse,
    LLMConnectError,
    LLMContentFilter,
    LLMError,
    LLMInputRefused,
    LLMLengthLimit,
    LLMRateLimited,
    LLMServerError,
    LLMStatusError,
    LLMStreamCut,
    LLMTimeout,
    in_chinese,
    is_context_too_long,
    is_input_refused,
)
from .registry import Registry
from .tokens import aload_encoding, encoding_name, estimate_msg_tokens, estimate_text_tokens, load_encoding

__all__ = [
    "ChatResult",
    "LLMAuthError",
    "LLMBadRequest",
    "LLMBadResponse",
    "LLMClient",
    "LLMConnectError",
    "LLMContentFilter",
    "LLMError",
    "LLMInputRefused",
    "LLMLengthLimit",
    "LLMRateLimited",
    "LLMServerError",
    "LLMStatusError",
    "LLMStreamCut",
    "LLMTimeout",
    "LedgerFn",
    "Registry",
    "RetryPolicy",
    "Usage",
    "aload_encoding",
    "encoding_name",
    "estimate_msg_tokens",
    "estimate_text_tokens",
    "in_chinese",
    "is_context_too_long",
    "is_input_refused",
    "load_encoding",
]
