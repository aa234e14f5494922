"""Outside audit 11 (fy): a second seeded random driver through the real bot, on what the
first one (tests/test_audit10_fz.py) left out.

bot.py runs as a real process with TWO QQ accounts (A 10000 and B 10002) connected to it
through the OneBot simulator over the real reverse WebSocket, both in one group (G1: each
account receives the members' messages under one id, and what one account sends reaches the
other as a member's message, merged forwards as a `forward` segment), A alone in a second
group (G2: 仅记录 with `/条数线 群 8`, so it still compresses) and in the owner's private
chat. The scripted OpenAI-compatible server has a 6,000-token window, answers slowly at
times (1–3 s, so questions pile up while a turn runs), answers long (over
MEMSUM_FORWARD_THRESHOLD, sent as merged forwards) or starting with the bot's nickname, and
refuses with DashScope's `data_inspection_failed` 400 every request that holds a marker
word. Events are picked by seed: members' plain messages and questions (@A, @B, by
nickname, replies quoting either account's answers, forwards included, quotes of messages
no account ever saw), refused messages (some of them questions), the owner typing on A's
account (NapCat `message_sent`), a daily cap (/限额) reached mid-run and lifted later, and
MEMSUM_USER_COOLDOWN. Invariants checked:

- every member message is stored exactly once in each session of an account that saw it,
  as a user row, in platform order; what the owner typed on A once, as A's own (assistant);
- no account answers the other's words: no answer quotes a message of the other account,
  and a session never answers more often than its members asked (one answer per asking
  burst at most); no question gets two answers;
- no answer after the one cap notice of the day until the cap is lifted (no chat request
  of G1 starts after the notice went out), and the notice goes out at most once a day;
- a refused message is never sent to the model verbatim again once it is marked refused;
- G2 (仅记录) compresses and never answers; every request fits the window;
- after the run (cap lifted, cooldown over) each account still answers in each 开 place.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.controls import CAP_NOTICE
from nonebot_plugin_memsum.types import REFUSED_KEY
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import group_sid, private_sid, query, until, wait_log
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.onebot import (
    FORWARD_ACTIONS,
    SEND_ACTIONS,
    ApiCall,
    OneBotSim,
    Segment,
    at,
    plain_text,
    reply,
    text,
)
from tests.fakes.seeds import seeds
from tests.test_audit8_m import DASHSCOPE
from tests.test_audit8_v import SharedGroup
from tests.test_audit8_y import napcat_message_sent
from tests.test_audit10_fz import quoted_id, request_tokens

pytestmark = pytest.mark.e2e

PERSONA = "你是第十一轮随机审计群里的助手小记。"
OWNER = 10001
A_ID, B_ID = 10000, 10002
WINDOW = 6000
TIMEOUT = 8.0
COOLDOWN = 2.0
FORWARD_AT = 80
ERROR_REPLY = "抱歉，我这边出了点问题，请稍后再试。"
G1, G2 = 93001, 93002
MEMBERS = {20001: "甲", 20002: "乙", 20003: "丙", 20004: "丁"}
BANNED = "违禁口号"
"""What the scripted provider's review refuses, wherever it is in a request."""
SUMMARY = "## 最近在聊什么\n大家在随便聊天。\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
PHRASES = (
    "今天的会议纪要如下，请大家核对一下有没有遗漏的地方",
    "服务器在凌晨三点重启过一次，日志里能看到内存占用一直在涨",
    "下周的团建地点改到城西的那家农家乐，记得带上身份证",
    "这个版本的发布说明还没写完，测试组说回归还差两个用例",
)
ANSWER = re.compile(r"^(小记)?答(\d+)：")
MARKER = re.compile(r"〔(\d+)号〕")

Place = tuple[str, int]
Session = tuple[int, Place]  # (account, place)


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def sid_of(session: Session) -> str:
    account, (kind, pid) = session
    return group_sid(pid, account) if kind == "group" else private_sid(pid, account)


def message_of(c: ApiCall) -> Any:
    return c.params.get("messages") or c.params.get("message") or []


def answer_no(c: ApiCall) -> int | None:
    """The number of the model's answer a send carries (None: not an answer)."""
    found = ANSWER.match(plain_text(message_of(c)).strip())
    return int(found.group(2)) if found else None


def place_of(c: ApiCall) -> Place:
    if c.params.get("group_id") is not None and c.params.get("message_type") != "private":
        return ("group", int(c.params["group_id"]))
    return ("private", int(c.params.get("user_id") or 0))


def sends(sim: OneBotSim) -> list[tuple[int, ApiCall]]:
    return [(i, c) for i, c in enumerate(sim.calls) if c.action in SEND_ACTIONS | FORWARD_ACTIONS]


@dataclass
class Said:
    mid: int
    place: Place
    uid: int
    marker: str
    at: float
    asks: tuple[int, ...]
    """The accounts it asks."""
    refused: bool = False
    owed: bool = True
    """Owed an answer by every account it asks (not capped, not cooling)."""


@dataclass
class Model:
    """The scripted provider: slow at times, long at times, refusing BANNED."""

    seed: int
    rng: random.Random = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: int = 0
    slow: int = 0
    """Chat replies still to come slowly."""
    chats: dict[int, float] = field(default_factory=dict)
    """Answer number → when its request arrived."""
    arrivals: list[float] = field(default_factory=list)
    """When each request arrived, in `llm.requests` order."""
    bodies: list[tuple[float, str]] = field(default_factory=list)
    """When each request arrived and its JSON, in arrival order."""
    refusals: int = 0
    summaries: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed * 7919)

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.arrivals.append(time.time())
            dumped = json.dumps(body, ensure_ascii=False)
            self.bodies.append((time.time(), dumped))
            if BANNED in dumped:
                self.refusals += 1
                return Reply(status=400, raw=json.dumps(DASHSCOPE, ensure_ascii=False))
            if not is_chat(body):
                self.summaries += 1
                return Reply(f"【保留原文】无\n{SUMMARY}")
            self.answers += 1
            n = self.answers
            self.chats[n] = time.time()
            delay = 0.0
            if self.slow:
                self.slow -= 1
                delay = self.rng.uniform(1.0, 3.0)
            head = ("小记" if self.rng.random() < 0.3 else "") + f"答{n}："
            if n % 3 == 0:  # over MEMSUM_FORWARD_THRESHOLD: a merged forward in a group
                return Reply(head + "这是一个很长的回答，" * 12, delay=delay)
            return Reply(head + "收到。", delay=delay)


@dataclass
class Driver:
    seed: int
    bot: BotProcess
    a: OneBotSim
    b: OneBotSim
    llm: ScriptedLLM
    model: Model
    rng: random.Random = field(init=False)
    said: list[Said] = field(default_factory=list)
    typed: list[tuple[Session, str]] = field(default_factory=list)
    """What the owner typed on A's account (message_sent), per session."""
    trace: list[str] = field(default_factory=list)
    capped: tuple[float, float] | None = None
    """When the cap was set and lifted."""
    refused_seen: dict[str, float] = field(default_factory=dict)
    """A refused message's marker → when it was first seen marked."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.shared = SharedGroup(G1, [self.a, self.b], relays=1 << 30)
        self._relay_forwards()
        self.sims = {A_ID: self.a, B_ID: self.b}

    def _relay_forwards(self) -> None:
        # A merged forward one account sends reaches the other as a member's message with a
        # `forward` segment (OneBot v11 segment `forward`, data.id; NapCat reports received
        # forwards so: NapNeko/NapCatQQ src/onebot/types/message.ts OB11MessageForward).
        for sim, other in ((self.a, self.b), (self.b, self.a)):
            base = sim.responders["send_group_forward_msg"]

            def relay(
                params: dict[str, Any], sim: OneBotSim = sim, other: OneBotSim = other, base: Any = base
            ):
                answer = base(params)
                if str(params.get("group_id")) == str(G1):
                    fid = int(answer["message_id"])
                    seg: Segment = {"type": "forward", "data": {"id": str(fid)}}
                    task = asyncio.ensure_future(other.group_message(G1, sim.self_id, [seg], message_id=fid))
                    self.shared._tasks.add(task)
                    task.add_done_callback(self.shared._tasks.discard)
                return answer

            sim.responders["send_group_forward_msg"] = relay

    # ---- events ---------------------------------------------------------------------------
    async def step(self, i: int, total: int) -> None:
        if i == total // 3:  # a cap a turn or two from now
            used = await query(
                self.bot.db_path,
                "SELECT coalesce(sum(tokens_in + tokens_out), 0) FROM ledger WHERE session_id IN (?, ?)",
                group_sid(G1, A_ID),
                group_sid(G1, B_ID),
            )
            return await self.owner_command(G1, f"/限额 {int(used[0][0]) + 150}", cap=True)
        if i == 5 * total // 6:
            return await self.owner_command(G1, "/限额 无", cap=False)
        roll = self.rng.random()
        if roll < 0.20:
            await self.member_says(G1, self.words())
        elif roll < 0.30:
            await self.member_says(G2, self.words())
        elif roll < 0.40:
            await self.member_says(G1, [at(A_ID), text(f" {self.words()}？")], asks=(A_ID,))
        elif roll < 0.46:
            await self.member_says(G1, [at(B_ID), text(f" {self.words()}？")], asks=(B_ID,))
        elif roll < 0.50:
            await self.member_says(G1, f"小记，{self.words()}？", asks=(A_ID, B_ID))
        elif roll < 0.57:
            await self.quote_answer()
        elif roll < 0.60:  # a quote of a message no account ever saw: asks nobody
            await self.member_says(G1, [reply(5_000_000 + i), text(self.words())])
        elif roll < 0.68:
            await self.refused_message()
        elif roll < 0.74:
            await self.owner_types()
        elif roll < 0.82:
            await self.owner_asks_privately()
        elif roll < 0.88:
            await self.pile_up()
        elif roll < 0.93:
            await self.quote_member()
        else:
            await self.member_says(G2, [at(A_ID), text(f" {self.words()}？")])  # 仅记录: asks nobody
        return None

    def words(self) -> str:
        return self.rng.choice(PHRASES)[: self.rng.randint(6, 20)]

    def next_marker(self) -> str:
        return f"〔{len(self.said) + 1}号〕"

    def accounts_of(self, place: Place) -> tuple[int, ...]:
        return (A_ID, B_ID) if place == ("group", G1) else (A_ID,)

    async def member_says(
        self,
        group: int,
        body: str | list[Segment],
        *,
        asks: tuple[int, ...] = (),
        refused: bool = False,
        wait: bool = True,
    ) -> Said:
        uid = self.rng.choice(list(MEMBERS))
        marker = self.next_marker()
        body = marker + body if isinstance(body, str) else [text(marker), *body]
        if group == G1:
            mid = await self.shared.say(uid, body, nickname=MEMBERS[uid])
        else:
            mid = await self.a.group_message(group, uid, body, nickname=MEMBERS[uid])
        s = Said(mid, ("group", group), uid, marker, time.time(), asks, refused)
        self.note(s)
        if wait:
            await self.stored(s)
        return s

    def note(self, s: Said) -> None:
        if s.asks and s.place == ("group", G1) and self.capped is not None and self.capped[1] == 0:
            s.owed = False  # capped: the notice at most
        for earlier in self.said:  # the member's cooldown: a question within it is not owed
            if (
                earlier.place == s.place
                and earlier.uid == s.uid
                and earlier.asks
                and s.at - earlier.at < COOLDOWN + 1
            ):
                if set(earlier.asks) & set(s.asks):
                    s.owed = False
        if s.refused:
            s.owed = False  # the error reply, or an answer: either is fine
        self.said.append(s)
        self.trace.append(f"say {s.mid} {s.place} asks={s.asks} owed={s.owed} refused={s.refused}")

    async def quote_answer(self) -> None:
        """A reply quoting one of an account's answers (a merged forward among them) asks it."""
        account = self.rng.choice((A_ID, B_ID))
        sim = self.sims[account]
        mine = [
            m.message_id
            for m in sim.messages.values()
            if m.group_id == G1
            and m.sender.get("user_id") == account
            and (ANSWER.match(plain_text(m.message).strip()) or m.message[0].get("type") == "forward")
        ]
        if not mine:
            await self.member_says(G1, self.words())
            return
        await self.member_says(G1, [reply(self.rng.choice(mine[-5:])), text(self.words())], asks=(account,))

    async def quote_member(self) -> None:
        ids = [s for s in self.said if s.place == ("group", G1)][-6:]
        if not ids:
            await self.member_says(G1, self.words())
            return
        quoted = self.rng.choice(ids)
        await self.member_says(G1, [reply(quoted.mid), text(self.words())])

    async def refused_message(self) -> None:
        group = self.rng.choice((G1, G1, G2))
        if group == G1 and self.rng.random() < 0.4:
            await self.member_says(
                group, [at(A_ID), text(f" {BANNED}，{self.words()}？")], asks=(A_ID,), refused=True
            )
        else:
            await self.member_says(group, f"{BANNED}，{self.words()}", refused=True)

    async def pile_up(self) -> None:
        """A slow model, and questions asked while its turn runs."""
        with self.model.lock:
            self.model.slow += 2
        self.trace.append("slow")
        n = self.rng.randint(2, 4)
        for _ in range(n):
            s = await self.member_says(G1, [at(A_ID), text(f" {self.words()}？")], asks=(A_ID,), wait=False)
            await asyncio.sleep(self.rng.uniform(0.05, 0.6))
            await self.stored(s)

    async def owner_types(self) -> None:
        """The owner types on A's account in another client: NapCat's `message_sent`."""
        group = self.rng.choice((G1, None))
        # Typed by a person, it may call the bots by name or @ the other account.
        head = self.rng.choice(("", "", "小记，", "@小记乙 "))
        words = f"{head}主人手打〔{len(self.typed) + 1}〕{self.words()}"
        if group is not None:
            body = [at(B_ID), text(words[len(head) :])] if head.startswith("@") else [text(words)]
            mid = self.a._store("group", self.a._self_sender(), body, None, group_id=group).message_id
            await self.a.send_event(napcat_message_sent(mid, body, group_id=group))
            # B, in the same group, receives it as the message of a member (A's account).
            await self.b.group_message(G1, A_ID, body, nickname="小记甲", message_id=mid)
            session: Session = (A_ID, ("group", group))
        else:
            mid = self.a._store(
                "private", self.a._self_sender(), [text(words)], None, user_id=OWNER
            ).message_id
            await self.a.send_event(napcat_message_sent(mid, [text(words)], peer=OWNER))
            session = (A_ID, ("private", OWNER))
        self.typed.append((session, words[len(head) :]))
        self.trace.append(f"typed {mid} {session}")
        await until(lambda: self._has(session, words[len(head) :]), f"{words} stored")

    async def _has(self, session: Session, words: str) -> bool:
        found = await query(
            self.bot.db_path,
            "SELECT 1 FROM messages WHERE session_id = ? AND content LIKE ?",
            sid_of(session),
            f"%{words}%",
        )
        return bool(found)

    async def owner_asks_privately(self) -> None:
        marker = self.next_marker()
        mid = await self.a.private_message(OWNER, marker + self.words(), nickname="主人")
        s = Said(mid, ("private", OWNER), OWNER, marker, time.time(), (A_ID,))
        self.note(s)
        await self.stored(s)

    async def owner_command(self, group: int, command: str, *, cap: bool) -> None:
        mark = len(self.a.calls)
        self.trace.append(f"command {command}")
        await self.shared.say(OWNER, command, nickname="主人")
        await self.a.wait_call(  # a long command output goes out as a merged forward too
            set(SEND_ACTIONS | FORWARD_ACTIONS),
            predicate=lambda c: "限额" in plain_text(message_of(c)),
            after=mark,
            timeout=20,
        )
        if cap:
            self.capped = (time.time(), 0)
        elif self.capped is not None:
            self.capped = (self.capped[0], time.time())

    # ---- waiting --------------------------------------------------------------------------
    async def stored(self, s: Said) -> None:
        for account in self.accounts_of(s.place):
            sid = sid_of((account, s.place))

            async def there(sid: str = sid) -> bool:
                found = await query(
                    self.bot.db_path,
                    "SELECT 1 FROM messages WHERE session_id = ? AND platform_id = ?",
                    sid,
                    str(s.mid),
                )
                return bool(found)

            await until(there, f"message {s.mid} stored in {sid} (seed {self.seed}: {self.trace[-6:]})")

    def covered(self, s: Said, account: int) -> bool:
        sim = self.sims[account]
        for _, c in sends(sim):
            if c.time < s.at - 0.5 or place_of(c) != s.place:
                continue
            t = plain_text(message_of(c)).strip()
            if t == ERROR_REPLY or (
                answer_no(c) and (s.place[0] == "private" or c.action in FORWARD_ACTIONS)
            ):
                return True
            quoted = quoted_id(c)
            if answer_no(c) and quoted is not None and quoted >= s.mid:
                return True
        return False

    async def settle(self) -> None:
        owed = [(s, acc) for s in self.said if s.owed for acc in s.asks]

        async def done() -> bool:
            await self.note_refused()
            return all(self.covered(s, acc) for s, acc in owed)

        await until(
            done,
            f"answers to {[(s.mid, acc) for s, acc in owed if not self.covered(s, acc)]} (seed {self.seed})",
            within=30,
            progress=lambda: _value(len(self.a.calls) + len(self.b.calls)),
        )

    # ---- invariants -------------------------------------------------------------------------
    async def note_refused(self) -> None:
        """When each refused message was seen marked in every session that holds it (each
        account's session finds it by itself: its copy is its own row)."""
        for s in self.said:
            if not s.refused or s.marker in self.refused_seen:
                continue
            marked = 0
            for account in self.accounts_of(s.place):
                found = await query(
                    self.bot.db_path,
                    "SELECT metadata FROM messages WHERE session_id = ? AND platform_id = ?",
                    sid_of((account, s.place)),
                    str(s.mid),
                )
                marked += bool(found and found[0][0] and json.loads(found[0][0]).get(REFUSED_KEY))
            if marked == len(self.accounts_of(s.place)):
                self.refused_seen[s.marker] = time.time()

    async def check_store(self) -> None:
        for account in (A_ID, B_ID):
            for place in (("group", G1), ("group", G2), ("private", OWNER)):
                session = (account, place)
                if account not in self.accounts_of(place):
                    continue
                rows = await query(
                    self.bot.db_path,
                    "SELECT platform_id, role, content FROM messages WHERE session_id = ? ORDER BY id",
                    sid_of(session),
                )
                where = f"seed {self.seed}, {session}"
                by_id: dict[str, list[tuple[Any, ...]]] = {}
                for r in rows:
                    if r[0] is not None:
                        by_id.setdefault(str(r[0]), []).append(r)
                mine = [s for s in self.said if s.place == place]
                for s in mine:
                    got = by_id.get(str(s.mid), [])
                    assert len(got) == 1, f"{where}: {s.mid} stored {len(got)} times: {got}"
                    assert got[0][1] == "user", f"{where}: {got}"
                    assert s.marker in got[0][2], f"{where}: {got}"
                order = [int(r[0]) for r in rows if r[0] is not None and int(r[0]) in {s.mid for s in mine}]
                assert order == sorted(order), f"{where}: out of order"
                for typed_session, words in self.typed:
                    holding = [r for r in rows if words in str(r[2])]
                    if typed_session == session:
                        assert [r[1] for r in holding] == ["assistant"], f"{where}: typed {words}: {holding}"

    def check_calls(self) -> None:
        said = {s.mid: s for s in self.said}
        for account, sim in self.sims.items():
            other = B_ID if account == A_ID else A_ID
            quotes: set[int] = set()
            numbers: set[int] = set()
            per_place: dict[Place, int] = {}
            for index, c in sends(sim):
                n = answer_no(c)
                place = place_of(c)
                where = f"seed {self.seed}: account {account} send {index} {plain_text(message_of(c))[:30]!r}"
                if n is None:
                    continue
                assert n not in numbers, f"{where}: answer {n} sent twice"
                numbers.add(n)
                assert place != ("group", G2), f"{where}: answered in 仅记录 G2"
                per_place[place] = per_place.get(place, 0) + 1
                quoted = quoted_id(c)
                if quoted is not None:
                    assert quoted not in quotes, f"{where}: a second answer to {quoted}"
                    quotes.add(quoted)
                    s = said.get(quoted)
                    assert s is not None, f"{where}: quotes {quoted}, no member's message"
                    assert account in s.asks, f"{where}: answers {quoted}, which asked {s.asks}"
                    q = sim.messages.get(quoted)
                    assert q is None or q.sender.get("user_id") != other, (
                        f"{where}: answers the other account"
                    )
            # MEMSUM_USER_COOLDOWN: the questions of one member an account answers in a group
            # were asked at least the cooldown apart.
            times: dict[tuple[Place, int], list[float]] = {}
            for quoted in quotes:
                if (s := said.get(quoted)) is not None and s.place[0] == "group":
                    times.setdefault((s.place, s.uid), []).append(s.at)
            for (place, uid), ats in times.items():
                ats.sort()
                gaps = [b - a for a, b in itertools.pairwise(ats)]
                assert all(g >= COOLDOWN - 0.3 for g in gaps), (
                    f"seed {self.seed}: {account} answered {uid} in {place} {gaps} s apart"
                )
            for place, count in per_place.items():
                asked = [s for s in self.said if s.place == place and account in s.asks]
                assert count <= len(asked), (
                    f"seed {self.seed}: {account} answered {place} {count} times, asked {len(asked)}"
                )
        notices = [
            c for sim in self.sims.values() for _, c in sends(sim) if plain_text(message_of(c)) == CAP_NOTICE
        ]
        assert len(notices) <= 1, f"seed {self.seed}: {len(notices)} cap notices in one day"

    def check_cap(self) -> None:
        notices = [
            c for sim in self.sims.values() for _, c in sends(sim) if plain_text(message_of(c)) == CAP_NOTICE
        ]
        if not notices or self.capped is None:
            return
        start, end = notices[0].time, self.capped[1] or float("inf")
        g1 = {s.marker for s in self.said if s.place == ("group", G1)}
        for body, arrived in zip(list(self.llm.requests), list(self.model.arrivals), strict=False):
            if not is_chat(body) or not start + 0.2 < arrived < end - 0.2:
                continue
            last_user = next(m for m in reversed(body["messages"]) if m["role"] == "user")
            markers = set(MARKER.findall(str(last_user.get("content"))))
            assert not {f"〔{m}号〕" for m in markers} & g1, (
                f"seed {self.seed}: a G1 turn called the model {arrived - start:.1f}s after the cap notice"
            )

    def check_requests(self) -> None:
        bodies = list(self.llm.requests)
        for n, body in enumerate(bodies):
            assert request_tokens(body) <= WINDOW, f"seed {self.seed}: request {n} over the window"
        for marker, seen in self.refused_seen.items():
            # A request that reached the model a moment after the mark was seen stored.
            for arrived, dumped in list(self.model.bodies):
                assert not (arrived > seen + 0.3 and marker in dumped and BANNED in dumped), (
                    f"seed {self.seed}: {arrived - seen:.1f}s after {marker} was marked refused, a request"
                    f" sends it: {[m for m in json.loads(dumped)['messages'] if marker in str(m)]}"
                )


async def _value(v: object) -> object:
    return v


def env(llm: ScriptedLLM) -> dict[str, str]:
    return {
        "MEMSUM_MODELS": json.dumps([llm.model_config("test/model", context_window=WINDOW)]),
        "MEMSUM_PERSONA": PERSONA,
        "MEMSUM_LLM_TIMEOUT": str(TIMEOUT),
        "MEMSUM_USER_COOLDOWN": str(COOLDOWN),
        "MEMSUM_FORWARD_THRESHOLD": str(FORWARD_AT),
    }


async def drive(tmp_path: Path, llm: ScriptedLLM, seed: int, events: int) -> Driver:
    llm.reset()
    model = Model(seed)
    llm.on_request(model)
    try:
        async with BotProcess(tmp_path / "bot", env=env(llm), log_level="INFO") as bot:
            a = OneBotSim(bot.ws_url, self_id=A_ID, access_token=bot.access_token, nickname="小记甲")
            b = OneBotSim(bot.ws_url, self_id=B_ID, access_token=bot.access_token, nickname="小记乙")
            async with a, b:
                await wait_log(bot, f"Bot {A_ID} connected")
                await wait_log(bot, f"Bot {B_ID} connected")
                d = Driver(seed, bot, a, b, llm, model)
                try:
                    for command in ("/记忆模式 仅记录", "/条数线 群 8"):
                        mark = len(a.calls)
                        await a.group_message(G2, OWNER, command, nickname="主人")
                        await a.wait_call(set(SEND_ACTIONS), after=mark, timeout=20)
                    for i in range(events):
                        await d.step(i, events)
                        await d.check_store()
                        d.check_calls()
                    await d.settle()
                    await asyncio.sleep(COOLDOWN + 0.5)
                    await d.settle()
                    # Still alive: each account answers in each place it is asked in.
                    for account in (A_ID, B_ID):
                        await d.member_says(G1, [at(account), text(" 最后一个问题？")], asks=(account,))
                    await d.owner_asks_privately()
                    for s in d.said[-3:]:
                        s.owed = True
                    await d.settle()
                    await asyncio.sleep(1.0)  # a second answer would come now
                    await d.note_refused()
                    await d.check_store()
                    d.check_calls()
                    d.check_cap()
                    d.check_requests()
                    archived = await query(
                        bot.db_path,
                        "SELECT count(*) FROM messages WHERE session_id = ? AND archived = 1",
                        group_sid(G2, A_ID),
                    )
                    g2 = [s for s in d.said if s.place == ("group", G2)]
                    if len(g2) > 12:
                        assert archived[0][0] > 0, f"seed {seed}: 仅记录 G2 never compressed ({len(g2)} said)"
                    assert "Traceback" not in bot.log(all_runs=True)
                except Exception as err:
                    lines = [
                        (acc, i, place_of(c), quoted_id(c), plain_text(message_of(c))[:24])
                        for acc, sim in d.sims.items()
                        for i, c in sends(sim)
                    ]
                    trace = "\n  ".join(d.trace[-50:])
                    log = bot.log(all_runs=True)[-5000:]
                    raise AssertionError(
                        f"{err}\ntrace:\n  {trace}\nsends: {lines[-30:]}\nlog: {log}"
                    ) from err
    finally:
        llm.reset()
    return d


@pytest.mark.parametrize("seed", seeds([1, 2], [3, 4]))
async def test_seeded_two_accounts_caps_refusals_and_a_slow_model_keep_every_invariant(
    tmp_path: Path, llm: ScriptedLLM, seed: int
) -> None:
    d = await drive(tmp_path, llm, seed, 90)
    # The run did what it is for: each thing it widens happened.
    every = [c for sim in d.sims.values() for _, c in sends(sim)]
    assert d.model.answers > 0
    assert d.model.refusals > 0
    assert d.model.summaries > 0
    assert any(c.action in FORWARD_ACTIONS and answer_no(c) for c in every)
    assert [plain_text(message_of(c)) for c in every].count(CAP_NOTICE) == 1
    assert d.typed
    assert any(t == "slow" for t in d.trace)


# ---- what the seeds found, shrunk -----------------------------------------------------------
async def test_a_turn_queued_behind_the_one_that_reaches_the_daily_cap_does_not_answer(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # Seed 3: with a slow model, 乙 asked while the bot still thought about 甲's question;
    # that turn reached /限额, the next question got 「今天的额度已经用完了」, and then the queued
    # turn for 乙 called the model and answered anyway, after the notice.
    group = 93101
    llm.reset()
    used = {"prompt_tokens": 500, "completion_tokens": 10, "total_tokens": 510}
    gate = Gate(Reply("答1：收到。", usage=used), holds=is_chat)
    llm.on_request(gate)
    try:
        with gate:
            async with BotProcess(tmp_path / "bot", env=env(llm), log_level="INFO") as bot:
                sim = OneBotSim(bot.ws_url, self_id=A_ID, access_token=bot.access_token)
                async with sim:
                    await wait_log(bot, f"Bot {A_ID} connected")
                    mark = len(sim.calls)
                    await sim.group_message(group, OWNER, "/限额 300", nickname="主人")
                    await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=mark)
                    first = await sim.group_message(
                        group, 20001, [at(A_ID), text(" 第一个问题？")], nickname="甲"
                    )
                    await gate.reached()
                    second = await sim.group_message(
                        group, 20002, [at(A_ID), text(" 第二个问题？")], nickname="乙"
                    )
                    await until(lambda: _stored(bot, group, second), "the second question stored")
                    await asyncio.sleep(0.3)  # its decision made (the cap not reached yet)
                    mark = len(sim.calls)
                    gate.open()
                    await sim.wait_call(
                        set(SEND_ACTIONS), predicate=lambda c: quoted_id(c) == first, after=mark
                    )
                    notice = await sim.wait_call(
                        set(SEND_ACTIONS),
                        predicate=lambda c: plain_text(message_of(c)) == CAP_NOTICE,
                        after=mark,
                    )
                    assert quoted_id(notice) == second
                    third = await sim.group_message(
                        group, 20003, [at(A_ID), text(" 第三个问题？")], nickname="丙"
                    )
                    await until(lambda: _stored(bot, group, third), "the third question stored")
                    await asyncio.sleep(1.0)  # an answer or a second notice would come now
                    assert len([b for b in llm.requests if is_chat(b)]) == 1
                    assert [plain_text(message_of(c)) for _, c in sends(sim)][-2:] == [
                        "答1：收到。",
                        CAP_NOTICE,
                    ]
    finally:
        llm.reset()


async def _stored(bot: BotProcess, group: int, mid: int) -> bool:
    found = await query(
        bot.db_path,
        "SELECT 1 FROM messages WHERE session_id = ? AND platform_id = ?",
        group_sid(group, A_ID),
        str(mid),
    )
    return bool(found)
