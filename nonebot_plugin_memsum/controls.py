"""The owner's controls over chat places: mode, the daily token cap, the member cooldown.

- Mode (a layered setting): `on` records and answers, `record` records and compresses
  but never answers, `off` neither records nor answers (commands still work).
- Daily cap (a layered setting, `MEMSUM_DAILY_TOKEN_CAP` by default): once a place's
  tokens of the day (every purpose, compression included) reach it, the next message
  that wants an answer gets one notice, and the place stays quiet until the next day
  in the bot's time zone. Recording goes on; a compression is never stopped by it.
- Cooldown (`MEMSUM_USER_COOLDOWN`): in a group a member gets at most one answer per
  cooldown; what they say meanwhile is recorded, not answered.

The decisions are pure functions; `Controls` reads and writes what they need in the
store (so all of it survives a restart) and keeps nothing in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import tzinfo
from typing import Literal, cast

from . import clock
from .config import Config, Mode
from .settings import Settings, place_scope
from .store import Store
from .types import SessionRecord
from .usage import day_of, day_start, usage_place, zone_of

COOLDOWN_NAMESPACE = "cooldown"
"""key: session id; value: {user id: when they last got an answer}."""
CAP_NOTICE_NAMESPACE = "cap_notice"
"""key: usage place; value: the day (YYYY-MM-DD) the cap notice went out."""
CAP_NOTICE = "今天的额度已经用完了，明天再聊吧。"

Decision = Literal["answer", "cap_notice", "capped", "cooling"]
"""Answer; say once that today's allowance is used up; stay quiet (cap, cooldown)."""


# ---- pure ---------------------------------------------------------------------------
def cooled_down(last_answer: float | None, now: float, cooldown: float) -> bool:
    return cooldown <= 0 or last_answer is None or now - last_answer >= cooldown


def still_cooling(answers: Mapping[str, float], now: float, cooldown: float) -> dict[str, float]:
    """The entries that can still hold someone back: the stored map never outgrows the
    members answered within one cooldown."""
    return {user: ts for user, ts in answers.items() if now - ts < cooldown}


def decide(*, used_today: int, cap: int, notified_today: bool, cooled: bool) -> Decision:
    """Whether a message that asks for an answer gets one, the cap notice, or nothing."""
    if cap > 0 and used_today >= cap:
        return "capped" if notified_today else "cap_notice"
    return "answer" if cooled else "cooling"


# ---- I/O ------------------------------------------------------------------------------
RECORDED_SINCE = "recorded_since"
"""Metadata namespace: place → when it was last switched on from 关 (`Controls.switched`)."""


def _place_of(record: SessionRecord) -> str:
    scope, key = place_scope(record)
    return f"{scope}:{key}"


class Controls:
    """Mode, cap and cooldown of chat places, read from and written to the store."""

    def __init__(self, store: Store, settings: Settings, config: Config) -> None:
        self._store = store
        self._settings = settings
        self._config = config
        self._zone = zone_of(config)
        self._deciding = asyncio.Lock()
        """Serialises the read-modify-write of the cooldown and cap-notice rows (a short
        section), so two messages at once cannot both pass a cooldown or both get the notice."""

    @property
    def zone(self) -> tzinfo:
        return self._zone

    async def mode(self, record: SessionRecord) -> Mode:
        return cast(Mode, (await self._settings.of_place("mode", record)).value)

    async def switched(self, record: SessionRecord, before: object, after: object) -> None:
        """The place's mode changed (/记忆模式, the web page). Switched on from 关, it notes
        when: what the place said before, while 关, is never the backfill's to store."""
        if before == "off" and after != "off":
            await self._store.put_meta(RECORDED_SINCE, _place_of(record), clock.now())

    async def recorded_since(self, record: SessionRecord) -> float:
        """When the place was last switched on from 关 (0: never)."""
        return float(await self._store.get_meta(RECORDED_SINCE, _place_of(record)) or 0)

    def last_mode(self, record: SessionRecord) -> Mode | None:
        """The place's mode as last read, when the database cannot be reached now."""
        resolved = self._settings.last_read_of_place("mode", record)
        return None if resolved is None else cast(Mode, resolved.value)

    async def used_today(self, record: SessionRecord) -> int:
        """Tokens in and out the place used since its day began, every purpose."""
        rows = await self._store.usage_rows(usage_place(record), day_start(clock.now(), self._zone))
        return sum(r.tokens_in + r.tokens_out for r in rows)

    async def still_within_cap(self, record: SessionRecord) -> Decision:
        """The cap's decision alone (no cooldown), for a turn that waited behind another:
        "answer", or "cap_notice"/"capped" when the place used up its day meanwhile."""
        return await self.answer(record, "", in_group=False)

    async def answer(self, record: SessionRecord, user_id: str, *, in_group: bool) -> Decision:
        """The decision for one message that asks for an answer; remembers what it decided."""
        cap = int((await self._settings.of_place("daily_token_cap", record)).value)
        place = usage_place(record)
        cooldown = self._config.memsum_user_cooldown if in_group else 0
        async with self._deciding:
            now = clock.now()
            today = day_of(now, self._zone)
            used = await self.used_today(record) if cap > 0 else 0
            notified = (
                cap > 0 and used >= cap and await self._store.get_meta(CAP_NOTICE_NAMESPACE, place) == today
            )
            answers: dict[str, float] = {}
            if cooldown > 0:
                answers = await self._store.get_meta(COOLDOWN_NAMESPACE, record.id) or {}
            decision = decide(
                used_today=used,
                cap=cap,
                notified_today=notified,
                cooled=cooled_down(answers.get(user_id), now, cooldown),
            )
            if decision == "answer" and cooldown > 0:
                answers = {**still_cooling(answers, now, cooldown), user_id: now}
                await self._store.put_meta(COOLDOWN_NAMESPACE, record.id, answers)
            elif decision == "cap_notice":
                await self._store.put_meta(CAP_NOTICE_NAMESPACE, place, today)
        return decision
