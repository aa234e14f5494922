"""The models of `MEMSUM_MODELS` and which one serves a purpose (R-CFG-5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nonebot.log import logger

from nonebot_plugin_memsum.config import ModelConfig


class Registry:
    """Models by id, and the choice of a chat-capable model per purpose ("chat", "summary").

    A purpose's own preference wins over the global one, which wins over the highest
    priority (ties: the first listed); a preference naming a missing or non-chat model
    falls through to the next level (R-CFG-5).
    """

    def __init__(
        self,
        models: Sequence[ModelConfig],
        *,
        preferred: str | None,
        preferences: Mapping[str, str | None],
    ) -> None:
        self._preferred = preferred
        self._preferences = dict(preferences)
        self._models: dict[str, ModelConfig] = {}
        self._chat: list[ModelConfig] = []
        # R-CFG-5: one warning per change into "no chat model", so start-up with no model
        # warns once and a model list that empties again warns once more.
        self._had_chat = True
        self.set_models(models)

    def set_models(self, models: Sequence[ModelConfig]) -> None:
        """Replace the model list (models may appear and vanish at run time)."""
        self._models = {m.id: m for m in models}
        self._chat = [m for m in models if m.chat]
        has_chat = bool(self._chat)
        if self._had_chat and not has_chat:
            logger.warning(
                "memsum: no chat-capable model is configured (MEMSUM_MODELS); the bot cannot answer"
            )
        self._had_chat = has_chat

    def get(self, model_id: str) -> ModelConfig | None:
        """The model with this id, chat-capable or not."""
        return self._models.get(model_id)

    def resolve(self, purpose: str) -> ModelConfig | None:
        """The model for `purpose`, or None when no chat-capable model exists."""
        for model_id in self._preference_chain(purpose):
            model = self._usable(model_id)
            if model is not None:
                return model
        # max() keeps the first of equal priorities.
        return max(self._chat, key=lambda m: m.priority, default=None)

    def missing_preferences(self, purpose: str) -> list[str]:
        """The preferences (own, then global) that name no chat-capable model, for error reasons."""
        return [mid for mid in self._preference_chain(purpose) if self._usable(mid) is None]

    def _preference_chain(self, purpose: str) -> list[str]:
        chain: list[str] = []
        for model_id in (self._preferences.get(purpose), self._preferred):
            if model_id and model_id not in chain:
                chain.append(model_id)
        return chain

    def _usable(self, model_id: str) -> ModelConfig | None:
        model = self._models.get(model_id)
        return model if model is not None and model.chat else None
