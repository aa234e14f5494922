"""The commands the bot's owner (and, when allowed, group owners and admins) use.

One matcher, declared in `register_commands`, serves the one table `COMMANDS`; each
command's flow is a function of its own that returns the text to answer. Who may use a
command is its NoneBot permission (`permission.py`), checked by the matcher's rule: for
anyone else the matcher does not run, so the command is not answered, not recorded, and
goes on to other plugins.
Commands block at a priority above the recording matcher, so a command never enters
history nor reaches the model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo
from typing import Literal

from nonebot import get_driver, on_message
from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, MessageEvent
from nonebot.adapters.onebot.v11 import Message as OBMessage
from nonebot.consts import CMD_ARG_KEY, CMD_KEY, CMD_WHITESPACE_KEY, PREFIX_KEY
from nonebot.log import logger
from nonebot.matcher import Matcher
from nonebot.params import CommandArg
from nonebot.permission import Permission
from nonebot.rule import TRIE_VALUE, Rule, TrieRule, command
from nonebot.typing import T_State

from . import clock, onebot, runtime, usage
from .agent import recall
from .agent.prompt import cut_text
from .agent.turn import Entry
from .compression.service import STORE_FAILED, CompressionError, CompressionResult, SessionStatus
from .compression.units import build_units
from .config import PERSONA_MAX, Config, Mode
from .llm.tokens import estimate_text_tokens
from .lru import LRU
from .onebot import recovery
from .onebot.fastpath import Claim
from .onebot.render import TRAILING, bidi_visible, word_goes_on
from .permission import SUPERUSER, SUPERUSER_OR_GROUP_ADMIN
from .settings import (
    LAYER_LABELS,
    MODE_WORDS,
    NO_CAP_WORD,
    RESET_WORD,
    Resolved,
    SettingName,
    place_key,
    place_scope,
    typed,
    validate,
)
from .store import SearchQuery, StoreError
from .store.search import match_expression
from .types import Message, SessionRecord

CONFIRM_WORD = "确认"
CONFIRM_SECONDS = 60
FAILED = "出错了，详情已记在日志里。"
_SETTING_TITLES: dict[SettingName, str] = {"compress_at": "压缩线", "history_limit": "条数线"}
_MODE_MEANINGS: dict[Mode, str] = {
    "on": "记录并回答",
    "record": "只记录和压缩，不回答",
    "off": "不记录也不回答（命令照常可用）",
}
_WORD_MODES: dict[str, Mode] = {word: mode for mode, word in MODE_WORDS.items()}
_SCOPE_WORDS = {"place": "本群", "session": "本会话"}


@dataclass(frozen=True, slots=True)
class _Call:
    """One command as received: who, where and the words after it."""

    bot: Bot
    event: MessageEvent
    record: SessionRecord
    superuser: bool
    text: str
    """Everything after the command, as typed (a persona keeps its line breaks)."""

    @property
    def args(self) -> tuple[str, ...]:
        """The words, a sentence's end typed after the last one dropped (「/记忆模式 关。」)."""
        words = self.text.split()
        if words:
            words[-1] = words[-1].rstrip(TRAILING)
        return tuple(w for w in words if w)


Flow = Callable[[_Call], Awaitable[str]]
RECALL_USAGE = "用法：/回忆 关键词 [@某人] [YYYY-MM-DD[..YYYY-MM-DD]]"
RECALL_LIMIT = 10
_DATE_RANGE = re.compile(rf"^({recall.DATE})(?:(?:\.\.|~|～)({recall.DATE}))?$")


# ---- pure text ----------------------------------------------------------------------
def format_time(ts: float, zone: tzinfo | None = None) -> str:
    """A moment in the bot's time zone (`MEMSUM_TIMEZONE`, as /回忆 and /用量 use it)."""
    return datetime.fromtimestamp(ts, zone).strftime("%Y-%m-%d %H:%M")


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


def settings_line(status: SessionStatus) -> str:
    """Both lines as set and the layer each comes from (R-CFG-2: every value a command
    shows says where it comes from)."""
    lines: tuple[tuple[SettingName, float, str], ...] = (
        ("compress_at", status.compress_at, status.compress_at_layer),
        ("history_limit", status.history_limit, status.history_limit_layer),
    )
    parts = [f"{_SETTING_TITLES[n]} {format_value(n, v)}（{LAYER_LABELS[layer]}）" for n, v, layer in lines]
    return "设置：" + "，".join(parts)


def status_text(status: SessionStatus, zone: tzinfo | None = None, kept: Sequence[Message] = ()) -> str:
    """What `/摘要` shows; `kept`: the kept originals themselves (R-RUN-12), as the summary
    model read them when it chose them (R-RUN-3: a tool group as its calls and results, a
    withdrawn message as withdrawn)."""
    lines: list[str] = []
    if status.summary:
        when = f"（{format_time(status.summary_time, zone)}）" if status.summary_time else ""
        # The summary model quotes members, direction controls and all.
        lines += [f"本会话摘要{when}：", bidi_visible(status.summary.strip()), ""]
    else:
        lines.append("本会话还没有摘要。")
    lines.append(f"保留原文 {status.kept_messages} 条" + ("：" if kept else ""))
    lines += [bidi_visible(unit.text) for unit in build_units(kept)]
    run = status.last_run
    if run is None:
        lines.append("还没有压缩过。")
    elif run.outcome == "done":
        lines.append(
            f"上次压缩：{format_time(run.time, zone)} 成功，"
            f"归档 {run.archived} 条，保留原文 {run.kept_messages} 条"
        )
    else:
        lines.append(f"上次压缩：{format_time(run.time, zone)} 失败：{run.reason or '原因未知'}")
    lines += [usage_line(status), count_line(status), settings_line(status)]
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
        number = float(typed(word))
    except ValueError:
        number = math.nan  # malformed: refused with the same range message as out of range
    value = validate(name, number)
    assert not isinstance(value, str)  # a number in, a number out
    return value


# ---- the flows ----------------------------------------------------------------------
async def _compress(call: _Call) -> str:
    try:
        result = await runtime.get().compression.compress(call.record.id)
    except CompressionError as err:
        return f"压缩失败：{err.reason}"
    except StoreError:  # R-RUN-11: rolled back, and the run has logged it
        return f"压缩失败：{STORE_FAILED}"
    logger.info(f"memsum: {call.event.user_id} compressed {call.record.id} ({result.outcome})")
    return receipt(result)


async def _summary(call: _Call) -> str:
    rt = runtime.get()
    status = await rt.compression.status(call.record.id)
    kept = await rt.compression.kept_originals(call.record.id, status.kept_messages)
    return status_text(status, usage.zone_of(rt.config), kept)


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
    key = call.record.id if scope == "session" else place_key(call.record)
    if key is None:
        return "私聊没有群设置。"  # asked to show or to change: either way there is no group
    if words:
        where = "本会话" if scope == "session" else "本群"
        if words[0] == RESET_WORD:
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


def mode_text(resolved: Resolved, where: str) -> str:
    mode: Mode = resolved.value  # type: ignore[assignment]  # validated on the way in
    return f"{where}模式：{MODE_WORDS[mode]}（{resolved.layer_label}）：{_MODE_MEANINGS[mode]}。"


async def _mode(call: _Call) -> str:
    """Show or set the place's mode (a layered setting)."""
    rt = runtime.get()
    scope, key = place_scope(call.record)
    where = _SCOPE_WORDS[scope]
    words = call.args
    if len(words) > 1 or (words and words[0] not in (*_WORD_MODES, RESET_WORD)):
        return "用法：/记忆模式 [开|仅记录|关|默认]"
    before = (await rt.settings.of_place("mode", call.record)).value
    if words == (RESET_WORD,):
        await rt.settings.reset("mode", scope, key)
    elif words:
        await rt.settings.set("mode", scope, key, _WORD_MODES[words[0]])
    resolved = await rt.settings.of_place("mode", call.record)
    await rt.controls.switched(call.record, before, resolved.value)
    now = mode_text(resolved, where)
    if not words:
        return now
    if resolved.value != "off":
        # Chatter recorded since the last turn end was never judged: a place switched on
        # is judged once now, as a 仅记录 place is after each message, so its first
        # question does not wait for the backlog's compression.
        await rt.compression.judge_recorded(call.record.id, Entry(call.record.platform, call.record.kind))
    logger.info(f"memsum: {call.event.user_id} set the mode of {scope} {key}: {words[0]}")
    done = f"已恢复{where}模式为默认。" if words == (RESET_WORD,) else f"已将{where}模式设为 {words[0]}。"
    return f"{done}\n现在：{now}"


async def _persona(call: _Call) -> str:
    """Show or set the place's persona (a layered setting), capped at PERSONA_MAX characters."""
    rt = runtime.get()
    scope, key = place_scope(call.record)
    where = _SCOPE_WORDS[scope]
    text = call.text.strip()
    done = ""
    if text == RESET_WORD:
        await rt.settings.reset("persona", scope, key)
        done = f"已恢复{where}人设为默认。"
    elif text:
        try:
            validate("persona", text)
        except ValueError as err:
            return f"没有修改：{err}。"
        if refusal := runtime.persona_refusal(rt, text):
            return f"没有修改：{refusal}。"
        await rt.settings.set("persona", scope, key, text)
        done = f"已设置{where}人设（{len(text)} 字），从下一次回答起生效。"
    resolved = await rt.settings.of_place("persona", call.record)
    shown = f"{where}人设（{resolved.layer_label}）：\n{resolved.value}"
    if over := runtime.persona_overflow(rt, str(resolved.value)):
        # Set under a model with a larger window: the turns send only its head (Agent.fit_persona).
        tokens, budget, model_id = over
        kept = len(cut_text(str(resolved.value), budget // 2, estimate_text_tokens))
        shown += (
            f"\n（注意：这段人设约 {tokens} token，超过了当前模型 {model_id} 每次请求可用的一半"
            f"（{budget} token），回答时只带上前 {kept} 字。请写短一些。）"
        )
    if not done:
        return shown
    logger.info(f"memsum: {call.event.user_id} changed the persona of {scope} {key}")
    return f"{done}\n现在：{shown}"


async def _usage(call: _Call) -> str:
    """This place's usage and cost in a period; a superuser in private also gets the top places."""
    rt = runtime.get()
    period = typed("".join(call.args)) or "今天"
    if period not in usage.PERIODS:
        return "用法：/用量 [今天|7天|30天|全部]"
    since = usage.period_start(period, clock.now(), rt.controls.zone)
    place = usage.usage_place(call.record)
    rows, activity = await usage.load(rt.store, place, since)
    models = {m.id: m for m in rt.config.memsum_models}
    cap = await rt.settings.of_place("daily_token_cap", call.record)
    parts = [
        usage.report_text(_SCOPE_WORDS[place_scope(call.record)[0]], period, rows, activity, models),
        usage.cap_text(int(cap.value), cap.layer_label, await rt.controls.used_today(call.record)),
    ]
    if call.superuser and not isinstance(call.event, GroupMessageEvent):
        parts.append(
            usage.top_text(period, usage.rank_places(await rt.store.usage_rows(None, since), models))
        )
    return "\n\n".join(parts)


async def _cap(call: _Call) -> str:
    """Show or set the place's daily token cap (a layered setting); 无 = no cap here."""
    rt = runtime.get()
    scope, key = place_scope(call.record)
    where = _SCOPE_WORDS[scope]
    words = call.args
    if len(words) > 1:
        return "用法：/限额 [token 数|无|默认]"
    if words == (RESET_WORD,):
        await rt.settings.reset("daily_token_cap", scope, key)
    elif words:
        try:
            value = 0 if words[0] == NO_CAP_WORD else parse_setting("daily_token_cap", words[0])
            await rt.settings.set("daily_token_cap", scope, key, value)
        except ValueError as err:
            return f"没有修改：{err}。"
    resolved = await rt.settings.of_place("daily_token_cap", call.record)
    now = usage.cap_text(int(resolved.value), resolved.layer_label, await rt.controls.used_today(call.record))
    if not words:
        return f"{where}{now}"
    logger.info(f"memsum: {call.event.user_id} set the daily cap of {scope} {key}: {words[0]}")
    return f"已修改{where}每日限额。\n现在：{where}{now}"


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
        # R-MEM-2: the messages are archived, not deleted: say so.
        return (
            "将清除本会话的全部上下文和摘要：之前的消息只留在存档里，不会再发给模型。"
            f"{CONFIRM_SECONDS} 秒内回复「{CONFIRM_WORD}」继续。"
        )
    return await _clear_context(call)


async def _clear_context(call: _Call) -> str:
    # R-MEM-2/3: also drops the summary and cancels a compression still waiting on the model.
    await runtime.get().compression.clear(call.record.id, "context")
    # A question about the context just cleared is settled: a later 「确认」 is chat again.
    for key in [key for key in _pending if key[0] == call.record.id]:
        del _pending[key]
    logger.info(f"memsum: {call.event.user_id} cleared the context of {call.record.id}")
    return "已清除本会话的上下文和摘要。"


def parse_recall(
    session_id: str, words: Sequence[str], mentions: Sequence[str], zone: tzinfo | None = None
) -> SearchQuery:
    """`/回忆` arguments: keywords, one speaker (an @, or `@昵称`/`@QQ号` typed), one date or
    range (both days included). ValueError in Chinese."""
    keywords: list[str] = []
    speakers = list(mentions)
    since = until = None
    for word in words:
        if (m := _DATE_RANGE.match(word)) is not None:
            if since is not None:
                raise ValueError("只能给一个日期或日期范围")
            since = recall.parse_time(m.group(1), zone=zone)
            until = recall.parse_time(m.group(2) or m.group(1), end=True, zone=zone)
        elif word.startswith(("@", "＠")) and len(word) > 1:
            speakers.append(word[1:])
        else:
            keywords.append(word)
    if len(speakers) > 1:
        raise ValueError("一次只能指定一个人")
    if since is not None and until is not None and until <= since:
        raise ValueError(recall.BACKWARDS)
    speaker = speakers[0] if speakers else None
    query = SearchQuery(session_id, " ".join(keywords), speaker, since, until, RECALL_LIMIT)
    if match_expression(query.text) is None and not speaker:
        raise ValueError("请给出关键词或 @某人" if not keywords else recall.NO_TERMS)
    return query


async def _recall(call: _Call) -> str:
    """The matches of this session only (a group never sees another place), best first."""
    mentions = [
        str(seg.data.get("qq"))
        for seg in call.event.message
        if seg.type == "at" and str(seg.data.get("qq")) not in ("all", str(call.event.self_id))
    ]
    zone = usage.zone_of(runtime.get().config)
    try:
        query = parse_recall(call.record.id, call.args, mentions, zone)
    except ValueError as err:
        return f"{err}\n{RECALL_USAGE}"
    # One more than it lists: whether there are more to say so (the rest is out of reach here).
    hits = await runtime.get().store.search(replace(query, limit=RECALL_LIMIT + 1))
    if not hits:
        return recall.NOTHING
    # The recall tool hands the model the same lines as said; the owner sees the controls.
    lines = [bidi_visible(recall.line(h.message, zone)) for h in hits[:RECALL_LIMIT]]
    if len(hits) > RECALL_LIMIT:
        head = (
            f"找到 {RECALL_LIMIT} 条以上，只列出最相关的 {RECALL_LIMIT} 条"
            "（按相关程度排列；加关键词、@某人或日期可缩小范围）："
        )
    else:
        head = f"找到 {len(hits)} 条（按相关程度排列）："
    return head + "\n" + "\n".join(lines)


async def _help(call: _Call) -> str:
    """What the asker may use, here (as NoneBot's permission of each command decides it)."""
    bot = call.bot
    lines = [c.usage for c in COMMANDS if c.name and await c.permission(bot, call.event)]
    return "\n".join([*lines, *_HELP_NOTES])


# ---- confirmation of /清除 上下文 -----------------------------------------------------
_pending: LRU[tuple[str, str], float] = LRU()
"""(session id, user id) → the moment the offer to clear the context runs out."""


def _confirm_key(record: SessionRecord, event: MessageEvent) -> tuple[str, str]:
    return record.id, str(event.user_id)


async def _is_confirmation(bot: Bot, event: MessageEvent) -> bool:
    """「确认」 from the user who asked, in the same session, in time; anything else flows on."""
    if event.get_plaintext().strip().rstrip(TRAILING).rstrip() != CONFIRM_WORD:  # 「确认。」 too
        return False
    key = _confirm_key(onebot.record_of(bot, event)[0], event)
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
@dataclass(frozen=True, slots=True)
class Command:
    """One command: its name (None: a plain 「确认」), flow, who may use it, its help line;
    `bare`: it takes no argument, and answers one with its usage line (`/压缩 取消` must not
    compress, 「/摘要 今天」 would read as if the word meant something)."""

    name: str | None
    flow: Flow
    permission: Permission
    usage: str
    bare: bool = False


COMMANDS: tuple[Command, ...] = (
    Command("压缩", _compress, SUPERUSER_OR_GROUP_ADMIN, "/压缩  立即压缩本会话", bare=True),
    Command(
        "摘要", _summary, SUPERUSER_OR_GROUP_ADMIN, "/摘要  查看摘要、保留原文、上次压缩和用量", bare=True
    ),
    Command(
        "清除",
        _clear,
        SUPERUSER_OR_GROUP_ADMIN,
        "/清除 [上下文|摘要]  清除上下文（连同摘要，需再回复「确认」）或只清除摘要",
    ),
    Command(
        "回忆",
        _recall,
        SUPERUSER_OR_GROUP_ADMIN,
        "/回忆 关键词 [@某人] [YYYY-MM-DD[..YYYY-MM-DD]]  查找本会话的聊天记录原文（含已压缩的）",
    ),
    Command(
        "记忆模式",
        _mode,
        SUPERUSER_OR_GROUP_ADMIN,
        "/记忆模式 [开|仅记录|关|默认]  查看或设置本群模式：开 = 记录并回答，仅记录 = 只记录不回答，"
        "关 = 都不做",
    ),
    Command(
        "人设",
        _persona,
        SUPERUSER_OR_GROUP_ADMIN,
        f"/人设 [文本|默认]  查看或设置本群人设（最长 {PERSONA_MAX} 字）",
    ),
    Command(
        "用量",
        _usage,
        SUPERUSER_OR_GROUP_ADMIN,
        "/用量 [今天|7天|30天|全部]  本群的 token 用量、回答和压缩次数、费用（按模型）",
    ),
    Command(
        "限额",
        _cap,
        SUPERUSER,
        "/限额 [token 数|无|默认]  查看或设置本群每日 token 限额（用完后只提醒一次，次日恢复）",
    ),
    Command(
        "压缩线",
        _compress_at,
        SUPERUSER,
        "/压缩线 [群] [0~1|默认]  查看或设置压缩线（0 = 不按用量压缩；加「群」改整个群）",
    ),
    Command(
        "条数线",
        _history_limit,
        SUPERUSER,
        "/条数线 [群] [条数|默认]  查看或设置条数线（0 = 不按条数压缩；加「群」改整个群）",
    ),
    Command("记忆帮助", _help, SUPERUSER_OR_GROUP_ADMIN, "/记忆帮助  列出你能用的命令", bare=True),
    # A plain 「确认」 answering /清除 上下文: held to /清除's permission when it comes, as the
    # sender is then (an admin demoted since asking is a member now).
    Command(None, _confirm, SUPERUSER_OR_GROUP_ADMIN, "确认"),
)
_HELP_NOTES = (
    "命令只有机器人的主人能用；开启 MEMSUM_GROUP_ADMIN_COMMANDS 后，群主和管理员可在本群使用"
    " /压缩 /摘要 /清除 /回忆 /记忆模式 /人设 /用量 /记忆帮助。",
)
USAGE = "\n".join([*(c.usage for c in COMMANDS if c.name), *_HELP_NOTES])
"""Every command, for PluginMetadata; /记忆帮助 shows the asker only theirs."""
_NAMES = frozenset((c.name,) for c in COMMANDS if c.name)


def _command_name(state: T_State) -> tuple[str, ...] | None:
    """The command NoneBot read the message as, unless the name runs on into a longer word
    (「/压缩包怎么解压」 is chat, recorded and maybe answered, never /压缩)."""
    prefix = state.get(PREFIX_KEY, {})
    name = prefix.get(CMD_KEY)
    if name is None or prefix.get(CMD_WHITESPACE_KEY) is not None:
        return name
    arg = prefix.get(CMD_ARG_KEY)
    rest = arg.extract_plain_text() if isinstance(arg, OBMessage) else ""
    return None if word_goes_on(rest) else name


def is_memsum_command(state: T_State) -> bool:
    """Whether NoneBot read the message as one of our commands (the recording matcher
    leaves those alone: a command the sender may not use is not ours to record)."""
    return _command_name(state) in _NAMES


COMMAND_NAMES: tuple[str, ...] = tuple(c.name for c in COMMANDS if c.name)
"""What a fetched message is skipped for: a command is answered, never stored."""


_BY_NAME = {c.name: c for c in COMMANDS if c.name}
_CONFIRM = next(c for c in COMMANDS if c.name is None)
_CHOSEN = "memsum_command"


async def _chosen(bot: Bot, event: MessageEvent, state: T_State) -> bool:
    """The commands' one rule: the command this message is, when its sender may use it
    (state[_CHOSEN]); anything else flows on to the recording matcher and other plugins.

    One matcher for every command, not an `on_command` each: NoneBot checks a matcher's
    permission before its rule, each check in task groups of its own, so twelve command
    matchers cost every ordinary message about 150 task spawns (most of the bot's CPU at
    a thousand groups). Here a message that is no command costs one dictionary look-up.
    """
    name = _command_name(state)
    if name is None:
        chosen = _CONFIRM if await _is_confirmation(bot, event) else None
    else:
        chosen = _BY_NAME.get(name[0]) if len(name) == 1 else None
    # Another account of this NoneBot (or a bot of MEMSUM_IGNORED_USERS) is a member here, an
    # admin often, but what it says is its model's answer, which any member can steer: never
    # a command (nor a 「确认」).
    if chosen is not None and (
        recovery.never_asks(bot, event.user_id) or not await chosen.permission(bot, event)
    ):
        chosen = None
    state[_CHOSEN] = chosen
    return chosen is not None


async def _handle(
    matcher: Matcher, bot: Bot, event: MessageEvent, state: T_State, arg: OBMessage | None = CommandArg()
) -> None:
    command: Command = state[_CHOSEN]
    name = command.name or CONFIRM_WORD
    onebot.release_arrival(event)  # a command is never stored; a long /压缩 must not hold later messages
    if str(event.user_id) == bot.self_id:
        await matcher.finish()  # the bot's own message echoed back (a reply starting with "/")
    record, _ = onebot.record_of(bot, event)
    await runtime.get().store.save_session(record)  # the place layer needs the record
    text = arg.extract_plain_text() if arg is not None and command.name else ""
    try:
        call = _Call(bot, event, record, await SUPERUSER(bot, event), text)
        answer = f"用法：/{name}（不带参数）" if command.bare and call.args else await command.flow(call)
    except Exception:
        logger.exception(f"memsum: command {name} failed")
        answer = FAILED
    try:
        await onebot.send_reply(bot, event, answer)
    except Exception as err:  # the connection (or the bot, shutting down) is gone
        logger.warning(f"memsum: could not answer {name}: {type(err).__name__}: {err}")
    await matcher.finish()


_FULL_WIDTH = {code: code + 0xFEE0 for code in range(0x21, 0x7F)}


def command_starts(configured: Iterable[str]) -> tuple[str, ...]:
    """COMMAND_START and each start's full-width form: a Chinese keyboard in full-width mode
    (many phones' default) types 「／压缩」, which the owner means as `/压缩`."""
    starts = list(configured)
    for start in list(starts):
        if (wide := start.translate(_FULL_WIDTH)) not in starts:
            starts.append(wide)
    return tuple(starts)


def register_commands(config: Config) -> Claim:
    """Declare the commands' matcher; it blocks, above the recording matcher's priority.
    The fast path (`onebot/fastpath.py`) leaves to NoneBot what its rule takes."""
    command(*COMMAND_NAMES)  # registers the names with NoneBot's command parser (state[PREFIX_KEY])
    configured = get_driver().config.command_start
    for start in command_starts(configured):
        if start not in configured:  # as `command` registers a name under each configured start
            for name in COMMAND_NAMES:
                TrieRule.add_prefix(f"{start}{name}", TRIE_VALUE(start, (name,)))
    matcher = on_message(rule=Rule(_chosen), priority=config.memsum_command_priority, block=True)
    matcher.handle()(_handle)
    return Claim(matcher, _chosen)
