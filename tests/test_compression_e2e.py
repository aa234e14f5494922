"""Compression end to end: bot.py as a subprocess, the OneBot simulator over the real
reverse WebSocket, and a scripted OpenAI-compatible model on real HTTP.

Two bots, each shared by the tests of its line:
- bot A (the usage line): a chat model with a 10 000-token window, compress_at 0.6 and
  a budget ratio of 0.2001, so E = min(0.6 × 10 000, 10 000 − 1 024) = 6 000 and the
  budget E × ratio = 1 200.6 lies strictly between the floor (1 000) and E / 4 (1 500);
  a summary model with a 64 000-token window, so one request carries a whole group.
- bot B (the count line): history_limit 6, ratio 0.5, a chat model with a 32 000-token
  window, a summary model with an 8 000-token window (chunking), a 2 s model timeout.

A group conversation is fed as many messages not addressed to the bot (recorded, no
turn) and then one @-message (one turn). Expectations are computed here from the
stored rows with the rules of the specification, not read back from the product.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum.compression.service import INJECTION_HEAD
from nonebot_plugin_memsum.llm.tokens import estimate_msg_tokens, estimate_text_tokens
from nonebot_plugin_memsum.types import Message, ToolCall
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, private_sid, query, running_bot, until, wait_log
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, ApiCall, OneBotSim, at, plain_text, text

SUPERUSER = 10001
SUMMARISER = "你是对话摘要员"
INJECTION = INJECTION_HEAD
DIVIDER = "对话已压缩"
CHAT_TITLES = ("最近在聊什么", "谁有问题没回应", "关键原话要点")
WORK_TITLES = ("目标", "做过的决定", "改过的文件", "未完成的事")
NUMBERED = re.compile(r"^#(\d+)〔约 (\d+) token〕")
TOPICS = ("周末去哪里爬山", "要带什么装备", "几点在地铁站集合", "午饭吃什么", "要不要叫上老王", "下雨怎么办")


def chat_summary(words: str = "成员1(20001) 提议周末爬山，大家在商量装备。") -> str:
    return f"## 最近在聊什么\n{words}\n## 谁有问题没回应\n无\n## 关键原话要点\n无"


def line(i: int) -> str:
    return f"第{i}条：我觉得{TOPICS[i % len(TOPICS)]}这件事还得再商量一下，大家有什么想法都说说看"


# --- the scripted model --------------------------------------------------------------


def is_summary(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and str(messages[0].get("content") or "").startswith(SUMMARISER)


def summary_requests(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [b for b in list(llm.requests) if is_summary(b)]


def chat_requests(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [b for b in list(llm.requests) if not is_summary(b)]


def usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5}


def answer(
    llm: ScriptedLLM,
    *,
    chat: Callable[[dict[str, Any]], Reply] = lambda _: Reply("收到"),
    summary: Callable[[dict[str, Any]], Reply],
) -> None:
    """Answer chat and summary requests apart (told by the summariser's system prompt)."""
    llm.on_request(lambda body: summary(body) if is_summary(body) else chat(body))


def system_of(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


def user_of(body: dict[str, Any]) -> str:
    return str(body["messages"][1]["content"])


def conversation_parts(body: dict[str, Any]) -> list[str]:
    """The parts of a summary request's conversation, as the request writes them."""
    user = user_of(body)
    start = user.index("〔对话记录开始〕\n") + len("〔对话记录开始〕\n")
    return user[start : user.index("\n〔对话记录结束〕")].split("\n\n")


def offered(body: dict[str, Any]) -> dict[int, int]:
    """Number → N of every numbered part of a summary request."""
    found = (NUMBERED.match(p) for p in conversation_parts(body))
    return {int(m.group(1)): int(m.group(2)) for m in found if m}


def stated_keep_cap(body: dict[str, Any]) -> int:
    m = re.search(r"其中保留的原文合计不超过 (\d+) tokens", system_of(body))
    assert m is not None, system_of(body)
    return int(m.group(1))


def history_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat request's messages after its leading system parts."""
    messages = body["messages"]
    first = next(i for i, m in enumerate(messages) if m["role"] != "system")
    return messages[first:]


# --- the stored history --------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: int
    role: str
    content: str
    name: str | None
    tool_calls: tuple[ToolCall, ...]
    tool_call_id: str | None
    event_marker: bool
    archived: bool

    @property
    def message(self) -> Message:
        return Message(
            role=self.role,  # type: ignore[arg-type]
            content=self.content,
            name=self.name,
            tool_calls=self.tool_calls,
            tool_call_id=self.tool_call_id,
        )

    @property
    def cost(self) -> int:
        """N: what the stored message takes kept verbatim (R-RUN-6)."""
        return estimate_msg_tokens(self.message)

    @property
    def rendered(self) -> str:
        """R-RUN-3 for messages without tools: a user's text as stored, an assistant's after 「助手: 」."""
        assert not self.tool_calls, self
        assert self.role in ("user", "assistant"), self
        return f"助手: {self.content}" if self.role == "assistant" else self.content


async def rows(bot: BotProcess, sid: str) -> list[Row]:
    """Every stored message of the session (archive included), in storage order."""
    if not bot.db_path.exists():
        return []
    raw = await query(
        bot.db_path,
        "SELECT id, role, content, name, tool_calls, tool_call_id, event_marker, archived"
        " FROM messages WHERE session_id = ? ORDER BY id",
        sid,
    )
    return [
        Row(
            r[0],
            r[1],
            r[2],
            r[3],
            tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in json.loads(r[4] or "[]")),
            r[5],
            bool(r[6]),
            bool(r[7]),
        )
        for r in raw
    ]


async def stored_summary(bot: BotProcess, sid: str) -> dict[str, Any] | None:
    sql = "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?"
    found = await query(bot.db_path, sql, sid)
    return json.loads(found[0][0]) if found else None


# --- talking to the bot ---------------------------------------------------------------


def sent_text(call: ApiCall) -> str:
    if call.action in FORWARD_ACTIONS:
        return plain_text(call.params.get("messages") or [])
    return plain_text(call.params.get("message", ""))


async def next_text(sim: OneBotSim, after: int, match: Callable[[str], bool]) -> str:
    """The first text the bot sends (from call index `after`) that `match`es."""
    call = await sim.wait_call(
        set(SEND_ACTIONS | FORWARD_ACTIONS), after=after, predicate=lambda c: match(sent_text(c)), timeout=20
    )
    return sent_text(call)


async def feed(bot: BotProcess, sim: OneBotSim, group: int, lines: list[str]) -> None:
    """Members' lines not addressed to the bot, waited for until stored."""
    sid = group_sid(group)
    before = len(await rows(bot, sid))
    for i, words in enumerate(lines):
        uid = 20001 + i % 7
        await sim.group_message(group, uid, words, nickname=f"成员{uid - 20000}")

    async def count() -> int:
        return len(await rows(bot, sid))

    async def stored() -> bool:
        return await count() >= before + len(lines)

    await until(stored, f"{len(lines)} lines stored in {sid}", progress=count)


async def ask(sim: OneBotSim, group: int, words: str, *, uid: int = 20002, reply: str = "收到") -> None:
    """One @-message (one turn), waited for until the bot's answer `reply` is sent."""
    mark = len(sim.calls)
    await sim.group_message(group, uid, [at(SELF_ID), text(f" {words}")], nickname=f"成员{uid - 20000}")
    await next_text(sim, mark, lambda t: t == reply)


async def command(sim: OneBotSim, group: int, words: str, expect: Callable[[str], bool]) -> str:
    """A superuser's command in the group; its answer."""
    mark = len(sim.calls)
    await sim.group_message(group, SUPERUSER, words, nickname="主人")
    return await next_text(sim, mark, expect)


async def settled(sim: OneBotSim, group: int) -> str:
    """/摘要 once it no longer shows a compression running (R-PROG-3 state)."""
    answers: list[str] = []

    async def idle() -> bool:
        answers.append(await command(sim, group, "/摘要", lambda t: "条数线" in t))
        return "正在压缩中" not in answers[-1]

    await until(idle, "the compression to end")
    return answers[-1]


async def summarised(bot: BotProcess, sid: str, llm: ScriptedLLM | None = None) -> dict[str, Any]:
    """The summary once stored; with `llm`, waited for as long as summary requests keep coming."""

    async def present() -> bool:
        return await stored_summary(bot, sid) is not None

    async def requests() -> int:
        return len(summary_requests(llm)) if llm is not None else 0

    await until(present, f"a summary of {sid}", progress=requests if llm is not None else None)
    found = await stored_summary(bot, sid)
    assert found is not None
    return found


def active(all_rows: list[Row]) -> list[Row]:
    return [r for r in all_rows if not r.archived]


def span_of(all_rows: list[Row]) -> list[Row]:
    """The conversation before the (only) divider: what the compression read."""
    end = next(i for i, r in enumerate(all_rows) if r.event_marker and r.content == DIVIDER)
    return [r for r in all_rows[:end] if not r.event_marker]


def annotated(number: int, row: Row) -> str:
    return f"#{number}〔约 {row.cost} token〕{row.rendered}"


# --- the bots ------------------------------------------------------------------------


@dataclass
class Env:
    bot: BotProcess
    sim: OneBotSim
    llm: ScriptedLLM


@asynccontextmanager
async def _launch(
    workdir: Path, chat_window: int, summary: tuple[str, int], **settings: str
) -> AsyncIterator[Env]:
    """A bot on a model server of its own: "test/chat" with `chat_window` and the summary model
    `summary` (id, window); `settings` are more of its `.env`."""
    summary_id, summary_window = summary
    with ScriptedLLM() as llm:
        models = [
            llm.model_config("test/chat", context_window=chat_window),
            llm.model_config(summary_id, context_window=summary_window),
        ]
        env = {
            "MEMSUM_MODELS": json.dumps(models),
            "MEMSUM_CHAT_MODEL": "test/chat",
            "MEMSUM_SUMMARY_MODEL": summary_id,
            **settings,
        }
        async with running_bot(workdir, env) as (bot, sim):
            yield Env(bot, sim, llm)


@pytest.fixture(scope="module")
async def bot_a(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    workdir = tmp_path_factory.mktemp("bot-a")
    settings = {"MEMSUM_COMPRESS_AT": "0.6", "MEMSUM_SUMMARY_BUDGET_RATIO": "0.2001"}
    async with _launch(workdir, 10000, ("test/summary", 64000), **settings) as started:
        yield started


@pytest.fixture(scope="module")
async def bot_b(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    workdir = tmp_path_factory.mktemp("bot-b")
    # MEMSUM_CAPACITY=spec: this bot's small summary window checks R-RUN-9's literal rule.
    settings = {
        "MEMSUM_HISTORY_LIMIT": "6",
        "MEMSUM_SUMMARY_BUDGET_RATIO": "0.5",
        "MEMSUM_LLM_TIMEOUT": "2",
        "MEMSUM_CAPACITY": "spec",
    }
    async with _launch(workdir, 32000, ("test/tiny", 8000), **settings) as started:
        yield started


@pytest.fixture
def a(bot_a: Env) -> Iterator[Env]:
    yield bot_a
    bot_a.llm.reset()


@pytest.fixture
def b(bot_b: Env) -> Iterator[Env]:
    yield bot_b
    bot_b.llm.reset()


def short(i: int) -> str:
    return f"第{i}句：{TOPICS[i % len(TOPICS)]}？"


# --- the usage line (bot A) ------------------------------------------------------------


async def test_r_trig_3_group_crosses_the_usage_line_then_the_summary_is_injected(a: Env) -> None:
    group = 31001
    sid = group_sid(group)
    first_turn = iter([Reply("收到", usage=usage(6000))])  # usage = E: the line is reached
    reply = f"【保留原文】3、5\n{chat_summary()}"
    answer(a.llm, chat=lambda _: next(first_turn, Reply("收到")), summary=lambda _: Reply(reply))
    await feed(a.bot, a.sim, group, [line(i) for i in range(100)])
    # R-TRIG-3: the compressible part must reach E / 2 = 3000 too.
    assert sum(r.cost for r in await rows(a.bot, sid)) >= 3000

    await ask(a.sim, group, "你们觉得呢")
    stored = await summarised(a.bot, sid)

    [body] = summary_requests(a.llm)
    all_rows = await rows(a.bot, sid)
    span = span_of(all_rows)
    assert [r.role for r in span] == ["user"] * 101 + ["assistant"]
    units_tokens = sum(estimate_text_tokens(r.rendered) for r in span)
    # R-BUD: E = min(0.6 × 10000, 10000 − 1024) = 6000; budget = min(E × 0.2001, content) = 1200.6,
    # above the floor 1000, under E / 4 = 1500 and ⅔ × min(4096, 64000 / 4) ≈ 2730.7.
    assert units_tokens > 1201
    keep_cap = min(1200, units_tokens * 2001 // 10000)  # R-BUD-4: ⌊ratio × new conversation⌋
    assert body["max_tokens"] == 1801  # R-BUD-7: ⌈1.5 × 1200.6⌉
    system = system_of(body)
    assert "摘要连同保留的原文合计约 1200 tokens（约 4800 个英文字符）" in system
    assert f"其中保留的原文合计不超过 {keep_cap} tokens" in system
    positions = [system.index(f"「## {title}」") for title in CHAT_TITLES]  # R-TPL-1, in order
    assert positions == sorted(positions)
    assert not [t for t in WORK_TITLES if f"「## {t}」" in system]
    assert "「昵称(ID)」" in system  # R-TPL-4
    # R-RUN-6: every unit here may be kept, numbered in time order with its verbatim cost.
    assert conversation_parts(body) == [annotated(n, r) for n, r in enumerate(span, 1)]

    kept = [span[2], span[4]]
    assert stored["text"] == chat_summary()
    assert (stored["template"], stored["kept_messages"]) == ("chat", 2)
    after = active(all_rows)
    assert [r.id for r in after[:2]] == [r.id for r in kept]
    assert [(r.content, r.event_marker) for r in after[2:]] == [(DIVIDER, True)]
    assert sum(r.archived for r in all_rows) == len(span) - 2

    await ask(a.sim, group, "那就这么定了", uid=20003)
    requests = chat_requests(a.llm)
    assert len(requests) == 2
    messages = requests[1]["messages"]
    injected = [i for i, m in enumerate(messages) if str(m["content"]).startswith(INJECTION)]
    assert len(injected) == 1  # R-INJ-1: one system message, the last before the history
    s = injected[0]
    assert [m["role"] for m in messages[: s + 1]] == ["system"] * (s + 1)
    assert messages[s]["content"].endswith(chat_summary())
    newest = next(r for r in reversed(await rows(a.bot, sid)) if r.role == "user")
    assert messages[s + 1 :] == [{"role": "user", "content": r.content} for r in (*kept, newest)]
    sent = json.dumps(messages, ensure_ascii=False)
    assert not [r.id for r in span if r not in kept and r.content in sent]


async def test_r_tpl_2_superusers_private_chat_gets_the_work_template_with_the_todo_list(a: Env) -> None:
    sid = private_sid(SUPERUSER)
    items = [("in_progress", "写周报"), ("pending", "订会议室"), ("done", "回邮件")]
    arguments = json.dumps({"items": [{"title": t, "status": s} for s, t in items]}, ensure_ascii=False)
    call = {"id": "call_todo_1", "name": "todo_write", "arguments": arguments}

    def chat(body: dict[str, Any]) -> Reply:
        if any(m.get("role") == "tool" for m in body["messages"]):
            return Reply("都记下了。", usage=usage(6000))
        return Reply("", tool_calls=[call], finish_reason="tool_calls")

    work = "## 目标\n写完周报\n## 做过的决定\n无\n## 改过的文件\n无\n## 未完成的事\n订会议室"
    answer(a.llm, chat=chat, summary=lambda _: Reply(f"【保留原文】无\n{work}"))
    long = "。".join(f"第{i}件事：{TOPICS[i % len(TOPICS)]}，还有周报里要写的第{i}项进展" for i in range(160))
    assert estimate_text_tokens(long) >= 3000  # R-TRIG-3: the compressible part reaches E / 2
    mark = len(a.sim.calls)
    await a.sim.private_message(SUPERUSER, long, nickname="主人")
    await next_text(a.sim, mark, lambda t: t == "都记下了。")
    stored = await summarised(a.bot, sid)

    [body] = summary_requests(a.llm)
    system, user = system_of(body), user_of(body)
    positions = [system.index(f"「## {title}」") for title in WORK_TITLES]  # R-TPL-2, in order
    assert positions == sorted(positions)
    assert not [t for t in CHAT_TITLES if f"「## {t}」" in system]
    assert "「昵称(ID)」" not in system
    # R-RUN-4: the todo items of this moment, last.
    assert user.endswith("\n\n当前任务列表状态\n" + "\n".join(f"- [{s}] {t}" for s, t in items))

    [said, calling, result, replied, divider] = await rows(a.bot, sid)
    assert (said.role, calling.tool_calls[0].id, result.tool_call_id, divider.content) == (
        "user",
        "call_todo_1",
        "call_todo_1",
        DIVIDER,
    )
    result_text = "\n  ".join(result.content[:200].splitlines())  # R-RUN-3: continuation lines indented
    group_text = f"调用 todo_write({arguments[:200]})\n工具结果(todo_write): {result_text}"
    units_tokens = sum(map(estimate_text_tokens, (said.content, group_text, replied.rendered)))
    keep_cap = min(1200, units_tokens * 2001 // 10000)
    assert f"其中保留的原文合计不超过 {keep_cap} tokens" in system
    assert body["max_tokens"] == 1801
    # R-RUN-6: the long message costs more than the keep cap, so it has no number; the tool
    # group is one unit under its head's number, N over both its messages.
    assert said.cost > keep_cap
    assert conversation_parts(body) == [
        said.content,
        f"#1〔约 {calling.cost + result.cost} token〕{group_text}",
        annotated(2, replied),
    ]
    assert (stored["text"], stored["template"], stored["kept_messages"]) == (work, "work", 0)


async def test_r_run_8_reply_without_the_heading_is_all_summary_and_keeps_nothing(a: Env) -> None:
    group = 31002
    sid = group_sid(group)
    words = chat_summary("大家在聊周末安排。")
    answer(a.llm, summary=lambda _: Reply(words))
    await feed(a.bot, a.sim, group, ["。".join(line(i) for i in range(20)), *map(short, range(5))])

    receipt = await command(a.sim, group, "/压缩", lambda t: t.startswith("压缩"))
    assert receipt.startswith("压缩完成："), receipt
    assert receipt.endswith("保留原文 0 条，归档 6 条。")
    [body] = summary_requests(a.llm)
    numbers = offered(body)
    assert numbers  # numbers were offered, and the reply named none
    stored = await stored_summary(a.bot, sid)
    assert stored is not None
    assert (stored["text"], stored["kept_messages"]) == (words, 0)
    assert [r.content for r in active(await rows(a.bot, sid))] == [DIVIDER]
    await wait_log(
        a.bot, f"{sid}: summary reply has no 【保留原文】 heading though {len(numbers)} were offered"
    )


async def test_r_run_8_numbers_not_offered_are_dropped(a: Env) -> None:
    group = 31003
    sid = group_sid(group)
    answer(a.llm, summary=lambda _: Reply(f"【保留原文】2、40\n{chat_summary()}"))
    await feed(a.bot, a.sim, group, ["。".join(line(i) for i in range(20)), *map(short, range(5))])

    receipt = await command(a.sim, group, "/压缩", lambda t: t.startswith("压缩"))
    assert receipt.endswith("保留原文 1 条，归档 5 条。"), receipt
    [body] = summary_requests(a.llm)
    assert 40 not in offered(body)
    second = next(p for p in conversation_parts(body) if p.startswith("#2〔"))
    after = active(await rows(a.bot, sid))
    assert [r.rendered for r in after[:-1]] == [NUMBERED.sub("", second)]
    assert after[-1].content == DIVIDER
    stored = await stored_summary(a.bot, sid)
    assert stored is not None
    assert (stored["text"], stored["kept_messages"]) == (chat_summary(), 1)


# --- the count line (bot B) ------------------------------------------------------------


async def test_r_trig_4_group_reaches_the_count_line_and_r_back_2_halves_the_kept(b: Env) -> None:
    group = 32001
    sid = group_sid(group)
    picks: list[int] = []

    def summary(body: dict[str, Any]) -> Reply:
        # The latest units that fit the stated keep cap, at most five: more than ⌊6 / 2⌋.
        numbers, cap, total = offered(body), stated_keep_cap(body), 0
        for n in sorted(numbers, reverse=True)[:5]:
            if total + numbers[n] > cap:
                break
            picks.insert(0, n)
            total += numbers[n]
        return Reply(f"【保留原文】{'、'.join(map(str, picks))}\n{chat_summary()}")

    answer(b.llm, summary=summary)
    await feed(b.bot, b.sim, group, [short(i) for i in range(15)])
    await ask(b.sim, group, "大家怎么看")  # 16 messages + the reply ≥ 6: due (R-TRIG-4)
    stored = await summarised(b.bot, sid)

    [body] = summary_requests(b.llm)
    all_rows = await rows(b.bot, sid)
    span = span_of(all_rows)
    assert len(span) == 17
    units_tokens = sum(estimate_text_tokens(r.rendered) for r in span)
    # R-BUD: E = min(0.8 × 32000, 32000 − 1024) = 25600; budget = min(E × 0.5, content) = content,
    # lifted to the floor 1000 (under E / 4 and ⅔ × min(4096, 8000 / 4)); max_tokens ⌈1.5 × 1000⌉.
    assert units_tokens < 1000
    assert body["max_tokens"] == 1500
    system = system_of(body)
    assert "摘要连同保留的原文合计约 1000 tokens（约 4000 个英文字符）" in system
    assert f"其中保留的原文合计不超过 {min(1000, units_tokens // 2)} tokens" in system
    positions = [system.index(f"「## {title}」") for title in CHAT_TITLES]
    assert positions == sorted(positions)
    assert conversation_parts(body) == [annotated(n, r) for n, r in enumerate(span, 1)]

    # R-BACK-2: nothing after the cut, so at most ⌊6 / 2⌋ = 3 stay: the earliest picks go.
    assert len(picks) > 3
    kept = [span[n - 1] for n in picks[-3:]]
    assert stored["kept_messages"] == 3
    after = active(all_rows)
    assert [r.id for r in after] == [*(r.id for r in kept), after[-1].id]
    assert after[-1].content == DIVIDER

    await ask(b.sim, group, "好的", uid=20003)
    messages = chat_requests(b.llm)[-1]["messages"]
    s = next(i for i, m in enumerate(messages) if str(m["content"]).startswith(INJECTION))
    newest = next(r for r in reversed(await rows(b.bot, sid)) if r.role == "user")
    assert messages[s + 1 :] == [{"role": r.role, "content": r.content} for r in (*kept, newest)]


async def test_r_run_10_chunks_fit_a_small_summary_window_and_end_in_one_summary(b: Env) -> None:
    group = 32002
    sid = group_sid(group)
    results: list[tuple[str, str]] = []  # per request: its summary, the part it chose to keep

    def summary(body: dict[str, Any]) -> Reply:
        choice = [p for p in conversation_parts(body) if NUMBERED.match(p)][-1]
        match = NUMBERED.match(choice)
        assert match is not None
        words = chat_summary(f"第{len(results) + 1}段：大家在商量话题{len(results) + 1}。")
        results.append((words, choice))
        return Reply(f"【保留原文】{match.group(1)}\n{words}")

    answer(b.llm, summary=summary)
    lines = [
        f"{line(i)}；第{i}位补充：{TOPICS[(i + 3) % len(TOPICS)]}也要提前安排好，别到时候手忙脚乱"
        for i in range(260)
    ]
    await feed(b.bot, b.sim, group, lines)
    await ask(b.sim, group, "总结一下")
    stored = await summarised(b.bot, sid, b.llm)

    requests = summary_requests(b.llm)
    all_rows = await rows(b.bot, sid)
    span = span_of(all_rows)
    # R-RUN-9: physical cap = min(4096, 8000 / 4) = 2000 and max_tokens = min(⌈1.5 × ⅔ × 2000⌉, 2000),
    # so a request holds at most (8000 − 2000 − 2000) / 2 = 2000 characters; the history is ten times that.
    assert sum(len(r.rendered) for r in span) >= 10 * 2000
    assert len(requests) == len(results) >= 10
    fresh: list[str] = []
    for k, body in enumerate(requests):
        previous = results[k - 1][0] if k else ""
        user = user_of(body)
        chars = len(system_of(body)) + len(user) - len(previous)
        assert body["max_tokens"] == 2000
        assert 2 * chars + 2000 + body["max_tokens"] <= 8000, k  # the existing summary counts as the cap
        assert "摘要连同保留的原文合计约 1333 tokens" in system_of(body)
        parts = conversation_parts(body)
        if k:
            # R-RUN-10: the previous result is the existing summary; its choice comes again, verbatim.
            assert f"〔已有摘要开始〕\n{previous}\n〔已有摘要结束〕" in user
            assert parts[0] == results[k - 1][1]
            parts = parts[1:]
        fresh += parts
    assert fresh == [annotated(n, r) for n, r in enumerate(span, 1)]  # each unit once, in order

    assert stored["text"] == results[-1][0]
    dividers = [r for r in all_rows if r.event_marker and r.content == DIVIDER]
    assert len(dividers) == 1
    last = next(r for n, r in enumerate(span, 1) if annotated(n, r) == results[-1][1])
    assert [r.id for r in active(all_rows)] == [last.id, dividers[0].id]  # what the last request chose


FAILURES = [
    pytest.param(
        32101,
        Reply(status=500, error="upstream exploded", headers={"Retry-After": "0"}),
        "摘要模型出错",
        id="http_500",
    ),
    pytest.param(32102, Reply(chat_summary(), delay=3), "摘要模型出错", id="timeout"),
    pytest.param(
        32103, Reply(f"【保留原文】无\n{chat_summary()}", cut_after=3), "摘要模型出错", id="cut_stream"
    ),
    pytest.param(
        32104,
        Reply(f"【保留原文】无\n{chat_summary()}", finish_reason="length"),
        "摘要在输出上限处被截断",
        id="length",
    ),
    pytest.param(32105, Reply("【保留原文】1、2\n"), "摘要为空", id="empty_summary"),
]


@pytest.mark.parametrize(("group", "failure", "reason"), FAILURES)
async def test_r_fail_1_a_failed_summary_archives_nothing_and_the_chat_goes_on(
    b: Env, group: int, failure: Reply, reason: str
) -> None:
    sid = group_sid(group)
    answer(b.llm, summary=lambda _: failure)
    await feed(b.bot, b.sim, group, [short(i) for i in range(6)])
    await ask(b.sim, group, "大家怎么看")

    log = await wait_log(b.bot, f"compression of {sid} failed: {reason}")
    assert summary_requests(b.llm)
    assert log.count(f"compression of {sid} failed") == 1  # one warning
    # (NoneBot itself prints its whole config at DEBUG, start-up only: our lines are checked.)
    assert not [entry for entry in log.splitlines() if "memsum:" in entry and API_KEY in entry]
    before = await rows(b.bot, sid)
    assert len(before) == 8
    assert not [r for r in before if r.archived or r.event_marker]  # R-FAIL-3: nothing trimmed
    assert await stored_summary(b.bot, sid) is None

    await ask(b.sim, group, "还在吗")
    body = chat_requests(b.llm)[-1]
    assert not [m for m in body["messages"] if str(m["content"]).startswith(INJECTION)]
    now = await rows(b.bot, sid)
    assert now[:8] == before
    assert [r.role for r in now[8:]] == ["user", "assistant"]
    assert history_of(body)[-1] == {"role": "user", "content": now[8].content}


async def test_r_back_3_retries_after_2_4_8_16_32_then_every_32_judged_turns(b: Env) -> None:
    group = 32200
    turns = 96
    gate = threading.Semaphore(0)

    def chat(body: dict[str, Any]) -> Reply:
        # Held until the test has seen the previous turn's compression, if any, end: a turn
        # that ends while its session compresses is not judged (R-TRIG-5).
        gate.acquire(timeout=30)
        return Reply("收到")

    answer(b.llm, chat=chat, summary=lambda _: Reply("【保留原文】无"))  # fails at once: empty
    await feed(b.bot, b.sim, group, [short(i) for i in range(6)])  # every turn reaches the count line
    attempts: list[int] = []
    status: dict[int, str] = {}
    try:
        for turn in range(1, turns + 2):
            mark = len(b.sim.calls)
            await b.sim.group_message(group, 20002, [at(SELF_ID), text(f" 第{turn}轮")], nickname="成员2")

            async def asked(turn: int = turn) -> bool:
                return len(chat_requests(b.llm)) >= turn

            await until(asked, f"the chat request of turn {turn}")
            # Turn `turn − 1` was judged before this one began, and a run it started is
            # registered before this request was sent: wait until /摘要 no longer shows it.
            status[turn - 1] = await settled(b.sim, group)
            if len(summary_requests(b.llm)) > len(attempts):
                attempts.append(turn - 1)
            assert len(summary_requests(b.llm)) == len(attempts)
            gate.release()
            await next_text(b.sim, mark, lambda t: t == "收到")
    finally:
        for _ in range(3):
            gate.release()

    assert attempts == [1, 3, 7, 15, 31, 63, 95]
    for turn in range(1, turns + 1):
        done = [t for t in attempts if t <= turn]
        wait = min(2 ** len(done), 32)
        left = wait - (turn - done[-1])
        assert f"已连续失败 {len(done)} 次，再过 {left} 轮对话才会重试" in status[turn], (turn, status[turn])
    assert await stored_summary(b.bot, group_sid(group)) is None
