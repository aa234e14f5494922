"""Audit 12, the owner's commands and `.env`, fuzzed through the real bot: bot.py as a
process, the OneBot simulator over the real reverse WebSocket, the scripted model on real
HTTP and the real SQLite file. Commands as owners type them on phones (full-width spaces
and digits, a sentence's end after the last word, an @ or a reply-quote around them, in a
group or in private, by the superuser, an admin or a member), a seeded random command
driver interleaving them with members' chatter and checking the invariants after each
step, and a table of wrong `.env` values, each of which must stop bot.py with one line
naming the key (or start with the documented default), never a traceback or a secret."""

from __future__ import annotations

import asyncio
import json
import random
import re
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import SELF_ID, connected, group_sid, query, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, Segment, at, plain_text
from tests.fakes.onebot import text as seg
from tests.fakes.seeds import seeds

SUPERUSER = 10001
ADMIN = 20900
MEMBER = 20001
SUMMARY = "【最近在聊什么】\n周末爬山\n【谁有问题没回应】\n无\n【关键原话要点】\n无\n【保留原文】\n无"
ANSWER = "好的，记下了。"


def is_chat(body: dict[str, Any]) -> bool:
    """A chat turn's request (it offers the tools), not a summary's."""
    return "tools" in body


def _answer(body: dict[str, Any]) -> Reply:
    return Reply(ANSWER) if is_chat(body) else Reply(SUMMARY)


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> AsyncIterator[BotProcess]:
    llm.reset()
    llm.on_request(_answer)
    env = {
        "MEMSUM_MODELS": json.dumps([llm.model_config()]),
        "LOG_LEVEL": "INFO",
        "MEMSUM_GROUP_ADMIN_COMMANDS": "true",
    }
    async with BotProcess(tmp_path_factory.mktemp("bot"), env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> AsyncIterator[OneBotSim]:
    async with connected(bot) as s:
        yield s


def _text_of(call_params: dict[str, Any], action: str) -> str:
    if action in FORWARD_ACTIONS:
        return plain_text(call_params.get("messages") or call_params.get("message") or [])
    return plain_text(call_params["message"])


async def said(
    sim: OneBotSim, group: int | None, user: int, message: str | list[Segment], *, quiet: float = 0
) -> list[str]:
    """What the bot sends after one message (in `group`, or in private when None): the
    first answer, then whatever else follows within 0.3 s; with `quiet`, nothing within
    `quiet` s is an empty list."""
    mark = len(sim.calls)
    if group is None:
        await sim.private_message(user, message)
    else:
        await sim.group_message(group, user, message)
    actions = set(SEND_ACTIONS | FORWARD_ACTIONS)
    try:
        first = await sim.wait_call(actions, after=mark, timeout=quiet or 15)
    except TimeoutError:
        if quiet:
            return []
        raise
    got = [_text_of(first.params, first.action)]
    after = sim.calls.index(first) + 1
    while True:
        try:
            call = await sim.wait_call(actions, after=after, timeout=0.3)
        except TimeoutError:
            return got
        got.append(_text_of(call.params, call.action))
        after = sim.calls.index(call) + 1


async def stored(bot: BotProcess, sid: str) -> list[str]:
    sql = "SELECT content FROM messages WHERE session_id = ? ORDER BY id"
    return [str(row[0]) for row in await query(bot.db_path, sql, sid)]


async def settings(bot: BotProcess) -> list[tuple[Any, ...]]:
    return sorted(await query(bot.db_path, "SELECT * FROM settings"))


# ---- commands as typed on a phone ---------------------------------------------------------
@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("/记忆模式 仅记录。", "已将本群模式设为 仅记录。"),
        ("/压缩线 0.5。", "已将本会话的压缩线设为 0.5。"),
        ("/条数线　群　３０。", "已将本群的条数线设为 30。"),
        ("/限额 5000！", "已修改本群每日限额。"),
        ("/用量 ７天。", "本群"),
        ("/摘要。", "本会话还没有摘要。"),
        ("/记忆帮助。", "/压缩  立即压缩本会话"),
        ("/清除 摘要。", "已清除本会话的摘要，上下文保留。"),
    ],
)
async def test_a_command_ending_with_a_full_stop_does_what_it_says(
    bot: BotProcess, sim: OneBotSim, typed: str, expected: str
) -> None:
    """A phone's input method ends the line with 「。」: the owner's command still works.
    Before: 「/压缩线 0.5。」 was refused with 「须在 0 到 1 之间」 (0.5 is), 「/记忆模式 关。」
    and 「/摘要。」 answered with their usage line."""
    group = 71000 + zlib.crc32(typed.encode()) % 900
    got = await said(sim, group, SUPERUSER, typed)
    assert len(got) == 1, got
    assert got[0].startswith(expected), got
    assert await stored(bot, group_sid(group)) == []  # a command is never recorded


async def test_a_members_line_that_merely_starts_like_a_command_is_recorded(
    bot: BotProcess, sim: OneBotSim
) -> None:
    """「/压缩包怎么解压」 is a member asking about a zip file, not /压缩: it is recorded like
    any line (before: NoneBot's command parser read it as /压缩, so the line was dropped as
    someone else's command and never reached the memory). The owner's glued line is chat
    too, not 「用法：/压缩（不带参数）」. A real command of ours by a member stays unrecorded
    (README: 其他人发的命令本插件完全不处理)."""
    group = 72001
    sid = group_sid(group)
    assert await said(sim, group, MEMBER, "/压缩包怎么解压", quiet=0.8) == []
    assert await said(sim, group, MEMBER, "/摘要 帮我看看", quiet=0.8) == []  # ours: not recorded
    assert await said(sim, group, MEMBER, "/ 斜杠开头的话", quiet=0.8) == []
    assert await said(sim, group, SUPERUSER, "/回忆录那本书不错", quiet=0.8) == []

    async def three() -> bool:
        return len(await stored(bot, sid)) >= 3

    await until(three, "the three chat lines stored")
    assert await stored(bot, sid) == [
        f"[用户{MEMBER}({MEMBER})] /压缩包怎么解压",
        f"[用户{MEMBER}({MEMBER})] / 斜杠开头的话",
        f"[用户{SUPERUSER}({SUPERUSER})] /回忆录那本书不错",
    ]
    # The command itself, glued to nothing or to a sentence's end, is still the command.
    assert (await said(sim, group, SUPERUSER, "/压缩线"))[0].startswith("压缩线 0.8（全局配置）")


@pytest.mark.parametrize("typed", ["确认。", "确认！", "确认 。"])
async def test_r_mem_2_a_confirmation_typed_with_a_full_stop_clears_the_context(
    bot: BotProcess, sim: OneBotSim, typed: str
) -> None:
    """Before: the owner's 「确认。」 (a phone's input method adds the 。) to 「/清除 上下文」's
    question was not the confirmation: it went to the model as chat (answered 「好的」 in a
    private chat, stored as a message) and the context stayed, though the owner believed it
    cleared."""
    group = 72100 + zlib.crc32(typed.encode()) % 90
    sid = group_sid(group)
    await sim.group_message(group, MEMBER, "周末去爬山吗")

    async def one() -> bool:
        return len(await stored(bot, sid)) == 1

    await until(one, "the member's line stored")
    asked = await said(sim, group, SUPERUSER, "/清除 上下文")
    assert asked[0].startswith("将清除本会话的全部上下文和摘要"), asked
    assert await said(sim, group, SUPERUSER, typed) == ["已清除本会话的上下文和摘要。"]
    active = "SELECT content FROM messages WHERE session_id = ? AND archived = 0"
    assert await query(bot.db_path, active, sid) == []
    assert await stored(bot, sid) == [
        f"[用户{MEMBER}({MEMBER})] 周末去爬山吗"
    ]  # archived, 「确认。」 not stored


@pytest.mark.parametrize(
    ("rest", "goes_on"),
    [
        ("", False),
        (" 今天", False),
        ("\u3000群 30", False),
        ("。", False),
        ("！？", False),
        ("包怎么解压", True),
        ("100000", False),  # 「/限额100000」: an owner's number typed without the space
        ("０.５", False),
        ("7天", False),
    ],
)
def test_what_follows_a_command_name_decides_whether_it_is_the_command(rest: str, goes_on: bool) -> None:
    """The same rule for a live message (commands.py) and a fetched one (the backfill skips
    commands, recovery.is_command): 「/压缩包…」 is stored after a restart too."""
    from nonebot_plugin_memsum.onebot.render import word_goes_on

    assert word_goes_on(rest) is goes_on


# ---- the seeded random command driver -------------------------------------------------------
DRIVER_GROUP = 73001
ADMIN_COMMANDS = frozenset({"压缩", "摘要", "清除", "回忆", "记忆模式", "人设", "用量", "记忆帮助"})
_MODE_WORDS = {"开": "on", "仅记录": "record", "关": "off"}
_FULL_WIDTH = str.maketrans("0123456789.", "０１２３４５６７８９．")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_ENGLISH_ERROR = re.compile(r"Traceback|Error|Exception|None\b|\bnan\b|\binf\b")


@dataclass
class Command:
    """One command the driver types: its name and words, and what it should do."""

    name: str
    words: list[str]
    change: dict[tuple[str, str], Any] | None = None
    """(scope, setting) → the value stored after it (None: reset); None: changes no setting."""
    valid: bool = True
    answer: str = ""
    """How the answer starts (for a valid command that changes something or a refusal)."""


@dataclass
class Model:
    """What the driver expects of the group: its stored settings, and a pending /清除."""

    stored: dict[tuple[str, str], Any] = field(default_factory=dict)
    pending: int | None = None
    """Who was asked to reply 「确认」 (their /清除 上下文)."""

    def value(self, name: str) -> Any:
        for scope in ("session", "place"):
            if (scope, name) in self.stored:
                return self.stored[(scope, name)]
        return None


def _number(rng: random.Random, valid: list[str], invalid: list[str]) -> tuple[str, bool]:
    if rng.random() < 0.7:
        return rng.choice(valid), True
    return rng.choice(invalid), False


def _pick_command(rng: random.Random, step: int) -> Command:
    name = rng.choice(
        ["记忆模式", "人设", "压缩线", "条数线", "限额", "用量", "摘要", "记忆帮助", "清除", "压缩", "回忆"]
    )
    if name == "记忆模式":
        word = rng.choice([*_MODE_WORDS, "默认", "", "半开", "开 关"])
        if word in _MODE_WORDS:
            return Command(
                name, [word], {("place", "mode"): _MODE_WORDS[word]}, answer=f"已将本群模式设为 {word}。"
            )
        if word == "默认":
            return Command(name, [word], {("place", "mode"): None}, answer="已恢复本群模式为默认。")
        if word == "":
            return Command(name, [], answer="本群模式：")
        return Command(name, word.split(), valid=False, answer="用法：")
    if name == "人设":
        kind = rng.choice(["set", "set", "reset", "show", "long"])
        if kind == "set":
            text = f"你是第{step}号测试助手，说话带一个喵字"
            return Command(name, [text], {("place", "persona"): text}, answer="已设置本群人设")
        if kind == "reset":
            return Command(name, ["默认"], {("place", "persona"): None}, answer="已恢复本群人设为默认。")
        if kind == "long":
            return Command(name, ["长" * 1001], valid=False, answer="没有修改：")
        return Command(name, [], answer="本群人设（")
    if name in ("压缩线", "条数线"):
        setting = "compress_at" if name == "压缩线" else "history_limit"
        scope = rng.choice(["session", "place"])
        words = ["群"] if scope == "place" else []
        title = "本群" if scope == "place" else "本会话"
        if setting == "compress_at":
            value, ok = _number(
                rng, ["0", "0.3", "0.55", "1", "0.9"], ["1.5", "-0.1", "abc", "80%", "nan", "1e400"]
            )
        else:
            value, ok = _number(rng, ["0", "5", "7", "200"], ["-3", "2.5", "abc", "100001", "1e30"])
        if rng.random() < 0.2:
            return Command(
                name, [*words, "默认"], {(scope, setting): None}, answer=f"已恢复{title}的{name}为默认。"
            )
        if rng.random() < 0.15:
            return Command(name, words, answer=f"{name} ")
        if not ok:
            return Command(name, [*words, value], valid=False, answer="没有修改：")
        number: float = float(value) if setting == "compress_at" else int(value)
        return Command(name, [*words, value], {(scope, setting): number}, answer=f"已将{title}的{name}设为 ")
    if name == "限额":
        value, ok = _number(
            rng, ["无", "1000000", "500000000", "默认"], ["-5", "abc", "1.5", "10000000000000"]
        )
        if not ok:
            return Command(name, [value], valid=False, answer="没有修改：")
        stored = None if value == "默认" else 0 if value == "无" else int(value)
        return Command(name, [value], {("place", "daily_token_cap"): stored}, answer="已修改本群每日限额。")
    if name == "用量":
        word = rng.choice(["", "今天", "7天", "30天", "全部", "昨天", "8天"])
        if word in ("昨天", "8天"):
            return Command(name, [word], valid=False, answer="用法：/用量")
        return Command(name, [word] if word else [], answer="本群用量（")
    if name in ("摘要", "记忆帮助", "压缩"):
        if rng.random() < 0.2:
            return Command(name, ["现在"], valid=False, answer=f"用法：/{name}（不带参数）")
        return Command(name, [])
    if name == "回忆":
        return Command(name, [rng.choice(["爬山", "周末", "2026-13-45", "@"])], answer="")
    word = rng.choice(["摘要", "上下文", "上下文 确认", "全部"])  # /清除
    if word == "全部":
        return Command(name, [word], valid=False, answer="用法：/清除")
    if word == "摘要":
        return Command(name, [word], answer="已清除本会话的摘要，上下文保留。")
    if word == "上下文":
        return Command(name, [word], answer="将清除本会话的全部上下文和摘要")
    return Command(name, word.split(), answer="已清除本会话的上下文和摘要。")


def _typed(rng: random.Random, command: Command) -> str | list[Segment]:
    """The command as an owner on a phone might type it."""
    space = rng.choice([" ", " ", "\u3000", "  "])
    words = [
        w.translate(_FULL_WIDTH) if rng.random() < 0.3 and command.name != "人设" else w
        for w in command.words
    ]
    line = "/" + command.name + "".join(space + w for w in words)
    if command.name != "人设" and rng.random() < 0.25:
        line += rng.choice(["。", "！", " 。"])
    around = rng.random()
    if around < 0.15:
        return [at(SELF_ID), seg(" " + line)]
    if around < 0.25:
        return [seg(line + " "), at(SELF_ID)]
    return line


async def _snapshot(bot: BotProcess) -> dict[tuple[str, str], Any]:
    """The driver group's stored settings: (scope, name) → value (numbers as numbers)."""
    found: dict[tuple[str, str], Any] = {}
    for scope, key, name, value in await query(bot.db_path, "SELECT * FROM settings"):
        if str(key).endswith(f":{DRIVER_GROUP}"):
            stored = json.loads(value)  # stored as JSON
            found[(scope, name)] = float(stored) if isinstance(stored, int | float) else stored
    return found


def _expected(model: Model) -> dict[tuple[str, str], Any]:
    return {
        k: (float(v) if isinstance(v, int | float) else v) for k, v in model.stored.items() if v is not None
    }


async def _user_rows(bot: BotProcess) -> list[str]:
    sql = "SELECT content FROM messages WHERE session_id = ? AND role = 'user' ORDER BY id"
    return [str(r[0]) for r in await query(bot.db_path, sql, group_sid(DRIVER_GROUP))]


def _may(user: int, name: str) -> bool:
    return user == SUPERUSER or (user == ADMIN and name in ADMIN_COMMANDS)


def _chat_lines(rng: random.Random, tag: str) -> tuple[str, bool]:
    """A member's line, and whether it asks the bot (`tag`: the seed and step, so no two
    lines of the module are the same)."""
    step = tag
    return rng.choice(
        [
            (f"第{step}句：周末去爬山吗", False),
            (f"小记，第{step}句：明天下雨吗", True),
            (f"/压缩包第{step}个在哪", False),
            (f"/ 第{step}句斜杠开头", False),
            (f"//第{step}句双斜杠", False),
            (f"/摘要很有用第{step}次", False),
        ]
    )


@pytest.mark.parametrize("seed", seeds([12], [1207]))
async def test_a_seeded_random_mix_of_commands_and_chatter_keeps_every_invariant(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, seed: int
) -> None:
    """Random commands (valid, invalid, edge values, full-width, a trailing 。, an @ before or
    after) by the owner, a group admin (MEMSUM_GROUP_ADMIN_COMMANDS=true) and a member,
    interleaved with members' chatter, in one group. After each step: a command the asker
    may use gets exactly one Chinese answer saying what happened or what was wrong; a
    refused or invalid one changes no setting; a valid one changes exactly its setting; a
    command is never recorded, anyone else's command is not answered; chatter (also lines
    that merely start with 「/」) is recorded unless the group is 关, answered when it asks
    the bot in a 开 group, and the answer's request carries the persona and count line set."""
    rng = random.Random(seed)
    sim.add_member(DRIVER_GROUP, ADMIN, "管理员", role="admin")
    model = Model(stored=dict(await _snapshot(bot)))  # what the other seed left
    for step in range(24):
        before_rows = await _user_rows(bot)
        before_settings = await _snapshot(bot)
        assert before_settings == _expected(model), f"step {step}"
        if rng.random() < 0.35:
            speaker = rng.choice([MEMBER, ADMIN, SUPERUSER])
            line, asks = _chat_lines(rng, f"{seed}-{step}")
            if line.startswith("/摘要") and speaker != MEMBER:
                speaker = MEMBER  # the owner's would be the command with an argument
            mode = model.value("mode") or "on"
            requests = len(llm.requests)
            got = await said(sim, DRIVER_GROUP, speaker, line, quiet=0.6 if not asks or mode != "on" else 0)
            name = "管理员" if speaker == ADMIN else f"用户{speaker}"
            want = f"[{name}({speaker})] {line}"
            if mode == "off":
                assert got == [], f"step {step}: a 关 group answered {line!r}"
                assert want not in await _user_rows(bot), f"step {step}: a 关 group recorded {line!r}"
                continue

            async def recorded(want: str = want) -> bool:
                return want in await _user_rows(bot)

            await until(recorded, f"step {step}: {line!r} recorded")
            if not (asks and mode == "on"):
                assert got == [], f"step {step}: {line!r} answered in mode {mode}"
                continue
            assert got == [ANSWER], f"step {step}: {got}"
            chats = [b for b in llm.requests[requests:] if is_chat(b)]
            assert chats, f"step {step}: no chat request"
            system = str(chats[-1]["messages"][0]["content"])
            persona = model.value("persona")
            if persona is None:
                assert "测试助手" not in system, f"step {step}: a reset persona still sent"
            else:
                assert persona in system, f"step {step}: the persona set is not sent"
            limit = model.value("history_limit")
            if limit:
                history = [m for m in chats[-1]["messages"] if m["role"] in ("user", "assistant")]
                assert len(history) <= limit, f"step {step}: {len(history)} messages sent, line {limit}"
            continue
        if model.pending is not None and rng.random() < 0.3:
            user, command = model.pending, Command("确认", [], answer="已清除本会话的上下文和摘要。")
            message: str | list[Segment] = "确认"
        else:
            user = rng.choice([SUPERUSER, SUPERUSER, SUPERUSER, ADMIN, MEMBER])
            command = _pick_command(rng, step)
            message = _typed(rng, command)
        allowed = command.name == "确认" or _may(user, command.name)
        got = await said(sim, DRIVER_GROUP, user, message, quiet=0 if allowed else 0.6)
        what = f"step {step}: {user} {message!r} → {got!r}"
        if not allowed:
            assert got == [], what
            assert await _snapshot(bot) == before_settings, what
            assert await _user_rows(bot) == before_rows, what  # someone else's command: not ours to record
            continue
        assert len(got) == 1, what
        answer = got[0]
        assert _CJK.search(answer), what
        assert not _ENGLISH_ERROR.search(answer.replace("MEMSUM_GROUP_ADMIN_COMMANDS", "")), what
        if command.answer:
            assert answer.startswith(command.answer), what
        assert await _user_rows(bot) == before_rows, what  # a command is never recorded
        if not command.valid or command.change is None:
            assert await _snapshot(bot) == before_settings, what
        else:
            model.stored.update(command.change)
            assert await _snapshot(bot) == _expected(model), what
        if command.name == "清除" and command.words == ["上下文"]:
            model.pending = user
        elif command.name == "确认" or (command.name == "清除" and command.words == ["上下文", "确认"]):
            model.pending = None
    log = bot.log()
    assert "Traceback" not in log
    assert "ERROR" not in log


# ---- wrong .env values, through bot.py -------------------------------------------------------
SECRET = "sk-audit12-SECRET-4f9a"
"""The API key of every model of the table: never printed."""


def _models(**fields: Any) -> str:
    return json.dumps(
        [
            {
                "id": "a/b",
                "base_url": "http://127.0.0.1:9/v1",
                "api_key": SECRET,
                "context_window": 32000,
                **fields,
            }
        ]
    )


async def _stops(tmp_path: Path, env: dict[str, str]) -> tuple[int, str]:
    """bot.py's exit code and log when it must not start."""
    bot = BotProcess(tmp_path, env={"MEMSUM_MODELS": _models(), **env}, log_level="INFO")
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    return exited.value.returncode, exited.value.log


def _one_line_naming(log: str, key: str) -> str:
    """The one line of the log that says what is wrong; it names `key`; no traceback, no secret."""
    assert "Traceback" not in log, log
    assert SECRET not in log, log
    said = [line for line in log.splitlines() if "nonebot-plugin-memsum:" in line]
    assert len(said) == 1, log
    assert f"invalid {key}:" in said[0], said[0]
    return said[0]


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"MEMSUM_REPLY_MAX_TOKENS": "40000"}, "MEMSUM_REPLY_MAX_TOKENS"),
        ({"MEMSUM_REPLY_MAX_TOKENS": "31900"}, "MEMSUM_REPLY_MAX_TOKENS"),
        ({"MEMSUM_MODELS": _models(context_window=1000)}, "MEMSUM_REPLY_MAX_TOKENS"),
        (
            {"MEMSUM_MODELS": _models(context_window=1000, max_output_tokens=990)},
            "MEMSUM_MODELS[a/b].max_output_tokens",
        ),
    ],
    ids=["reply-over-window", "reply-nearly-window", "tiny-window", "model-max-output"],
)
async def test_a_reply_reserve_that_leaves_no_room_names_the_reserve_not_the_persona(
    tmp_path: Path, env: dict[str, str], key: str
) -> None:
    """Before: with MEMSUM_REPLY_MAX_TOKENS=40000 on a 32000-token model (or a tiny window),
    bot.py stopped with 「invalid MEMSUM_PERSONA: the persona takes 121 tokens, more than half
    of the 0 …」 although the owner never set a persona: the built-in one was blamed for the
    reserve. Now the line names the reserve that leaves no room, and how to fix it."""
    code, log = await _stops(tmp_path, env)
    assert code != 0
    line = _one_line_naming(log, key)
    assert "MEMSUM_PERSONA" not in line
    assert "make it smaller or use a model with a larger context_window" in line


WRONG_VALUES: list[tuple[str, str, str, str]] = [
    # (key in .env, value, key the line names, what the line says is expected)
    ("MEMSUM_COMPRESS_AT", "80%", "MEMSUM_COMPRESS_AT", "valid number"),
    ("MEMSUM_COMPRESS_AT", "１.５", "MEMSUM_COMPRESS_AT", "full-width"),
    ("MEMSUM_SUMMARY_BUDGET_RATIO", "0.6", "MEMSUM_SUMMARY_BUDGET_RATIO", "less than or equal to 0.5"),
    ("MEMSUM_CAPACITY", "fast", "MEMSUM_CAPACITY", "'measured' or 'spec'"),
    ("MEMSUM_HISTORY_LIMIT", "-1", "MEMSUM_HISTORY_LIMIT", "greater than or equal to 0"),
    ("MEMSUM_TRIM_RATIO", "0", "MEMSUM_TRIM_RATIO", "greater than 0"),
    ("MEMSUM_REPLY_MAX_TOKENS", "", "MEMSUM_REPLY_MAX_TOKENS", "the value is empty"),
    (
        "MEMSUM_TIERS",
        '{"onebot.grup": {"compress_at": 0.5}}',
        "MEMSUM_TIERS",
        "onebot, onebot.group, onebot.private",
    ),
    ("MEMSUM_TIERS", "{onebot: 1}", "MEMSUM_TIERS", "not valid JSON"),
    (
        "MEMSUM_TIERS",
        '{"onebot.group": {"mode": "silent"}}',
        "MEMSUM_TIERS[onebot.group][mode]",
        "'on', 'record' or 'off'",
    ),
    ("MEMSUM_TOKENIZER", "gpt2", "MEMSUM_TOKENIZER", "o200k_base|cl100k_base"),
    ("MEMSUM_MAX_TOOL_ROUNDS", "33", "MEMSUM_MAX_TOOL_ROUNDS", "less than or equal to 32"),
    ("MEMSUM_COMPRESS_CONCURRENCY", "0", "MEMSUM_COMPRESS_CONCURRENCY", "greater than or equal to 1"),
    ("MEMSUM_RESUME_WINDOW", "1e400", "MEMSUM_RESUME_WINDOW", "finite number"),
    ("MEMSUM_BACKFILL_HOURS", "169", "MEMSUM_BACKFILL_HOURS", "less than or equal to 168"),
    ("MEMSUM_BACKFILL_COUNT", "x", "MEMSUM_BACKFILL_COUNT", "valid integer"),
    ("MEMSUM_DEFAULT_MODE", "开", "MEMSUM_DEFAULT_MODE", "'on', 'record' or 'off'"),
    ("MEMSUM_USER_COOLDOWN", "-1", "MEMSUM_USER_COOLDOWN", "greater than or equal to 0"),
    ("MEMSUM_DAILY_TOKEN_CAP", "1.5", "MEMSUM_DAILY_TOKEN_CAP", "valid integer"),
    ("MEMSUM_TIMEZONE", "UTC+8", "MEMSUM_TIMEZONE", "IANA name such as Asia/Shanghai"),
    ("MEMSUM_FORWARD_THRESHOLD", "abc", "MEMSUM_FORWARD_THRESHOLD", "valid integer"),
    ("MEMSUM_GROUP_ADMIN_COMMANDS", "是", "MEMSUM_GROUP_ADMIN_COMMANDS", "valid boolean"),
    ("MEMSUM_DB_URL", "mysql://memsum:S3cretPW@db/memsum", "MEMSUM_DB_URL", "postgresql://user:password@"),
    ("MEMSUM_COMMAND_PRIORITY", "-1", "MEMSUM_COMMAND_PRIORITY", "greater than or equal to 0"),
    ("MEMSUM_WEB_TOKEN", "shortS3cretTok", "MEMSUM_WEB_TOKEN", "at least 16 characters"),
    ("MEMSUM_LLM_TIMEOUT", "0", "MEMSUM_LLM_TIMEOUT", "greater than 0"),
    ("MEMSUM_MODELS", _models()[:-2] + ",}]", "MEMSUM_MODELS", "not valid JSON"),
    ("MEMSUM_MODELS", _models(base_url="ftp://x"), "MEMSUM_MODELS[0][base_url]", "https?://"),
    ("MEMSUM_MODELS", _models(context_window="32k"), "MEMSUM_MODELS[0][context_window]", "valid integer"),
    ("MEMSUM_MODELS", _models(price_in=-1), "MEMSUM_MODELS[0][price_in]", "greater than or equal to 0"),
]
THROUGH_BOT_PY = (1, 6, 8, 9, 13, 19, 22, 24, 27)
"""The cases run through bot.py: one of each kind of failure (full-width, empty, broken JSON,
a nested key, infinity, a time zone, a database URL with a password, a token, a model's
URL); all of them in-process through the same parser (each bot.py costs seconds)."""


def test_r_cfg_1_each_wrong_env_value_is_refused_in_one_line_naming_the_key() -> None:
    """Every case of the table through the parser bot.py uses (the values as NoneBot's
    .env reader passes them: JSON-decoded when they decode)."""
    from nonebot_plugin_memsum.config import ConfigError, parse_config

    for key, value, named, expects in WRONG_VALUES:
        try:
            decoded: Any = json.loads(value)
        except ValueError:
            decoded = value
        raw = {"memsum_models": json.loads(_models()), key.lower(): decoded}
        with pytest.raises(ConfigError) as info:
            parse_config(raw)
        line = str(info.value)
        assert "\n" not in line, (key, value, line)
        assert line.startswith(f"invalid {named}:"), (key, value, line)
        assert expects in line, (key, value, line)
        assert not any(secret in line for secret in (SECRET, "S3cretPW", "shortS3cretTok")), line


@pytest.mark.parametrize("chunk", range(0, len(THROUGH_BOT_PY), 5))
async def test_r_cfg_1_each_kind_of_wrong_env_value_stops_bot_py_with_one_line_naming_the_key(
    tmp_path: Path, chunk: int
) -> None:
    """bot.py with a wrong value stops with a non-zero code and exactly one line naming the
    key and what it expects; no traceback; neither the API key nor a password or token
    shown. (Up to five bot.py processes per test, two at a time.)"""
    gate = asyncio.Semaphore(2)

    async def one(index: int) -> None:
        key, value, named, expects = WRONG_VALUES[index]
        async with gate:
            code, log = await _stops(tmp_path / str(index), {key: value})
        assert code != 0, (key, value)
        line = _one_line_naming(log, named)
        assert expects in line, (key, value, line)
        for secret in ("S3cretPW", "shortS3cretTok"):
            assert secret not in log, (key, log)

    await asyncio.gather(*(one(i) for i in THROUGH_BOT_PY[chunk : chunk + 5]))


async def test_an_empty_persona_db_path_or_error_reply_starts_with_the_documented_default(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    """`MEMSUM_PERSONA=` is the built-in persona (.env.example: 「leave empty for the built-in
    one」), `MEMSUM_DB_PATH=` the localstore data folder, `MEMSUM_ERROR_REPLY=` says nothing
    when a turn fails (README)."""
    from nonebot_plugin_memsum.config import DEFAULT_PERSONA

    llm.reset()
    llm.default = Reply(status=400, error="bad request")  # not retried
    env = {
        "MEMSUM_MODELS": json.dumps([llm.model_config()]),
        "MEMSUM_PERSONA": "",
        "MEMSUM_DB_PATH": "",
        "MEMSUM_ERROR_REPLY": "",
    }
    async with BotProcess(tmp_path, env=env, log_level="INFO") as proc, connected(proc) as s:
        got = await said(s, 74001, SUPERUSER, "/人设")
        assert got == [f"本群人设（全局配置）：\n{DEFAULT_PERSONA}"]
        assert await said(s, 74001, MEMBER, "小记，在吗", quiet=2) == []  # the model failed: silence
        assert list((tmp_path / "localstore" / "data").rglob("*.db")), "no database in the data folder"
        assert not (tmp_path / "memsum.db").exists()
    assert "Traceback" not in proc.log()
    llm.reset()
    llm.on_request(_answer)
