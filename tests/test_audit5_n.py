"""Fifth outside audit (n): a group that has used the bot for weeks. One private runtime
on a real SQLite file and the scripted OpenAI-compatible server, driven through many
compressions in a row; every step checks the invariants (R-BUD's stated budget, keep cap
and max_tokens; R-INJ's one injected block; R-TPL's merge of sections by name; kept
originals and the divider; R-TRIG/R-BACK over long runs) rather than one point, with
fixed seeds. Issue 10's daily cap and member cooldown across midnight of MEMSUM_TIMEZONE
through the plugin's one clock (clock.py)."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum import usage as ledger
from nonebot_plugin_memsum.agent.events import UsageEvent
from nonebot_plugin_memsum.compression.service import DIVIDER, INJECTION_HEAD
from nonebot_plugin_memsum.llm.tokens import estimate_stored, estimate_text_tokens
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message
from tests.fakes.llm_server import Reply
from tests.fakes.service import (
    GROUP,
    IN_GROUP,
    NOTHING_KEPT,
    Env,
    Make,
    conversation_of,
    existing_summary_of,
    seed,
    settle,
    stated,
    summary_of,
    units_tokens,
    usage,
    user_of,
)

CHAT_TITLES = ("最近在聊什么", "谁有问题没回应", "关键原话要点")
MERGE_ASK = "请在同名小节上合并更新"
FOLD_ASK = "请把其中的内容按意思归入"
ANNOTATED = re.compile(r"^#(\d+)〔约 (\d+) token〕", re.MULTILINE)


# ---- the summariser's replies, in the shapes models write them ---------------------------------
@dataclass
class Written:
    """One scripted summary reply and what a reader of it expects."""

    reply: str
    body: str
    """The reply without its 【保留原文】 block, stripped: what must be stored."""
    chosen: list[int]
    structured: bool
    """The body has the template's three sections and no other section (R-TPL-5)."""


def write_summary(rng: random.Random, round_no: int, offered: dict[int, int]) -> Written:
    """A reply with sections in any order, sometimes an extra or a missing one, and the
    【保留原文】 block first, last or between sections, in one of the heading forms a model
    writes (R-RUN-7)."""
    titles = list(CHAT_TITLES)
    shape = rng.choice(["plain", "shuffled", "extra", "missing", "bold"])
    if shape == "shuffled":
        rng.shuffle(titles)
    if shape == "missing":
        titles.remove(rng.choice(titles))
    sections = [f"## {t}\n第{round_no}轮：{t}的要点{rng.randint(0, 999)}" for t in titles]
    if shape == "extra":
        sections.insert(rng.randrange(len(sections) + 1), f"## 其他\n第{round_no}轮的闲话")
    if shape == "bold":
        sections = [s.replace("## ", "**", 1).replace("\n", "**\n", 1) for s in sections]
    chosen = sorted(rng.sample(sorted(offered), min(len(offered), rng.randint(0, 3))))
    numbers = "、".join(map(str, chosen)) or "无"
    block = rng.choice(
        [
            f"【保留原文】{numbers}",
            f"## 【保留原文】\n{numbers}",
            f"**【保留原文】**：{numbers}",
            f"> 【保留原文】 {numbers}",
        ]
    )
    where = rng.randrange(len(sections) + 1)
    parts = [*sections[:where], block, *sections[where:]]
    body = "\n".join([*sections[:where], *sections[where:]]).strip()
    return Written("\n".join(parts), body, chosen, shape in ("plain", "shuffled", "bold"))


def annotated(body: dict[str, Any]) -> dict[int, int]:
    """number → the N of its 「#n〔约 N token〕」 in the request (R-RUN-6)."""
    return {int(m.group(1)): int(m.group(2)) for m in ANNOTATED.finditer(conversation_of(body))}


# ---- the expected budget, worked out here from the rule's words (R-BUD-1..7) ---------------------------
def expected_budget(
    *, line: Fraction | None, ratio: Fraction, content: int, units: int, max_output: int, window: int
) -> tuple[Fraction, int, int]:
    phys = min(Fraction(max_output), Fraction(window, 4))
    if line is None:
        budget = max(Fraction(content), Fraction(1000))
    else:
        budget = min(max(min(line * ratio, Fraction(content)), Fraction(1000)), line / 4)
    budget = min(budget, phys * Fraction(2, 3))
    keep_cap = min(math.floor(budget), math.floor(ratio * units))
    max_tokens = min(math.ceil(budget * Fraction(3, 2)), math.floor(phys))
    return budget, keep_cap, max_tokens


@dataclass
class Run:
    env: Env
    rng: random.Random
    usages: list[UsageEvent] = field(default_factory=list)
    said: int = 0

    async def talk(self, n: int, size: int) -> None:
        await seed(self.env.rt, n, start=self.said, size=size)
        self.said += n

    async def turn(self, prompt_tokens: int = 100) -> dict[str, Any]:
        """A turn answered 「好的」; its chat request."""
        self.env.model.chat.append(Reply(f"好的{self.said}", usage=usage(prompt_tokens)))
        await self.env.rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
        await settle(self.env.rt)
        return self.env.model.chat_requests()[-1]


def injected(request: dict[str, Any]) -> list[int]:
    """Positions of the messages of a chat request that carry the summary."""
    return [i for i, m in enumerate(request["messages"]) if INJECTION_HEAD in str(m.get("content"))]


def check_injection(request: dict[str, Any], summary_text: str | None, kept: list[Message]) -> None:
    """R-INJ-1/2: the summary in full, once, as the last system message, right before the
    history, which starts with the kept originals in their order; none without a summary."""
    messages = request["messages"]
    where = injected(request)
    if summary_text is None:
        assert where == [], messages
        return
    assert len(where) == 1, messages
    (i,) = where
    assert messages[i] == {"role": "system", "content": f"{INJECTION_HEAD}\n\n{summary_text}"}
    assert messages[i + 1]["role"] != "system"
    assert all(m["role"] == "system" for m in messages[:i])
    head = [m["content"] for m in messages[i + 1 : i + 1 + len(kept)]]
    assert head == [m.content for m in kept], (head, [m.content for m in kept])


# ---- R-BUD, R-TPL, R-INJ, R-RUN-12 over twenty-four compressions ---------------------------------
async def test_r_bud_r_tpl_r_inj_hold_at_every_one_of_many_compressions_in_a_row(make: Make) -> None:
    # Chat window 32000, trim budget 32000 − 1024; the owner moves the group's compress_at now
    # and then (R-CFG-2), so the line, and with it which clause of R-BUD binds, changes.
    # Summary model: window 32000, max output 2400 → physical cap 2400, ⅔ of it 1600.
    env = await make(
        chat={"context_window": 32000},
        summary={"context_window": 32000, "max_output_tokens": 2400},
        memsum_compress_at=0.8,
    )
    rt, model = env.rt, env.model
    run = Run(env, random.Random(20260501))
    rt.bus.subscribe(UsageEvent, lambda e: run.usages.append(e))
    stored: str | None = None
    structured = True
    kept: list[Message] = []
    bound: set[str] = set()
    for round_no in range(24):
        at = run.rng.choice([0.8, 0.4, 0.2, 0.05, 1.0])
        await rt.settings.set("compress_at", "session", GROUP.id, at)
        await run.talk(run.rng.randint(1, 14), run.rng.choice([8, 40, 160, 500]))
        chat = await run.turn()
        check_injection(chat, stored, kept)
        history = await rt.store.get_history(GROUP.id)
        assert not rt.compression.is_running(GROUP.id)
        units = units_tokens(history)
        old = estimate_text_tokens(stored) if stored else 0
        latest = run.usages[-1]
        line = min(Fraction(str(at)) * latest.window, Fraction(latest.trim_budget))
        budget, keep_cap, max_tokens = expected_budget(
            line=line, ratio=Fraction(1, 10), content=old + units, units=units, max_output=2400, window=32000
        )
        bound.add(
            "phys"
            if budget == 1600
            else "quarter"
            if budget == line / 4
            else "floor"
            if budget == 1000
            else "content"
            if budget == old + units
            else "line"
        )
        written: list[Written] = []

        def answer(body: dict[str, Any], round_no: int = round_no, written: list[Written] = written) -> Reply:
            w = write_summary(run.rng, round_no, annotated(body))
            written.append(w)
            return Reply(w.reply)

        model.summary.append(answer)
        seen = len(model.summary_requests())
        result = await rt.compression.compress(GROUP.id)
        assert result.outcome == "done"
        requests = model.summary_requests()[seen:]
        assert len(requests) == 1, f"round {round_no}: chunked"  # sizes stay under one request
        (request,) = requests
        # R-BUD-1..7: stated budget and keep cap, and max_tokens, exactly.
        assert stated(request) == (math.floor(budget), keep_cap), (round_no, at, line, old, units)
        assert request["max_tokens"] == max_tokens
        # R-TPL-5: the previous summary goes back whole, merged by name when it has the
        # template's sections (in any order), folded when it lacks one or has another.
        if stored is None:
            assert "〔已有摘要开始〕" not in user_of(request)
        else:
            assert existing_summary_of(request) == stored
            ask = MERGE_ASK if structured else FOLD_ASK
            assert ask in user_of(request), (round_no, stored)
        # R-RUN-8 / R-BACK-1: what is kept, and what the commit did.
        (w,) = written
        costs = annotated(request)
        choice = [n for n in w.chosen if n in costs]
        limit = min(Fraction(keep_cap), budget - estimate_text_tokens(w.body))
        while choice and sum(costs[n] for n in choice) > limit:
            choice.pop(0)
        record = await summary_of(rt)
        assert record is not None
        assert record["text"] == w.body
        after = await rt.store.get_history(GROUP.id)
        assert [m.content for m in after if m.event_marker] == [DIVIDER]
        assert after[-1].content == DIVIDER
        previous = {m.id for m in kept}
        kept = [m for m in after if m.is_conversation]
        if previous & {m.id for m in kept}:
            bound.add("kept twice")
        if previous - {m.id for m in kept}:
            bound.add("kept, then archived")
        by_number = {
            n: m.content for n, m in zip(sorted(costs), numbered_units(history, request), strict=True)
        }
        assert [m.content for m in kept] == [by_number[n] for n in choice], round_no
        assert {m.id for m in kept} <= {m.id for m in history}  # the very rows, untouched
        assert record["kept_messages"] == len(kept)
        assert sum(estimate_stored(m) for m in kept) <= keep_cap
        stored, structured = w.body, w.structured
    await run.talk(1, 8)
    chat = await run.turn()
    check_injection(chat, stored, kept)
    # The run crossed every clause of the budget, and kept originals were kept again and
    # archived later.
    assert bound == {"phys", "quarter", "floor", "line", "content", "kept twice", "kept, then archived"}, (
        bound
    )
    # After a summary-only clear nothing is injected; the kept originals stay history.
    await rt.compression.clear(GROUP.id, "summary")
    chat = await run.turn()
    assert injected(chat) == []
    history_sent = [m for m in chat["messages"] if m["role"] != "system"]
    assert [m["content"] for m in history_sent[: len(kept)]] == [m.content for m in kept]


def numbered_units(history: list[Message], request: dict[str, Any]) -> list[Message]:
    """The messages behind the request's numbered units, in number order (plain user and
    assistant lines here: one message a unit)."""
    texts = conversation_of(request).split("\n\n")
    numbered = [ANNOTATED.sub("", t, count=1) for t in texts if ANNOTATED.match(t)]
    conv = [m for m in history if m.is_conversation]
    out: list[Message] = []
    for text in numbered:
        match = [m for m in conv if m.content == text or f"助手: {m.content}" == text]
        assert match, text
        out.append(match[0])
    return out


# ---- R-TRIG-4, R-BACK-2/3/4 over eighty turns with the count line ---------------------------------
FAIL = Reply(status=500, error="summariser down", headers={"Retry-After": "0"})


def keep_everything(body: dict[str, Any]) -> Reply:
    """A summariser that asks to keep every original offered (R-BACK-2 then cuts)."""
    numbers = "、".join(map(str, sorted(annotated(body)))) or "无"
    return Reply(f"【保留原文】{numbers}\n## 最近在聊什么\n闲聊\n## 谁有问题没回应\n无\n## 关键原话要点\n无")


async def test_r_trig_4_r_back_2_3_4_hold_at_every_turn_of_a_long_run(make: Make) -> None:
    # A busy group with a count line of 12: between 1 and 9 lines per turn, a summariser that
    # wants to keep everything and fails about a third of the time. At every turn: a run
    # starts exactly when the count at turn end reaches the line and the back-off allows
    # (waits of 2, 4, 8, … judged turns after the k-th failure in a row, reset by success);
    # after each success the active conversation is at most ⌊12 / 2⌋ (kept originals
    # counted, the divider not), and the summary's kept count says how many stayed.
    limit = 12
    env = await make(memsum_history_limit=limit)
    rt, model = env.rt, env.model
    rng = random.Random(7)
    said = 0
    failures = waited = 0
    attempts = successes = 0
    waits: list[int] = []
    for turn in range(80):
        new = rng.randint(1, 9)
        await seed(rt, new, start=said)
        said += new
        active = sum(m.is_conversation for m in await rt.store.get_history(GROUP.id))
        due = active + 1 >= limit  # R-TRIG-4: the reply stored after the turn counts
        if failures:
            waited += 1
        may = failures == 0 or waited >= min(2**failures, 32)
        fails = rng.random() < 0.35
        model.summary_default = FAIL if fails else keep_everything
        seen = len(model.summary_requests())
        await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
        await settle(rt)
        attempted = len(model.summary_requests()) > seen
        assert attempted == (due and may), (turn, active, failures, waited)
        status = await rt.compression.status(GROUP.id)
        if attempted:
            attempts += 1
            if fails:
                if failures:
                    waits.append(waited)
                failures, waited = failures + 1, 0
                # R-FAIL-3: a failure trims nothing; the history only grew by the reply.
                assert sum(m.is_conversation for m in await rt.store.get_history(GROUP.id)) == active + 1
            else:
                if failures:
                    waits.append(waited)
                successes += 1
                failures = waited = 0
                history = await rt.store.get_history(GROUP.id)
                conversation = [m for m in history if m.is_conversation]
                assert len(conversation) <= limit // 2, (turn, len(conversation))
                record = await summary_of(rt)
                assert record is not None
                assert record["kept_messages"] == len(conversation)
                assert history[-1].content == DIVIDER
                assert sum(m.event_marker for m in history) == 1
        assert status.backoff_failures == failures
    # The run went through successes, failures in a row and their growing waits.
    assert successes >= 5
    assert attempts - successes >= 5
    assert max(waits) >= 4, waits


# ---- issue 10: the daily cap and the member cooldown over five weeks of MEMSUM_TIMEZONE days -------
NEW_YORK = ZoneInfo("America/New_York")


def local(day: date, hh: int, mm: int = 0, ss: float = 0.0) -> float:
    """The moment `day hh:mm:ss` in New York (the wall clock the owner reads)."""
    whole = datetime(day.year, day.month, day.day, hh, mm, int(ss), tzinfo=NEW_YORK)
    return whole.timestamp() + (ss - int(ss))


async def test_the_cap_and_cooldown_follow_new_york_days_for_five_weeks_across_dst(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's clock is UTC; MEMSUM_TIMEZONE is New York, whose offset changes on
    # 2026-03-08 (−5 → −4). Five weeks of a capped group with a count line: members ask at
    # random moments, many right around local midnight and UTC midnight (19:00 / 20:00 local).
    # Every decision is checked against the ledger this test keeps by hand: tokens of chat
    # and summary calls since local midnight; a cap notice once a local day; a cooldown of
    # 90 s per member, whatever the day.
    cap, cooldown = 2500, 90.0
    env = await make(
        memsum_timezone="America/New_York",
        memsum_daily_token_cap=cap,
        memsum_user_cooldown=cooldown,
        memsum_history_limit=6,
    )
    rt, model = env.rt, env.model
    now = [local(date(2026, 2, 20), 9)]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    model.chat_default = Reply("好的", usage=usage(400))  # 405 tokens a turn
    model.summary_default = Reply(NOTHING_KEPT, usage=usage(300))  # 305 a compression
    rng = random.Random(310)
    spent: list[tuple[float, int]] = []
    answered: list[float] = []
    compressed: list[float] = []
    noticed: set[date] = set()
    last: dict[str, float] = {}
    seen = {"answer": 0, "cap_notice": 0, "capped": 0, "cooling": 0}
    said = 0
    moments: list[float] = []
    for offset in range(35):
        day = date(2026, 2, 20) + timedelta(days=offset)
        moments += [local(day, 23, 59, 59.5), local(day + timedelta(days=1), 0, 0, 0.0)]
        moments += [local(day, h) for h in (19, 20)]  # UTC midnight, before and after DST
        moments += [local(day, rng.randint(8, 22), rng.randint(0, 59), rng.randint(0, 59)) for _ in range(3)]
    moments += [t + rng.uniform(1, 150) for t in moments if rng.random() < 0.5]  # asked again soon
    moments.sort()
    for t in moments:
        for user in rng.sample(["20001", "20002", "20003"], rng.randint(1, 2)):
            now[0] = t
            today = datetime.fromtimestamp(t, NEW_YORK).date()
            midnight = datetime(today.year, today.month, today.day, tzinfo=NEW_YORK).timestamp()
            used = sum(tokens for at, tokens in spent if at >= midnight)
            if used >= cap:
                expected = "capped" if today in noticed else "cap_notice"
                noticed.add(today)
            elif t - last.get(user, -math.inf) < cooldown:
                expected = "cooling"
            else:
                expected = "answer"
                last[user] = t
            await rt.agent.record(
                GROUP, Message(role="user", content=f"[成员({user})] 第{said}句", name=user, ts=t)
            )
            said += 1
            decision = await rt.controls.answer(GROUP, user, in_group=True)
            assert decision == expected, (datetime.fromtimestamp(t, NEW_YORK), user, used)
            seen[decision] += 1
            if decision == "answer":
                before = len(model.summary_requests())
                await rt.agent.run_turn(GROUP.id, entry=IN_GROUP)
                await settle(rt)
                spent.append((t, 405))
                spent += [(t, 305)] * (len(model.summary_requests()) - before)
                answered.append(t)
                compressed += [t] * (len(model.summary_requests()) - before)
            # /用量 今天 reads the same ledger: every token of the local day, compressions too.
            since = ledger.period_start("今天", t, rt.controls.zone)
            rows, activity = await ledger.load(rt.store, ledger.usage_place(GROUP), since)
            today_spent = sum(k for at, k in spent if at >= midnight)
            assert sum(r.tokens_in + r.tokens_out for r in rows) == today_spent
            # … and its answers and compressions of the day, archived dividers included.
            assert activity.answers == sum(at >= midnight for at in answered)
            assert activity.compressions == sum(at >= midnight for at in compressed)
    assert all(seen.values()), seen
    assert len(noticed) >= 20  # most days reached the cap
    assert len(compressed) >= 20
    week = ledger.period_start("7天", now[0], rt.controls.zone)
    assert week is not None
    assert week == local(datetime.fromtimestamp(now[0], NEW_YORK).date() - timedelta(days=6), 0)
    _, activity = await ledger.load(rt.store, ledger.usage_place(GROUP), week)
    assert activity.compressions == sum(at >= week for at in compressed)


# ---- R-TRIG-3 and the hard trim over a long run: the question always reaches the model ----------
async def test_r_trig_3_over_forty_turns_near_the_window_every_question_is_sent_whole(make: Make) -> None:
    # Chat window 5000: trim budget 5000 − 1024 = 3976 = E (compress_at 1). Members paste
    # anything from a word to a page; the summariser writes a summary of its own size each
    # time. At every turn the request carries the summary once and the newest question
    # verbatim; a turn is sent hard-trimmed only when what lies before its question is under
    # E / 2 (nothing worth compressing); the history never needs more than E / 2 before a run.
    env = await make(chat={"context_window": 5000}, memsum_compress_at=1.0)
    rt, model = env.rt, env.model
    rng = random.Random(4242)
    usages: list[UsageEvent] = []
    rt.bus.subscribe(UsageEvent, lambda e: usages.append(e) if e.turn_id else None)
    line = 3976
    said = 0
    compressions = trimmed_turns = 0
    for turn in range(40):
        size = rng.choice([10, 60, 200, 600, 1200])
        await seed(rt, rng.randint(1, 4), start=said, size=size)
        said += 1
        history = await rt.store.get_history(GROUP.id)
        question = [m for m in history if m.role == "user"][-1]
        before = sum(estimate_stored(m) for m in history if m.is_conversation and m.id != question.id)
        topic = "话" * rng.randint(20, 600)
        model.summary_default = Reply(
            f"【保留原文】无\n## 最近在聊什么\n{topic}\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
        )
        runs = len(model.summary_requests())
        chat = await Run(env, rng).turn()
        compressions += len(model.summary_requests()) > runs
        record = await summary_of(rt)
        assert len(injected(chat)) == (1 if record else 0)
        assert chat["messages"][-1] == {"role": "user", "content": question.content}, turn
        if usages[-1].trimmed:
            trimmed_turns += 1
            assert 2 * before < line, (turn, before)
    # Issue 9's run inside the turn made room every time: no turn of this seed was trimmed.
    assert (compressions >= 10, trimmed_turns) == (True, 0)


# ---- the owner moves the group to a smaller chat model ---------------------------------------------
async def test_r_trig_3_a_summary_over_half_the_new_line_is_rewritten_before_the_question_is_cut(
    make: Make,
) -> None:
    # Weeks of compressions under a 32k chat model left a summary of about 3,600 tokens (its
    # budget then: 2,560, max_tokens 3,840). The owner switches to a 4k model: trim budget
    # 4096 − 1024 = 3072 = E. The summary alone is over the trim budget, so the hard trim cut
    # every question down to 「…（消息过长，已截断）」 and the bot answered nothing it was
    # asked, turn after turn, as the few lines before each question were far under E / 2.
    # Now the turn compresses first (the summary is rewritten) and the question goes out whole.
    env = await make(chat={"context_window": 4096})
    rt, model = env.rt, env.model
    old = "## 最近在聊什么\n" + "旧话题的细节。" * 520 + "\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
    assert estimate_text_tokens(old) > 3072
    await rt.store.put_meta(
        SUMMARY_NAMESPACE, GROUP.id, {"text": old, "template": "chat", "time": 1.0, "kept_messages": 0}
    )
    run = Run(env, random.Random(1))
    await run.talk(3, 30)  # what the group said since the last compression under the old model
    for turn in range(6):
        await run.talk(1, 30)
        question = (await rt.store.get_history(GROUP.id))[-1]
        chat = await run.turn()
        assert chat["messages"][-1] == {"role": "user", "content": question.content}, turn
    (request,) = model.summary_requests()  # one rewrite, then the summary fits: no second run
    assert existing_summary_of(request) == old
    # The run's line is the one of the request it makes room for (R-TRIG-1's snapshot of it;
    # audit 6 s): E = 3072, so 0.1 × E → the floor 1000 → E / 4 = 768 wins. It was R-BUD-6's
    # 2730 (no usage of the new model yet), over E / 2: a summariser that used it wrote a
    # summary the next turn had to rewrite again.
    assert stated(request)[0] == 768
    record = await summary_of(rt)
    assert record is not None
    assert record["text"] != old
    check_injection(model.chat_requests()[-1], record["text"], [])
