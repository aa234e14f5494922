"""Layered per-session settings: `compress_at` and `history_limit` (R-CFG-2/3/4/6), and
the owner's controls `mode`, `persona` and `daily_token_cap`.

Layers, lowest first: plugin config < platform tier (`onebot`) < platform-type tier
(`onebot.group`) < place (one group) < session. Tiers come from `.env`; place and
session values live in the store. `resolve` is the one rule, pure; `Settings` reads the
layers and writes the stored ones.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .config import PERSONA_MAX, Config, Mode, Tier
from .lru import LRU
from .store import Store
from .types import SessionRecord

SettingName = Literal["compress_at", "history_limit", "mode", "persona", "daily_token_cap"]
SETTING_NAMES: tuple[SettingName, ...] = (
    "compress_at",
    "history_limit",
    "mode",
    "persona",
    "daily_token_cap",
)
COPIED_TO_CHILDREN: tuple[SettingName, ...] = ("compress_at", "history_limit")
"""R-CFG-3 is about the compression settings; a child has no place to be switched off in."""
Value = float | int | str
MODE_WORDS: dict[Mode, str] = {"on": "开", "record": "仅记录", "off": "关"}
RESET_WORD = "默认"
"""Typed as a setting's value (a command's, the web page's field): back to the layer below."""
NO_CAP_WORD = "无"
"""Typed as the daily token cap: no cap (0)."""
MAX_DAILY_CAP = 10**12
_CONFIG_KEYS: dict[SettingName, str] = {
    "compress_at": "memsum_compress_at",
    "history_limit": "memsum_history_limit",
    "mode": "memsum_default_mode",
    "persona": "memsum_persona",
    "daily_token_cap": "memsum_daily_token_cap",
}
LAYER_LABELS = {
    "global": "全局配置",
    "platform": "平台档",
    "platform_type": "平台类型档",
    "place": "本群",
    "session": "本会话",
}


@dataclass(frozen=True, slots=True)
class Resolved:
    """An effective value and the layer it came from (a key of LAYER_LABELS)."""

    value: Any
    """float for compress_at; int for history_limit and daily_token_cap; str for mode
    (a key of MODE_WORDS) and persona."""
    layer: str

    @property
    def layer_label(self) -> str:
        return LAYER_LABELS[self.layer]


def tier_keys(
    record: SessionRecord | None, entry_platform: str | None, entry_type: str | None
) -> tuple[str, str]:
    """The tier names of a session: its birth platform, else the one it entered through. An
    entry given by its type tier's name alone (`onebot.group`, as MEMSUM_TIERS names it) is
    that platform and type."""
    if record is not None and record.platform:
        platform, kind = record.platform, record.kind
    elif entry_type is None and entry_platform and "." in entry_platform:
        platform, kind = entry_platform.split(".", 1)
    else:
        platform, kind = entry_platform or "", entry_type or ""
    return platform, f"{platform}.{kind}"


def resolve(
    name: SettingName,
    config: Config,
    tiers: Mapping[str, Tier],
    platform_key: str,
    platform_type_key: str,
    place_value: Value | None,
    session_value: Value | None,
) -> Resolved:
    """The highest layer that sets `name` wins."""
    result = Resolved(getattr(config, _CONFIG_KEYS[name]), "global")
    for layer, tier_name in (("platform", platform_key), ("platform_type", platform_type_key)):
        tier = tiers.get(tier_name)
        value = getattr(tier, name) if tier else None
        if value is not None:
            result = Resolved(value, layer)
    if place_value is not None:
        result = Resolved(place_value, "place")
    if session_value is not None:
        result = Resolved(session_value, "session")
    return result


def validate(name: SettingName, value: Value) -> Value:
    """The allowed range of each name, or ValueError with it in Chinese."""
    if name == "mode":
        if value not in MODE_WORDS:
            raise ValueError("模式须是 开、仅记录 或 关")
        return str(value)
    if name == "persona":
        text = str(value).strip()
        if not text:
            raise ValueError("人设不能为空（恢复默认请用「默认」）")
        if len(text) > PERSONA_MAX:
            raise ValueError(f"人设最长 {PERSONA_MAX} 字，这段有 {len(text)} 字")
        return text
    if name == "daily_token_cap":
        number = float(value)
        if not number.is_integer() or not 0 <= number <= MAX_DAILY_CAP:
            raise ValueError(f"限额须是 0 到 {MAX_DAILY_CAP} 之间的整数 token 数（0 表示不限）")
        return int(number)
    if name == "compress_at":
        if not 0 <= float(value) <= 1:
            raise ValueError("压缩线须在 0 到 1 之间（0 表示不按用量压缩）")
        return float(value) + 0.0  # 「-0」 is 0, shown as 0
    number = float(value)
    if not number.is_integer() or not 0 <= number <= 100000:
        raise ValueError("条数线须是 0 到 100000 之间的整数（0 表示不按条数压缩）")
    return int(number)


def place_key(record: SessionRecord) -> str | None:
    return f"{record.platform}:{record.place}" if record.place else None


def place_scope(record: SessionRecord) -> tuple[Literal["session", "place"], str]:
    """Where a place's own value is stored: a group's place layer; a private chat (one
    session, no place) its session layer."""
    key = place_key(record)
    return ("place", key) if key else ("session", record.id)


class Settings:
    """Reads the layers of a session and writes its stored layers."""

    def __init__(self, store: Store, config: Config) -> None:
        self._store = store
        self._config = config
        self._stored: LRU[tuple[str, str], dict[str, Any]] = LRU()
        """Stored layers read so far: they change only through this object (one process on
        a SQLite file), and every turn reads them twice (the agent, then the trigger)."""

    async def _layer(self, scope: Literal["session", "place"], key: str) -> dict[str, Any]:
        # With other processes on the database (store.shared) a layer may change under us:
        # read each time (two small reads per turn).
        values = None if self._store.shared else self._stored.get((scope, key))
        if values is None:
            values = self._stored[(scope, key)] = await self._store.get_settings(scope, key)
        return values

    async def effective_all(
        self,
        session_id: str,
        *,
        entry_platform: str | None = None,
        entry_type: str | None = None,
        record: SessionRecord | None = None,
    ) -> dict[SettingName, Resolved]:
        """Every setting of a session, from two reads (the record is cached by the store).

        `record`: the session's record when the caller has it (it may not be stored yet)."""
        layers = await self._layers(session_id, entry_platform, entry_type, record)
        return {name: self._resolve(name, *layers) for name in SETTING_NAMES}

    async def effective(
        self,
        name: SettingName,
        session_id: str,
        *,
        entry_platform: str | None = None,
        entry_type: str | None = None,
    ) -> Resolved:
        return self._resolve(name, *await self._layers(session_id, entry_platform, entry_type, None))

    async def of_place(self, name: SettingName, record: SessionRecord) -> Resolved:
        """A setting of the place a chat session is in (its tiers from the record)."""
        # Every message asks its place's mode: one name resolved, not all of them.
        return self._resolve(name, *await self._layers(record.id, record.platform, record.kind, record))

    def last_read_of_place(self, name: SettingName, record: SessionRecord) -> Resolved | None:
        """`of_place` from the layers as last read, without I/O (the database cannot be
        reached); None when a layer was never read (or was forgotten since)."""
        place = place_key(record)
        place_values = self._stored.get(("place", place)) if place else {}
        session_values = self._stored.get(("session", record.id))
        if place_values is None or session_values is None:
            return None
        return self._resolve(
            name, *tier_keys(record, record.platform, record.kind), place_values, session_values
        )

    async def _layers(
        self,
        session_id: str,
        entry_platform: str | None,
        entry_type: str | None,
        record: SessionRecord | None,
    ) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
        """What `resolve` reads besides the name: the tier names and the two stored layers."""
        if record is None:
            record = await self._store.get_session(session_id)
        platform_key, type_key = tier_keys(record, entry_platform, entry_type)
        place = place_key(record) if record else None
        place_values = await self._layer("place", place) if place else {}
        return platform_key, type_key, place_values, await self._layer("session", session_id)

    def _resolve(
        self,
        name: SettingName,
        platform_key: str,
        type_key: str,
        place_values: Mapping[str, Any],
        session_values: Mapping[str, Any],
    ) -> Resolved:
        return resolve(
            name,
            self._config,
            self._config.memsum_tiers,
            platform_key,
            type_key,
            place_values.get(name),
            session_values.get(name),
        )

    async def set(
        self, name: SettingName, scope: Literal["session", "place"], key: str, value: Value
    ) -> None:
        await self._store.set_setting(scope, key, name, validate(name, value))
        self._stored.pop((scope, key), None)  # after the write: a read meanwhile saw the old value

    def forget_session(self, session_id: str) -> None:
        """The session's stored layer was deleted with the session (Store.delete_session)."""
        self._stored.pop(("session", session_id), None)

    async def reset(self, name: SettingName, scope: Literal["session", "place"], key: str) -> None:
        await self._store.delete_setting(scope, key, name)
        self._stored.pop((scope, key), None)

    async def create_child(
        self, child: SessionRecord, entry_platform: str | None, entry_type: str | None
    ) -> SessionRecord:
        """R-CFG-3: a child writes down its parent's effective values when it is created,
        then is independent: a child that already exists is returned untouched."""
        assert child.parent is not None
        resolved = await self.effective_all(
            child.parent, entry_platform=entry_platform, entry_type=entry_type
        )
        # One transaction: two callers creating the same child cannot both copy.
        async with self._store.transaction() as tx:
            existing = await tx.get_session(child.id)
            if existing is not None:
                return existing
            stored = await tx.save_session(child)
            for name in COPIED_TO_CHILDREN:
                await tx.set_setting("session", child.id, name, resolved[name].value)
        self._stored.pop(("session", child.id), None)
        return stored


def typed(word: str) -> str:
    """A word as typed with a Chinese input method in full-width mode (「０．５」, 「７天」)
    read as its ASCII spelling."""
    return unicodedata.normalize("NFKC", word)
