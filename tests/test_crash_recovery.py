"""What a restart needs to lose nothing (issue 15), in process on a real SQLite file with the
scripted model server: messages stored once by their platform id, replies marked as being
sent before they go out, the questions a crash left unanswered, the compression queue
(bounded, oldest due first) and its resumption, the drain before a stop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.compression.service import DUE_NAMESPACE
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.runtime import Runtime
from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.store.store import DEDUP_SECONDS
from nonebot_plugin_memsum.types import Message, SessionRecord
from tests.fakes.e2e import until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.service import settle

PERSONA = "你是测试群里的助手小记。"
SUMMARY = "【保留原文】无\n## 最近在聊什么\n闲聊\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
ENTRY = Entry("onebot", "group")


def group(n: int) -> SessionRecord:
    return SessionRecord(
        id=f"onebot:10000:group:{n}", platform="onebot", kind="group", place=f"group:{n}", room_class="room"
    )


def said(text: str, *, pid: int | None = None, asks: bool = False, ts: float = 0.0) -> Message:
    return Message(
        role="user",
        content=f"[甲(20001)] {text}",
        name="20001",
        ts=ts or clock.now(),
        platform_id=None if pid is None else str(pid),
        addressed=asks,
    )


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


def replies_row(db: Path, sid: str) -> tuple[int, str] | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        row = con.execute("SELECT upto, state FROM replies WHERE session_id = ?", (sid,)).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


MakeRuntime = Callable[..., Awaitable[Runtime]]


async def no_marks(rt: Runtime) -> bool:
    return not await rt.store.list_meta(DUE_NAMESPACE)


@pytest.fixture
async def make_rt(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[MakeRuntime]:
    built: list[Runtime] = []

    async def make(**config: Any) -> Runtime:
        models = [ModelConfig(**llm.model_config("test/model"))]
        cfg = Config(memsum_models=models, memsum_persona=PERSONA, **config)
        rt = await runtime.build(cfg, tmp_path / "memsum.db", ["小记"], {"10001"})
        built.append(rt)
        return rt

    llm.reset()
    try:
        yield make
    finally:
        for rt in built:
            await runtime.close(rt)
        llm.reset()


# ---- the store (on both engines) ------------------------------------------------------
async def test_a_message_is_stored_once_by_its_platform_id(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    try:
        now = clock.now()
        first = await store.append_once("s1", said("一", pid=7, ts=now))
        assert first is not None
        assert first.id is not None
        assert first.platform_id == "7"
        assert await store.append_once("s1", said("一（再取一次）", pid=7, ts=now + 1)) is None
        # Another session may use the same id; so may a namesake long after (32-bit hashes repeat).
        assert await store.append_once("s2", said("二", pid=7, ts=now)) is not None
        assert await store.append_once("s1", said("很久以后", pid=7, ts=now + DEDUP_SECONDS + 1)) is not None
        # Without a platform id nothing is deduplicated.
        assert await store.append_once("s1", said("无 id")) is not None
        assert await store.append_once("s1", said("无 id")) is not None
        contents = [m.content for m in await store.get_history("s1")]
        assert contents == [
            "[甲(20001)] 一",
            "[甲(20001)] 很久以后",
            "[甲(20001)] 无 id",
            "[甲(20001)] 无 id",
        ]
        assert (await store.get_history("s1"))[0].platform_id == "7"
    finally:
        await store.close()


async def test_the_platform_ids_a_session_holds_are_found_as_append_once_counts_them(
    location: Path | str,
) -> None:
    # A backfill skips what its session holds already in one trip (issue 15): the same
    # ids `append_once` would refuse, no others.
    store = Store(location)
    await store.open()
    try:
        now = clock.now()
        await store.append_once("s1", said("一", pid=7, ts=now))
        await store.append_once("s1", said("二", pid=8, ts=now))
        await store.append_once("s2", said("别的会话", pid=9, ts=now))
        found = await store.stored_platform_ids(
            "s1", {"7": now + 1, "8": now + DEDUP_SECONDS + 1, "9": now, "10": now}
        )
        assert found == {"7"}  # 8: a namesake long after is new; 9: another session's
        assert await store.append_once("s1", said("二（很久以后）", pid=8, ts=now + DEDUP_SECONDS + 1))
        assert await store.stored_platform_ids("s1", {}) == set()
    finally:
        await store.close()


async def test_a_quoted_message_is_found_by_its_platform_id_in_its_own_session_only(
    location: Path | str,
) -> None:
    # What a reply quotes when the implementation's `get_msg` no longer has it (record.py):
    # the newest of the session under that id, archived or not; never another session's.
    store = Store(location)
    await store.open()
    try:
        now = clock.now()
        await store.append_once("s1", said("很久以前", pid=7, ts=now - DEDUP_SECONDS - 5))
        await store.append_once("s1", said("一", pid=7, ts=now))
        await store.append_once("s2", said("别的会话", pid=9, ts=now))
        await store.clear("s1", "context")  # archived: still what was said
        found = await store.by_platform_id("s1", "7")
        assert found is not None
        assert (found.content, found.role, found.platform_id) == ("[甲(20001)] 一", "user", "7")
        assert await store.by_platform_id("s1", "9") is None
        assert await store.by_platform_id("s1", "8") is None
    finally:
        await store.close()


async def test_an_answer_is_named_by_the_id_it_went_out_under_only_when_it_is_the_newest(
    location: Path | str,
) -> None:
    # send.py notes the platform id of a sent answer, so a reply quoting it asks the bot
    # after the implementation forgot it; an apology sent without a stored answer names nothing.
    store = Store(location)
    await store.open()
    try:
        await store.append("s1", Message(role="assistant", content="旧的回答"))
        await store.append("s1", Message(role="assistant", content="新的回答"))
        await store.append("s1", said("一"))
        await store.name_answer("s1", "出错了，请稍后再试", "900")  # not what was stored
        await store.name_answer("s1", "旧的回答", "901")  # not the newest answer
        await store.name_answer("s2", "新的回答", "902")  # another session
        assert [await store.by_platform_id("s1", p) for p in ("900", "901", "902")] == [None] * 3
        await store.name_answer("s1", "新的回答", "903")
        found = await store.by_platform_id("s1", "903")
        assert found is not None
        assert (found.role, found.content) == ("assistant", "新的回答")
    finally:
        await store.close()


async def test_pending_questions_are_those_after_the_last_reply_mark_within_the_window(
    location: Path | str,
) -> None:
    store = Store(location)
    await store.open()
    try:
        now = clock.now()
        old = await store.append("a", said("一小时前的问题", asks=True, ts=now - 3600))
        q1 = await store.append("a", said("问题一", asks=True, ts=now - 10))
        await store.append("a", said("闲聊", ts=now - 9))
        q2 = await store.append("a", said("问题二", asks=True, ts=now - 5))
        b1 = await store.append("b", said("别的群的问题", asks=True, ts=now - 5))
        await store.append("c", said("答过了", asks=True, ts=now - 5))
        c_last = await store.append("c", said("闲聊", ts=now - 4))
        assert c_last.id is not None
        assert old.id is not None
        await store.mark_reply("c", c_last.id, "sending")
        pending = await store.pending_questions(now - 300)
        assert [(sid, m.id) for sid, m in pending] == [("a", q1.id), ("a", q2.id), ("b", b1.id)]
        assert all(m.addressed for _, m in pending)
        assert [sid for sid, _ in await store.pending_questions(now - 300, prefix="b")] == ["b"]
        # A mark never moves back; a clear leaves nothing to answer.
        assert q1.id is not None
        await store.mark_reply("a", q1.id, "sent")
        await store.mark_reply("a", old.id, "sent")
        assert [m.id for _, m in await store.pending_questions(now - 300, prefix="a")] == [q2.id]
        await store.clear("a", "context")
        assert await store.pending_questions(now - 300, prefix="a") == []
        assert await store.replies_being_sent() == [("c", c_last.id)]
    finally:
        await store.close()


async def test_recent_sessions_are_those_with_a_message_since(location: Path | str) -> None:
    store = Store(location)
    await store.open()
    try:
        now = clock.now()
        for n, age in ((1, 10), (2, 3 * 86400), (3, 60)):
            await store.save_session(group(n))
            await store.append(group(n).id, said("x", ts=now - age))
        await store.save_session(SessionRecord(id="onebot:99:group:1", platform="onebot", kind="group"))
        await store.append("onebot:99:group:1", said("另一个账号", ts=now))
        await store.clear(group(3).id, "context")  # archived messages count too
        recent = await store.recent_sessions("onebot:10000:", now - 86400)
        assert [sid for sid, _ in recent] == [group(3).id, group(1).id]
    finally:
        await store.close()


# ---- replies: marked before they go out -----------------------------------------------
async def test_a_reply_is_marked_as_being_sent_before_it_goes_out(
    make_rt: MakeRuntime, llm: ScriptedLLM, tmp_path: Path
) -> None:
    rt = await make_rt()
    llm.default = Reply("好的")
    q = await rt.agent.record(group(1), said("小记在吗", asks=True))
    assert q.id is not None
    seen: list[tuple[int, str] | None] = []

    async def reply(text: str) -> None:
        seen.append(await asyncio.to_thread(replies_row, tmp_path / "memsum.db", group(1).id))

    assert await rt.agent.run_turn(group(1).id, reply, ENTRY) == "replied"
    assert seen == [(q.id, "sending")]
    # Issue 9: the `sent` mark waits in memory and goes with the usage rows, within a second.
    assert replies_row(tmp_path / "memsum.db", group(1).id) == (q.id, "sending")
    assert await rt.store.replies_being_sent() == []  # writes what waits before it reads
    assert replies_row(tmp_path / "memsum.db", group(1).id) == (q.id, "sent")
    assert await rt.store.pending_questions(0) == []
    later = await rt.agent.record(group(1), said("还有一个问题", asks=True))
    assert [m.id for _, m in await rt.store.pending_questions(0)] == [later.id]


async def test_a_failed_turn_marks_its_error_reply_and_a_silent_turn_its_silence(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(memsum_llm_timeout=5)
    await rt.agent.record(group(1), said("问题", asks=True))
    llm.push(Reply(status=400))
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    assert await rt.agent.run_turn(group(1).id, reply, ENTRY) == "error"
    assert sent == [rt.config.memsum_error_reply]
    assert await rt.store.pending_questions(0) == []  # answered (with the apology): not again
    await rt.agent.record(group(2), said("问题", asks=True))
    llm.push(Reply("[不回复]"))
    assert await rt.agent.run_turn(group(2).id, reply, ENTRY) == "silent"
    assert await rt.store.pending_questions(0) == []


async def test_each_turn_logs_one_info_line_without_message_text(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    llm.default = Reply("秘密的回答内容")
    await rt.agent.record(group(1), said("秘密的问题内容", asks=True))
    with captured("INFO") as lines:
        await rt.agent.run_turn(group(1).id, None, ENTRY)
    turn_lines = [line for line in lines if "memsum: turn " in line]
    assert len(turn_lines) == 1, lines
    assert group(1).id in turn_lines[0]
    assert " replied " in turn_lines[0]
    assert "tokens" in turn_lines[0]
    assert not any("秘密" in line for line in lines)


# ---- the compression queue ------------------------------------------------------------
async def test_interrupted_compressions_resume_oldest_due_first_and_at_most_n_at_once(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt(memsum_compress_concurrency=2)
    lock = threading.Lock()
    in_flight, most, order = [0], [0], []

    def summarise(body: dict[str, Any]) -> Reply | None:
        if is_chat(body):
            return None
        text = body["messages"][1]["content"]
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            order.append(next(n for n in range(1, 7) if f"群{n}的话" in text))
        time.sleep(0.2)
        with lock:
            in_flight[0] -= 1
        return Reply(SUMMARY)

    llm.on_request(summarise)
    now = clock.now()
    dues = {1: now - 50, 2: now - 10, 3: now - 40, 4: now - 20, 5: now - 30}
    for n, due in dues.items():
        for i in range(3):
            await rt.agent.record(group(n), said(f"群{n}的话 {i}"))
        await rt.store.put_meta(DUE_NAMESPACE, group(n).id, {"due": due})
    await rt.store.put_meta(DUE_NAMESPACE, group(6).id, {"due": now})  # nothing to compress there
    with captured("INFO") as lines:
        assert await rt.compression.resume() == 6
        await until(lambda: no_marks(rt), "the queue to empty")
    assert most[0] == 2
    assert sorted(order[:2]) == [1, 3]
    assert sorted(order[2:4]) == [4, 5]
    assert order[4] == 2
    done = [line for line in lines if "memsum: compression " in line and " done " in line]
    assert len(done) == 5
    assert not any("群" in line for line in lines)
    for n in dues:
        assert (await rt.compression.summary(group(n).id) or {}).get("text")


@pytest.mark.parametrize("meanwhile", ["compressed", "cleared"])
async def test_r_trig_5_a_queued_compression_overtaken_by_a_compression_or_clear_sends_nothing(
    make_rt: MakeRuntime, llm: ScriptedLLM, meanwhile: str
) -> None:
    """R-TRIG-5 for the queue: a session waiting for a free slot and compressed meanwhile (a
    /压缩, a turn's own run) or cleared is not compressed when its slot comes, and keeps no
    mark that a restart would run."""
    rt = await make_rt(memsum_compress_concurrency=1)
    now = clock.now()
    for n in (1, 2):
        for i in range(3):
            await rt.agent.record(group(n), said(f"群{n}的话 {i}"))
        await rt.store.put_meta(DUE_NAMESPACE, group(n).id, {"due": now - 10 + n})
    llm.default = Reply(SUMMARY)
    with llm.gate(Reply(SUMMARY), holds=lambda b: not is_chat(b) and "群1的话" in str(b)) as gate:
        assert await rt.compression.resume() == 2
        await gate.reached()  # group 1 holds the only slot; group 2 waits in the queue
        if meanwhile == "compressed":
            assert (await rt.compression.compress(group(2).id)).outcome == "done"
        else:
            await rt.compression.clear(group(2).id, "context")
        await rt.agent.record(group(2), said("群2的话 之后又说了一句"))  # nothing near the line
        gate.open()
    await settle(rt)  # the queue's worker, group 2's turn in it included
    assert await no_marks(rt)
    asked = ["群2的话" in str(body) for body in llm.requests if not is_chat(body)]
    assert asked.count(True) == (meanwhile == "compressed"), "group 2 was summarised again"
    assert asked.count(False) == 1
    assert (await rt.compression.summary(group(1).id) or {}).get("text")


async def test_a_stopped_compression_keeps_its_mark_and_runs_at_the_next_start(
    make_rt: MakeRuntime, llm: ScriptedLLM, tmp_path: Path
) -> None:
    rt = await make_rt()
    with llm.gate(Reply(SUMMARY), holds=lambda b: not is_chat(b)) as gate:
        for i in range(3):
            await rt.agent.record(group(1), said(f"话 {i}"))
        task = asyncio.ensure_future(rt.compression.compress(group(1).id))
        await gate.reached()
        assert group(1).id in await rt.store.list_meta(DUE_NAMESPACE)
        await runtime.close(rt)
        await asyncio.gather(task, return_exceptions=True)
    llm.reset()
    llm.default = Reply(SUMMARY)
    again = await make_rt()
    assert await again.compression.resume() == 1
    await until(lambda: no_marks(again), "the resumed run")
    assert (await again.compression.summary(group(1).id) or {}).get("text")


# ---- the drain before a stop ----------------------------------------------------------
async def test_drain_lets_the_turn_in_flight_finish_and_starts_no_new_one(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    sent: list[str] = []

    async def reply(text: str) -> None:
        sent.append(text)

    with llm.gate(Reply("答")) as gate:
        q = await rt.agent.record(group(1), said("问", asks=True))
        rt.agent.request_turn(group(1).id, reply, ENTRY, trigger=q.id)
        await gate.reached()
        drained = asyncio.ensure_future(rt.agent.drain(10))
        await asyncio.sleep(0)
        late = await rt.agent.record(group(2), said("停机时的问题", asks=True))
        rt.agent.request_turn(group(2).id, reply, ENTRY, trigger=late.id)
        gate.open()
        assert await drained == 0
    assert sent == ["答"]
    # What came in while stopping is stored and still unanswered: the next start answers it.
    assert [(sid, m.id) for sid, m in await rt.store.pending_questions(0)] == [(group(2).id, late.id)]


# ---- bounded memory -------------------------------------------------------------------
def test_per_session_structures_keep_the_sessions_written_last() -> None:
    from nonebot_plugin_memsum.lru import LRU

    kept: LRU[str, int] = LRU(maxlen=3)
    for n in range(10):
        kept[f"s{n}"] = n
    kept["s7"] = 70  # written again: fresh
    kept["s10"] = 10
    assert list(kept.items()) == [("s9", 9), ("s7", 70), ("s10", 10)]


async def test_ten_thousand_sessions_leave_bounded_state_behind(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    from nonebot_plugin_memsum.lru import SESSIONS_KEPT

    rt = await make_rt()
    llm.default = Reply("好")
    for n in range(SESSIONS_KEPT + 50):
        await rt.store.save_session(group(n))
    for n in range(30):
        await rt.agent.record(group(n), said("问", asks=True))
        await rt.agent.run_turn(group(n).id, None, ENTRY)
    assert len(rt.store._sessions) == SESSIONS_KEPT
    # Nothing of a turn stays behind once the session is idle.
    assert len(rt.agent._locks) == 0
    assert rt.agent._workers == {}
    assert rt.compression._turn_epoch == {}


async def test_summaries_kept_in_memory_are_bounded_in_bytes(make_rt: MakeRuntime) -> None:
    # A summary's length follows the model's window: a count of sessions is no byte bound.
    from nonebot_plugin_memsum.compression.service import SUMMARY_CACHE_BYTES
    from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE

    rt = await make_rt()
    kept = rt.compression._summaries
    assert kept.max_bytes == SUMMARY_CACHE_BYTES
    kept.max_bytes = 100_000  # the same rule at a size a test can fill
    texts = {group(n).id: f"摘要{n}：" + "长" * 10_000 for n in range(20)}  # ~20 KB each in memory
    for sid, text in texts.items():
        await rt.store.put_meta(SUMMARY_NAMESPACE, sid, {"text": text})
        assert (await rt.compression.summary(sid) or {})["text"] == text
    assert kept.bytes <= 100_000
    assert len(kept) == 4  # the four read last
    for sid, text in texts.items():  # an evicted one is read from the store again
        assert (await rt.compression.summary(sid) or {})["text"] == text


async def test_a_sent_mark_waiting_in_memory_never_marks_a_newer_reply_sent(tmp_path: Path) -> None:
    # Issue 9: `sent` is written within a second; a newer reply of the session marked
    # `sending` meanwhile stays `sending` (a crash now must not count it as sent).
    from nonebot_plugin_memsum.store import Store

    store = Store(tmp_path / "memsum.db")
    await store.open()
    try:
        first = await store.append("s", said("第一问", asks=True))
        second = await store.append("s", said("第二问", asks=True))
        assert first.id is not None
        assert second.id is not None
        await store.mark_reply("s", first.id, "sending")
        store.mark_sent("s", first.id)
        await store.mark_reply("s", second.id, "sending")
        assert await store.replies_being_sent() == [("s", second.id)]
        store.mark_sent("s", second.id)
    finally:
        await store.close()  # writes what waits
    assert replies_row(tmp_path / "memsum.db", "s") == (second.id, "sent")
