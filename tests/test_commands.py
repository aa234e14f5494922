"""The commands through NoneBot (nonebug): every command × role × the admin option × outcome.

The plugin runs as conftest starts it (temporary database, superuser 10001, no model);
each test works in a group or private chat of its own so tests never see each other's
history or settings.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any, Literal, Self

import pytest
from nonebot.adapters.onebot.v11 import Bot, GroupIncreaseNoticeEvent, GroupMessageEvent, PrivateMessageEvent
from nonebot.adapters.onebot.v11 import Message as OBMessage
from nonebot.adapters.onebot.v11.event import Sender
from nonebug import App
from pydantic import create_model

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.agent.events import UsageEvent
from nonebot_plugin_memsum.commands import (
    COMMANDS,
    USAGE,
    parse_setting,
    receipt,
    setting_text,
    status_text,
)
from nonebot_plugin_memsum.compression.service import CompressionResult, LastRun, SessionStatus
from nonebot_plugin_memsum.config import DEFAULT_PERSONA, PERSONA_MAX, ModelConfig
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.settings import Resolved
from nonebot_plugin_memsum.store import SUMMARY_NAMESPACE
from nonebot_plugin_memsum.types import Message
from nonebot_plugin_memsum.usage import CAP_NOTE
from tests.fakes.llm_server import API_KEY, Reply, ScriptedLLM

SELF_ID = "10000"
SUPERUSER_ID = 10001
EMPTY_STATUS = "\n".join(
    [
        "本会话还没有摘要。",
        "保留原文 0 条",
        "还没有压缩过。",
        "还没有用量记录（本会话尚未调用模型）。",
        "条数 0；条数线未开启。",
    ]
)
CHAT_SUMMARY = "【最近在聊什么】\n大家在商量周末去爬山\n【谁有问题没回应】\n无\n【关键原话要点】\n无"

_places = itertools.count(700_001)


def new_group() -> int:
    return next(_places)


# ---- events (nonebot-plugin-template style factories) -------------------------------
# What every message event has and no test needs to state.
_MESSAGE_DEFAULTS: dict[str, Any] = {
    "time": (int, 1_700_000_000),
    "self_id": (int, int(SELF_ID)),
    "post_type": (Literal["message"], "message"),
    "message_id": (int, 1),
    "raw_message": (str, ""),
    "font": (int, 0),
}
_GroupEvent = create_model(
    "_GroupEvent",
    __base__=GroupMessageEvent,
    message_type=(Literal["group"], "group"),
    sub_type=(str, "normal"),
    **_MESSAGE_DEFAULTS,
)
_PrivateEvent = create_model(
    "_PrivateEvent",
    __base__=PrivateMessageEvent,
    message_type=(Literal["private"], "private"),
    sub_type=(str, "friend"),
    **_MESSAGE_DEFAULTS,
)


def group_msg(text: str, group: int, *, user: int = SUPERUSER_ID, role: str = "member") -> GroupMessageEvent:
    sender = Sender(user_id=user, nickname=f"用户{user}", card="", role=role)
    fields = {"user_id": user, "group_id": group, "message": OBMessage(text), "raw_message": text}
    return _GroupEvent.model_validate({**fields, "sender": sender})


def private_msg(text: str, user: int = SUPERUSER_ID) -> PrivateMessageEvent:
    sender = Sender(user_id=user, nickname=f"用户{user}")
    fields = {"user_id": user, "message": OBMessage(text), "raw_message": text}
    return _PrivateEvent.model_validate({**fields, "sender": sender})


class Like(str):
    """Equal to any text the pattern matches (nonebug compares expected != actual)."""

    seen: str | None = None

    def __new__(cls, pattern: str) -> Self:
        return super().__new__(cls, pattern)

    def __eq__(self, other: object) -> bool:
        if re.fullmatch(str(self), str(other), re.S) is None:
            return False
        self.seen = str(other)
        return True

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


class Satisfies:
    """Equal to any value the predicate accepts."""

    def __init__(self, predicate: Callable[[Any], bool]) -> None:
        self.predicate = predicate

    def __eq__(self, other: object) -> bool:
        return self.predicate(other)

    def __ne__(self, other: object) -> bool:
        return not self.predicate(other)

    __hash__ = None  # type: ignore[assignment]


def forwarded_text(nodes: Any) -> str:
    """The text of a merged-forward message's nodes."""
    return "".join(seg["data"]["text"] for n in nodes for seg in n["data"]["content"])


async def run(app: App, event: Any, expect: str | None) -> None:
    """Deliver `event`; the bot answers exactly `expect` (None: it says nothing). A long
    answer in a group goes out as a merged-forward message holding exactly that text."""
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        threshold = runtime.get().config.memsum_forward_threshold
        if expect is None:
            return
        if isinstance(event, GroupMessageEvent) and not isinstance(expect, Like) and len(expect) > threshold:
            ctx.should_call_api(
                "send_group_forward_msg",
                {"group_id": event.group_id, "messages": Satisfies(lambda n: forwarded_text(n) == expect)},
                result={},
            )
        else:
            ctx.should_call_send(event, expect, result={"message_id": 1})


async def history(session_id: str) -> list[Message]:
    return await runtime.get().store.get_history(session_id)


def seeded_line(i: int) -> str:
    return f"[用户2000{i}(2000{i})] 第 {i} 句：周末去爬山吗"


async def seed(session_id: str, group: int, n: int) -> None:
    record = group_record(SELF_ID, group)
    for i in range(n):
        await runtime.get().agent.record(record, Message(role="user", content=seeded_line(i), ts=1.0 + i))
    assert record.id == session_id


@pytest.fixture
def admin_option(app: App, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """MEMSUM_GROUP_ADMIN_COMMANDS for one test (indirect parameter; default off)."""
    value = bool(getattr(request, "param", False))
    rt = runtime.get()
    monkeypatch.setattr(rt, "config", rt.config.model_copy(update={"memsum_group_admin_commands": value}))
    return value


@pytest.fixture
def llm(app: App) -> Iterator[ScriptedLLM]:
    """A real summary model on 127.0.0.1 for this test."""
    rt = runtime.get()
    with ScriptedLLM() as server:
        rt.registry.set_models([ModelConfig.model_validate(server.model_config())])
        try:
            yield server
        finally:
            rt.registry.set_models([])


# ---- who may use what ------------------------------------------------------------------
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


@pytest.mark.parametrize("admin_option", [False, True], indirect=True, ids=["option-off", "option-on"])
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("text", list(ALLOWED_ANSWER))
async def test_who_may_use_each_command(app: App, admin_option: bool, role: Role, text: str) -> None:
    group = new_group()
    session = session_of(role, group)
    before = await history(session)
    expected = ALLOWED_ANSWER[text]
    if not may_use(role, text, admin_option):
        expected = None  # not handled at all: no refusal
    elif callable(expected):
        expected = expected(role)
    await run(app, event_for(role, text, group), expected)
    # Allowed or not, a command never enters history.
    assert await history(session) == before


async def test_a_member_changes_nothing_and_hears_nothing(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": "旧摘要", "kept_messages": 0})
    for text in (
        "/清除 上下文 确认",
        "/清除 摘要",
        "/压缩",
        "/压缩线 0.1",
        "/条数线 群 5",
        "/记忆模式 关",
        "/人设 你是一只猫",
    ):
        await run(app, group_msg(text, group, user=20003), None)
    assert [m.content for m in await history(sid)] == [seeded_line(i) for i in range(3)]
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) == {
        "text": "旧摘要",
        "kept_messages": 0,
    }
    rt = runtime.get()
    for name in ("compress_at", "history_limit", "mode", "persona"):
        assert (await rt.settings.effective(name, sid)).layer == "global"  # type: ignore[arg-type]


async def test_a_members_command_goes_on_to_another_plugins_matcher(app: App) -> None:
    # Another plugin with a /摘要 of its own, below our commands' priority: a member's
    # /摘要 is its business; ours (a superuser's) blocks before it.
    from nonebot import on_command

    other = on_command("摘要", priority=10, block=True)
    seen: list[str] = []

    @other.handle()
    async def _(event: GroupMessageEvent) -> None:
        seen.append(event.get_plaintext())

    try:
        group = new_group()
        await run(app, group_msg("/摘要 今天", group, user=20003), None)
        assert seen == ["/摘要 今天"]
        await run(app, group_msg("/摘要", group), Like("本会话还没有摘要。.*"))
        assert seen == ["/摘要 今天"]
    finally:
        other.destroy()
    assert await history(group_record(SELF_ID, group).id) == []


# ---- /压缩 ------------------------------------------------------------------------------
async def test_compress_nothing_to_compress(app: App) -> None:
    await run(app, group_msg("/压缩", new_group()), "没有需要压缩的内容。")


async def test_compress_without_a_model_fails_with_the_reason_and_keeps_history(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    await run(app, group_msg("/压缩", group), "压缩失败：没有可用的摘要模型")
    assert len(await history(sid)) == 3
    status = await runtime.get().compression.status(sid)
    assert status.last_run is not None
    assert (status.last_run.outcome, status.last_run.reason) == ("error", "没有可用的摘要模型")


@pytest.mark.parametrize("admin_option", [True], indirect=True)
@pytest.mark.parametrize("who", ["superuser", "admin"])
async def test_compress_answers_with_a_receipt(
    app: App, admin_option: bool, llm: ScriptedLLM, who: Literal["superuser", "admin"]
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 4)
    llm.push(Reply(f"{CHAT_SUMMARY}\n【保留原文】\n无"))
    answer = Like(r"压缩完成：(\d+) → (\d+) token，保留原文 0 条，归档 4 条。")
    await run(app, event_for(who, "/压缩", group), answer)
    assert answer.seen is not None
    before, after = map(int, re.findall(r"\d+", answer.seen)[:2])
    assert before > 0
    assert after > 0
    remaining = await history(sid)
    assert [(m.role, m.content, m.event_marker) for m in remaining] == [("system", "对话已压缩", True)]
    stored = await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid)
    assert stored is not None
    assert stored["text"] == CHAT_SUMMARY
    assert len(llm.requests) == 1


async def test_compress_model_error_names_no_secret(app: App, llm: ScriptedLLM) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 3)
    llm.push(Reply(status=400, error=f"bad request for key {API_KEY[:6]}"))
    answer = Like(r"压缩失败：摘要模型出错.*")
    await run(app, group_msg("/压缩", group), answer)
    assert answer.seen is not None
    assert API_KEY not in answer.seen
    assert len(await history(sid)) == 3
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None


# ---- /摘要 ------------------------------------------------------------------------------
async def usage(session_id: str, used: int, window: int = 64000, trim_budget: int = 60000) -> None:
    await runtime.get().bus.emit(
        UsageEvent(
            session_id=session_id,
            turn_id="turn-1",
            platform="onebot",
            platform_type="group",
            model_id="test/model",
            window=window,
            trim_budget=trim_budget,
            usage=used,
            trimmed=False,
            untrimmed_history=0,
            history_messages=0,
            history_limit=0,
        )
    )


async def test_summary_shows_summary_kept_last_run_usage_and_count(app: App, llm: ScriptedLLM) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 4)
    llm.push(Reply(f"{CHAT_SUMMARY}\n【保留原文】\n无"))
    await run(app, group_msg("/压缩", group), Like("压缩完成：.*"))
    await usage(sid, 12345)
    await runtime.get().settings.set("history_limit", "session", sid, 40)
    answer = Like(
        r"本会话摘要（\d{4}-\d\d-\d\d \d\d:\d\d）：\n"
        + re.escape(CHAT_SUMMARY)
        + r"\n\n保留原文 0 条\n上次压缩：\d{4}-\d\d-\d\d \d\d:\d\d 成功，归档 4 条，保留原文 0 条\n"
        r"用量 12345 / 压缩线 51200 token（窗口 64000）\n条数 0 / 条数线 40"
    )
    await run(app, group_msg("/摘要", group), answer)


async def test_summary_line_is_capped_by_the_trim_budget(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage(sid, 30000, window=64000, trim_budget=40000)
    await run(app, group_msg("/摘要", group), Like(r".*\n用量 30000 / 压缩线 40000 token（窗口 64000）\n.*"))


async def test_summary_says_the_line_is_off_at_compress_at_zero(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage(sid, 30000)
    await runtime.get().settings.set("compress_at", "session", sid, 0)
    await run(app, group_msg("/摘要", group), Like(r".*\n用量 30000 token；压缩线已关闭，不按用量压缩。\n.*"))


async def test_summary_shows_a_failed_run_and_its_reason(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 2)
    await run(app, group_msg("/压缩", group), "压缩失败：没有可用的摘要模型")
    await run(app, group_msg("/摘要", group), Like(r".*\n上次压缩：[-\d: ]+ 失败：没有可用的摘要模型\n.*"))


async def test_long_summary_goes_out_as_merged_forward_in_groups(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    long_text = "很长的摘要。" * 100
    await runtime.get().store.put_meta(
        SUMMARY_NAMESPACE, sid, {"text": long_text, "time": 1.0, "kept_messages": 2}
    )

    def forwarded(nodes: Any) -> bool:
        content = "".join(seg["data"]["text"] for n in nodes for seg in n["data"]["content"])
        return all(n["type"] == "node" for n in nodes) and long_text in content and "保留原文 2 条" in content

    event = group_msg("/摘要", group)
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        ctx.should_call_api(
            "send_group_forward_msg", {"group_id": group, "messages": Satisfies(forwarded)}, result={}
        )


async def test_long_summary_is_plain_text_in_private(app: App) -> None:
    sid = private_record(SELF_ID, SUPERUSER_ID).id
    long_text = "私聊里的长摘要。" * 60
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": long_text, "kept_messages": 0})
    try:
        await run(app, private_msg("/摘要"), Like(f"本会话摘要：\n{long_text}\n\n保留原文 0 条\n.*"))
    finally:
        await runtime.get().store.delete_meta(SUMMARY_NAMESPACE, sid)


# ---- /压缩线 and /条数线 -----------------------------------------------------------------
NO_USAGE = "还没有用量记录，生效线在首次调用模型后才知道。"


async def test_r_cfg_2_superuser_sets_and_resets_compress_at_for_the_session(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(
        app,
        group_msg("/压缩线 0.3", group),
        f"已将本会话的压缩线设为 0.3。\n现在：压缩线 0.3（本会话）；{NO_USAGE}",
    )
    assert (await runtime.get().store.get_settings("session", sid)).get("compress_at") == 0.3
    await run(app, group_msg("/压缩线", group), f"压缩线 0.3（本会话）；{NO_USAGE}")
    await run(
        app,
        group_msg("/压缩线 默认", group),
        f"已恢复本会话的压缩线为默认。\n现在：压缩线 0.8（全局配置）；{NO_USAGE}",
    )
    assert (await runtime.get().store.get_settings("session", sid)).get("compress_at") is None


async def test_r_cfg_2_group_layer_is_set_with_qun_and_the_session_still_wins(app: App) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/压缩线 群 0.5", group),
        f"已将本群的压缩线设为 0.5。\n现在：压缩线 0.5（本群）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 0.4", group),
        f"已将本会话的压缩线设为 0.4。\n现在：压缩线 0.4（本会话）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 群 0.6", group),
        f"已将本群的压缩线设为 0.6。\n现在：压缩线 0.4（本会话）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 默认", group),
        f"已恢复本会话的压缩线为默认。\n现在：压缩线 0.6（本群）；{NO_USAGE}",
    )
    await run(
        app,
        group_msg("/压缩线 群 默认", group),
        f"已恢复本群的压缩线为默认。\n现在：压缩线 0.8（全局配置）；{NO_USAGE}",
    )


async def test_r_cfg_2_compress_at_shows_the_line_in_force_once_usage_is_known(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await usage(sid, 1000, window=64000, trim_budget=60000)
    await run(app, group_msg("/压缩线", group), "压缩线 0.8（全局配置）；生效线 51200 token（窗口 64000）")
    await run(
        app,
        group_msg("/压缩线 0.5", group),
        "已将本会话的压缩线设为 0.5。\n现在：压缩线 0.5（本会话）；生效线 32000 token（窗口 64000）",
    )
    await run(
        app,
        group_msg("/压缩线 0", group),
        "已将本会话的压缩线设为 0。\n现在：压缩线 0（本会话）：不按用量压缩。",
    )


async def test_r_cfg_6_history_limit_set_show_and_reset(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 2)
    await run(
        app,
        group_msg("/条数线 20", group),
        "已将本会话的条数线设为 20。\n现在：条数线 20（本会话）；当前 2 条",
    )
    assert (await runtime.get().store.get_settings("session", sid)).get("history_limit") == 20
    await run(
        app,
        group_msg("/条数线 群 30", group),
        "已将本群的条数线设为 30。\n现在：条数线 20（本会话）；当前 2 条",
    )
    await run(
        app,
        group_msg("/条数线 默认", group),
        "已恢复本会话的条数线为默认。\n现在：条数线 30（本群）；当前 2 条",
    )
    await run(app, group_msg("/条数线", group), "条数线 30（本群）；当前 2 条")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("/压缩线 1.5", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 -0.1", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 abc", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 nan", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/压缩线 群 2", "没有修改：压缩线须在 0 到 1 之间（0 表示不按用量压缩）。"),
        ("/条数线 2.5", "没有修改：条数线须是 0 到 100000 之间的整数（0 表示不按条数压缩）。"),
        ("/条数线 -1", "没有修改：条数线须是 0 到 100000 之间的整数（0 表示不按条数压缩）。"),
        ("/条数线 十", "没有修改：条数线须是 0 到 100000 之间的整数（0 表示不按条数压缩）。"),
        ("/压缩线 0.3 0.4", "用法：/压缩线 [群] [值|默认]"),
        ("/条数线 群 5 6", "用法：/条数线 [群] [值|默认]"),
    ],
)
async def test_r_cfg_2_bad_values_are_refused_with_the_range_and_nothing_changes(
    app: App, text: str, answer: str
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg(text, group), answer)
    store = runtime.get().store
    for name in ("compress_at", "history_limit"):
        assert (await store.get_settings("session", sid)).get(name) is None
        assert (await store.get_settings("place", f"onebot:group:{group}")).get(name) is None


async def test_r_cfg_2_no_group_layer_in_private(app: App) -> None:
    await run(app, private_msg("/压缩线 群 0.3"), "私聊没有群设置。")


@pytest.mark.parametrize("admin_option", [True], indirect=True)
@pytest.mark.parametrize("role", ["owner", "admin"])
@pytest.mark.parametrize(
    "text", ["/压缩线 0.3", "/压缩线 默认", "/压缩线 群 0.3", "/条数线 10", "/条数线 群 默认"]
)
async def test_r_cfg_2_the_lines_stay_superuser_only_with_the_admin_option(
    app: App, admin_option: bool, role: Role, text: str
) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await runtime.get().settings.set("compress_at", "place", f"onebot:group:{group}", 0.7)
    await run(app, group_msg(text, group, user=20002, role=role), None)
    rt = runtime.get()
    assert (await rt.settings.of_place("compress_at", group_record(SELF_ID, group))).value == 0.7
    assert (await rt.store.get_settings("session", sid)).get("compress_at") is None
    assert (await rt.store.get_settings("session", sid)).get("history_limit") is None


# ---- /记忆模式 and what a mode does --------------------------------------------------
async def turns_requested(app: App, event: Any) -> list[str]:
    """Deliver a message (nothing said back); the sessions it asked the agent to answer
    (recorded instead of run: a turn without a model would answer with an apology)."""
    asked: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime.get().agent, "request_turn", lambda sid, *a, **k: asked.append(sid))
        await run(app, event, None)
    return asked


def to_me(event: GroupMessageEvent) -> GroupMessageEvent:
    return event.model_copy(update={"to_me": True})


async def test_mode_is_set_shown_and_reset_with_its_layer(app: App) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/记忆模式 仅记录", group),
        "已将本群模式设为 仅记录。\n现在：本群模式：仅记录（本群）：只记录和压缩，不回答。",
    )
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {"mode": "record"}
    await run(app, group_msg("/记忆模式", group), "本群模式：仅记录（本群）：只记录和压缩，不回答。")
    await run(
        app,
        group_msg("/记忆模式 关", group),
        "已将本群模式设为 关。\n现在：本群模式：关（本群）：不记录也不回答（命令照常可用）。",
    )
    await run(
        app,
        group_msg("/记忆模式 默认", group),
        "已恢复本群模式为默认。\n现在：本群模式：开（全局配置）：记录并回答。",
    )
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {}


async def test_mode_in_private_is_the_sessions(app: App) -> None:
    sid = private_record(SELF_ID, SUPERUSER_ID).id
    try:
        await run(
            app,
            private_msg("/记忆模式 关"),
            "已将本会话模式设为 关。\n现在：本会话模式：关（本会话）：不记录也不回答（命令照常可用）。",
        )
        assert (await runtime.get().store.get_settings("session", sid)).get("mode") == "off"
    finally:
        await runtime.get().settings.reset("mode", "session", sid)


@pytest.mark.parametrize("text", ["/记忆模式 休息", "/记忆模式 开 关", "/记忆模式 on"])
async def test_mode_with_an_unknown_word_shows_the_usage_and_changes_nothing(app: App, text: str) -> None:
    group = new_group()
    await run(app, group_msg(text, group), "用法：/记忆模式 [开|仅记录|关|默认]")
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {}


@pytest.mark.parametrize("admin_option", [True], indirect=True)
async def test_a_group_admin_sets_the_mode_of_their_group(app: App, admin_option: bool) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/记忆模式 关", group, user=20002, role="admin"),
        Like("已将本群模式设为 关。.*"),
    )
    assert await runtime.get().controls.mode(group_record(SELF_ID, group)) == "off"


async def test_an_off_group_records_nothing_but_commands_still_work(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg("/记忆模式 关", group), Like("已将本群模式设为 关。.*"))
    assert await turns_requested(app, to_me(group_msg("小记在吗", group, user=20003))) == []
    joined = GroupIncreaseNoticeEvent.model_validate(
        {
            "time": 1_700_000_000,
            "self_id": int(SELF_ID),
            "post_type": "notice",
            "notice_type": "group_increase",
            "sub_type": "approve",
            "group_id": group,
            "user_id": 20004,
            "operator_id": 20004,
        }
    )
    await run(app, joined, None)
    assert await history(sid) == []
    await run(app, group_msg("/摘要", group), EMPTY_STATUS)
    await run(app, group_msg("/记忆模式 开", group), Like("已将本群模式设为 开。.*"))
    await run(app, group_msg("现在记下来", group, user=20003), None)
    assert [m.content for m in await history(sid)] == ["[用户20003(20003)] 现在记下来"]


async def test_a_record_only_group_records_and_never_answers(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg("/记忆模式 仅记录", group), Like("已将本群模式设为 仅记录。.*"))
    assert await turns_requested(app, to_me(group_msg("小记在吗", group, user=20003))) == []
    assert await turns_requested(app, group_msg("大家好", group, user=20003)) == []
    assert [m.content for m in await history(sid)] == [
        "[用户20003(20003)] 小记在吗",
        "[用户20003(20003)] 大家好",
    ]


async def test_an_on_group_starts_a_turn_for_a_message_to_the_bot(app: App) -> None:
    # The counterpart of the tests around it: the same message in an `on` group asks for a turn.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    assert await turns_requested(app, to_me(group_msg("小记在吗", group, user=20003))) == [sid]


async def test_default_mode_record_answers_nowhere(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    # MEMSUM_DEFAULT_MODE=record: another plugin uses the memory without a second chat bot.
    rt = runtime.get()
    config = rt.config.model_copy(update={"memsum_default_mode": "record"})
    monkeypatch.setattr(rt.settings, "_config", config)
    peer = new_group()  # a private peer of its own
    sid = private_record(SELF_ID, peer).id
    assert await turns_requested(app, private_msg("你好", user=peer)) == []
    assert [m.content for m in await history(sid)] == [f"[用户{peer}({peer})] 你好"]


# ---- /人设 ----------------------------------------------------------------------------------
async def test_persona_is_set_shown_used_and_reset(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    persona = "你是一只会说话的猫，\n说话结尾带「喵」。"
    await run(
        app,
        group_msg(f"/人设 {persona}", group),
        f"已设置本群人设（{len(persona)} 字），从下一次回答起生效。\n现在：本群人设（本群）：\n{persona}",
    )
    rt = runtime.get()
    assert (await rt.agent.system_parts(sid))[0] == persona
    await run(app, group_msg("/人设", group), f"本群人设（本群）：\n{persona}")
    await run(
        app,
        group_msg("/人设 默认", group),
        f"已恢复本群人设为默认。\n现在：本群人设（全局配置）：\n{DEFAULT_PERSONA}",
    )
    assert (await rt.agent.system_parts(sid))[0] == DEFAULT_PERSONA


async def test_a_persona_too_long_is_refused_with_the_limit(app: App) -> None:
    group = new_group()
    await run(
        app,
        group_msg("/人设 " + "喵" * (PERSONA_MAX + 1), group),
        f"没有修改：人设最长 {PERSONA_MAX} 字，这段有 {PERSONA_MAX + 1} 字。",
    )
    assert await runtime.get().store.get_settings("place", f"onebot:group:{group}") == {}


async def test_a_persona_set_in_one_group_stays_there(app: App) -> None:
    group, other = new_group(), new_group()
    await run(app, group_msg("/人设 只在这个群", group), Like("已设置本群人设.*"))
    rt = runtime.get()
    assert (await rt.settings.of_place("persona", group_record(SELF_ID, other))).value == DEFAULT_PERSONA


# ---- /清除 ------------------------------------------------------------------------------
ASK = str(ALLOWED_ANSWER["/清除"])
CLEARED = "已清除本会话的上下文和摘要。"


async def with_summary(group: int, n: int = 3) -> str:
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, n)
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": "旧摘要", "kept_messages": 0})
    return sid


async def test_r_mem_2_clear_summary_keeps_the_context(app: App) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除 摘要", group), "已清除本会话的摘要，上下文保留。")
    assert len(await history(sid)) == 3
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None


async def test_r_mem_2_clear_context_with_confirm_word_skips_the_question(app: App) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除 上下文 确认", group), CLEARED)
    assert await history(sid) == []
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None


@pytest.mark.parametrize("text", ["/清除", "/清除 上下文"])
async def test_r_mem_2_clear_context_asks_and_confirm_does_it_unrecorded(app: App, text: str) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg(text, group), ASK)
    assert len(await history(sid)) == 3  # nothing yet
    await run(app, group_msg("确认", group), CLEARED)
    # Had 「确认」 been recorded it would follow the clear; it is an operator action.
    assert await history(sid) == []
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is None
    # A second 「确认」 is plain chat again: recorded, nothing answered.
    await run(app, group_msg("确认", group), None)
    assert [m.content for m in await history(sid)] == [f"[用户{SUPERUSER_ID}({SUPERUSER_ID})] 确认"]


async def test_r_mem_2_confirm_from_someone_else_or_elsewhere_does_nothing(app: App) -> None:
    group, other = new_group(), new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除", group), ASK)
    await run(app, group_msg("确认", group, user=20003), None)  # another member: chat
    await run(app, group_msg("确认", other), None)  # the same user elsewhere: chat
    assert len(await history(sid)) == 4
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None
    await run(app, group_msg("确认", group), CLEARED)
    assert await history(sid) == []


async def confirmed_after(app: App, monkeypatch: pytest.MonkeyPatch, seconds: int, expect: str | None) -> str:
    """/清除 in a new group with a summary, and 「确认」 `seconds` later, which the bot answers
    with exactly `expect` (None: nothing); the session's id."""
    group = new_group()
    sid = await with_summary(group)
    now = clock.now()
    monkeypatch.setattr(clock, "now", lambda: now)
    await run(app, group_msg("/清除", group), ASK)
    monkeypatch.setattr(clock, "now", lambda: now + seconds)
    await run(app, group_msg("确认", group), expect)
    return sid


async def test_r_mem_2_confirm_after_60_seconds_is_too_late(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await confirmed_after(app, monkeypatch, 61, None)
    assert len(await history(sid)) == 4  # the late 「确认」 is ordinary chat
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None


async def test_r_mem_2_confirm_within_60_seconds_counts(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = await confirmed_after(app, monkeypatch, 60, CLEARED)
    assert await history(sid) == []


@pytest.mark.parametrize("admin_option", [True], indirect=True)
async def test_r_mem_2_group_admin_clears_with_confirmation(app: App, admin_option: bool) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg("/清除", group, user=20002, role="admin"), ASK)
    await run(app, group_msg("确认", group, user=20002, role="admin"), CLEARED)
    assert await history(sid) == []


@pytest.mark.parametrize("text", ["/清除 全部", "/清除 摘要 确认 现在", "/清除 上下文 好的"])
async def test_clear_with_unknown_words_shows_usage_and_clears_nothing(app: App, text: str) -> None:
    group = new_group()
    sid = await with_summary(group)
    await run(app, group_msg(text, group), "用法：/清除 [上下文|摘要]")
    assert len(await history(sid)) == 3
    assert await runtime.get().store.get_meta(SUMMARY_NAMESPACE, sid) is not None


# ---- help ---------------------------------------------------------------------------
def test_usage_lists_every_command() -> None:
    named = [c.name for c in COMMANDS if c.name]
    assert sorted(named) == sorted(
        ["压缩", "摘要", "压缩线", "条数线", "清除", "回忆", "记忆帮助", "记忆模式", "人设", "用量", "限额"]
    )
    for name in named:
        assert f"\n/{name} " in f"\n{USAGE}"


# ---- the texts, pure ----------------------------------------------------------------
def status(**changes: Any) -> SessionStatus:
    base: dict[str, Any] = {
        "summary": None,
        "summary_time": None,
        "kept_messages": 0,
        "last_run": None,
        "running": False,
        "usage": None,
        "line": None,
        "window": None,
        "compress_at": 0.8,
        "history_limit": 0,
        "active_messages": 0,
        "backoff_failures": 0,
        "backoff_turns_left": 0,
    }
    return SessionStatus(**{**base, **changes})


def test_status_text_of_an_empty_session() -> None:
    assert status_text(status()) == EMPTY_STATUS


def test_r_back_3_status_text_shows_the_back_off_only_after_failures() -> None:
    failing = status(
        backoff_failures=2,
        backoff_turns_left=3,
        last_run=LastRun(time=0, outcome="error", reason="摘要模型出错：超时", kept_messages=0, archived=0),
    )
    text = status_text(failing)
    assert "失败：摘要模型出错：超时" in text
    assert text.endswith("自动压缩退避中：已连续失败 2 次，再过 3 轮对话才会重试。")
    assert "退避" not in status_text(status(backoff_failures=0, backoff_turns_left=0))


def test_status_text_says_when_a_compression_is_running() -> None:
    assert status_text(status(running=True)).endswith("正在压缩中…")


def test_receipt() -> None:
    done = CompressionResult("s", "done", tokens_before=9000, tokens_after=1200, kept_messages=3, archived=40)
    assert receipt(done) == "压缩完成：9000 → 1200 token，保留原文 3 条，归档 40 条。"
    assert receipt(CompressionResult("s", "nothing")) == "没有需要压缩的内容。"


def test_setting_text_names_the_layer_and_the_meaning() -> None:
    assert (
        setting_text("compress_at", Resolved(0.75, "platform"), status())
        == f"压缩线 0.75（平台档）；{NO_USAGE}"
    )
    assert (
        setting_text("compress_at", Resolved(0.5, "place"), status(line=20000, window=40000))
        == "压缩线 0.5（本群）；生效线 20000 token（窗口 40000）"
    )
    assert (
        setting_text("history_limit", Resolved(0, "global"), status())
        == "条数线 0（全局配置）：不按条数压缩。"
    )


@pytest.mark.parametrize(("word", "value"), [("0", 0.0), ("1", 1.0), (".25", 0.25), ("1e-1", 0.1)])
def test_parse_setting_accepts_the_range(word: str, value: float) -> None:
    assert parse_setting("compress_at", word) == value


def test_parse_setting_history_limit_is_an_integer() -> None:
    assert parse_setting("history_limit", "40") == 40
    assert isinstance(parse_setting("history_limit", "40.0"), int)
    with pytest.raises(ValueError, match="整数"):
        parse_setting("history_limit", "inf")


# ---- QA regressions ------------------------------------------------------------------------


async def test_compress_with_an_argument_answers_the_usage_and_compresses_nothing(app: App) -> None:
    # `/压缩 取消` read as `/压缩` would compress when the user meant to stop.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await seed(sid, group, 2)
    await run(app, group_msg("/压缩 取消", group), "用法：/压缩（不带参数）")
    assert len(await history(sid)) == 2
    assert (await runtime.get().compression.status(sid)).last_run is None


async def test_a_command_from_the_bots_own_account_is_ignored(app: App) -> None:
    # Some implementations report the bot's own messages; an answer starting with "/" must
    # not make the bot answer itself.
    await run(app, group_msg("/摘要", new_group(), user=int(SELF_ID)), None)


async def test_a_forwarded_summary_carries_cq_code_as_text(app: App) -> None:
    # Implementations parse a string node content as CQ codes: a summary quoting
    # `[CQ:at,qq=all]` would make the bot @ everyone.
    group = new_group()
    sid = group_record(SELF_ID, group).id
    long_text = "有人发了 [CQ:at,qq=all] 想让机器人复述。" * 20
    await runtime.get().store.put_meta(SUMMARY_NAMESPACE, sid, {"text": long_text, "kept_messages": 0})

    def as_text(nodes: Any) -> bool:
        contents = [n["data"]["content"] for n in nodes]
        return all(seg["type"] == "text" for c in contents for seg in c) and long_text in "".join(
            seg["data"]["text"] for c in contents for seg in c
        )

    event = group_msg("/摘要", group)
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        ctx.should_call_api(
            "send_group_forward_msg", {"group_id": group, "messages": Satisfies(as_text)}, result={}
        )


async def test_an_empty_message_event_is_neither_recorded_nor_answered(app: App) -> None:
    group = new_group()
    await run(app, group_msg("", group, user=20003), None)
    await run(app, private_msg("  ", user=group), None)  # a private peer of its own
    assert await history(group_record(SELF_ID, group).id) == []
    assert await history(private_record(SELF_ID, group).id) == []


def test_plugin_metadata_is_complete_for_the_plugin_store() -> None:
    # What the NoneBot plugin store reads: type, adapters, config class and a usage that
    # names every command.
    from nonebot import get_plugin

    from nonebot_plugin_memsum.config import Config

    plugin = get_plugin("nonebot_plugin_memsum")
    assert plugin is not None
    meta = plugin.metadata
    assert meta is not None
    assert meta.type == "application"
    assert meta.supported_adapters == {"~onebot.v11"}
    assert meta.config is Config
    assert meta.homepage
    for command in COMMANDS:
        if command.name:
            assert f"/{command.name} " in meta.usage
