"""Twelfth outside audit (web): the owner's web page (issue 12) under real use, driven by a
seeded random walk.

bot.py runs as a real process with the OneBot simulator over the real reverse WebSocket and
the scripted model on real HTTP (a small window, a small count line). Members talk (with
HTML, emoji and long names in their cards and in the group names), ask the bot, and the
owner types commands in chat, interleaved with everything the page's JavaScript
(web/static/app.js) can do, sent exactly as it sends it: the overview, each session's page,
a setting changed (valid or not, on this session or the group), compress now, clear the
summary or the context, search. After every step:

- what the page's API says equals the bot's SQLite file (read directly, read-only) and what
  /摘要, /用量 and the setting commands say in chat;
- a change made on the page is what the very next turn's request to the model carries (the
  persona, the mode, the lines), and a change made in chat is what the page shows;
- a change without the right credentials (no cookie, a wrong or signed-out cookie, no or a
  wrong CSRF header, another site's Origin, a GET) is refused and changes nothing;
- a bad value gets a Chinese reason and changes nothing.

Separately: the page in Chromium shows every `<script>` / `"><img onerror>` from cards, group
names, messages, summaries and personas as text, and a group with thousands of messages is
paged, not sent whole.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, connected, group_sid, query, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, as_segments, at, plain_text, text

pytestmark = pytest.mark.e2e

SUPERUSER = 10001
WEB_TOKEN = "web-token-audit12-web-0123456789"
WINDOW = 3000
HISTORY_LIMIT = 14
XSS = ["<script>window.__pwned=1</script>", '"><img src=x onerror="window.__pwned=2">']
"""What would run if the page ever put chat text into the document as HTML."""
CARDS = [
    "阿洁😀",
    XSS[0] + "小林",
    XSS[1],
    "很长很长的群名片" * 6,
    "Ｚｅｒｏ🏔️\u200b",
]
GROUP_NAMES = [
    XSS[0] + "爬山群🏔️",
    XSS[1] + "读书会📚" + "长" * 40,
]
LINES = [
    "周末去爬山吗，带上水和干粮😀",
    "提取码是 k3m9，链接在群文件",
    "我觉得<b>这个</b>方案不错",
    XSS[0],
    XSS[1] + " 哈哈",
    "明天 8 点集合，别迟到 🚌",
    "English words mixed 中文 and 数字 12345",
]
PERSONAS = ["你是爬山群的助手小记，说话简短。", "你是读书会的助手<script>x</script>，爱用表情😀。"]
BAD_VALUES: dict[str, list[str]] = {
    "compress_at": ["1.5", "-0.1", "abc", "", "nan", "inf"],
    "history_limit": ["2.5", "-1", "100001", "十", ""],
    "daily_token_cap": ["-5", "1e13", "1.5", "很多"],
    "mode": ["maybe", ""],
    "persona": ["", "   ", "长" * 1001],
}


SEEDS = [1, 2, 3, 4]
STEPS_PER_SEED = 60


def groups_of(seed: int) -> list[int]:
    return [73000 + seed * 10 + i for i in range(2)]


def is_summary_request(body: dict[str, Any]) -> bool:
    """The summariser's request carries no tools; the chat's carries recall (and todo_write)."""
    return "tools" not in body


def summary_reply(body: dict[str, Any]) -> Reply | None:
    if not is_summary_request(body):
        return None
    prompt = str(body["messages"][-1]["content"])
    keep = "1" if "#1〔" in prompt else "无"
    return Reply(
        f"【保留原文】{keep}\n## 最近在聊什么\n大家在聊爬山 {XSS[1]} 😀\n## 谁有问题没回应\n无\n"
        "## 关键原话要点\n提取码 k3m9"
    )


@dataclass
class Bot:
    proc: BotProcess
    sim: OneBotSim
    llm: ScriptedLLM

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.proc.port}/memsum/"


@pytest.fixture(scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    with ScriptedLLM() as llm:
        llm.on_request(summary_reply)
        settings = {
            "MEMSUM_MODELS": json.dumps(
                [llm.model_config(context_window=WINDOW, price_in=2, price_out=8, currency="元")]
            ),
            "MEMSUM_WEB_TOKEN": WEB_TOKEN,
            "MEMSUM_HISTORY_LIMIT": str(HISTORY_LIMIT),
            "MEMSUM_TIMEZONE": "Asia/Shanghai",
            "MEMSUM_BACKFILL_HOURS": "0",
        }
        async with running_bot(tmp_path_factory.mktemp("audit12web"), settings) as (proc, sim):
            for seed in SEEDS:  # names known before the page first reads them (it re-reads every 5 min)
                for i, g in enumerate(groups_of(seed)):
                    sim.add_group(g, GROUP_NAMES[(i + seed) % len(GROUP_NAMES)])
            names(sim)
            yield Bot(proc, sim, llm)


def names(sim: OneBotSim) -> None:
    """`get_group_list` and `get_friend_list`, which the page reads names from (web/__init__.py).
    Shapes from the OneBot v11 spec (botuniverse/onebot-11 api/public.md: get_group_list →
    [{group_id, group_name, member_count, max_member_count}], get_friend_list → [{user_id,
    nickname, remark}]) as NapCat answers them (NapCat.Onebot src/onebot/action/group/
    GetGroupList.ts, action/user/GetFriendList.ts via OB11Construct.group / .friends)."""
    sim.responders["get_group_list"] = lambda _: [
        {"group_id": g, "group_name": n, "member_count": 3, "max_member_count": 200}
        for g, n in sim.group_names.items()
    ]
    sim.responders["get_friend_list"] = lambda _: [
        {"user_id": 20099, "nickname": XSS[1] + "好友", "remark": ""}
    ]


# ---- the page, as app.js calls it ---------------------------------------------------------
class PageClient:
    """The page's requests as app.js makes them in Chromium: `fetch("api/" + path)` with the
    session cookie, POSTs as JSON with `X-Memsum-CSRF`, and the headers a same-origin fetch
    carries (Origin, Sec-Fetch-Site)."""

    def __init__(self, base: str) -> None:
        self.origin = base.split("/memsum/")[0]
        self.http = httpx.AsyncClient(base_url=base, timeout=20)
        self.csrf = ""

    async def login(self) -> None:
        resp = await self.post("login", {"token": WEB_TOKEN})
        assert resp.status_code == 200, resp.text
        self.csrf = resp.json()["csrf"]

    async def get(self, path: str) -> httpx.Response:
        return await self.http.get("api/" + path, headers={"Sec-Fetch-Site": "same-origin"})

    async def post(self, path: str, body: Any) -> httpx.Response:
        return await self.http.post(
            "api/" + path,
            content=json.dumps(body),
            headers={
                "Content-Type": "application/json",
                "X-Memsum-CSRF": self.csrf,
                "Origin": self.origin,
                "Sec-Fetch-Site": "same-origin",
            },
        )

    async def ok(self, path: str) -> dict[str, Any]:
        resp = await self.get(path)
        assert resp.status_code == 200, f"{path}: {resp.status_code} {resp.text}"
        return resp.json()

    async def session(self, sid: str) -> dict[str, Any]:
        return await self.ok("sessions/" + quote(sid, safe=""))

    async def setting(self, sid: str, name: str, scope: str, value: str | None) -> httpx.Response:
        return await self.post(
            f"sessions/{quote(sid, safe='')}/settings", {"name": name, "scope": scope, "value": value}
        )

    async def aclose(self) -> None:
        await self.http.aclose()


# ---- the store, read directly ---------------------------------------------------------------
async def db_counts(bot: Bot, sid: str) -> tuple[int, int]:
    rows = await query(
        bot.proc.db_path,
        "SELECT coalesce(sum(archived = 0 AND event_marker = 0 AND role != 'system'), 0),"
        " coalesce(sum(archived), 0) FROM messages WHERE session_id = ?",
        sid,
    )
    return int(rows[0][0]), int(rows[0][1])


async def db_settings(bot: Bot, scope: str, key: str) -> dict[str, Any]:
    rows = await query(
        bot.proc.db_path, "SELECT name, value FROM settings WHERE scope = ? AND scope_key = ?", scope, key
    )
    return {str(n): json.loads(v) for n, v in rows}


async def db_meta(bot: Bot, namespace: str, key: str) -> Any:
    rows = await query(
        bot.proc.db_path, "SELECT value FROM metadata WHERE namespace = ? AND key = ?", namespace, key
    )
    return json.loads(rows[0][0]) if rows else None


async def db_compressions(bot: Bot, sid: str) -> list[tuple[Any, ...]]:
    return await query(
        bot.proc.db_path,
        "SELECT ts, outcome, kept, archived FROM compressions WHERE session_id = ? ORDER BY id DESC",
        sid,
    )


async def snapshot(bot: Bot) -> tuple[Any, ...]:
    """Everything a page action could change."""
    db = bot.proc.db_path
    return (
        await query(db, "SELECT * FROM settings ORDER BY scope, scope_key, name"),
        await query(db, "SELECT session_id, count(*), sum(archived) FROM messages GROUP BY session_id"),
        await query(db, "SELECT count(*) FROM compressions"),
        await query(db, "SELECT key, value FROM metadata WHERE namespace = 'summary' ORDER BY key"),
    )


# ---- chat ------------------------------------------------------------------------------------
def sent(call: Any) -> str:
    return plain_text(as_segments(call.params.get("messages") or call.params.get("message") or []))


async def command(bot: Bot, place: tuple[str, int], said: str, starts: str | tuple[str, ...]) -> str:
    """The owner types `said` in the place; the bot's reply that starts with `starts`."""
    mark = len(bot.sim.calls)
    kind, number = place
    if kind == "group":
        await bot.sim.group_message(number, SUPERUSER, said, nickname="群主")
    else:
        await bot.sim.private_message(SUPERUSER, said)
    call = await bot.sim.wait_call(
        set(SEND_ACTIONS | FORWARD_ACTIONS),
        after=mark,
        timeout=30,
        predicate=lambda c: sent(c).startswith(starts),
    )
    return sent(call)


@dataclass
class Walk:
    """One seeded run: the places, the owner's page, and what the driver expects."""

    seed: int
    rng: random.Random
    bot: Bot
    page: PageClient
    groups: list[int]
    said: dict[str, list[str]] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)

    def sid(self, group: int) -> str:
        return group_sid(group)


# ---- what the owner types into the page's fields ------------------------------------------------
async def fresh_group(bot: Bot, group: int, name: str) -> str:
    bot.sim.add_group(group, name)
    await bot.sim.group_message(group, 20000, "大家好", card=CARDS[0])
    sid = group_sid(group)

    async def stored() -> bool:
        return (await db_counts(bot, sid))[0] > 0

    await until(stored, "the group's first message stored")
    return sid


async def test_default_typed_into_a_setting_on_the_page_restores_it_as_in_chat(bot: Bot) -> None:
    """The page refused an empty persona with 「人设不能为空（恢复默认请用「默认」）」; an
    owner who then typed 默认 got the persona 「默认」: the bot's next answer went out under
    a system prompt of that one word. Typed into a number's field it was 「请填写数字」.
    Now 默认 on the page is what it is in every setting command: back to the layer below."""
    sid = await fresh_group(bot, 73901, "默认测试群")
    page = PageClient(bot.base)
    await page.login()
    try:
        place = "onebot:group:73901"
        assert (await page.setting(sid, "persona", "place", PERSONAS[0])).status_code == 200
        assert (await page.setting(sid, "compress_at", "session", "0.5")).status_code == 200
        empty = await page.setting(sid, "persona", "place", "")
        assert empty.status_code == 400
        assert "「默认」" in empty.json()["detail"]
        for name, scope in (("persona", "place"), ("compress_at", "session")):
            resp = await page.setting(sid, name, scope, " 默认 ")
            assert resp.status_code == 200, resp.text
            assert resp.json()["layer_label"] == "全局配置"
        assert await db_settings(bot, "place", place) == {}
        assert await db_settings(bot, "session", sid) == {}
        shown = {s["name"]: s for s in (await page.session(sid))["settings"]}
        assert shown["persona"]["value"] != "默认"
        assert shown["persona"]["layer"] == "global"
        requests = len(bot.llm.requests)
        mark = len(bot.sim.calls)
        await bot.sim.group_message(73901, 20001, [at(SELF_ID), text(" 在吗")], card=CARDS[1])
        await bot.sim.wait_call(set(SEND_ACTIONS), after=mark, timeout=30)
        chat = [r for r in bot.llm.requests[requests:] if not is_summary_request(r)]
        assert chat[0]["messages"][0]["content"] == shown["persona"]["value"]
    finally:
        await page.aclose()


async def test_a_value_typed_in_full_width_or_as_a_word_is_read_on_the_page_as_in_chat(bot: Bot) -> None:
    """A phone's Chinese keyboard in full-width mode types 「０．７」; chat's /压缩线 ０．７ takes
    it (commands.typed), the page said 「请填写数字」. /限额 无 turns the cap off, 无 on the page
    was 「请填写数字」 too. Now the page reads them as chat does; a word that is no number is
    still refused, in Chinese, and changes nothing."""
    sid = await fresh_group(bot, 73902, "全角测试群")
    page = PageClient(bot.base)
    await page.login()
    try:
        for name, typed, value in (
            ("compress_at", "０．７", 0.7),
            ("history_limit", "１２", 12),
            ("daily_token_cap", "５００００", 50000),
            ("daily_token_cap", " 无 ", 0),
        ):
            resp = await page.setting(sid, name, "session", typed)
            assert resp.status_code == 200, (typed, resp.text)
            assert resp.json()["value"] == value
            assert (await db_settings(bot, "session", sid))[name] == value
        said = await command(bot, ("group", 73902), "/压缩线", ("压缩线",))
        assert said.startswith("压缩线 0.7（本会话）"), said
        said = await command(bot, ("group", 73902), "/条数线", ("条数线",))
        assert said.startswith("条数线 12（本会话）"), said
        before = await snapshot(bot)
        for name, typed in (("compress_at", "七成"), ("history_limit", "无"), ("daily_token_cap", "很多")):
            resp = await page.setting(sid, name, "session", typed)
            assert resp.status_code == 400, resp.text
            assert resp.json()["detail"] == "请填写数字"
        assert await snapshot(bot) == before
    finally:
        await page.aclose()


# ---- names ------------------------------------------------------------------------------------------
async def test_the_page_opened_before_the_qq_client_connects_names_the_groups_once_it_has(
    tmp_path: Path,
) -> None:
    """The owner starts the bot and opens the page at once, before NapCat has connected (it
    reconnects every few seconds). The page's first read of group names found no bot and
    kept that empty answer for five minutes: every group showed as a bare number although
    the client was connected and answering get_group_list. Now a read that reached no bot
    is not kept: the next look asks again."""
    with ScriptedLLM() as llm:
        settings = {"MEMSUM_MODELS": json.dumps([llm.model_config()]), "MEMSUM_WEB_TOKEN": WEB_TOKEN}
        async with BotProcess(tmp_path, env=settings) as proc:
            page = PageClient(f"http://127.0.0.1:{proc.port}/memsum/")
            await page.login()
            try:
                assert (await page.ok("overview"))["sessions"] == []  # no client yet
                async with connected(proc) as sim:
                    sim.add_group(73970, "晚连上的群" + XSS[0])
                    names(sim)
                    await sim.group_message(73970, 20000, "大家好", card=CARDS[0])
                    sid = group_sid(73970)

                    async def named() -> bool:
                        rows = (await page.ok("overview"))["sessions"]
                        return any(r["id"] == sid and r["name"] == sim.group_names[73970] for r in rows)

                    await until(named, "the group named on the page", within=15)
                    assert (await page.session(sid))["name"] == sim.group_names[73970]
            finally:
                await page.aclose()
