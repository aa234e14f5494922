"""What the web page shows, as plain data: pure functions over store records, no I/O.

Every text that came from chat (messages, summaries, names) is passed on as data; the
page puts it into the document as text, never as markup, and each in an isolate of its
own (<bdi>). Direction controls in it are shown as code points (`render.bidi_visible`).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, fields
from typing import Any

from nonebot_plugin_memsum.compression.budget import compression_line
from nonebot_plugin_memsum.compression.templates import CHAT, WORK, heading
from nonebot_plugin_memsum.config import Config, ModelConfig
from nonebot_plugin_memsum.onebot.render import bidi_visible
from nonebot_plugin_memsum.settings import (
    MODE_WORDS,
    NO_CAP_WORD,
    SETTING_NAMES,
    place_key,
    resolve,
    tier_keys,
    typed,
)
from nonebot_plugin_memsum.store import UsageRow
from nonebot_plugin_memsum.types import (
    CompressionRecord,
    DailyUsage,
    Message,
    SessionActivity,
    SessionRecord,
    is_refused,
)
from nonebot_plugin_memsum.usage import row_cost

SETTING_TITLES = {
    "compress_at": "压缩线",
    "history_limit": "条数线",
    "mode": "模式",
    "persona": "人设",
    "daily_cap": "每日限额",
    "daily_token_cap": "每日限额",
}
_RUN_FIELDS = tuple(f.name for f in fields(CompressionRecord))
_TITLES = CHAT.titles + WORK.titles
_BRACKETED = re.compile(r"^\s*【([^】\n]{1,40})】\s*$")


def setting_text(name: str, value: Any) -> str:
    """A value as the owner reads it: a mode by its word, a cap of 0 as none."""
    if name == "mode":
        return MODE_WORDS.get(value, str(value))
    if name == "daily_token_cap" and not value:
        return "不限"
    return f"{value:g}" if isinstance(value, float) else str(value)


def setting_input(name: str, value: float | str) -> float | str | None:
    """A value from the page as the settings layer takes it: a mode's word as its key, a
    persona as text, numbers as numbers (None: not a number). Numbers are read as the chat
    commands read them: typed in full width (「０．７」, a phone's Chinese keyboard) as their
    ASCII spelling, and 无 as no daily cap (/限额 无)."""
    if name == "mode":
        words = {word: key for key, word in MODE_WORDS.items()}
        return words.get(str(value), str(value))
    if name == "persona" or not isinstance(value, str):
        return value
    word = typed(value).strip()
    if name == "daily_token_cap" and word == NO_CAP_WORD:
        return 0
    try:
        return float(word)
    except ValueError:
        return None


def session_title(sid: str, record: SessionRecord | None, names: Mapping[str, str]) -> dict[str, str]:
    """The kind of place, its number, its name when the platform told us one, and the bot
    account the session is of (`onebot:<account>:group:<id>`): with two QQ accounts in one
    group, the group has a session of each, and the page must tell them apart."""
    parts = sid.split(":")
    account = (
        parts[1] if len(parts) == 4 and record is not None and record.kind in ("group", "private") else ""
    )
    if record is not None and record.kind == "group" and record.place:
        number = record.place.split(":", 1)[-1]
        name = bidi_visible(names.get(record.place, ""))
        return {"kind": "群聊", "number": number, "name": name, "account": account}
    if record is not None and record.kind == "private" and record.peer:
        name = bidi_visible(names.get(f"private:{record.peer}", ""))
        return {"kind": "私聊", "number": record.peer, "name": name, "account": account}
    kind = record.kind if record is not None else "internal"
    return {"kind": "内部" if kind == "internal" else kind, "number": "", "name": sid, "account": ""}


def summary_sections(text: str | None) -> list[dict[str, str]]:
    """The summary cut at its section headings: a template's section title written as the
    prompt asks (`## 标题`), at another `#` level, in bold or as 【标题】; any other heading
    (a topic's `### 话题`) stays in its section's body. Text before the first heading is a
    section without a title."""
    if not text:
        return []
    sections: list[dict[str, str]] = []
    title, body = "", []
    for line in bidi_visible(text).splitlines():
        bracketed = _BRACKETED.match(line)
        head = heading(line, _TITLES)
        found = bracketed.group(1).strip() if bracketed else head[0] if head else None
        if found in _TITLES:
            if title or "".join(body).strip():
                sections.append({"title": title, "body": "\n".join(body).strip()})
            title, body = found, []
        else:
            body.append(line)
    if title or "".join(body).strip():
        sections.append({"title": title, "body": "\n".join(body).strip()})
    return sections


def message_view(msg: Message, withdrawn: Collection[int] = ()) -> dict[str, Any]:
    """A message for the page, with whether it was withdrawn on the platform (撤回): as the
    store read it, or among the ids a search found withdrawn (`withdrawn`). Every list marks
    it, not only the search's: 最近消息 and 保留原文 showed a withdrawn text unmarked. One
    the model provider's content review refused says `refused` (its text stays, R-MEM-2)."""
    view: dict[str, Any] = {
        "id": msg.id,
        "ts": msg.ts,
        "role": msg.role,
        "content": bidi_visible(msg.content),
        "withdrawn": msg.withdrawn or msg.id in withdrawn,
    }
    if is_refused(msg):  # the provider's content review refused it: the model reads a placeholder
        view["refused"] = True
    return view


def line_tokens(compress_at: float, model: ModelConfig | None, trim_budget: int | None) -> int | None:
    """The compression line E in tokens for the model the session talks to; None when
    compress_at is 0 (R-CFG-4) or no model is known."""
    if model is None or not compress_at:
        return None
    line = compression_line(compress_at, model.context_window, trim_budget)
    return int(line) if line is not None else None


def fraction(value: int | None, limit: float | None) -> float | None:
    if value is None or not limit:
        return None
    return round(value / limit, 4)


def resolved_settings(
    record: SessionRecord | None,
    sid: str,
    config: Config,
    stored: Mapping[tuple[str, str], Mapping[str, Any]],
    skip: Collection[str] = (),
) -> dict[str, dict[str, Any]]:
    """Every layered setting of a session with its layer, from all stored layers read at
    once (the overview resolves a thousand sessions with the settings' own rule)."""
    platform_key, type_key = tier_keys(record, None, None)
    place = place_key(record) if record else None
    place_values = stored.get(("place", place), {}) if place else {}
    session_values = stored.get(("session", sid), {})
    result: dict[str, dict[str, Any]] = {}
    for name in SETTING_NAMES:
        if name in skip:
            continue
        value = resolve(
            name,
            config,
            config.memsum_tiers,
            platform_key,
            type_key,
            place_values.get(name),
            session_values.get(name),
        )
        result[name] = {
            "value": value.value,
            "text": setting_text(name, value.value),
            "layer": value.layer,
            "layer_label": value.layer_label,
        }
    return result


def usage_view(rows: Iterable[DailyUsage], models: Mapping[str, ModelConfig]) -> list[dict[str, Any]]:
    """Rows with their cost by the price table of `MEMSUM_MODELS` (the rule `/用量` uses)."""
    out = []
    for row in rows:
        model = models.get(row.model)
        as_usage = UsageRow(
            row.day, row.purpose, row.model, row.calls, row.tokens_in, row.tokens_out, row.tokens_cached
        )
        cost = row_cost(as_usage, model)
        out.append(
            {**asdict(row), "cost": cost, "currency": model.currency if model and cost is not None else ""}
        )
    return out


def totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sums of usage rows; the cost only over the rows that have one, and by currency."""
    tokens_in = tokens_out = tokens_cached = calls = 0
    cost: dict[str, float] = {}
    unpriced = False
    for row in rows:
        tokens_in += row["tokens_in"]
        tokens_out += row["tokens_out"]
        tokens_cached += row["tokens_cached"]
        calls += row["calls"]
        if row["cost"] is None:
            unpriced = True
        else:
            cost[row["currency"]] = cost.get(row["currency"], 0.0) + row["cost"]
    return {
        "calls": calls,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_cached": tokens_cached,
        "cost": {k: round(v, 6) for k, v in cost.items()},
        "unpriced": unpriced,
    }


def usage_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        ["日期", "模型", "用途", "调用次数", "输入 token", "其中缓存命中", "输出 token", "费用", "币种"]
    )
    for row in rows:
        cost = "" if row["cost"] is None else f"{row['cost']:.6f}"
        cells = [
            row[k] for k in ("day", "model", "purpose", "calls", "tokens_in", "tokens_cached", "tokens_out")
        ]
        writer.writerow([*map(_csv_cell, cells), cost, row["currency"]])
    return buf.getvalue()


def _csv_cell(value: Any) -> Any:
    # A cell a spreadsheet would run as a formula (a model name is configuration, but
    # the file is opened by people).
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return value


def compression_view(run: CompressionRecord) -> dict[str, Any]:
    # Not dataclasses.asdict: it deep-copies, a third of the overview's time over 1,000 rows.
    return {name: getattr(run, name) for name in _RUN_FIELDS}


def overview_order(row: Mapping[str, Any]) -> float:
    """The order app.js first draws the overview in (`state.sort`): the fullest memory
    first, the sessions without a usage ratio last; a stable sort keeps ties as listed."""
    ratio = row["usage_ratio"]
    return math.inf if ratio is None else -ratio


def overview_row(
    act: SessionActivity,
    names: Mapping[str, str],
    settings: Mapping[str, Mapping[str, Any]],
    line: int | None,
    last: CompressionRecord | None,
    running: bool,
    backoff: tuple[int, int],
) -> dict[str, Any]:
    limit = settings.get("history_limit", {}).get("value") or 0
    return {
        "id": act.session_id,
        **session_title(act.session_id, act.record, names),
        "settings": settings,
        "active": act.active,
        "archived": act.archived,
        "last_ts": act.last_ts,
        "usage": act.usage,
        "line": line,
        "usage_ratio": fraction(act.usage, line),
        "count_ratio": fraction(act.active, limit),
        "last_compression": compression_view(last) if last else None,
        "running": running,
        "backoff_failures": backoff[0],
        "backoff_turns_left": backoff[1],
    }
