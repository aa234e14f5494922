"""Sending answers: in groups the answer quotes the message it answers, and a long one
goes out as a merged-forward message where the implementation allows it."""

from __future__ import annotations

from nonebot.adapters.onebot.v11 import Bot, GroupMessageEvent, MessageEvent, MessageSegment
from nonebot.log import logger

from nonebot_plugin_memsum import runtime
from nonebot_plugin_memsum.agent.turn import ReplyFn

FORWARD_PART = 1500
PLAIN_PART = 3000


def replier(bot: Bot, event: MessageEvent) -> ReplyFn:
    """How a turn answers this event: in a group, quoting it."""

    async def send(text: str) -> None:
        await send_reply(bot, event, text, quote=isinstance(event, GroupMessageEvent))

    return send


async def send_reply(bot: Bot, event: MessageEvent, text: str, *, quote: bool = False) -> None:
    """Plain text; in groups a long text goes out as a merged-forward message.

    `quote`: the answer quotes the message it answers, so a busy group sees to whom.
    """
    threshold = runtime.get().config.memsum_forward_threshold
    if isinstance(event, GroupMessageEvent) and threshold and len(text) > threshold:
        # Content as a text segment: implementations parse a string as CQ codes, and a
        # model told to repeat `[CQ:at,qq=all]` must not make the bot @ everyone.
        nodes = [
            {
                "type": "node",
                "data": {
                    "name": "记忆助手",
                    "uin": bot.self_id,
                    "content": [{"type": "text", "data": {"text": part}}],
                },
            }
            for part in split_text(text, FORWARD_PART)
        ]
        try:
            await bot.call_api("send_group_forward_msg", group_id=event.group_id, messages=nodes)
            return
        except Exception as err:
            logger.info(f"memsum: merged-forward not available ({type(err).__name__}); sending plain text")
    for i, part in enumerate(split_text(text, PLAIN_PART)):
        if quote and i == 0:
            await bot.send(event, MessageSegment.reply(event.message_id) + part)
        else:
            await bot.send(event, part)


def split_text(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
