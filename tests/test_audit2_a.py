"""A second outside audit of R-CFG, R-TPL, R-INJ and R-BUD: black-box scenarios written from
the Chinese original, through the runtime on a real SQLite file, the public `api`, the
commands (nonebug) and the scripted OpenAI-compatible server on 127.0.0.1. Each checks a
boundary, a combination of layers or rules, or an exact string that tests/test_audit_a.py,
tests/test_audit_b.py and the unit tests do not already check."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import pytest
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.turn import Entry
from nonebot_plugin_memsum.compression.service import INJECTION_HEAD
from nonebot_plugin_memsum.compression.templates import CHAT, WORK, system_prompt
from nonebot_plugin_memsum.config import ConfigError, parse_config
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import SessionRecord
from tests.fakes.llm_server import Reply
from tests.fakes.nonebug import SELF_ID, group_msg, new_group, run, usage_event
from tests.fakes.service import (
    CHAT_SUMMARY,
    GROUP,
    IN_GROUP,
    OWNER,
    WORK_SUMMARY,
    Env,
    Make,
    existing_summary_of,
    held_compression,
    keeping,
    offered,
    seed,
    settle,
    stated,
    system_of,
    units_tokens,
    usage,
    user_of,
)

CHAT_TITLES = ("最近在聊什么", "谁有问题没回应", "关键原话要点")
WORK_TITLES = ("目标", "做过的决定", "改过的文件", "未完成的事")
PRIVATE = SessionRecord(
    id="onebot:private:20002", platform="onebot", kind="private", peer="20002", room_class="direct"
)
INTERNAL = SessionRecord(id="audit2:internal", platform=None, kind="internal")


def titles_asked(body: dict[str, Any]) -> tuple[str, ...]:
    """The section titles the summariser's system prompt asks for, in order (R-TPL-4)."""
    return tuple(re.findall(r"「## ([^」]+)」", system_of(body)))


async def put_summary(rt: Any, text: str, template: str) -> None:
    record = {"text": text, "template": template, "time": 1.0, "kept_messages": 0}
    await rt.store.put_meta(SUMMARY_NAMESPACE, GROUP.id, record)


def summary_message(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The one message of a chat request that carries the summary (R-INJ-1), and its index."""
    carrying = [(i, m) for i, m in enumerate(body["messages"]) if INJECTION_HEAD in str(m["content"])]
    assert len(carrying) == 1, body["messages"]
    return carrying[0]


async def turn(env: Env, session: SessionRecord = GROUP, used: int = 100, entry: Entry = IN_GROUP) -> str:
    env.model.chat.append(Reply("好的", usage=usage(used)))
    outcome = await env.rt.agent.run_turn(session.id, entry=entry)
    await settle(env.rt)
    return outcome


# ---- R-CFG-1 -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (
            {"memsum_tiers": {"onebot.group": {"compress_at": 1.01}}},
            "MEMSUM_TIERS[onebot.group][compress_at]",
        ),
        (
            {"memsum_tiers": {"onebot.private": {"compress_at": -0.1}}},
            "MEMSUM_TIERS[onebot.private][compress_at]",
        ),
        ({"memsum_tiers": {"onebot": {"history_limit": -1}}}, "MEMSUM_TIERS[onebot][history_limit]"),
        ({"memsum_summary_budget_ratio": -0.01}, "MEMSUM_SUMMARY_BUDGET_RATIO"),
        ({"memsum_compress_at": 1.01}, "MEMSUM_COMPRESS_AT"),
        ({"memsum_compress_at": "八成"}, "MEMSUM_COMPRESS_AT"),
    ],
)
def test_r_cfg_1_a_tier_or_plugin_value_outside_its_range_is_refused_naming_it(
    raw: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(raw)
    assert str(refused.value).startswith(f"invalid {key}")
    assert "\n" not in str(refused.value)


def test_r_cfg_1_a_tier_line_at_both_ends_of_its_range_is_allowed() -> None:
    config = parse_config(
        {"memsum_tiers": {"onebot.group": {"compress_at": 0}, "onebot.private": {"compress_at": 1}}}
    )
    assert config.memsum_tiers["onebot.group"].compress_at == 0
    assert config.memsum_tiers["onebot.private"].compress_at == 1


# ---- R-CFG-2 / R-CFG-4: a zero on a higher layer is a value, not "unset" -----------------------
async def test_r_cfg_4_zero_on_a_higher_layer_turns_the_line_off_and_a_value_over_a_zero_turns_it_on(
    make: Make,
) -> None:
    env = await make(
        memsum_compress_at=0,
        memsum_tiers={"onebot": {"compress_at": 0.6}, "onebot.group": {"compress_at": 0}},
    )
    service, settings = env.rt.compression, env.rt.settings
    await seed(env.rt, 1)
    await seed(env.rt, 1, record=PRIVATE)
    await env.rt.store.save_session(INTERNAL)
    # The group's type tier says 0 over the platform tier's 0.6: off.
    assert await service.compress_at(GROUP.id, "onebot", "group") is None
    # A private chat has no type tier: the platform tier's 0.6 over the global 0.
    assert await service.compress_at(PRIVATE.id, "onebot", "private") == 0.6
    # No birth platform: the tier of the platform it came in through; none: the global 0.
    assert await service.compress_at(INTERNAL.id, "onebot", "private") == 0.6
    assert await service.compress_at(INTERNAL.id, "onebot", "group") is None
    assert await service.compress_at(INTERNAL.id) is None
    # The session's own value over the type tier's 0 turns the line on, and its own 0 off again.
    await settings.set("compress_at", "session", GROUP.id, 0.45)
    assert await service.compress_at(GROUP.id, "onebot", "group") == 0.45
    await settings.set("compress_at", "session", PRIVATE.id, 0)
    assert await service.compress_at(PRIVATE.id, "onebot", "private") is None


async def test_r_cfg_4_the_compression_service_answers_compress_at_through_the_api(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 压缩服务的 compressAt(sessionId, platform) 交出这个会话的生效值（0 时为 undefined）: the
    # service other plugins get is `api`.
    from nonebot_plugin_memsum import api

    env = await make(memsum_tiers={"onebot.private": {"compress_at": 0}})
    monkeypatch.setattr(runtime, "get", lambda: env.rt)
    await seed(env.rt, 1)
    internal = await api.internal_session("audit2:cron")
    assert await api.compress_at(GROUP.id) == 0.8
    assert await api.compress_at(internal.id, "onebot", "private") is None
    await env.rt.settings.set("compress_at", "session", GROUP.id, 0.25)
    assert await api.compress_at(GROUP.id, "onebot", "group") == 0.25


async def test_r_cfg_6_a_session_count_line_of_zero_switches_off_the_tiers_count_line(make: Make) -> None:
    env = await make(memsum_tiers={"onebot.group": {"history_limit": 4}})
    rt, model = env.rt, env.model
    history = await seed(rt, 10)
    await rt.settings.set("history_limit", "session", GROUP.id, 0)
    assert await turn(env) == "replied"
    assert model.summary_requests() == []  # no count line: 10 + 1 ≥ 4 is not due
    # No count trimming either: all ten lines are sent.
    sent = [m["content"] for m in model.chat_requests()[-1]["messages"] if m["role"] == "user"]
    assert sent == [m.content for m in history]
    # Back to the tier's 4: the next turn is due by count.
    await rt.settings.reset("history_limit", "session", GROUP.id)
    assert await turn(env) == "replied"
    assert len(model.summary_requests()) == 1


# ---- R-CFG-3 -------------------------------------------------------------------------------------
async def test_r_cfg_3_a_child_keeps_its_tier_value_when_the_parents_place_and_session_change(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nonebot_plugin_memsum import api

    env = await make(memsum_tiers={"onebot.group": {"compress_at": 0.3, "history_limit": 8}})
    rt = env.rt
    monkeypatch.setattr(runtime, "get", lambda: rt)
    await seed(rt, 1)
    child = await api.child_session(GROUP.id, "audit2:child")
    await rt.settings.set("compress_at", "place", "onebot:group:1", 0.6)
    await rt.settings.set("history_limit", "place", "onebot:group:1", 20)
    await rt.settings.set("compress_at", "session", GROUP.id, 0.7)
    assert (await rt.settings.effective("compress_at", GROUP.id)).value == 0.7
    at = await rt.settings.effective("compress_at", child.id)
    limit = await rt.settings.effective("history_limit", child.id)
    assert (at.value, at.layer) == (0.3, "session")
    assert (limit.value, limit.layer) == (8, "session")
    assert await api.compress_at(child.id) == 0.3


async def test_r_cfg_3_a_child_of_a_session_with_the_line_off_starts_with_it_off(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nonebot_plugin_memsum import api

    env = await make()
    rt = env.rt
    monkeypatch.setattr(runtime, "get", lambda: rt)
    await seed(rt, 1)
    await rt.settings.set("compress_at", "session", GROUP.id, 0)
    child = await api.child_session(GROUP.id, "audit2:child-off")
    await rt.settings.set("compress_at", "session", GROUP.id, 0.5)
    assert await rt.compression.compress_at(child.id) is None


# ---- R-CFG-2 + R-TRIG-3 + R-BUD-1: the place layer over a type tier ------------------------------
async def test_r_cfg_2_the_groups_own_line_beats_its_type_tier_for_trigger_and_budget(make: Make) -> None:
    # Chat window 10000, trim budget 8976. The type tier says 0.3 (E 3000), the group's own
    # layer 0.5: E = 5000. A usage of 3000 is then not due; 5000 is. Budget 5000 × 0.1 = 500,
    # lifted to the floor 1000 (E / 4 = 1250 does not bind): 1000, max_tokens 1500.
    env = await make(chat={"context_window": 10000}, memsum_tiers={"onebot.group": {"compress_at": 0.3}})
    rt, model = env.rt, env.model
    await rt.settings.set("compress_at", "place", "onebot:group:1", 0.5)
    await seed(rt, 30, size=120)
    await turn(env, used=3000)
    assert model.summary_requests() == []
    await turn(env, used=5000)
    (request,) = model.summary_requests()
    assert stated(request)[0] == 1000
    assert request["max_tokens"] == 1500


async def test_r_cfg_2_compress_at_and_summary_show_the_trim_budget_when_it_is_the_smaller_line(
    app: App,
) -> None:
    # 会话服务的用量条目与界面的压缩线给的就是这个较小值: min(0.8 × 64000, 30000) = 30000.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage_event(sid, 1000, window=64000, trim_budget=30000)
    await run(app, group_msg("/压缩线", group), "压缩线 0.8（全局配置）；生效线 30000 token（窗口 64000）")
    status = await runtime.get().compression.status(sid)
    assert status.line == 30000


# ---- R-TPL through the OneBot session records ----------------------------------------------------
@pytest.mark.parametrize(
    ("record", "titles"),
    [
        pytest.param(group_record(SELF_ID, 777), CHAT_TITLES, id="group_chat"),
        pytest.param(private_record(SELF_ID, 20002), CHAT_TITLES, id="private_member_chat"),
        pytest.param(private_record(SELF_ID, OWNER), WORK_TITLES, id="private_owner_work"),
    ],
)
async def test_r_tpl_1_2_the_template_of_the_sessions_onebot_makes(
    env: Env, record: SessionRecord, titles: tuple[str, ...]
) -> None:
    await seed(env.rt, 3, record=record)
    await env.rt.compression.compress(record.id)
    (request,) = env.model.summary_requests()
    assert titles_asked(request) == titles


async def test_r_tpl_2_a_child_made_through_the_api_under_a_group_uses_the_work_template(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nonebot_plugin_memsum import api

    monkeypatch.setattr(runtime, "get", lambda: env.rt)
    await seed(env.rt, 1)
    child = await api.child_session(GROUP.id, "audit2:task")
    for i in range(3):
        await api.record(child, api.Message(role="user", content=f"[甲(1)] 子任务第{i}步", ts=2000.0 + i))
    env.model.summary.append(Reply(f"【保留原文】无\n{WORK_SUMMARY}"))
    await api.compress(child.id)
    (request,) = env.model.summary_requests()
    assert titles_asked(request) == WORK_TITLES
    assert "昵称(ID)" not in system_of(request)


# ---- R-TPL-1/2/4: each section's guidance as the original words it -------------------------------
@pytest.mark.parametrize(
    ("template", "guidance"),
    [
        (
            CHAT,
            {
                "最近在聊什么": ["按话题分段", "写明发言人"],
                "谁有问题没回应": ["点名提问或请求、还没得到回答的人与问题"],
                "关键原话要点": ["承诺、约定、数字、链接、对助手的请求", "保留发言人与原文要点"],
            },
        ),
        (
            WORK,
            {
                "目标": ["要做成什么", "最近一次请求照录原话"],
                "做过的决定": ["定下与放弃的方案及理由"],
                "改过的文件": ["路径与改了什么", "只依据工具调用记录"],
                "未完成的事": ["待办列表的状态", "下一步"],
            },
        ),
    ],
)
def test_r_tpl_4_every_section_carries_the_originals_guidance(
    template: Any, guidance: dict[str, list[str]]
) -> None:
    prompt = system_prompt(template, budget=1500, keep_cap=100)
    lines = {t: line for line in prompt.splitlines() for t in guidance if line.startswith(f"「## {t}」")}
    assert set(lines) == set(guidance)
    for title, phrases in guidance.items():
        for phrase in phrases:
            assert phrase in lines[title], (title, phrase)


# ---- R-TPL-5 across the chunks of one compression ------------------------------------------------
async def test_r_tpl_5_each_chunk_merges_or_folds_by_the_summary_it_gets(make: Make) -> None:
    # The stored summary is the work template's (the session changed template): the first
    # request folds it. The first chunk answers in the chat sections: the second merges. The
    # second answers without structure: the third folds again.
    env = await make(summary={"context_window": 6000}, memsum_capacity="spec")
    rt, model = env.rt, env.model
    await put_summary(rt, WORK_SUMMARY, "work")
    await seed(rt, 60, size=80)
    plain = "大家聊了很多，没有结构。"
    model.summary.extend([Reply(f"【保留原文】无\n{CHAT_SUMMARY}"), Reply(f"【保留原文】无\n{plain}")])
    await rt.compression.compress(GROUP.id)
    requests = model.summary_requests()
    assert len(requests) >= 3
    fold = "按意思归入「最近在聊什么」「谁有问题没回应」「关键原话要点」"
    merge = "请在同名小节上合并更新"
    first, second, third = (user_of(r) for r in requests[:3])
    assert existing_summary_of(requests[0]) == WORK_SUMMARY
    assert fold in first
    assert merge not in first
    assert existing_summary_of(requests[1]) == CHAT_SUMMARY
    assert merge in second
    assert fold not in second
    assert existing_summary_of(requests[2]) == plain
    assert fold in third
    assert merge not in third


# ---- R-INJ ---------------------------------------------------------------------------------------
async def test_r_inj_2_the_head_is_the_same_for_every_session_template_and_kept_count(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    owner = private_record(SELF_ID, OWNER)
    short = await seed(rt, 2, size=2)
    await seed(rt, 2, start=2, size=300)
    model.summary.append(keeping(short[0].content))
    assert (await rt.compression.compress(GROUP.id)).kept_messages == 1
    await seed(rt, 3, record=owner, start=10)
    model.summary.append(Reply(f"【保留原文】无\n{WORK_SUMMARY}"))
    assert (await rt.compression.compress(owner.id)).kept_messages == 0
    heads = []
    for session, text in ((GROUP, CHAT_SUMMARY), (owner, WORK_SUMMARY)):
        prompt = await rt.agent.build_prompt(session.id, Entry("onebot", session.kind))
        (carrying,) = [m for m in prompt.messages if text in str(m["content"])]
        assert carrying["role"] == "system"
        head, body = carrying["content"].split("\n\n", 1)
        assert body == text
        heads.append(head)
    assert heads[0] == heads[1] == INJECTION_HEAD
    # What the head says (the original's first sentence): kept originals, if any, come first in
    # the history in their original order, and the summary covers them already.
    for words in ("保留的原文", "原来的时间顺序", "历史开头", "概括过"):
        assert words in INJECTION_HEAD


async def test_r_inj_1_kept_originals_follow_the_summary_before_what_came_later(make: Make) -> None:
    env = await make(memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    short = await seed(rt, 3, size=2)
    await seed(rt, 2, start=3, size=300)
    run_, gate = await held_compression(env, keeping(short[0].content, short[2].content))
    late = await seed(rt, 1, start=20)  # arrives while the model writes the summary
    gate.open()
    assert (await run_).kept_messages == 2
    later = await seed(rt, 1, start=21)
    await turn(env)
    body = model.chat_requests()[-1]
    index, _ = summary_message(body)
    after = body["messages"][index + 1 :]
    assert [m["role"] for m in body["messages"][: index + 1]] == ["system"] * (index + 1)
    expected = [short[0].content, short[2].content, late[0].content, later[0].content]
    assert [m["content"] for m in after] == expected


async def test_r_inj_2_a_summary_longer_than_the_trim_budget_is_sent_whole(make: Make) -> None:
    # A smaller chat model now (window 4000, trim budget 2976) than the summary was written
    # for: the summary is not cut by any budget; the agent's hard trim gives way instead.
    env = await make(chat={"context_window": 4000})
    rt, model = env.rt, env.model
    topics = "".join(f"第{i}个话题：甲(1) 和乙(2) 讨论了很多细节。\n" for i in range(250))
    long_text = f"## 最近在聊什么\n{topics}"
    long_text += "## 谁有问题没回应\n无\n## 关键原话要点\n无"
    await put_summary(rt, long_text, "chat")
    # Only the question: with lines before it the turn would rewrite the oversized summary
    # first (test_audit5_n); with nothing to compress the summary goes out as it is, whole.
    await seed(rt, 1)
    await turn(env)
    assert model.summary_requests() == []
    _, message = summary_message(model.chat_requests()[-1])
    assert message == {"role": "system", "content": f"{INJECTION_HEAD}\n\n{long_text}"}


async def test_r_inj_1_the_summary_is_the_last_system_part_after_every_anchor_and_the_persona(
    env: Env,
) -> None:
    rt, model = env.rt, env.model

    async def context_part(sid: str) -> str:
        return "〔另一个插件的 context 块〕"

    async def weather_part(sid: str) -> str:
        return "〔天气：晴〕"

    rt.agent.contribute("context", context_part)  # registered first, still before the summary
    rt.agent.contribute("weather", weather_part)
    await rt.settings.set("persona", "place", "onebot:group:1", "你是本群的小助手。")
    await put_summary(rt, CHAT_SUMMARY, "chat")
    history = await seed(rt, 2)
    await turn(env)
    messages = model.chat_requests()[-1]["messages"]
    assert messages[:4] == [
        {"role": "system", "content": "你是本群的小助手。"},
        {"role": "system", "content": "〔天气：晴〕"},
        {"role": "system", "content": "〔另一个插件的 context 块〕"},
        {"role": "system", "content": f"{INJECTION_HEAD}\n\n{CHAT_SUMMARY}"},
    ]
    assert [m["content"] for m in messages[4:]] == [m.content for m in history]


# ---- R-BUD ---------------------------------------------------------------------------------------
async def test_r_bud_6_after_the_context_is_cleared_the_budget_follows_the_content(make: Make) -> None:
    # Chat window 32000: E = min(0.8 × 32000, 30976) = 25600, budget 2560. After /清除 上下文
    # there is no usage: the budget is what is compressed, at most ⅔ × 4096 = 2730.67.
    env = await make()
    rt, model = env.rt, env.model
    await seed(rt, 3)
    await turn(env)
    assert (await rt.compression.status(GROUP.id)).line == 25600
    await rt.compression.clear(GROUP.id, "context")
    assert (await rt.compression.status(GROUP.id)).line is None
    await seed(rt, 6, start=100, size=1000)
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert stated(request)[0] == 2730
    assert request["max_tokens"] == 4096


@pytest.mark.parametrize(
    ("compress_at", "shown", "max_tokens"),
    [
        pytest.param(0.4, 1000, 1500, id="line_4000_floor_equals_quarter"),
        pytest.param(0.399, 997, 1497, id="line_3990_quarter_under_floor"),
    ],
)
async def test_r_bud_3_a_line_of_4000_is_where_the_quarter_meets_the_floor(
    make: Make, compress_at: float, shown: int, max_tokens: int
) -> None:
    # Chat window 10000, trim budget 8976: E = 4000 (E × 0.1 = 400, floor 1000, E / 4 = 1000)
    # or 3990 (E / 4 = 997.5 wins over the floor; max_tokens ⌈1496.25⌉).
    env = await make(chat={"context_window": 10000}, memsum_compress_at=compress_at)
    rt, model = env.rt, env.model
    await seed(rt, 12, size=110)
    await turn(env)
    content = units_tokens(await rt.store.get_history(GROUP.id))
    assert content > 1000
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert stated(request) == (shown, min(shown, math.floor(Fraction(1, 10) * content)))
    assert request["max_tokens"] == max_tokens


async def test_r_bud_1_compress_at_1_makes_the_trim_budget_the_line(make: Make) -> None:
    # Window 20000: E = min(1 × 20000, 20000 − 1024) = 18976; × 0.1 = 1897.6 (floor 1000,
    # E / 4 and ⅔ × 4096 do not bind); max_tokens ⌈2846.4⌉ = 2847.
    env = await make(chat={"context_window": 20000}, memsum_compress_at=1)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    await turn(env)
    assert units_tokens(await rt.store.get_history(GROUP.id)) > 1898
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert stated(request)[0] == 1897
    assert request["max_tokens"] == 2847


async def test_r_bud_3_the_largest_ratio_is_held_to_a_quarter_of_the_line(make: Make) -> None:
    # Ratio 0.5, chat window 10000: E = 8000, E × 0.5 = 4000 > E / 4 = 2000; keep cap
    # min(2000, ⌊0.5 × the new conversation⌋); max_tokens 3000.
    env = await make(chat={"context_window": 10000}, memsum_summary_budget_ratio=0.5)
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    await turn(env)
    content = units_tokens(await rt.store.get_history(GROUP.id))
    assert content > 2000
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    assert stated(request) == (2000, min(2000, content // 2))
    assert request["max_tokens"] == 3000


async def test_r_bud_1_a_platformless_session_takes_the_line_of_the_tier_it_came_in_through(
    make: Make,
) -> None:
    # An internal session talks through a OneBot private chat: its line is that tier's 0.3.
    # Window 10000: E = 3000, × 0.1 = 300, floor 1000, E / 4 = 750 wins; max_tokens 1125.
    # (Under the global 0.8 it would be E = 8000 and a budget of 1000.)
    env = await make(chat={"context_window": 10000}, memsum_tiers={"onebot.private": {"compress_at": 0.3}})
    rt, model = env.rt, env.model
    await seed(rt, 12, size=110, record=INTERNAL)
    await turn(env, INTERNAL, entry=Entry("onebot", "private"))
    await rt.compression.compress(INTERNAL.id)
    (request,) = model.summary_requests()
    assert stated(request)[0] == 750
    assert request["max_tokens"] == 1125


async def test_r_bud_5_a_declared_output_over_a_quarter_of_the_window_is_held_to_the_quarter(
    make: Make,
) -> None:
    # Summary model window 9000, max output 8192: physical cap min(8192, 2250) = 2250; no usage,
    # so the budget is what is compressed, at most ⅔ × 2250 = 1500; max_tokens min(2250, 2250).
    env = await make(summary={"context_window": 9000, "max_output_tokens": 8192})
    rt, model = env.rt, env.model
    await seed(rt, 30, size=120)
    assert units_tokens(await rt.store.get_history(GROUP.id)) > 1500
    await rt.compression.compress(GROUP.id)
    request = model.summary_requests()[0]
    assert stated(request)[0] == 1500
    assert request["max_tokens"] == 2250


async def test_r_bud_4_keep_cap_is_a_ratio_of_the_new_conversation_not_of_the_old_summary(
    make: Make,
) -> None:
    # No usage: budget = old summary + new conversation (a long old summary lifts it), but the
    # keep cap is ⌊0.1 × the new conversation⌋ only.
    env = await make()
    rt, model = env.rt, env.model
    old = "## 最近在聊什么\n" + "甲(1) 说了很多话。" * 200 + "\n## 谁有问题没回应\n无\n## 关键原话要点\n无"
    await put_summary(rt, old, "chat")
    await seed(rt, 5, size=40)
    content = units_tokens(await rt.store.get_history(GROUP.id))
    await rt.compression.compress(GROUP.id)
    (request,) = model.summary_requests()
    budget, keep_cap = stated(request)
    assert budget > 1000  # the old summary lifted it over the floor
    assert keep_cap == math.floor(Fraction(1, 10) * content)
    assert offered(request) == {}  # nothing fits so small a cap


# ---- R-TPL-5 + R-RUN-7: a "#3" or a #hashtag in a section's body is not a section --------------
TAGGED = (
    "## 最近在聊什么\n#原神 新版本：甲(1) 问大家抽没抽到\n"
    "## 谁有问题没回应\n无\n## 关键原话要点\n#3 是周六：乙(2) 说周六 8 点集合"
)


async def test_r_tpl_5_a_summary_whose_body_has_hash_numbers_or_tags_is_merged_not_folded(env: Env) -> None:
    # The original expects "#数字" inside the summary body (R-RUN-7: not a number to keep) and
    # QQ topics are written as #话题: such a body line is text, not a heading. The summary has
    # exactly the chat template's sections, so the next compression merges into them.
    rt, model = env.rt, env.model
    await seed(rt, 3)
    model.summary.append(Reply(f"【保留原文】无\n{TAGGED}"))
    await rt.compression.compress(GROUP.id)
    await seed(rt, 3, start=3)
    await rt.compression.compress(GROUP.id)
    second = model.summary_requests()[1]
    assert existing_summary_of(second) == TAGGED
    assert "请在同名小节上合并更新" in user_of(second)
    assert "按意思归入" not in user_of(second)


def test_r_tpl_5_glued_section_titles_still_count_and_glued_body_tags_do_not() -> None:
    from nonebot_plugin_memsum.compression.templates import has_template_sections

    glued = "##目标\n写周报\n##做过的决定\n无\n##改过的文件\n无\n##未完成的事：\n#2 那条还没做"
    assert has_template_sections(glued, WORK)
    assert has_template_sections(TAGGED, CHAT)
    # A spaced heading outside the template is still another structure: fold.
    assert not has_template_sections(TAGGED + "\n## 杂项\n无", CHAT)
    assert not has_template_sections(TAGGED, WORK)
