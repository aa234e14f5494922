"""Nothing lost around a crash or a reconnect (issue 15).

When an account connects, every session of it with a message stored in the last
MEMSUM_BACKFILL_HOURS fetches what was said while the bot was away
(`get_group_msg_history` / `get_friend_msg_history`) and records it through the same
path as a live message (same labels; stored once by platform message id; what the bot
account said as the bot's own, unless it went out through this process: said.py), a few
sessions at a time; a live message of such a session waits until its backfill is
done, so what was said before it is stored before it, and has that session fetched at
once (beside the few, up to as many again) rather than queued behind a thousand groups'
fetches. Every question to the bot younger
than MEMSUM_RESUME_WINDOW with no answer yet gets one turn per session (the newest asker
quoted), as a burst does: as soon as its session's backfill is stored (sessions with a
question left unanswered are fetched first), not after the whole account's. A group the
account left meanwhile (no notice reaches a bot that is down) is known by `get_group_list`,
asked once per connect: neither fetched nor answered.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nonebot import get_bots, get_driver
from nonebot.adapters.onebot.v11 import (
    Adapter,
    Bot,
    Event,
    GroupMessageEvent,
    MessageEvent,
    PrivateMessageEvent,
)
from nonebot.adapters.onebot.v11.event import Reply
from nonebot.adapters.onebot.v11.exception import ActionFailed
from nonebot.compat import type_validate_python
from nonebot.log import logger

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.errors import StoreError
from nonebot_plugin_memsum.types import Message

from .notices import left_group
from .render import is_empty, word_goes_on
from .sessions import PLATFORM, group_record, private_record

FETCHES_AT_ONCE = 4
"""History fetches in flight per account in the background, and at most as many again started
at once for sessions a live message waits for. At 1,000 groups and 100 live messages/s the
backfill took 1.6-1.7 s with 4 or 8 (bench/README.md, issue 15 session 6): what bounds it is
the shared event loop and store, not the number in flight; 4 queue fewer statements ahead of
a live message's own."""
SLACK = 5.0
"""Seconds before a session's last stored message a fetched one may be from and still be
new: platform times are whole seconds, stored times are when the bot received them."""
HISTORY_ACTIONS = {"group": "get_group_msg_history", "private": "get_friend_msg_history"}
UNKNOWN_ACTION = 1404
"""The retcode of an action the implementation does not have (OneBot v11 communication
docs; NapCat src/onebot/network/*websocket*.ts `不支持的api`, go-cqhttp, Lagrange)."""
PROBES = 3
"""Sessions a history action may fail for, before it has answered once on the connection,
and still be tried for another. A failure for one place says little of the others: NapCat
answers retcode 1200 with the error of the place (a group the bot has left since), LLOneBot
「未找到消息」 for a place it holds no message of. Once the action has answered, a failure
skips that session only."""


LEFT = "left_group"
"""Metadata namespace: group session → when the account left it (kicked, left, the group
disbanded: a notice said so, or a connect's `get_group_list` no longer named it). Its history
is not asked for nor its questions answered on a later connect, unless something was stored
there since or the group list names it again (the account back in the group)."""
GROUP_LIST_TIMEOUT = 5.0
"""Seconds the connect's `get_group_list` may take: live messages wait for the plan it is
part of. Past it, as when refused, no group counts as left."""


@dataclass
class Account:
    """One connection's backfill: planned (the sessions to fetch are known), and per
    session a gate live messages wait on until its history is in."""

    planned: asyncio.Event = field(default_factory=asyncio.Event)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    """History actions the implementation refused on this connection: not called again."""
    answered: set[str] = field(default_factory=set)
    """History actions that answered at least once on this connection."""
    refused: dict[str, int] = field(default_factory=dict)
    """Per history action, its failures before it first answered (PROBES)."""
    skipped: int = 0
    """Sessions whose history could not be fetched while the action works for others."""
    task: asyncio.Task[None] | None = None
    todo: dict[str, float] = field(default_factory=dict)
    """Sessions whose fetch has not started: their last stored message's time, oldest first."""
    wanted: dict[str, None] = field(default_factory=dict)
    """Sessions of `todo` to fetch before the others, in the order they were asked for: those
    with a question left unanswered, then those a live message waits for while it cannot
    start their fetch itself (before the first fetches, or with FETCHES_AT_ONCE of its own)."""
    probed: bool = False
    """The first fetch of each kind is done: an implementation without the action answered
    one call, and a live message may start its session's fetch."""
    live: set[asyncio.Task[None]] = field(default_factory=set)
    """Fetches live messages started."""
    stored: int = 0
    """Messages the backfill stored so far, by every fetch."""
    asked: set[str] = field(default_factory=set)
    """Sessions with a question to answer once their backfill is stored: one left
    unanswered before the connection, or one the backfill stored."""
    resumed: set[str] = field(default_factory=set)
    """Sessions whose questions got their turn."""
    questions: dict[tuple[str, str], int] = field(default_factory=dict)
    """(session id, platform message id) → stored id of the questions the backfill stored
    while MEMSUM_RESUME_WINDOW is 0 (`fetched_question`)."""
    left: dict[str, float] = field(default_factory=dict)
    """Group sessions the account left, and when (LEFT)."""
    forwards_hang: bool = False
    """`get_forward_msg` timed out for a fetched merged forward: this connection's backfill
    (and refills) ask no more, the rest keep `[合并转发]`: each ask would hold its session's
    live messages FORWARD_TIMEOUT more. Live messages still ask."""


# ---- the pure part --------------------------------------------------------------------
def history_params(kind: str, target: int, count: int) -> dict[str, Any]:
    """The parameters every implementation reads the same way: the latest `count` messages.

    NapCat (NapNeko/NapCatQQ src/onebot/action/go-cqhttp/GetGroupMsgHistory.ts,
    GetFriendMsgHistory.ts): `message_seq` absent or 0 = the latest, `count` (default 20),
    `reverseOrder`; LLOneBot the same names; Lagrange (LagrangeDev/Lagrange.Doc
    docs/Lagrange.OneBot/API/Extend/index.md): `message_id` (the last one wanted) and
    `count`; go-cqhttp (Mrs4s/go-cqhttp coolq/api.go CQGetGroupMessageHistory):
    `message_seq` 0 = latest, always 20, no `count`. So: the target and `count`, no anchor.
    """
    key = "group_id" if kind == "group" else "user_id"
    return {key: target, "count": count}


def as_event_payload(raw: Mapping[str, Any], kind: str, self_id: str, target: int) -> dict[str, Any] | None:
    """A fetched message as the event payload the adapter parses, with the fields some
    implementations leave out (go-cqhttp sends no `post_type`); None when unusable: also one
    under id 0, which is no id (record.platform_id), so nothing tells whether it is stored."""
    if not isinstance(raw, Mapping) or str(raw.get("message_id") or "").strip() in ("", "0"):
        return None
    if raw.get("sender") is None:
        return None
    payload: dict[str, Any] = {
        "message_type": kind,
        "sub_type": "normal" if kind == "group" else "friend",
        "font": 0,
        "raw_message": "",
        **raw,
        # NapCat and LLOneBot give the account's own messages `message_sent`, which the
        # adapter has no message model for: those are what the owner typed on another client.
        "post_type": "message",
        "self_id": int(self_id),
    }
    payload.setdefault("user_id", (raw.get("sender") or {}).get("user_id"))
    payload.setdefault("message", payload["raw_message"])
    payload.setdefault("time", 0)
    if kind == "group":
        payload["group_id"] = target
    elif str(payload.get("user_id")) == self_id:
        # The account's own words in the peer's history are to the peer (record.peer_of);
        # NapCat's history gives them no `target_id`.
        payload["target_id"] = target
    if payload.get("user_id") is None:
        return None
    return payload


def newest_after(payloads: Sequence[dict[str, Any]], after: float, limit: int) -> list[dict[str, Any]]:
    """The last `limit` of those said from `after` − SLACK on, oldest first.

    Implementations disagree on the order they answer in (NapCat reverses, whatever
    `reverseOrder` says), so it is taken from the times; the answer's own order breaks ties.
    """
    ordered = list(payloads)
    if len(ordered) > 1 and _time(ordered[0]) > _time(ordered[-1]):
        ordered.reverse()
    ordered.sort(key=_time)  # stable: ties keep the answer's order
    recent = [p for p in ordered if _time(p) >= after - SLACK]
    return recent[-limit:] if limit > 0 else []


def groups_in(answer: Any) -> set[int] | None:
    """The groups a `get_group_list` answer names; None when it says nothing to go by: not
    a list, an entry without a group id, or no group at all (LLOneBot 3.x answers its empty
    cache when the refresh fails: LLOneBot/LLOneBot src/onebot11/action/group/GetGroupList.ts).
    Ids as numbers or strings (LuckyLilliaBot sends `groupCode`, a string)."""
    if not isinstance(answer, list) or not answer:
        return None
    found: set[int] = set()
    for group in answer:
        value = str(group.get("group_id") or "").strip() if isinstance(group, Mapping) else ""
        if not value.isdigit():
            return None
        found.add(int(value))
    return found


def next_session(todo: dict[str, float], wanted: dict[str, None]) -> tuple[str, float] | None:
    """Takes the next session to fetch out of `todo`: a wanted one first, then the oldest."""
    while wanted:
        sid = next(iter(wanted))
        del wanted[sid]
        if sid in todo:
            return sid, todo.pop(sid)
    if todo:
        sid = next(iter(todo))
        return sid, todo.pop(sid)
    return None


MILLISECONDS = 1e11
"""A platform time beyond this (the year 5138 in seconds) is in milliseconds: LLOneBot 3.10
(LLOneBot/LuckyLilliaBot issue #95) and cqhttp-mirai (yyuueexxiinngg/onebot-kotlin issue
#70) sent 13-digit times."""


def platform_time(value: Any) -> float:
    """An implementation's `time` in seconds, whether it sent seconds or milliseconds; 0 when unusable."""
    try:
        seconds = float(value or 0)
    except (TypeError, ValueError):
        return 0.0
    return seconds / 1000 if seconds > MILLISECONDS else seconds


def _time(payload: Mapping[str, Any]) -> float:
    return platform_time(payload.get("time"))


def addresses_bot(event: MessageEvent, self_id: str, nicknames: Iterable[str]) -> bool:
    """What the adapter's `to_me` says of a live event, for a fetched one: a private
    message, an @ of the bot, or a group message that starts with one of its nicknames."""
    if isinstance(event, PrivateMessageEvent):
        return True
    if event.reply is not None and str(event.reply.sender.user_id) == self_id:
        return True  # a reply to one of the bot's messages, as the adapter's `_check_reply` says
    message = event.original_message
    if any(seg.type == "at" and str(seg.data.get("qq", "")) == self_id for seg in message):
        return True
    text = message.extract_plain_text().lstrip()
    return any(nick and text.startswith(nick) for nick in nicknames)


def another_account(bot: Bot, user_id: int | str) -> bool:
    """Whether `user_id` is another QQ account connected to this NoneBot, now or earlier in
    this process. What it says is recorded as a member's message, but never asks this
    account: two accounts in one group share NICKNAME, and an answer that starts with it, or
    quotes the other's message, would start the other's turn, whose answer quotes this
    one's, and so on, for as long as the model is paid."""
    uid = str(user_id)
    return uid != bot.self_id and (uid in runtime.get().onebot.self_ids or uid in get_bots())


def never_asks(bot: Bot, user_id: int | str) -> bool:
    """Whether what `user_id` says is never a question or a command to this account: another
    account of this NoneBot, or a QQ number of MEMSUM_IGNORED_USERS (another bot in the
    owner's groups, run elsewhere: two bots that answer @s and replies answer each other)."""
    return str(user_id) in runtime.get().config.memsum_ignored_users or another_account(bot, user_id)


def is_command(event: MessageEvent, starts: Iterable[str], names: Iterable[str]) -> bool:
    """A command of this plugin: those are answered, never stored."""
    text = event.original_message.extract_plain_text().lstrip()
    return any(
        text.startswith(start + name) and not word_goes_on(text[len(start + name) :])
        for start in starts
        for name in names
    )


# ---- the I/O shell --------------------------------------------------------------------
def account_of(bot: Bot) -> Account:
    """This connection's backfill, started on first use (the connect hook or an event that
    beat it): its messages must not be stored before what was said before them."""
    state = runtime.get().onebot
    state.self_ids.add(bot.self_id)
    accounts = state.accounts
    account = accounts.get(bot.self_id)
    if account is None:
        account = accounts[bot.self_id] = Account()
        account.task = asyncio.create_task(_recover(bot, account), name=f"memsum-recover-{bot.self_id}")
    return account


def forget(bot: Bot) -> None:
    """The connection is gone: the next one backfills again."""
    account = runtime.get().onebot.accounts.pop(bot.self_id, None)
    if account is not None:
        for task in [account.task, *account.live]:
            if task is not None:
                task.cancel()
        account.planned.set()
        for gate in account.gates.values():
            gate.set()


async def wait_backfilled(bot: Bot, session_id: str) -> None:
    """Until the session's history fetched on connect is stored (at once when none is due)."""
    account = account_of(bot)
    await account.planned.wait()
    gate = account.gates.get(session_id)
    if gate is None or gate.is_set():
        return
    if session_id in account.todo:
        if account.probed and len(account.live) < FETCHES_AT_ONCE:
            task = asyncio.create_task(
                _fetch(bot, account, session_id, account.todo.pop(session_id)),
                name=f"memsum-backfill-{session_id}",
            )
            account.live.add(task)
            task.add_done_callback(account.live.discard)
        else:
            account.wanted[session_id] = None  # fetched next
    await gate.wait()


async def _recover(bot: Bot, account: Account) -> None:
    rt = runtime.get()
    config = rt.config
    try:
        sessions: list[tuple[str, float]] = []
        account.left = {sid: float(ts) for sid, ts in (await rt.store.meta_values(LEFT)).items()}
        if config.memsum_backfill_count and config.memsum_backfill_hours:
            since = clock.now() - config.memsum_backfill_hours * 3600
            sessions = await rt.store.recent_sessions(f"{PLATFORM}:{bot.self_id}:", since)
        pending = await _pending(bot) if config.memsum_resume_window else []
        await _check_groups(bot, account, dict(sessions), [sid for sid, _ in pending])
        # A group the account left answers nothing but a failure (each of which counts
        # against PROBES): not asked, unless it stored something since (back in it).
        sessions = [(sid, last) for sid, last in sessions if account.left.get(sid, -math.inf) < last]
        if sessions and config.memsum_resume_window:
            # Fetched first, before those a live message waits for (asked later): at a
            # thousand groups live messages want a new session every few milliseconds.
            account.asked = {sid for sid, _ in pending}
            sessions.sort(key=lambda s: s[0] not in account.asked)  # the probes too; stable
            account.wanted = dict.fromkeys(sid for sid, _ in sessions if sid in account.asked)
        for sid, _ in sessions:
            account.gates[sid] = asyncio.Event()
    except Exception as err:
        logger.warning(f"memsum: cannot plan the backfill of {bot.self_id}: {type(err).__name__}: {err}")
        sessions = []
    finally:
        account.planned.set()
    if sessions:
        started = clock.now()

        async def fetcher() -> None:
            while (item := next_session(account.todo, account.wanted)) is not None:
                await _fetch(bot, account, *item)

        # One session of each kind first, the next one only if that failed: an implementation
        # without the action answers one call with a failure, not a thousand.
        account.todo = dict(sessions)
        await asyncio.gather(*(_probe(bot, account, kind) for kind in HISTORY_ACTIONS))
        account.probed = True
        await asyncio.gather(*(fetcher() for _ in range(FETCHES_AT_ONCE)))
        while account.live:
            await asyncio.wait(set(account.live))
        skipped = f"; {account.skipped} could not be fetched" if account.skipped else ""
        logger.info(
            f"memsum: backfill of {bot.self_id}: {account.stored} messages said while away stored"
            f" in {len(sessions)} sessions ({(clock.now() - started) * 1000:.0f} ms){skipped}"
        )
    if config.memsum_resume_window:
        await _resume_questions(bot, account)  # no backfill, or questions that came meanwhile
        if account.resumed:
            logger.info(
                f"memsum: {len(account.resumed)} sessions of {bot.self_id} had questions left unanswered;"
                " answering"
            )


async def _probe(bot: Bot, account: Account, kind: str) -> None:
    """The account's sessions of one kind fetched one by one, in their turn, until the
    action has answered or is known not to work (PROBES)."""
    action = HISTORY_ACTIONS[kind]
    while action not in account.answered and action not in account.unsupported:
        sid = next((sid for sid in account.todo if _target(sid)[0] == kind), None)
        if sid is None:
            return
        await _fetch(bot, account, sid, account.todo.pop(sid))


async def _fetch(bot: Bot, account: Account, sid: str, last: float) -> None:
    """One session's backfill: its gate opens once it is stored, then its questions get
    their turn."""
    try:
        stored = await _backfill(bot, account, sid, last)
        account.stored += stored  # not `+= await`: that reads the count before the fetch
    except Exception as err:
        logger.warning(f"memsum: backfill of {sid} failed: {type(err).__name__}: {err}")
    finally:
        account.gates[sid].set()
    if sid in account.asked and runtime.get().config.memsum_resume_window:
        await _resume_questions(bot, account, sid)


async def _backfill(bot: Bot, account: Account, sid: str, last: float, *, questions: bool = False) -> int:
    """Stores what the session said from `last` on; the number stored. A question stored is
    left for `fetched_question` when nothing answers on connect (MEMSUM_RESUME_WINDOW 0) or
    when `questions` says its live event may still come."""
    kind, target = _target(sid)
    if kind is None or HISTORY_ACTIONS[kind] in account.unsupported:
        return 0
    record = group_record(bot.self_id, target) if kind == "group" else private_record(bot.self_id, target)
    if await runtime.get().controls.mode(record) == "off":
        return 0  # 关: what the place said, while off or while away, is not ours to record
    action = HISTORY_ACTIONS[kind]
    count = runtime.get().config.memsum_backfill_count
    try:
        data = await bot.call_api(action, **history_params(kind, target, count))
    except Exception as err:  # ActionFailed (unknown action, a place it cannot read), NetworkError
        _refused(bot, account, sid, action, err)
        return 0
    account.answered.add(action)
    raw = data.get("messages") if isinstance(data, Mapping) else None
    payloads = [p for r in raw or [] if (p := as_event_payload(r, kind, bot.self_id, target)) is not None]
    recent = newest_after(payloads, last, count)
    # Said before the place was last switched on from 关: not recorded then, nor now. Platform
    # times are whole seconds: one of the switch's own second may have come after it, and stays.
    if since := int(await runtime.get().controls.recorded_since(record)):
        recent = [p for p in recent if not 0 < _time(p) < since]
    # Those the session holds already (said just before its last stored one) skipped in one
    # trip: at a thousand groups they are most of what is fetched.
    said = {str(p["message_id"]): _time(p) or clock.now() for p in recent}  # as record_message dates it
    known = await runtime.get().store.stored_platform_ids(sid, said)
    from .said import sent_here  # said.py imports record.py, which imports this module

    mine = [p for p in recent if str(p.get("user_id")) == bot.self_id and str(p["message_id"]) not in known]
    sent = await sent_here(sid) if mine else []
    stored = 0
    for payload in recent:
        if str(payload["message_id"]) in known:
            continue
        event = Adapter.json_to_event(payload)
        if not isinstance(event, GroupMessageEvent | PrivateMessageEvent):
            continue
        msg = await _record_fetched(bot, account, event, sent)
        if msg is not None:
            stored += 1
            if msg.addressed:
                account.asked.add(sid)
                if (questions or not runtime.get().config.memsum_resume_window) and msg.id is not None:
                    account.questions[(sid, str(payload["message_id"]))] = msg.id
    return stored


async def refill(bot: Bot, session_id: str) -> None:
    """What the store refused of the session (a full disk, the database away), fetched again
    now that it stores, through the backfill's path (stored once by platform id, in order).
    The caller holds the session's backfill hold, so it goes in before the session's next
    message. Old questions among it are stored, not answered: they were asked long ago."""
    rt = runtime.get()
    since = rt.onebot.refusals.places.pop(session_id, None)
    if since is None:
        return
    account = account_of(bot)
    await account.planned.wait()
    try:
        # Said since the refusals, the live messages still on their way too: those the
        # fetch stores first are answered by their live event (`fetched_question`).
        stored = await _backfill(bot, account, session_id, since, questions=True)
    except Exception as err:
        logger.warning(f"memsum: cannot fetch again what {session_id} said: {type(err).__name__}: {err}")
        return
    if stored:
        logger.info(f"memsum: {stored} messages of {session_id} the store refused, fetched again and stored")


def refill_all() -> None:
    """Every session's refused messages fetched again in the background, one session at a time
    (started once the store stores again; a session's own next message does its own first)."""
    refusals = runtime.get().onebot.refusals
    if refusals.places and (refusals.refilling is None or refusals.refilling.done()):
        refusals.refilling = asyncio.create_task(_refill_all(), name="memsum-refill")


async def _refill_all() -> None:
    rt = runtime.get()
    bots = get_bots()
    while rt.onebot.refusals.places and not rt.onebot.refusals.total:
        sid = next(iter(rt.onebot.refusals.places))
        bot = bots.get(sid.split(":")[1]) if sid.count(":") == 3 else None
        if not isinstance(bot, Bot):
            rt.onebot.refusals.places.pop(sid)  # not connected: the next connect's backfill
            continue
        async with rt.onebot.recording.hold(f"backfill:{sid}"):
            await refill(bot, sid)


def fetched_question(bot: Bot, session_id: str, message_id: int) -> int | None:
    """The stored id of a question the backfill stored that nothing answers on connect
    (MEMSUM_RESUME_WINDOW 0), for its live event: said just as the bot connected, it came
    both ways, and then only the live one can answer it. None otherwise."""
    account = runtime.get().onebot.accounts.get(bot.self_id)
    return None if account is None else account.questions.pop((session_id, str(message_id)), None)


def _refused(bot: Bot, account: Account, sid: str, action: str, err: Exception) -> None:
    """A history call failed: that session is skipped or, when the implementation lacks the
    action (an unknown action, no answer at all, or PROBES places failed before any
    answered), every session of its kind on this connection, with one INFO line."""
    if action in account.unsupported:
        return
    retcode = err.info.get("retcode") if isinstance(err, ActionFailed) else None
    if action not in account.answered:
        tries = account.refused[action] = account.refused.get(action, 0) + 1
        if retcode is None or str(retcode) == str(UNKNOWN_ACTION) or tries >= PROBES:
            account.unsupported.add(action)
            logger.info(
                f"memsum: {bot.self_id} cannot {action} ({type(err).__name__}); no backfill of that kind"
            )
            return
    account.skipped += 1
    logger.debug(f"memsum: backfill of {sid} skipped: {action} failed ({type(err).__name__} {retcode})")


async def _record_fetched(
    bot: Bot, account: Account, event: MessageEvent, sent: list[tuple[str, str | None]]
) -> Message | None:
    """Stores a fetched message (`addressed`: it asked the bot); None when not stored. One of
    the bot account is stored as the bot's own words (the owner typing on it while bot.py was
    down), as said.py stores a live one, unless it went out through this process's Bot
    (`sent`: the plugin's own sends, command output and notices too; those without an id)."""
    from nonebot_plugin_memsum.commands import COMMAND_NAMES, command_starts  # they import this package

    from .record import drop_foreign_quote, fill_forgotten_quote, record_message, record_of
    from .said import IN_PARTS, echo_text, name_fetched_answer, sent_here_match

    if is_empty(event.original_message) and event.reply is None:
        return None  # nothing said
    if is_command(event, command_starts(get_driver().config.command_start), COMMAND_NAMES):
        return None
    if str(event.user_id) == bot.self_id:
        if is_empty(event.original_message):
            return None  # a bare quote: nothing the account said
        text = echo_text(event.original_message)
        if sent_here_match(sent, str(event.message_id), text):
            if (text, IN_PARTS) in sent:  # a whole answer the kill left without its id
                await name_fetched_answer(record_of(bot, event)[0].id, str(event.message_id), text)
            return None
        said_at = platform_time(event.time)
        await _fill_forward(bot, account, event)
        _, msg = await record_message(bot, event, said_at=said_at, fetched=True, by_bot=True)
        return msg
    rt = runtime.get()
    await _resolve_reply(bot, event)
    drop_foreign_quote(bot, event)
    await fill_forgotten_quote(bot, event)
    await _fill_forward(bot, account, event)
    asks = addresses_bot(event, bot.self_id, rt.nicknames) and not never_asks(bot, event.user_id)
    _, msg = await record_message(bot, event, addressed=asks, said_at=platform_time(event.time), fetched=True)
    return msg


async def _fill_forward(bot: Bot, account: Account, event: MessageEvent) -> None:
    """The content of a fetched merged forward, unless an ask of this connection's backfill
    timed out already (then it keeps `[合并转发]` without waiting again)."""
    from .record import fill_forward

    if not account.forwards_hang and await fill_forward(bot, event.original_message):
        account.forwards_hang = True


async def _resolve_reply(bot: Bot, event: MessageEvent) -> None:
    """The quoted message of a fetched reply, as the adapter looks it up for a live one
    (nonebot/adapters/onebot/v11/bot.py `_check_reply`: `get_msg` of the reply segment's id),
    so a fetched reply is quoted like a live one and a reply to the bot asks it."""
    segment = next((seg for seg in event.original_message if seg.type == "reply"), None)
    if segment is None or event.reply is not None:
        return
    try:
        event.reply = type_validate_python(Reply, await bot.get_msg(message_id=int(segment.data["id"])))
    except Exception as err:  # no longer cached by the implementation: recorded without the quote
        logger.debug(f"memsum: quoted message of a fetched reply not available: {type(err).__name__}")


async def note_left(bot: Bot, event: Event) -> None:
    """A notice that the account is no longer in a group: noted (LEFT) for later connects."""
    if getattr(event, "notice_type", None) not in ("group_decrease", "group_dismiss"):
        return  # most notices: no dump of the event
    payload = event.model_dump()
    if not payload.get("group_id") or not left_group(payload, bot.self_id):
        return
    try:
        await runtime.get().store.put_meta(
            LEFT, group_record(bot.self_id, payload["group_id"]).id, clock.now()
        )
    except StoreError as err:  # its next connects then ask its history in vain, as before
        logger.warning(f"memsum: could not note that {bot.self_id} left group {payload['group_id']}: {err}")


async def _check_groups(bot: Bot, account: Account, last: Mapping[str, float], asked: Iterable[str]) -> None:
    """The account's groups checked against `get_group_list`, once per connect: one it is no
    longer in, though no notice said so (kicked, or the group disbanded, while bot.py was
    down), is noted as left (LEFT); one the list names again (invited back meanwhile) is no
    longer. `last`: the sessions to backfill and their last stored message's time; `asked`:
    those with a question left unanswered. A failed, late or empty answer changes nothing."""
    groups = {sid: target for sid in [*last, *asked] if (target := _group_of(sid))}
    if not groups:
        return
    try:
        # `no_cache`: the list as the server has it now, not one cached before the kick
        # (NapCat GetGroupList.ts, Lagrange GetGroupListOperation.cs, LLOneBot; go-cqhttp).
        async with asyncio.timeout(GROUP_LIST_TIMEOUT):
            joined = groups_in(await bot.call_api("get_group_list", no_cache=True))
    except Exception as err:  # ActionFailed, NetworkError, TimeoutError: nothing learnt
        logger.debug(f"memsum: no group list of {bot.self_id}: {type(err).__name__}")
        return
    if joined is None:
        return
    now, gone = clock.now(), 0
    for sid, group in groups.items():
        try:
            if group in joined and sid in account.left:
                del account.left[sid]
                await runtime.get().store.delete_meta(LEFT, sid)
            elif group not in joined and (
                sid not in account.left or account.left[sid] < last.get(sid, -math.inf)
            ):
                account.left[sid] = now
                gone += 1
                await runtime.get().store.put_meta(LEFT, sid, now)
        except StoreError as err:  # this connection goes by what it learnt all the same
            logger.warning(f"memsum: could not note whether {bot.self_id} is in group {group}: {err}")
    if gone:
        logger.info(
            f"memsum: {bot.self_id} is no longer in {gone} groups (get_group_list); not fetching them"
        )


def _group_of(session_id: str) -> int | None:
    kind, target = _target(session_id)
    return target if kind == "group" else None


async def _pending(bot: Bot, session_id: str | None = None) -> list[tuple[str, Any]]:
    """The account's (or one session's) questions younger than the window with no answer yet."""
    rt = runtime.get()
    since = clock.now() - rt.config.memsum_resume_window
    found = await rt.store.pending_questions(since, prefix=session_id or f"{PLATFORM}:{bot.self_id}:")
    return [(sid, m) for sid, m in found if session_id is None or sid == session_id]  # a prefix of longer ids


async def _resume_questions(bot: Bot, account: Account, session_id: str | None = None) -> None:
    """One turn per session (the account's, or one) with questions younger than the window
    and no answer yet, unless its questions got one on this connection already."""
    from .matchers import answer_if_allowed  # the matchers import this module
    from .record import TEMP_GROUP_KEY

    rt = runtime.get()
    newest: dict[str, Any] = {}
    for sid, msg in await _pending(bot, session_id):
        if sid not in account.resumed and account.left.get(sid, -math.inf) < msg.ts:
            newest[sid] = msg  # storage order: the last one is the newest asker
    for sid, msg in newest.items():
        kind, target = _target(sid)
        if kind is None or msg.platform_id is None or msg.name is None:
            continue
        event = _quotable(
            bot, kind, target, msg.platform_id, msg.name, msg.ts, msg.metadata.get(TEMP_GROUP_KEY)
        )
        if event is None:
            continue
        record = group_record(bot.self_id, target) if kind == "group" else private_record(bot.self_id, target)
        if await rt.controls.mode(record) != "on":
            continue  # the owner turned answers off meanwhile
        account.resumed.add(sid)
        await answer_if_allowed(bot, event, record, msg.id)  # the daily cap and the cooldown decide


def _quotable(
    bot: Bot, kind: str, target: int, platform_id: str, user_id: str, ts: float, temp_group: Any = None
) -> MessageEvent | None:
    """The stored question as the event an answer quotes and is sent to; `temp_group`: the
    group a temporary session came from, sent along as the live event's `group_id` is (send.py)."""
    try:
        message_id, uid = int(platform_id), int(user_id)
    except ValueError:
        return None
    payload = {
        "post_type": "message",
        "message_type": kind,
        "sub_type": "normal" if kind == "group" else "friend",
        "time": math.floor(ts),
        "self_id": int(bot.self_id),
        "message_id": message_id,
        "user_id": uid,
        "message": [],
        "raw_message": "",
        "font": 0,
        "sender": {"user_id": uid},
    }
    if kind == "group":
        payload["group_id"] = target
    elif str(temp_group or "").isdigit():
        payload.update(sub_type="group", group_id=int(str(temp_group)))  # OneBot v11: a temp chat's sub_type
    event = Adapter.json_to_event(payload)
    return event if isinstance(event, MessageEvent) else None


def _target(session_id: str) -> tuple[str | None, int]:
    """`onebot:<self>:group:<id>` → ("group", id); anything else → (None, 0)."""
    parts = session_id.split(":")
    if len(parts) != 4 or parts[0] != PLATFORM or parts[2] not in HISTORY_ACTIONS or not parts[3].isdigit():
        return None, 0
    return parts[2], int(parts[3])
