"""Sixth outside audit (t), recall: "nothing said is ever out of reach" (issue 11), as a group
member or the owner looking for what was said weeks ago, after many compressions.

- Withdrawn messages (QQ 撤回, `group_recall` / `friend_recall`): the chat's paths (the
  model's `recall` tool, /回忆, `api.search` by default) never repeat a message its sender
  or an admin took back, neither as a hit nor as a neighbour; the owner's web page still
  finds it, marked 已撤回.
- The same query through /回忆, the tool, `api.search` and the web page: the same hits, in
  the same order; what one result line shows.
- Queries a user types: single characters, mixed scripts and digits, QQ numbers, names (an
  old card after a card change), emoji or punctuation only, dates in MEMSUM_TIMEZONE.

bot.py runs as a real process with the OneBot simulator over the real reverse WebSocket
and the scripted model on real HTTP; the page is read over real HTTP; the bot's SQLite file
is read directly. Store-level scenarios use a real SQLite file (and PostgreSQL where the
`location` fixture runs both engines).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from nonebot_plugin_memsum import usage
from nonebot_plugin_memsum.agent.recall import NOTHING, register_recall_tool
from nonebot_plugin_memsum.agent.tools import ToolContext, ToolRegistry
from nonebot_plugin_memsum.commands import parse_recall
from nonebot_plugin_memsum.llm.tokens import estimate_text_tokens
from nonebot_plugin_memsum.store import SearchQuery, Store
from nonebot_plugin_memsum.types import Message
from tests.fakes.botproc import BotProcess
from tests.fakes.e2e import SELF_ID, group_sid, private_sid, query, running_bot, until, wait_rows
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.onebot import FORWARD_ACTIONS, SEND_ACTIONS, OneBotSim, as_segments, at, plain_text, text

SUPERUSER = 10001
PERSONA = "你是回忆审计群里的助手小记。"
WEB_TOKEN = "web-token-audit6-t-0123456789"
SHANGHAI = ZoneInfo("Asia/Shanghai")


def is_chat(body: dict[str, Any]) -> bool:
    return body["messages"][0].get("content") == PERSONA


@pytest.fixture(scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[BotProcess, OneBotSim, ScriptedLLM]]:
    with ScriptedLLM() as llm:
        settings = {
            "MEMSUM_MODELS": json.dumps([llm.model_config()]),
            "MEMSUM_PERSONA": PERSONA,
            "MEMSUM_WEB_TOKEN": WEB_TOKEN,
            "MEMSUM_TIMEZONE": "Asia/Shanghai",
        }
        async with running_bot(tmp_path_factory.mktemp("audit6t"), settings) as (bot, sim):
            yield bot, sim, llm


@pytest.fixture
def bot(env: tuple[BotProcess, OneBotSim, ScriptedLLM]) -> BotProcess:
    return env[0]


@pytest.fixture
def sim(env: tuple[BotProcess, OneBotSim, ScriptedLLM]) -> OneBotSim:
    return env[1]


@pytest.fixture
def llm(env: tuple[BotProcess, OneBotSim, ScriptedLLM]) -> ScriptedLLM:
    model = env[2]
    model.reset()
    return model


async def next_send(sim: OneBotSim, after: int) -> str:
    """The text of the bot's next message (a forward's nodes joined) from call index `after`."""
    call = await sim.wait_call(set(SEND_ACTIONS | FORWARD_ACTIONS), after=after, timeout=30)
    return plain_text(as_segments(call.params.get("messages") or call.params.get("message") or []))


async def command(sim: OneBotSim, group: int | None, said: str) -> str:
    mark = len(sim.calls)
    if group is None:
        await sim.private_message(SUPERUSER, said)
    else:
        await sim.group_message(group, SUPERUSER, said)
    return await next_send(sim, mark)


@pytest.fixture
async def owner(bot: BotProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{bot.port}/memsum", timeout=10) as client:
        assert (await client.post("/api/login", json={"token": WEB_TOKEN})).status_code == 200
        yield client


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


# ---- withdrawn messages ----------------------------------------------------------------
KEPT = "这周六烧烤，网盘提取码是 k3m9，链接在群文件"
PHONE = "13912345678"
WITHDRAWN_BY_SELF = f"发错了，我的手机号 {PHONE} 提取码别用这个"
SECRET = "z0z0秘钥"
WITHDRAWN_BY_ADMIN = f"烧烤场地的门禁提取码 {SECRET}"


async def test_a_withdrawn_message_is_never_repeated_into_the_chat_but_the_owner_s_page_marks_it(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, owner: httpx.AsyncClient
) -> None:
    """A member posts their phone number by mistake and withdraws it; an admin withdraws
    another member's message. Before: /回忆 and the model's `recall` still found both (the
    phone number came back to the whole group as a hit, or as the line after a hit). Now the
    chat's paths leave them out; the owner's page finds them, marked 已撤回."""
    group = 96001
    sid = group_sid(group)
    sim.add_member(group, 20042, "阿洁", role="admin")
    await sim.group_message(group, 20041, KEPT, nickname="小林")
    phone_id = await sim.group_message(group, 20042, WITHDRAWN_BY_SELF)
    await sim.group_message(group, 20043, "收到烧烤的事", nickname="小周")
    secret_id = await sim.group_message(group, 20041, WITHDRAWN_BY_ADMIN)
    await wait_rows(bot, sid, 4)
    # OneBot v11 event/notice.md 群消息撤回; NapCat OB11GroupRecallNoticeEvent.ts: by oneself
    # (operator_id = user_id) and by an admin (tests/fixtures/onebot/napcat/group_recall_*.json).
    await sim.notice("group_recall", group_id=group, user_id=20042, operator_id=20042, message_id=phone_id)
    await sim.notice("group_recall", group_id=group, user_id=20041, operator_id=20042, message_id=secret_id)
    stored = await wait_rows(bot, sid, 6)
    assert stored[-2:] == [
        ("notice", "阿洁(20042) 撤回了一条消息"),
        ("notice", "阿洁(20042) 撤回了 小林(20041) 的一条消息"),
    ]

    # /回忆: the owner's command, answered into the group.
    answer = await command(sim, group, "/回忆 提取码")
    assert answer.startswith("找到 1 条（按相关程度排列）：\n"), answer
    assert "k3m9" in answer
    assert PHONE not in answer
    assert SECRET not in answer
    for withdrawn_word in (PHONE, "门禁", "手机号 @20042"):
        assert await command(sim, group, f"/回忆 {withdrawn_word}") == NOTHING, withdrawn_word

    # The model's tool: neither as a hit nor as the line after the kept message.
    def searching(body: dict[str, Any]) -> Reply | None:
        if not is_chat(body):
            return None
        if not tool_results(body):
            calls = [
                {"id": "call_t_1", "name": "recall", "arguments": json.dumps({"query": "提取码"})},
                {"id": "call_t_2", "name": "recall", "arguments": json.dumps({"query": "手机号"})},
            ]
            return Reply("", tool_calls=calls, finish_reason="tool_calls")
        return Reply("查到了")

    llm.on_request(searching)
    mark = len(sim.calls)
    await sim.group_message(group, 20043, [at(SELF_ID), text(" 帮我翻翻之前的记录")])
    assert await next_send(sim, mark) == "查到了"
    [found, phone] = tool_results([b for b in list(llm.requests) if is_chat(b)][-1])
    assert "k3m9" in found
    assert "收到烧烤的事" in found
    assert PHONE not in found
    assert SECRET not in found
    assert phone == NOTHING

    # The owner's page: found, marked; the kept message is not marked.
    path = f"/api/sessions/{sid}/search"
    results = (await owner.get(path, params={"q": "提取码"})).json()["results"]
    marks = {r["hit"]["content"].split("] ", 1)[1]: r["hit"]["withdrawn"] for r in results}
    assert marks == {KEPT: False, WITHDRAWN_BY_SELF: True, WITHDRAWN_BY_ADMIN: True}
    kept = next(r for r in results if not r["hit"]["withdrawn"])
    first_after = kept["after"][0]
    assert first_after["content"].endswith(WITHDRAWN_BY_SELF)
    assert first_after["withdrawn"] is True
    [hit] = (await owner.get(path, params={"q": PHONE})).json()["results"]
    assert hit["hit"]["withdrawn"] is True

    # What the store holds: the messages themselves are kept (R-MEM-2: nothing is deleted).
    rows = await query(bot.db_path, "SELECT content, withdrawn FROM messages WHERE session_id = ?", sid)
    assert sorted(r[1] for r in rows if r[0].endswith((WITHDRAWN_BY_SELF, WITHDRAWN_BY_ADMIN))) == [1, 1]


async def test_a_message_withdrawn_in_a_private_chat_is_not_found_by_the_owner_s_recall_there(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM
) -> None:
    # OneBot v11 event/notice.md 好友消息撤回: {notice_type: friend_recall, user_id, message_id}.
    llm.push(Reply("好的"), Reply("嗯"))
    mark = len(sim.calls)
    said = await sim.private_message(SUPERUSER, "记一下：新的 WiFi 密码 x1y2z3")
    await next_send(sim, mark)
    mark = len(sim.calls)
    await sim.private_message(SUPERUSER, "另一个 WiFi 是访客网")
    await next_send(sim, mark)
    await sim.notice("friend_recall", user_id=SUPERUSER, message_id=said)
    await until(lambda: _withdrawn(bot, private_sid(SUPERUSER)), "the private message marked withdrawn")
    answer = await command(sim, None, "/回忆 WiFi")
    assert "访客网" in answer
    assert "x1y2z3" not in answer, answer


async def _withdrawn(bot: BotProcess, sid: str) -> bool:
    rows = await query(
        bot.db_path, "SELECT COUNT(*) FROM messages WHERE session_id = ? AND withdrawn = 1", sid
    )
    return rows[0][0] > 0


# ---- the store, both engines --------------------------------------------------------------
GROUP = "onebot:10000:group:96100"
T0 = time.time() - 30 * 86400
"""A month ago: what a member looks for weeks later."""


def said(name: str, qq: int, body: str, ts: float, platform_id: str | None = None) -> Message:
    return Message(
        role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=ts, platform_id=platform_id
    )


async def test_withdrawn_messages_leave_hits_and_neighbours_unless_the_search_asks_for_them(
    store: Store,
) -> None:
    kept = await store.append(GROUP, said("小林", 20041, KEPT, T0, "501"))
    gone = await store.append(GROUP, said("阿洁", 20042, WITHDRAWN_BY_SELF, T0 + 1, "-502"))  # Lagrange: < 0
    after = await store.append(GROUP, said("小周", 20043, "收到烧烤的事", T0 + 2, "503"))
    await store.mark_withdrawn(GROUP, "-502")
    await store.mark_withdrawn(GROUP, "999")  # a message never stored: nothing happens
    await store.mark_withdrawn("onebot:10000:group:96101", "501")  # another group's id: not ours

    [hit] = await store.search(SearchQuery(GROUP, "提取码"), context=1)
    assert (hit.message, hit.before, hit.after, hit.withdrawn) == (kept, (), (after,), frozenset())
    assert await store.search(SearchQuery(GROUP, PHONE)) == []
    assert await store.search(SearchQuery(GROUP, "", speaker="阿洁")) == []

    both = await store.search(SearchQuery(GROUP, "提取码", withdrawn=True), context=1)
    assert {h.message.id for h in both} == {kept.id, gone.id}
    by_id = {h.message.id: h for h in both}
    assert by_id[kept.id].after == (gone,)
    assert by_id[kept.id].withdrawn == {gone.id}
    assert by_id[gone.id].withdrawn == {gone.id}
    # The message itself is kept, unchanged, in the history (R-MEM-2).
    assert [m.content for m in await store.get_history(GROUP)] == [kept.content, gone.content, after.content]


# ---- a member's name: an old card after a card change -----------------------------------
async def test_a_member_is_found_under_the_card_they_have_now_and_the_one_they_had_then(
    store: Store,
) -> None:
    """A member said it weeks ago as 小明 and has been 明哥 since (a `group_card` notice only
    renames later lines: README 通知). The owner types the name they know, old or new; the
    model passes the name it sees in the recent chat. Before: only the lines said under that
    very name were found, so 「/回忆 爬山 @明哥」 missed the plan made as 小明."""
    old = await store.append(GROUP, said("小明", 20051, "周末爬山东门集合，带水", T0))
    await store.append(GROUP, said("小红", 20052, "爬山我也去", T0 + 1))
    new = await store.append(GROUP, said("明哥", 20051, "爬山改到周日了", T0 + 86400))
    other = await store.append(GROUP, said("小明", 20053, "另一个小明也爬山", T0 + 2 * 86400))
    for name in ("明哥", "小明"):
        hits = await store.search(SearchQuery(GROUP, "爬山", speaker=name))
        expected = {old.id, new.id} | ({other.id} if name == "小明" else set())
        assert {h.message.id for h in hits} == expected, name
    # Typed as the owner does (/回忆 … @明哥) and as the model's tool passes it.
    by_command = await store.search(parse_recall(GROUP, ["爬山", "@明哥"], []))
    assert {h.message.id for h in by_command} == {old.id, new.id}
    registry = ToolRegistry()
    register_recall_tool(registry, store, estimate_text_tokens)
    found = await registry.call(
        ToolContext(session_id=GROUP), "recall", '{"query": "爬山", "speaker": "明哥"}'
    )
    assert "周末爬山东门集合" in found
    assert not [line for line in found.splitlines() if line.startswith("→") and "爬山我也去" in line]
    # A QQ number stays exact, and a name nobody had finds nothing.
    assert {h.message.id for h in await store.search(SearchQuery(GROUP, "爬山", speaker="20051"))} == {
        old.id,
        new.id,
    }
    assert await store.search(SearchQuery(GROUP, "爬山", speaker="小刚")) == []


# ---- time filters -------------------------------------------------------------------------
async def test_the_model_can_ask_for_what_was_said_yesterday_in_the_bots_time_zone(store: Store) -> None:
    """「昨天谁说了烧烤的事？」: the model is not told today's date, and `since`/`until` took
    only YYYY-MM-DD, so it could not narrow a search to yesterday (it guessed a date, or got
    「错误：日期「昨天」的格式应为 …」). Now 今天/昨天/前天 are days of MEMSUM_TIMEZONE."""
    today = usage.day_start(time.time(), SHANGHAI)
    for ts, body in [
        (today - 86400 - 60, "前天的烧烤太咸了"),
        (today - 2 * 3600, "昨天晚上烧烤真香"),
        (today + 60, "今天早上的烧烤剩了"),
    ]:
        await store.append(GROUP, said("小林", 20041, body, ts))
        await store.append(GROUP, said("小周", 20043, "嗯嗯", ts + 1))  # hits are not each other's neighbours
    registry = ToolRegistry()
    register_recall_tool(registry, store, estimate_text_tokens, SHANGHAI)
    ctx = ToolContext(session_id=GROUP)

    async def recall(**args: str) -> str:
        """The hit lines (→) of the result, or the result when it holds none."""
        result = await registry.call(ctx, "recall", json.dumps({"query": "烧烤", **args}))
        return "\n".join(line for line in result.splitlines() if line.startswith("→")) or result

    yesterday = await recall(since="昨天", until="昨天")
    assert "昨天晚上烧烤真香" in yesterday
    assert "太咸" not in yesterday
    assert "剩了" not in yesterday
    today_only = await recall(since="今天")
    assert "剩了" in today_only
    assert "真香" not in today_only
    two_days = await recall(since="前天", until="昨天")
    assert "太咸" in two_days
    assert "真香" in two_days
    assert "剩了" not in two_days
    assert (await recall(since="上周")).startswith("错误：日期「上周」的格式应为")


# ---- one query, every path ----------------------------------------------------------------
LINKS = [
    (20061, "小林", "网盘链接 https://pan.example.com/s/1AbC 提取码 8h2k，周末的照片都在里面"),
    (20062, "小周", "链接呢？"),
    (20063, "阿洁", "链接我也发一个：https://docs.example.org/plan 烧烤分工表\n第二行：谁带炭"),
    (20061, "小林", "上面那个链接失效了就找我"),
    (20064, "老王", "CPU占用90%的那个链接别点"),
]
LINE_SHAPE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2} \[[^\[\]\n]+\(\d+\)\] \S")


def _bodies(lines: list[str]) -> list[str]:
    return [line.split("] ", 1)[1] for line in lines]


async def test_the_same_query_finds_the_same_messages_in_the_same_order_in_command_tool_and_page(
    bot: BotProcess, sim: OneBotSim, llm: ScriptedLLM, owner: httpx.AsyncClient
) -> None:
    group = 96200
    sid = group_sid(group)
    for i, (qq, name, body) in enumerate(LINKS):
        await sim.group_message(group, qq, body, nickname=name)
        await sim.group_message(group, 20069, f"路过{i}", nickname="路人")  # hits are not neighbours
    await wait_rows(bot, sid, 2 * len(LINKS))

    answer = await command(sim, group, "/回忆 链接")
    head, *lines = answer.splitlines()
    assert head == f"找到 {len(LINKS)} 条（按相关程度排列）："
    for line in lines:  # 时间 [昵称(QQ)] 正文, one line each, a line break shown as ⏎
        assert LINE_SHAPE.match(line), line
    by_command = _bodies(lines)
    assert by_command[0].startswith("网盘链接")  # the message that carries the link first
    assert any(body.endswith("烧烤分工表 ⏎ 第二行：谁带炭") for body in by_command)

    page = (await owner.get(f"/api/sessions/{sid}/search", params={"q": "链接"})).json()["results"]
    assert [r["hit"]["content"].split("] ", 1)[1].replace("\n", " ⏎ ") for r in page] == by_command

    def searching(body: dict[str, Any]) -> Reply | None:
        if not is_chat(body):
            return None
        if not tool_results(body):
            call = {"id": "call_t_9", "name": "recall", "arguments": json.dumps({"query": "链接"})}
            return Reply("", tool_calls=[call], finish_reason="tool_calls")
        return Reply("好")

    llm.on_request(searching)
    mark = len(sim.calls)
    await sim.group_message(group, 20062, [at(SELF_ID), text(" 之前谁发过东西？")])
    assert await next_send(sim, mark) == "好"
    [result] = tool_results([b for b in list(llm.requests) if is_chat(b)][-1])
    by_tool = _bodies([line[2:] for line in result.splitlines() if line.startswith("→ ")])
    assert by_tool == by_command


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("链", 5),  # one character: a prefix of the text's terms
        ("pan.example", 1),  # a URL fragment
        ("1abc", 1),  # a code, whatever its case
        ("CPU占用90%", 1),  # mixed scripts, digits and a sign
        ("@20061", 2),  # a QQ number typed as a speaker
        ("链接 @小林", 2),  # a name typed as a speaker
        ("8h2k 2026-01-01", 0),  # a day when it was not said
    ],
)
async def test_what_an_owner_types_into_recall_finds_what_it_should(
    bot: BotProcess, sim: OneBotSim, typed: str, expected: int
) -> None:
    group = 96201
    sid = group_sid(group)
    if len(await wait_rows(bot, sid, 0)) < len(LINKS):
        for qq, name, body in LINKS:
            await sim.group_message(group, qq, body, nickname=name)
        await wait_rows(bot, sid, len(LINKS))
    answer = await command(sim, group, f"/回忆 {typed}")
    if expected:
        assert answer.startswith(f"找到 {expected} 条（按相关程度排列）："), answer
    else:
        assert answer == NOTHING


async def test_an_at_mention_emoji_or_punctuation_in_recall(bot: BotProcess, sim: OneBotSim) -> None:
    group = 96202
    await sim.group_message(group, 20071, "周末一起打球 😀", nickname="阿球")
    await sim.group_message(group, 20072, "打球算我一个", nickname="阿篮")
    await wait_rows(bot, group_sid(group), 2)
    mark = len(sim.calls)
    await sim.group_message(group, SUPERUSER, [text("/回忆 打球 "), at(20071)])  # a real @ of the member
    answer = await next_send(sim, mark)
    assert answer.startswith("找到 1 条"), answer
    assert "阿球(20071)" in answer
    for typed in ("😀", "「」"):
        answer = await command(sim, group, f"/回忆 {typed}")
        assert answer.startswith("关键词里没有可以搜索的文字"), answer
        assert answer.endswith("用法：/回忆 关键词 [@某人] [YYYY-MM-DD[..YYYY-MM-DD]]")
    # A sentence's end after the command is not a word of it (test_audit12_cmd): no keyword.
    answer = await command(sim, group, "/回忆 ？？！")
    assert answer == "请给出关键词或 @某人\n用法：/回忆 关键词 [@某人] [YYYY-MM-DD[..YYYY-MM-DD]]"


# ---- many results -------------------------------------------------------------------------
async def test_recall_with_more_matches_than_it_lists_says_so_and_how_to_narrow_it(
    bot: BotProcess, sim: OneBotSim, owner: httpx.AsyncClient
) -> None:
    """Thirty members posted a 接龙 over the weeks. Before: /回忆 接龙 answered 「找到 10 条」
    and the page listed 20, as if that were all: the owner could not tell that older ones
    exist. Now both say there are more and how to narrow the search."""
    group = 96300
    sid = group_sid(group)
    for i in range(25):
        await sim.group_message(group, 20100 + i, f"接龙第 {i} 位：{'带水' if i % 2 else '带零食'}")
    await wait_rows(bot, sid, 25)
    answer = await command(sim, group, "/回忆 接龙")
    head, *lines = answer.splitlines()
    assert head == "找到 10 条以上，只列出最相关的 10 条（按相关程度排列；加关键词、@某人或日期可缩小范围）："
    assert len(lines) == 10
    few = await command(sim, group, "/回忆 接龙 带零食 @20100")
    assert few.splitlines()[0] == "找到 1 条（按相关程度排列）："
    page = (await owner.get(f"/api/sessions/{sid}/search", params={"q": "接龙"})).json()
    assert len(page["results"]) == 20
    assert page["more"] is True
    page = (await owner.get(f"/api/sessions/{sid}/search", params={"q": "接龙 带零食"})).json()
    assert len(page["results"]) == 13
    assert page["more"] is False
