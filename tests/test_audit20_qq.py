"""Audit 20, the QQ surface: the specification as a group's owner meets it through the bot's
commands in chat. What the bot says in the group (in Chinese, the spec's strings verbatim)
after /压缩, /摘要, /清除, /压缩线 and /条数线; in-process through NoneBot (nonebug) where one
command at a time tells it, and through bot.py and the OneBot simulator over the real
WebSocket where a command has to arrive while a compression waits on the llm."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC

import pytest
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.commands import status_text
from nonebot_plugin_memsum.compression.service import SessionStatus
from nonebot_plugin_memsum.config import ModelConfig, Tier
from nonebot_plugin_memsum.llm.registry import Registry
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message, ToolCall
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID as QQ_SELF_ID
from tests.fakes.e2e import group_sid, query, until
from tests.fakes.llm_server import Gate, Reply, ScriptedLLM
from tests.fakes.nonebug import SELF_ID, Like, group_msg, history, new_group, run, seed, usage_event
from tests.fakes.onebot import OneBotSim, at
from tests.fakes.onebot import text as seg
from tests.fakes.service import is_summary

# The bot, the simulator and the held summary model of the commands' end-to-end tests.
from tests.test_commands_e2e import active, answers, bot, chat, sim, slow, summary  # noqa: F401  (fixtures)

CHAT_SUMMARY = "【最近在聊什么】\n大家在商量周末去爬山\n【谁有问题没回应】\n无\n【关键原话要点】\n无"


@pytest.fixture
def summariser(app: App, llm: ScriptedLLM, request: pytest.FixtureRequest) -> Iterator[ScriptedLLM]:
    """The module's scripted server as the only model, fresh for this test (indirect
    parameter: fields of its MEMSUM_MODELS entry)."""
    rt = runtime.get()
    llm.reset()
    rt.registry.set_models([ModelConfig.model_validate(llm.model_config(**getattr(request, "param", {})))])
    try:
        yield llm
    finally:
        rt.registry.set_models([])
        llm.reset()


# ---- /摘要 names where each line comes from (R-CFG-2) --------------------------------------
async def test_r_cfg_2_summary_names_the_layer_of_each_line(app: App) -> None:
    # README: 「命令显示的值都注明来自哪一层」; /摘要 shows both lines.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg("/压缩线 群 0.5", group), Like("已将本群的压缩线设为 0.5。.*"))
    await run(app, group_msg("/条数线 40", group), Like("已将本会话的条数线设为 40。.*"))
    await usage_event(sid, 12345)
    await run(
        app,
        group_msg("/摘要", group),
        Like(
            r".*\n用量 12345 / 压缩线 32000 token（窗口 64000）\n条数 0 / 条数线 40\n"
            r"设置：压缩线 0\.5（本群），条数线 40（本会话）"
        ),
    )


async def test_r_cfg_4_summary_before_any_usage_says_the_line_is_off_and_where_from(app: App) -> None:
    group = new_group()
    await run(app, group_msg("/压缩线 0", group), Like("已将本会话的压缩线设为 0。.*"))
    await run(
        app,
        group_msg("/摘要", group),
        "\n".join(
            [
                "本会话还没有摘要。",
                "保留原文 0 条",
                "还没有压缩过。",
                "还没有用量记录（本会话尚未调用模型）。",
                "条数 0；条数线未开启。",
                "设置：压缩线 0（本会话），条数线 0（全局配置）",
            ]
        ),
    )


async def test_r_cfg_2_the_five_layers_as_the_owner_sets_and_resets_them_in_chat(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # global < onebot < onebot.group < 本群 < 本会话, each shown with its layer; resetting
    # one uncovers the next below.
    rt = runtime.get()
    tiers = {"onebot": Tier(compress_at=0.7), "onebot.group": Tier(compress_at=0.6)}
    monkeypatch.setattr(rt.settings, "_config", rt.config.model_copy(update={"memsum_tiers": tiers}))
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage_event(sid, 1000, window=100000, trim_budget=90000)

    async def shown() -> tuple[str, str]:
        line = Like(r"压缩线 ([\d.]+)（(.+?)）；生效线 \d+ token（窗口 100000）")
        await run(app, group_msg("/压缩线", group), line)
        status = Like(r".*\n设置：压缩线 ([\d.]+)（(.+?)），条数线 0（全局配置）")
        await run(app, group_msg("/摘要", group), status)
        said = re.fullmatch(str(line), line.seen or "")
        listed = re.fullmatch(str(status), status.seen or "", re.S)
        assert said is not None
        assert listed is not None
        assert said.groups() == listed.groups()  # /压缩线 and /摘要 agree
        return said.group(1), said.group(2)

    assert await shown() == ("0.6", "平台类型档")
    await run(app, group_msg("/压缩线 群 0.5", group), Like("已将本群的压缩线设为 0.5。.*"))
    assert await shown() == ("0.5", "本群")
    await run(app, group_msg("/压缩线 0.4", group), Like("已将本会话的压缩线设为 0.4。.*"))
    assert await shown() == ("0.4", "本会话")
    await run(app, group_msg("/压缩线 默认", group), Like("已恢复本会话的压缩线为默认。.*"))
    assert await shown() == ("0.5", "本群")
    await run(app, group_msg("/压缩线 群 默认", group), Like("已恢复本群的压缩线为默认。.*"))
    assert await shown() == ("0.6", "平台类型档")
    monkeypatch.setattr(
        rt.settings,
        "_config",
        rt.config.model_copy(update={"memsum_tiers": {"onebot": Tier(compress_at=0.7)}}),
    )
    assert await shown() == ("0.7", "平台档")
    monkeypatch.setattr(rt.settings, "_config", rt.config)
    assert await shown() == ("0.8", "全局配置")


# ---- /摘要 shows the kept originals themselves (R-RUN-12) --------------------------------
async def test_r_run_12_summary_lists_the_kept_originals(app: App, summariser: ScriptedLLM) -> None:
    # README: /摘要 「查看摘要、保留原文、…」; a count alone does not show what was kept.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 40)  # enough conversation for a keep cap above one line
    summariser.push(Reply(f"【保留原文】\n#3\n{CHAT_SUMMARY}"))
    await run(app, group_msg("/压缩", group), Like("压缩完成：.*保留原文 1 条，归档 39 条。"))
    kept = "[用户20002(20002)] 第 2 句：周末去爬山吗"  # as the summary model read it (R-RUN-3)
    listed = Like(rf".*\n保留原文 1 条：\n{re.escape(kept)}\n上次压缩：.*")
    await run(app, group_msg("/摘要", group), listed)
    # Cleared with the summary: none is kept any more, and none is listed.
    await run(app, group_msg("/清除 摘要", group), "已清除本会话的摘要，上下文保留。")
    await run(app, group_msg("/摘要", group), Like(r"本会话还没有摘要。\n保留原文 0 条\n上次压缩：.*"))


def test_r_run_12_kept_originals_are_listed_as_the_summary_model_read_them() -> None:
    # A withdrawn one as withdrawn; a tool group as its call and result (R-RUN-3).
    said = Message(role="user", content="[甲(20001)] 提取码 8848", ts=0.0, withdrawn=True)
    call = ToolCall("c1", "recall", '{"query": "爬山"}')
    asked = Message(role="assistant", content="", ts=1.0, tool_calls=(call,))
    found = Message(role="tool", content="找到 1 条", ts=1.0, tool_call_id="c1")
    status = SessionStatus(
        summary=CHAT_SUMMARY, summary_time=None, kept_messages=3, last_run=None, running=False,
        usage=None, line=None, window=None, compress_at=0.8, history_limit=0, active_messages=3,
        backoff_failures=0, backoff_turns_left=0,
    )  # fmt: skip
    text = status_text(status, UTC, [said, asked, found])
    listed = (
        "保留原文 3 条：\n[甲(20001)] （这条消息已撤回）\n"
        '调用 recall({"query": "爬山"})\n工具结果(recall): 找到 1 条\n'
    )
    assert listed in text
    assert "8848" not in text


# ---- what /压缩 answers (R-FAIL, R-PROG) ---------------------------------------------------
@pytest.mark.parametrize("summariser", [{"context_window": 600}], indirect=True)
async def test_r_fail_2_a_window_too_small_for_the_summary_request_is_said(
    app: App, summariser: ScriptedLLM
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    await run(app, group_msg("/压缩", group), "压缩失败：摘要模型的窗口装不下提示词、已有摘要与输出上限")
    assert len(await history(sid)) == 3  # R-FAIL-3
    assert summariser.requests == []


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(CHAT_SUMMARY, finish_reason="length"), "摘要在输出上限处被截断"),
        (Reply("【保留原文】\n无"), "摘要为空"),
        (Reply(CHAT_SUMMARY * 5, cut_after=3), Like("摘要模型出错：test/model 回复中途断开（.+）")),
    ],
    ids=["length", "empty", "stream-cut"],
)
async def test_r_fail_1_the_owner_is_told_why_a_compression_failed(
    app: App, summariser: ScriptedLLM, reply: Reply, reason: str
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    summariser.push(reply)
    await run(
        app,
        group_msg("/压缩", group),
        Like("压缩失败：" + (reason if isinstance(reason, Like) else re.escape(reason))),
    )
    assert len(await history(sid)) == 3  # R-FAIL-3: no summary, nothing archived, no divider
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None


async def test_r_fail_1_a_preferred_summary_model_that_is_gone_is_named(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = Registry([], preferred=None, preferences={"summary": "gone/qwen-max"})
    monkeypatch.setattr(runtime.get().compression, "registry", gone)
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    await run(app, group_msg("/压缩", group), "压缩失败：摘要模型 gone/qwen-max 不可用")
    failed = Like(r".*\n上次压缩：[-\d: ]+ 失败：摘要模型 gone/qwen-max 不可用\n.*")
    await run(app, group_msg("/摘要", group), failed)


async def test_r_prog_2_only_a_divider_left_is_nothing_to_compress(app: App, summariser: ScriptedLLM) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    summariser.push(Reply(f"{CHAT_SUMMARY}\n【保留原文】\n无"))
    await run(app, group_msg("/压缩", group), Like("压缩完成：.*归档 3 条。"))
    await run(app, group_msg("/压缩", group), "没有需要压缩的内容。")
    assert len(summariser.requests) == 1


# ---- over the real WebSocket: commands while a compression waits on the model -------------
SUPERUSER = 10001
SUMMARY = f"{CHAT_SUMMARY}\n【保留原文】\n无"


async def say(qq: OneBotSim, group: int, command: str) -> str:
    """The owner's command in the group, and what the bot answers."""
    mark = len(qq.calls)
    await qq.group_message(group, SUPERUSER, command)
    return (await answers(qq, mark, 1))[0]


async def test_r_mem_3_clearing_only_the_summary_also_cancels_a_waiting_compression(
    bot: BotProcess,  # noqa: F811
    sim: OneBotSim,  # noqa: F811
    llm: ScriptedLLM,
    slow: Gate,  # noqa: F811
) -> None:
    # 「清理发生在压缩途中(模型尚未返回)时,这次压缩作废」: the summary kind is a clear too.
    group = 30201
    await chat(bot, sim, group, 4)
    mark = len(sim.calls)
    await sim.group_message(group, SUPERUSER, "/压缩")
    await llm.wait_requests_async(1)
    assert (await say(sim, group, "/摘要")).endswith("\n正在压缩中…")
    assert await say(sim, group, "/清除 摘要") == "已清除本会话的摘要，上下文保留。"
    slow.open()
    got = await answers(sim, mark, 3)
    assert got[-1] == "压缩失败：压缩期间会话被清空"
    sid = group_sid(group)
    assert len(await active(bot, sid)) == 4  # nothing archived, no divider
    assert await summary(bot, sid) == []


async def test_r_run_11_a_withdrawal_while_the_model_thinks_fails_with_history_changed(
    bot: BotProcess,  # noqa: F811
    sim: OneBotSim,  # noqa: F811
    llm: ScriptedLLM,
    slow: Gate,  # noqa: F811
) -> None:
    group = 30202
    await chat(bot, sim, group, 4)
    sid = group_sid(group)
    first = min(i for i, m in sim.messages.items() if m.group_id == group)
    mark = len(sim.calls)
    await sim.group_message(group, SUPERUSER, "/压缩")
    await llm.wait_requests_async(1)
    await sim.notice("group_recall", group_id=group, user_id=20001, message_id=first)

    async def withdrawn() -> bool:
        sql = "SELECT withdrawn FROM messages WHERE session_id = ? ORDER BY id LIMIT 1"
        return bool((await query(bot.db_path, sql, sid))[0][0])

    await until(withdrawn, "the first line withdrawn")
    slow.open()
    assert await answers(sim, mark, 1) == ["压缩失败：压缩期间历史被改动"]
    assert await summary(bot, sid) == []
    assert len(await active(bot, sid)) == 5  # the four lines and the withdrawal's notice


async def test_r_cfg_4_compress_at_0_turns_the_usage_line_off_and_the_count_line_still_compresses(
    bot: BotProcess,  # noqa: F811
    sim: OneBotSim,  # noqa: F811
    llm: ScriptedLLM,
) -> None:
    group = 30203
    sid = group_sid(group)
    llm.on_request(lambda body: Reply(SUMMARY) if is_summary(body) else None)
    try:
        assert (await say(sim, group, "/压缩线 0")).startswith(
            "已将本会话的压缩线设为 0。\n现在：压缩线 0（本会话）：不按用量压缩。"
        )
        assert (await say(sim, group, "/条数线 4")).startswith("已将本会话的条数线设为 4。")
        await chat(bot, sim, group, 3)
        mark = len(sim.calls)
        await sim.group_message(group, 20009, [at(QQ_SELF_ID), seg(" 大家觉得呢")])
        assert await answers(sim, mark, 1) == ["好的"]

        async def summarised() -> bool:
            return bool(await summary(bot, sid))

        await until(summarised, "the count line's compression")
        status = await say(sim, group, "/摘要")
        assert status.startswith("本会话摘要")
        assert "\n用量 " in status
        assert "token；压缩线已关闭，不按用量压缩。\n" in status
        assert "\n设置：压缩线 0（本会话），条数线 4（本会话）" in status
    finally:
        llm.reset()
