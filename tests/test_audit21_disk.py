"""Outside audit 21 (disk): what a bot owner meets when the database file and its folder
misbehave. bot.py as a real process on its own SQLite file, the OneBot simulator over the
reverse WebSocket (tests/fakes/onebot.py), the scripted model server: a folder the bot
cannot create its file in.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.llm_server import Reply, ScriptedLLM

pytestmark = pytest.mark.e2e

PERSONA = "你是审计群里的助手小记。"


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == PERSONA


@pytest.fixture
def answering(llm: ScriptedLLM) -> ScriptedLLM:
    llm.reset()
    llm.on_request(lambda b: Reply("好的") if is_chat(b) else None)
    return llm


def bot_in(tmp_path: Path, llm: ScriptedLLM, **extra: str) -> BotProcess:
    """bot.py at INFO (the level an owner runs at) on `tmp_path/bot`."""
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA, **extra}
    return BotProcess(tmp_path / "bot", env=env, log_level="INFO")


# ---- a folder the bot cannot create its file in -------------------------------------------
async def test_a_database_folder_the_bot_cannot_write_stops_start_up_with_one_line_naming_it(
    tmp_path: Path, answering: ScriptedLLM
) -> None:
    # MEMSUM_DB_PATH in a folder made by another user (`sudo mkdir`, a Windows user's
    # C:\Program Files): SQLite says only "unable to open database file", which names no
    # cause. The line says the folder must be writable.
    folder = tmp_path / "张三 的数据"
    folder.mkdir()
    bot = bot_in(tmp_path, answering, MEMSUM_DB_PATH=str(folder / "memsum.db"))
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes whatever the mode says, unless it drops these capabilities
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "running as root needs util-linux setpriv"
        bot.wrapper = (setpriv, "--bounding-set=-dac_override,-dac_read_search")
    try:
        with pytest.raises(BotExitedError) as exited:
            await bot.start()
    finally:
        folder.chmod(0o755)
    log = exited.value.log
    naming = [line for line in log.splitlines() if "MEMSUM_DB_PATH" in line]
    assert len(naming) == 1, log
    assert str(folder) in naming[0]
    assert "write" in naming[0]
    assert "Traceback" not in log
    assert exited.value.returncode != 0
