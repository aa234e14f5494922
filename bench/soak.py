"""Soak: bot.py as a real process under many groups, a failing model, and a SIGKILL.

    .venv/bin/python bench/soak.py --groups 1000 --rate 100 --minutes 4

- bot.py runs as its own process (tests/fakes/botproc.py) at LOG_LEVEL=INFO with a
  count line, so compressions happen;
- the model is a ScriptedLLM in a process of its own: every answer takes 0.3–2 s, 3 % of
  chat requests fail with 500 and 1 % with 429, 5 % of summaries fail; a chat answer
  names the questions in its prompt no earlier answer named, and how long the
  server spent on that prompt (all attempts), so the bench can tell overhead from model time;
- our own OneBot client (tests/fakes/onebot.py) connects over reverse WebSocket: groups
  of 5 members talk at `--rate` messages/s (10 % address the bot, bursts, 5,000-character
  pastes, malformed events) and it answers `get_group_msg_history` as NapCat does,
  keeping what is said while the bot is down;
- at `--kill-at` of the run the bot gets SIGKILL and is started again at once on the
  same data; the client reconnects when the bot listens again.

It prints: messages said / lost / duplicated / out of order, said-while-down not
recorded, questions unanswered within the window, answered twice, turn overhead p50/p99
(answers from one model request), bot CPU ms per message, resident-memory slope after
warm-up, log bytes per 1,000 messages. Figures, not assertions: tests/test_soak.py runs a
small version and asserts the correctness figures.
"""

# ruff: noqa: T201

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes.botproc import BotProcess
from tests.fakes.onebot import OneBotSim, at, text

SELF_ID = 10000
PERSONA = "你是压测群里的助手小记，回答简短。"
SUMMARISER = "你是对话摘要员"
SUMMARY = "【保留原文】无\n## 最近在聊什么\n大家在闲聊\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
TOKEN = re.compile(r"\b([MQ]\d+)\b")
QUESTION = re.compile(r"\bQ\d+\b")
APOLOGY = "抱歉"
SERVED = "model.served"
"""The model server's record, beside its URL file: one line per request, `start end token`."""
BACKFILL = re.compile(
    r"memsum: backfill of \d+: (\d+) messages said while away stored in (\d+) sessions \((\d+) ms\)"
)
"""The bot's INFO line at the end of an account's backfill on connect."""
SAID_WORDS = ("随便聊聊", "假装别人", "长长长长", "收到 ")
"""Words of what the members say and of the model's answers: none may reach the log."""


# ---- the model server (its own process) -------------------------------------------------
def serve_model(port_file: Path, faults: bool, seed: int) -> None:
    from tests.fakes.llm_server import Reply, ScriptedLLM

    rng = random.Random(seed)
    lock = threading.Lock()
    spent: dict[str, tuple[int, float]] = {}
    failed_at: dict[str, float] = {}
    served = port_file.with_name(SERVED).open("a", encoding="utf-8")

    def respond(body: dict[str, Any]) -> Reply:
        now = time.monotonic()
        messages = body["messages"]
        delay = rng.uniform(0.3, 2.0)
        key = hashlib.sha1(json.dumps(messages, ensure_ascii=False).encode()).hexdigest()
        reply = _respond(messages, key, delay)
        # When it served which session: from this request's arrival, or from the end of the
        # failed attempt it retries (the client's wait before a retry is the model's too),
        # to its answer; named by the first said token in the prompt (each is one group's).
        with lock:
            start = failed_at.pop(key, now)
            if reply.status != 200:
                failed_at[key] = now + delay
            token = next((t for m in messages for t in TOKEN.findall(str(m.get("content") or ""))), "-")
            served.write(f"{start:.4f} {now + delay:.4f} {token}\n")
            served.flush()
        return reply

    def _respond(messages: list[dict[str, Any]], key: str, delay: float) -> Reply:
        if str(messages[0].get("content", "")).startswith(SUMMARISER):
            if faults and rng.random() < 0.05:
                return Reply(status=500, delay=delay)
            return Reply(SUMMARY, delay=delay)
        with lock:
            attempts, total = spent.get(key, (0, 0.0))
            spent[key] = (attempts + 1, total + delay)
        roll = rng.random()
        if faults and roll < 0.03:
            return Reply(status=500, delay=delay)
        if faults and roll < 0.04:
            return Reply(status=429, headers={"Retry-After": "1"}, delay=delay)
        # What this answer covers: the questions in its prompt no earlier answer named. Not
        # only those after the last answer: a question that came while another turn ran is
        # stored before that turn's answer, and a model still sees it.
        asked: list[str] = []
        covered: set[str] = set()
        for m in messages:
            found = QUESTION.findall(str(m.get("content") or ""))
            if m["role"] == "assistant":
                covered.update(found)
            elif m["role"] == "user":
                asked += found
        seen = [q for q in asked if q not in covered]
        with lock:
            attempts, total = spent.pop(key)
        return Reply(
            f"收到 {' '.join(seen) or '-'} attempts={attempts} model_ms={total * 1000:.0f}", delay=delay
        )

    llm = ScriptedLLM()
    llm.on_request(respond)
    llm.start()
    port_file.write_text(llm.base_url)
    threading.Event().wait()


def start_model(workdir: Path, faults: bool, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / "model.url"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-model", str(port_file), "--seed", str(seed)]
        + (["--faults"] if faults else ["--no-faults"]),
        cwd=REPO,
    )
    for _ in range(200):
        if port_file.exists() and port_file.read_text():
            return proc, port_file.read_text()
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the model server did not start")


# ---- the run ----------------------------------------------------------------------------
@dataclass
class Said:
    token: str
    group: int
    message_id: int
    at: float
    down: bool
    question: bool


@dataclass
class Wait:
    """One counted answer: how long its asker waited, and how much of that was the model's."""

    life: str
    """"life N" (asked and answered in the Nth process), or "resumed" (asked before a restart)."""
    raw_ms: float
    """Answer time − question time − the model's time on the answer's own prompt."""
    net_ms: float
    """Answer time − question time − every moment in between the model served the question's
    session: its own prompt, an earlier turn's request still running, a summary, the wait
    before a retry. What is left is the bot's: its CPU, the event loop, the store, queues."""
    group: int
    asked: float


@dataclass
class Results:
    said: int = 0
    said_while_down: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    down_not_recorded: int = 0
    questions: int = 0
    unanswered: int = 0
    answered_twice: int = 0
    apologies: int = 0
    """Failed turns' apologies (counted as answering their asker for `unanswered`)."""
    overhead_ms: list[float] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    """The same answers as `overhead_ms`, attributed (process life, the model's share)."""
    cpu_ms_per_message: float = 0.0
    cpu_ms_with_startup: float = 0.0
    rss_slope_mb_per_min: list[float] = field(default_factory=list)
    log_bytes_per_1000: float = 0.0
    text_lines: int = 0
    turns: int = 0
    compressions: int = 0
    backfills: list[tuple[int, int, float]] = field(default_factory=list)
    """Each backfill on connect: messages stored, sessions fetched, seconds."""
    backfill_spans: list[tuple[str, float, float]] = field(default_factory=list)
    """(life, from, to): from when a restarted bot listened to the end of its backfill."""
    stopped: str = ""
    rss_max_mb: float = 0.0
    rss_spread_mb: list[tuple[float, float]] = field(default_factory=list)

    def report(self) -> str:
        p = f"{_p50_p99(self.overhead_ms)} ms" if self.overhead_ms else "-"
        return "\n".join(
            [
                f"messages said: {self.said} ({self.said_while_down} while the bot was down)",
                f"lost: {self.lost}  duplicated: {self.duplicated}  out of order: {self.out_of_order}",
                f"said while down, not recorded: {self.down_not_recorded}",
                f"questions: {self.questions}  unanswered within the window: {self.unanswered}"
                f"  answered twice: {self.answered_twice}  failed turns' apologies: {self.apologies}",
                f"turn overhead p50 / p99 (one model request): {p} over {len(self.overhead_ms)} answers",
                *self._split(),
                f"bot CPU per message: {self.cpu_ms_per_message:.2f} ms"
                f" ({self.cpu_ms_with_startup:.2f} ms with the start-ups)",
                "resident memory slope after warm-up (per process life): "
                + ", ".join(f"{s:+.2f} MB/min" for s in self.rss_slope_mb_per_min)
                + f"; highest {self.rss_max_mb:.0f} MB; after warm-up lowest-highest "
                + ", ".join(f"{lo:.1f}-{hi:.1f} MB ({hi - lo:.1f})" for lo, hi in self.rss_spread_mb),
                f"log: {self.log_bytes_per_1000 / 1024:.1f} KB per 1,000 messages;"
                f" lines with message text: {self.text_lines}",
                f"INFO turn lines: {self.turns}, compressions: {self.compressions}",
                "backfill on connect: "
                + (
                    ", ".join(f"{m} messages in {n} sessions, {t:.1f} s" for m, n, t in self.backfills)
                    or "none logged"
                ),
                f"SIGTERM at the end: {self.stopped}",
            ]
        )

    def _split(self) -> list[str]:
        if not self.waits:
            return []
        lines = [
            "  raw: answer - question - the model's time on that answer's prompt; net: also minus every"
            " moment the model served that session in between (an earlier turn, a summary, a retry's wait)"
        ]
        for life in sorted({w.life for w in self.waits}):
            raw = [w.raw_ms for w in self.waits if w.life == life]
            net = [w.net_ms for w in self.waits if w.life == life]
            lines.append(
                f"  {life}: {len(raw)} answers, raw p50 / p99 {_p50_p99(raw)} ms,"
                f" net {_p50_p99(net)} ms, net max {max(net):.0f} ms"
            )
        for life, since, until in self.backfill_spans:
            net = [w.net_ms for w in self.waits if w.life == life and since <= w.asked <= until]
            lines.append(
                f"  {life}, asked in the first {until - since:.1f} s after it listened (its backfill's"
                f" duration): {len(net)} answers"
                + (f", net p50 / p99 {_p50_p99(net)} ms, net max {max(net):.0f} ms" if net else "")
            )
        start = min(w.asked for w in self.waits)
        worst = sorted(self.waits, key=lambda w: w.net_ms)[-5:][::-1]
        lines.append(
            "  longest net: "
            + ", ".join(
                f"{w.net_ms:.0f} ms ({w.life}, group {w.group}, asked at {w.asked - start:.0f} s)"
                for w in worst
            )
        )
        return lines


def _p50_p99(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} / {_pct(values, 0.99):.0f}"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Proc:
    """CPU and RSS of one bot process life, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu = 0.0
        self.rss: list[tuple[float, float]] = []
        self.started = time.monotonic()
        """When it listened."""
        self.sample()
        self.startup = self.cpu
        """CPU seconds when it listened: loading, opening the store, the tokenizer."""

    def sample(self) -> None:
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            self.cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.rss.append((time.monotonic(), int(line.split()[1]) / 1024))
        except (OSError, IndexError):
            pass

    def after_warmup(self, warmup: float) -> list[tuple[float, float]]:
        return [(t, r) for t, r in self.rss if t >= self.rss[0][0] + warmup] if self.rss else []

    def spread(self, warmup: float) -> tuple[float, float] | None:
        """Lowest and highest RSS after the warm-up (issue 15: flat within +-5 MB)."""
        points = [r for _, r in self.after_warmup(warmup)]
        return (min(points), max(points)) if len(points) >= 3 else None

    def slope(self, warmup: float) -> float | None:
        points = self.after_warmup(warmup)
        if len(points) < 3:
            return None
        tm = statistics.mean(t for t, _ in points)
        rm = statistics.mean(r for _, r in points)
        den = sum((t - tm) ** 2 for t, _ in points)
        return sum((t - tm) * (r - rm) for t, r in points) / den * 60 if den else None


async def run(
    workdir: Path,
    *,
    groups: int,
    rate: float,
    seconds: float,
    kill_at: float | None = 0.5,
    faults: bool = True,
    warmup: float = 120.0,
    settle: float = 30.0,
    seed: int = 1,
    extra_env: dict[str, str] | None = None,
) -> Results:
    rng = random.Random(seed)
    model, base_url = start_model(workdir, faults, seed)
    model_cfg = {
        "id": "soak/model",
        "base_url": base_url,
        "api_key": "sk-soak",
        "context_window": 32000,
        "max_output_tokens": 1024,
    }
    env = {
        "MEMSUM_MODELS": json.dumps([model_cfg]),
        "MEMSUM_PERSONA": PERSONA,
        "MEMSUM_HISTORY_LIMIT": "40",
        "MEMSUM_LLM_TIMEOUT": "30",
        **(extra_env or {}),
    }
    bot = BotProcess(workdir / "bot", env=env, log_level="INFO")
    said: list[Said] = []
    replies: list[tuple[float, str, dict[str, Any]]] = []
    lives: list[Proc] = []
    stopped = ""
    try:
        await bot.start(60)
        lives.append(Proc(_pid(bot)))
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        sim.responders["send_msg"] = _recording_send(sim, replies)
        sim.responders["send_group_msg"] = lambda p: sim.responders["send_msg"](
            {**p, "message_type": "group"}
        )
        await sim.connect(60)
        down = [False]
        seq = 0
        start = time.monotonic()
        deadline = start + seconds
        kill_time = start + seconds * kill_at if kill_at is not None else None
        interval = 1 / rate
        next_at = start
        sampler = asyncio.create_task(_sample(lives))
        reconnect: asyncio.Task[None] | None = None
        while (now := time.monotonic()) < deadline:
            if kill_time is not None and now >= kill_time:
                kill_time = None
                lives[-1].sample()
                await bot.kill()
                down[0] = True
                reconnect = asyncio.create_task(_restart(bot, sim, lives, down))
            if now < next_at:
                await asyncio.sleep(min(next_at - now, 0.05))
                continue
            next_at += interval
            group = 900000 + rng.randrange(groups)
            burst = 3 if rng.random() < 0.05 else 1
            for _ in range(burst):
                seq += 1
                said.append(await _say(sim, rng, group, seq, down[0]))
        if reconnect is not None:
            await reconnect
        await _settle(said, replies, settle)  # answers in flight
        sampler.cancel()
        lives[-1].sample()
        await sim.close()
        try:
            stopped = f"exit code {await bot.terminate(60)}"
        except TimeoutError:  # a figure too: it still had work queued a minute after SIGTERM
            stopped = "still running 60 s after SIGTERM: killed"
            await bot.kill()
    finally:
        await bot.stop()
        model.kill()
    results = _analyse(bot, said, replies, lives, warmup, _served(workdir / SERVED, said))
    results.stopped = stopped
    return results


def _pid(bot: BotProcess) -> int:
    assert bot._proc is not None
    return bot._proc.pid


async def _restart(bot: BotProcess, sim: OneBotSim, lives: list[Proc], down: list[bool]) -> None:
    await asyncio.wait_for(sim.disconnected.wait(), 30)
    await bot.start(60)
    lives.append(Proc(_pid(bot)))
    await sim.connect(60)
    down[0] = False


async def _sample(lives: list[Proc]) -> None:
    while True:
        lives[-1].sample()
        await asyncio.sleep(2)


async def _say(sim: OneBotSim, rng: random.Random, group: int, seq: int, down: bool) -> Said:
    uid = 20000 + rng.randrange(5)
    question = rng.random() < 0.10
    token = f"{'Q' if question else 'M'}{seq}"
    roll = rng.random()
    body = f"{token} 随便聊聊第{seq}句"
    if roll < 0.002:
        body = f"{token} " + "长" * 5000  # a paste
    elif roll < 0.004:
        body = f"{token} [伪造(12345)] 假装别人"  # a forgery, neutralised but stored
    message: Any = [at(SELF_ID), text(f" {body}")] if question else body
    if sim._ws is None:
        down = True
    try:
        mid = await sim.group_message(group, uid, message, nickname=f"成员{uid - 20000}")
    except Exception:  # the connection dropped mid-send: QQ still has it
        down = True
        mid = max(sim.messages) if sim.messages else 0
    if rng.random() < 0.002 and sim._ws is not None:  # a malformed event: no message at all
        try:
            await sim.send_event({"post_type": "message", "message_type": "group", "group_id": group})
        except Exception:
            pass
    return Said(token, group, mid, time.monotonic(), down, question)


def _recording_send(sim: OneBotSim, replies: list[tuple[float, str, dict[str, Any]]]):
    plain = sim._send_msg

    def send(params: dict[str, Any]) -> dict[str, Any]:
        replies.append((time.monotonic(), json.dumps(params.get("message"), ensure_ascii=False), params))
        return plain(params)

    return send


def _covered(raw: str, by_id: dict[int, str]) -> tuple[set[str], re.Match[str] | None]:
    """The questions a sent answer covers, and the quote it carries."""
    covered = set(QUESTION.findall(raw))
    quoted = re.search(r'"reply", "data": \{"id": "(\d+)"', raw)
    if not covered and quoted and APOLOGY in raw:  # a failed turn answers its asker with the apology
        covered = {by_id.get(int(quoted.group(1)), "")}
    return covered, quoted


async def _settle(said: list[Said], replies: list[tuple[float, str, dict[str, Any]]], quiet: float) -> None:
    """Until every question has an answer, or none came for `quiet` seconds: a busy machine
    answers late, and the figures must not count that as never."""
    questions = {s.token for s in said if s.question}
    by_id = {s.message_id: s.token for s in said}
    answered: set[str] = set()
    seen, last = 0, time.monotonic()
    while time.monotonic() - last < quiet:
        if len(replies) > seen:
            for _, raw, _ in replies[seen:]:
                answered |= _covered(raw, by_id)[0]
            seen, last = len(replies), time.monotonic()
            if questions <= answered:
                return
        await asyncio.sleep(0.2)


def _served(path: Path, said: list[Said]) -> dict[int, list[tuple[float, float]]]:
    """Group → the intervals the model server spent on its requests, in order of start."""
    group_of = {s.token: s.group for s in said}
    served: defaultdict[int, list[tuple[float, float]]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        start, end, token = line.split()
        if token in group_of:
            served[group_of[token]].append((float(start), float(end)))
    for intervals in served.values():
        intervals.sort()
    return served


def _covered_time(intervals: list[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] inside the union of `intervals` (sorted by start)."""
    total, reach = 0.0, a
    for start, end in intervals:
        if start >= b:
            break
        start, end = max(start, reach), min(end, b)
        if end > start:
            total += end - start
            reach = end
    return total


def _life(lives: list[Proc], t: float) -> int:
    return sum(1 for p in lives[1:] if p.started <= t)


def _analyse(
    bot: BotProcess,
    said: list[Said],
    replies: list[tuple[float, str, dict[str, Any]]],
    lives: list[Proc],
    warmup: float,
    served: dict[int, list[tuple[float, float]]],
) -> Results:
    r = Results(said=len(said), said_while_down=sum(s.down for s in said))
    with sqlite3.connect(f"file:{bot.db_path}?mode=ro", uri=True) as con:
        rows = con.execute(
            "SELECT session_id, content FROM messages WHERE role = 'user' ORDER BY id"
        ).fetchall()
    found: Counter[str] = Counter()
    order: defaultdict[str, list[str]] = defaultdict(list)
    for sid, content in rows:
        tokens = TOKEN.findall(content.split("] ", 1)[-1][:40])
        if tokens:
            found[tokens[0]] += 1
            order[sid].append(tokens[0])
    r.lost = sum(1 for s in said if found[s.token] == 0)
    r.duplicated = sum(1 for s in said if found[s.token] > 1)
    r.down_not_recorded = sum(1 for s in said if s.down and found[s.token] == 0)
    position = {s.token: i for i, s in enumerate(said)}
    for tokens in order.values():
        seen = [position[t] for t in tokens if t in position]
        r.out_of_order += sum(1 for a, b in itertools.pairwise(seen) if b < a)
    questions = {s.token: s for s in said if s.question}
    r.questions = len(questions)
    answered: Counter[str] = Counter()
    apologised: Counter[str] = Counter()
    by_id = {s.message_id: s.token for s in said}
    for t, raw, _ in replies:
        covered, quoted = _covered(raw, by_id)
        answered.update(covered)
        if APOLOGY in raw:
            apologised.update(covered)
        m = re.search(r"attempts=(\d+) model_ms=(\d+)", raw)
        if quoted and m and m.group(1) == "1":
            asker = next(
                (q for q in covered if questions.get(q) and questions[q].message_id == int(quoted.group(1))),
                None,
            )
            if asker is not None and answered[asker] == 1 and not questions[asker].down:
                q = questions[asker]
                r.overhead_ms.append((t - q.at) * 1000 - int(m.group(2)))
                asked_in, answered_in = _life(lives, q.at), _life(lives, t)
                r.waits.append(
                    Wait(
                        f"life {asked_in + 1}" if asked_in == answered_in else "resumed",
                        r.overhead_ms[-1],
                        (t - q.at - _covered_time(served.get(q.group, []), q.at, t)) * 1000,
                        q.group,
                        q.at,
                    )
                )
    r.unanswered = sum(1 for q in questions if answered[q] == 0)
    # Twice: two answers from the model. A failed turn's apology (after its retries) and a later
    # turn's answer that names the same question are not: that later turn was another member's
    # question, and its model saw the first one still without an answer.
    r.answered_twice = sum(1 for q in questions if answered[q] - apologised[q] > 1)
    r.apologies = sum(apologised.values())
    delivered = max(1, r.said - r.lost)
    r.cpu_ms_per_message = sum(p.cpu - p.startup for p in lives) * 1000 / delivered
    r.cpu_ms_with_startup = sum(p.cpu for p in lives) * 1000 / delivered
    r.rss_slope_mb_per_min = [s for p in lives if (s := p.slope(warmup)) is not None]
    r.rss_spread_mb = [s for p in lives if (s := p.spread(warmup)) is not None]
    r.rss_max_mb = max((rss for p in lives for _, rss in p.rss), default=0.0)
    log = bot.log(all_runs=True)
    r.log_bytes_per_1000 = len(log.encode()) * 1000 / delivered
    r.text_lines = sum(1 for line in log.splitlines() if any(w in line for w in SAID_WORDS))
    r.turns = log.count("memsum: turn ")
    r.compressions = log.count("memsum: compression ")
    r.backfills = [(int(m), int(n), int(ms) / 1000) for m, n, ms in BACKFILL.findall(log)]
    restarted = lives[1:]  # the first life's store is empty: no backfill line of its own
    for i, (p, (_, _, seconds)) in enumerate(zip(restarted, r.backfills[-len(restarted) :], strict=False)):
        r.backfill_spans.append((f"life {i + 2}", p.started, p.started + seconds))
    return r


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Soak: bot.py under many groups, a failing model, a SIGKILL."
    )
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--rate", type=float, default=30, help="messages per second")
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--kill-at", type=float, default=0.5, help="fraction of the run; negative: no kill")
    parser.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup", type=float, default=120, help="seconds before the memory slope counts")
    parser.add_argument("--settle", type=float, default=30, help="seconds without an answer that end the run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--history-limit", type=int, default=40, help="the count line (lower: compressions come sooner)"
    )
    parser.add_argument("--bot", type=Path, help="another checkout's bot.py (a 'before' figure)")
    parser.add_argument("--profile", action="store_true", help="cProfile the bot (no kill); print the top")
    parser.add_argument(
        "--heap",
        help="minutes (e.g. 2,6,12) at which the bot (no kill) writes a heap census into its folder",
    )
    parser.add_argument(
        "--stalls",
        action="store_true",
        help="run the bot under bench/stall_bot.py: event-loop stalls over 50 ms, with stacks, per life",
    )
    parser.add_argument("--workdir", type=Path, help="keep the bot's folder (log, database) here")
    parser.add_argument("--serve-model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_model:
        serve_model(args.serve_model, args.faults, args.seed)
        return
    if args.bot:
        import tests.fakes.botproc

        tests.fakes.botproc.BOT_PY = args.bot.resolve()  # bot.py imports the package beside it
    if args.profile:
        import tests.fakes.botproc

        tests.fakes.botproc.BOT_PY = REPO / "bench" / "profiled_bot.py"
        args.kill_at = -1
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="memsum-soak-", dir=args.workdir)
    if args.heap:
        import tests.fakes.botproc

        tests.fakes.botproc.BOT_PY = REPO / "bench" / "heap_bot.py"
        args.kill_at = -1
        (Path(tmp) / "bot").mkdir()
        (Path(tmp) / "bot" / "heap.minutes").write_text(args.heap)
    if args.stalls:
        import tests.fakes.botproc

        (Path(tmp) / "bot").mkdir(exist_ok=True)
        (Path(tmp) / "bot" / "stall.bot").write_text(str(tests.fakes.botproc.BOT_PY))
        tests.fakes.botproc.BOT_PY = REPO / "bench" / "stall_bot.py"
    results = asyncio.run(
        run(
            Path(tmp),
            groups=args.groups,
            rate=args.rate,
            seconds=args.minutes * 60,
            kill_at=args.kill_at if args.kill_at >= 0 else None,
            faults=args.faults,
            warmup=args.warmup,
            settle=args.settle,
            seed=args.seed,
            extra_env={"MEMSUM_HISTORY_LIMIT": str(args.history_limit)},
        )
    )
    print(
        f"soak: {args.groups} groups, {args.rate:g} msg/s, {args.minutes:g} min,"
        f" kill at {args.kill_at:g}, faults {'on' if args.faults else 'off'}"
    )
    print(results.report())
    if args.profile:
        import pstats

        stats = pstats.Stats(str(Path(tmp) / "bot" / "profile.out"))
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(30)
    if args.heap:
        for census in sorted((Path(tmp) / "bot").glob("heap-*.txt"), key=lambda p: float(p.stem[5:])):
            print(f"\n---- {census.name}\n" + census.read_text())
    if args.stalls:
        for summary in sorted((Path(tmp) / "bot").glob("stalls-*.summary"), key=lambda p: p.stat().st_mtime):
            stalls = summary.with_suffix(".txt")
            print(f"\n---- process {summary.stem[7:]}: {summary.read_text()}")
            print(stalls.read_text() if stalls.exists() else "no stall over 50 ms")
    if args.workdir:
        print(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
