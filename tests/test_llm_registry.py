"""Which model serves a purpose, and the warning when none can (R-CFG-5)."""

from collections.abc import Iterator
from typing import Any

import pytest

from nonebot_plugin_memsum.config import ModelConfig
from nonebot_plugin_memsum.llm.registry import Registry
from tests.fakes.logs import captured

NO_MODEL = "no chat-capable model"


def model(mid: str, *, priority: int = 0, chat: bool = True) -> ModelConfig:
    return ModelConfig(
        id=mid, base_url="http://127.0.0.1:1/v1", context_window=8000, priority=priority, chat=chat
    )


A = model("p/a")
B = model("p/b", priority=5)
C = model("p/c", priority=5)
EMBED = model("p/embed", priority=99, chat=False)


def registry(models: list[ModelConfig], preferred: str | None = None, **prefs: Any) -> Registry:
    return Registry(models, preferred=preferred, preferences=prefs)


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    with captured("WARNING") as lines:
        yield lines


def test_r_cfg_5_own_preference_wins_over_global_and_priority() -> None:
    reg = registry([A, B, C], preferred="p/c", summary="p/a")
    assert reg.resolve("summary") == A
    assert reg.missing_preferences("summary") == []


def test_r_cfg_5_global_preference_wins_over_priority() -> None:
    reg = registry([A, B, C], preferred="p/a", chat=None)
    assert reg.resolve("chat") == A
    assert reg.resolve("summary") == A


def test_r_cfg_5_highest_priority_without_preferences_first_listed_on_ties() -> None:
    assert registry([A, B, C]).resolve("summary") == B
    assert registry([A, C, B]).resolve("summary") == C
    assert registry([A]).resolve("chat") == A


def test_r_cfg_5_missing_own_preference_falls_through_to_global() -> None:
    reg = registry([A, B, C], preferred="p/a", summary="gone/model")
    assert reg.resolve("summary") == A
    assert reg.missing_preferences("summary") == ["gone/model"]


def test_r_cfg_5_missing_preferences_fall_through_to_priority() -> None:
    reg = registry([A, B, C], preferred="gone/global", summary="gone/own")
    assert reg.resolve("summary") == B
    assert reg.missing_preferences("summary") == ["gone/own", "gone/global"]
    # The chat purpose has no own preference: only the global one is missing.
    assert reg.missing_preferences("chat") == ["gone/global"]


def test_r_cfg_5_non_chat_models_are_skipped() -> None:
    reg = registry([A, EMBED, B], summary="p/embed")
    # EMBED has the highest priority and is preferred, but cannot chat.
    assert reg.resolve("summary") == B
    assert reg.missing_preferences("summary") == ["p/embed"]
    assert reg.get("p/embed") == EMBED
    assert registry([EMBED]).resolve("chat") is None


def test_r_cfg_5_no_model_means_none_and_names_the_preference() -> None:
    reg = registry([], summary="ds/chat")
    assert reg.resolve("summary") is None
    assert reg.missing_preferences("summary") == ["ds/chat"]


def test_r_cfg_5_models_appear_and_vanish_at_run_time() -> None:
    reg = registry([A], summary="p/b")
    assert reg.resolve("summary") == A
    reg.set_models([A, B])
    assert reg.resolve("summary") == B
    assert reg.get("p/b") == B
    reg.set_models([A])
    assert reg.resolve("summary") == A
    assert reg.get("p/b") is None


def test_r_cfg_5_no_chat_model_warns_exactly_once(warnings: list[str]) -> None:
    reg = registry([EMBED])
    for _ in range(3):
        assert reg.resolve("summary") is None
        assert reg.resolve("chat") is None
    reg.set_models([])
    reg.set_models([EMBED])
    assert sum(NO_MODEL in line for line in warnings) == 1


def test_r_cfg_5_warns_again_after_models_appear_and_vanish(warnings: list[str]) -> None:
    reg = registry([])
    reg.set_models([A])
    reg.set_models([A, B])
    assert sum(NO_MODEL in line for line in warnings) == 1
    reg.set_models([EMBED])
    reg.resolve("chat")
    assert sum(NO_MODEL in line for line in warnings) == 2
    reg.set_models([B])
    reg.set_models([])
    assert sum(NO_MODEL in line for line in warnings) == 3


def test_r_cfg_5_no_warning_while_a_chat_model_exists(warnings: list[str]) -> None:
    reg = registry([A, EMBED], summary="gone/model")
    reg.set_models([B])
    reg.resolve("summary")
    assert not any(NO_MODEL in line for line in warnings)
