"""Audit 20 (find): "nothing said is ever out of reach". Recall as a QQ group's members and
owner use it (README 「回忆：摘要里没写的细节也找得回来」, "Recall: the search index"): what
real groups say and later look for, through the store's one search (both engines), `/回忆`
(nonebug, the plugin as loaded) and the model's `recall` tool (a real turn against the
scripted model server).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, GroupRecallNoticeEvent, MessageSegment
from nonebot.adapters.onebot.v11.event import Sender
from nonebug import App

from nonebot_plugin_memsum import clock, runtime
from nonebot_plugin_memsum.agent.recall import NO_TERMS, NOTHING
from nonebot_plugin_memsum.agent.tools import ToolContext
from nonebot_plugin_memsum.commands import RECALL_USAGE
from nonebot_plugin_memsum.onebot import group_record
from nonebot_plugin_memsum.onebot.render import forward_record, labelled, quote_marker
from nonebot_plugin_memsum.store import SearchQuery, Store
from nonebot_plugin_memsum.types import Message
from tests.fakes.agent import GROUP as AGENT_GROUP
from tests.fakes.agent import GROUP_ENTRY, MakeRuntime, Replies, fill, tool_call, user
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.fakes.nonebug import (
    SELF_ID,
    Like,
    forwarded,
    group_msg,
    history,
    new_group,
    run,
)

GROUP = "onebot:10000:group:1"
T0 = datetime(2026, 11, 2, 20, 0, tzinfo=ZoneInfo("Asia/Shanghai")).timestamp()
_ts = itertools.count()


def said(name: str, qq: int, body: str) -> Message:
    return Message(role="user", content=f"[{name}({qq})] {body}", name=str(qq), ts=T0 + next(_ts))


# What one group said over a few weeks: each line something a member later asks about.
TALK = [
    ("阿强", 20002, "资料我传网盘了 https://pan.baidu.com/s/1AbCdE 提取码：x7k9"),  # 0
    ("莉莉", 20003, "周五晚上聚餐，别迟到"),  # 1
    ("小明", 20001, "我家猫又把键盘踩了"),  # 2
    ("老王", 20004, "激活码 ＡＢＣ１２３，全角的"),  # 3
    ("Tony", 20011, "Deploy with Docker Compose tonight"),  # 4
    ("阿杰", 20006, "显卡 2,399 入手了"),  # 5
    ("阿杰", 20006, "预算1000块以内"),  # 6
    ("小红", 20005, "用docker部署就行，别手动装"),  # 7
    ("小红", 20005, "群文件里的 期末复习_final-v2.pdf 是最新的"),  # 8
    ("老王", 20004, "有事找我 QQ 123456789"),  # 9
    ("阿强", 20002, "房租 12,000 一个月，押一付三"),  # 10
    ("莉莉", 20003, "链接🔗在群公告，提取码😀看置顶"),  # 11
    ("小明", 20001, "C++ 和 Python 选哪个"),  # 12
]


async def seed(store: Store) -> list[Message]:
    return [await store.append(GROUP, said(n, q, b)) for n, q, b in TALK]


async def found(store: Store, text: str) -> list[int]:
    hits = await store.search(SearchQuery(GROUP, text))
    bodies = [f"[{n}({q})] {b}" for n, q, b in TALK]
    return [bodies.index(h.message.content) for h in hits]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("提取码", [0, 11]),  # three characters
        ("网盘", [0]),  # two
        ("周五", [1]),
        ("猫", [2]),  # one character
        ("ABC123", [3]),  # half-width finds full-width (NFKC), any case
        ("ａｂｃ１２３", [3]),
        ("docker", [4, 7]),  # any case
        ("DOCKER", [4, 7]),
        ("用docker部署", [7]),  # mixed text, no spaces
        ("docker部署", [7]),
        ("期末复习_final-v2.pdf", [8]),  # a file name
        ("final", [8]),
        ("pan.baidu.com/s/1AbCdE", [0]),  # a link
        ("123456789", [9]),  # a QQ number
        ("2399", [5]),  # a number said with a thousands separator, looked up without
        ("2,399", [5]),
        ("1,000", [6]),  # and the other way round
        ("12000", [10]),
        ("１２,０００", [10]),
        ("提取码 看置顶", [11]),  # every word must occur, emoji between them in the text
        ("网盘，提取码", [0]),  # keywords listed as Chinese lists them: 「，」「、」「；」
        ("链接、提取码", [11]),
        ("网盘；x7k9", [0]),
        ("docker,compose", [4]),
        ("C++", [0, 4, 12]),  # by design c is a prefix: the link's "com", "Compose" too
    ],
)
async def test_what_a_group_said_is_found_by_what_it_later_types(
    store: Store, query: str, expected: list[int]
) -> None:
    await seed(store)
    assert sorted(await found(store, query)) == sorted(expected)


@pytest.mark.parametrize(
    "query",
    [
        '"',
        "*",
        "AND",
        "NEAR(",
        "-",
        ":",
        'NEAR("网盘" 提取码',
        "body:网盘",
        "网盘 OR 猫",
        "^猫",
        '"网盘"*',
        "NOT 猫",
        "'; DROP TABLE messages; --",
    ],
)
async def test_search_syntax_typed_as_a_query_is_text_never_an_error(store: Store, query: str) -> None:
    await seed(store)
    hits = await found(store, query)
    # Only the words of the query count: 网盘 finds its message, the operators nothing more.
    assert set(hits) <= {0, 2}
    assert len(await store.search(SearchQuery(GROUP, "猫"))) == 1  # and the table is intact


# ---- /回忆 as the owner types it in the group (nonebug: the plugin as loaded) ---------------
SHANGHAI = ZoneInfo("Asia/Shanghai")
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d"


def member(text: str, group: int, user: int, card: str) -> GroupMessageEvent:
    """A member's group message, their card as QQ sends it in `sender`."""
    event = group_msg(text, group, user=user)
    return event.model_copy(
        update={"sender": Sender(user_id=user, nickname=f"用户{user}", card=card, role="member")}
    )


@pytest.fixture
def shanghai(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """MEMSUM_TIMEZONE=Asia/Shanghai (the server's own zone is UTC) and a clock a test sets."""
    rt = runtime.get()
    monkeypatch.setattr(rt, "config", rt.config.model_copy(update={"memsum_timezone": "Asia/Shanghai"}))
    now = [T0]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    return now


def at_shanghai(*moment: int) -> float:
    return datetime(*moment, tzinfo=SHANGHAI).timestamp()  # type: ignore[misc]


async def test_a_day_is_the_bot_time_zones_day_to_the_minute(app: App, shanghai: list[float]) -> None:
    # 23:59 and 00:01 in Shanghai are 15:59 and 16:01 of one UTC day: only the zone tells them apart.
    group = new_group()
    shanghai[0] = at_shanghai(2026, 11, 6, 23, 59)
    await run(app, member("周五的聚餐改到七点", group, 20001, "小明"), None)
    shanghai[0] = at_shanghai(2026, 11, 7, 0, 1)
    await run(app, member("聚餐我晚到一会", group, 20003, "莉莉"), None)
    late = "2026-11-06 23:59 [小明(20001)] 周五的聚餐改到七点"
    early = "2026-11-07 00:01 [莉莉(20003)] 聚餐我晚到一会"
    await run(app, group_msg("/回忆 聚餐 2026-11-06", group), f"找到 1 条（按相关程度排列）：\n{late}")
    await run(app, group_msg("/回忆 聚餐 2026-11-07", group), f"找到 1 条（按相关程度排列）：\n{early}")
    await run(
        app, group_msg("/回忆 聚餐 2026-11-07～2026-11-08", group), f"找到 1 条（按相关程度排列）：\n{early}"
    )
    both = await _answer(app, group_msg("/回忆 聚餐 2026-11-06..2026-11-07", group))
    assert sorted(both.splitlines()[1:]) == sorted([late, early])
    await run(app, group_msg("/回忆 聚餐 2026-11-05", group), NOTHING)


async def test_the_at_filter_follows_a_member_through_a_card_change(app: App, shanghai: list[float]) -> None:
    group = new_group()
    shanghai[0] = at_shanghai(2026, 11, 1, 10, 0)
    await run(app, member("周末去爬山吗", group, 20001, "小明"), None)
    shanghai[0] = at_shanghai(2026, 11, 3, 10, 0)
    await run(app, member("周末我有空", group, 20003, "莉莉"), None)
    shanghai[0] = at_shanghai(2026, 11, 5, 10, 0)
    await run(app, member("周末要加班，去不了了", group, 20001, "明哥"), None)  # the same member, a new card
    his = [
        "2026-11-05 10:00 [明哥(20001)] 周末要加班，去不了了",
        "2026-11-01 10:00 [小明(20001)] 周末去爬山吗",
    ]
    for command in (
        "/回忆 周末 @明哥",
        "/回忆 周末 @小明",
        "/回忆 周末 [CQ:at,qq=20001]",
        "/回忆 [CQ:at,qq=20001]",
    ):
        answer = await _answer(app, group_msg(command, group))
        assert sorted(answer.splitlines()[1:]) == sorted(his), command
    answer = await _answer(app, group_msg("/回忆 周末 @莉莉", group))
    assert answer.splitlines()[1:] == ["2026-11-03 10:00 [莉莉(20003)] 周末我有空"]


async def test_withdrawn_and_cleared_messages_are_not_found(app: App, shanghai: list[float]) -> None:
    group = new_group()
    await run(app, member("网盘提取码 k2v9，别外传", group, 20002, "阿强"), None)
    await run(app, member("周末去爬山", group, 20001, "小明"), None)
    await run(app, member("网盘链接在群公告", group, 20003, "莉莉"), None)
    withdrawn = (await history(group_record(SELF_ID, group).id))[0]
    # OneBot v11 event/notice.md 群消息撤回: {group_id, user_id, operator_id, message_id}.
    notice = GroupRecallNoticeEvent(
        time=int(shanghai[0]),
        self_id=int(SELF_ID),
        post_type="notice",
        notice_type="group_recall",
        group_id=group,
        user_id=20002,
        operator_id=20002,
        message_id=int(str(withdrawn.platform_id)),
    )
    await run(app, notice, None)
    await run(app, group_msg("/回忆 k2v9", group), NOTHING)
    answer = await _answer(app, group_msg("/回忆 网盘", group))
    assert answer.splitlines()[1:] == [Like(TIME + re.escape(" [莉莉(20003)] 网盘链接在群公告"))]
    await run(app, group_msg("/清除 上下文", group), Like("将清除本会话的全部上下文和摘要.*"))
    await run(app, group_msg("确认", group), "已清除本会话的上下文和摘要。")
    for word in ("爬山", "网盘", "k2v9"):
        await run(app, group_msg(f"/回忆 {word}", group), NOTHING)
    await run(app, member("爬山改到下周", group, 20001, "小明"), None)  # said after the clear: found
    answer = await _answer(app, group_msg("/回忆 爬山", group))
    assert answer.splitlines()[1:] == [Like(TIME + re.escape(" [小明(20001)] 爬山改到下周"))]


@pytest.mark.parametrize("query", ['"', "*", "AND", "NEAR(", "-", ":", '"网盘', "网盘*", "-网盘", "网盘:"])
async def test_search_syntax_typed_into_recall_never_fails(app: App, query: str) -> None:
    group = new_group()
    await run(app, member("网盘链接在群公告", group, 20003, "莉莉"), None)
    answer = await _answer(app, group_msg(f"/回忆 {query}", group))
    assert answer in (NOTHING, f"{NO_TERMS}\n{RECALL_USAGE}") or answer.startswith("找到 1 条"), answer


async def test_many_hits_list_the_best_ten_in_one_merged_forward(app: App, shanghai: list[float]) -> None:
    group = new_group()
    record = group_record(SELF_ID, group)
    store = runtime.get().store
    # 10,000 members' lines with the word (stored as recording stores them), one with the code.
    for i in range(10_000):
        await store.append(
            record.id, said(f"用户{i}", 30000 + i, f"第{i}次说：网盘又限速了，烦" + "。" * (i % 7))
        )
    await run(
        app,
        member(
            "网盘资料 https://pan.baidu.com/s/1Qx 提取码 7u2p，周末前有效，限速的话用客户端下",
            group,
            20002,
            "阿强",
        ),
        None,
    )
    lines = "".join(await forwarded(app, group, "/回忆 网盘")).splitlines()
    assert (
        lines[0]
        == "找到 10 条以上，只列出最相关的 10 条（按相关程度排列；加关键词、@某人或日期可缩小范围）："
    )
    assert len(lines) == 11
    assert "[阿强(20002)] 网盘资料" in lines[1]  # the message carrying the link ranks first
    answer = await _answer(app, group_msg("/回忆 网盘 提取码", group))  # short: one plain message
    assert answer.splitlines()[1:] == [
        Like(TIME + re.escape(" [阿强(20002)] 网盘资料 https://pan.baidu.com/s/1Qx") + ".*")
    ]


async def _answer(app: App, event: GroupMessageEvent) -> str:
    """What the bot answers a command with, as one plain message."""
    got = Like(".*")
    async with app.test_matcher() as ctx:
        bot = ctx.create_bot(base=Bot, self_id=SELF_ID)
        ctx.receive_event(bot, event)
        ctx.should_call_send(event, got, result={"message_id": 1})
    return got.seen or ""


# A group file as NapCat sends it: tests/fixtures/onebot/napcat/message_file.json (a NapCat
# user's published capture), with a name of the length schools and offices give theirs.
LONG_FILE = "【重要】关于2026年度春季学期本科生毕业论文（设计）工作安排的通知-教务处.docx"


async def test_a_long_file_name_is_found_by_its_end(app: App) -> None:
    group = new_group()
    segment = MessageSegment("file", {"file": LONG_FILE, "file_id": "/be2a7132-8e06", "file_size": "48213"})
    await run(app, member(str(segment), group, 20005, "小红"), None)
    [stored] = await history(group_record(SELF_ID, group).id)
    assert (
        stored.content
        == "[小红(20005)] [文件: 重要 关于2026年度春季学期本科生毕业论文（设计）工作安排的通知-教务处.docx]"
    )
    for words in ("教务处", "docx", "毕业论文 工作安排"):
        answer = await _answer(app, group_msg(f"/回忆 {words}", group))
        assert answer.endswith("[小红(20005)] " + stored.content.split("] ", 1)[1]), words


@pytest.fixture
def berlin_system(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """No MEMSUM_TIMEZONE, the system's zone Europe/Berlin (TZ, as a container sets it: a
    zone with daylight saving), and a clock a test sets; the process's zone restored after."""
    rt = runtime.get()
    monkeypatch.setattr(rt, "config", rt.config.model_copy(update={"memsum_timezone": None}))
    now = [T0]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    with monkeypatch.context() as env:
        env.setenv("TZ", "Europe/Berlin")
        time.tzset()
        yield now
    time.tzset()


async def test_the_systems_zone_keeps_its_summer_and_winter_time(
    app: App, berlin_system: list[float]
) -> None:
    # README: MEMSUM_TIMEZONE defaults to the system's zone. Half the year the offset differs
    # from today's: a day filter and the times shown must follow the zone's own rules.
    group = new_group()
    berlin = ZoneInfo("Europe/Berlin")
    for month in (1, 7):
        berlin_system[0] = datetime(2026, month, 15, 0, 30, tzinfo=berlin).timestamp()
        await run(app, member(f"{month}月的烧烤在湖边", group, 20001, "小明"), None)
    for month in (1, 7):
        day = f"2026-{month:02d}-15"
        expected = f"找到 1 条（按相关程度排列）：\n{day} 00:30 [小明(20001)] {month}月的烧烤在湖边"
        await run(app, group_msg(f"/回忆 烧烤 {day}", group), expected)


async def test_a_date_written_with_slashes_or_dots_is_a_date(app: App, shanghai: list[float]) -> None:
    # 「2026/11/06」 is how many members write a date; as a keyword it found nothing, silently.
    group = new_group()
    shanghai[0] = at_shanghai(2026, 11, 6, 23, 59)
    await run(app, member("周五的聚餐改到七点", group, 20001, "小明"), None)
    late = "找到 1 条（按相关程度排列）：\n2026-11-06 23:59 [小明(20001)] 周五的聚餐改到七点"
    for date in ("2026/11/06", "2026.11.6", "2026/11/05..2026/11/06", "2026.11.05..2026.11.06"):
        await run(app, group_msg(f"/回忆 聚餐 {date}", group), late)
    await run(app, group_msg("/回忆 聚餐 2026/11/07", group), NOTHING)


async def test_the_tools_until_with_a_time_includes_that_minute(make_rt: MakeRuntime) -> None:
    # The tool's schema: until is 「截止（含当天）」; given to the minute, that minute is in too.
    rt = await make_rt(memsum_timezone="Asia/Shanghai")
    said_at = at_shanghai(2026, 11, 6, 23, 59) + 30
    await fill(
        rt,
        AGENT_GROUP,
        [Message(role="user", content="[小明(20001)] 聚餐改到七点", name="20001", ts=said_at)],
    )
    args = {"query": "聚餐", "since": "2026-11-06 23:00", "until": "2026-11-06 23:59"}
    result = await rt.tools.call(ToolContext(AGENT_GROUP.id), "recall", json.dumps(args))
    assert "2026-11-06 23:59 [小明(20001)] 聚餐改到七点" in result
    args["until"] = "2026-11-06 23:58"
    assert await rt.tools.call(ToolContext(AGENT_GROUP.id), "recall", json.dumps(args)) == NOTHING


# ---- the model's recall tool, in a real turn against the scripted model server ----------
async def test_the_model_finds_words_only_in_a_forward_a_quote_or_an_archive(
    make_rt: MakeRuntime, llm: ScriptedLLM
) -> None:
    rt = await make_rt()
    # NapCat's get_forward_msg answer: `messages`, each an OB11 message with `sender` and
    # `message` (NapCatQQ packages/napcat-onebot/action/go-cqhttp/GetForwardMsg.ts).
    record = forward_record(
        [
            {
                "sender": {"user_id": 30001, "nickname": "前同事"},
                "message": [{"type": "text", "data": {"text": "新软件的激活码 QWER-7788"}}],
            },
            {
                "sender": {"user_id": 30002, "nickname": "老板"},
                "message": [{"type": "text", "data": {"text": "别外传"}}],
            },
        ],
        {},
    )
    old = [
        labelled("阿强", 20002, f"转一下 {record}"),
        labelled("莉莉", 20003, "收到", quote_marker("老王", 20004, "会议室改到 B302 了")),
        labelled("阿杰", 20006, "显卡 2,399 入手了"),
    ]
    await fill(rt, AGENT_GROUP, [Message(role="user", content=c, name="0") for c in old])
    await rt.compression.compress(AGENT_GROUP.id)  # long ago: archived, the summary keeps none of it
    assert [m.content for m in await rt.store.get_archived(AGENT_GROUP.id)] == old
    await fill(rt, AGENT_GROUP, [user("@小记(10000) 激活码、会议室和显卡价格还记得吗")])
    queries = [{"query": "激活码"}, {"query": "B302"}, {"query": "2399"}, {"query": 'NEAR("激活码" *'}]
    llm.push(
        *[Reply("", tool_calls=[tool_call(f"c{i}", "recall", q)]) for i, q in enumerate(queries)],
        Reply("都找到了。"),
    )

    assert await rt.agent.run_turn(AGENT_GROUP.id, Replies(), GROUP_ENTRY) == "replied"

    results = [m.content for m in await rt.store.get_history(AGENT_GROUP.id) if m.role == "tool"]
    assert len(results) == 4
    assert "[阿强(20002)] 转一下 [合并转发：" in results[0]
    assert "QWER-7788" in results[0]
    assert "[莉莉(20003)] [回复 老王(20004)：会议室改到 B302 了] 收到" in results[1]
    assert "[阿杰(20006)] 显卡 2,399 入手了" in results[2]
    assert results[3] == NOTHING  # NEAR is a word too (every word must occur): no error
