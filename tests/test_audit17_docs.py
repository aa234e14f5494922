"""Audit 17: the README as a contract. What 「在 QQ 里使用」 shows typed as a phone types it,
the `.env` keys as owners write them, and what the quick start prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from nonebot.config import Config as NoneBotConfig
from nonebug import App
from pydantic import SecretStr

from nonebot_plugin_memsum.commands import COMMAND_NAMES, command_starts
from nonebot_plugin_memsum.config import Config, ConfigError, parse_config
from nonebot_plugin_memsum.onebot import group_record, private_record
from nonebot_plugin_memsum.onebot.recovery import is_command
from tests.fakes.botproc import BotExitedError, BotProcess
from tests.fakes.commands import EMPTY_STATUS
from tests.fakes.nonebug import (
    SELF_ID,
    Like,
    group_msg,
    history,
    new_group,
    private_msg,
    run,
    turns_requested,
)


# ---- commands typed with a full-width slash ------------------------------------------
# A Chinese keyboard in full-width mode (the default of many phone IMEs) types 「／压缩」;
# the README shows `/压缩`, and an owner reads the two as the same command.
@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("／压缩", "没有需要压缩的内容。"),
        ("／摘要", EMPTY_STATUS),
        ("／清除 摘要", "已清除本会话的摘要，上下文保留。"),
        (
            "／记忆模式 仅记录",
            "已将本群模式设为 仅记录。\n现在：本群模式：仅记录（本群）：只记录和压缩，不回答。",
        ),
        ("／限额100000", Like("已修改本群每日限额。\n现在：本群每日限额 100000 token（本群）.*")),
    ],
)
async def test_a_command_typed_with_a_full_width_slash_is_that_command(
    app: App, text: str, answer: str
) -> None:
    group = new_group()
    await run(app, group_msg(text, group), answer)
    # A command, not chat: never stored.
    assert await history(group_record(SELF_ID, group).id) == []


async def test_a_full_width_command_in_private_is_answered_by_the_command_not_the_model(app: App) -> None:
    # In a private chat every message asks the model: 「／压缩」 read as chat went to it.
    peer = new_group()
    event = private_msg("／压缩", user=peer)
    assert await turns_requested(app, event) == []
    owner = private_msg("／压缩")
    await run(app, owner, "没有需要压缩的内容。")
    assert await history(private_record(SELF_ID, peer).id) == []


async def test_a_members_full_width_command_is_not_ours_and_a_longer_word_is_chat(app: App) -> None:
    group = new_group()
    sid = group_record(SELF_ID, group).id
    await run(app, group_msg("／摘要", group, user=20003), None)  # a member: not handled, not stored
    assert await history(sid) == []
    await run(app, group_msg("／压缩包怎么解压", group, user=20003), None)
    assert [m.content for m in await history(sid)] == ["[用户20003(20003)] ／压缩包怎么解压"]


def test_fetched_history_skips_a_full_width_command_too() -> None:
    # What the backfill stores goes through recovery.is_command with the same starts.
    starts = command_starts(["/"])
    assert is_command(group_msg("／压缩", 1), starts, COMMAND_NAMES)
    assert not is_command(group_msg("／压缩包怎么解压", 1), starts, COMMAND_NAMES)
    assert command_starts(["/", "／"]) == ("/", "／")
    assert command_starts([""]) == ("",)


# ---- .env values as owners write them ------------------------------------------------
def read_env(tmp_path: Path, line: str) -> Config:
    """One `.env` line read as NoneBot reads it (python-dotenv, then each value of a key it
    does not know decoded as JSON when it can be), then validated as the plugin does."""
    env = tmp_path / ".env"
    env.write_text(f"{line}\n", "utf-8")
    return parse_config(NoneBotConfig(_env_file=str(env)).model_dump())


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        # The README asks for at least 16 characters; `secrets.token_hex` or a typed run of
        # digits is a number to NoneBot's JSON decoding.
        ("MEMSUM_WEB_TOKEN=12345678901234567890", "memsum_web_token", "12345678901234567890"),
        ("MEMSUM_ERROR_REPLY=404", "memsum_error_reply", "404"),
        ("MEMSUM_PERSONA=42", "memsum_persona", "42"),
    ],
)
def test_a_text_key_written_as_digits_is_that_text(tmp_path: Path, line: str, key: str, value: str) -> None:
    got = getattr(read_env(tmp_path, line), key)
    assert (got.get_secret_value() if isinstance(got, SecretStr) else got) == value


@pytest.mark.parametrize(
    "line",
    [
        # `true` for a cap read as 1 token a day, `false` for the line as 0 (compression off).
        "MEMSUM_DAILY_TOKEN_CAP=true",
        "MEMSUM_COMPRESS_AT=false",
        "MEMSUM_HISTORY_LIMIT=true",
        "MEMSUM_USER_COOLDOWN=true",
        'MEMSUM_TIERS={"onebot.group": {"daily_token_cap": true}}',
    ],
)
def test_yes_or_no_for_a_number_stops_start_up_naming_the_key(tmp_path: Path, line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        read_env(tmp_path, line)
    key = line.split("=", 1)[0]
    assert str(refused.value).startswith(f"invalid {key}")
    assert "a number" in str(refused.value)


@pytest.mark.parametrize(
    "driver",
    [
        "fastapi",  # the `~` forgotten
        "~fastapi+websockets",
        "~fastapi ~websockets",  # a space for the `+`
        "~fastapi+~aiohttp",  # a client driver that is not installed
        "",
    ],
)
async def test_a_wrong_driver_stops_bot_py_with_one_line_naming_driver(tmp_path: Path, driver: str) -> None:
    # README 其他连接方式 has owners edit DRIVER; NoneBot's resolver raised a traceback ending
    # in "module 'fastapi' has no attribute 'Driver'" or "Empty module name".
    bot = BotProcess(tmp_path, env={"DRIVER": driver}, log_level="INFO")
    with pytest.raises(BotExitedError) as exited:
        await bot.start()
    log = exited.value.log
    assert exited.value.returncode == 2, log
    assert "Traceback" not in log, log
    said = [line for line in log.splitlines() if "CRITICAL" in line]
    assert len(said) == 1, log
    assert "bot.py: invalid DRIVER in .env" in said[0]
    assert "DRIVER=~fastapi" in said[0]  # the form to write


# ---- the quick start -----------------------------------------------------------------
async def test_bot_py_says_where_to_point_the_reverse_websocket(tmp_path: Path) -> None:
    # README 快速开始: "then point the reverse WebSocket at ws://127.0.0.1:8080/onebot/v11/ws".
    # uvicorn's line names only http://127.0.0.1:8080, which NapCat does not connect to.
    async with BotProcess(tmp_path, log_level="INFO") as bot:
        log = bot.log()
    said = [line for line in log.splitlines() if "/onebot/v11/ws" in line]
    assert len(said) == 1, log
    assert f"ws://127.0.0.1:{bot.port}/onebot/v11/ws" in said[0]
    assert "ONEBOT_ACCESS_TOKEN" in said[0]
    assert "test-token" not in log
