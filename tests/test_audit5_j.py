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

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from dotenv import dotenv_values
from nonebot.adapters.onebot.v11 import Bot
from nonebug import App
from pydantic import SecretStr

from nonebot_plugin_memsum import __plugin_meta__, commands, runtime
from nonebot_plugin_memsum.commands import COMMANDS
from nonebot_plugin_memsum.config import DEFAULT_PERSONA, Config, ConfigError, parse_config
from nonebot_plugin_memsum.llm.tokens import _build as tiktoken_encoding
from nonebot_plugin_memsum.llm.tokens import encoding_name, estimate_text_tokens, load_encoding
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.onebot.send import send_reply
from nonebot_plugin_memsum.permission import SUPERUSER, SUPERUSER_OR_GROUP_ADMIN
from nonebot_plugin_memsum.settings import place_scope
from nonebot_plugin_memsum.types import Message
from tests.fakes.agent import GROUP, GROUP_ENTRY, MakeRuntime, Replies
from tests.fakes.botproc import REPO, BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, query, until, wait_log
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.logs import captured
from tests.fakes.nonebug import SELF_ID as SELF_ID_STR
from tests.fakes.nonebug import Like, Satisfies, forwarded_text, group_msg, new_group, private_msg, run
from tests.fakes.onebot import OneBotSim, at, text


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
    for where, words in lists.items():
        assert re.findall(r"/[^\s/(（）),，。]+", words) == expected, where
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
    assert start.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && ")
    assert start.endswith(" && .venv/bin/python bot.py")


def test_the_quick_start_runs_again_once_env_exists_whatever_cp_does(tmp_path: Path) -> None:
    # README: the first run copies .env.example to .env; fill it in, then 再运行同一条命令.
    # Before: the copy was `cp -n .env.example .env`, and GNU cp 9.2 to 9.4 (Ubuntu 24.04)
    # exits 1 when -n skips an existing file (coreutils NEWS 9.2; reverted in 9.5, which warns
    # instead), so the second run stopped there and never started the bot.
    quick = _readme().split("## 快速开始", 1)[1].split("```", 2)[1]
    start = next(line for line in quick.splitlines() if "bot.py" in line)
    copy = start.split(" && ", 2)[2].rsplit(" && ", 1)[0]  # between the install and bot.py
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "cp").write_text(
        "#!/bin/sh\n# GNU cp 9.2-9.4: -n and an existing destination exit 1\n"
        'if [ "$1" = "-n" ]; then [ -e "$3" ] && exit 1; shift; fi\nexec /bin/cp "$@"\n'
    )
    (shim / "cp").chmod(0o755)
    work = tmp_path / "clone"
    work.mkdir()
    (work / ".env.example").write_text('SUPERUSERS=["10001"]\n')
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    first = subprocess.run(["sh", "-c", copy], cwd=work, env=env, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    (work / ".env").write_text('SUPERUSERS=["424242"]\n')  # the owner fills it in
    again = subprocess.run(["sh", "-c", copy], cwd=work, env=env, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    assert (work / ".env").read_text() == 'SUPERUSERS=["424242"]\n'


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


# ---- Each key takes effect with a valid non-default value ----------------------------------------
class _Bot:
    """What `send_reply` uses of a OneBot bot: the calls it made."""

    self_id = "10000"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call_api(self, api: str, **data: Any) -> Any:
        self.calls.append(api)
        return {}

    async def send(self, event: Any, message: Any) -> Any:
        self.calls.append("send")
        return {"message_id": 1}


@pytest.mark.parametrize(
    ("threshold", "length", "sent_as"),
    [
        (300, 301, "send_group_forward_msg"),  # the default
        (300, 300, "send"),
        (10, 11, "send_group_forward_msg"),
        (10, 10, "send"),
        (0, 5000, "send"),  # 0 = never
    ],
)
async def test_memsum_forward_threshold_decides_when_a_group_answer_is_merged_forward(
    app: App, monkeypatch: pytest.MonkeyPatch, threshold: int, length: int, sent_as: str
) -> None:
    rt = runtime.get()
    monkeypatch.setattr(rt, "config", rt.config.model_copy(update={"memsum_forward_threshold": threshold}))
    bot = _Bot()
    await send_reply(cast(Bot, bot), group_msg("在吗", new_group()), "好" * length, quote=True)
    assert bot.calls[0] == sent_as
    private = _Bot()
    await send_reply(cast(Bot, private), private_msg("在吗"), "好" * length)
    assert private.calls[0] == "send"  # a private chat never gets a merged-forward message


async def test_memsum_tokenizer_cl100k_base_makes_every_estimate_a_cl100k_count(make_rt: MakeRuntime) -> None:
    text = "周末去香山爬山吗？提取码 8x2k，链接在群文件里。"
    assert encoding_name() == "o200k_base"
    o200k = estimate_text_tokens(text)
    try:
        await make_rt(memsum_tokenizer="cl100k_base")
        assert encoding_name() == "cl100k_base"
        cl100k = estimate_text_tokens(text)
        assert cl100k == len(tiktoken_encoding("cl100k_base").encode(text))
        assert cl100k != o200k
    finally:
        load_encoding("o200k_base")  # process-wide: give the other tests their default back
    assert estimate_text_tokens(text) == o200k


async def test_memsum_daily_token_cap_and_default_mode_are_the_global_layer(make_rt: MakeRuntime) -> None:
    rt = await make_rt(memsum_daily_token_cap=5000, memsum_default_mode="record")
    cap = await rt.settings.of_place("daily_token_cap", GROUP)
    assert (cap.value, cap.layer_label) == (5000, "全局配置")
    assert await rt.controls.mode(GROUP) == "record"
    # a place's own /限额 wins over it
    await rt.settings.set("daily_token_cap", "place", place_scope(GROUP)[1], 100)
    assert (await rt.settings.of_place("daily_token_cap", GROUP)).value == 100


def _load_in_another_project(
    tmp_path: Path, *, on_path: bool, **init: Any
) -> subprocess.CompletedProcess[str]:
    """NoneBot loading the plugin in another project's folder (not this clone's), as
    `nb run` there does; `on_path`: the clone's folder is on sys.path, as a non-editable
    install or an editable one in setuptools' compat mode make it (PYTHONPATH stands in)."""
    settings = {"memsum_db_path": str(tmp_path / "m.db"), "localstore_data_dir": str(tmp_path), **init}
    script = f"""
import nonebot
from nonebot.adapters.onebot.v11 import Adapter
nonebot.init(**{settings!r})
nonebot.get_driver().register_adapter(Adapter)
plugin = nonebot.load_plugin("nonebot_plugin_memsum")
print(plugin and sorted({{m.priority for m in plugin.matcher}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMSUM_", "PYTHONPATH"))}
    if on_path:
        env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )


def test_memsum_command_and_chat_priority_are_the_matchers_priorities(tmp_path: Path) -> None:
    # The matchers are declared when the plugin loads: a fresh interpreter with the two keys set.
    done = _load_in_another_project(
        tmp_path, on_path=True, memsum_command_priority=3, memsum_chat_priority=70
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[3, 70]"
    default = _load_in_another_project(tmp_path, on_path=True)
    assert default.stdout.strip().splitlines()[-1] == "[5, 50]"


def test_the_readmes_install_from_a_clone_gives_a_plugin_nonebot_can_load(tmp_path: Path) -> None:
    # The README told owners of an existing NoneBot project `pip install -e /path/to/clone`.
    # setuptools' default editable install imports the package through a finder of its own,
    # never through sys.path; NoneBot's PluginFinder (nonebot/plugin/manager.py) asks only
    # PathFinder, so the plugin imported as a plain module: "Module nonebot_plugin_memsum is
    # not loaded as a plugin!", logged, and the bot ran on without memory or commands. This
    # test's own venv is such an install (.ci/run's `pip install -e`): the failure is real.
    plain_editable = _load_in_another_project(tmp_path, on_path=False)
    assert "is not loaded as a plugin" in plain_editable.stdout + plain_editable.stderr
    assert plain_editable.stdout.strip().splitlines()[-1] == "None"
    readme = _readme()
    from_clone = next(line for line in readme.splitlines() if "/path/to/nonebot-plugin-memsum" in line)
    assert "pip install /path/to/nonebot-plugin-memsum" in from_clone
    assert "--config-settings editable_mode=compat" in from_clone
    assert "pip install -e" in readme.split("## 在 QQ 里使用")[0].split("## 装进已有的 NoneBot 项目")[1]


# ---- A wrong value stops start-up naming the key ---------------------------------------------
@pytest.mark.parametrize(
    ("raw", "key", "allowed"),
    [
        ({"memsum_capacity": "exact"}, "MEMSUM_CAPACITY", "'measured' or 'spec'"),
        ({"memsum_group_admin_commands": "maybe"}, "MEMSUM_GROUP_ADMIN_COMMANDS", "valid boolean"),
        ({"memsum_forward_threshold": -1}, "MEMSUM_FORWARD_THRESHOLD", "greater than or equal to 0"),
        ({"memsum_backfill_hours": 200}, "MEMSUM_BACKFILL_HOURS", "less than or equal to 168"),
        ({"memsum_backfill_count": -1}, "MEMSUM_BACKFILL_COUNT", "greater than or equal to 0"),
        ({"memsum_compress_concurrency": 0}, "MEMSUM_COMPRESS_CONCURRENCY", "greater than or equal to 1"),
        ({"memsum_compress_concurrency": 65}, "MEMSUM_COMPRESS_CONCURRENCY", "less than or equal to 64"),
        ({"memsum_command_priority": -1}, "MEMSUM_COMMAND_PRIORITY", "greater than or equal to 0"),
        ({"memsum_chat_priority": "high"}, "MEMSUM_CHAT_PRIORITY", "valid integer"),
        ({"memsum_web_token": "short"}, "MEMSUM_WEB_TOKEN", "at least 16 characters"),
        ({"memsum_resume_window": -5}, "MEMSUM_RESUME_WINDOW", "greater than or equal to 0"),
        ({"memsum_compress_at": ""}, "MEMSUM_COMPRESS_AT", "valid number"),  # `MEMSUM_COMPRESS_AT=`
        ({"memsum_models": ""}, "MEMSUM_MODELS", "not valid JSON"),  # `MEMSUM_MODELS=`
    ],
)
def test_a_wrong_value_of_a_key_no_other_test_breaks_is_refused_naming_it(
    raw: dict[str, Any], key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    message = str(info.value)
    assert message.startswith(f"invalid {key}: ")
    assert allowed in message
    assert "\n" not in message
    assert "short" not in message  # a token's value is never shown


# ---- Every script under bench/ starts ------------------------------------------------------------
BENCHES = sorted(p.name for p in (REPO / "bench").glob("*.py") if "argparse" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("script", BENCHES)
def test_every_benchmark_script_starts_and_explains_its_options(script: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSUM_")}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"usage: {script}" in done.stdout
    assert list(tmp_path.iterdir()) == []  # --help writes nothing


# ---- Crash and restart keys with non-default values, through bot.py and the simulator -----------
PERSONA = "你是审计五 j 群里的助手小记。"


def _answers_to(sim: OneBotSim, message_id: int) -> list[Any]:
    """Sends quoting `message_id` (a group answer quotes its question)."""
    return [
        c
        for c in sim.calls
        if c.action in {"send_msg", "send_group_msg"}
        and any(
            isinstance(seg, dict) and seg.get("type") == "reply" and str(seg["data"]["id"]) == str(message_id)
            for seg in c.params.get("message") or []
        )
    ]


def _age(db: Path, sid: str, seconds: float) -> None:
    """Make everything a session stored `seconds` older (the bot is not running)."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE messages SET ts = ts - ? WHERE session_id = ?", (seconds, sid))
        conn.execute(
            "UPDATE message_counts SET newest_ts = newest_ts - ? WHERE session_id = ?", (seconds, sid)
        )


async def test_backfill_hours_backfill_count_and_resume_window_take_effect_on_reconnect(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    llm.reset()
    llm.on_request(lambda b: Reply("好的") if b["messages"][0]["content"] == PERSONA else None)
    env = {
        "MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]),
        "MEMSUM_PERSONA": PERSONA,
        "MEMSUM_BACKFILL_HOURS": "1",  # default 24
        "MEMSUM_BACKFILL_COUNT": "3",  # default 50
        "MEMSUM_RESUME_WINDOW": "60",  # default 300
    }
    busy, stale, quiet = 7301, 7302, 7303
    async with BotProcess(tmp_path / "bot", env=env, log_level="INFO") as bot:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await sim.connect()
        await wait_log(bot, f"Bot {SELF_ID} connected")
        for group in (busy, stale, quiet):
            await sim.group_message(group, 20001, f"你好 {group}", nickname="甲")
        stored = "SELECT count(*) FROM messages"
        await until(lambda: _rows(bot, stored, 3), "the three groups' first messages")
        await bot.kill()
        await asyncio.wait_for(sim.disconnected.wait(), 15)
        for group in (busy, stale, quiet):
            _age(bot.db_path, group_sid(group), 1000)  # all three within the last hour…
        _age(bot.db_path, group_sid(stale), 7200)  # …but this one: its last message 2 h ago
        # Said while the bot was down (the simulator keeps it, as QQ does).
        for word in ("零", "一", "二"):
            await sim.group_message(busy, 20002, word, nickname="乙")
        question = await sim.group_message(busy, 20003, [at(SELF_ID), text(" 新问题")], nickname="丙")
        await sim.group_message(stale, 20002, "有人吗", nickname="乙")
        old = await sim.group_message(quiet, 20003, [at(SELF_ID), text(" 旧问题")], nickname="丙")
        sim.messages[old].time -= 200  # asked 200 s ago: older than the 60 s window
        await bot.start()
        await sim.connect()
        await wait_log(bot, "memsum: backfill of 10000:")
        await until(
            lambda: _true(bool(_answers_to(sim, question))), "the answer to the question within the window"
        )
        await asyncio.sleep(1)
        fetched = {c.params["group_id"]: c.params for c in sim.calls if c.action == "get_group_msg_history"}
        assert sorted(fetched) == [busy, quiet]  # not the group quiet for 2 h (> MEMSUM_BACKFILL_HOURS)
        assert {p["count"] for p in fetched.values()} == {3}
        rows = await query(
            bot.db_path, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", group_sid(busy)
        )
        said = [r[0] for r in rows if r[0].startswith("[")]
        # the newest 3 said while away (MEMSUM_BACKFILL_COUNT), not 零
        assert said == [
            f"[甲(20001)] 你好 {busy}",
            "[乙(20002)] 一",
            "[乙(20002)] 二",
            "[丙(20003)] @小记(10000) 新问题",
        ]
        rows = await query(
            bot.db_path, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", group_sid(quiet)
        )
        assert [r[0] for r in rows] == [f"[甲(20001)] 你好 {quiet}", "[丙(20003)] @小记(10000) 旧问题"]
        assert _answers_to(sim, old) == []  # stored, but older than MEMSUM_RESUME_WINDOW: not answered
        assert len(_answers_to(sim, question)) == 1
        await sim.close()
    llm.reset()


async def _rows(bot: BotProcess, sql: str, n: int) -> bool:
    return bot.db_path.exists() and (await query(bot.db_path, sql))[0][0] >= n


async def _true(value: bool) -> bool:
    return value


# ---- Commands as the README describes them ------------------------------------------------------
async def test_recall_results_that_are_long_go_out_as_a_merged_forward_message_in_groups(app: App) -> None:
    # README: /回忆 … 结果长时以合并转发发出.
    group = new_group()
    record = group_record(SELF_ID_STR, group)
    for i in range(8):
        said = f"[用户{20001 + i}({20001 + i})] 第 {i} 个网盘链接的提取码是 k{i}x9，" + "说明" * 20
        await runtime.get().agent.record(record, Message(role="user", content=said, ts=1.0 + i))

    def forwarded(nodes: Any) -> bool:
        content = forwarded_text(nodes)
        return content.startswith("找到 8 条（按相关程度排列）：\n") and all(
            f"k{i}x9" in content for i in range(8)
        )

    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID_STR)
        ctx.receive_event(bot, group_msg("/回忆 提取码", group))
        ctx.should_call_api(
            "send_group_forward_msg", {"group_id": group, "messages": Satisfies(forwarded)}, result={}
        )


async def test_a_second_sigterm_stops_at_once_without_waiting_for_the_turn(
    tmp_path: Path, llm: ScriptedLLM
) -> None:
    # README 崩溃、重启与内存: SIGTERM waits up to 10 s for the turns in flight; 再按一次或 Ctrl-C 立即停止.
    llm.reset()
    env = {"MEMSUM_MODELS": json.dumps([llm.model_config("test/model")]), "MEMSUM_PERSONA": PERSONA}
    bot = BotProcess(tmp_path / "bot", env=env, log_level="INFO")
    await bot.start()
    try:
        sim = OneBotSim(bot.ws_url, self_id=SELF_ID, access_token=bot.access_token)
        await sim.connect()
        await wait_log(bot, f"Bot {SELF_ID} connected")
        assert "memsum: web page off (MEMSUM_WEB_TOKEN is empty)" in bot.log()  # README 管理网页
        with llm.gate(Reply("不会发出"), holds=lambda b: b["messages"][0]["content"] == PERSONA) as gate:
            await sim.group_message(7401, 20001, [at(SELF_ID), text(" 在吗")], nickname="甲")
            await gate.reached()
            assert bot._proc is not None
            bot._proc.send_signal(signal.SIGTERM)
            await wait_log(bot, "memsum: SIGTERM: letting the turns in flight finish")
            started = asyncio.get_running_loop().time()
            bot._proc.send_signal(signal.SIGTERM)
            await bot.wait_exit(8)  # well before the 10 s grace
            assert asyncio.get_running_loop().time() - started < 8
            gate.open()
        assert not [c for c in sim.calls if c.action in {"send_msg", "send_group_msg"}]
        await sim.close()
    finally:
        await bot.stop()
        llm.reset()


# ---- MEMSUM_ERROR_REPLY written empty ------------------------------------------------------------
@pytest.mark.parametrize("written", ["", "   "])
async def test_an_empty_error_reply_says_nothing_in_chat_and_still_settles_the_question(
    make_rt: MakeRuntime, llm: ScriptedLLM, written: str
) -> None:
    # Before: `MEMSUM_ERROR_REPLY=` sent an empty message on every failed turn (a bare quote in
    # a group), which OneBot implementations refuse, so each failure also logged a send error.
    # .env.example's empty values mean "off" (MEMSUM_WEB_TOKEN=) or "the default" elsewhere;
    # an owner who empties the apology wants silence.
    rt = await make_rt(memsum_error_reply=written)
    await rt.agent.record(
        GROUP, Message(role="user", content="[甲(20001)] 在吗", name="20001", addressed=True)
    )
    llm.push(Reply(status=400))
    replies = Replies()
    with captured("DEBUG") as lines:
        assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "error"
    assert replies.texts == []
    assert not [line for line in lines if "could not send" in line]
    assert await rt.store.pending_questions(0) == []  # settled as if apologised: never resumed


async def test_a_set_error_reply_is_still_said(make_rt: MakeRuntime, llm: ScriptedLLM) -> None:
    rt = await make_rt(memsum_error_reply="稍等，我这边有点问题。")
    llm.push(Reply(status=400))
    replies = Replies()
    await rt.agent.record(
        GROUP, Message(role="user", content="[甲(20001)] 在吗", name="20001", addressed=True)
    )
    assert await rt.agent.run_turn(GROUP.id, replies, GROUP_ENTRY) == "error"
    assert replies.texts == ["稍等，我这边有点问题。"]


def test_the_readme_configuration_table_gives_each_keys_real_default() -> None:
    section = _readme().split("## 配置（`.env`）", 1)[1].split("某个值不合法时", 1)[0]
    defaults = parse_config({})
    words = {"无": None, "内置": DEFAULT_PERSONA, "系统时区": None, "localstore 数据文件": None}
    seen = []
    for keys, shown in re.findall(r"(?m)^\| (`MEMSUM_[^|]+) \| ([^|]+) \|", section):
        names = re.findall(r"`(MEMSUM_\w+)`", keys)
        values = re.findall(r"`([^`]+)`", shown) or [shown.strip()] * len(names)
        for name, value in zip(names, values, strict=True):
            actual = getattr(defaults, name.lower())
            if isinstance(actual, SecretStr):
                assert value.startswith("空"), name
                assert actual.get_secret_value() == "", name
            elif value in words:
                assert actual == words[value], name
            elif isinstance(actual, str):
                assert actual == value, name
            elif isinstance(actual, frozenset):  # a JSON list read as a set (MEMSUM_IGNORED_USERS)
                assert frozenset(json.loads(value)) == actual, name
            else:
                assert json.loads(value) == actual, name
            seen.append(name)
    # CONTRIBUTING: every key is in the README's configuration table (it listed only "the common ones")
    assert sorted(seen) == sorted(name.upper() for name in Config.model_fields)


@pytest.mark.parametrize(
    ("typed", "period"),
    [("/用量", "今天"), ("/用量 今天", "今天"), ("/用量 30天", "30天"), ("/用量 ３０天", "30天")],
)
async def test_every_period_of_the_usage_command_is_read(app: App, typed: str, period: str) -> None:
    # README / usage text: /用量 [今天|7天|30天|全部], 今天 by default (7天 and 全部 are tested elsewhere).
    group = new_group()
    await run(
        app,
        group_msg(typed, group),
        Like(rf"本群用量（{period}）：回答 0 次，压缩 0 次\n这段时间没有调用模型。\n.*"),
    )
