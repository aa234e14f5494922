"""Audit 20 (find): "nothing said is ever out of reach". Recall as a QQ group's members and
owner use it (README 「回忆：摘要里没写的细节也找得回来」, "Recall: the search index"): what
real groups say and later look for, through the store's one search (both engines), `/回忆`
(nonebug, the plugin as loaded) and the model's `recall` tool (a real turn against the
scripted model server).
"""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from nonebot_plugin_memsum.store import SearchQuery, Store
from nonebot_plugin_memsum.types import Message

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
