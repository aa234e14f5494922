"""The commands the bot's owner (and, when allowed, group owners and admins) use.

Every matcher is declared in `register_commands`; each command's flow is a function
of its own that returns the text to answer. Commands block at a priority above the
recording matcher, so a command (refused or not) never enters history nor reaches
the model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from nonebot import on_command, on_message
from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, MessageEvent
from nonebot.adapters.onebot.v11 import Message as OBMessage
from nonebot.log import logger
from nonebot.matcher import Matcher
from nonebot.params import CommandArg
from nonebot.permission import SUPERUSER
from nonebot.rule import Rule
from nonebot.typing import T_State

from . import clock, onebot, runtime
from .compression.service import STORE_FAILED, CompressionError, CompressionResult, SessionStatus
from .config import Config
from .settings import Resolved, SettingName, place_key, validate
from .store import StoreError
from .types import SessionRecord

USAGE = """\
/压缩  立即压缩本会话
/摘要  查看摘要、保留原文、上次压缩和用量
/压缩线 [0~1|默认]  查看或设置本会话的压缩线（0 = 不按用量压缩）
/条数线 [条数|默认]  查看或设置本会话的条数线（0 = 不按条数压缩）
  在值前加「群」改整个群的设置，如 /压缩线 群 0.5
/清除 [上下文|摘要]  清除上下文（连同摘要，需再回复「确认」）或只清除摘要
/记忆帮助  显示本帮助
以上命令仅限机器人的主人；开启 MEMSUM_GROUP_ADMIN_COMMANDS 后，群主和管理员也可在本群使用 \
/压缩、/摘要、/清除，并查看两条线（修改仍限主人）。"""

CONFIRM_WORD = "确认"
CONFIRM_SECONDS = 60
REFUSED = "抱歉，只有机器人的主人可以使用这个命令。"
REFUSED_ADMINS = "抱歉，只有机器人的主人和群管理员可以使用这个命令。"
REFUSED_CHANGE = "抱歉，只有机器人的主人可以修改这项设置。"
FAILED = "出错了，详情已记在日志里。"
_SETTING_TITLES: dict[SettingName, str] = {"compress_at": "压缩线", "history_limit": "条数线"}


@dataclass(frozen=True, slots=True)
class _Call:
    """One command as received: who, where and the words after it."""

    event: MessageEvent
    record: SessionRecord
    owner: bool
    args: tuple[str, ...]


Flow = Callable[[_Call], Awaitable[str]]


# ---- pure text ----------------------------------------------------------------------
def format_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def format_value(name: SettingName, value: float) -> str:
    return f"{float(value):g}" if name == "compress_at" else str(int(value))


def receipt(result: CompressionResult) -> str:
    """The one line `/压缩` answers with."""
    if result.outcome == "nothing":
        return "没有需要压缩的内容。"
    return (
        f"压缩完成：{result.tokens_before} → {result.tokens_after} token，"
        f"保留原文 {result.kept_messages} 条，归档 {result.archived} 条。"
    )


def usage_line(status: SessionStatus) -> str:
    """Usage against the compression line E in force (R-CFG-2, R-TRIG-3)."""
    if status.usage is None:
        return "还没有用量记录（本会话尚未调用模型）。"
    if status.line is None:
        return f"用量 {status.usage} token；压缩线已关闭，不按用量压缩。"
    window = f"（窗口 {status.window}）" if status.window else ""
    return f"用量 {status.usage} / 压缩线 {status.line} token{window}"


def count_line(status: SessionStatus) -> str:
    if status.history_limit <= 0:
        return f"条数 {status.active_messages}；条数线未开启。"
    return f"条数 {status.active_messages} / 条数线 {status.history_limit}"


def status_text(status: SessionStatus) -> str:
    """What `/摘要` shows."""
    lines: list[str] = []
    if status.summary:
        when = f"（{format_time(status.summary_time)}）" if status.summary_time else ""
        lines += [f"本会话摘要{when}：", status.summary.strip(), ""]
    else:
        lines.append("本会话还没有摘要。")
    lines.append(f"保留原文 {status.kept_messages} 条")
    run = status.last_run
    if run is None:
        lines.append("还没有压缩过。")
    elif run.outcome == "done":
        lines.append(
            f"上次压缩：{format_time(run.time)} 成功，归档 {run.archived} 条，保留原文 {run.kept_messages} 条"
        )
    else:
        lines.append(f"上次压缩：{format_time(run.time)} 失败：{run.reason or '原因未知'}")
    lines += [usage_line(status), count_line(status)]
    if status.backoff_failures > 0:  # R-BACK-3
        lines.append(
            f"自动压缩退避中：已连续失败 {status.backoff_failures} 次，"
            f"再过 {status.backoff_turns_left} 轮对话才会重试。"
        )
    if status.running:
        lines.append("正在压缩中…")
    return "\n".join(lines)


def setting_text(name: SettingName, resolved: Resolved, status: SessionStatus) -> str:
    """An effective value, its layer, and what it means now."""
    head = f"{_SETTING_TITLES[name]} {format_value(name, resolved.value)}（{resolved.layer_label}）"
    if name == "compress_at":
        if not resolved.value:
            return f"{head}：不按用量压缩。"  # R-CFG-4
        if status.line is None:
            return f"{head}；还没有用量记录，生效线在首次调用模型后才知道。"
        window = f"（窗口 {status.window}）" if status.window else ""
        return f"{head}；生效线 {status.line} token{window}"
    if not resolved.value:
        return f"{head}：不按条数压缩。"
    return f"{head}；当前 {status.active_messages} 条"


def parse_setting(name: SettingName, word: str) -> float | int:
    """A value typed in chat, checked against the allowed range (ValueError in Chinese)."""
    try:
        number = float(word)
    except ValueError:
        number = math.nan  # malformed: refused with the same range message as out of range
    return validate(name, number)


# ---- who may ------------------------------------------------------------------------
def _group_admin(event: MessageEvent) -> bool:
    if not runtime.get().config.memsum_group_admin_commands:
        return False
    return isinstance(event, GroupMessageEvent) and event.sender.role in ("owner", "admin")


def _session_record(bot: Bot, event: MessageEvent) -> SessionRecord:
    if isinstance(event, GroupMessageEvent):
        return onebot.group_record(bot.self_id, event.group_id)
    return onebot.private_record(bot.self_id, event.user_id)


# ---- the flows ----------------------------------------------------------------------
async def _compress(call: _Call) -> str:
    if call.args:  # `/压缩 取消` must not compress
        return "用法：/压缩（不带参数）"
    try:
        result = await runtime.get().compression.compress(call.record.id)
    except CompressionError as err:
        return f"压缩失败：{err.reason}"
    except StoreError:  # R-RUN-11: rolled back, and the run has logged it
        return f"压缩失败：{STORE_FAILED}"
    logger.info(f"memsum: {call.event.user_id} compressed {call.record.id} ({result.outcome})")
    return receipt(result)


async def _summary(call: _Call) -> str:
    return status_text(await runtime.get().compression.status(call.record.id))


async def _compress_at(call: _Call) -> str:
    return await _setting("compress_at", call)


async def _history_limit(call: _Call) -> str:
    return await _setting("history_limit", call)


async def _setting(name: SettingName, call: _Call) -> str:
    """Show, set or reset one layered setting (R-CFG-2: changing it is for owners only)."""
    rt = runtime.get()
    title = _SETTING_TITLES[name]
    words = list(call.args)
    scope: Literal["session", "place"] = "session"
    if words[:1] == ["群"]:
        scope, words = "place", words[1:]
    if len(words) > 1:
        return f"用法：/{title} [群] [值|默认]"
    if words:
        if not call.owner:  # R-CFG-2: only an owner changes it, whatever the admin option says
            return REFUSED_CHANGE
        key = call.record.id if scope == "session" else place_key(call.record)
        if key is None:
            return "私聊没有群设置。"
        where = "本会话" if scope == "session" else "本群"
        if words[0] == "默认":
            await rt.settings.reset(name, scope, key)
            done = f"已恢复{where}的{title}为默认。"
        else:
            try:
                value = parse_setting(name, words[0])
            except ValueError as err:
                return f"没有修改：{err}。"
            await rt.settings.set(name, scope, key, value)
            done = f"已将{where}的{title}设为 {format_value(name, value)}。"
        logger.info(f"memsum: {call.event.user_id} changed {name} of {scope} {key}: {words[0]}")
        return f"{done}\n现在：{await _show_setting(name, call.record)}"
    return await _show_setting(name, call.record)


async def _show_setting(name: SettingName, record: SessionRecord) -> str:
    rt = runtime.get()
    resolved = await rt.settings.effective(
        name, record.id, entry_platform=record.platform, entry_type=record.kind
    )
    return setting_text(name, resolved, await rt.compression.status(record.id))


async def _clear(call: _Call) -> str:
    words = list(call.args)
    kind = words.pop(0) if words else "上下文"
    confirmed = words == [CONFIRM_WORD]
    if kind not in ("上下文", "摘要") or (words and not confirmed):
        return "用法：/清除 [上下文|摘要]"
    if kind == "摘要":
        await runtime.get().compression.clear(call.record.id, "summary")
        logger.info(f"memsum: {call.event.user_id} cleared the summary of {call.record.id}")
        return "已清除本会话的摘要，上下文保留。"
    if not confirmed:
        _pending[_confirm_key(call.record, call.event)] = clock.now() + CONFIRM_SECONDS
        return f"将清除本会话的全部上下文和摘要，无法恢复。{CONFIRM_SECONDS} 秒内回复「{CONFIRM_WORD}」继续。"
    return await _clear_context(call)


async def _clear_context(call: _Call) -> str:
    # R-MEM-2/3: also drops the summary and cancels a compression still waiting on the model.
    await runtime.get().compression.clear(call.record.id, "context")
    logger.info(f"memsum: {call.event.user_id} cleared the context of {call.record.id}")
    return "已清除本会话的上下文和摘要。"


async def _help(call: _Call) -> str:
    return USAGE


# ---- confirmation of /清除 上下文 -----------------------------------------------------
_pending: dict[tuple[str, str], float] = {}
"""(session id, user id) → the moment the offer to clear the context runs out."""


def _confirm_key(record: SessionRecord, event: MessageEvent) -> tuple[str, str]:
    return record.id, str(event.user_id)


async def _is_confirmation(bot: Bot, event: MessageEvent) -> bool:
    """「确认」 from the user who asked, in the same session, in time; anything else flows on."""
    if event.get_plaintext().strip() != CONFIRM_WORD:
        return False
    key = _confirm_key(_session_record(bot, event), event)
    deadline = _pending.get(key)
    if deadline is None:
        return False
    if clock.now() > deadline:
        del _pending[key]
        return False
    return True


async def _confirm(call: _Call) -> str:
    if _pending.pop(_confirm_key(call.record, call.event), None) is None:
        return "没有等待确认的操作。"  # another 确认 of the same user won the race
    return await _clear_context(call)


# ---- wiring -------------------------------------------------------------------------
_COMMANDS: tuple[tuple[str | None, Flow], ...] = (
    ("压缩", _compress),
    ("摘要", _summary),
    ("压缩线", _compress_at),
    ("条数线", _history_limit),
    ("清除", _clear),
    ("记忆帮助", _help),
    (None, _confirm),  # a plain 「确认」 answering /清除 上下文
)


def _handler(name: str, flow: Flow) -> Callable[..., Awaitable[None]]:
    async def handle(
        matcher: Matcher, bot: Bot, event: MessageEvent, state: T_State, arg: OBMessage | None = CommandArg()
    ) -> None:
        onebot.release_arrival(state)  # a command is never stored; a long /压缩 must not hold later messages
        if str(event.user_id) == bot.self_id:
            await matcher.finish()  # the bot's own message echoed back (a reply starting with "/")
        owner = await SUPERUSER(bot, event)
        if not owner and not _group_admin(event):
            admins_allowed = runtime.get().config.memsum_group_admin_commands
            text = REFUSED_ADMINS if admins_allowed and isinstance(event, GroupMessageEvent) else REFUSED
        else:
            record = _session_record(bot, event)
            await runtime.get().store.save_session(record)  # the place layer needs the record
            words = tuple(arg.extract_plain_text().split()) if arg is not None else ()
            try:
                text = await flow(_Call(event, record, owner, words))
            except Exception:
                logger.exception(f"memsum: command {name} failed")
                text = FAILED
        try:
            await onebot.send_reply(bot, event, text)
        except Exception as err:  # the connection (or the bot, shutting down) is gone
            logger.warning(f"memsum: could not answer {name}: {type(err).__name__}: {err}")
        await matcher.finish()

    return handle


def register_commands(config: Config) -> None:
    """Declare every command; they block, above the recording matcher's priority."""
    priority = config.memsum_command_priority
    for name, flow in _COMMANDS:
        if name is None:
            matcher = on_message(rule=Rule(_is_confirmation), priority=priority, block=True)
        else:
            matcher = on_command(name, priority=priority, block=True)
        matcher.handle()(_handler(name or CONFIRM_WORD, flow))
