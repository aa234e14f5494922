"""Outside audit 12 (dp): SQLite and PostgreSQL must behave the same (issue 13), seeded and
differential.

An owner who moves the memory from the SQLite file to PostgreSQL (MEMSUM_DATABASE_URL, and
the migration tool) expects the bot to go on exactly as before. A seeded driver runs one
random sequence of library calls (`nonebot_plugin_memsum.api`: messages from several
speakers with cards, turns, compressions, clears of the context and of the summary,
deletions, child sessions, withdrawals, settings of compress_at / history_limit / mode,
searches with speakers, times and neighbours, usage queries) **sequentially** on a runtime
over a real SQLite file and on one over a fresh PostgreSQL database (tests/fakes/pgserver.py),
each against its own scripted OpenAI-compatible server (tests/fakes/llm_server.py) scripted
from the same seed: small windows so compressions are frequent, some failing model calls,
some recall tool calls. The clock is the same fake one on both sides (one instant per step).

After every step it compares everything observable, normalised only for row ids (messages
are named by their place in the session's storage order): active and archived history
(content, speaker, order, token estimates, withdrawn marks), the summary record, status,
the compression line, settings, compression records, the requests each model server
received (identical), the answers and outcomes, the errors (type and Chinese text), search
hits with their order, scores and neighbours, and the usage figures the commands and the
web page read (ledger totals, per place, per day, series, overview). Halfway it migrates
the SQLite file to a fresh PostgreSQL database (store/migrate.py) and goes on there: the
migrated store must keep matching.

A second seeded driver does the same one level down, for the store calls of the OneBot layer
(appends and their dedupe by platform id, withdrawals, reply marks, answers named, archive
spans, clears, deletions, refusals): every read of the backfill and of crash recovery is
compared after each write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, clock, runtime, usage
from nonebot_plugin_memsum.compression.service import CLEARS_NAMESPACE, RUNS_NAMESPACE
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE, ReplyState, SearchQuery, Store, open_store
from nonebot_plugin_memsum.store.migrate import migrate
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.llm_server import Reply
from tests.fakes.pgdb import raw
from tests.fakes.pgserver import PgServer
from tests.fakes.seeds import seeds
from tests.fakes.service import Env, Make, settle, user_of

GROUP = SessionRecord(
    id="onebot:group:6001", platform="onebot", kind="group", place="group:6001", room_class="room"
)
FRIEND = SessionRecord(
    id="onebot:private:20003", platform="onebot", kind="private", peer="20003", room_class="direct"
)
TASK = SessionRecord(id="plugin:digest:1", platform=None, kind="internal")
CHILD = SessionRecord(id="plugin:digest:1:sub", platform=None, kind="child", parent=TASK.id)
SESSIONS = (GROUP, FRIEND, TASK, CHILD)
ENTRY = {GROUP.id: api.Entry("onebot", "group"), FRIEND.id: api.Entry("onebot", "private")}
SPEAKERS = (
    ("阿明", "20001"),
    ("小红", "20002"),
    ("Tom", "20003"),
    ("老王🍉", "20004"),
    ("红红", "20002"),  # 小红 changed her card
    ("ＴＯＭ", "20003"),
)
LINES = (
    "周末去爬山吗",
    "服务器又重启了，Redis 挂了",
    "网盘提取码是 x7k9，链接在群文件",
    "发布说明还没写完",
    "ＡＢＣ abc 的测试跑通了",
    "团建改到农家乐，周六早上八点集合",
    "Wi-Fi 密码 CAFE2024",
    "报销单要签字，找财务",
    "爬山爬山，我也去",
    "明天下雨吗",
    "  前面有空格的 ABC 和 Café",
    "ＷＩ－ＦＩ 连不上了，ｘ７ｋ９ 也不对",
)
WORDS = (
    "爬山",
    "提取码",
    "x7k",
    "abc",
    "服务器",
    "周六",
    "签字",
    "山",
    "cafe2024",
    "Redis 重启",
    "20002",
    "ＡＢＣ",
    "wi-fi",
    "Café",
    "好好",
)
CHAT_WINDOW = 3000
SUMMARY_WINDOW = 5000
T0 = 1_780_000_000.0


class Models:
    """What one model server answers: drawn from a generator of the seed, one draw per request,
    so two servers given the same requests answer the same."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.summaries = 0
        self.failed = 0

    def summary(self, body: dict[str, Any]) -> Reply:
        roll = self.rng.random()
        if roll < 0.12:
            self.failed += 1
            return Reply(status=400, error="scripted summariser failure")
        self.summaries += 1
        offered = re.findall(r"^#(\d+)〔", user_of(body), re.MULTILINE)
        keep = [n for n in offered if self.rng.random() < 0.25]
        work = "最近在聊什么" not in body["messages"][0]["content"]
        head = "## 目标\n整理周报" if work else "## 最近在聊什么\n大家在约周末的事"
        rest = (
            "## 做过的决定\n无\n## 改过的文件\n无\n## 未完成的事\n无"
            if work
            else "## 谁有问题没回应\n无\n## 关键原话要点\n无"
        )
        return Reply(f"【保留原文】{'、'.join(keep) or '无'}\n{head}（第{self.summaries}次）\n{rest}")

    def chat(self, body: dict[str, Any]) -> Reply:
        roll = self.rng.random()
        if roll < 0.15:
            self.failed += 1
            return Reply(status=400, error="scripted chat failure")
        last = body["messages"][-1]
        if roll < 0.3 and body.get("tools") and last.get("role") == "user":
            word = self.rng.choice(WORDS)
            args = json.dumps({"query": word}, ensure_ascii=False)
            call = {"id": f"call_{self.rng.randrange(10**6)}", "name": "recall", "arguments": args}
            return Reply("", tool_calls=[call], finish_reason="tool_calls")
        return Reply(f"好的，第{self.rng.randrange(1000)}号回答" + "嗯" * self.rng.randrange(40))


# ---- normalising what differs legitimately (row ids) -----------------------------------------
class Names:
    """Message ids as their place in one store's storage order (each side has its own)."""

    def __init__(self) -> None:
        self.by_id: dict[int, int] = {}

    def of(self, msg_id: int | None) -> int | None:
        if msg_id is None:
            return None
        if msg_id not in self.by_id:
            self.by_id[msg_id] = len(self.by_id)
        return self.by_id[msg_id]

    async def learn(self, store: Store) -> None:
        for (msg_id,) in await raw(store.location, "SELECT id FROM messages ORDER BY id"):
            self.of(int(msg_id))


def message(m: Message, names: Names) -> tuple[Any, ...]:
    return (
        names.of(m.id),
        m.role,
        m.content,
        m.name,
        m.tool_calls,
        m.tool_call_id,
        m.ts,
        dict(m.metadata),
        m.event_marker,
        m.tokens,
        m.platform_id,
        m.addressed,
        m.withdrawn,
    )


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@contextlib.contextmanager
def using(rt: Runtime) -> Iterator[None]:
    """`api` calls `runtime.get()`: here it answers the side's runtime."""
    original = runtime.get
    runtime.get = lambda: rt  # type: ignore[assignment]
    try:
        yield
    finally:
        runtime.get = original  # type: ignore[assignment]


async def observe(rt: Runtime, names: Names) -> dict[str, Any]:
    """Everything a user, a plugin or the owner's page can read of the store now."""
    with using(rt):
        return await _observe(rt, names)


async def _observe(rt: Runtime, names: Names) -> dict[str, Any]:
    store = rt.store
    # What waits in memory on SQLite (a shared store writes it at once): the page writes it too.
    await store.flush_ledger()
    await rt.compression.write_usage()
    await names.learn(store)
    seen: dict[str, Any] = {}
    for s in SESSIONS:
        sid = s.id
        seen[f"{sid} record"] = plain(await store.get_session(sid))
        seen[f"{sid} active"] = [message(m, names) for m in await api.history(sid)]
        seen[f"{sid} archived"] = [message(m, names) for m in await store.get_archived(sid)]
        seen[f"{sid} summary"] = plain(await store.get_meta(SUMMARY_NAMESPACE, sid))
        seen[f"{sid} status"] = plain(await api.status(sid))
        seen[f"{sid} line"] = await api.compress_at(sid)
        seen[f"{sid} compressions"] = plain(await store.compressions(sid))
        seen[f"{sid} usage"] = await store.usage_totals(sid)
        seen[f"{sid} series"] = plain(await store.usage_series(sid, "chat"))
        seen[f"{sid} count"] = await store.count_active(sid)
        seen[f"{sid} runs"] = plain(await store.get_meta(RUNS_NAMESPACE, sid))
        seen[f"{sid} todos"] = plain(await api.todos(sid))
    # Every metadata row (summaries, back-off, latest usage, run records, due marks): but the
    # clear marks, which only a shared store (PostgreSQL) keeps for the other processes.
    meta = await raw(store.location, "SELECT namespace, key, value FROM metadata")
    # A turn's id is a random uuid on each side: only whether there is one.
    seen["metadata"] = sorted(
        (
            ns,
            k,
            {**d, "turn_id": bool(d["turn_id"])}
            if isinstance(d := json.loads(v), dict) and "turn_id" in d
            else d,
        )
        for ns, k, v in meta
        if ns != CLEARS_NAMESPACE
    )
    seen["usage of the group"] = plain(await usage.load(store, "onebot:group:6001", None))
    seen["settings"] = plain(await store.all_settings())
    seen["usage rows"] = plain(await store.usage_rows(None, None))
    seen["usage rows of the group"] = plain(await store.usage_rows("onebot:group:6001", T0))
    seen["usage by day"] = plain(await store.usage_by_day(0.0, utc_offset=8 * 3600))
    # Listed in no particular order (the page sorts it by its columns).
    overview = sorted(await store.session_overview("chat"), key=lambda a: a.session_id)
    seen["overview"] = plain(overview)
    seen["last compressions"] = plain(await store.last_compressions())
    return seen


def hits(found: list[api.SearchHit], names: Names) -> list[Any]:
    return [
        (
            message(h.message, names),
            round(h.score, 9),
            [message(m, names) for m in h.before],
            [message(m, names) for m in h.after],
            sorted(n for i in h.withdrawn if (n := names.of(i)) is not None),
        )
        for h in found
    ]


# ---- one side of the comparison ---------------------------------------------------------------
@dataclasses.dataclass
class Side:
    env: Env
    models: Models
    names: Names = dataclasses.field(default_factory=Names)
    seen_requests: int = 0

    def new_requests(self) -> list[dict[str, Any]]:
        requests = list(self.env.model.llm.requests)
        fresh, self.seen_requests = requests[self.seen_requests :], len(requests)
        return fresh


Step = Callable[[Side], Any]


async def perform(side: Side, step: dict[str, Any]) -> Any:
    """One step of the sequence on one side; what it returned or raised."""
    rt = side.env.rt
    try:
        with using(rt):
            return await _perform(side, step)
    except Exception as err:  # the error is what is compared
        return ("raised", type(err).__name__, str(err))
    finally:
        await settle(rt)


async def _perform(side: Side, step: dict[str, Any]) -> Any:
    rt = side.env.rt
    # A named regression scripts the model's next answers itself (both sides alike).
    side.env.model.chat.extend(step.get("chat", ()))
    side.env.model.summary.extend(step.get("summary", ()))
    op = step["op"]
    sid = step.get("sid", "")
    session = next((s for s in SESSIONS if s.id == sid), None)
    if op == "record":
        assert session is not None
        out = []
        for role, text, name, pid in step["messages"]:
            stored = await api.record(
                session,
                Message(role=role, content=text, name=name, platform_id=pid, addressed=role == "user"),
            )
            out.append(message(stored, side.names))
        return out
    if op == "turn":
        said: list[str] = []

        async def reply(text: str) -> None:
            said.append(text)

        outcome = await api.run_turn(sid, reply, ENTRY.get(sid, api.Entry()))
        return outcome, said
    if op == "compress":
        return plain(await api.compress(sid))
    if op == "clear":
        await api.clear(sid, step["kind"])
        return None
    if op == "delete":
        await api.delete_session(sid)
        return None
    if op == "child":
        return plain(await api.child_session(TASK.id, CHILD.id))
    if op == "internal":
        return plain(await api.internal_session(TASK.id))
    if op == "withdraw":
        await rt.store.mark_withdrawn(sid, step["pid"])
        return None
    if op == "setting":
        await rt.settings.set(step["name"], "session", sid, step["value"])
        return None
    if op == "search":
        found = await api.search(
            sid,
            step["query"],
            speaker=step["speaker"],
            since=step["since"],
            until=step["until"],
            limit=step["limit"],
            context=step["context"],
            withdrawn=step["withdrawn"],
        )
        return hits(found, side.names)
    if op == "prompt":
        prompt = await api.build_prompt(sid, ENTRY.get(sid, api.Entry()))
        return [plain(prompt.messages), [message(m, side.names) for m in prompt.history], prompt.estimate]
    raise AssertionError(op)


def steps(seed: int, count: int) -> list[dict[str, Any]]:
    """The random sequence: decided up front, so both sides run the very same steps."""
    rng = random.Random(seed * 7919)
    out: list[dict[str, Any]] = []
    pid = 0
    pids: dict[str, list[str]] = {}
    for _ in range(count):
        session = rng.choices(SESSIONS, weights=[5, 2, 2, 1])[0]
        sid = session.id
        op = rng.choices(
            [
                "record",
                "turn",
                "compress",
                "clear",
                "summary",
                "delete",
                "child",
                "withdraw",
                "setting",
                "search",
                "prompt",
            ],
            weights=[30, 14, 5, 2, 2, 1, 1, 3, 4, 12, 2],
        )[0]
        if op == "record":
            messages = []
            for _ in range(rng.randint(1, 4)):
                card, qq = rng.choice(SPEAKERS)
                pid += 1
                text = rng.choice(LINES) + "，" + "好" * rng.randrange(0, 50)
                roll = rng.random()
                if roll < 0.08:  # a notice the OneBot layer records (a member joined)
                    messages.append(("notice", f"[通知] {card}({qq}) 加入了群聊", None, f"m{pid}"))
                elif roll < 0.12:  # another plugin records the bot's own words
                    messages.append(("assistant", f"（定时提醒）{text}", None, f"m{pid}"))
                else:
                    messages.append(("user", f"[{card}({qq})] {text}", qq, f"m{pid}"))
                pids.setdefault(sid, []).append(f"m{pid}")
            out.append({"op": "record", "sid": sid, "messages": messages})
        elif op in ("clear", "summary"):
            out.append({"op": "clear", "sid": sid, "kind": "context" if op == "clear" else "summary"})
        elif op == "withdraw":
            if pids.get(sid):
                out.append({"op": "withdraw", "sid": sid, "pid": rng.choice(pids[sid])})
        elif op == "child":
            out.append({"op": rng.choice(["child", "internal"]), "sid": CHILD.id})
        elif op == "setting":
            name = rng.choice(["history_limit", "compress_at", "mode"])
            value = {
                "history_limit": rng.choice([6, 10, 16, 0]),
                "compress_at": rng.choice([0.3, 0.5, 0.8, 0.0]),
                "mode": rng.choice(["on", "on", "record"]),
            }[name]
            out.append({"op": "setting", "sid": sid, "name": name, "value": value})
        elif op == "search":
            sid = GROUP.id if rng.random() < 0.6 else sid  # where most is said
            words = rng.sample(WORDS, rng.choice([1, 1, 1, 2]))
            speaker = rng.choice(
                [None, None, None, "阿明", "20002", "Tom", "老王", "小红", "tom", "助手", "通知"]
            )
            since = until = None
            if rng.random() < 0.2:
                since = T0 + rng.randrange(0, 4000)
                until = since + rng.choice([100, 1000, 100000])
            out.append(
                {
                    "op": "search",
                    "sid": sid,
                    "query": " ".join(words) if rng.random() < 0.9 else "",
                    "speaker": speaker,
                    "since": since,
                    "until": until,
                    "limit": rng.choice([3, 5, 10]),
                    "context": rng.choice([0, 0, 1, 2]),
                    "withdrawn": rng.random() < 0.3,
                }
            )
        else:
            out.append({"op": op, "sid": sid})
    return out


async def build(make: Make, seed: int, location: Path | str) -> Side:
    models = Models(seed)
    env = await make(
        chat={"context_window": CHAT_WINDOW, "max_output_tokens": 300},
        summary={"context_window": SUMMARY_WINDOW, "max_output_tokens": 1200},
        location=location,
        memsum_compress_at=0.5,
        memsum_history_limit=12,
        memsum_reply_max_tokens=300,
        memsum_persona="你是差分测试的助手。",
    )
    env.model.summary_default = models.summary
    env.model.chat_default = models.chat
    return Side(env, models)


async def restarted(make: Make, side: Side, location: Path | str) -> Side:
    """The side's bot started again on `location`: a new runtime, the model going on."""
    await settle(side.env.rt)
    again = await build(make, 0, location)
    again.models.rng.setstate(side.models.rng.getstate())
    again.models.summaries = side.models.summaries
    again.names = side.names
    return again


def differences(a: Any, b: Any) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in dict.fromkeys([*a, *b]):
            if a.get(k) != b.get(k):
                out.append(f"{k}:\n  sqlite:   {a.get(k)!r:.3000}\n  postgres: {b.get(k)!r:.3000}")
        if not out and list(a) != list(b):
            out.append(f"order of keys: {list(a)} / {list(b)}")
        return out
    return [] if a == b else [f"sqlite:   {a!r:.1500}\npostgres: {b!r:.1500}"]


async def compare_step(
    i: int, step: dict[str, Any], left: Side, right: Side, now: list[float], tally: dict[str, int]
) -> None:
    now[0] = T0 + 37.0 * i
    results = []
    for side in (left, right):
        result = await perform(side, step)
        results.append((result, side.new_requests()))
    (a, a_requests), (b, b_requests) = results
    where = f"step {i} {step}"
    assert a_requests == b_requests, (where, differences(a_requests, b_requests)[:3])
    assert a == b, (where, differences(a, b))
    kind = step["op"] + (" raised" if isinstance(a, tuple) and a[:1] == ("raised",) else "")
    kind += " found" if step["op"] == "search" and a else ""
    kind += f" {a[0]}" if step["op"] == "turn" and isinstance(a, tuple) and a[0] != "raised" else ""
    tally[kind] = tally.get(kind, 0) + 1
    seen_a, seen_b = await observe(left.env.rt, left.names), await observe(right.env.rt, right.names)
    assert seen_a == seen_b, (where, differences(seen_a, seen_b)[:4])


async def run_differential(
    make: Make,
    now: list[float],
    seed: int,
    sqlite_path: Path,
    pg_url: str,
    migrated_url: str,
    count: int = 110,
) -> dict[str, int]:
    """Runs the sequence; how many steps of each kind (and outcome) it compared."""
    tally: dict[str, int] = {}
    plan = steps(seed, count)
    left = await build(make, seed, sqlite_path)
    right = await build(make, seed, pg_url)
    for i, step in enumerate(plan[: count // 2]):
        await compare_step(i, step, left, right, now, tally)
    # The owner stops the bot, moves the SQLite file to PostgreSQL and starts it there; the
    # bot already on PostgreSQL restarts too (a restart forgets what only memory held).
    await left.env.rt.store.flush_ledger()
    await left.env.rt.compression.write_usage()
    report = await migrate(sqlite_path, migrated_url)
    assert report.verified, report.lines()
    tally["failed model calls"] = right.models.failed
    moved = await restarted(make, left, migrated_url)
    right = await restarted(make, right, pg_url)
    seen_moved, seen_right = (
        await observe(moved.env.rt, moved.names),
        await observe(right.env.rt, right.names),
    )
    assert seen_moved == seen_right, ("migrated", differences(seen_moved, seen_right)[:4])
    for i, step in enumerate(plan[count // 2 :], count // 2):
        await compare_step(i, step, moved, right, now, tally)
    archived = await raw(pg_url, "SELECT COUNT(*) FROM messages WHERE archived = 1")
    tally["archived messages"] = int(archived[0][0])
    tally["failed model calls"] += right.models.failed
    return tally


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [T0]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    return now


@pytest.fixture
def migrated_url(pg_server: PgServer) -> Iterator[str]:
    """A second fresh database, where the SQLite file is migrated to."""
    url = pg_server.database()
    yield url
    pg_server.drop(url)


@pytest.mark.parametrize("seed", seeds([3, 17], [29, 58]))
async def test_the_same_random_calls_on_sqlite_postgresql_and_a_migrated_file_look_the_same(
    pg_url: str, migrated_url: str, make: Make, tmp_path: Path, fake_clock: list[float], seed: int
) -> None:
    # The databases first: the runtimes close before they are dropped.
    tally = await run_differential(make, fake_clock, seed, tmp_path / "dp.db", pg_url, migrated_url)
    # The sequence went where it was meant to: answers, compressions, hits, failures.
    assert tally.get("turn replied", 0) >= 3, tally
    assert tally.get("search found", 0) >= 2, tally
    assert tally.get("archived messages", 0) > 0, tally
    assert tally["failed model calls"] > 0, tally


# ---- regressions the differential driver found, shrunk ----------------------------------------
async def _both(tmp_path: Path, pg_url: str, messages: list[Message], query: SearchQuery) -> list[list[Any]]:
    """The same messages stored in a SQLite file and in PostgreSQL; each one's answer to `query`
    as (content, score) in order."""
    answers = []
    for location in (tmp_path / "both.db", pg_url):
        store = await open_store(location)
        try:
            await store.save_session(GROUP)
            for m in messages:
                await store.append(GROUP.id, m)
            answers.append([(h.message.content, h.score) for h in await store.search(query)])
        finally:
            await store.close()
    return answers


async def test_recall_ranks_full_width_letters_alike_on_sqlite_and_postgresql(
    tmp_path: Path, pg_url: str
) -> None:
    # A member pastes a code in full-width letters (a Chinese input method's 全角), another
    # repeats it in plain letters. Both engines find both (the index takes NFKC), but SQLite's
    # ranking counts the words in the text as SQLite's lower() sees it (ASCII letters, no NFKC)
    # while PostgreSQL counted them after NFKC: 「ＡＢＣ」 counted there, not here, so /回忆 and
    # the recall tool put the two messages in a different order after the move.
    pad = "，" + "好" * 60
    messages = [
        Message(role="user", content=f"[阿明(20001)] ＡＢＣ abc ＡＢＣ 测试跑通了{pad}", name="20001", ts=T0),
        Message(role="user", content=f"[小红(20002)] abc 和 abc 都对{pad}", name="20002", ts=T0 + 1),
    ]
    sqlite, postgres = await _both(tmp_path, pg_url, messages, SearchQuery(GROUP.id, "abc"))
    assert [c[12:14] for c, _ in sqlite] == ["ab", "ＡＢ"]
    assert postgres == sqlite


async def test_recall_scores_a_label_and_its_spaces_alike_on_sqlite_and_postgresql(
    tmp_path: Path, pg_url: str
) -> None:
    # The ranking's length prior counts the text without its label: SQLite drops every space
    # after the label, PostgreSQL dropped one; a short message scored differently.
    messages = [Message(role="user", content="[阿明(20001)]   爬山 周六", name="20001", ts=T0)]
    sqlite, postgres = await _both(tmp_path, pg_url, messages, SearchQuery(GROUP.id, "爬山"))
    assert sqlite == [("[阿明(20001)]   爬山 周六", pytest.approx(5 / 60))]  # 「爬山 周六」
    assert postgres == sqlite


async def compared(
    make: Make, now: list[float], tmp_path: Path, pg_url: str, plan: list[dict[str, Any]]
) -> list[tuple[Side, list[api.UsageEvent]]]:
    """A fixed sequence run on SQLite and on PostgreSQL, compared after every step; each side
    with the usage events its runtime emitted."""
    sides = [await build(make, 0, tmp_path / "fixed.db"), await build(make, 0, pg_url)]
    usages: list[list[api.UsageEvent]] = [[], []]
    for side, seen in zip(sides, usages, strict=True):
        side.env.rt.bus.subscribe(api.UsageEvent, seen.append)
    tally: dict[str, int] = {}
    for i, step in enumerate(plan):
        await compare_step(i, step, sides[0], sides[1], now, tally)
    return list(zip(sides, usages, strict=True))


async def latest_usage_shown(side: Side, session_id: str) -> int | None:
    with using(side.env.rt):
        return (await api.status(session_id)).usage


def said(n: int, card: str = "阿明", qq: str = "20001") -> tuple[str, str, str, str]:
    return ("user", f"[{card}({qq})] 第{n}句：周末去爬山吗，" + "好" * 30, qq, f"f{n}")


async def test_status_after_a_failed_turn_is_the_same_on_sqlite_and_postgresql(
    pg_url: str, make: Make, tmp_path: Path, fake_clock: list[float]
) -> None:
    plan: list[dict[str, Any]] = [
        {"op": "record", "sid": GROUP.id, "messages": [said(1)]},
        {"op": "turn", "sid": GROUP.id, "chat": [Reply("好的")]},
        {"op": "record", "sid": GROUP.id, "messages": [said(2), said(3, "小红", "20002")]},
        {"op": "turn", "sid": GROUP.id, "chat": [Reply(status=500, error="upstream down")] * 4},
    ]
    for side, usages in await compared(make, fake_clock, tmp_path, pg_url, plan):
        # /摘要 and the summary's budget read the failed turn's request snapshot (R-TRIG-1,
        # R-BUD-1: every usage counts for the budget), not the turn before it.
        assert [u.turn_id is None for u in usages] == [True, False, True]
        assert await latest_usage_shown(side, GROUP.id) == usages[-1].usage > usages[1].usage


async def test_a_place_switched_to_record_only_reads_the_same_on_sqlite_and_postgresql(
    pg_url: str, make: Make, tmp_path: Path, fake_clock: list[float]
) -> None:
    plan: list[dict[str, Any]] = [
        {"op": "record", "sid": GROUP.id, "messages": [said(1)]},
        {"op": "turn", "sid": GROUP.id, "chat": [Reply("好的")]},
        {"op": "setting", "sid": GROUP.id, "name": "mode", "value": "record"},
        {"op": "record", "sid": GROUP.id, "messages": [said(2), said(3, "小红", "20002")]},
        {"op": "record", "sid": GROUP.id, "messages": [said(n) for n in range(4, 8)]},
    ]
    for side, usages in await compared(make, fake_clock, tmp_path, pg_url, plan):
        # No turn: each recorded message's judgement stands in for one (R-TRIG-3/4); /摘要
        # shows the memory as it is now, not the last answered turn's.
        with using(side.env.rt):
            status = await api.status(GROUP.id)
        assert status.active_messages == 8  # and the answer before the switch
        assert status.usage is not None
        assert status.usage > 2 * usages[1].usage


# ---- the OneBot layer's store calls (backfill, crash recovery, withdrawals), seeded ---------------
STORE_SESSIONS = (
    SessionRecord(
        id="onebot:10000:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
    ),
    SessionRecord(
        id="onebot:10000:private:5", platform="onebot", kind="private", peer="5", room_class="direct"
    ),
    SessionRecord(
        id="onebot:20000:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
    ),
)
PREFIXES = ("", "onebot:10000:", "onebot:20000:", "onebot:10000:group:")
STATES: tuple[ReplyState, ...] = ("sending", "sent")


async def store_reads(store: Store, names: Names) -> dict[str, Any]:
    await names.learn(store)
    pids = [f"p{n}" for n in range(8)]
    seen: dict[str, Any] = {}
    for s in STORE_SESSIONS:
        sid = s.id
        seen[f"{sid} active"] = [message(m, names) for m in await store.get_history(sid)]
        seen[f"{sid} archived"] = [message(m, names) for m in await store.get_archived(sid)]
        seen[f"{sid} first"] = [message(m, names) for m in await store.first_active(sid, 3)]
        seen[f"{sid} count"] = await store.count_active(sid)
        seen[f"{sid} by pid"] = [
            None if (m := await store.by_platform_id(sid, p)) is None else message(m, names) for p in pids
        ]
        seen[f"{sid} stored pids"] = sorted(
            await store.stored_platform_ids(sid, dict.fromkeys(pids, T0 + 50))
        )
        seen[f"{sid} withdrawn questions"] = await store.questions_withdrawn(sid)
        seen[f"{sid} answered"] = names.of(await store.answered_upto(sid) or None)
    for prefix in PREFIXES:
        seen[f"{prefix} sessions"] = await store.recent_sessions(prefix, T0 + 20)
        seen[f"{prefix} questions"] = [
            (sid, message(m, names)) for sid, m in await store.pending_questions(T0 + 10, prefix)
        ]
        seen[f"{prefix} of pid"] = [await store.session_of_platform_id(prefix, p) for p in pids]
    seen["sending"] = sorted((sid, names.of(upto)) for sid, upto in await store.replies_being_sent())
    seen["activity"] = plain(await store.activity("onebot:group:1", None, "divider"))
    return seen


async def store_step(store: Store, names: Names, rng: random.Random, t: float) -> str:
    """One random write of the OneBot layer; what it was (the same on both sides: `rng` is
    each side's copy of one generator)."""
    s = rng.choice(STORE_SESSIONS)
    sid = s.id
    op = rng.choices(
        ["append", "once", "withdraw", "answer", "mark", "archive", "clear", "delete", "refuse"],
        weights=[30, 20, 6, 6, 6, 4, 2, 1, 2],
    )[0]
    pid = f"p{rng.randrange(8)}" if rng.random() < 0.8 else None
    history = [m for m in await store.get_history(sid) if not m.event_marker]
    pick = rng.random()
    if op in ("append", "once"):
        msg = Message(
            role="user",
            content=f"[甲(2000{rng.randrange(3)})] 第{rng.randrange(100)}句",
            name="20001",
            ts=t + rng.choice([0.0, 0.5]),
            platform_id=pid,
            addressed=rng.random() < 0.5,
        )
        await store.save_session(s)
        stored = await (store.append(sid, msg) if op == "append" else store.append_once(sid, msg))
        return f"{op} {sid} {pid} -> {stored is not None}"
    if op == "withdraw" and pid:
        await store.mark_withdrawn(sid, pid)
    elif op == "answer":
        await store.save_session(s)
        upto = history[int(pick * len(history))].id or 0 if history else 0
        state = rng.choice(STATES)
        answer = Message(role="assistant", content=f"答{rng.randrange(100)}", ts=t)
        await store.append_marking(sid, answer, upto, state)
        if pid and rng.random() < 0.5:
            await store.name_answer(sid, answer.content, pid)
    elif op == "mark" and history:
        await store.mark_reply(
            sid, history[int(pick * len(history))].id or 0, rng.choice(["sending", "sent"])
        )
    elif op == "archive" and history:
        count = max(1, int(pick * len(history)))
        await store.archive_span(sid, count, [j for j in range(min(count, 3)) if rng.random() < 0.3])
    elif op == "clear":
        await store.clear(sid, "context")
    elif op == "delete":
        await store.delete_session(sid)
    elif op == "refuse" and history:
        await store.mark_refused(sid, [history[int(pick * len(history))].id or 0])
    return f"{op} {sid} {pid}"


@pytest.mark.parametrize("seed", [5, 41])
async def test_the_onebot_layers_store_calls_answer_alike_on_sqlite_and_postgresql(
    tmp_path: Path, pg_url: str, seed: int
) -> None:
    stores = [await open_store(tmp_path / "onebot.db"), await open_store(pg_url)]
    names = [Names(), Names()]
    rngs = [random.Random(seed), random.Random(seed)]
    try:
        for i in range(100):
            t = T0 + i
            done = [await store_step(st, n, r, t) for st, n, r in zip(stores, names, rngs, strict=True)]
            assert done[0] == done[1], (i, done)
            a, b = [await store_reads(st, n) for st, n in zip(stores, names, strict=True)]
            assert a == b, (i, done[0], differences(a, b)[:4])
    finally:
        for st in stores:
            await st.close()


async def test_a_sent_answers_id_is_in_the_history_read_next_on_both_engines(location: Path | str) -> None:
    # The bot answers (stored), reads the history (the next turn, a reconnect's backfill),
    # then notes the id QQ gave the answer (onebot/send.py). On SQLite the history cache kept
    # the answer without its id, so the backfill after a reconnect (onebot/said.py
    # `sent_here`) took it for one sent in parts and skipped any of the account's fetched
    # messages that were a piece of it; on PostgreSQL the write counter read it again.
    store = await open_store(location)
    try:
        session = STORE_SESSIONS[0]
        await store.save_session(session)
        await store.append(session.id, Message(role="user", content="[甲(20001)] 在吗", ts=T0))
        answer = await store.append(
            session.id, Message(role="assistant", content="在的，有事请说", ts=T0 + 1)
        )
        assert (await store.get_history(session.id))[-1].platform_id is None
        await store.name_answer(session.id, "在的，有事请说", "7001")
        last = (await store.get_history(session.id))[-1]
        assert (last.id, last.platform_id) == (answer.id, "7001")
    finally:
        await store.close()
