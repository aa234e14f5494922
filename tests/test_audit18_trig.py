"""Audit 18: R-TRIG, R-BACK, R-CFG, R-TPL, R-INJ and R-MEM over time, driven only through the
public `api` module and `.env`-style settings (`Config`), with the scripted OpenAI-compatible
server as both the chat and the summary model, on a real SQLite file.

Each test builds a private runtime and makes it the one `api` talks to. The chat model's
reply states the prompt tokens it "used", so a test sets where a turn stands against the
compression line E = min(compress_at × window, trim budget); the window is 8000 and the trim
budget 8000 − 1024 = 6976 unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.config import Config
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.service import NOTHING_KEPT, WORK_SUMMARY, settle, usage

OWNER = "10001"
CHAT, SUM = "chat-m", "sum-m"
WINDOW = 8000
TEXT = "今天我们讨论周末去哪里爬山顺便带上相机拍照大家记得带水和干粮路线从北门上山"


def talk(i: int, chars: int = 40) -> str:
    body = (TEXT * (chars // len(TEXT) + 1))[:chars]
    return f"[甲(1)] 第{i}条 {body}"


class Bot:
    """A private runtime behind `api`, its model server, and what it reported."""

    def __init__(self, llm: ScriptedLLM, db: Path) -> None:
        self.llm = llm
        self.db = db
        self.progress: list[api.CompressionProgress] = []
        self.chat_usage = 100
        self.summary_reply: Callable[[dict[str, Any]], Reply] = lambda body: Reply(
            NOTHING_KEPT
            if "最近在聊什么" in body["messages"][0]["content"]
            else f"【保留原文】无\n{WORK_SUMMARY}"
        )
        self.hold: Gate | None = None
        self.chat_script: list[Reply] = []
        llm.on_request(self._answer)

    def _answer(self, body: dict[str, Any]) -> Reply:
        if self.hold is not None:
            self.hold(body)  # a Gate without a reply: waits, then lets the script answer
        if body["model"] == SUM:
            return self.summary_reply(body)
        if self.chat_script:
            return self.chat_script.pop(0)
        return Reply("好的", usage=usage(self.chat_usage))

    def summary_requests(self) -> list[dict[str, Any]]:
        return [b for b in self.llm.requests if b["model"] == SUM]

    def starts(self, sid: str) -> int:
        return sum(1 for p in self.progress if p.session_id == sid and p.phase == "start")

    async def turn(self, sid: str, text: str | None = None, *, used: int | None = None) -> str:
        """Record a user message, run a turn whose call reports `used` prompt tokens, and
        wait for whatever compression its end started."""
        if used is not None:
            self.chat_usage = used
        session = await _session(sid)
        await api.record(session, api.Message(role="user", content=text or talk(0)))
        said: list[str] = []

        async def send(t: str) -> None:
            said.append(t)

        outcome = await api.run_turn(sid, send, api.Entry("onebot.group"))
        await settle(runtime.get())
        return outcome


_SESSIONS: dict[str, api.SessionRecord] = {}


async def _session(sid: str) -> api.SessionRecord:
    if sid not in _SESSIONS:
        _SESSIONS[sid] = group(sid)
    return _SESSIONS[sid]


def group(sid: str) -> api.SessionRecord:
    place = sid.rsplit(":", 1)[-1]
    return api.SessionRecord(
        id=sid, platform="onebot", kind="group", place=f"group:{place}", room_class="room"
    )


Build = Callable[..., Awaitable[Bot]]


@pytest.fixture
async def build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Build]:
    made: list[tuple[runtime.Runtime, ScriptedLLM]] = []

    async def make(
        *,
        chat: dict[str, Any] | None = None,
        models: Callable[[ScriptedLLM], list[dict[str, Any]]] | None = None,
        db: Path | None = None,
        **env: Any,
    ) -> Bot:
        llm = ScriptedLLM().start()
        entries = (
            models(llm)
            if models
            else [
                llm.model_config(
                    "t/chat", **{"model": CHAT, "context_window": WINDOW, "priority": 1, **(chat or {})}
                ),
                llm.model_config("t/sum", model=SUM),
            ]
        )
        prefs = {} if models else {"memsum_chat_model": "t/chat", "memsum_summary_model": "t/sum"}
        cfg = Config.model_validate({"memsum_models": entries, **prefs, **env})
        db = db or tmp_path / f"memsum-{len(made)}.db"
        rt = await runtime.build(cfg, db, ["小记"], {OWNER})
        monkeypatch.setattr(runtime, "_current", rt)
        made.append((rt, llm))
        bot = Bot(llm, db)
        api.subscribe(api.CompressionProgress, bot.progress.append)
        return bot

    _SESSIONS.clear()
    yield make
    for rt, llm in made:
        await runtime.close(rt)
        llm.stop()


async def fill(sid: str, tokens: int) -> None:
    """Record conversation until the history estimates at least `tokens`."""
    session = await _session(sid)
    total, i = 0, 1
    while total < tokens:
        text = talk(i, 300)
        await api.record(session, api.Message(role="user", content=text))
        total += estimate_text_tokens(text)
        i += 1


async def say(session: api.SessionRecord | str, count: int, chars: int = 40) -> None:
    """Record `count` short user messages."""
    record = await _session(session) if isinstance(session, str) else session
    for i in range(count):
        await api.record(record, api.Message(role="user", content=talk(i, chars)))


# ---- R-TRIG ---------------------------------------------------------------------------
async def test_r_trig_2_usage_line_compresses_in_background_after_the_answer(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)  # E = min(4000, 6976) = 4000
    sid = "onebot:group:1"
    await fill(sid, 2200)  # compressible ≥ E / 2
    assert await bot.turn(sid, used=4000) == "replied"
    assert bot.starts(sid) == 1
    assert [p.phase for p in bot.progress] == ["start", "done"]
    # The turn's chat request came first: the compression ran after the answer, not before it.
    models = [b["model"] for b in bot.llm.requests]
    assert models[0] == CHAT
    assert models[1:] == [SUM]
    status = await api.status(sid)
    assert status.summary
    assert "爬山" in status.summary
    history = await api.history(sid)
    assert [m.content for m in history if m.event_marker] == ["对话已压缩"]


@pytest.mark.parametrize(
    ("history", "used", "runs"),
    [
        (2200, 4000, 1),  # at E, compressible ≥ E / 2
        (2200, 3999, 0),  # below E
        (300, 6000, 0),  # persona, tools and contributions make the usage; history < E / 2
    ],
)
async def test_r_trig_3_usage_line_and_half_of_it_compressible(
    build: Build, history: int, used: int, runs: int
) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = f"onebot:group:3{history}{used}"
    await fill(sid, history)
    await bot.turn(sid, used=used)
    assert bot.starts(sid) == runs
    assert len(bot.summary_requests()) == runs


async def test_r_trig_3_once_per_crossing(build: Build) -> None:
    """After a compression the usage may stay over E (what cannot be compressed), but the
    compressible part is small: no second run on the next turns."""
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:4"
    await fill(sid, 2200)
    await bot.turn(sid, used=4500)
    assert bot.starts(sid) == 1
    for i in range(3):
        await bot.turn(sid, talk(100 + i), used=4500)
    assert bot.starts(sid) == 1


async def test_r_trig_4_count_line(build: Build) -> None:
    """history_limit 6: 3 stored + the question = 4 at the start, + the reply = 5 < 6; the next
    turn starts at 6 (the reply and its question too), + its reply = 7 ≥ 6."""
    bot = await build(memsum_history_limit=6, memsum_compress_at=0)
    sid = "onebot:group:5"
    await say(sid, 3)
    await bot.turn(sid, talk(3), used=10)  # 4 messages at start, + reply = 5
    assert bot.starts(sid) == 0
    await bot.turn(sid, talk(4), used=10)  # 6 at start (the earlier reply too), + reply = 7
    assert bot.starts(sid) == 1
    assert bot.progress[-1].phase == "done"


async def test_r_trig_5_a_turn_with_nothing_new_is_not_judged(build: Build) -> None:
    """run_turn with nothing new since the last turn: silent, no model call, so no usage of
    its own to judge (the last one is an earlier turn's)."""
    bot = await build(memsum_history_limit=4, memsum_compress_at=0)
    sid = "onebot:group:6"
    session = await _session(sid)
    await api.record(session, api.Message(role="user", content=talk(1)))
    await bot.turn(sid, talk(2), used=10)  # 2 at start + reply = 3 < 4
    assert bot.starts(sid) == 0
    outcome = await api.run_turn(sid)
    assert outcome == "silent"
    await settle(runtime.get())
    assert bot.starts(sid) == 0


async def test_r_cfg_4_compress_at_zero_turns_the_usage_line_off(build: Build) -> None:
    bot = await build(memsum_compress_at=0)
    sid = "onebot:group:7"
    await fill(sid, 3000)
    await bot.turn(sid, used=6900)
    assert bot.starts(sid) == 0
    assert await api.compress_at(sid, "onebot", "group") is None


async def test_r_trig_5_a_turn_overtaken_by_a_compression_is_not_judged(build: Build) -> None:
    """A manual compression has its summary while the turn waits for the model, and commits
    once the turn is done (the background never changes history while a turn runs): the
    turn's usage was measured over the old history, so its end starts nothing."""
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:8"
    await fill(sid, 2200)
    bot.chat_usage = 5000
    gate = bot.hold = Gate(holds=lambda body: body["model"] == CHAT)
    session = await _session(sid)
    await api.record(session, api.Message(role="user", content=talk(50)))
    with gate:
        turn = asyncio.create_task(api.run_turn(sid, None, api.Entry("onebot.group")))
        await gate.reached()
        asked = len(bot.llm.requests)
        manual = asyncio.create_task(api.compress(sid))
        await bot.llm.wait_requests_async(asked + 1)  # the summary, asked while the turn still waits
    assert await turn == "replied"
    assert (await manual).outcome == "done"
    await settle(runtime.get())
    assert bot.starts(sid) == 1  # the manual one only


async def test_r_trig_manual_compression_without_any_usage(build: Build) -> None:
    """R-BUD-6: no usage yet (nothing was ever said to the model): the budget comes from what is
    compressed, at least 1000; max_tokens = ceil(1.5 × budget)."""
    bot = await build()
    sid = "onebot:group:9"
    await fill(sid, 200)
    result = await api.compress(sid)
    assert result.outcome == "done"
    [req] = bot.summary_requests()
    assert (req.get("max_tokens") or req.get("max_completion_tokens")) == 1500
    assert "1000" in req["messages"][0]["content"]
    assert [p.phase for p in bot.progress] == ["start", "done"]


async def test_r_prog_2_manual_compression_of_an_empty_session(build: Build) -> None:
    bot = await build()
    sid = "onebot:group:10"
    await api.record(await _session(sid), api.Message(role="user", content=talk(1)))
    await api.clear(sid)
    await api.compress(sid)
    assert not bot.summary_requests()
    assert not bot.progress


def failing(body: dict[str, Any]) -> Reply:
    return Reply(status=400, error="bad request")


async def failed_once(bot: Bot, sid: str, text: str | None = None) -> None:
    """A due turn whose background run fails: the session's first back-off."""
    await fill(sid, 2200)
    bot.summary_reply = failing
    await bot.turn(sid, text, used=5000)
    assert (await api.status(sid)).backoff_failures == 1


# ---- R-BACK ---------------------------------------------------------------------------
async def test_r_back_3_failures_back_off_2_4_8_turns_and_success_resets(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:11"
    await fill(sid, 2200)
    bot.summary_reply = failing
    runs: list[int] = []
    for n in range(1, 16):
        if n == 15:
            bot.summary_reply = lambda body: Reply(NOTHING_KEPT)
        before = bot.starts(sid)
        await bot.turn(sid, talk(100 + n), used=5000)
        if bot.starts(sid) > before:
            runs.append(n)
    # Fail at 1; 2 judged turns later (3) fail; 4 later (7) fail; 8 later (15) succeed.
    assert runs == [1, 3, 7, 15]
    assert [p.phase for p in bot.progress] == ["start", "error"] * 3 + ["start", "done"]
    status = await api.status(sid)
    assert status.backoff_failures == 0


async def test_r_back_4_manual_success_and_clear_forget_the_back_off(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:12"
    await failed_once(bot, sid)
    # A manual run that fails is not a background failure: the back-off stays as it was.
    with pytest.raises(api.CompressionError):
        await api.compress(sid)
    assert (await api.status(sid)).backoff_failures == 1
    bot.summary_reply = lambda body: Reply(NOTHING_KEPT)
    await api.compress(sid)
    assert (await api.status(sid)).backoff_failures == 0
    # A clear forgets it too.
    await failed_once(bot, sid, talk(7))
    await api.clear(sid)
    assert (await api.status(sid)).backoff_failures == 0
    # …and the next due turn tries at once.
    await fill(sid, 2200)
    before = bot.starts(sid)
    await bot.turn(sid, talk(8), used=5000)
    assert bot.starts(sid) == before + 1


async def test_r_back_4_deleting_a_session_forgets_the_back_off(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:13"
    await failed_once(bot, sid)
    await api.delete_session(sid)
    assert (await api.status(sid)).backoff_failures == 0


async def test_r_back_2_count_rule_keeps_at_most_half_the_limit(build: Build) -> None:
    """history_limit 8: kept originals + messages after the cut ≤ 4 after the run."""
    bot = await build(memsum_history_limit=8, memsum_compress_at=0, memsum_summary_budget_ratio=0.5)
    sid = "onebot:group:14"

    def keep_all(body: dict[str, Any]) -> Reply:
        numbers = sorted(set(re.findall(r"#(\d+)〔约", body["messages"][1]["content"])), key=int)
        return Reply(f"【保留原文】{'、'.join(numbers) or '无'}\n" + NOTHING_KEPT.split("\n", 1)[1])

    bot.summary_reply = keep_all
    await say(sid, 6, 10)
    await bot.turn(sid, talk(6, 10), used=10)  # 7 + reply = 8
    assert bot.starts(sid) == 1
    assert bot.progress[-1].phase == "done"
    active = [m for m in await api.history(sid) if not m.event_marker and m.role != "system"]
    assert 0 < len(active) <= 4


# ---- R-CFG ----------------------------------------------------------------------------
def test_r_cfg_1_defaults() -> None:
    cfg = Config()
    assert cfg.memsum_compress_at == 0.8
    assert cfg.memsum_summary_budget_ratio == 0.1


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("memsum_compress_at", 1.01),
        ("memsum_compress_at", -0.1),
        ("memsum_compress_at", "abc"),
        ("memsum_summary_budget_ratio", 0.51),
        ("memsum_summary_budget_ratio", -0.01),
        ("memsum_summary_budget_ratio", "NaN"),
    ],
)
def test_r_cfg_1_a_value_out_of_range_is_refused_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ValidationError) as err:
        Config.model_validate({key: value})
    assert key in str(err.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("memsum_compress_at", 0),
        ("memsum_compress_at", 1),
        ("memsum_summary_budget_ratio", 0),
        ("memsum_summary_budget_ratio", 0.5),
    ],
)
def test_r_cfg_1_range_ends_are_allowed(key: str, value: float) -> None:
    assert getattr(Config.model_validate({key: value}), key) == value


def test_r_cfg_1_a_tier_value_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError) as err:
        Config.model_validate({"memsum_tiers": json.dumps({"onebot.group": {"compress_at": 1.5}})})
    assert "compress_at" in str(err.value)


async def test_r_cfg_2_tiers_resolve_platform_then_platform_type(build: Build) -> None:
    await build(
        memsum_compress_at=0.7,
        memsum_tiers={"onebot": {"compress_at": 0.5}, "onebot.group": {"compress_at": 0.3}},
    )
    await api.record(group("onebot:group:20"), api.Message(role="user", content=talk(1)))
    private = api.SessionRecord(
        id="onebot:private:20002", platform="onebot", kind="private", peer="20002", room_class="direct"
    )
    await api.record(private, api.Message(role="user", content=talk(1)))
    assert await api.compress_at("onebot:group:20", "onebot", "group") == 0.3
    # A session born on a platform keeps its own tier whatever it entered through.
    assert await api.compress_at("onebot:group:20", "onebot", "private") == 0.3
    assert await api.compress_at("onebot:private:20002", "onebot", "private") == 0.5
    # A session without a birth platform takes the tier of the platform it entered through.
    internal = await api.internal_session("myplugin:report")
    assert await api.compress_at(internal.id, "onebot", "group") == 0.3
    assert await api.compress_at(internal.id, "onebot", "private") == 0.5
    assert await api.compress_at(internal.id, None, None) == 0.7


async def test_r_cfg_3_a_child_session_copies_its_parents_value(build: Build) -> None:
    await build(memsum_compress_at=0.7, memsum_tiers={"onebot.group": {"compress_at": 0.3}})
    await api.record(group("onebot:group:21"), api.Message(role="user", content=talk(1)))
    child = await api.child_session("onebot:group:21", "onebot:group:21/task")
    assert await api.compress_at(child.id, None, None) == 0.3


# ---- R-TPL ----------------------------------------------------------------------------
CHAT_SECTIONS = ["最近在聊什么", "谁有问题没回应", "关键原话要点"]
WORK_SECTIONS = ["目标", "做过的决定", "改过的文件", "未完成的事"]


def sections_in_order(text: str, titles: list[str]) -> bool:
    at = [text.find(t) for t in titles]
    return all(i >= 0 for i in at) and at == sorted(at)


async def summarise(bot: Bot, session: api.SessionRecord) -> dict[str, Any]:
    await say(session, 3)
    before = len(bot.summary_requests())
    await api.compress(session.id)
    return bot.summary_requests()[before]


@pytest.mark.parametrize(
    ("session", "template"),
    [
        (group("onebot:group:30"), "chat"),
        (
            api.SessionRecord(
                id="onebot:private:20002",
                platform="onebot",
                kind="private",
                peer="20002",
                room_class="direct",
            ),
            "chat",
        ),
        (
            api.SessionRecord(
                id=f"onebot:private:{OWNER}",
                platform="onebot",
                kind="private",
                peer=OWNER,
                room_class="direct",
            ),
            "work",
        ),
    ],
)
async def test_r_tpl_1_2_template_by_session_record(
    build: Build, session: api.SessionRecord, template: str
) -> None:
    bot = await build()
    req = await summarise(bot, session)
    system = req["messages"][0]["content"]
    if template == "chat":
        assert sections_in_order(system, CHAT_SECTIONS)
        assert "目标" not in system
        assert "昵称(ID)" in system
    else:
        assert sections_in_order(system, WORK_SECTIONS)
        assert "最近在聊什么" not in system


async def test_r_tpl_2_internal_and_child_sessions_use_the_work_template(build: Build) -> None:
    bot = await build()
    internal = await api.internal_session("myplugin:daily")
    req = await summarise(bot, internal)
    assert sections_in_order(req["messages"][0]["content"], WORK_SECTIONS)
    await api.record(group("onebot:group:31"), api.Message(role="user", content=talk(1)))
    child = await api.child_session("onebot:group:31", "onebot:group:31/sub")
    req = await summarise(bot, child)
    assert sections_in_order(req["messages"][0]["content"], WORK_SECTIONS)


async def test_r_tpl_4_every_required_instruction_and_the_numbers(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:32"
    await fill(sid, 2200)
    await bot.turn(sid, used=4000)  # E = 4000: budget = 400 → floor 1000 → cap E/4 = 1000
    [req] = bot.summary_requests()
    system = req["messages"][0]["content"]
    assert "【保留原文】" in system
    assert "无" in system
    assert sections_in_order(system, CHAT_SECTIONS)
    assert "1000" in system
    assert (req.get("max_tokens") or req.get("max_completion_tokens")) == math.ceil(1.5 * 1000)
    # The keep cap: ⌊0.1 × the newly compressed conversation⌋, stated in the prompt.
    numbers = [int(n) for n in re.findall(r"\d+", system)]
    assert any(100 <= n < 1000 for n in numbers), system


async def test_r_tpl_5_second_compression_merges_into_the_existing_summary(build: Build) -> None:
    bot = await build()
    session = group("onebot:group:33")
    await summarise(bot, session)
    req = await summarise(bot, session)
    user = req["messages"][1]["content"]
    assert "约大家周末爬山" in user  # the existing summary is sent
    text = req["messages"][0]["content"] + user
    assert "合并" in text


# ---- R-INJ / R-MEM --------------------------------------------------------------------
async def test_r_inj_1_2_summary_is_one_system_message_right_before_the_history(build: Build) -> None:
    bot = await build()
    a, b = group("onebot:group:40"), group("onebot:group:41")
    await summarise(bot, a)
    await summarise(bot, b)
    heads = []
    for s in (a, b):
        await api.record(s, api.Message(role="user", content="[乙(2)] 新的一条"))
        prompt = await api.build_prompt(s.id, api.Entry("onebot.group"))
        msgs = prompt.messages
        at = next(i for i, m in enumerate(msgs) if m["role"] == "system" and "约大家周末爬山" in m["content"])
        assert all(m["role"] == "system" for m in msgs[:at])
        assert msgs[at + 1]["role"] != "system"
        assert sum(1 for m in msgs if "约大家周末爬山" in str(m["content"])) == 1
        heads.append(msgs[at]["content"].split("约大家周末爬山")[0].splitlines()[0])
    assert heads[0] == heads[1]
    assert heads[0]


async def test_r_mem_1_2_summary_in_metadata_and_clears(build: Build) -> None:
    bot = await build()
    s = group("onebot:group:42")
    await summarise(bot, s)

    def stored() -> list[str]:
        with sqlite3.connect(bot.db) as db:
            return [
                r[0]
                for r in db.execute(
                    "SELECT value FROM metadata WHERE namespace = 'summary' AND key = ?", (s.id,)
                )
            ]

    assert len(stored()) == 1
    assert "爬山" in stored()[0]
    await api.record(s, api.Message(role="user", content=talk(9)))
    await api.clear(s.id, "summary")
    assert stored() == []
    assert (await api.status(s.id)).summary is None
    assert [m.content for m in await api.history(s.id) if not m.event_marker]  # history stays
    await summarise(bot, s)
    assert stored()
    await api.clear(s.id, "context")
    assert stored() == []
    assert not [m for m in await api.history(s.id) if not m.event_marker]
    await summarise(bot, s)
    await api.delete_session(s.id)
    assert stored() == []


# ---- more R-TRIG / R-BACK / R-CFG over time ---------------------------------------------
def tool_call(call_id: str = "c1") -> Reply:
    return Reply("", tool_calls=[{"id": call_id, "name": "lookup", "arguments": "{}"}], usage=usage(10))


async def test_r_trig_4_tool_calls_and_results_of_the_turn_count(build: Build) -> None:
    """3 at the turn's start + a tool call + its result + the reply = 6 ≥ 6; without the
    tools the same turn counts 4."""
    bot = await build(memsum_history_limit=6, memsum_compress_at=0)
    api.tool("lookup", "查一下", {"type": "object", "properties": {}})(lambda ctx, args: "查到了")
    sid = "onebot:group:50"
    await say(sid, 2)
    bot.chat_script = [tool_call(), Reply("好的", usage=usage(10))]
    assert await bot.turn(sid, talk(2), used=10) == "replied"
    assert bot.starts(sid) == 1
    assert bot.progress[-1].phase == "done"


async def test_r_trig_4_without_tools_the_same_turn_is_under_the_line(build: Build) -> None:
    bot = await build(memsum_history_limit=6, memsum_compress_at=0)
    sid = "onebot:group:51"
    await say(sid, 2)
    await bot.turn(sid, talk(2), used=10)
    assert bot.starts(sid) == 0


async def test_r_trig_2_a_failed_turn_is_not_judged(build: Build) -> None:
    """The turn's first call reported a usage over the line; its second call failed: the
    turn ends in error and starts no compression."""
    bot = await build(memsum_compress_at=0.5)
    api.tool("lookup", "查一下", {"type": "object", "properties": {}})(lambda ctx, args: "查到了")
    sid = "onebot:group:52"
    await fill(sid, 2200)
    bot.chat_script = [
        Reply("", tool_calls=[{"id": "c1", "name": "lookup", "arguments": "{}"}], usage=usage(5000)),
        Reply(status=400, error="bad request"),
    ]
    assert await bot.turn(sid, talk(60)) == "error"
    assert bot.starts(sid) == 0


async def test_r_cfg_4_zero_line_hard_trimmed_turn_does_not_compress(build: Build) -> None:
    """compress_at 0: no compression by usage at all, even for a turn that was hard-trimmed
    (no count line set either)."""
    bot = await build(memsum_compress_at=0)
    sid = "onebot:group:53"
    await fill(sid, 9000)  # over the trim budget of 6976
    await bot.turn(sid, used=6900)
    assert bot.starts(sid) == 0
    [req] = bot.llm.requests
    assert len(req["messages"]) < len(await api.history(sid))  # it was trimmed


async def test_r_back_3_the_count_line_shares_the_back_off(build: Build) -> None:
    bot = await build(memsum_history_limit=4, memsum_compress_at=0)
    sid = "onebot:group:54"
    bot.summary_reply = failing
    await say(sid, 3)
    runs = []
    for n in range(1, 5):
        before = bot.starts(sid)
        await bot.turn(sid, talk(10 + n), used=10)
        if bot.starts(sid) > before:
            runs.append(n)
    assert runs == [1, 3]
    status = await api.status(sid)
    assert (status.backoff_failures, status.backoff_turns_left) == (2, 3)


async def test_r_cfg_5_summary_preference_naming_a_missing_model_falls_through(build: Build) -> None:
    def models(llm: ScriptedLLM) -> list[dict[str, Any]]:
        return [
            llm.model_config("t/low", model="low-m", priority=1),
            llm.model_config("t/high", model="high-m", priority=5),
        ]

    bot = await build(models=models, memsum_summary_model="t/missing")
    session = group("onebot:group:55")
    await api.record(session, api.Message(role="user", content=talk(1)))
    bot.llm.on_request(lambda body: Reply(NOTHING_KEPT))
    await api.compress(session.id)
    assert [b["model"] for b in bot.llm.requests] == ["high-m"]


async def test_r_fail_1_no_chat_capable_summary_model_names_the_preference(build: Build) -> None:
    def models(llm: ScriptedLLM) -> list[dict[str, Any]]:
        return [llm.model_config("t/embed", model="e-m", chat=False)]

    bot = await build(models=models, memsum_summary_model="t/missing")
    session = group("onebot:group:56")
    await api.record(session, api.Message(role="user", content=talk(1)))
    with pytest.raises(api.CompressionError) as err:
        await api.compress(session.id)
    assert "t/missing" in str(err.value)
    assert not bot.llm.requests
    assert (await api.status(session.id)).summary is None


def max_tokens(req: dict[str, Any]) -> int:
    return req.get("max_tokens") or req["max_completion_tokens"]


async def test_r_bud_6_after_a_clear_there_is_no_usage_and_no_line(build: Build) -> None:
    """Window 32000, compress_at 0.8: E = 25600 and the budget 2560 while the session has a
    usage; after a clear it has none (R-BUD-6: 「清理之后」), so the budget comes from what is
    compressed, at most ⅔ × 4096."""
    bot = await build(chat={"context_window": 32000})
    sid = "onebot:group:60"
    await fill(sid, 3200)
    await bot.turn(sid, used=100)  # a usage: the line is known
    await api.compress(sid)
    assert max_tokens(bot.summary_requests()[-1]) == math.ceil(1.5 * 2560)
    await api.clear(sid)
    await fill(sid, 3200)
    await api.compress(sid)
    # ⅔ × 4096 and its 1.5 times: 4095 or 4096 as the budget is rounded (tests/test_audit17_ref.py
    # checks the formula); what matters here is that the old line (3840) no longer applies.
    assert max_tokens(bot.summary_requests()[-1]) in (4095, 4096)


async def test_r_trig_5_a_turn_overtaken_by_a_clear_is_not_judged(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:61"
    await fill(sid, 2200)
    bot.chat_usage = 5000
    gate = bot.hold = Gate(holds=lambda body: body["model"] == CHAT)
    await api.record(await _session(sid), api.Message(role="user", content=talk(50)))
    with gate:
        turn = asyncio.create_task(api.run_turn(sid, None, api.Entry("onebot.group")))
        await gate.reached()
        await api.clear(sid)
        await fill(sid, 2200)
    await turn
    await settle(runtime.get())
    assert bot.starts(sid) == 0


async def test_r_prog_3_r_mem_3_r_back_4_clear_cancels_a_running_compression(build: Build) -> None:
    """A manual run while the background one waits for the model is refused; a clear then
    cancels the background run: nothing written, an error event with the reason, and no
    back-off (a cancelled run is no failure)."""
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:62"
    await fill(sid, 2200)
    gate = bot.hold = Gate(holds=lambda body: body["model"] == SUM)
    with gate:
        await api.record(await _session(sid), api.Message(role="user", content=talk(50)))
        bot.chat_usage = 5000
        await api.run_turn(sid, None, api.Entry("onebot.group"))
        await gate.reached()
        with pytest.raises(api.CompressionError) as err:
            await api.compress(sid)
        assert "这个会话正在压缩" in str(err.value)
        await api.clear(sid)
    await settle(runtime.get())
    assert [(p.phase, p.reason) for p in bot.progress] == [("start", None), ("error", "压缩期间会话被清空")]
    status = await api.status(sid)
    assert status.summary is None
    assert status.backoff_failures == 0
    assert await api.history(sid) == []


async def test_r_inj_2_the_summary_is_injected_whole(build: Build) -> None:
    bot = await build()
    long = (
        "## 最近在聊什么\n"
        + "甲(1) 说了很多很多话。" * 400
        + "\n## 谁有问题没回应\n无\n## 关键原话要点\n末尾标记"
    )
    bot.summary_reply = lambda body: Reply(f"【保留原文】无\n{long}")
    s = group("onebot:group:63")
    await summarise(bot, s)
    await api.record(s, api.Message(role="user", content="[乙(2)] 新的一条"))
    prompt = await api.build_prompt(s.id, api.Entry("onebot.group"))
    assert any(long in str(m["content"]) for m in prompt.messages)


async def test_r_back_3_waits_grow_to_32_turns_then_stay(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:70"
    await fill(sid, 2200)
    bot.summary_reply = failing
    runs = []
    for n in range(1, 128):
        before = bot.starts(sid)
        await bot.turn(sid, f"[甲(1)] {n}", used=5000)
        if bot.starts(sid) > before:
            runs.append(n)
    assert runs == [1, 3, 7, 15, 31, 63, 95, 127]


async def test_r_trig_4_a_silent_answer_adds_no_reply(build: Build) -> None:
    """history_limit 5: 4 at the start; a reply would make 5, a silent turn stays at 4."""
    bot = await build(memsum_history_limit=5, memsum_compress_at=0)
    sid = "onebot:group:71"
    await say(sid, 3)
    bot.chat_script = [Reply("[不回复]", usage=usage(10))]
    assert await bot.turn(sid, talk(3), used=10) == "silent"
    assert bot.starts(sid) == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [("memsum_history_limit", -1), ("memsum_tiers", {"onebot.group": {"history_limit": -2}})],
)
def test_r_cfg_6_a_negative_count_line_is_refused_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ValidationError) as err:
        Config.model_validate({key: value})
    assert "history_limit" in str(err.value)


async def test_r_inj_1_after_contributions_right_before_the_history(build: Build) -> None:
    bot = await build()
    api.contribute("weather", lambda sid: "今天晴")
    s = group("onebot:group:72")
    await summarise(bot, s)
    await api.record(s, api.Message(role="user", content="[乙(2)] 新的一条"))
    msgs = (await api.build_prompt(s.id, api.Entry("onebot.group"))).messages
    at = next(i for i, m in enumerate(msgs) if "约大家周末爬山" in str(m["content"]))
    assert any("今天晴" in str(m["content"]) for m in msgs[:at])
    assert msgs[at]["role"] == "system"
    assert msgs[at + 1] == {"role": "user", "content": "[乙(2)] 新的一条"} or msgs[at + 1]["role"] == "user"


@pytest.mark.parametrize(("entry", "due"), [("onebot.group", True), ("onebot.private", False)])
async def test_r_trig_2_lines_resolve_by_the_entry_platform(build: Build, entry: str, due: bool) -> None:
    """An internal session has no birth platform: the tier of the platform each turn came in
    through gives both lines."""
    bot = await build(memsum_compress_at=0, memsum_tiers={"onebot.group": {"history_limit": 4}})
    s = await api.internal_session(f"myplugin:{entry}")
    await say(s, 3)
    await api.run_turn(s.id, None, api.Entry(entry))
    await settle(runtime.get())
    assert bot.starts(s.id) == (1 if due else 0)


@pytest.mark.parametrize(("entry", "due"), [("onebot.group", True), ("onebot.private", False)])
async def test_r_trig_3_usage_line_by_the_entry_platform(build: Build, entry: str, due: bool) -> None:
    bot = await build(memsum_compress_at=0.8, memsum_tiers={"onebot.group": {"compress_at": 0.5}})
    s = await api.internal_session(f"myplugin:u-{entry}")
    total = 0
    i = 0
    while total < 2200:
        text = talk(i, 300)
        await api.record(s, api.Message(role="user", content=text))
        total += estimate_text_tokens(text)
        i += 1
    bot.chat_usage = 4500  # over 0.5 × 8000, under 0.8 × 8000
    await api.run_turn(s.id, None, api.Entry(entry))
    await settle(runtime.get())
    assert bot.starts(s.id) == (1 if due else 0)


@pytest.mark.parametrize(("glob", "tier", "answer"), [(0, 0.5, 0.5), (0.8, 0, None)])
async def test_r_cfg_2_4_a_tier_turns_the_usage_line_on_or_off(
    build: Build, glob: float, tier: float, answer: float | None
) -> None:
    bot = await build(memsum_compress_at=glob, memsum_tiers={"onebot.group": {"compress_at": tier}})
    sid = "onebot:group:80"
    await fill(sid, 2200)
    assert await api.compress_at(sid, "onebot", "group") == answer
    await bot.turn(sid, used=5000)
    assert bot.starts(sid) == (1 if answer else 0)


async def test_r_trig_3_status_line_is_the_smaller_of_line_and_trim_budget(build: Build) -> None:
    """compress_at 1.0 × 8000 is over the trim budget 6976: the line in force is 6976."""
    bot = await build(memsum_compress_at=1.0)
    sid = "onebot:group:81"
    await bot.turn(sid, used=100)
    assert (await api.status(sid)).line == 6976


async def test_r_trig_3_a_turn_that_would_be_trimmed_compresses_once(build: Build) -> None:
    """README Decisions: the turn compresses first, then sends a request that fits; its own
    end is not judged, so there is no second run."""
    bot = await build(memsum_compress_at=1.0)
    sid = "onebot:group:82"
    await fill(sid, 8000)
    assert await bot.turn(sid, talk(99), used=1000) == "replied"
    assert bot.starts(sid) == 1
    assert [b["model"] for b in bot.llm.requests] == [SUM, CHAT]
    chat = bot.llm.requests[1]
    assert any("约大家周末爬山" in str(m["content"]) for m in chat["messages"])
    assert chat["messages"][-1]["content"] == talk(99)


def keep_all(body: dict[str, Any]) -> Reply:
    """A summariser that asks to keep every number it was offered."""
    numbers = sorted(set(re.findall(r"#(\d+)〔约", body["messages"][1]["content"])), key=int)
    return Reply(f"【保留原文】{'、'.join(numbers) or '无'}\n" + NOTHING_KEPT.split("\n", 1)[1])


def conversation(history: list[api.Message]) -> list[api.Message]:
    return [m for m in history if not m.event_marker and m.role != "system"]


async def test_r_prog_2_only_a_divider_left_is_nothing_to_do(build: Build) -> None:
    bot = await build()
    s = group("onebot:group:90")
    await summarise(bot, s)
    progress, requests = len(bot.progress), len(bot.summary_requests())
    await api.compress(s.id)
    assert (len(bot.progress), len(bot.summary_requests())) == (progress, requests)


async def test_r_trig_5_the_background_skips_a_session_already_compressing(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:91"
    await fill(sid, 2200)
    gate = bot.hold = Gate(holds=lambda body: body["model"] == SUM)
    with gate:
        manual = asyncio.create_task(api.compress(sid))
        await gate.reached()
        await api.record(await _session(sid), api.Message(role="user", content=talk(50)))
        bot.chat_usage = 5000
        assert await api.run_turn(sid, None, api.Entry("onebot.group")) == "replied"
    await manual
    await settle(runtime.get())
    assert bot.starts(sid) == 1


async def test_r_back_2_count_hysteresis_no_run_until_the_line_again(build: Build) -> None:
    """history_limit 6: after the count compression at most 3 are active, so the next turn
    (3 + question + reply = 5) does not run, the one after it (7) does."""
    bot = await build(memsum_history_limit=6, memsum_compress_at=0, memsum_summary_budget_ratio=0.5)
    bot.summary_reply = keep_all
    sid = "onebot:group:92"
    await say(sid, 4, 10)
    runs = []
    for n in range(1, 4):
        before = bot.starts(sid)
        await bot.turn(sid, talk(10 + n, 10), used=10)
        if bot.starts(sid) > before:
            runs.append(n)
        assert len(conversation(await api.history(sid))) <= (3 if bot.starts(sid) > before else 6)
    assert runs[0] == 1
    assert 2 not in runs


@pytest.mark.parametrize(("arrivals", "kept_at_most"), [(3, 1), (4, 0)])
async def test_r_back_2_messages_arriving_during_the_run_count(
    build: Build, arrivals: int, kept_at_most: int
) -> None:
    """history_limit 8 (half: 4): messages that come while the summariser works are after the
    cut; kept originals only fill what is left of the half, none when they reach it."""
    bot = await build(memsum_history_limit=8, memsum_summary_budget_ratio=0.5)
    bot.summary_reply = keep_all
    s = group(f"onebot:group:93{arrivals}")
    await say(s, 8, 10)
    gate = bot.hold = Gate(holds=lambda body: body["model"] == SUM)
    with gate:
        run = asyncio.create_task(api.compress(s.id))
        await gate.reached()
        for i in range(arrivals):
            await api.record(s, api.Message(role="user", content=talk(50 + i, 10)))
    result = await run
    assert result.outcome == "done"
    active = conversation(await api.history(s.id))
    assert len(active) - arrivals <= kept_at_most
    assert len(active) <= 4 or kept_at_most == 0


async def test_r_back_1_kept_originals_within_ratio_of_what_was_compressed(build: Build) -> None:
    bot = await build(chat={"context_window": 32000})
    bot.summary_reply = keep_all
    s = group("onebot:group:94")
    total = 0
    for i in range(12):
        text = talk(i, 200)
        await api.record(s, api.Message(role="user", content=text))
        total += estimate_text_tokens(text)
    await api.compress(s.id)
    kept = conversation(await api.history(s.id))
    assert sum(estimate_text_tokens(m.content) for m in kept) <= 0.1 * total


async def test_r_cfg_5_then_the_global_preference_then_priority(build: Build) -> None:
    def models(llm: ScriptedLLM) -> list[dict[str, Any]]:
        return [
            llm.model_config("t/low", model="low-m", priority=1),
            llm.model_config("t/high", model="high-m", priority=5),
        ]

    bot = await build(models=models, memsum_summary_model="t/missing", memsum_preferred_model="t/low")
    bot.llm.on_request(lambda body: Reply(NOTHING_KEPT))
    session = group("onebot:group:95")
    await api.record(session, api.Message(role="user", content=talk(1)))
    await api.compress(session.id)
    assert [b["model"] for b in bot.llm.requests] == ["low-m"]


async def test_r_cfg_6_both_lines_off_nothing_compresses(build: Build) -> None:
    bot = await build(memsum_compress_at=0, memsum_history_limit=0)
    sid = "onebot:group:96"
    await say(sid, 40, 10)
    await bot.turn(sid, used=6900)
    assert bot.starts(sid) == 0


async def test_r_inj_1_every_call_of_a_turn_carries_the_summary(build: Build) -> None:
    bot = await build()
    api.tool("lookup", "查一下", {"type": "object", "properties": {}})(lambda ctx, args: "查到了")
    s = group("onebot:group:97")
    await summarise(bot, s)
    bot.chat_script = [tool_call(), Reply("好的", usage=usage(10))]
    _SESSIONS[s.id] = s
    await bot.turn(s.id, "[乙(2)] 查一下")
    chats = [b for b in bot.llm.requests if b["model"] == CHAT]
    assert len(chats) == 2
    for body in chats:
        assert sum("约大家周末爬山" in str(m["content"]) for m in body["messages"]) == 1


async def test_r_trig_1_a_failed_turns_snapshot_still_gives_the_line(build: Build) -> None:
    """The snapshot taken before the call counts for the budget (R-TRIG-1) though the call
    failed: a manual run then writes to E = 0.8 × 32000 (budget 2560, max_tokens 3840),
    not to what is compressed."""
    bot = await build(chat={"context_window": 32000})
    sid = "onebot:group:98"
    await fill(sid, 3200)
    bot.chat_script = [Reply(status=400, error="bad request")]
    assert await bot.turn(sid) == "error"
    await api.compress(sid)
    assert max_tokens(bot.summary_requests()[-1]) == 3840


async def test_r_back_4_clearing_the_summary_alone_forgets_the_back_off(build: Build) -> None:
    bot = await build(memsum_compress_at=0.5)
    sid = "onebot:group:99"
    await failed_once(bot, sid)
    await api.clear(sid, "summary")
    assert (await api.status(sid)).backoff_failures == 0


async def test_r_mem_3_clearing_the_summary_cancels_a_running_compression(build: Build) -> None:
    """The run read the old summary as its input; a clear of `summary` while the model works
    cancels it, so the cleared summary is not written back inside the new one."""
    bot = await build()
    s = group("onebot:group:100")
    await summarise(bot, s)
    for i in range(3):
        await api.record(s, api.Message(role="user", content=talk(10 + i)))
    gate = bot.hold = Gate(holds=lambda body: body["model"] == SUM)
    with gate:
        run = asyncio.create_task(api.compress(s.id))
        await gate.reached()
        await api.clear(s.id, "summary")
    with pytest.raises(api.CompressionError) as err:
        await run
    assert "压缩期间会话被清空" in str(err.value)
    assert (await api.status(s.id)).summary is None
    assert len(conversation(await api.history(s.id))) == 3


async def test_r_bud_1_a_count_run_writes_to_the_trim_budget_line(build: Build) -> None:
    """compress_at 0 and a count line: the run the count started still has a line, the trim
    budget 6976 (R-BUD-1); its budget 697 is lifted to the floor 1000, max_tokens 1500, not
    set from what is compressed (about 1800 tokens here, as with no usage)."""
    bot = await build(memsum_compress_at=0, memsum_history_limit=6)
    sid = "onebot:group:102"
    await say(sid, 4, 400)
    await bot.turn(sid, talk(9), used=10)
    assert bot.starts(sid) == 1
    assert max_tokens(bot.summary_requests()[-1]) == 1500
