"""What every command answers in a fresh place, and who may use it: one table shared by
the in-process matrix (tests/test_commands.py) and the one over OneBot
(tests/test_commands_e2e.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from nonebot.adapters.onebot.v11 import GroupMessageEvent, PrivateMessageEvent

from nonebot_plugin_memsum.commands import RECALL_USAGE, USAGE
from nonebot_plugin_memsum.config import DEFAULT_PERSONA
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.usage import CAP_NOTE
from tests.fakes.nonebug import SELF_ID, SUPERUSER_ID, Like, group_msg, private_msg

NO_USAGE = "还没有用量记录，生效线在首次调用模型后才知道。"
EMPTY_STATUS = "\n".join(
    [
        "本会话还没有摘要。",
        "保留原文 0 条",
        "还没有压缩过。",
        "还没有用量记录（本会话尚未调用模型）。",
        "条数 0；条数线未开启。",
        "设置：压缩线 0.8（全局配置），条数线 0（全局配置）",
    ]
)

Role = Literal["superuser", "owner", "admin", "member", "private peer", "superuser private"]
ROLES: tuple[Role, ...] = ("superuser", "owner", "admin", "member", "private peer", "superuser private")
SUPERUSER_ONLY = ("/压缩线", "/条数线", "/限额")
HELP_ALL = USAGE
HELP_GROUP_ADMINS = "\n".join(line for line in USAGE.splitlines() if not line.startswith(SUPERUSER_ONLY))
# What each command answers in a fresh, empty session when it is allowed.
ALLOWED_ANSWER: dict[str, str | Callable[[Role], str]] = {
    "/压缩": "没有需要压缩的内容。",
    "/摘要": EMPTY_STATUS,
    "/压缩线": "压缩线 0.8（全局配置）；还没有用量记录，生效线在首次调用模型后才知道。",
    "/条数线": "条数线 0（全局配置）：不按条数压缩。",
    "/清除 摘要": "已清除本会话的摘要，上下文保留。",
    "/清除": (
        "将清除本会话的全部上下文和摘要：之前的消息只留在存档里，不会再发给模型。60 秒内回复「确认」继续。"
    ),
    "/记忆模式": lambda role: f"{where(role)}模式：开（全局配置）：记录并回答。",
    "/人设": lambda role: f"{where(role)}人设（全局配置）：\n{DEFAULT_PERSONA}",
    "/用量": lambda role: usage_answer(role),
    "/限额": lambda role: f"{where(role)}每日限额：不限（全局配置）。{CAP_NOTE}",
    "/回忆": f"请给出关键词或 @某人\n{RECALL_USAGE}",
    "/记忆帮助": lambda role: HELP_ALL if role.startswith("superuser") else HELP_GROUP_ADMINS,
}


def usage_answer(role: Role) -> str:
    """/用量 in a place that never called a model; a superuser in private also gets the top
    places, which other tests' spending decides."""
    own = (
        f"{where(role)}用量（今天）：回答 0 次，压缩 0 次\n这段时间没有调用模型。\n\n"
        f"每日限额：不限（全局配置）。{CAP_NOTE}"
    )
    if role == "superuser private":
        return Like(re.escape(own) + r"\n\n花费最多的地方（今天）：\n.+")
    return own


def where(role: Role) -> str:
    return "本会话" if role in ("private peer", "superuser private") else "本群"


def event_for(role: Role, text: str, group: int) -> GroupMessageEvent | PrivateMessageEvent:
    if role == "private peer":
        return private_msg(text, user=group)  # a user id of its own
    if role == "superuser private":
        return private_msg(text)
    user = SUPERUSER_ID if role == "superuser" else {"owner": 20001, "admin": 20002, "member": 20003}[role]
    return group_msg(text, group, user=user, role="member" if role == "superuser" else role)


def session_of(role: Role, group: int) -> str:
    if role == "private peer":
        return private_record(SELF_ID, group).id
    if role == "superuser private":
        return private_record(SELF_ID, SUPERUSER_ID).id
    return group_record(SELF_ID, group).id


def may_use(role: Role, command: str, admin_option: bool) -> bool:
    if role.startswith("superuser"):
        return True
    return admin_option and role in ("owner", "admin") and not command.startswith(SUPERUSER_ONLY)
