"""Reading the summariser's reply: the 【保留原文】 block and the summary (R-RUN-7)."""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass

from nonebot_plugin_memsum.compression.templates import KEEP_HEADING, NONE_MARK

# Markdown markers and a full-width ＃ may stand before the heading.
_HEADING = re.compile(r"^[\s#＃*>\-]*" + re.escape(KEEP_HEADING) + r"(?P<rest>.*)$")
_DIGITS = frozenset("0123456789０１２３４５６７８９")
_ASCII_MARKS = frozenset(string.punctuation)
_NUMBER = re.compile(r"[0-9０-９]+")
_HASH_NUMBER = re.compile(r"[#＃]\s*([0-9０-９]+)")
# The annotation a request puts after a number, 「〔约 12 token〕」, copied back (in any
# bracket): it is no number to keep and no word that ends the block.
_ANNOTATION = re.compile(
    r"[〔(（\[]\s*(?:(?:约|~|～|≈)\s*[0-9０-９]+\s*(?:tokens?)?|[0-9０-９]+\s*tokens?)\s*[〕)）\]]",
    re.IGNORECASE,
)
_MAX_DIGITS = 9  # a longer run is no number of ours, and int() of a huge run may raise


@dataclass(frozen=True, slots=True)
class ParsedReply:
    summary: str
    """The reply without any 【保留原文】 block, stripped."""
    numbers: tuple[int, ...] | None
    """The numbers of the last block, first mention order; None when the reply has no heading."""
    block_unreadable: bool
    """The block has words but no number and no 「无」."""


def _is_word(ch: str) -> bool:
    """Not a digit, a blank or punctuation: punctuation of any script (quotes, brackets,
    dots, dashes) and ASCII's marks (`#`, `*`, `>`, `|`) in their full-width forms too."""
    if ch.isspace() or ch in _DIGITS:
        return False
    return not (unicodedata.category(ch)[0] == "P" or unicodedata.normalize("NFKC", ch) in _ASCII_MARKS)


def _lists_numbers(line: str) -> bool:
    """A line that only lists numbers: digits, # before them, 无, blanks, punctuation (a
    block quoted with `>` quotes its number lines too)."""
    return not any(_is_word(ch) for ch in line if ch != NONE_MARK)


def _block_end(lines: list[str], head: int) -> int:
    end = head + 1
    while end < len(lines) and _lists_numbers(_ANNOTATION.sub("", lines[end])):
        end += 1
    return end


def _numbers(block: list[str]) -> list[int]:
    """The numbers a block lists, first mention order; once any is written `#n`, only the
    `#n` count (`1. #3` keeps 3)."""
    runs = [r for line in block for r in _HASH_NUMBER.findall(line)]
    if not runs:
        runs = [r for line in block for r in _NUMBER.findall(line)]
    return list(dict.fromkeys(int(r) for r in runs if len(r) <= _MAX_DIGITS))


def parse_reply(text: str) -> ParsedReply:
    """Split a reply into the summary and the numbers to keep.

    A block is the heading line (numbers may follow the heading on it) and the lines
    right after it that only list numbers (a number's 「〔约 N token〕」 annotation
    copied back is neither a number nor a word); any other line ends it. The block may
    come first or last; with several, the last one counts; none is left in the
    summary. A `#3` in the summary body is no number.
    """
    lines = text.splitlines()
    summary: list[str] = []
    block: list[str] | None = None
    i = 0
    while i < len(lines):
        m = _HEADING.match(lines[i])
        if m is None:
            summary.append(lines[i])
            i += 1
            continue
        end = _block_end(lines, i)
        block = [_ANNOTATION.sub("", line) for line in (m.group("rest"), *lines[i + 1 : end])]
        i = end
    body = "\n".join(summary).strip()
    if block is None:
        return ParsedReply(body, None, block_unreadable=False)
    numbers = _numbers(block)
    said_none = any(NONE_MARK in line for line in block)
    has_words = any(_is_word(ch) for line in block for ch in line)
    unreadable = not numbers and not said_none and has_words
    return ParsedReply(body, tuple(numbers), block_unreadable=unreadable)
