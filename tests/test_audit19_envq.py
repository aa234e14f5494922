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

from tests.fakes.botproc import BotProcess
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
