"""Audit 20, the QQ surface: the specification as a group's owner meets it through the bot's
commands in chat. What the bot says in the group (in Chinese, the spec's strings verbatim)
after /压缩, /摘要, /清除, /压缩线 and /条数线; in-process through NoneBot (nonebug) where one
command at a time tells it, and through bot.py and the OneBot simulator over the real
WebSocket where a command has to arrive while a compression waits on the model."""

from __future__ import annotations

import re

from nonebug import App

from nonebot_plugin_memsum import runtime, usage
from nonebot_plugin_memsum.commands import format_time
from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.onebot import group_record
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.nonebug import SELF_ID, Like, group_msg, new_group, run, seed, usage_event

CHAT_SUMMARY = "【最近在聊什么】\n大家在商量周末去爬山\n【谁有问题没回应】\n无\n【关键原话要点】\n无"


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


# ---- /摘要 shows the kept originals themselves (R-RUN-12) --------------------------------
async def test_r_run_12_summary_lists_the_kept_originals(app: App, llm: ScriptedLLM) -> None:
    # README: /摘要 「查看摘要、保留原文、…」; a count alone does not show what was kept.
    rt = runtime.get()
    rt.registry.set_models([ModelConfig.model_validate(llm.model_config())])
    try:
        group = new_group()
        sid = group_record(SELF_ID, group).id
        await seed(sid, group, 40)  # enough conversation for a keep cap above one line
        llm.push(Reply(f"【保留原文】\n#3\n{CHAT_SUMMARY}"))
        await run(app, group_msg("/压缩", group), Like("压缩完成：.*保留原文 1 条，归档 39 条。"))
        kept = format_time(1.0 + 2, usage.zone_of(rt.config)) + " [用户20002(20002)] 第 2 句：周末去爬山吗"
        await run(
            app, group_msg("/摘要", group), Like(rf".*\n保留原文 1 条：\n{re.escape(kept)}\n上次压缩：.*")
        )
        # Cleared with the summary: none is kept any more, and none is listed.
        await run(app, group_msg("/清除 摘要", group), "已清除本会话的摘要，上下文保留。")
        await run(app, group_msg("/摘要", group), Like(r"本会话还没有摘要。\n保留原文 0 条\n上次压缩：.*"))
    finally:
        rt.registry.set_models([])
