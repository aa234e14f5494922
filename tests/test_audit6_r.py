"""Sixth outside audit (r): the owner's first week, then a plugin author's.

A new QQ-bot owner who follows only the README and `.env.example`: every kind of value
an owner types into `.env` (numbers for QQ ids, a full-width comma or digit, a comment
after a value, Windows line endings, an empty value, no `.env` at all, a settings key
given only as an environment variable), `bot.py` as a real process (a database folder
that does not exist, a port in use), a persona too long for the model, and every command
as it is really typed over OneBot (an @ or a reply in front of it, full-width spaces and
digits, a member's command). Then a plugin author on `nonebot_plugin_memsum.api`: a
session id that does not exist, and a turn with nothing new to answer.

Real paths throughout: bot.py as a subprocess with the OneBot simulator over the real
WebSocket, the real SQLite file, the scripted OpenAI-compatible server over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nonebot_plugin_memsum import api, runtime
from nonebot_plugin_memsum.config import (
    PERSONA_MAX,
    ConfigError,
    ModelConfig,
    environment_only_keys,
    parse_config,
    superuser_problems,
)
from nonebot_plugin_memsum.errors import MemsumError
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import connected, group_sid, private_sid, query, until, wait_log
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import OneBotSim, at, plain_text, reply
from tests.fakes.onebot import text as seg

SUPERUSER = 10001
MEMBER = 20003


async def _refused(bot: BotProcess) -> tuple[int, str]:
    """bot.py's exit code and log when it must not start."""
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    return exited.value.returncode, exited.value.log


def _lines_naming(log: str, key: str) -> list[str]:
    return [line for line in log.splitlines() if key in line]


# ---- SUPERUSERS and NoneBot's own keys, as owners write them ----------------------------------
@pytest.mark.parametrize(
    "written",
    [
        "[10001]",  # QQ numbers are numbers: the most common way to write it
        "10001",  # no brackets
        '["10001"，"10002"]',  # a full-width comma from a Chinese input method
        "['10001']",  # Python's quotes
    ],
)
async def test_superusers_written_as_owners_write_them_stop_bot_py_with_one_line_naming_it(
    tmp_path: Path, written: str
) -> None:
    # Before: NoneBot's pydantic or JSON error escaped nonebot.init() as a 20-line traceback
    # ending in `superusers.0 Input should be a valid string` or `error parsing env var`.
    bot = BotProcess(tmp_path, env={"SUPERUSERS": written}, log_level="INFO")
    code, log = await _refused(bot)
    assert code == 2
    assert "Traceback" not in log
    naming = _lines_naming(log, "SUPERUSERS")
    assert len(naming) == 1, log
    assert "CRITICAL" in naming[0]
    assert 'SUPERUSERS=["10001", "10002"]' in naming[0]  # the form that works


async def test_a_port_that_is_no_number_stops_bot_py_naming_port(tmp_path: Path) -> None:
    bot = BotProcess(tmp_path, log_level="INFO")
    bot.env["PORT"] = "80８0"
    code, log = await _refused(bot)
    assert code == 2
    assert "Traceback" not in log
    naming = _lines_naming(log, "invalid PORT")
    assert len(naming) == 1, log
    assert "integer" in naming[0]


async def test_superusers_with_full_width_digits_or_a_space_are_named_at_start_up(tmp_path: Path) -> None:
    # Valid JSON, so NoneBot takes them, but no QQ number ever equals "１０００１" or
    # "10002 ": every command of that owner was ignored without a word.
    bot = BotProcess(tmp_path, env={"SUPERUSERS": '["１０００１", "10002 ", "10003"]'}, log_level="INFO")
    async with bot:
        log = await wait_log(bot, "Application startup complete")
    warned = [line for line in log.splitlines() if "SUPERUSERS entry" in line]
    assert len(warned) == 2, log
    assert any("'１０００１'" in line for line in warned)
    assert any("'10002 '" in line for line in warned)
    assert not any("10003" in line for line in warned)
    assert superuser_problems(set()) == [
        'SUPERUSERS is empty: nobody can use the commands (write your QQ number: SUPERUSERS=["10001"])'
    ]
    assert superuser_problems({"10001", "onebot:10002"}) == []


class _NoDotenvBot(BotProcess):
    """bot.py started in a folder without `.env`; its settings as environment variables."""

    def _write_dotenv(self) -> None:
        (self.workdir / ".env").unlink(missing_ok=True)

    def _child_env(self) -> dict[str, str]:
        return {**super()._child_env(), **self.env}


async def test_bot_py_without_env_says_so_and_that_memsum_keys_from_the_environment_are_ignored(
    tmp_path: Path,
) -> None:
    # Started from the wrong folder (or with `-e` variables only, as Docker users do): it ran
    # on defaults without a word, a database in ~/.local/share and no model.
    bot = _NoDotenvBot(tmp_path, env={"MEMSUM_COMPRESS_AT": "0.5"}, log_level="INFO")
    async with bot:
        log = await wait_log(bot, "Application startup complete")
    assert f"no .env in {tmp_path}" in log
    ignored = _lines_naming(log, "MEMSUM_COMPRESS_AT")
    assert len(ignored) == 1, log
    assert "not in .env" in ignored[0]
    # The environment's NoneBot keys still apply: it listened on the port it was given.
    assert f":{bot.port}" in log
    raw = {"memsum_compress_at": "0.5"}
    assert environment_only_keys({"MEMSUM_COMPRESS_AT": "0.5"}, raw) == []
    assert environment_only_keys({"MEMSUM_HISTORY_LIMIT": "9", "PATH": "/bin"}, raw) == [
        "MEMSUM_HISTORY_LIMIT is set in the environment but not in .env: NoneBot reads this plugin's"
        " keys only from .env (where the environment variable then overrides it), so it is ignored"
    ]


# ---- values of MEMSUM_ keys ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("memsum_compress_at", "", "the value is empty (delete the line for the default)"),
        ("memsum_history_limit", "  ", "the value is empty (delete the line for the default)"),
        ("memsum_compress_at", "０.５", "full-width characters"),
        ("memsum_daily_token_cap", "１０００００", "full-width characters"),
        ("memsum_user_cooldown", "３０", "full-width characters"),
        ("memsum_default_mode", "", "the value is empty"),
    ],
)
def test_r_cfg_1_an_empty_or_full_width_value_is_refused_saying_which_it_is(
    key: str, value: str, said: str
) -> None:
    # Before: "Input should be a valid number, unable to parse string as a number" for a
    # value that looks like one to the owner who typed it.
    with pytest.raises(ConfigError) as refused:
        parse_config({key: value})
    line = str(refused.value)
    assert line.startswith(f"invalid {key.upper()}: ")
    assert said in line


# ---- MEMSUM_PERSONA: no longer than any other persona, and never over the window ---------------
def test_memsum_persona_longer_than_any_persona_may_be_is_refused_naming_the_key() -> None:
    # Before: /人设 and a tier's persona were capped at 1000 characters, MEMSUM_PERSONA not
    # at all: a pasted character card of any size went with every request.
    assert parse_config({"memsum_persona": "人" * PERSONA_MAX}).memsum_persona == "人" * PERSONA_MAX
    assert parse_config({"memsum_persona": f"  {'人' * PERSONA_MAX}\n"}).memsum_persona == "人" * PERSONA_MAX
    with pytest.raises(ConfigError) as refused:
        parse_config({"memsum_persona": "角色设定。" * 300})
    line = str(refused.value)
    assert line.startswith("invalid MEMSUM_PERSONA: ")
    assert f"at most {PERSONA_MAX} characters" in line
    assert "1500" in line
    assert "角色设定" not in line


async def test_a_persona_the_chat_models_window_cannot_carry_stops_bot_py_naming_the_key(
    tmp_path: Path,
) -> None:
    # Before: a 2k-window model with a 900-character persona started, and every request was
    # the persona plus the question cut to nothing: over the window, refused by the provider.
    model = {"id": "local/small", "base_url": "http://127.0.0.1:9/v1", "context_window": 2048}
    persona = "你是一只说话带喵的猫娘，" * 75  # 900 characters
    assert estimate_text_tokens(persona) > (2048 - 1024) // 2
    env = {"MEMSUM_MODELS": json.dumps([model]), "MEMSUM_PERSONA": persona}
    bot = BotProcess(tmp_path, env=env, log_level="INFO")
    code, log = await _refused(bot)
    assert code != 0
    assert "Traceback" not in log
    naming = _lines_naming(log, "MEMSUM_PERSONA")
    assert len(naming) == 1, log
    assert "local/small" in naming[0]
    assert "1024" in naming[0]  # what a request of that model may carry
    assert "猫娘" not in log


async def test_a_tier_persona_the_window_cannot_carry_is_refused_and_a_fitting_one_starts(
    tmp_path: Path,
) -> None:
    model = {"id": "local/small", "base_url": "http://127.0.0.1:9/v1", "context_window": 2048}
    tiers = {"onebot.group": {"persona": "群聊里你是一位严谨的历史老师，" * 60}}
    env = {"MEMSUM_MODELS": json.dumps([model]), "MEMSUM_TIERS": json.dumps(tiers, ensure_ascii=False)}
    code, log = await _refused(BotProcess(tmp_path / "long", env=env, log_level="INFO"))
    assert code != 0
    assert len(_lines_naming(log, "MEMSUM_TIERS[onebot.group].persona")) == 1, log
    tiers = {"onebot.group": {"persona": "群聊里你是一位严谨的历史老师。"}}
    env["MEMSUM_TIERS"] = json.dumps(tiers, ensure_ascii=False)
    async with BotProcess(tmp_path / "short", env=env, log_level="INFO") as bot:
        await wait_log(bot, "Application startup complete")


# ---- the commands as they are really typed, over OneBot ----------------------------------------
@pytest.fixture(scope="module")
def answering() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        server.on_request(lambda body: Reply("模型的回答"))
        yield server


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, answering: ScriptedLLM) -> Any:
    # A Windows owner's .env: CRLF line endings, Notepad's UTF-8 byte order mark, comments
    # after values, quoted values, and a database in a folder that does not exist yet.
    class _WindowsBot(BotProcess):
        def _write_dotenv(self) -> None:
            lines = [f"{key}={value}" for key, value in self.env.items()]
            text = "\r\n".join(["# 机器人配置", *lines]) + "\r\n"
            (self.workdir / ".env").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))

    workdir = tmp_path_factory.mktemp("owner")
    proc = _WindowsBot(workdir, log_level="INFO")
    proc.db_path = workdir / "数据" / "new" / "memsum.db"
    proc.env.update(
        {
            "SUPERUSERS": '["10001"]  # 我的 QQ',
            "NICKNAME": '["小记"]',
            "COMMAND_START": '["/"]',
            "MEMSUM_DB_PATH": str(proc.db_path),
            "MEMSUM_MODELS": f"'{json.dumps([answering.model_config()])}'",
            "MEMSUM_COMPRESS_AT": "0.6  # 压缩线",
            "MEMSUM_HISTORY_LIMIT": '"40"',
            "MEMSUM_DEFAULT_MODE": "on # 开",
        }
    )
    async with proc:
        yield proc


@pytest.fixture(scope="module")
async def sim(bot: BotProcess) -> Any:
    async with connected(bot) as s:
        yield s


async def _said(sim: OneBotSim, group: int, user: int, message: Any, *, quiet: float = 0.8) -> list[str]:
    """What the bot sends after one group message (nothing within `quiet` s: nothing)."""
    mark = len(sim.calls)
    await sim.group_message(group, user, message)
    try:
        call = await sim.wait_call("send_msg", after=mark, timeout=quiet if quiet else 15)
    except TimeoutError:
        return []
    return [plain_text(call.params["message"])]


async def _stored(bot: BotProcess, sid: str) -> list[str]:
    sql = "SELECT content FROM messages WHERE session_id = ? ORDER BY id"
    return [row[0] for row in await query(bot.db_path, sql, sid)]


async def test_a_windows_env_with_comments_and_quotes_is_read_and_the_database_folder_made(
    bot: BotProcess, sim: OneBotSim
) -> None:
    assert bot.db_path.is_file()  # 数据/new/ made for it
    group = 61001
    got = await _said(sim, group, SUPERUSER, "/压缩线", quiet=0)
    assert got[0].startswith("压缩线 0.6（全局配置）")
    got = await _said(sim, group, SUPERUSER, "/条数线", quiet=0)
    assert got[0].startswith("条数线 40（全局配置）")
    got = await _said(sim, group, SUPERUSER, "/记忆模式", quiet=0)
    assert got == ["本群模式：开（全局配置）：记录并回答。"]
    assert await _stored(bot, group_sid(group)) == []  # commands are never recorded


async def test_a_command_behind_an_at_or_a_reply_is_the_owners_command_and_never_recorded(
    bot: BotProcess, sim: OneBotSim, answering: ScriptedLLM
) -> None:
    group = 61002
    asked = len(answering.requests)
    quoted = await sim.group_message(group, MEMBER, "周末去爬山吗")
    await until(lambda: _count(bot, group_sid(group), 1), "the member's line stored")
    mode = "本群模式：开（全局配置）：记录并回答。"
    assert await _said(sim, group, SUPERUSER, [at(10000), seg(" /记忆模式")], quiet=0) == [mode]
    assert await _said(sim, group, SUPERUSER, [reply(quoted), seg("/记忆模式")], quiet=0) == [mode]
    assert await _said(sim, group, SUPERUSER, [reply(quoted), at(10000), seg(" /记忆模式")], quiet=0) == [
        mode
    ]
    assert await _said(sim, group, SUPERUSER, "小记 /记忆模式", quiet=0) == [mode]
    assert await _stored(bot, group_sid(group)) == ["[用户20003(20003)] 周末去爬山吗"]
    assert len(answering.requests) == asked  # no command reached the model


async def test_a_members_command_with_an_at_or_a_reply_gets_nothing_and_stores_nothing(
    bot: BotProcess, sim: OneBotSim, answering: ScriptedLLM
) -> None:
    # An @ would otherwise ask the bot: the command must not become a question to the model,
    # nor show the member anything of the group's memory.
    group = 61003
    asked = len(answering.requests)
    quoted = await sim.group_message(group, MEMBER, "谁发过网盘链接")
    await until(lambda: _count(bot, group_sid(group), 1), "the member's line stored")
    assert await _said(sim, group, MEMBER, [at(10000), seg(" /摘要")]) == []
    assert await _said(sim, group, MEMBER, [reply(quoted), seg("/回忆 网盘")]) == []
    assert await _said(sim, group, MEMBER, "/清除 上下文 确认") == []
    assert await _stored(bot, group_sid(group)) == ["[用户20003(20003)] 谁发过网盘链接"]
    assert len(answering.requests) == asked
    # A private peer's command too: in private every message is answered, a command is not.
    mark = len(sim.calls)
    await sim.private_message(30001, "/摘要")
    await asyncio.sleep(0.8)
    assert [c for c in sim.calls[mark:] if c.action.startswith("send")] == []
    assert await _stored(bot, private_sid(30001)) == []


async def test_arguments_typed_with_full_width_spaces_digits_and_extra_spaces_are_read(
    bot: BotProcess, sim: OneBotSim
) -> None:
    group = 61004
    got = await _said(sim, group, SUPERUSER, "/记忆模式　仅记录", quiet=0)
    assert got[0].startswith("已将本群模式设为 仅记录。")
    got = await _said(sim, group, SUPERUSER, "/记忆模式   开  ", quiet=0)
    assert got[0].startswith("已将本群模式设为 开。")
    got = await _said(sim, group, SUPERUSER, "/条数线　群　３０", quiet=0)
    assert got[0].startswith("已将本群的条数线设为 30。")
    got = await _said(sim, group, SUPERUSER, "/限额 １０００００", quiet=0)
    assert got[0].startswith("已修改本群每日限额。\n现在：本群每日限额 100000 token（本群）")
    got = await _said(sim, group, SUPERUSER, "/限额 10万", quiet=0)  # said what it takes
    assert got[0].startswith("没有修改：限额须是 0 到 ")
    got = await _said(sim, group, SUPERUSER, "/压缩 现在", quiet=0)
    assert got == ["用法：/压缩（不带参数）"]


async def _count(bot: BotProcess, sid: str, n: int) -> bool:
    return len(await _stored(bot, sid)) >= n


async def test_a_port_in_use_stops_bot_py_with_a_line_naming_the_address(tmp_path: Path) -> None:
    bot = BotProcess(tmp_path, log_level="INFO")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", bot.port))
        taken.listen()
        await bot.spawn()
        code = await bot.wait_exit(30)
    log = bot.log()
    assert code != 0
    assert "Traceback" not in log
    naming = [line for line in log.splitlines() if f"127.0.0.1:{bot.port}" in line]
    assert len(naming) == 1, log
    assert "已被占用" in naming[0]  # bot.py's line, with the .env key (tests/test_audit18_left.py)


# ---- /人设 against the model's window ------------------------------------------------------------
@pytest.fixture
def small_model() -> Iterator[ScriptedLLM]:
    rt = runtime.get()
    with ScriptedLLM() as server:
        rt.registry.set_models([ModelConfig(**server.model_config("r/small", context_window=2048))])
        try:
            yield server
        finally:
            rt.registry.set_models([])


async def test_a_persona_over_half_of_a_request_is_refused_by_the_command_and_nothing_is_set(
    app: Any, small_model: ScriptedLLM
) -> None:
    from tests.fakes.nonebug import group_msg, new_group, run

    group = new_group()
    long = "你是一只说话带喵的猫娘，" * 75
    tokens = estimate_text_tokens(long)
    await run(
        app,
        group_msg(f"/人设 {long}", group),
        f"没有修改：这段人设约 {tokens} token，超过了模型每次请求可用的一半（1024 token），"
        "每次回答都要带上它，聊天记录就放不下了。请写短一些。",
    )
    await run(
        app,
        group_msg("/人设 你是猫娘。", group),
        "已设置本群人设（5 字），从下一次回答起生效。\n现在：本群人设（本群）：\n你是猫娘。",
    )
    # Over 1000 characters the length is what is said, whatever the window.
    await run(app, group_msg(f"/人设 {'喵' * 1001}", group), "没有修改：人设最长 1000 字，这段有 1001 字。")


# ---- the library: unknown sessions and turns with nothing to answer ---------------------------
@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    rt = runtime.get()
    with ScriptedLLM() as server:
        rt.registry.set_models([ModelConfig(**server.model_config("r/model", context_window=16000))])
        try:
            yield server
        finally:
            rt.registry.set_models([])


async def test_run_turn_on_a_session_never_created_raises_and_calls_no_model(llm: ScriptedLLM) -> None:
    # Before: the model was asked with the persona alone (a paid call), its greeting went to
    # `reply`, and was stored under an id with no session: a history nothing else could see.
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    llm.push(Reply("你好呀"))
    with pytest.raises(api.SessionNotFound) as missing:
        await api.run_turn("r:typo", send)
    assert missing.value.session_id == "r:typo"
    assert "r:typo" in str(missing.value)
    assert llm.requests == []
    assert sent == []
    assert await api.history("r:typo") == []
    with pytest.raises(api.SessionNotFound):
        await api.build_prompt("r:typo")
    assert isinstance(missing.value, MemsumError)
    assert isinstance(missing.value, LookupError)
    assert "SessionNotFound" in api.__all__


async def test_a_child_of_a_parent_never_created_raises_and_creates_nothing() -> None:
    with pytest.raises(api.SessionNotFound) as missing:
        await api.child_session("r:no-parent", "r:no-parent:child")
    assert missing.value.session_id == "r:no-parent"
    assert await runtime.get().store.get_session("r:no-parent:child") is None
    # A child recorded into (api.record) still makes itself, as documented.
    parent = await api.internal_session("r:parent")
    child = await api.child_session(parent.id, "r:parent:child")
    assert child.parent == parent.id


async def test_the_reads_and_no_ops_on_a_session_never_created_answer_as_documented(llm: ScriptedLLM) -> None:
    sid = "r:never"
    assert await api.history(sid) == []
    assert await api.search(sid, "提取码") == []
    status = await api.status(sid)
    assert (status.summary, status.active_messages, status.usage) == (None, 0, None)
    assert (await api.compress(sid)).outcome == "nothing"
    assert await api.compress_at(sid) == pytest.approx(runtime.get().config.memsum_compress_at)
    await api.clear(sid)
    await api.delete_session(sid)
    assert await runtime.get().store.get_session(sid) is None
    assert llm.requests == []


async def test_run_turn_with_nothing_new_is_silent_without_a_model_call(llm: ScriptedLLM) -> None:
    # Before: a second run_turn with nothing new asked the model again with a note that its
    # last answer was already sent; the model's second answer went out and was stored.
    session = await api.internal_session("r:nothing-new")
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    assert await api.run_turn(session.id, send) == "silent"  # an empty session
    assert llm.requests == []
    await api.record(session, api.Message(role="user", content="[甲(1)] 今天几号？"))
    llm.push(Reply("十二月四日"))
    assert await api.run_turn(session.id, send) == "replied"
    llm.push(Reply("又答了一遍"))
    assert await api.run_turn(session.id, send) == "silent"
    assert len(llm.requests) == 1
    assert sent == ["十二月四日"]
    assert [m.content for m in await api.history(session.id)] == ["[甲(1)] 今天几号？", "十二月四日"]
    # A notice is something new to answer; so is a message stored after a silent turn.
    await api.record(session, api.Message(role="notice", content="乙(2) 加入了本群"))
    assert await api.run_turn(session.id, send) == "replied"
    assert sent == ["十二月四日", "又答了一遍"]


async def test_a_question_that_came_in_while_the_answer_was_written_is_still_answered(
    llm: ScriptedLLM,
) -> None:
    # Stored before the answer (it arrived while the model wrote), it is after what the
    # turn read: the next run_turn answers it.
    session = await api.internal_session("r:during")
    await api.record(session, api.Message(role="user", content="[甲(1)] 第一个问题"))
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(_: str) -> None:
        pass

    llm.push(Reply("第一个回答"))
    original = runtime.get().client.chat

    async def chat(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        return await original(*args, **kwargs)

    runtime.get().client.chat = chat  # type: ignore[method-assign]
    try:
        turn = asyncio.create_task(api.run_turn(session.id, slow))
        await entered.wait()
        await api.record(session, api.Message(role="user", content="[乙(2)] 第二个问题"))
        release.set()
        assert await turn == "replied"
    finally:
        runtime.get().client.chat = original  # type: ignore[method-assign]
    llm.push(Reply("第二个回答"))
    assert await api.run_turn(session.id) == "replied"
    assert len(llm.requests) == 2
    assert any("第二个问题" in m["content"] for m in llm.requests[-1]["messages"])


def test_no_secret_of_env_in_any_refusal_line() -> None:
    # The refusals added here name keys and sizes, never a value that may be secret.
    key = "sk-live-abcdef123456"
    with pytest.raises(ConfigError) as refused:
        parse_config(
            {
                "memsum_models": [
                    {"id": "p/m", "base_url": "http://x/v1", "api_key": key, "context_window": 8000}
                ],
                "memsum_web_token": "",
                "memsum_compress_at": "０.８",
            }
        )
    assert key not in str(refused.value)
    assert "full-width characters" in str(refused.value)


# ---- LOG_LEVEL and an open port -------------------------------------------------------------------
async def test_log_level_in_lower_case_is_that_level_and_never_prints_the_config(tmp_path: Path) -> None:
    # Before: loguru knows only INFO, so NoneBot's filter raised on every line: a traceback per
    # line, bot.py dead, and loguru's dump of the failing record printed NoneBot's DEBUG line
    # of the loaded config, the API key in it.
    secret = "sk-live-4f1d9c2b7a"
    model = {"id": "p/m", "base_url": "http://127.0.0.1:9/v1", "api_key": secret, "context_window": 8000}
    bot = BotProcess(tmp_path, env={"MEMSUM_MODELS": json.dumps([model])}, log_level="info")
    async with bot:
        log = await wait_log(bot, "Application startup complete")
    assert "Traceback" not in log
    assert secret not in log
    assert "[DEBUG]" not in log
    assert "[INFO]" in log


async def test_a_log_level_loguru_does_not_know_stops_bot_py_naming_it(tmp_path: Path) -> None:
    secret = "sk-live-4f1d9c2b7a"
    model = {"id": "p/m", "base_url": "http://127.0.0.1:9/v1", "api_key": secret, "context_window": 8000}
    bot = BotProcess(tmp_path, env={"MEMSUM_MODELS": json.dumps([model])}, log_level="verbose")
    code, log = await _refused(bot)
    assert code == 2
    assert "Traceback" not in log
    assert secret not in log
    naming = _lines_naming(log, "LOG_LEVEL")
    assert len(naming) == 1, log
    assert "'verbose'" in naming[0]


@pytest.mark.parametrize("token", [None, "a-long-random-token"])
async def test_an_empty_access_token_on_an_address_others_reach_is_warned(
    tmp_path: Path, token: str | None
) -> None:
    bot = BotProcess(tmp_path, env={"HOST": "0.0.0.0"}, access_token=token, log_level="INFO")
    async with bot:
        log = await wait_log(bot, "Application startup complete")
    warned = _lines_naming(log, "ONEBOT_ACCESS_TOKEN is empty")
    assert len(warned) == (1 if token is None else 0), log
    if token is None:
        assert "HOST=0.0.0.0" in warned[0]
        assert f"port {bot.port}" in warned[0]


# ---- MEMSUM_DB_PATH as Windows owners and hurried owners write it ------------------------------
class _RawDotenvBot(BotProcess):
    """bot.py with `.env` lines written exactly as given in `raw` after the harness's own."""

    raw: tuple[str, ...] = ()

    def _write_dotenv(self) -> None:
        super()._write_dotenv()
        with (self.workdir / ".env").open("a", encoding="utf-8") as env:
            env.write("".join(f"{line}\n" for line in self.raw))


async def test_a_windows_db_path_in_double_quotes_stops_bot_py_naming_the_key(tmp_path: Path) -> None:
    # Before: python-dotenv reads "C:\bot\memsum.db" with \b as a backspace; the bot made and
    # used a file named `C:<backspace>ot\memsum.db` in its folder, every restart the same.
    bot = _RawDotenvBot(tmp_path, log_level="INFO")
    del bot.env["MEMSUM_DB_PATH"]
    bot.raw = ('MEMSUM_DB_PATH="C:\\bot\\memsum.db"',)
    code, log = await _refused(bot)
    assert code == 2
    assert "Traceback" not in log
    naming = _lines_naming(log, "MEMSUM_DB_PATH")
    assert len(naming) == 1, log
    assert "single quotes" in naming[0]
    assert not any("\b" in name for name in os.listdir(tmp_path))
    # In single quotes the backslashes stay (on Windows, the path it names).
    assert parse_config({"memsum_db_path": "C:\\bot\\memsum.db"}).memsum_db_path == Path("C:\\bot\\memsum.db")


async def test_a_db_path_that_is_a_folder_stops_bot_py_saying_to_name_a_file(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    bot = BotProcess(tmp_path, env={"MEMSUM_DB_PATH": str(folder)}, log_level="INFO")
    code, log = await _refused(bot)
    assert code != 0
    assert "Traceback" not in log
    naming = _lines_naming(log, "MEMSUM_DB_PATH")
    assert len(naming) == 1, log
    assert "it is a folder" in naming[0]
    assert str(folder / "memsum.db") in naming[0]
