"""The SSE decoder of the chat client: events from the bytes of a body, however they are cut.

The recorded provider streams of tests/fixtures/providers/ (each cites its source) are fed
whole, cut at every byte, one byte at a time, and with their line ends rewritten to CRLF and
CR, which the event-stream format allows (WHATWG HTML, "Interpreting an event stream":
https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation,
"lines must be separated by either a U+000D CARRIAGE RETURN U+000A LINE FEED (CRLF) character
pair, a single U+000A LINE FEED (LF) character, or a single U+000D CARRIAGE RETURN (CR)
character"). CRLF is what servers built on sse-starlette send unless told otherwise
(`DEFAULT_SEPARATOR = "\\r\\n"`, sysid/sse-starlette sse_starlette/sse.py).
"""

import json

import pytest

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm.client import LLMClient, SSEDecoder
from tests.fakes.llm_server import Reply, ScriptedLLM, transcript

STREAMS = ["openai_stream_usage.sse", "deepseek_reasoner_stream.sse", "openrouter_stream_reasoning.sse"]


def decode(pieces: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    out = [event for piece in pieces for event in decoder.feed(piece)]
    return out + decoder.close()


def expected(body: bytes) -> list[bytes]:
    """The `data` of each event, read the plain way: LF lines, blank line between events."""
    events = []
    for block in body.split(b"\n\n"):
        data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if data:
            events.append(b"\n".join(data))
    return events


@pytest.mark.parametrize("name", STREAMS)
def test_a_recorded_stream_cut_at_every_byte_gives_the_same_events(name: str) -> None:
    body = transcript(name)
    assert any(b > 0x7F for b in body)  # multi-byte UTF-8 (Chinese) that some cuts split
    events = expected(body)
    assert events[-1:] == [b"[DONE]"]
    assert decode([body]) == events
    for cut in range(1, len(body)):
        assert decode([body[:cut], body[cut:]]) == events, cut
    assert decode([body[i : i + 1] for i in range(len(body))]) == events


@pytest.mark.parametrize("end", [b"\r\n", b"\r"])
def test_crlf_and_cr_line_ends_give_the_same_events(end: bytes) -> None:
    body = transcript("openai_stream_usage.sse")
    events = expected(body)
    rewritten = body.replace(b"\n", end)
    assert decode([rewritten]) == events
    for cut in range(1, len(rewritten)):
        assert decode([rewritten[:cut], rewritten[cut:]]) == events, cut


def test_comments_other_fields_and_multi_line_data() -> None:
    # OpenRouter's `: OPENROUTER PROCESSING` comments (providers/openrouter_stream_reasoning.sse),
    # DeepSeek's `: keep-alive`; an event of two data lines with `event:` and `id:` fields.
    body = (
        b": keep-alive\n\nevent: message\nid: 7\ndata: first\ndata:second\n\n"
        b": OPENROUTER PROCESSING\n\ndata: [DONE]"
    )
    assert decode([body]) == [b"first\nsecond", b"[DONE]"]  # the last event ends with the body


def test_a_blank_line_without_data_is_no_event() -> None:
    assert decode([b"\n\n\r\n\r\n: ping\n\n"]) == []


async def test_a_crlf_stream_in_tiny_http_chunks_reaches_the_answer_whole() -> None:
    """Over real HTTP: the recorded DeepSeek stream with CRLF line ends, sent in HTTP chunks of
    5 bytes, so lines, CRLF pairs and Chinese characters arrive split across reads."""
    body = transcript("deepseek_chat_stream.sse").replace(b"\n", b"\r\n")
    whole = [json.loads(e) for e in expected(transcript("deepseek_chat_stream.sse"))[:-1]]
    answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in whole if c["choices"])
    assert any(ord(ch) > 0x7F for ch in answer)
    with ScriptedLLM() as llm:
        llm.push(Reply(raw=body, raw_chunk_bytes=5))
        client = LLMClient(timeout=10)
        try:
            result = await client.chat(
                ModelConfig(**llm.model_config()), [{"role": "user", "content": "在吗"}], purpose="chat"
            )
        finally:
            await client.aclose()
    assert result.content == answer
    assert result.finish_reason == "stop"
    assert result.usage is not None
    assert result.usage.prompt_tokens > 0
