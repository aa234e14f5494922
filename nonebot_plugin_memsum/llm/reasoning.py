"""A model's reasoning written into its answer, taken out before anyone sees or stores it.

DeepSeek-R1, QwQ, Qwen3 and others served through Ollama, LM Studio and many hosts put
their thinking at the head of `content` as a `<think>…</think>` block instead of a separate
`reasoning_content` field. The client applies this to every reply, so a chat, the stored
history and the summary parser only ever get the answer.

Decisions:
- Only a block at the head counts (leading whitespace allowed): a `<think>` later in the
  text is something the model says, e.g. a group talking about these very tags.
- A block never closed (the reply stopped at the output limit mid-thought) is all
  thought: the answer is empty.
- A reply with a closing tag but no opening one (a chat template that puts `<think>` into
  the prompt) is left alone: telling it from an answer that quotes `</think>` is guesswork.
"""

from __future__ import annotations

_OPEN = "<think>"
_CLOSE = "</think>"


def split_think(text: str) -> tuple[str, str]:
    """(answer, thought) of a reply that may start with a `<think>…</think>` block.

    Without such a block: (text, "") unchanged.
    """
    body = text.lstrip()
    if not body.startswith(_OPEN):
        return text, ""
    thought, closed, answer = body[len(_OPEN) :].partition(_CLOSE)
    if not closed:
        return "", thought.strip()
    return answer.lstrip(), thought.strip()
