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
import os
import random
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest

from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, connected, group_sid, query, running_bot, until
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, as_segments, at, plain_text, text
from tests.fakes.seeds import seeds

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


SEEDS = seeds([1, 2], [3, 4])
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
            sim.add_group(XSS_GROUP, XSS[1] + "群名😀" + XSS[0])
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


async def check_session(walk: Walk, group: int) -> dict[str, Any]:
    """The session's page against the SQLite file, the overview and /摘要."""
    bot, sid = walk.bot, walk.sid(group)
    page = await walk.page.session(sid)
    active, archived = await db_counts(bot, sid)
    assert page["active"] == active, walk.steps[-3:]
    summary = await db_meta(bot, "summary", sid)
    assert page["summary"]["text"] == (summary["text"] if summary else None)
    session_values = await db_settings(bot, "session", sid)
    place_values = await db_settings(bot, "place", f"onebot:group:{group}")
    for s in page["settings"]:
        assert s["session_value"] == session_values.get(s["name"]), s
        assert s["place_value"] == place_values.get(s["name"]), s
        if s["name"] in session_values:
            assert (s["layer"], s["value"]) == ("session", session_values[s["name"]])
        elif s["name"] in place_values:
            assert (s["layer"], s["value"]) == ("place", place_values[s["name"]])
        else:
            assert s["layer"] == "global"
    runs = await db_compressions(bot, sid)
    assert [(r["ts"], r["outcome"]) for r in page["compressions"]] == [(r[0], r[1]) for r in runs][
        : len(page["compressions"])
    ]
    talk = await query(
        bot.proc.db_path,
        "SELECT content FROM messages WHERE session_id = ? AND archived = 0 AND event_marker = 0"
        " AND role IN ('user', 'assistant', 'tool', 'notice') ORDER BY id DESC LIMIT 30",
        sid,
    )
    assert [m["content"] for m in page["recent"]] == [r[0] for r in reversed(talk)]

    overview = await walk.page.ok("overview")
    row = next(r for r in overview["sessions"] if r["id"] == sid)
    assert (row["active"], row["archived"]) == (active, archived)
    assert row["name"] == walk.bot.sim.group_names[group]
    for s in page["settings"]:
        if s["name"] in row["settings"]:
            assert row["settings"][s["name"]]["value"] == s["value"]
            assert row["settings"][s["name"]]["layer"] == s["layer"]
    assert (row["last_compression"] or {}).get("ts") == (runs[0][0] if runs else None)

    said = await command(bot, ("group", group), "/摘要", ("本会话",))
    if page["summary"]["text"]:
        assert page["summary"]["text"].strip() in said
    else:
        assert "本会话还没有摘要。" in said
    assert f"保留原文 {len(page['kept'])} 条" in said
    if page["history_limit"]:
        assert f"条数 {page['active']} / 条数线 {page['history_limit']}" in said
    else:
        assert f"条数 {page['active']}；条数线未开启。" in said
    if page["usage"] is None:
        assert "还没有用量记录" in said
    elif page["line"] is None:
        assert f"用量 {page['usage']} token；压缩线已关闭" in said
    else:
        assert f"用量 {page['usage']} / 压缩线 {page['line']} token" in said
    return page


async def check_usage(walk: Walk, group: int) -> None:
    """/用量 in the group against the page's daily cap and the ledger."""
    bot, sid = walk.bot, walk.sid(group)
    said = await command(bot, ("group", group), "/用量", ("本群用量",))
    page = await walk.page.session(sid)
    cap = page["daily_cap"]
    if cap["cap"] > 0:
        assert f"每日限额 {cap['cap']} token" in said, said
        assert f"今天已用 {cap['used']}" in said, said
    else:
        assert "每日限额：不限" in said, said
    total = re.search(r"合计 (\d+) token", said)
    assert (int(total.group(1)) if total else 0) == cap["used"], said


# ---- the steps --------------------------------------------------------------------------------
async def member_says(walk: Walk, group: int) -> None:
    rng, bot = walk.rng, walk.bot
    resp = await walk.page.get("sessions/" + quote(walk.sid(group), safe=""))
    mode = "on" if resp.status_code == 404 else resp.json()["settings"][2]["value"]
    user = 20000 + rng.randrange(len(CARDS))
    line = rng.choice(LINES) + f" code{walk.seed}x{len(walk.steps)}"
    before = await db_counts(bot, walk.sid(group))
    await bot.sim.group_message(group, user, line, card=CARDS[user - 20000])
    if mode == "off":  # 关 records nothing: the next command's reply comes after it was handled
        await command(bot, ("group", group), "/摘要", ("本会话",))
        assert await db_counts(bot, walk.sid(group)) == before
    else:
        walk.said.setdefault(walk.sid(group), []).append(line)

        async def stored() -> bool:
            rows = await query(
                bot.proc.db_path,
                "SELECT 1 FROM messages WHERE session_id = ? AND content LIKE ?",
                walk.sid(group),
                f"%{line}",
            )
            return bool(rows)

        await until(stored, f"{line!r} stored")


async def ask(walk: Walk, group: int) -> None:
    """A member asks the bot: the request carries the persona, the page's lines are the
    turn's (the usage the turn stored), and 关 / 仅记录 / a spent cap answer nothing."""
    bot, sid = walk.bot, walk.sid(group)
    page = await walk.page.session(sid)
    setting = {s["name"]: s["value"] for s in page["settings"]}
    question = f"问题{len(walk.steps)}：周末天气怎么样？"
    requests = len(bot.llm.requests)
    mark = len(bot.sim.calls)
    await bot.sim.group_message(group, 20001, [at(SELF_ID), text(" " + question)], card=CARDS[1])
    spent = page["daily_cap"]["spent"]
    if setting["mode"] != "on" or spent:
        await command(bot, ("group", group), "/摘要", ("本会话",))
        asked = [
            r
            for r in bot.llm.requests[requests:]
            if not is_summary_request(r) and question in json.dumps(r, ensure_ascii=False)
        ]
        assert not asked, f"{setting['mode']} / cap spent: the question went to the model"
        return
    call = await bot.sim.wait_call(
        set(SEND_ACTIONS),
        after=mark,
        timeout=30,
        predicate=lambda c: "群主" not in sent(c) and not sent(c).startswith("本会话"),
    )
    del call
    chat = [
        r
        for r in bot.llm.requests[requests:]
        if not is_summary_request(r) and question in json.dumps(r, ensure_ascii=False)
    ]
    assert chat, "the question never reached the model"
    assert chat[0]["messages"][0]["content"] == setting["persona"]
    # The turn's usage (as /摘要 and the page read it) was measured under the page's lines.
    measured = await db_meta(bot, "usage", sid)

    async def written() -> bool:
        nonlocal measured
        measured = await db_meta(bot, "usage", sid)
        return measured is not None and measured["turn_id"] != walk.said.get("__turn__" + sid, [""])[-1]

    await until(written, "the turn's usage written")
    assert measured is not None
    walk.said.setdefault("__turn__" + sid, []).append(measured["turn_id"])
    assert measured["history_limit"] == setting["history_limit"]
    after = await walk.page.session(sid)
    assert after["line"] == measured["line"]


async def change_on_page(walk: Walk, group: int) -> None:
    rng, sid = walk.rng, walk.sid(group)
    name = rng.choice(["compress_at", "history_limit", "mode", "persona", "daily_token_cap"])
    scope = rng.choice(["session", "place"])
    value: str | None
    if rng.random() < 0.1:
        value = None
    elif rng.random() < 0.1:
        value = "默认"  # as every setting command takes it, and as the page's refusals advise
    else:
        value = {
            "compress_at": lambda: rng.choice(["0.5", "0.8", "0.3", "0", "1", "０．７"]),
            "history_limit": lambda: str(rng.choice([0, 8, HISTORY_LIMIT, 40])),
            "mode": lambda: rng.choice(["on", "record", "off", "on"]),
            "persona": lambda: rng.choice(PERSONAS),
            "daily_token_cap": lambda: rng.choice(["0", "无", "1", str(10**6)]),
        }[name]()
    walk.steps.append(f"page set {name} {scope} {value!r}")
    resp = await walk.page.setting(sid, name, scope, value)
    assert resp.status_code == 200, resp.text
    result = resp.json()
    page = await walk.page.session(sid)
    shown = next(s for s in page["settings"] if s["name"] == name)
    assert shown["value"] == result["value"]
    key = sid if scope == "session" else f"onebot:group:{group}"
    stored = await db_settings(walk.bot, scope, key)
    if value in (None, "默认"):  # back to the layer below
        assert name not in stored, (value, stored)
    else:
        typed = {"０．７": 0.7, "无": 0}.get(value, value)
        assert stored[name] == (typed if name in ("mode", "persona") else float(typed)), (value, stored)
    # The chat command says the same value and layer.
    if name in ("compress_at", "history_limit"):
        title = "压缩线" if name == "compress_at" else "条数线"
        said = await command(walk.bot, ("group", group), f"/{title}", (title,))
        number = f"{float(shown['value']):g}" if name == "compress_at" else str(int(shown["value"]))
        assert said.startswith(f"{title} {number}（{shown['layer_label']}）"), said
    elif name == "mode":
        said = await command(walk.bot, ("group", group), "/记忆模式", ("本群模式",))
        word = {"on": "开", "record": "仅记录", "off": "关"}[shown["value"]]
        assert said.startswith(f"本群模式：{word}（{shown['layer_label']}）"), said
    elif name == "persona":
        said = await command(walk.bot, ("group", group), "/人设", ("本群人设",))
        assert said.startswith(f"本群人设（{shown['layer_label']}）：\n{shown['value']}"), said
    else:
        said = await command(walk.bot, ("group", group), "/限额", ("本群每日限额",))
        assert f"（{shown['layer_label']}）" in said, said


async def change_in_chat(walk: Walk, group: int) -> None:
    rng = walk.rng
    choice = rng.choice(["压缩线", "条数线", "记忆模式", "限额", "人设"])
    where = rng.choice(["", "群 "]) if choice in ("压缩线", "条数线") else ""
    value = {
        "压缩线": rng.choice(["0.6", "默认", "０．７"]),
        "条数线": rng.choice(["10", "默认", "0"]),
        "记忆模式": rng.choice(["开", "仅记录", "默认", "开"]),
        "限额": rng.choice(["无", "默认", "500000"]),
        "人设": rng.choice([*PERSONAS, "默认"]),
    }[choice]
    walk.steps.append(f"chat /{choice} {where}{value}")
    said = await command(walk.bot, ("group", group), f"/{choice} {where}{value}", ("已", "没有修改"))
    assert said.startswith("已"), said
    name = {
        "压缩线": "compress_at",
        "条数线": "history_limit",
        "记忆模式": "mode",
        "限额": "daily_token_cap",
        "人设": "persona",
    }[choice]
    page = await walk.page.session(walk.sid(group))
    shown = next(s for s in page["settings"] if s["name"] == name)
    assert f"（{shown['layer_label']}）" in said, (said, shown)


async def bad_value(walk: Walk, group: int) -> None:
    rng, sid = walk.rng, walk.sid(group)
    name = rng.choice(list(BAD_VALUES))
    value = rng.choice(BAD_VALUES[name])
    walk.steps.append(f"page bad {name} {value[:20]!r}")
    before = await snapshot(walk.bot)
    resp = await walk.page.setting(sid, name, rng.choice(["session", "place"]), value)
    assert resp.status_code == 400, (name, value, resp.status_code, resp.text)
    detail = resp.json()["detail"]
    assert isinstance(detail, str), detail
    assert re.search(r"[\u4e00-\u9fff]", detail), detail
    assert await snapshot(walk.bot) == before


async def forged(walk: Walk, group: int) -> None:
    """A change without the page's credentials: refused, nothing changed."""
    rng, bot, sid = walk.rng, walk.bot, walk.sid(group)
    path = f"api/sessions/{quote(sid, safe='')}/"
    body = {"kind": "context", "confirm": True}
    setting = {"name": "mode", "scope": "place", "value": "off"}
    good = {"Content-Type": "application/json", "X-Memsum-CSRF": walk.page.csrf}
    cookie = walk.page.http.cookies.get("memsum_session") or ""
    kind = rng.choice(
        ["none", "bogus", "no-csrf", "wrong-csrf", "cross-site", "cross-origin", "get", "signed-out", "form"]
    )
    walk.steps.append(f"forged {kind}")
    before = await snapshot(bot)
    async with httpx.AsyncClient(base_url=bot.base, timeout=10) as other:
        if kind == "signed-out":
            gone = PageClient(bot.base)
            await gone.login()
            stale = gone.http.cookies.get("memsum_session") or ""
            assert (await gone.post("logout", {})).status_code == 200
            await gone.aclose()
            other.cookies.set("memsum_session", stale)
        elif kind == "bogus":
            other.cookies.set("memsum_session", "x" * 43)
        elif kind != "none":
            other.cookies.set("memsum_session", cookie)
        headers = dict(good)
        if kind == "no-csrf":
            headers.pop("X-Memsum-CSRF")
        elif kind == "wrong-csrf":
            headers["X-Memsum-CSRF"] = walk.page.csrf[:-2] + "xx"
        elif kind == "cross-site":
            headers.update({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
        elif kind == "cross-origin":
            headers["Origin"] = "http://evil.example"  # an older browser: no Sec-Fetch-Site
        if kind == "get":
            resp = await other.get(path + "clear", params={"kind": "context", "confirm": "true"})
            assert resp.status_code in (404, 405), resp.text
            resp2 = await other.get(path + "settings", params=setting)
            assert resp2.status_code in (404, 405), resp2.text
            resp3 = await other.get(path + "compress")
            assert resp3.status_code in (404, 405), resp3.text
        elif kind == "form":
            # A cross-site HTML form: no JSON, no header a form can set.
            resp = await other.post(
                path + "clear",
                content=urlencode(body),
                headers={
                    "Content-Type": "application/x-www-form-urlencoded",
                    "Origin": "http://evil.example",
                },
            )
            assert resp.status_code in (401, 403), resp.text
        else:
            resp = await other.post(path + "clear", content=json.dumps(body), headers=headers)
            resp2 = await other.post(path + "settings", content=json.dumps(setting), headers=headers)
            resp3 = await other.post(path + "compress", content="{}", headers=headers)
            expected = 401 if kind in ("none", "bogus", "signed-out") else 403
            assert [resp.status_code, resp2.status_code, resp3.status_code] == [expected] * 3, resp.text
            assert re.search(r"[\u4e00-\u9fff]", resp.json()["detail"])
            if kind in ("none", "bogus", "signed-out"):  # nor may it read
                assert (await other.get(path.rstrip("/"))).status_code == 401
                assert (await other.get("api/overview")).status_code == 401
    assert await snapshot(bot) == before


async def compress_now(walk: Walk, group: int) -> None:
    bot, sid = walk.bot, walk.sid(group)
    walk.steps.append("page compress")
    runs = len(await db_compressions(bot, sid))
    resp = await walk.page.post(f"sessions/{quote(sid, safe='')}/compress", {})
    if resp.status_code == 409:  # one was running already (a turn's)
        return
    assert resp.status_code == 202, resp.text
    progress: dict[str, Any] = {}

    async def done() -> bool:
        page = await walk.page.session(sid)
        progress.update(page["progress"] or {})
        return not page["running"] and progress.get("phase") in ("done", "error")

    await until(done, "the page's compression ended")
    text_ = progress["text"]
    if text_ == "没有需要压缩的内容。":
        assert len(await db_compressions(bot, sid)) == runs
    elif progress["phase"] == "done":
        assert text_.startswith("压缩完成"), text_
        rows = await db_compressions(bot, sid)
        assert len(rows) == runs + 1
        assert rows[0][1] == "done"
        kept, archived = rows[0][2], rows[0][3]
        assert f"保留原文 {kept} 条，归档 {archived} 条" in text_


async def clear(walk: Walk, group: int) -> None:
    rng, bot, sid = walk.rng, walk.bot, walk.sid(group)
    kind = rng.choice(["summary", "context", "context-unconfirmed"])
    walk.steps.append(f"page clear {kind}")
    path = f"sessions/{quote(sid, safe='')}/clear"
    if kind == "context-unconfirmed":
        before = await snapshot(bot)
        resp = await walk.page.post(path, {"kind": "context"})
        assert resp.status_code == 400
        assert resp.json()["detail"] == "清除上下文需要确认"
        assert await snapshot(bot) == before
        return
    resp = await walk.page.post(
        path, {"kind": kind, "confirm": kind == "context"} if kind == "context" else {"kind": kind}
    )
    assert resp.status_code == 200, resp.text
    assert await db_meta(bot, "summary", sid) is None
    if kind == "context":
        assert (await db_counts(bot, sid))[0] == 0
        walk.said[sid] = []
        said = await command(bot, ("group", group), "/摘要", ("本会话",))
        assert "本会话还没有摘要。" in said, said
        assert "还没有用量记录" in said, said


async def search(walk: Walk, group: int) -> None:
    """The page's search finds a line said since the last clear (archived or not), once."""
    sid = walk.sid(group)
    said = walk.said.get(sid, [])
    if not said:
        return
    line = walk.rng.choice(said)
    code = line.rsplit(" ", 1)[-1]
    walk.steps.append(f"page search {code}")
    params = {"q": code}
    if walk.rng.random() < 0.3:
        params["since"] = "2000-01-01"
    found = await walk.page.ok(f"sessions/{quote(sid, safe='')}/search?{urlencode(params)}")
    hits = [r["hit"]["content"] for r in found["results"]]
    assert len(hits) == 1, (line, hits)
    assert hits[0].endswith(line), (line, hits)


STEPS = [
    (member_says, 6),
    (ask, 3),
    (change_on_page, 3),
    (change_in_chat, 2),
    (bad_value, 2),
    (forged, 2),
    (compress_now, 1),
    (clear, 1),
    (search, 1),
]


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_seeded_walk_of_chat_commands_and_the_page_keeps_them_equal(bot: Bot, seed: int) -> None:
    rng = random.Random(seed)
    groups = groups_of(seed)
    page = PageClient(bot.base)
    await page.login()
    walk = Walk(seed, rng, bot, page, groups)
    try:
        for g in groups:  # each group exists before the page looks at it
            await member_says(walk, g)
        actions = [fn for fn, weight in STEPS for _ in range(weight)]
        for i in range(STEPS_PER_SEED):
            fn = rng.choice(actions)
            group = rng.choice(groups)
            walk.steps.append(f"{i}: {fn.__name__} {group}")
            await fn(walk, group)
            if i % 4 == 3:
                await check_session(walk, group)
        for g in groups:
            await check_session(walk, g)
            await check_usage(walk, g)
    except BaseException as err:
        err.add_note(f"seed {seed}, steps:\n" + "\n".join(walk.steps))  # to replay it
        raise
    finally:
        await page.aclose()


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
    it (settings.typed), the page said 「请填写数字」. /限额 无 turns the cap off, 无 on the page
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


# ---- in Chromium: nothing from chat runs ---------------------------------------------------------
XSS_GROUP = 73950
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HAS_CHROMIUM = Path(CHROMIUM).exists()


async def test_markup_in_cards_group_names_messages_summary_and_persona_shows_as_text_in_chromium(
    bot: Bot,
) -> None:
    """Every text the page shows that came from QQ or from the owner — a group name and a
    friend's nickname (get_group_list / get_friend_list), members' cards in the message
    prefixes, messages, the summary the model wrote, a persona — holding `<script>` and
    `"><img onerror>`, in Debian's Chromium: shown as text, nothing ran, no element made."""
    if not HAS_CHROMIUM:  # as tests/test_web_browser.py: .ci/run makes a missing browser fail
        if os.environ.get("MEMSUM_REQUIRE_BROWSER"):
            raise RuntimeError(f"Chromium is required but missing at {CHROMIUM}")
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.async_api import async_playwright, expect

    from tests.test_web_browser import ARGS

    sid = group_sid(XSS_GROUP)
    for n, card in enumerate(CARDS):
        await bot.sim.group_message(XSS_GROUP, 20000 + n, f"{XSS[n % 2]} 第{n}句", card=card)
    await bot.sim.private_message(20099, XSS[0] + " 私聊", nickname=XSS[1] + "好友")
    page_api = PageClient(bot.base)
    await page_api.login()
    try:

        async def stored() -> bool:
            return (await db_counts(bot, sid))[0] >= len(CARDS)

        await until(stored, "the group's lines stored")
        resp = await page_api.setting(sid, "persona", "place", PERSONAS[1] + XSS[1])
        assert resp.status_code == 200, resp.text
        await page_api.post(f"sessions/{quote(sid, safe='')}/compress", {})

        async def compressed() -> bool:
            return bool(await db_compressions(bot, sid))

        await until(compressed, "the page's compression")
        await bot.sim.group_message(XSS_GROUP, 20002, XSS[1] + " 压缩之后", card=CARDS[2])
        await until(lambda: _has_active(bot, sid), "a line after the compression")
    finally:
        await page_api.aclose()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = await (await browser.new_context(viewport={"width": 390, "height": 844})).new_page()
            await page.goto(bot.base)
            await page.fill("#token", WEB_TOKEN)
            await page.click("#login-form button[type=submit]")
            row = page.locator(f"tr.session-row[data-id='{sid}']")
            await expect(row).to_contain_text(bot.sim.group_names[XSS_GROUP])
            await expect(page.locator("#sessions")).to_contain_text(XSS[1] + "好友")
            await page.fill("#filter", str(XSS_GROUP))
            await row.click()
            await expect(page.locator("#session-title")).to_contain_text(bot.sim.group_names[XSS_GROUP])
            await expect(page.locator("#summary")).to_contain_text(XSS[1])
            await expect(page.locator("#recent")).to_contain_text(f"(20002)] {XSS[1]} 压缩之后")
            setting = page.locator("tr.setting[data-name=persona]")
            await expect(setting).to_contain_text(PERSONAS[1] + XSS[1])
            await expect(setting.locator("textarea")).to_have_value(PERSONAS[1] + XSS[1])
            await page.fill("#search input[name=q]", "压缩之后")
            await page.click("#search button[type=submit]")
            await expect(page.locator("#search-results .msg.found")).to_contain_text(XSS[1])
            assert await page.locator("#main img, #main script").count() == 0
            assert await page.evaluate("window.__pwned") is None
        finally:
            await browser.close()


async def _has_active(bot: Bot, sid: str) -> bool:
    rows = await query(
        bot.proc.db_path,
        "SELECT 1 FROM messages WHERE session_id = ? AND archived = 0 AND content LIKE '%压缩之后'",
        sid,
    )
    return bool(rows)


# ---- a large group ---------------------------------------------------------------------------------
BIG_GROUP = 73960
BIG = 2500


async def test_a_group_of_thousands_of_active_messages_is_paged_not_sent_whole(bot: Bot) -> None:
    """Both lines switched off on the page, so nothing is ever archived: 2,500 messages of
    ~200 characters (half a megabyte) stay active. The session's page sends the newest 30,
    the search the best 20 and says there are more, the overview the counts: each answer a
    few dozen kilobytes, and the counts equal the SQLite file's."""
    sid = group_sid(BIG_GROUP)
    bot.sim.add_group(BIG_GROUP, "大群")
    await bot.sim.group_message(BIG_GROUP, 20000, "开始", card=CARDS[0])
    await until(lambda: _stored_at_least(bot, sid, 1), "the first line")
    page = PageClient(bot.base)
    await page.login()
    try:
        for name in ("compress_at", "history_limit"):
            assert (await page.setting(sid, name, "place", "0")).status_code == 200
        filler = "爬山路线讨论，" * 28
        for n in range(BIG):
            await bot.sim.group_message(BIG_GROUP, 20000 + n % 5, f"{filler}第{n}条", card=CARDS[n % 5])
        await until(lambda: _stored_at_least(bot, sid, BIG + 1), f"{BIG} lines stored", within=60)
        active, archived = await db_counts(bot, sid)
        assert (active, archived) == (BIG + 1, 0)
        resp = await page.get("sessions/" + quote(sid, safe=""))
        assert resp.status_code == 200
        assert len(resp.content) < 64_000, len(resp.content)
        shown = resp.json()
        assert shown["active"] == active
        assert len(shown["recent"]) == 30
        assert shown["recent"][-1]["content"].endswith(f"第{BIG - 1}条")
        assert shown["count_ratio"] is None  # 条数线 off
        found = await page.get(f"sessions/{quote(sid, safe='')}/search?{urlencode({'q': '爬山路线'})}")
        assert found.status_code == 200
        assert len(found.content) < 200_000, len(found.content)
        assert len(found.json()["results"]) == 20
        assert found.json()["more"] is True
        overview = await page.get("overview")
        assert len(overview.content) < 200_000
        row = next(r for r in overview.json()["sessions"] if r["id"] == sid)
        assert (row["active"], row["archived"]) == (active, archived)
        said = await command(bot, ("group", BIG_GROUP), "/摘要", ("本会话",))
        assert f"条数 {active}；条数线未开启。" in said, said
    finally:
        await page.aclose()


async def _stored_at_least(bot: Bot, sid: str, n: int) -> bool:
    return (await db_counts(bot, sid))[0] >= n


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
