"""Fifth outside audit (j): the user-facing contract and the docs, as an owner who installs
the bot from the README and relies on every name it documents.

Every `.env` key, command form and string that the README, `.env.example`, the plugin's
usage text (PluginMetadata.usage) and the resolved issues name is checked against the
product: a key takes effect with a valid non-default value, an empty value means what
`.env.example` says, a wrong value stops start-up naming the key; the docs name modules,
commands and commands' permissions that exist; the README's commands are `.ci/run`'s.
Start-up goes through bot.py as a subprocess where the `.env` reading itself matters.
"""

from __future__ import annotations

from pathlib import Path

from nonebot_plugin_memsum.config import parse_config
from tests.fakes.botproc import BotProcess


# ---- Empty values mean the default --------------------------------------------------------------
def test_an_empty_db_path_means_the_localstore_file() -> None:
    default = Path("/data/memsum.db")
    for raw in ("", "  "):
        assert parse_config({"memsum_db_path": raw}).store_location(default) == default
    assert parse_config({"memsum_db_path": "x/m.db"}).store_location(default) == Path("x/m.db")


async def test_bot_py_with_memsum_db_path_written_empty_starts_on_the_localstore_file(tmp_path: Path) -> None:
    # Before: `MEMSUM_DB_PATH=` (the way .env.example writes MEMSUM_PREFERRED_MODEL= and the
    # other keys whose empty value means the default) was read as the folder ".", and start-up
    # stopped with "MEMSUM_DB_PATH: cannot open .: unable to open database file".
    bot = BotProcess(tmp_path, env={"MEMSUM_DB_PATH": ""}, log_level="INFO")
    try:
        await bot.start()
    finally:
        code = await bot.stop()
    log = bot.log()
    assert code == 0, log
    data = tmp_path / "localstore" / "data" / "nonebot_plugin_memsum" / "memsum.db"
    assert data.is_file(), log
    assert f"memsum: database {data}" in log
    assert "MEMSUM_DB_PATH" not in log
