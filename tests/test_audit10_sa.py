"""Audit 10, angle SA: the specification read literally, sentence by sentence, for R-CFG,
R-TPL, R-BUD and R-INJ, written as an outsider who has read only
spec/plugin-memory-summary.zh.md, REQUIREMENTS.md and DESIGN.md would write them: the
public library API (`nonebot_plugin_memsum.api`) on a runtime with a real SQLite file and
the scripted OpenAI-compatible server on real HTTP, and bot.py with the OneBot simulator
where a QQ place's mode matters.

Expected sizes are worked out here from the spec's arithmetic, never read back from the
product: E = min(compress_at × window, trim budget) (trim budget = window − 1024 for these
models), budget = E × summaryBudgetRatio, at most what is compressed, at least 1000, at
most E / 4, at most ⅔ × min(max output (4096 unknown), window / 4) of the summary model;
max_tokens = ⌈1.5 × budget⌉ (R-BUD-1..7).
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.compression.service import INJECTION_HEAD
from nonebot_plugin_memsum.types import SessionRecord
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    Env,
    Make,
    seed,
    settle,
    stated,
    units_tokens,
    usage,
)

# A summary model that binds nothing here: window 200000, max output 8192 (⅔ cap 5461).
BIG_SUMMARY = {"context_window": 200000, "max_output_tokens": 8192}


def long_line(i: int) -> str:
    """A member's line of about 480 characters, labelled as the OneBot layer labels it."""
    return f"[成员{i}(2{i:04d})] 第{i}条：" + "周末去哪里爬山这件事还得再商量一下" * 28


async def record_lines(env: Env, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await api.record(GROUP, api.Message(role="user", content=long_line(i), ts=1000.0 + i))
        await settle(env.rt)


@pytest.fixture
def on_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point the library API at a test's own runtime (it answers for the plugin's runtime)."""

    def use(env: Env) -> Env:
        monkeypatch.setattr(runtime, "_current", env.rt)
        return env

    return use


# ---- R-BUD-1 in a 仅记录 place ---------------------------------------------------------------
async def test_r_bud_1_a_record_only_groups_compression_writes_to_the_line_that_judged_it(
    make: Make, on_env: Any
) -> None:
    # A 仅记录 group (record and compress, never answer) on an 8k chat model: its lines are
    # judged after each recorded message against E = min(0.8 × 8000, 8000 − 1024) = 6400.
    # R-BUD-1: the budget is E × 0.1 = 640, lifted to the floor 1000 (under E / 4 = 1600),
    # whatever triggered the run; max_tokens ⌈1.5 × 1000⌉ = 1500. The product took no line
    # (no model call, so no usage) and asked for what was compressed, ~3000 tokens: a
    # summary of nearly half the line, sent with every turn once the group is switched on.
    env = on_env(
        await make(
            chat={"context_window": 8000},
            summary=BIG_SUMMARY,
            memsum_default_mode="record",
            memsum_history_limit=10,
        )
    )
    await record_lines(env, 10)  # the count line: 10 messages
    (request,) = env.model.summary_requests()
    assert env.model.chat_requests() == []  # 仅记录 never answers
    assert units_tokens([api.Message(role="user", content=long_line(i)) for i in range(10)]) > 2000
    budget, keep_cap = stated(request)
    assert budget == 1000
    assert request["max_tokens"] == 1500
    assert 0 < keep_cap <= 1000
    # R-INJ-1: the summary is then the last system message before the history of a prompt.
    prompt = await api.build_prompt(GROUP.id, IN_GROUP)
    systems = [m for m in prompt.messages if m["role"] == "system"]
    assert str(systems[-1]["content"]).startswith(INJECTION_HEAD)
    assert prompt.messages.index(systems[-1]) == len(systems) - 1

    # A /压缩 in the same group later (R-BUD-1: a manual run too) uses the same line.
    await record_lines(env, 6, start=10)
    await api.compress(GROUP.id)
    last = env.model.summary_requests()[-1]
    assert stated(last)[0] == 1000
    assert last["max_tokens"] == 1500


async def test_r_bud_1_a_record_only_group_in_a_real_bot_writes_a_summary_sized_to_its_line(
    tmp_path: Path,
) -> None:
    # The same through bot.py and the OneBot simulator over the real WebSocket:
    # MEMSUM_DEFAULT_MODE=record, MEMSUM_HISTORY_LIMIT=10, an 8k chat model. The tenth
    # member's line reaches the count line; the summary request states the budget of the
    # line, 1000 (E = 6400), not the ~3000 tokens the group said.
    from tests.fakes.e2e import group_sid, running_bot, until, wait_rows

    group = 97101
    with ScriptedLLM() as llm:
        llm.on_request(lambda body: Reply(f"【保留原文】无\n{CHAT_SUMMARY}"))
        env = {
            "MEMSUM_MODELS": json.dumps(
                [
                    llm.model_config("test/chat", context_window=8000, priority=1),
                    llm.model_config("test/sum", **BIG_SUMMARY),
                ]
            ),
            "MEMSUM_CHAT_MODEL": "test/chat",
            "MEMSUM_SUMMARY_MODEL": "test/sum",
            "MEMSUM_DEFAULT_MODE": "record",
            "MEMSUM_HISTORY_LIMIT": "10",
        }
        async with running_bot(tmp_path, env) as (bot, sim):
            for i in range(10):
                words = "周末去哪里爬山这件事还得再商量一下" * 28
                await sim.group_message(group, 20001 + i, words, nickname=f"成员{i}")
            await wait_rows(bot, group_sid(group), 10)

            async def asked() -> bool:
                return len(llm.requests) >= 1

            await until(asked, "the summary request")
        (request,) = list(llm.requests)
    assert str(request["messages"][0]["content"]).startswith("你是对话摘要员")
    assert stated(request)[0] == 1000
    assert request["max_tokens"] == 1500


# ---- R-BUD-1 / R-CFG-2: the line in force when the run starts ------------------------------
async def test_r_bud_1_a_line_the_owner_lowered_after_the_last_turn_sizes_the_next_compression(
    make: Make, on_env: Any
) -> None:
    # Chat window 10000, the global 0.8: E = 8000 at the last turn. The owner then sets this
    # session's line to 0.3 (/压缩线 0.3): E = 3000 for the next compression; × 0.1 = 300,
    # floor 1000, E / 4 = 750 wins; max_tokens ⌈1125⌉.
    env = on_env(await make(chat={"context_window": 10000}, summary=BIG_SUMMARY))
    rt, model = env.rt, env.model
    await seed(rt, 20, size=110)
    model.chat.append(Reply("好的", usage=usage(500)))
    assert await api.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    assert model.summary_requests() == []  # 500 is far under E = 8000
    await rt.settings.set("compress_at", "session", GROUP.id, 0.3)
    assert await api.compress_at(GROUP.id, "onebot", "group") == 0.3  # R-CFG-4's answer
    await api.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert stated(request)[0] == 750
    assert request["max_tokens"] == 1125


# ---- R-BUD-3: the floor holds above what is compressed -------------------------------------
async def test_r_bud_3_a_short_span_under_a_large_line_still_gets_the_floor(make: Make, on_env: Any) -> None:
    # E = min(0.8 × 32000, 32000 − 1024) = 25600; × 0.1 = 2560; what is compressed is only a
    # few short lines (R-BUD-2 brings it far under 1000), and the floor lifts the two together
    # to 1000 (E / 4 = 6400 does not bind): "要压的很少时也留够写全各小节". max_tokens 1500.
    env = on_env(await make(summary=BIG_SUMMARY))
    rt, model = env.rt, env.model
    await seed(rt, 4)
    assert await api.run_turn(GROUP.id, entry=IN_GROUP) == "replied"
    await settle(rt)
    content = units_tokens(await rt.store.get_history(GROUP.id))
    assert content < 300
    await api.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert stated(request) == (1000, math.floor(Fraction(1, 10) * content))  # R-BUD-4
    assert request["max_tokens"] == 1500


# ---- R-TPL-1/2 through the library API ------------------------------------------------------
async def test_r_tpl_1_2_a_one_to_one_chat_and_its_child_through_the_api(make: Make, on_env: Any) -> None:
    # A one-to-one session with a peer who is not an owner: the chat template; a child of it
    # (a task the chat spawned): the work template, though its parent is a chat (R-TPL-2).
    env = on_env(await make(summary=BIG_SUMMARY))
    model = env.model
    peer = SessionRecord(
        id="onebot:private:20077", platform="onebot", kind="private", peer="20077", room_class="direct"
    )
    await api.record(peer, api.Message(role="user", content="[路人(20077)] 帮我记一下明天交报告"))
    child = await api.child_session(peer.id, "task:20077:1")
    await api.record(child, api.Message(role="user", content="整理报告的提纲"))
    await api.compress(peer.id)
    model.summary_default = Reply(
        "【保留原文】无\n## 目标\n提纲\n## 做过的决定\n无\n## 改过的文件\n无\n## 未完成的事\n无"
    )
    await api.compress(child.id)
    chat_req, work_req = model.summary_requests()
    chat_system, work_system = chat_req["messages"][0]["content"], work_req["messages"][0]["content"]
    titles = ["「## 最近在聊什么」", "「## 谁有问题没回应」", "「## 关键原话要点」"]
    assert [chat_system.index(t) for t in titles] == sorted(chat_system.index(t) for t in titles)
    assert "「## 目标」" not in chat_system
    assert "「昵称(ID)」" in chat_system  # R-TPL-4: the chat template alone asks for it
    work_titles = ["「## 目标」", "「## 做过的决定」", "「## 改过的文件」", "「## 未完成的事」"]
    assert [work_system.index(t) for t in work_titles] == sorted(work_system.index(t) for t in work_titles)
    assert "「## 最近在聊什么」" not in work_system
    assert "「昵称(ID)」" not in work_system
