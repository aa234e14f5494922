"""The `recall` tool: the chat model looks up older conversation of its own session (issue 11).

A thin caller of the store's one search query (store/search.py). The tool sees only
the session of the turn it runs in (`ToolContext.session_id`); a child session sees its
own messages, not its parent's (a child may run under a group that its user should not
read through it). The result is `时间 [昵称(ID)] 正文` lines within RESULT_TOKENS, the
matching messages with a line either side where the budget allows. The call and its
result are stored as a tool group like any other (R-RUN-2), so compression handles them.
Tool results are not indexed: a search never finds an earlier search's echo.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any

from nonebot_plugin_memsum import clock
from nonebot_plugin_memsum.store import SearchHit, SearchQuery, Store
from nonebot_plugin_memsum.store.search import match_expression, query_words, speaker_of, split_label
from nonebot_plugin_memsum.types import REFUSED_TEXT, WITHDRAWN_TEXT, Message, is_refused, unquoted

from .tools import ToolContext, ToolRegistry

RECALL_TOOL = "recall"
RESULT_TOKENS = 1500
"""What one recall result may cost the prompt."""
DEFAULT_LIMIT = 8
MAX_LIMIT = 20
CONTEXT_LINES = 1
NOTHING = "没有找到相关的聊天记录。"
NO_TERMS = "关键词里没有可以搜索的文字（需要汉字、字母或数字）。"
BACKWARDS = "日期范围的结束早于开始"
DATE = r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}"
"""A date as members write it: 2026-11-06, 2026/11/06 or 2026.11.06 (also /回忆's ranges)."""
_DAY = re.compile(rf"^({DATE})(?:[ T](\d{{1,2}}):(\d{{2}}))?$")

# Sent with every chat request (issue 9): short; how to read a result is said in the result.
DESCRIPTION = (
    "按关键词查本会话较早的聊天原文（含已压缩进摘要的）；摘要里缺的细节（链接、提取码、日期、"
    "谁说过什么）用它查。关键词空格分隔，须全部出现。"
)
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "关键词，如「周末 烧烤」"},
        "speaker": {"type": "string", "description": "只看此人：QQ 号或昵称"},
        "since": {"type": "string", "description": "起始日期 YYYY-MM-DD[ HH:MM]、今天、昨天或前天"},
        "until": {"type": "string", "description": "截止（含当天），同上"},
        "limit": {"type": "integer", "description": f"条数，默认 {DEFAULT_LIMIT}，至多 {MAX_LIMIT}"},
    },
    "required": ["query"],
}


# ---- pure text ----------------------------------------------------------------------
DAYS_BACK = {"今天": 0, "今日": 0, "昨天": 1, "昨日": 1, "前天": 2}
"""Days the model may name instead of a date: it is not told today's date, so 「昨天说的」
could not become a date range otherwise."""


def parse_time(text: str, *, end: bool = False, zone: tzinfo | None = None) -> float:
    """A date (`YYYY-MM-DD`, optionally with ` HH:MM`, or a day of DAYS_BACK) in `zone` (None:
    the system's) as a unix time; with `end`, the end of that day (the start of the next), or
    of that minute. ValueError in Chinese."""
    if (back := DAYS_BACK.get(text.strip())) is not None:
        day = datetime.fromtimestamp(clock.now(), zone).date() - timedelta(days=back - (1 if end else 0))
        return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()
    m = _DAY.match(text.strip())
    if m is None:
        raise ValueError(f"日期「{text}」的格式应为 YYYY-MM-DD 或 YYYY-MM-DD HH:MM")
    date, hour, minute = m.groups()
    year, month, day = re.split(r"[-/.]", date)
    try:
        moment = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), tzinfo=zone)
    except ValueError:
        raise ValueError(f"没有「{text}」这个日期") from None
    if end:  # until is exclusive: the day, or the minute, named is in
        moment += timedelta(days=1) if hour is None else timedelta(minutes=1)
    return moment.timestamp()


LINE_BREAK = " ⏎ "
"""A message's own line breaks in a result line."""


def _parts(m: Message, zone: tzinfo | None, *, content: str | None = None) -> tuple[str, str]:
    """(`时间 [昵称(ID)] `, 正文) of the line; `content` instead of what the model reads of it."""
    when = datetime.fromtimestamp(m.ts, zone).strftime("%Y-%m-%d %H:%M")
    content = unquoted(m) if content is None else content
    body = split_label(content)[2] if m.role == "user" else content
    if is_refused(m):  # the provider's content review refused it: it would be refused again
        body = REFUSED_TEXT
    return f"{when} [{speaker_of(m.role, m.name, m.content)}] ", LINE_BREAK.join(body.splitlines())


def line(m: Message, zone: tzinfo | None = None) -> str:
    """`时间 [昵称(ID)] 正文` (助手 and 通知 for the bot's own words and notices), the time in `zone`.

    One line per message: a member's second line written `2026-12-04 09:00 [群主(10001)] …`
    would otherwise read as a line the owner said, to the model and on /回忆.
    """
    return "".join(_parts(m, zone))


_CUT_HEAD = "…"
_CUT_TAIL = "…（过长，已截断）"


def excerpt(m: Message, words: Sequence[str], size: int, zone: tzinfo | None = None) -> str:
    """A hit too long for the result, as `→ 时间 [昵称(ID)] …正文…` of about `size` characters: the
    part around the first of the query words it holds (a long announcement's extraction code is
    at its end), its head when none is found."""
    head, body = _parts(m, zone)
    room = max(1, size - len(head) - 2)
    low = body.lower()
    if words and not any(w in low for w in words):
        body = unicodedata.normalize("NFKC", body)  # full-width text holds the words only normalised
        low = body.lower()
    found = [i for w in words if (i := low.find(w)) >= 0]
    start = max(0, min(min(found) - room // 4, len(body) - room)) if found else 0
    piece = body[start : start + room]
    return f"→ {head}{_CUT_HEAD if start else ''}{piece}{_CUT_TAIL if start + room < len(body) else ''}"


def mask_withdrawn(result: str, gone: Sequence[Message], zone: tzinfo | None = None) -> str:
    """A stored recall result with every line that shows one of the `gone` messages (withdrawn on
    the platform since, or a reply whose quote of one now reads as withdrawn) read as the model
    reads the message itself: its head and WITHDRAWN_TEXT, or the reply with that quote. A line
    shows a message when it is that message's `line` (or `excerpt`) as `render` wrote it in
    `zone`, from its stored text; another message of the same speaker and minute with other
    words stays."""
    lines = result.split("\n")
    for m in gone:
        head, body = _parts(m, zone, content=m.content)
        reply = not m.withdrawn and unquoted(m) != m.content  # only its quote reads as withdrawn
        now = _parts(m, zone)[1] if reply else WITHDRAWN_TEXT
        for i, text in enumerate(lines):
            prefix, rest = text[:2], text[2:]
            if prefix not in ("→ ", "  ") or not rest.startswith(head):
                continue
            rest = rest[len(head) :]
            if rest == body or (_is_excerpt(rest) and _excerpt_piece(rest) in _normalised(body)):
                # An excerpt of a reply: the reply as now read, cut to the excerpt's length.
                cut = now if not reply or len(now) <= len(rest) else now[: len(rest)] + _CUT_TAIL
                lines[i] = prefix + head + cut
    return "\n".join(lines)


def _is_excerpt(rest: str) -> bool:
    return rest.startswith(_CUT_HEAD) or rest.endswith(_CUT_TAIL)


def _excerpt_piece(rest: str) -> str:
    return rest.removesuffix(_CUT_TAIL).removeprefix(_CUT_HEAD)


def _normalised(body: str) -> str:
    return body + "\n" + unicodedata.normalize("NFKC", body)  # `excerpt` may have cut either


def render(
    hits: Sequence[SearchHit],
    budget: int,
    estimate: Callable[[str], int],
    zone: tzinfo | None = None,
    words: Sequence[str] = (),
) -> str:
    """Best hits first, each with its neighbours in time order, within `budget` tokens. A hit
    whose neighbours do not fit comes alone; a line already shown is not repeated; the best hit
    alone over the budget comes as the part of it around the query `words` (`excerpt`)."""
    shown: set[int | None] = set()
    blocks: list[str] = []
    used = 0
    for hit in hits:
        if hit.message.id in shown:
            continue
        full = [*hit.before, hit.message, *hit.after]
        for candidate in (full, [hit.message]):
            lines = [
                ("→ " if m is hit.message else "  ") + line(m, zone) for m in candidate if m.id not in shown
            ]
            cost = estimate("\n".join(lines))
            if used + cost <= budget:
                blocks.append("\n".join(lines))
                shown.update(m.id for m in candidate)
                used += cost
                break
        else:
            if not blocks:  # the best hit alone is over the budget: its head rather than nothing
                blocks.append(excerpt(hit.message, words, budget, zone))
                shown.add(hit.message.id)
                used = budget
    if not blocks:
        return NOTHING
    return f"找到 {len(blocks)} 处相关记录（按相关程度排列，→ 标出命中的消息）：\n\n" + "\n\n".join(blocks)


def query_of(session_id: str, args: dict[str, Any], zone: tzinfo | None = None) -> SearchQuery:
    """The tool's JSON arguments as a search of the session; ValueError in Chinese."""
    text = str(args.get("query") or "")
    speaker = str(args["speaker"]).strip() if args.get("speaker") else None
    if match_expression(text) is None and not (speaker or "").lstrip("@"):
        raise ValueError(NO_TERMS)
    try:
        limit = int(args.get("limit") or DEFAULT_LIMIT)
    except (TypeError, ValueError):
        raise ValueError("limit 须是整数") from None
    since = parse_time(str(args["since"]), zone=zone) if args.get("since") else None
    until = parse_time(str(args["until"]), end=True, zone=zone) if args.get("until") else None
    if since is not None and until is not None and until <= since:
        raise ValueError(BACKWARDS)  # as /回忆 says it: "nothing found" would mislead the model
    return SearchQuery(
        session_id=session_id,
        text=text,
        speaker=speaker.lstrip("@") if speaker else None,
        since=since,
        until=until,
        limit=max(1, min(limit, MAX_LIMIT)),
    )


# ---- the tool -----------------------------------------------------------------------
def register_recall_tool(
    registry: ToolRegistry, store: Store, estimate: Callable[[str], int], zone: tzinfo | None = None
) -> None:
    """`recall`, reading and writing times in `zone` (MEMSUM_TIMEZONE, as /用量 does)."""

    @registry.tool(RECALL_TOOL, DESCRIPTION, PARAMETERS, builtin=True)
    async def recall(ctx: ToolContext, args: dict[str, Any]) -> str:
        try:
            query = query_of(ctx.session_id, args, zone)
        except ValueError as err:
            return f"错误：{err}"
        hits = await store.search(query, context=CONTEXT_LINES)
        return render(hits, RESULT_TOKENS, estimate, zone, query_words(query.text))
