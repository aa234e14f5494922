"""Audit 19 (envq): the machines QQ-bot owners really run the bot on: a Windows editor's
`.env`, a console or log file that is not UTF-8 (Windows' code page 936, a C-locale Linux),
data paths with Chinese characters, spaces, `~`. bot.py runs as a real subprocess
(tests/fakes/botproc.py) with the OneBot simulator and the scripted model server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import connected, group_sid, wait_rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import plain_text

pytestmark = pytest.mark.e2e

PERSONA = "你是审计群里的助手小记。"
GROUP = 19001
MEMBER = 20001


@pytest.fixture(scope="module")
def llm() -> Any:
    with ScriptedLLM() as server:
        yield server


class _Console(BotProcess):
    """bot.py with its output in a console or file of another encoding than UTF-8."""

    def __init__(self, workdir: Path, console: dict[str, str], **kwargs: Any) -> None:
        super().__init__(workdir, **kwargs)
        self.console = console

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in super()._child_env().items() if k not in ("LANG", "LC_ALL", "LC_CTYPE")}
        del env["PYTHONIOENCODING"]
        return {**env, **self.console}


# ---- 1. `.env` as Windows editors save it ---------------------------------------------------
class _Saved(BotProcess):
    """bot.py with its `.env` saved as a Windows editor does: CRLF line endings, `encoding`
    (Notepad's "UTF-8 with BOM" is utf-8-sig, its "ANSI" on a Chinese Windows is GBK, its
    "Unicode" UTF-16), `pad` after every value, MEMSUM_PERSONA on the first line."""

    def __init__(self, workdir: Path, encoding: str, pad: str = "", **kwargs: Any) -> None:
        super().__init__(workdir, **kwargs)
        self.encoding, self.pad = encoding, pad

    def _write_dotenv(self) -> None:
        first = {"MEMSUM_PERSONA": self.env["MEMSUM_PERSONA"]}
        lines = [f"{key}={value}{self.pad}" for key, value in {**first, **self.env}.items()]
        text = "\r\n".join(lines) + "\r\n"
        (self.workdir / ".env").write_bytes(text.encode(self.encoding))


def _chat_env(llm: ScriptedLLM) -> dict[str, str]:
    return {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}


async def test_a_notepad_env_with_a_bom_crlf_and_trailing_spaces_is_read_as_written(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # The persona on the BOM's line, the nickname followed by spaces and a CR: a lost first
    # key, a persona or nickname with a \r or the BOM in it would each answer differently.
    llm.reset()
    llm.on_request(lambda body: Reply("在的") if body["messages"][0]["content"] == PERSONA else None)
    async with _Saved(tmp_path / "bot", "utf-8-sig", "   ", env=_chat_env(llm), log_level="INFO") as bot:
        async with connected(bot) as sim:
            mark = len(sim.calls)
            await sim.group_message(GROUP, MEMBER, "小记 在吗", nickname="甲")
            call = await sim.wait_call("send_msg", after=mark, timeout=20)
    assert plain_text(call.params["message"]).endswith("在的")
    assert llm.requests[-1]["messages"][0]["content"] == PERSONA


@pytest.mark.parametrize("encoding", ["gbk", "gb18030", "utf-16"])
async def test_an_env_not_saved_as_utf8_stops_start_up_with_one_line_saying_so(
    tmp_path: Path, llm: ScriptedLLM, encoding: str
) -> None:
    # NoneBot reads .env as UTF-8: the UnicodeDecodeError was reported as "invalid DRIVER in
    # .env", with DRIVER's form to write, whatever the file held.
    with pytest.raises(BotExitedError) as exited:
        await _Saved(tmp_path / "bot", encoding, env=_chat_env(llm), log_level="INFO").start()
    log = exited.value.log
    said = [line for line in log.splitlines() if "CRITICAL" in line or "Traceback" in line]
    assert (exited.value.returncode, len(said)) == (2, 1), log
    assert "bot.py: .env is not saved as UTF-8 (line 1)" in said[0]
    assert "DRIVER" not in said[0]
    assert PERSONA not in log


async def test_a_nickname_in_full_width_quotes_stops_start_up_with_one_line_naming_it(tmp_path: Path) -> None:
    # “” typed with a Chinese input method: not JSON, so no name at all would call the bot.
    bot = BotProcess(tmp_path / "bot", env={"NICKNAME": "[“小记”]"}, log_level="INFO")
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    said = [line for line in exited.value.log.splitlines() if "CRITICAL" in line or "Traceback" in line]
    assert (exited.value.returncode, len(said)) == (2, 1), exited.value.log
    assert "bot.py: invalid NICKNAME in .env" in said[0]
    assert 'NICKNAME=["小记"]' in said[0]  # the form that works


# ---- 2. a console or log file that is not UTF-8 --------------------------------------------
# What members send that code page 936 (GBK) and ASCII cannot encode: emoji, a CJK
# extension-B character, bidi controls (the RLO an attacker uses to reverse a name).
HARD_TEXT = ["小记 看这个😂👍🏻", "小记 𠮷野家的𪚥字", "小记 \u202eabc\u202c 是什么"]


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
@pytest.mark.parametrize(
    "console",
    [
        {"PYTHONIOENCODING": "gbk"},  # Windows' console code page 936, as Python names it
        {"LC_ALL": "C", "PYTHONUTF8": "0"},  # a C-locale Linux box: stdout is ASCII
    ],
    ids=["gbk", "c-locale"],
)
async def test_a_console_that_cannot_encode_what_members_send_keeps_the_bot_answering(
    tmp_path: Path, llm: ScriptedLLM, console: dict[str, str], level: str
) -> None:
    llm.reset()
    llm.on_request(lambda body: Reply("收到🙂") if body["messages"][0]["content"] == PERSONA else None)
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}
    async with _Console(tmp_path / "bot", console, env=env, log_level=level) as bot:
        async with connected(bot) as sim:
            for n, said in enumerate(HARD_TEXT):
                mark = len(sim.calls)
                await sim.group_message(GROUP, MEMBER, said, nickname="甲🌸")
                call = await sim.wait_call("send_msg", after=mark, timeout=20)
                assert plain_text(call.params["message"]).endswith("收到🙂")
                await wait_rows(bot, group_sid(GROUP), 2 * (n + 1))
        assert bot.running
    log = bot.log()
    assert "Logging error" not in log, log
    assert "UnicodeEncodeError" not in log, log
    if level == "DEBUG":  # the line of a message with an emoji is kept, the emoji escaped
        assert "\\U0001f602" in log, log


# ---- 3. where the database file goes -------------------------------------------------------
@pytest.mark.parametrize(
    ("written", "where"),
    [
        # `~` as owners write it after `python -m nonebot_plugin_memsum.migrate --from
        # sqlite:~/…`, which expands it: the bot made a folder named `~` in its own.
        ("~/机器人 数据/memsum.db", "home/机器人 数据/memsum.db"),
        ("数据 目录/memsum.db", "数据 目录/memsum.db"),  # relative: to the folder of .env
    ],
    ids=["tilde", "relative"],
)
async def test_a_database_path_with_a_tilde_spaces_or_relative_is_the_file_it_names(
    tmp_path: Path, llm: ScriptedLLM, written: str, where: str
) -> None:
    bot = BotProcess(tmp_path / "bot", env={**_chat_env(llm), "MEMSUM_DB_PATH": written}, log_level="INFO")
    bot.db_path = tmp_path / "bot" / where  # HOME is the work folder's home/ (botproc.py)
    async with bot, connected(bot) as sim:
        await sim.group_message(GROUP, MEMBER, "早上好", nickname="甲")
        await wait_rows(bot, group_sid(GROUP), 1)
    assert not (tmp_path / "bot" / "~").exists()
