"""Messages of one session are stored in the order they arrived, even when NoneBot runs
their handlers in another order or rendering one of them waits on the OneBot API (a name
look-up for an @)."""

import asyncio
from typing import Any

from nonebot.adapters.onebot.v11 import GroupMessageEvent, Message, MessageSegment, PokeNotifyEvent
from nonebot.adapters.onebot.v11.event import Sender
from nonebug import App

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.onebot import group_record, record_message, record_notice
from tests.fakes.nonebug import SELF_ID, group_msg, history, new_group, run

GROUP_ID = 880_001


class SlowBot:
    """Just what record_message asks of a Bot; member look-ups wait for the test."""

    self_id = "10000"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def get_group_member_info(self, **params: Any) -> dict[str, Any]:
        await self.release.wait()
        return {"nickname": "远方", "card": ""}


def event(message_id: int, message: Message, user: int) -> GroupMessageEvent:
    return GroupMessageEvent.model_validate(
        {
            "time": 1_700_000_000,
            "self_id": 10000,
            "post_type": "message",
            "message_type": "group",
            "sub_type": "normal",
            "message_id": message_id,
            "user_id": user,
            "group_id": GROUP_ID,
            "message": message,
            "original_message": message,
            "raw_message": str(message),
            "font": 0,
            "sender": Sender(user_id=user, nickname=f"用户{user}"),
        }
    )


async def test_a_name_lookup_does_not_let_a_later_message_overtake() -> None:
    bot = SlowBot()
    first = event(1, Message([MessageSegment.text("问 "), MessageSegment.at(99999)]), 1)
    second = event(2, Message("第二条"), 2)
    a = asyncio.create_task(record_message(bot, first))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    b = asyncio.create_task(record_message(bot, second))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not b.done()  # it waits behind the first, whose name look-up is pending
    bot.release.set()
    await asyncio.gather(a, b)
    history = await runtime.get().store.get_history(group_record(bot.self_id, GROUP_ID).id)
    assert [m.content for m in history] == ["[用户1(1)] 问 @远方(99999)", "[用户2(2)] 第二条"]


async def test_an_anonymous_member_is_labelled_with_the_anonymous_name() -> None:
    # Every anonymous member shares user id 80000000 and the nickname 匿名消息.
    fields = event(3, Message("我是匿名的"), 80000000).model_dump()
    anonymous = GroupMessageEvent.model_validate(
        {**fields, "sub_type": "anonymous", "anonymous": {"id": 1, "name": "大力水手", "flag": "f"}}
    )
    _record, msg = await record_message(SlowBot(), anonymous)  # type: ignore[arg-type]
    assert msg is not None
    assert msg.content == "[匿名 大力水手(80000000)] 我是匿名的"


async def test_a_poke_at_the_bot_names_the_bot_and_is_recorded_not_answered() -> None:
    poke = PokeNotifyEvent.model_validate(
        {
            "time": 1_700_000_000,
            "self_id": 10000,
            "post_type": "notice",
            "notice_type": "notify",
            "sub_type": "poke",
            "group_id": GROUP_ID + 1,
            "user_id": 4,
            "target_id": 10000,
        }
    )
    bot = SlowBot()
    bot.release.set()
    msg = await record_notice(bot, poke)  # type: ignore[arg-type]
    assert msg is not None
    assert msg.role == "notice"
    assert msg.content == "远方(4) 戳了戳 小记(10000)"  # the poker's name looked up (R-TPL-4 labels)


async def test_a_burst_is_stored_in_arrival_order_whatever_order_its_handlers_run() -> None:
    # NoneBot lets a burst's events reach the matchers in any order; the arrival ticket
    # taken in the event preprocessor decides the order they are stored in.
    group = GROUP_ID + 2
    sid = group_record(SlowBot.self_id, group).id
    events = [
        GroupMessageEvent.model_validate(
            {**event(20 + i, Message(f"第{i}条"), 5).model_dump(), "group_id": group}
        )
        for i in range(4)
    ]
    tickets = runtime.get().onebot.arrivals
    arrivals = [tickets.take(sid) for _ in events]
    skipped = tickets.take(sid)  # a command between them: never stored
    late = GroupMessageEvent.model_validate(
        {**event(30, Message("命令之后"), 5).model_dump(), "group_id": group}
    )
    late_arrival = tickets.take(sid)
    tasks = [
        asyncio.create_task(record_message(SlowBot(), e, a))  # type: ignore[arg-type]
        for e, a in [(late, late_arrival), *reversed(list(zip(events, arrivals, strict=True)))]
    ]
    await asyncio.sleep(0.05)
    assert all(not t.done() for t in tasks[:1])  # the last one waits for the command's ticket too
    tickets.done(skipped)
    await asyncio.gather(*tasks)
    history = await runtime.get().store.get_history(sid)
    assert [m.content for m in history] == [*(f"[用户5(5)] 第{i}条" for i in range(4)), "[用户5(5)] 命令之后"]


async def test_a_message_another_plugin_takes_does_not_hold_back_the_next_one(app: App) -> None:
    # Another plugin's matcher above ours blocks a message: no handler of ours ever sees
    # it, and its arrival ticket goes once NoneBot is done with the event, so the group's
    # next message is stored, not left waiting for one that never will be.
    from nonebot import on_message
    from nonebot.rule import keyword

    other = on_message(rule=keyword("拦下"), priority=10, block=True)
    taken: list[str] = []

    @other.handle()
    async def _(event: GroupMessageEvent) -> None:
        taken.append(event.get_plaintext())

    group = new_group()
    try:
        await asyncio.wait_for(run(app, group_msg("拦下 这条归别的插件", group), None), 60)
        await asyncio.wait_for(run(app, group_msg("这条照常记录", group), None), 60)
    finally:
        other.destroy()
    assert taken == ["拦下 这条归别的插件"]
    stored = await history(group_record(SELF_ID, group).id)
    assert [m.content for m in stored] == ["[用户10001(10001)] 这条照常记录"]
    assert len(runtime.get().onebot.arrivals) == 0
