"""A seeded Chinese QQ group log with planted facts, for bench_recall.py and the recall tests.

Filler is everyday group chat built from common words (greetings, games, food, work,
study, the weather, links without codes, numbers, English words, emoji), so the words of
a fact also turn up in unrelated messages, as in a real group. Planted facts are the
things people ask about later (FACTS): links with extraction codes, promises with
dates, announcements, questions someone asked. Each fact lists its words of two Chinese
characters and up: the queries the quality figure is measured with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MEMBERS = [
    ("小明", 20001),
    ("阿强", 20002),
    ("莉莉", 20003),
    ("老王", 20004),
    ("猫猫", 20005),
    ("张三", 20006),
    ("李四", 20007),
    ("大熊", 20008),
    ("小雨", 20009),
    ("风铃", 20010),
    ("Tony", 20011),
    ("一只鱼", 20012),
]

_SUBJECTS = "我 你 他 咱们 大家 我们 你们 群主 老板 同事 室友 我妈 朋友".split()
# Everyday words, most frequent first: drawn with Zipf weights (1/rank), so the topical
# words the facts use (网盘, 链接, 资料, 报名 …) also turn up in chatter, but seldom.
_CHAT = (
    "今天 明天 晚上 吃饭 游戏 下班 睡觉 上班 周末 外卖 奶茶 作业 加班 开会 电影 昨天 早上 中午 "
    "火锅 排位 上分 手机 电脑 天气 下雨 好热 好冷 空调 地铁 堵车 打车 快递 淘宝 考试 复习 工作 "
    "工资 房租 老师 项目 需求 测试 上线 代码 系统 软件 显卡 键盘 旅游 爬山 跑步 健身 减肥 熬夜 "
    "电视剧 综艺 音乐 演唱会 放假 面试 论文 答辩 毕业 租房 图片 截图 视频 文件 消息 回复 私聊 "
    "群里 问题 办法 时间 地方 东西 事情 资料 链接 网盘 烧烤 公告 报名 管理员 保存 过期 品牌 模板"
).split()
_WEIGHTS = [1 / (rank + 1) for rank in range(len(_CHAT))]
_VERBS = "想 要 去 在 看 玩 买 吃 做 说 问 找 发 等 试试 推荐 觉得 知道 记得 忘了 喜欢 讨厌".split()
_TAILS = "吧 啊 呢 哈哈哈 hhh 了 嘛 吗 草 绝了 笑死 好耶 真的 确实 可以 不行 算了 +1".split()
_EXTRA = [
    "[表情]",
    "[图片]",
    "😂",
    "🤣",
    "ok",
    "nb",
    "666",
    "yyds",
    "bug",
    "GPT",
    "Python",
    "steam",
    "https://www.bilibili.com/video/BV1xx411c7mD",
    "https://github.com/nonebot/nonebot2",
]


def filler(rng: random.Random) -> str:
    parts = [rng.choice(_SUBJECTS)]
    for word in rng.choices(_CHAT, _WEIGHTS, k=rng.randint(1, 4)):
        parts += [rng.choice(_VERBS), word]
    if rng.random() < 0.15:
        parts.append(rng.choice(_EXTRA))
    parts.append(rng.choice(_TAILS))
    return ("" if rng.random() < 0.7 else "，").join(parts)


@dataclass(frozen=True, slots=True)
class Fact:
    speaker: tuple[str, int]
    text: str
    words: tuple[str, ...]
    """Its words of two Chinese characters and up: each one is a query."""


def _code(rng: random.Random, n: int = 4) -> str:
    return "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(n))


# (text with {link} and {code} to fill, its words of two Chinese characters and up)
FACTS: list[tuple[str, tuple[str, ...]]] = [
    ("期末复习资料传到网盘了 {link} 提取码：{code}", ("期末", "复习资料", "网盘", "提取码")),
    ("年会照片都在这 {link} 提取码 {code} 七天后过期", ("年会", "照片", "提取码", "过期")),
    ("模组整合包下载链接 {link} 密码{code}，解压就能玩", ("模组", "整合包", "下载", "密码", "解压")),
    ("高清壁纸合集 {link} 提取码:{code} 记得转存", ("高清", "壁纸", "合集", "转存")),
    ("考研真题打包好了，{link} 提取码是{code}", ("考研", "真题", "打包")),
    ("说好了，12月6号周六我请大家去海底捞，谁都别放鸽子", ("海底捞", "放鸽子", "周六")),
    ("我保证下周三之前把简历模板发给你", ("保证", "下周三", "简历", "模板")),
    ("月底前我一定把借你的五百块还上", ("月底", "借你", "五百块", "还上")),
    ("答应你们，元旦假期带大家去滑雪场", ("元旦", "假期", "滑雪场")),
    ("周五晚上八点我来订体育馆的羽毛球场地", ("周五", "体育馆", "羽毛球", "场地")),
    ("【群公告】本周六晚上八点举行狼人杀线下聚会，报名请私聊管理员，名额有限", ("狼人杀", "聚会", "名额")),
    ("【通知】群文件里的入群须知更新了，新人务必看完", ("群文件", "入群须知", "新人", "务必")),
    ("公告：禁止在群里发广告，违者直接踢出", ("禁止", "广告", "违者", "踢出")),
    ("【活动】读书分享会改到下周日下午两点，地点图书馆三楼", ("读书", "分享会", "图书馆", "三楼")),
    ("抽奖活动截止到本月二十号，中奖名单群内公布", ("抽奖", "截止", "中奖", "名单", "公布")),
    ("请问一下，显卡驱动更新以后一直蓝屏怎么办？", ("显卡", "驱动", "蓝屏")),
    ("有人知道办日本签证要准备哪些材料吗", ("日本", "签证", "材料")),
    ("宿舍门禁到底是几点关门啊", ("宿舍", "门禁", "关门")),
    ("信用卡年费怎么才能免掉？", ("信用卡", "年费", "免掉")),
    ("路由器重置以后连不上网了，求助", ("路由器", "重置", "连不上", "求助")),
    ("驾照科目二倒车入库有什么技巧", ("驾照", "科目二", "倒车", "入库", "技巧")),
    ("猫粮哪个牌子比较好，我家猫挑食", ("猫粮", "牌子", "挑食")),
    ("谁能推荐一款降噪耳机，预算一千左右", ("降噪", "耳机", "预算")),
    ("租房合同到期押金不退怎么办", ("租房", "合同", "押金")),
]


def plant(rng: random.Random, index: int) -> Fact:
    text, words = FACTS[index % len(FACTS)]
    link = f"https://pan.baidu.com/s/1{_code(rng, 10)}"
    return Fact(rng.choice(MEMBERS), text.format(link=link, code=_code(rng)), words)


def group_log(n: int, facts: int, seed: int = 7) -> tuple[list[tuple[str, int, str]], dict[int, Fact]]:
    """`n` messages (nickname, QQ number, text) with `facts` planted facts at random places;
    returns the messages and {index in the log: fact}."""
    rng = random.Random(seed)
    planted = {at: k for k, at in enumerate(rng.sample(range(n), facts))}
    log: list[tuple[str, int, str]] = []
    out: dict[int, Fact] = {}
    for i in range(n):
        if i in planted:
            fact = plant(rng, planted[i])
            out[i] = fact
            log.append((fact.speaker[0], fact.speaker[1], fact.text))
        else:
            name, qq = rng.choice(MEMBERS)
            log.append((name, qq, filler(rng)))
    return log, out
