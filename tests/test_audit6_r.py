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

from pathlib import Path

import pytest

from nonebot_plugin_memsum.config import (
    ConfigError,
    environment_only_keys,
    parse_config,
    superuser_problems,
)
from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.e2e import wait_log

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
