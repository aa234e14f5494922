"""Layered settings (R-CFG-2/3/4/6) over a real Store, and their persistence across a
restart of bot.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from nonebot_plugin_memsum.agent.events import EventBus
from nonebot_plugin_memsum.agent.tools import ToolRegistry
from nonebot_plugin_memsum.agent.turn import Agent, Entry
from nonebot_plugin_memsum.compression.service import CompressionService
from nonebot_plugin_memsum.compression.trigger import count_due
from nonebot_plugin_memsum.config import PERSONA_MAX, Config, Tier
from nonebot_plugin_memsum.llm import LLMClient, Registry
from nonebot_plugin_memsum.settings import SettingName, Settings, Value, place_key, place_scope
from nonebot_plugin_memsum.store import Store
from nonebot_plugin_memsum.types import SessionRecord
from tests.fakes.e2e import restart, running_bot
from tests.fakes.onebot import OneBotSim, plain_text

GROUP = SessionRecord(
    id="onebot:10000:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
)
PRIVATE = SessionRecord(
    id="onebot:10000:private:2", platform="onebot", kind="private", peer="2", room_class="direct"
)
INTERNAL = SessionRecord(id="internal:job", platform=None, kind="internal")
# One value per layer and name, all different, so the layer a value came from is plain.
LAYERED: dict[SettingName, dict[str, float | int]] = {
    "compress_at": {"global": 0.8, "platform": 0.7, "platform_type": 0.6, "place": 0.5, "session": 0.4},
    "history_limit": {"global": 80, "platform": 70, "platform_type": 60, "place": 50, "session": 40},
}
# The owner's controls are layered settings too: same layers, same resolution.
OWNER_LAYERED: dict[SettingName, dict[str, Value]] = {
    "persona": {
        "global": "全局",
        "platform": "平台",
        "platform_type": "群聊",
        "place": "本群",
        "session": "会话",
    },
    "daily_token_cap": {"global": 0, "platform": 7000, "platform_type": 6000, "place": 5000, "session": 4000},
}
ALL_LAYERED: dict[SettingName, Mapping[str, Value]] = {**LAYERED, **OWNER_LAYERED}


def layered_config() -> Config:
    ca, hl = LAYERED["compress_at"], LAYERED["history_limit"]
    pe, cap = OWNER_LAYERED["persona"], OWNER_LAYERED["daily_token_cap"]
    return Config(
        memsum_compress_at=ca["global"],
        memsum_history_limit=int(hl["global"]),
        memsum_persona=str(pe["global"]),
        memsum_daily_token_cap=int(cap["global"]),
        memsum_tiers={
            "onebot": Tier(
                compress_at=ca["platform"],
                history_limit=int(hl["platform"]),
                persona=str(pe["platform"]),
                daily_token_cap=int(cap["platform"]),
            ),
            "onebot.group": Tier(
                compress_at=ca["platform_type"],
                history_limit=int(hl["platform_type"]),
                persona=str(pe["platform_type"]),
                daily_token_cap=int(cap["platform_type"]),
            ),
        },
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(tmp_path / "memsum.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def settings(store: Store) -> Settings:
    for record in (GROUP, PRIVATE, INTERNAL):
        await store.save_session(record)
    return Settings(store, layered_config())


async def values(settings: Settings, session_id: str, **entry: str | None) -> dict[SettingName, tuple]:
    out: dict[SettingName, tuple] = {}
    for name in LAYERED:
        r = await settings.effective(name, session_id, **entry)
        out[name] = (r.value, r.layer)
    return out


@pytest.mark.parametrize("name", list(ALL_LAYERED))
async def test_r_cfg_2_each_layer_overrides_the_one_below(settings: Settings, name: SettingName) -> None:
    place = place_key(GROUP)
    assert place is not None
    want = ALL_LAYERED[name]
    r = await settings.effective(name, GROUP.id)
    assert (r.value, r.layer, r.layer_label) == (want["platform_type"], "platform_type", "平台类型档")
    await settings.set(name, "place", place, want["place"])
    r = await settings.effective(name, GROUP.id)
    assert (r.value, r.layer, r.layer_label) == (want["place"], "place", "本群")
    await settings.set(name, "session", GROUP.id, want["session"])
    r = await settings.effective(name, GROUP.id)
    assert (r.value, r.layer, r.layer_label) == (want["session"], "session", "本会话")


@pytest.mark.parametrize("name", list(ALL_LAYERED))
async def test_r_cfg_2_reset_falls_back_layer_by_layer(settings: Settings, name: SettingName) -> None:
    place = place_key(GROUP)
    assert place is not None
    want = ALL_LAYERED[name]
    await settings.set(name, "place", place, want["place"])
    await settings.set(name, "session", GROUP.id, want["session"])
    await settings.reset(name, "session", GROUP.id)
    assert (await settings.effective(name, GROUP.id)).layer == "place"
    await settings.reset(name, "place", place)
    r = await settings.effective(name, GROUP.id)
    assert (r.value, r.layer) == (want["platform_type"], "platform_type")
    await settings.reset(name, "place", place)  # resetting what is not set is harmless
    assert (await settings.effective(name, GROUP.id)).layer == "platform_type"


async def test_r_cfg_2_the_platform_tier_serves_a_type_without_its_own(settings: Settings) -> None:
    # `onebot.private` is not configured: the `onebot` tier is the highest that says something.
    got = await values(settings, PRIVATE.id)
    assert got == {
        "compress_at": (LAYERED["compress_at"]["platform"], "platform"),
        "history_limit": (LAYERED["history_limit"]["platform"], "platform"),
    }


async def test_r_cfg_2_without_tiers_the_plugin_config_answers(store: Store) -> None:
    await store.save_session(GROUP)
    settings = Settings(store, Config(memsum_compress_at=0.65, memsum_history_limit=12))
    got = await values(settings, GROUP.id)
    assert got == {"compress_at": (0.65, "global"), "history_limit": (12, "global")}


async def test_r_cfg_2_a_group_setting_reaches_every_session_of_that_group_only(
    store: Store, settings: Settings
) -> None:
    other_bot = SessionRecord(
        id="onebot:10009:group:1", platform="onebot", kind="group", place="group:1", room_class="room"
    )
    other_group = SessionRecord(
        id="onebot:10000:group:3", platform="onebot", kind="group", place="group:3", room_class="room"
    )
    for record in (other_bot, other_group):
        await store.save_session(record)
    place = place_key(GROUP)
    assert place is not None
    await settings.set("compress_at", "place", place, 0.33)
    assert (await settings.effective("compress_at", other_bot.id)).value == 0.33
    assert (await settings.effective("compress_at", other_group.id)).layer == "platform_type"
    assert (await settings.effective("compress_at", PRIVATE.id)).layer == "platform"


async def test_r_cfg_2_a_session_setting_stays_in_its_session(settings: Settings) -> None:
    await settings.set("history_limit", "session", GROUP.id, 9)
    assert (await settings.effective("history_limit", PRIVATE.id)).layer == "platform"


async def test_r_cfg_2_platform_less_session_takes_the_tier_of_its_entry_platform(
    settings: Settings,
) -> None:
    via_group = await values(settings, INTERNAL.id, entry_platform="onebot", entry_type="group")
    assert via_group == {
        "compress_at": (LAYERED["compress_at"]["platform_type"], "platform_type"),
        "history_limit": (LAYERED["history_limit"]["platform_type"], "platform_type"),
    }
    via_private = await values(settings, INTERNAL.id, entry_platform="onebot", entry_type="private")
    assert via_private["compress_at"] == (LAYERED["compress_at"]["platform"], "platform")
    alone = await values(settings, INTERNAL.id)
    assert alone["compress_at"] == (LAYERED["compress_at"]["global"], "global")


async def test_r_cfg_2_a_session_with_no_record_takes_its_entry_tier_too(settings: Settings) -> None:
    got = await values(settings, "never-seen", entry_platform="onebot", entry_type="group")
    assert got["history_limit"] == (LAYERED["history_limit"]["platform_type"], "platform_type")


async def test_r_cfg_2_the_birth_platform_wins_over_the_entry_platform(settings: Settings) -> None:
    got = await values(settings, GROUP.id, entry_platform="onebot", entry_type="private")
    assert got["compress_at"] == (LAYERED["compress_at"]["platform_type"], "platform_type")


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("compress_at", 1.5),
        ("compress_at", -0.1),
        ("compress_at", float("nan")),
        ("history_limit", -1),
        ("history_limit", 2.5),
        ("history_limit", float("inf")),
        ("history_limit", 100001),
    ],
)
async def test_r_cfg_2_out_of_range_is_refused_and_nothing_is_stored(
    store: Store, settings: Settings, name: SettingName, bad: float
) -> None:
    with pytest.raises(ValueError, match="之间"):
        await settings.set(name, "session", GROUP.id, bad)
    assert (await store.get_settings("session", GROUP.id)).get(name) is None
    assert (await settings.effective(name, GROUP.id)).layer == "platform_type"


async def test_r_cfg_2_values_survive_reopening_the_store(tmp_path: Path) -> None:
    path = tmp_path / "memsum.db"
    first = Store(path)
    await first.open()
    await Settings(first, Config()).set("compress_at", "session", GROUP.id, 0.25)
    await first.close()
    second = Store(path)
    await second.open()
    try:
        r = await Settings(second, Config()).effective("compress_at", GROUP.id)
        assert (r.value, r.layer) == (0.25, "session")
    finally:
        await second.close()


async def test_r_cfg_3_child_copies_its_parents_effective_values(store: Store, settings: Settings) -> None:
    place = place_key(GROUP)
    assert place is not None
    await settings.set("compress_at", "place", place, 0.55)
    child = SessionRecord(id="child-1", platform=None, kind="internal", parent=GROUP.id)
    assert await settings.create_child(child, "onebot", "group") == await store.get_session(child.id)
    got = await values(settings, child.id)
    assert got == {
        "compress_at": (0.55, "session"),
        "history_limit": (LAYERED["history_limit"]["platform_type"], "session"),
    }


async def test_r_cfg_3_child_is_independent_of_its_parent_afterwards(
    store: Store, settings: Settings
) -> None:
    child = SessionRecord(id="child-2", platform=None, kind="internal", parent=GROUP.id)
    await settings.set("compress_at", "session", GROUP.id, 0.45)
    await settings.create_child(child, "onebot", "group")
    await settings.set("compress_at", "session", GROUP.id, 0.2)  # the parent changes
    assert (await settings.effective("compress_at", child.id)).value == 0.45
    await settings.set("compress_at", "session", child.id, 0.9)  # the child changes
    assert (await settings.effective("compress_at", GROUP.id)).value == 0.2


# ---- the owner's controls as layered settings -------------------------------------------
async def test_mode_layers_default_mode_then_tier_then_type_tier_then_place(store: Store) -> None:
    for record in (GROUP, PRIVATE):
        await store.save_session(record)
    settings = Settings(
        store,
        Config(
            memsum_default_mode="record",
            memsum_tiers={"onebot": Tier(mode="off"), "onebot.group": Tier(mode="on")},
        ),
    )
    assert await values_of(settings, "mode", PRIVATE.id) == ("off", "platform")
    assert await values_of(settings, "mode", GROUP.id) == ("on", "platform_type")
    assert await values_of(settings, "mode", "internal:x") == ("record", "global")
    scope, key = place_scope(GROUP)
    assert (scope, key) == ("place", "onebot:group:1")
    await settings.set("mode", scope, key, "off")
    assert await values_of(settings, "mode", GROUP.id) == ("off", "place")
    scope, key = place_scope(PRIVATE)  # a private chat has no place: its session is the place
    assert (scope, key) == ("session", PRIVATE.id)
    await settings.set("mode", scope, key, "on")
    assert await values_of(settings, "mode", PRIVATE.id) == ("on", "session")


async def values_of(settings: Settings, name: SettingName, session_id: str) -> tuple[Value, str]:
    r = await settings.effective(name, session_id)
    return r.value, r.layer


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("mode", "maybe", "模式须是 开、仅记录 或 关"),
        ("mode", "开", "模式须是 开、仅记录 或 关"),  # the words are the commands'; stored is on/record/off
        ("persona", "   ", "人设不能为空"),
        ("persona", "猫" * (PERSONA_MAX + 1), f"人设最长 {PERSONA_MAX} 字，这段有 {PERSONA_MAX + 1} 字"),
        ("daily_token_cap", -1, "限额须是 0 到"),
        ("daily_token_cap", 2.5, "限额须是 0 到"),
    ],
)
async def test_owner_controls_refuse_bad_values_and_store_nothing(
    store: Store, settings: Settings, name: SettingName, bad: Value, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        await settings.set(name, "session", GROUP.id, bad)
    assert (await store.get_settings("session", GROUP.id)).get(name) is None


async def test_a_persona_of_the_longest_length_is_kept_whole(settings: Settings) -> None:
    persona = "猫" * PERSONA_MAX
    await settings.set("persona", "session", GROUP.id, f"  {persona}\n")
    assert await values_of(settings, "persona", GROUP.id) == (persona, "session")


async def test_r_cfg_3_a_child_copies_the_compression_settings_only(store: Store, settings: Settings) -> None:
    await settings.set("persona", "session", GROUP.id, "父会话的人设")
    child = SessionRecord(id="child-3", platform=None, kind="internal", parent=GROUP.id)
    await settings.create_child(child, "onebot", "group")
    assert set(await store.get_settings("session", child.id)) == {"compress_at", "history_limit"}


@pytest.fixture
async def service(store: Store, settings: Settings) -> AsyncIterator[CompressionService]:
    config = layered_config()
    registry = Registry([], preferred=None, preferences={})
    client = LLMClient(timeout=5, ledger=store.record_usage)
    bus = EventBus()
    agent = Agent(store, client, registry, bus, config, settings, ToolRegistry())
    svc = CompressionService(store, client, registry, bus, config, settings, agent, None, None)
    try:
        yield svc
    finally:
        await client.aclose()


async def test_r_cfg_4_compress_at_zero_is_none(settings: Settings, service: CompressionService) -> None:
    assert await service.compress_at(GROUP.id) == LAYERED["compress_at"]["platform_type"]
    await settings.set("compress_at", "session", GROUP.id, 0)
    assert await service.compress_at(GROUP.id) is None
    status = await service.status(GROUP.id)
    assert (status.compress_at, status.line) == (0, None)
    # The internal session answers through the tier of its entry platform.
    place_less = await service.compress_at(INTERNAL.id, "onebot", "group")
    assert place_less == LAYERED["compress_at"]["platform_type"]


async def test_r_cfg_6_the_count_line_is_the_agents_history_limit(
    settings: Settings, service: CompressionService
) -> None:
    await settings.set("history_limit", "session", GROUP.id, 7)
    assert await service.agent.history_limit(GROUP.id, Entry("onebot", "group")) == 7
    assert (await service.status(GROUP.id)).history_limit == 7
    assert count_due(6, "replied", 7)
    assert not count_due(5, "replied", 7)


async def test_r_cfg_6_zero_on_every_layer_is_no_count_line(store: Store) -> None:
    await store.save_session(GROUP)
    settings = Settings(store, Config())
    r = await settings.effective("history_limit", GROUP.id)
    assert (r.value, r.layer) == (0, "global")
    assert not count_due(10_000, "replied", int(r.value))


# ---- persistence across a restart of bot.py -------------------------------------------
async def command(sim: OneBotSim, text: str, *, group: int = 30001, user: int = 10001) -> str:
    """Send a command in a group and return the bot's answer."""
    mark = len(sim.calls)
    await sim.group_message(group, user, text)
    call = await sim.wait_call("send_msg", after=mark)
    return plain_text(call.params["message"])


@pytest.mark.e2e
async def test_r_cfg_2_session_setting_persists_across_a_bot_restart(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as (bot, sim):
        assert "设为 0.3" in await command(sim, "/压缩线 0.3")
        await restart(bot, sim)
        assert "压缩线 0.3（本会话）" in await command(sim, "/压缩线")
