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

import json
import re
from pathlib import Path

from dotenv import dotenv_values

from nonebot_plugin_memsum import __plugin_meta__, commands
from nonebot_plugin_memsum.commands import COMMANDS
from nonebot_plugin_memsum.config import Config, parse_config
from nonebot_plugin_memsum.permission import SUPERUSER, SUPERUSER_OR_GROUP_ADMIN
from tests.fakes.botproc import REPO, BotProcess


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


# ---- The docs name what exists -------------------------------------------------------------------
def _readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def _usage_forms() -> dict[str, str]:
    """The plugin's usage text (PluginMetadata.usage): each command's form, by name."""
    forms = {}
    for line in __plugin_meta__.usage.splitlines():
        if line.startswith("/"):
            form = line.split("  ")[0]
            forms[form.split()[0][1:]] = form
    return forms


def test_the_readme_command_table_is_the_plugins_usage_text_with_the_same_permissions() -> None:
    rows = re.findall(r"(?m)^\| `(/[^`]+)` \| ([^|]+) \|", _readme())
    forms = _usage_forms()
    assert [form.replace("\\|", "|") for form, _ in rows] == list(forms.values())
    by_name = {c.name: c for c in COMMANDS if c.name}
    for form, who in rows:
        command = by_name[form.split()[0][1:]]
        expected = "主人" if command.permission is SUPERUSER else "主人、群管"
        assert who.strip() == expected, form


def _docstring_of(field: str) -> str:
    source = (REPO / "nonebot_plugin_memsum" / "config.py").read_text(encoding="utf-8")
    return source.split(f"\n    {field}:", 1)[1].split('"""')[1]


def _group_admin_commands() -> list[str]:
    return [f"/{c.name}" for c in COMMANDS if c.name and c.permission is SUPERUSER_OR_GROUP_ADMIN]


def test_every_list_of_the_group_admins_commands_names_all_of_them() -> None:
    # Before: .env.example (and the key's docstring) left /回忆 out, and the README's map of the
    # code listed commands.py's commands without /回忆.
    expected = _group_admin_commands()
    assert "/回忆" in expected
    example = (REPO / ".env.example").read_text(encoding="utf-8")
    comment = example[: example.index("\nMEMSUM_GROUP_ADMIN_COMMANDS=")].rsplit("\n\n", 1)[-1]
    comment = comment[comment.index("# Let group owners") :]
    english = _readme().split("## English", 1)[1]
    lists = {
        ".env.example": comment.split("(/压缩线")[0],
        "the key's docstring": _docstring_of("memsum_group_admin_commands").split("(/压缩线")[0],
        "/记忆帮助": commands._HELP_NOTES[0],
        "README English": english.split("may use `", 1)[1].split("`", 1)[0],
    }
    for where, text in lists.items():
        assert re.findall(r"/[^\s/(（）),，。]+", text) == expected, where
    owner_only = [f"/{c.name}" for c in COMMANDS if c.name and c.permission is SUPERUSER]
    assert sorted(re.findall(r"/\S+", comment.split("(", 1)[1].split(" stay")[0])) == sorted(owner_only)


def test_the_readme_map_of_the_code_names_modules_that_exist() -> None:
    section = _readme().split("### How the code is laid out", 1)[1].split("\nTests live in", 1)[0]
    package = REPO / "nonebot_plugin_memsum"
    named = 0
    for cell in re.findall(r"(?m)^\| ((?:`[^`]+`(?:, )?)+) \|", section):
        paths = re.findall(r"`([^`]+)`", cell)
        folder = Path(paths[0]).parent
        for name in paths:
            assert (package / name).exists() or (package / folder / name).exists(), name
            named += 1
    assert named > 40
    row = next(line for line in section.splitlines() if line.startswith("| `commands.py`"))
    assert re.findall(r"`/([^`]+)`", row) == [c.name for c in COMMANDS if c.name]


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    quick = _readme().split("## 快速开始", 1)[1].split("```", 2)[1]
    test_command = next(line for line in quick.splitlines() if "pytest" in line)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ci_lines = [line for line in ci if line.startswith(("python3 -m venv", ".venv/bin/pytest"))]
    # .ci/run only adds pip's -q
    assert " && ".join(ci_lines).replace("pip install -q -e", "pip install -e") == test_command
    start = next(line for line in quick.splitlines() if "bot.py" in line)
    assert start.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && cp -n .env.example .env")


def test_every_key_is_in_the_shipped_env_example_under_a_comment_and_its_values_load() -> None:
    lines = (REPO / ".env.example").read_text(encoding="utf-8").splitlines()
    keyed = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^#? ?(MEMSUM_\w+)=", line))}
    fields = [name.upper() for name in Config.model_fields]
    assert sorted(keyed) == sorted(fields)
    for key, i in keyed.items():
        j = i - 1
        while re.match(r"^#? ?MEMSUM_\w+=", lines[j]):  # a group of keys under one comment
            j -= 1
        assert lines[j].startswith("# "), key
        assert not lines[j].startswith("# ----"), key
    values = dotenv_values(REPO / ".env.example")
    raw = {k.lower(): json.loads(v) if v and v[0] in "[{" else v for k, v in values.items() if k in fields}
    config = parse_config(raw)
    assert config.memsum_tiers["onebot.group"].compress_at == 0.5
    assert config.memsum_models[0].id == "deepseek/deepseek-chat"
