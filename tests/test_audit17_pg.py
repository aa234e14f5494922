"""Outside audit 17 (pg): what landed lately behaves the same on SQLite and PostgreSQL.

Withdrawals (masking the session's active `recall` results, the quotes of replies stored
before), answers named on backfill, the overview's order, the recall index and its ranking,
the history cache, usage, settings layers, clears, deletion and compression's archive. A
seeded driver runs one random sequence through the library API and the Runtime on a SQLite
file and on PostgreSQL, where two runtimes (two bot processes) share the database and take
turns; restarts are new runtimes on the same database. After every step it compares what a
user or the model can see: the requests the model got, the answers, search hits in their
order, /回忆's text, the web page's data, and everything audit 12's driver observes
(tests/test_audit12_dp.py, whose helpers it reuses), read through every runtime.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from nonebot_plugin_memsum import api, clock, runtime, usage
from nonebot_plugin_memsum.agent import recall
from nonebot_plugin_memsum.commands import RECALL_LIMIT, parse_recall
from nonebot_plugin_memsum.onebot.render import bidi_visible
from nonebot_plugin_memsum.onebot.said import name_fetched_answer
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import QUOTE_OF_KEY, Message
from nonebot_plugin_memsum.web.app import create_app
from tests.fakes.llm_server import Reply
from tests.fakes.seeds import seeds
from tests.fakes.service import Env, Make, settle
from tests.test_audit12_dp import (
    CHILD,
    ENTRY,
    FRIEND,
    GROUP,
    LINES,
    SESSIONS,
    SPEAKERS,
    T0,
    TASK,
    Models,
    Names,
    Side,
    build,
    message,
    observe,
    plain,
    using,
)
from tests.test_audit12_dp import _perform as audit12_perform

TOKEN = "audit17-pg-web-token-0123456789abcdef"
ORIGIN = "http://memsum.test"
OWNER = {GROUP.id: 0, TASK.id: 0, CHILD.id: 0, FRIEND.id: 1}
"""Which of the PostgreSQL side's processes a session's chat is with (its bot account's)."""
TALK = ("record", "turn", "compress", "child", "internal")
TOKENS = re.compile(r"zk(\d+)q")
"""Every recorded message carries `zk<n>q`, n its platform id's number: a unique word."""


class RecallingModels(Models):
    """Audit 12's scripted models, calling `recall` more often and for a unique word the
    conversation holds, so that withdrawals meet stored recall results."""

    def chat(self, body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if body.get("tools") and last.get("role") == "user" and self.rng.random() < 0.5:
            said = sorted({int(n) for n in TOKENS.findall(json.dumps(body, ensure_ascii=False))})
            word = f"zk{self.rng.choice(said)}q" if said else "爬山"
            if self.rng.random() < 0.3:
                word += " " + self.rng.choice(["爬山", "服务器", "abc", "好好"])
            args = json.dumps({"query": word}, ensure_ascii=False)
            call = {"id": f"call_{self.rng.randrange(10**6)}", "name": "recall", "arguments": args}
            return Reply("", tool_calls=[call], finish_reason="tool_calls")
        return super().chat(body)


@dataclasses.dataclass
class Bot:
    """One engine: its runtimes on one database (PostgreSQL: two processes at once), the one
    that takes the next step, and the scripted models all of them share."""

    location: Path | str
    envs: list[Env]
    models: RecallingModels
    names: Names = dataclasses.field(default_factory=Names)
    turn: int = 0
    seen: dict[int, int] = dataclasses.field(default_factory=dict)

    def acting(self, step: dict[str, Any]) -> Env:
        """Who takes the step: a session's chat (its messages, turns, /压缩) is with the
        process of its bot account; the owner's page and the withdrawals it relays, any."""
        if step["op"] in TALK:
            return self.envs[OWNER[step["sid"]] % len(self.envs)]
        return self.envs[self.turn % len(self.envs)]

    def new_requests(self, env: Env) -> list[dict[str, Any]]:
        requests = list(env.model.llm.requests)
        fresh = requests[self.seen.get(id(env), 0) :]
        self.seen[id(env)] = len(requests)
        return fresh


async def runtime_on(make: Make, location: Path | str, models: RecallingModels) -> Env:
    env = (await build(make, 0, location)).env
    env.model.summary_default = models.summary
    env.model.chat_default = models.chat
    return env


async def restart(make: Make, bot: Bot, which: int) -> None:
    """The process `which` stops (its memory gone) and starts again on the same database."""
    old = bot.envs[which]
    await settle(old.rt)
    await runtime.close(old.rt)
    bot.envs[which] = await runtime_on(make, bot.location, bot.models)


def quoted(card: str, qq: str, text: str) -> str:
    return f"[回复 {card}({qq})：{text[:20]}] "


def steps(seed: int, count: int) -> list[dict[str, Any]]:
    """The sequence, decided up front; a pick among what is stored (`pick`) is made on each
    side from its own state, the same while the two agree."""
    rng = random.Random(seed * 104729)
    out: list[dict[str, Any]] = []
    n = 0
    said: dict[str, list[tuple[str, str, str, str]]] = {}  # sid -> (pid, card, qq, text)
    for _ in range(count):
        session = rng.choices(SESSIONS, weights=[6, 3, 1, 1])[0]
        sid = session.id
        op = rng.choices(
            [
                "record",
                "turn",
                "withdraw",
                "name",
                "compress",
                "clear",
                "delete",
                "setting",
                "search",
                "restart",
                "switch",
                "child",
            ],
            weights=[28, 16, 8, 3, 3, 2, 1, 4, 8, 2, 6, 1],
        )[0]
        if op == "record":
            messages = []
            for _ in range(rng.randint(1, 3)):
                card, qq = rng.choice(SPEAKERS)
                n += 1
                text = f"{rng.choice(LINES)} zk{n}q，" + "好" * rng.randrange(0, 40)
                quote, meta = "", {}
                earlier = said.get(sid, [])
                if earlier and rng.random() < 0.35:
                    pid, qcard, qqq, qtext = rng.choice(earlier)
                    quote, meta = quoted(qcard, qqq, qtext), {QUOTE_OF_KEY: pid}
                if rng.random() < 0.08:
                    messages.append(("assistant", f"（定时提醒）{text}", None, f"m{n}", {}))
                else:
                    messages.append(("user", f"[{card}({qq})] {quote}{text}", qq, f"m{n}", meta))
                said.setdefault(sid, []).append((f"m{n}", card, qq, text))
            out.append({"op": "record", "sid": sid, "messages": messages})
        elif op == "withdraw":
            sid = GROUP.id if rng.random() < 0.7 else sid  # where the model recalls most
            if said.get(sid):
                out.append(
                    {
                        "op": "withdraw",
                        "sid": sid,
                        "pid": rng.choice(said[sid])[0],
                        "pick": rng.random() if rng.random() < 0.7 else None,
                    }
                )
        elif op == "name":
            n += 1
            out.append({"op": "name", "sid": sid, "pid": f"a{n}", "fetched": rng.random() < 0.5})
        elif op == "clear":
            out.append({"op": "clear", "sid": sid, "kind": rng.choice(["context", "summary"])})
        elif op == "delete":
            out.append({"op": "delete", "sid": sid})
            said.pop(sid, None)
        elif op == "setting":
            name = rng.choice(["history_limit", "compress_at", "mode"])
            value = {
                "history_limit": rng.choice([6, 10, 16, 0]),
                "compress_at": rng.choice([0.3, 0.5, 0.8, 0.0]),
                "mode": rng.choice(["on", "on", "record"]),
            }[name]
            scope = "place" if session.place and rng.random() < 0.4 else "session"
            key = f"onebot:{session.place}" if scope == "place" else sid
            reset = rng.random() < 0.2
            out.append(
                {"op": "setting", "name": name, "scope": scope, "key": key, "value": value, "reset": reset}
            )
        elif op == "search":
            sid = GROUP.id if rng.random() < 0.6 else sid
            ours = [t for _, _, _, t in said.get(sid, [])]
            word = TOKENS.search(rng.choice(ours)).group(0) if ours and rng.random() < 0.5 else None  # type: ignore[union-attr]
            query = word or rng.choice(["爬山", "abc", "服务器 重启", "好好", "提取码", "周六"])
            out.append(
                {
                    "op": "search",
                    "sid": sid,
                    "query": query,
                    "speaker": rng.choice([None, None, None, "阿明", "20002", "Tom"]),
                    "since": None,
                    "until": None,
                    "limit": rng.choice([3, 5, 10]),
                    "context": rng.choice([0, 1, 2]),
                    "withdrawn": rng.random() < 0.3,
                }
            )
        elif op == "restart":
            out.append({"op": "restart", "which": rng.randrange(2)})
        elif op == "child":
            out.append({"op": rng.choice(["child", "internal"]), "sid": CHILD.id})
        else:
            out.append({"op": op, "sid": sid})
    return out


async def masked_pick(rt: Runtime, sid: str, pick: float) -> str | None:
    """A platform id among those the session's active recall results show (None: none)."""
    shown = sorted(
        {
            int(n)
            for m in await rt.store.get_history(sid)
            if m.role == "tool" and m.name == "recall"
            for n in TOKENS.findall(m.content)
        }
    )
    return f"m{shown[int(pick * len(shown))]}" if shown else None


async def perform(bot: Bot, env: Env, step: dict[str, Any], make: Make) -> Any:
    try:
        with using(env.rt):
            return await _perform(bot, env, step, make)
    except Exception as err:  # the error is what is compared
        return ("raised", type(err).__name__, str(err))
    finally:
        for env in bot.envs:
            await settle(env.rt)


async def _perform(bot: Bot, env: Env, step: dict[str, Any], make: Make) -> Any:
    rt = env.rt
    op = step["op"]
    sid = step.get("sid", "")
    session = next((s for s in SESSIONS if s.id == sid), None)
    if op == "record":
        assert session is not None
        out = []
        for role, text, name, pid, meta in step["messages"]:
            m = Message(
                role=role, content=text, name=name, platform_id=pid, addressed=role == "user", metadata=meta
            )
            out.append(message(await api.record(session, m), bot.names))
        return out
    if op == "turn":
        answers: list[str] = []

        async def reply(text: str) -> None:
            answers.append(text)

        return await api.run_turn(sid, reply, ENTRY.get(sid, api.Entry())), answers
    if op == "withdraw":
        pid = step["pid"]
        shown = None if step["pick"] is None else await masked_pick(rt, sid, step["pick"])
        await rt.mark_withdrawn(sid, shown or pid)
        return shown or pid, shown is not None
    if op == "name":
        unnamed = [
            m for m in await rt.store.get_history(sid) if m.role == "assistant" and m.platform_id is None
        ]
        if not unnamed:
            return None
        text = unnamed[-1].content
        if step["fetched"]:
            await name_fetched_answer(sid, step["pid"], " ".join(text.split()))
        else:
            await rt.store.name_answer(sid, text, step["pid"])
        return text
    if op == "clear":
        await rt.compression.clear(sid, step["kind"])
        return None
    if op == "setting":
        if step["reset"]:
            await rt.settings.reset(step["name"], step["scope"], step["key"])
        else:
            await rt.settings.set(step["name"], step["scope"], step["key"], step["value"])
        return None
    if op == "search":
        found = await audit12_perform(Side(env, bot.models, bot.names), step)
        return found, await recall_text(rt, sid, step["query"])
    if op == "restart":
        await restart(make, bot, step["which"] % len(bot.envs))
        return None
    if op == "switch":
        bot.turn += 1
        return None
    return await audit12_perform(Side(env, bot.models, bot.names), step)  # compress, delete, child


async def recall_text(rt: Runtime, sid: str, words: str) -> str:
    """What /回忆 answers (commands._recall, past its parsing of the event)."""
    zone = usage.zone_of(rt.config)
    try:
        query = parse_recall(sid, words.split(), [], zone)
    except ValueError as err:
        return str(err)
    found = await rt.store.search(dataclasses.replace(query, limit=RECALL_LIMIT + 1))
    lines = [bidi_visible(recall.line(h.message, zone)) for h in found[:RECALL_LIMIT]]
    return f"{len(found)}\n" + "\n".join(lines) if found else recall.NOTHING


def paths(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two observations differ, down to the leaves."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in dict.fromkeys([*a, *b]) for p in paths(a.get(k), b.get(k), f"{at}/{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True)) for p in paths(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at}: sqlite {a!r:.400} / postgres {b!r:.400}"]


def named(value: Any, names: Names) -> Any:
    """The page's data with message ids as their place in storage order."""
    if isinstance(value, dict):
        return {
            k: names.of(v) if k == "id" and isinstance(v, int) else named(v, names) for k, v in value.items()
        }
    if isinstance(value, list):
        return [named(v, names) for v in value]
    return value


async def page(rt: Runtime, names: Names) -> dict[str, Any]:
    """What the owner's web page reads (web/app.py), signed in."""
    app = create_app(lambda: rt, TOKEN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=ORIGIN, headers={"origin": ORIGIN}) as http:
        (await http.post("/api/login", json={"token": TOKEN})).raise_for_status()
        seen: dict[str, Any] = {"overview": (await http.get("/api/overview")).json()}
        for s in SESSIONS:
            seen[s.id] = (await http.get(f"/api/sessions/{s.id}")).json()
        for q in ("爬山", "好好 abc"):
            seen[q] = (await http.get(f"/api/sessions/{GROUP.id}/search", params={"q": q})).json()
    return named(seen, names)


async def everything(rt: Runtime, names: Names) -> dict[str, Any]:
    seen = await observe(rt, names)
    # The overview as the store lists it (audit 12 sorted it): the page keeps ties in this order.
    seen["overview listed"] = [a.session_id for a in await rt.store.session_overview("chat")]
    seen["page"] = await page(rt, names)
    return seen


async def compare_step(
    i: int, step: dict[str, Any], left: Bot, right: Bot, now: list[float], make: Make, tally: dict[str, int]
) -> None:
    now[0] = T0 + 37.0 * i
    acting = left.acting(step), right.acting(step)
    a, b = await perform(left, acting[0], step, make), await perform(right, acting[1], step, make)
    where = f"step {i} {step}"
    a_req, b_req = left.new_requests(acting[0]), right.new_requests(acting[1])
    assert a_req == b_req, (where, paths(a_req, b_req)[:6])
    assert plain(a) == plain(b), (where, paths(plain(a), plain(b))[:6])
    kind = step["op"] + (" raised" if isinstance(a, tuple) and a[:1] == ("raised",) else "")
    kind += " of a recall result" if step["op"] == "withdraw" and a[1] is True else ""
    tally[kind] = tally.get(kind, 0) + 1
    if step["op"] == "turn" and any(m.get("role") == "tool" for r in a_req for m in r["messages"]):
        tally["turn read recall"] = tally.get("turn read recall", 0) + 1
    # What each process keeps in memory for a second (the usage ledger, the latest usage) is
    # written before another process reads: a shared store lags by design (Store.record_usage).
    for env in (*left.envs, *right.envs):
        await env.rt.store.flush_ledger()
        await env.rt.compression.write_usage()
    seen = await everything(left.envs[0].rt, left.names)
    for n, env in enumerate(right.envs):
        other = await everything(env.rt, right.names)
        assert seen == other, (where, f"process {n}", paths(seen, other)[:6])


async def bot_on(make: Make, seed: int, location: Path | str, processes: int) -> Bot:
    models = RecallingModels(seed)
    envs = [await runtime_on(make, location, models) for _ in range(processes)]
    return Bot(location, envs, models)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [T0]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    return now


@pytest.mark.parametrize("seed", seeds([7, 23], [101, 202, 303]))
async def test_the_same_random_sequence_reads_the_same_on_sqlite_and_on_postgresql_shared_by_two_bots(
    pg_url: str, make: Make, tmp_path: Path, fake_clock: list[float], seed: int
) -> None:
    left = await bot_on(make, seed, tmp_path / "pg17.db", 1)
    right = await bot_on(make, seed, pg_url, 2)
    tally: dict[str, int] = {}
    for i, step in enumerate(steps(seed, 48)):
        await compare_step(i, step, left, right, fake_clock, make, tally)
    if seed in (7, 23):  # every run's seeds went where they were meant to; longer runs add others
        assert tally.get("withdraw of a recall result", 0) >= 1, sorted(tally.items())
        assert tally.get("turn read recall", 0) >= 1, sorted(tally.items())


# ---- regressions the driver found, shrunk -----------------------------------------------------
async def _status(rt: Runtime, sid: str) -> api.SessionStatus:
    with using(rt):
        return await api.status(sid)


def _said(n: int) -> Message:
    return Message(role="user", content=f"[阿明(20001)] 第{n}句：周末去爬山吗", name="20001", addressed=True)


async def test_a_clear_in_one_bot_process_forgets_the_usage_another_process_measured(
    pg_url: str, make: Make, fake_clock: list[float]
) -> None:
    # Seed 7, step 15: two bot processes on one PostgreSQL; the friend's chat is with process
    # B, the owner clears it from process A (the web page, /清除). B's turn had failed after its
    # request snapshot (601 tokens): that figure lived only in B's memory, so A's page showed
    # the last answered turn's figure meanwhile, and after A's clear B's /摘要 went on showing
    # 601 for a memory that was gone (SQLite: none, R-MEM-2).
    a = await runtime_on(make, pg_url, RecallingModels(0))
    b = await runtime_on(make, pg_url, RecallingModels(0))
    with using(b.rt):
        await api.record(FRIEND, _said(1))
        b.model.chat.append(Reply("好的"))
        assert await api.run_turn(FRIEND.id, None, ENTRY[FRIEND.id]) == "replied"
        await api.record(FRIEND, _said(2))
        b.model.chat.extend([Reply(status=400, error="scripted chat failure")] * 4)
        assert await api.run_turn(FRIEND.id, None, ENTRY[FRIEND.id]) == "error"
    measured = (await _status(b.rt, FRIEND.id)).usage
    assert measured is not None
    assert (await _status(a.rt, FRIEND.id)).usage == measured  # the snapshot, as SQLite shows it
    await a.rt.compression.clear(FRIEND.id, "context")
    assert (await _status(a.rt, FRIEND.id)).usage is None
    assert (await _status(b.rt, FRIEND.id)).usage is None


async def test_a_snapshot_outlives_a_restart_on_sqlite_as_it_is_read_on_postgresql(
    tmp_path: Path, make: Make, fake_clock: list[float]
) -> None:
    # With the snapshot stored on PostgreSQL, SQLite keeps it too: a restart after a failed
    # turn showed the answered turn before it, where PostgreSQL shows the failed request's.
    location = tmp_path / "restart.db"
    bot = Bot(location, [await runtime_on(make, location, RecallingModels(0))], RecallingModels(0))
    with using(bot.envs[0].rt):
        await api.record(FRIEND, _said(1))
        bot.envs[0].model.chat.append(Reply("好的"))
        assert await api.run_turn(FRIEND.id, None, ENTRY[FRIEND.id]) == "replied"
        answered = (await api.status(FRIEND.id)).usage
        await api.record(FRIEND, _said(2))
        bot.envs[0].model.chat.extend([Reply(status=400, error="scripted chat failure")] * 4)
        assert await api.run_turn(FRIEND.id, None, ENTRY[FRIEND.id]) == "error"
    measured = (await _status(bot.envs[0].rt, FRIEND.id)).usage
    assert measured is not None
    assert measured != answered
    await restart(make, bot, 0)
    assert (await _status(bot.envs[0].rt, FRIEND.id)).usage == measured


async def test_a_session_deleted_by_another_bot_process_is_gone_here_too(pg_url: str, make: Make) -> None:
    # Seed 7, step 47: process B knew the friend's session (its record cached), process A
    # deleted it (the web page); B still read the record from its cache, so its page showed
    # the deleted session (not 「没有这个会话」) and api.status of it went on.
    a = await runtime_on(make, pg_url, RecallingModels(0))
    b = await runtime_on(make, pg_url, RecallingModels(0))
    with using(b.rt):
        await api.record(FRIEND, _said(1))
    assert await b.rt.store.get_session(FRIEND.id) is not None  # known to B from now on
    with using(a.rt):
        await api.delete_session(FRIEND.id)
    assert await b.rt.store.get_session(FRIEND.id) is None
    assert (await page(b.rt, Names()))[FRIEND.id] == {"detail": "没有这个会话"}
