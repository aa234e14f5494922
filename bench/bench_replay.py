"""Replay a long Chinese group chat through the real plugin against a fake model in its own process.

    python bench/bench_replay.py [--messages 3000 --windows 32000 8000 4000 2000 --seed 9]

The log is generated here (seeded): a dozen members with group cards, topics that change,
questions (some answered with an @), links, promises, emoji and reactions, long pastes
(tracebacks, build lists, articles), and the bot addressed about one message in ten. Each
member message is recorded through `api.record` as the OneBot layer stores it
(「[名片(QQ)] text」, the sender's id as `name`); a message to the bot is a turn
(`api.run_turn`), answered by the fake model with a reply of realistic length, and the
replay waits for the compression its end may start. bench/fake_openai.py runs as a
separate process (its CPU is not charged) and counts calls, o200k request tokens,
requests over the window and TCP connections.

Printed per window: summariser calls and input tokens, chat input tokens, turns the
plugin hard-trimmed, turns whose request did not end with the message that asked (summarised
or trimmed away), requests over the window (input + max_tokens > W), summariser
requests per compression, compressions refused, the chat estimate against the server's
count, connections opened, and the plugin's CPU per turn (everything it does for the
messages and turns, the harness's control calls excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import http.client
import json
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nonebot

nonebot.init(log_level="ERROR")

from nonebot.log import logger

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.config import Config, ModelConfig

logger.remove()
PERSONA = "你是群聊里的小助手，回答简洁友好，用中文。被 @ 时回答问题，其余时候不插话。"
BOT = "小助手"

# ---- the log ---------------------------------------------------------------------------------
_MEMBERS = [
    ("阿强", "程序猿阿强"), ("小美", "小美今天不加班"), ("老王", "隔壁老王"), ("摸鱼大师", "摸鱼大师"),
    ("Kevin", "Kevin"), ("思思", "思思🍓"), ("大熊", "大熊｜装机"), ("小林", "小林同学"),
    ("阿珂", "阿珂"), ("橘子", "橘子汽水"), ("老张", "张工"), ("Momo", "Momo_"),
]  # fmt: skip
_TOPICS = {
    "装机": ["这套配置{n}块能拿下吗", "显卡价格又涨了{n}%", "电源选{n}W够不够", "机箱风道怎么排比较好"],
    "代码": ["数据库从MySQL迁到PG要注意什么", "这个报错查了{n}小时没头绪", "3.{n} 有人用过吗"],
    "周末": ["周六下午{n}点去爬山吗", "那家火锅人均{n}左右", "周末有人打羽毛球吗", "电影票还剩{n}张"],
    "游戏": ["新赛季段位掉到{n}星了", "今晚{n}点开黑", "这个副本打了{n}遍还没出", "抽卡又歪了"],
    "工作": ["周报写了{n}页", "明天{n}点开组会", "需求又改了第{n}版", "下班了吗各位"],
    "学习": ["四级还有{n}天", "论文第{n}章写完了", "有人借我一下笔记吗", "图书馆几点关门"],
}  # fmt: skip
_REACTIONS = ["草", "+1", "[doge]", "哈哈哈哈", "确实", "😂😂", "有道理", "牛", "？？？", "[捂脸]", "👍"]
_LINKS = [
    "https://b23.tv/BV1{x}", "https://github.com/nonebot/nonebot2/issues/{n}",
    "https://pan.baidu.com/s/1{x} 提取码 {c}", "https://mp.weixin.qq.com/s/{x}",
    "https://item.jd.com/{n}.html", "https://www.zhihu.com/question/{n}",
]  # fmt: skip
_TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/srv/bot/plugins/{m}.py", line {n}, in handle\n    result = await session.execute(stmt)\n'
    '  File "/usr/lib/python3.11/site-packages/sqlalchemy/ext/asyncio/session.py", line 461, in execute\n'
    "    return await greenlet_spawn(self.sync_session.execute, statement)\n"
)
_ARTICLE = (
    "【公告】本群将于本周{n}进行例行整理，请大家把置顶文件备份好。群规第三条：禁止刷屏和发广告，违者移出。"
)


def _paste(rng: random.Random) -> str:
    kind = rng.choice(["trace", "article", "build"])
    if kind == "trace":
        body = "".join(
            _TRACE.format(m=rng.choice(["music", "weather", "todo"]), n=rng.randint(10, 400))
            for _ in range(8)
        )
        return body + "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked"
    if kind == "article":
        return "".join(_ARTICLE.format(n=rng.choice("一二三四五六日")) for _ in range(rng.randint(12, 30)))
    parts = [
        "CPU: i5-13600KF",
        "主板: B760M",
        "内存: 32G DDR5 6000",
        "显卡: RTX 4070",
        "硬盘: 2T NVMe",
        "电源: 750W 金牌",
    ]
    return "\n".join(f"{p} ￥{rng.randint(300, 5000)}" for p in parts * rng.randint(3, 8))


def generate(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` member messages; `to_bot` marks a turn, `reply` the bot's answer."""
    rng = random.Random(seed)
    members = [(nick, card, str(rng.randint(10_000_000, 3_999_999_999))) for nick, card in _MEMBERS]
    topic = rng.choice(list(_TOPICS))
    until = 0
    log: list[dict[str, Any]] = []
    for i in range(n):
        if i >= until:
            topic, until = rng.choice(list(_TOPICS)), i + rng.randint(40, 250)
        _, card, uid = rng.choice(members)
        roll = rng.random()
        if roll < 0.012:
            text = _paste(rng)
        elif roll < 0.05:
            text = f"{rng.choice(['看这个', '链接在这', '分享一下'])} " + rng.choice(_LINKS).format(
                n=rng.randint(1000, 99999), x=f"{rng.getrandbits(40):x}", c=f"{rng.getrandbits(16):04x}"
            )
        elif roll < 0.25:
            text = rng.choice(_REACTIONS)
        elif roll < 0.35:
            other = rng.choice(members)
            text = f"@{other[1]} {rng.choice(_TOPICS[topic]).format(n=rng.randint(1, 99))}？"
        else:
            text = rng.choice(_TOPICS[topic]).format(n=rng.randint(1, 99)) + rng.choice(
                ["", "。", "！", "吧", "～", " 😂"]
            )
            if rng.random() < 0.3:
                text += "，" + rng.choice(_TOPICS[rng.choice(list(_TOPICS))]).format(n=rng.randint(1, 99))
        to_bot = rng.random() < 0.1
        if to_bot:
            text = f"@{BOT} {text}"
        reply = ""
        if to_bot:
            reply = "".join(
                rng.choice(["好的，", "我看了一下，", "建议先", "可以试试", "记下了：", "这个问题"])
                for _ in range(2)
            )
            reply += rng.choice(_TOPICS[topic]).format(n=rng.randint(1, 99)) * rng.randint(1, 6)
        log.append({"card": card, "uid": uid, "text": text, "to_bot": to_bot, "reply": reply})
    return log


# ---- the fake model ----------------------------------------------------------------------------
class Server:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "fake_openai.py")], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().split()[1])
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def ctl(self, method: str, path: str, payload: Any = None) -> dict[str, Any]:
        body = None if payload is None else json.dumps(payload, ensure_ascii=False).encode()
        self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        return json.loads(self.conn.getresponse().read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def summary_budget(window: int, compress_at: float, ratio: float, reserve: int) -> int:
    """B as the plugin states it (R-BUD) when a lot is compressed, to cap the fake summaries."""
    line = min(compress_at * window, window - reserve)
    return int(min(max(line * ratio, 1000), line / 4, 2 / 3 * min(4096, window / 4)))


# ---- one replay ------------------------------------------------------------------------------------
@dataclass
class Replay:
    window: int
    turns: int = 0
    cpu_ns: int = 0
    harness_ns: int = 0
    trimmed: int = 0
    estimates: list[tuple[int, int]] = field(default_factory=list)
    per_compression: list[int] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


async def replay(
    log: list[dict[str, Any]],
    window: int,
    server: Server,
    spec: bool,
    profile: cProfile.Profile | None = None,
) -> Replay:
    out = Replay(window)
    tmp = Path(tempfile.mkdtemp(prefix="memsum-replay-"))
    model = ModelConfig.model_validate(
        {
            "id": "bench/fake",
            "base_url": f"http://127.0.0.1:{server.port}/v1",
            "api_key": "sk-bench",
            "context_window": window,
            "max_output_tokens": 4096,
        }
    )
    config = Config(
        memsum_models=[model], memsum_persona=PERSONA, memsum_capacity="spec" if spec else "measured"
    )
    cap = summary_budget(window, 0.8, 0.1, config.memsum_reply_max_tokens)
    server.ctl("POST", "/ctl/reset", {"window": window, "cap": cap})
    rt = await runtime.start(config, tmp / "memsum.db", [BOT], set())
    session = api.SessionRecord(
        id="onebot:1:group:2", platform="onebot", kind="group", place="group:2", room_class="room"
    )
    entry = api.Entry("onebot", "group")
    snapshot: list[int] = []
    started: list[int] = []

    def on_usage(e: api.UsageEvent) -> None:
        if e.turn_id is None:
            snapshot.append(e.usage)
        else:
            if e.trimmed:
                out.trimmed += 1
            out.estimates.append((snapshot[-1], e.usage))

    def on_progress(e: api.CompressionProgress) -> None:
        h = time.process_time_ns()
        summ = server.ctl("GET", "/ctl/count")["summ"]
        if e.phase == "start":
            started.append(summ)
        else:
            out.per_compression.append(summ - started.pop())
            if e.phase == "error":
                out.refusals.append(e.reason or "")
        out.harness_ns += time.process_time_ns() - h

    unsubscribe = [
        api.subscribe(api.UsageEvent, on_usage),
        api.subscribe(api.CompressionProgress, on_progress),
    ]

    async def silent(text: str) -> None:
        pass

    if profile is not None:
        profile.enable()
    try:
        for rec in log:
            content = f"[{rec['card']}({rec['uid']})] {rec['text']}"
            if rec["to_bot"]:
                h = time.process_time_ns()
                server.ctl("POST", "/ctl/turn", {"reply": rec["reply"], "asked": content})
                out.harness_ns += time.process_time_ns() - h
            t0 = time.process_time_ns()
            msg = api.Message(role="user", content=content, name=rec["uid"])
            await api.record(session, msg)
            if rec["to_bot"]:
                await api.run_turn(session.id, silent, entry)
                while bg := set(rt.compression._background):
                    await asyncio.gather(*bg, return_exceptions=True)
                out.turns += 1
            out.cpu_ns += time.process_time_ns() - t0
    finally:
        if profile is not None:
            profile.disable()
        for u in unsubscribe:
            u()
        await runtime.stop()
    out.counts = server.ctl("GET", "/ctl/count")
    return out


def report(r: Replay) -> None:
    c = r.counts
    errors = [abs(est - real) / real for est, real in r.estimates if real]
    per = r.per_compression or [0]
    cpu = (r.cpu_ns - r.harness_ns) / 1e6 / max(1, r.turns)
    mean = statistics.mean(errors or [0])
    rows = [
        ("summariser calls", c["summ"]),
        ("summariser input tokens", f"{c['summ_in']:,}"),
        ("  of it a system prompt repeated from the previous request", f"{c['summ_cached_prefix']:,}"),
        ("chat input tokens", f"{c['chat_in']:,}"),
        ("chat + summariser input tokens", f"{c['chat_in'] + c['summ_in']:,}"),
        ("turns / hard-trimmed turns", f"{r.turns} / {r.trimmed}"),
        ("turns not ending with the message that asked", c["asked_missing"]),
        ("requests over the window (input + max_tokens)", c["over_window"]),
        ("compressions / refused", f"{len(r.per_compression)} / {len(r.refusals)}"),
        ("summariser requests per compression: max / mean", f"{max(per)} / {statistics.mean(per):.1f}"),
        ("chat estimate vs server count: max / mean |error|", f"{max(errors, default=0):.2%} / {mean:.2%}"),
        ("connections opened / model calls", f"{c['connections']} / {c['chat'] + c['summ']}"),
        ("plugin CPU per turn, ms", f"{cpu:.2f}"),
    ]  # fmt: skip
    print(f"\nW = {r.window:,}")  # noqa: T201
    for name, value in rows:
        print(f"  {name:<52} {value}")  # noqa: T201
    if r.refusals:
        print(f"  refused: {sorted(set(r.refusals))}")  # noqa: T201


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--windows", type=int, nargs="+", default=[32000, 8000, 4000, 2000])
    ap.add_argument("--spec", action="store_true", help="MEMSUM_CAPACITY=spec (R-RUN-9's literal rule)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of each replay")
    args = ap.parse_args()
    log = generate(args.messages, args.seed)
    chars = sum(len(r["text"]) for r in log)
    turns = sum(r["to_bot"] for r in log)
    print(f"log: {len(log)} member messages, {turns} turns, {chars:,} characters (seed {args.seed})")  # noqa: T201
    server = Server()
    try:
        for window in args.windows:
            profile = cProfile.Profile() if args.profile else None
            report(asyncio.run(replay(log, window, server, args.spec, profile)))
            if profile is not None:
                pstats.Stats(profile).sort_stats("tottime").print_stats(40)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
