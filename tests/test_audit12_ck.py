"""Audit 12, angle "a kill at every write": issue 15 (nothing lost across crashes and restarts,
answers resumed, never twice), R-RUN-11 and R-MEM-1 (the compression's commit is all or
nothing), R-PROG (a compression cut short is re-run, never stuck), checked systematically
rather than at chosen moments.

A child process (tests/fakes/killpoint_worker.py) drives a runtime of its own through
`nonebot_plugin_memsum.api` on a real SQLite file against the scripted OpenAI-compatible
server: messages recorded, a session setting changed, a turn with a tool round (todo_write)
and its answer, the usage ledger written, a compression with its commit, more messages, a
second session compressed and then cleared, a clean stop. A clean run lists its database
writes; then for every N the child is killed (`os._exit(137)`, from the connection's trace
callback) right before its Nth write statement runs (before each INSERT / UPDATE / DELETE /
COMMIT: so also right after the one before), and a fresh runtime starts on the same file as
the bot's start-up does, answers the questions left unanswered as the OneBot layer does on
reconnect, and is checked:
- `PRAGMA integrity_check` is ok; the per-session counts agree with the rows;
- every message `api.record` had returned before the kill is stored exactly once;
- summary, divider and archive are all old or all new; a compression that had begun
  (marked due) is re-run at start-up and none is left marked;
- the question is answered exactly once (before the kill or after the restart), its answer
  stored once, its usage rows never counted twice;
- the session setting is the old or the new value;
- a clear is all or nothing;
- the restarted runtime works: a new turn answers and a new compression commits.

The OneBot half: bot.py as a real process (tests/fakes/killshim.py counts its writes the same
way) with the OneBot simulator over the real WebSocket, killed before each write of a
question's path (its record, the answer's commit with its `sending` mark, the answer's message
id, the batched `sent` mark), then restarted: every member message stored once (the backfill
brings back what the kill lost), the question answered exactly once, the bot's answer stored
once (the backfill sees it in the group's history).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.compression.service import DIVIDER, DUE_NAMESPACE
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.types import Message
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, query, until, wait_log
from tests.fakes.killpoint_worker import PERSONA, SUMMARY, A, B, C, D, config
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.onebot import OneBotSim, at, text

WORKER = Path(__file__).parent / "fakes" / "killpoint_worker.py"
REPO = Path(__file__).resolve().parents[1]
ANSWER = "这是答案"
LATER = "重启后的新回答"
TODO = json.dumps({"items": [{"title": "回答问题", "status": "in_progress"}]})


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def respond(body: dict[str, Any]) -> Reply:
    """The model of every point: a summary for the summariser; for a chat, a todo_write call
    first, then the answer (the newest user message after the restart gets its own)."""
    msgs = body["messages"]
    if not is_chat(body):
        return Reply(SUMMARY)
    if msgs[-1]["role"] == "tool":
        asked = [m for m in msgs if m["role"] == "user"]
        return Reply(LATER if asked and "重启后" in asked[-1]["content"] else ANSWER)
    return Reply("", tool_calls=[{"id": "call_1", "name": "todo_write", "arguments": TODO}])


@dataclass
class Zygote:
    proc: subprocess.Popen[str]

    def run(self, n: int, db: Path, out: Path) -> tuple[int, list[str]]:
        """The workload killed before write `n` (0: not killed): its exit status and lines."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{n} {db} {out}\n")
        self.proc.stdin.flush()
        done = self.proc.stdout.readline().split()
        assert done[:2] == ["done", str(n)], done
        return int(done[2]), out.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        llm.on_request(respond)
        yield llm


@pytest.fixture(scope="module")
def zygote(model: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    env = {**os.environ, "KILLPOINT_DIR": str(tmp_path_factory.mktemp("killpoint-store"))}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(model.model_config(context_window=16000))],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    try:
        yield Zygote(proc)
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Seen:
    """What one point's child reported (committed before the kill)."""

    recorded: dict[str, list[str]] = field(default_factory=dict)
    sent: int = 0
    flushed: bool = False
    setting: bool = False
    compressed: set[str] = field(default_factory=lambda: set())
    cleared: bool = False
    quiet: bool = False
    deleted: bool = False

    @classmethod
    def of(cls, lines: list[str]) -> Seen:
        seen = cls()
        for line in lines:
            kind, _, rest = line.partition(" ")
            if kind == "recorded":
                sid, _, content = rest.partition(" ")
                seen.recorded.setdefault(sid, []).append(content)
            elif kind == "sent":
                seen.sent += 1
            elif kind == "flushed":
                seen.flushed = True
            elif kind == "set":
                seen.setting = True
            elif kind == "compressed":
                seen.compressed.add(rest.split()[0])
            elif kind == "cleared":
                seen.cleared = True
            elif kind == "quiet":
                seen.quiet = True
            elif kind == "deleted":
                seen.deleted = True
        return seen


def rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as con:
        return con.execute(sql, params).fetchall()


def meta(db: Path, namespace: str, key: str) -> Any | None:
    found = rows(db, "SELECT value FROM metadata WHERE namespace = ? AND key = ?", (namespace, key))
    return json.loads(found[0][0]) if found else None


def check_file(db: Path, where: str) -> None:
    """SQLite's own check, and the per-session counts (kept by triggers) against the rows."""
    assert rows(db, "PRAGMA integrity_check") == [("ok",)], where
    counted = {
        r[0]: (r[1], r[2]) for r in rows(db, "SELECT session_id, active, archived FROM message_counts")
    }
    actual = {
        r[0]: (r[1], r[2])
        for r in rows(
            db,
            "SELECT session_id, SUM(archived = 0 AND event_marker = 0 AND role != 'system'),"
            " SUM(archived = 1) FROM messages GROUP BY session_id",
        )
    }
    for sid, (active, archived) in actual.items():
        assert counted.get(sid, (0, 0)) == (active, archived), f"{where}: message_counts of {sid}"


def check_compression_state(db: Path, sid: str, where: str) -> None:
    """R-RUN-11 / R-MEM-1: without a summary nothing is archived and no divider exists; with
    one, exactly one active divider, at the summary's time, every archived message older,
    and the conversation kept before it is the summary's kept count."""
    summary = meta(db, "summary", sid)
    active = rows(
        db,
        "SELECT id, role, content, ts, event_marker FROM messages"
        " WHERE session_id = ? AND archived = 0 ORDER BY id",
        (sid,),
    )
    archived = rows(db, "SELECT ts FROM messages WHERE session_id = ? AND archived = 1", (sid,))
    cleared = rows(db, "SELECT 1 FROM search_cleared WHERE session_id = ?", (sid,))
    dividers = [i for i, r in enumerate(active) if r[2] == DIVIDER and r[4]]
    if summary is None:
        if cleared:  # a clear: everything archived at once, the summary gone with it
            assert not [r for r in active if not r[4]] or not archived, f"{where}: {sid} half cleared"
            return
        assert not archived, f"{where}: {sid} archived messages without a summary"
        assert not dividers, f"{where}: {sid} a divider without a summary"
        return
    assert len(dividers) == 1, f"{where}: {sid} has {len(dividers)} active dividers with a summary"
    divider = active[dividers[0]]
    assert divider[3] == pytest.approx(summary["time"]), (
        f"{where}: {sid} divider and summary of different commits"
    )
    assert all(ts <= divider[3] for (ts,) in archived), where
    kept = [r for r in active[: dividers[0]] if not r[4] and r[1] != "system"]
    assert len(kept) == summary["kept_messages"], f"{where}: {sid} kept originals"


async def restart(db: Path, model: ScriptedLLM) -> Runtime:
    """What the bot's start-up does on the file (runtime.start without becoming the plugin's
    own runtime): queue the interrupted compressions, report the cut replies."""
    rt = await runtime.build(
        Config.model_validate(config(json.dumps(model.model_config(context_window=16000)))), db, [], set()
    )
    await runtime.resume(rt)

    async def drained() -> bool:
        return not await rt.store.list_meta(DUE_NAMESPACE) and not rt.compression._runs

    await until(drained, "the resumed compressions to finish", within=10)
    return rt


async def answer_pending(rt: Runtime, sent: list[str]) -> None:
    """What the OneBot layer does on reconnect: a turn for a session whose questions within
    the resume window have no answer yet."""

    async def reply(text: str) -> None:
        sent.append(text)

    since = clock.now() - rt.config.memsum_resume_window
    for sid in dict.fromkeys(s for s, _ in await rt.store.pending_questions(since, prefix=A)):
        await rt.agent.run_turn(sid, reply, Entry("onebot", "group"), only_new=True)


async def check_point(n: int, db: Path, lines: list[str], model: ScriptedLLM, chat_before: int) -> None:
    where = f"killed before write {n}"
    seen = Seen.of(lines)
    check_file(db, where)
    for sid in (A, B, C):
        check_compression_state(db, sid, where + " (as the kill left it)")
    due_at_kill = {r[0] for r in rows(db, "SELECT key FROM metadata WHERE namespace = ?", (DUE_NAMESPACE,))}
    child_chat = sum(map(is_chat, model.requests[chat_before:]))
    rt = await restart(db, model)
    try:
        sent: list[str] = []
        await answer_pending(rt, sent)
        await rt.store.flush_ledger()
        restart_chat = sum(map(is_chat, model.requests[chat_before:])) - child_chat
        check_file(db, where + ", restarted")
        for sid in (A, B, C):
            check_compression_state(db, sid, where + ", restarted")
        # Every message record() returned is stored exactly once (active or archived).
        for sid, contents in seen.recorded.items():
            if sid == D and seen.deleted:
                continue  # deleted on purpose
            stored = [r[0] for r in rows(db, "SELECT content FROM messages WHERE session_id = ?", (sid,))]
            for content in contents:
                assert stored.count(content) == 1, (
                    f"{where}: {content!r} stored {stored.count(content)} times"
                )
        users = [r[0] for r in rows(db, "SELECT content FROM messages WHERE role = 'user'")]
        assert len(users) == len(set(users)), f"{where}: a message stored twice"
        # R-PROG / issue 15 item 3: a compression that had begun is re-run, none left marked.
        assert not await rt.store.list_meta(DUE_NAMESPACE), where
        for sid in due_at_kill:
            if sid == A or not seen.cleared:
                assert meta(db, "summary", sid) is not None, f"{where}: {sid}'s compression was not re-run"
        # Issue 15 item 1: the question answered exactly once, its answer stored once.
        question = bool(rows(db, "SELECT 1 FROM messages WHERE session_id = ? AND addressed = 1", (A,)))
        answers = rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = ? AND content = ?", (A, ANSWER))[
            0
        ][0]
        assert seen.sent + len(sent) == int(question), f"{where}: answered {seen.sent} + {len(sent)} times"
        assert answers == int(question), f"{where}: the answer stored {answers} times"
        # Usage: never counted twice (a crash may lose the last second's rows: README).
        ledger = rows(db, "SELECT COUNT(*) FROM ledger WHERE session_id = ? AND purpose = '对话'", (A,))[0][0]
        assert restart_chat + (child_chat if seen.flushed else 0) <= ledger <= child_chat + restart_chat, (
            where
        )
        # The setting: old or new, the new one once set() returned.
        cap = rows(
            db,
            "SELECT value FROM settings WHERE scope = 'session' AND scope_key = ? AND name = ?",
            (A, "daily_token_cap"),
        )
        assert [json.loads(v) for (v,) in cap] in ([[123456]] if seen.setting else [[], [123456]]), where
        # A clear that returned took everything of B, summary included.
        if seen.cleared:
            assert meta(db, "summary", B) is None, where
            assert not rows(
                db, "SELECT 1 FROM messages WHERE session_id = ? AND archived = 0 AND event_marker = 0", (B,)
            )
        # A child session is made with its copied settings, and deleted, in one commit each.
        child = rows(db, "SELECT parent FROM sessions WHERE id = ?", (D,))
        copied = rows(db, "SELECT name FROM settings WHERE scope = 'session' AND scope_key = ?", (D,))
        held = rows(db, "SELECT content FROM messages WHERE session_id = ?", (D,))
        if seen.deleted or not child:
            assert not copied, f"{where}: the child's settings without the child"
            assert not held, f"{where}: the child's messages without the child"
        else:
            assert child == [(A,)], where
            assert sorted(n for (n,) in copied) == ["compress_at", "history_limit"], where
        # The 仅记录 place: old mode or new, the record()s that returned before the kill kept.
        mode = rows(db, "SELECT value FROM settings WHERE scope = 'place' AND scope_key = 'onebot:group:3'")
        assert mode == [('"record"',)] or (not seen.quiet and mode == []), where
        # The restarted runtime works: a new question is answered, a new compression commits.
        later: list[str] = []
        await rt.agent.record(
            (await rt.store.get_session(A)) or api_group(),
            Message(
                role="user",
                content="[成员9(20009)] 重启后还在吗",
                name="20009",
                platform_id="p9",
                addressed=True,
            ),
        )

        async def reply(text: str) -> None:
            later.append(text)

        assert await rt.agent.run_turn(A, reply, Entry("onebot", "group"), only_new=True) == "replied", where
        assert later == [LATER], where
        done = await rt.compression.compress(A)
        assert done.outcome == "done", where
        check_compression_state(db, A, where + ", compressed after the restart")
    finally:
        await runtime.close(rt)
    check_file(db, where + ", closed")


def api_group() -> Any:
    from nonebot_plugin_memsum.types import SessionRecord

    return SessionRecord(id=A, platform="onebot", kind="group", place="group:1", room_class="room")


async def test_issue_15_r_run_11_a_kill_before_every_write_then_a_restart(
    zygote: Zygote, model: ScriptedLLM, tmp_path: Path
) -> None:
    status, lines = await asyncio.to_thread(zygote.run, 0, tmp_path / "clean.db", tmp_path / "clean.out")
    assert status == 0, lines
    assert lines[-1] == "end", lines
    writes = [line for line in lines if line.startswith("w ")]
    assert len(writes) > 120, "the workload makes its writes"  # each point below is one of them
    assert Seen.of(lines).sent == 1
    for n in range(1, len(writes) + 1):
        db, out = tmp_path / f"{n}.db", tmp_path / f"{n}.out"
        before = len(model.requests)
        status, lines = await asyncio.to_thread(zygote.run, n, db, out)
        assert status == 137, f"point {n} ({writes[n - 1]}) was not reached: {lines}"
        await check_point(n, db, lines, model, before)


# ---- the OneBot half: bot.py as a real process, killed before chosen writes ----------------
# The simulator answers `get_group_msg_history` as NapCat does and keeps what the bot sent
# (tests/fakes/onebot.py cites NapCat's source for both), so a restart's backfill sees the
# answer a kill may have cut between its send and the store's note of its message id.
SHIM = Path(__file__).parent / "fakes" / "killshim.py"
GROUP = 7301
BOT_PERSONA = "你是崩溃点测试群里的助手小记。"
BOT_ANSWER = "今天是十二月五日。"


def bot_env(llm: ScriptedLLM) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": BOT_PERSONA}


async def bot_life(bot: BotProcess, sim: OneBotSim, kill_at: int, log: Path) -> int:
    """Life 1: a greeting, a question to the bot, its answer, a thanks; killed before write
    `kill_at` (0: SIGKILLed once it is all done). The question's message id."""
    bot.wrapper = (sys.executable, str(SHIM), str(kill_at), str(log))
    await bot.start()
    await sim.connect()
    await wait_log(bot, f"Bot {SELF_ID} connected")
    await sim.group_message(GROUP, 20001, "大家好", nickname="甲")
    question = await sim.group_message(GROUP, 20002, [at(SELF_ID), text(" 今天几号？")], nickname="乙")

    async def answered_or_dead() -> bool:
        return bool(answers_to(sim, question)) or not bot.running

    await until(answered_or_dead, "the answer (or the kill)", within=15)
    await sim.group_message(GROUP, 20001, "谢谢", nickname="甲")

    async def thanked_or_dead() -> bool:
        return not bot.running or await _stored(bot, "[甲(20001)] 谢谢")

    await until(thanked_or_dead, "the thanks stored (or the kill)", within=15)
    await asyncio.sleep(1.2)  # the batched `sent` mark and ledger (LEDGER_DELAY) may come next
    if bot.running:
        await bot.kill()
    await asyncio.wait_for(sim.disconnected.wait(), 15)
    return question


def answers_to(sim: OneBotSim, message_id: int) -> list[Any]:
    """Sends that quote `message_id` (a group answer quotes its question)."""
    return [
        c
        for c in sim.calls
        if c.action in {"send_msg", "send_group_msg"}
        and any(
            seg.get("type") == "reply" and str(seg["data"]["id"]) == str(message_id)
            for seg in (c.params.get("message") or [])
            if isinstance(seg, dict)
        )
    ]


async def bot_point(tmp: Path, llm: ScriptedLLM, n: int) -> list[str]:
    """One point: life 1 killed before write `n`, life 2 a plain restart; checked after it.
    What life 1 wrote (`N SQL` lines; `kill N SQL` for the point)."""
    log = tmp / "writes.log"
    bot = BotProcess(tmp / "bot", env=bot_env(llm), log_level="INFO")
    sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
    try:
        question = await bot_life(bot, sim, n, log)
        bot.wrapper = ()
        await bot.start()
        await sim.connect()
        await wait_log(bot, f"Bot {SELF_ID} connected")
        await wait_log(bot, "memsum: backfill of 10000")

        async def answered() -> bool:
            return bool(answers_to(sim, question))

        await until(answered, f"the question answered (point {n})", within=15)
        await asyncio.sleep(1.5)  # a second answer would come now
        await bot.stop()
        where = f"bot.py killed before write {n}"
        assert (await query(bot.db_path, "PRAGMA integrity_check")) == [("ok",)], where
        said = [r[0] for r in await query(bot.db_path, "SELECT content FROM messages WHERE role = 'user'")]
        for content in ("[甲(20001)] 大家好", "[乙(20002)] @小记(10000) 今天几号？", "[甲(20001)] 谢谢"):
            assert said.count(content) == 1, f"{where}: {content} stored {said.count(content)} times: {said}"
        # Issue 15: answered once, across the kill; the bot's words stored once (not again by
        # the backfill, which sees them in the group's history).
        assert len(answers_to(sim, question)) == 1, where
        words = await query(bot.db_path, "SELECT content, platform_id FROM messages WHERE role = 'assistant'")
        assert [w for w, _ in words].count(BOT_ANSWER) == 1, f"{where}: the answer stored as {words}"
    finally:
        if bot.running:
            await bot.kill()
        await sim.close()
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


@pytest.fixture
def bot_llm(llm: ScriptedLLM) -> Iterator[ScriptedLLM]:
    llm.reset()
    llm.on_request(
        lambda b: Reply(BOT_ANSWER) if b["messages"][0]["content"] == BOT_PERSONA else Reply(SUMMARY)
    )
    yield llm
    llm.reset()


async def _stored(bot: BotProcess, content: str) -> bool:
    return bool(await query(bot.db_path, "SELECT 1 FROM messages WHERE content = ?", content))


async def test_issue_15_bot_py_killed_before_each_write_of_a_question_and_its_answer(
    tmp_path: Path, bot_llm: ScriptedLLM
) -> None:
    # A clean life lists the writes; then a kill before each write of the question's path:
    # its record, the answer's commit with its `sending` mark, the answer's message id, the
    # batched `sent` mark (bot.py starts twice per point: four points, not every write).
    writes = await bot_point(tmp_path / "clean", bot_llm, 0)
    wanted = {
        "the question's record": "今天几号",
        "the answer's commit": "'sending'",
        "the answer's message id": "SET platform_id",
        "the sent mark": "SET state = 'sent'",
    }
    points: dict[str, int] = {}
    for what, needle in wanted.items():
        at_write = next((int(w.split()[0]) for w in writes if needle in w), None)
        assert at_write is not None, f"{what} not among the writes:\n" + "\n".join(writes)
        # The answer's mark is inside its transaction: the kill goes before that COMMIT.
        points[what] = at_write + 1 if needle == "'sending'" else at_write
    for what, n in points.items():
        lines = await bot_point(tmp_path / f"p{n}", bot_llm, n)
        assert lines, what
        assert lines[-1].startswith(f"kill {n} "), (what, lines[-3:])
        if what == "the answer's commit":
            assert lines[-1] == f"kill {n} COMMIT", lines[-3:]


async def test_issue_15_a_question_asked_while_a_compression_ran_is_still_answered_after_the_restart(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # The kill (or stop) lands while a compression waits for the summariser, after a member
    # asked the bot something: the store holds the compression's due mark and the unanswered
    # question. Start-up re-runs the compression first; the question must still get its turn
    # "exactly as if the process had not died" (issue 15 item 1): had it not died, the run's
    # snapshot predates the question, which stays active and is answered.
    db = tmp_path / "memsum.db"
    llm.on_request(lambda b: Reply(ANSWER) if is_chat(b) else None)
    llm.default = Reply(SUMMARY)
    cfg = Config.model_validate(config(json.dumps(llm.model_config(context_window=16000))))
    group = api_group()
    rt = await runtime.build(cfg, db, [], set())
    try:
        for n in range(4):
            await rt.agent.record(
                group, Message(role="user", content=f"[甲(20001)] 闲聊第{n}句", name="20001")
            )
        with llm.gate(holds=lambda b: not is_chat(b)) as gate:
            running = asyncio.create_task(rt.compression.compress(A))
            await gate.reached()
            asked = Message(
                role="user",
                content="[乙(20002)] @小记(10000) 明天开会吗？",
                name="20002",
                platform_id="q1",
                addressed=True,
            )
            await rt.agent.record(group, asked)
            await runtime.close(rt)  # the stop (a SIGKILL leaves the same rows: tested above)
            await asyncio.gather(running, return_exceptions=True)
    finally:
        await runtime.close(rt)
    assert meta(db, DUE_NAMESPACE, A) is not None, "the cut compression is marked for the next start"
    rt = await restart(db, llm)
    try:
        assert meta(db, "summary", A) is not None, "start-up re-ran the compression"
        sent: list[str] = []
        await answer_pending(rt, sent)
        assert sent == [ANSWER], "the question asked before the stop is answered after the restart"
        chat = [b for b in llm.requests if is_chat(b)]
        assert "明天开会吗" in chat[-1]["messages"][-1]["content"], "the model reads the question verbatim"
    finally:
        await runtime.close(rt)


async def test_issue_15_a_reply_cut_by_a_kill_is_reported_at_the_next_start_only(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # The kill lands before the batched `sent` mark (the point "the sent mark" above): the
    # reply stays `sending`. The next start says so once ("not sent again"); a later restart,
    # after a life in which nothing was cut, must not report the same reply again.
    db = tmp_path / "memsum.db"
    cfg = Config.model_validate(config(json.dumps(llm.model_config(context_window=16000))))
    rt = await runtime.build(cfg, db, [], set())
    try:
        stored = await rt.agent.record(
            api_group(), Message(role="user", content="[甲(20001)] 在吗", name="20001")
        )
        assert stored.id is not None
        await rt.store.mark_reply(A, stored.id, "sending")  # the answer went out; the kill came next
    finally:
        await runtime.close(rt)
    for life, expected in (("the first restart", 1), ("a later restart", 0)):
        with captured("INFO") as lines:
            rt = await runtime.build(cfg, db, [], set())
            try:
                await runtime.resume(rt)
            finally:
                await runtime.close(rt)
        cut = [line for line in lines if "replies were being sent" in line]
        assert len(cut) == expected, f"{life}: {cut}"
