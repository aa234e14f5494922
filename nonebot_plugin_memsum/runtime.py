"""What the plugin runs once started: one store, one HTTP client, one agent, one bus,
and the OneBot layer's bounded state.

Created in NoneBot's on_startup and stopped in on_shutdown (both idempotent); importing
the plugin opens nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nonebot.log import logger

from .agent.events import EventBus
from .agent.tools import StoreTodoProvider, ToolRegistry, register_todo_tool
from .agent.turn import Agent
from .compression.service import CompressionService
from .config import Config
from .controls import Controls
from .llm import LLMClient, Registry
from .llm.tokens import aload_encoding, encoding_name
from .onebot.state import OneBotState
from .settings import Settings
from .store import Store


@dataclass
class Runtime:
    config: Config
    store: Store
    registry: Registry
    client: LLMClient
    bus: EventBus
    settings: Settings
    tools: ToolRegistry
    todos: StoreTodoProvider
    agent: Agent
    compression: CompressionService
    controls: Controls
    nicknames: list[str] = field(default_factory=list)
    onebot: OneBotState = field(default_factory=OneBotState)
    """Names, arrival tickets and recording locks of the OneBot layer, bounded."""


_current: Runtime | None = None


class NotStarted(RuntimeError):
    """The plugin is used before NoneBot started it."""


def get() -> Runtime:
    if _current is None:
        raise NotStarted("nonebot-plugin-memsum is not started yet (NoneBot on_startup has not run)")
    return _current


async def start(config: Config, db_path: Path, nicknames: list[str], superusers: set[str]) -> Runtime:
    """Build the plugin's runtime once (idempotent) and make it the current one."""
    global _current
    if _current is None:
        _current = await build(config, db_path, nicknames, superusers)
        chat, summary = _current.registry.resolve("chat"), _current.registry.resolve("summary")
        logger.info(
            f"memsum: database {db_path}; chat model {chat.id if chat else '-'}, "
            f"summary model {summary.id if summary else '-'}; tokenizer {encoding_name()}"
        )
    return _current


async def build(config: Config, db_path: Path, nicknames: list[str], superusers: set[str]) -> Runtime:
    """Open the store and wire every part; tests build private ones with this."""
    await aload_encoding(config.memsum_tokenizer)
    store = Store(db_path)
    await store.open()
    registry = Registry(
        config.memsum_models,
        preferred=config.memsum_preferred_model,
        preferences={"chat": config.memsum_chat_model, "summary": config.memsum_summary_model},
    )
    client = LLMClient(timeout=config.memsum_llm_timeout, ledger=store.record_usage)
    bus = EventBus()
    settings = Settings(store, config)
    tools = ToolRegistry()
    todos = StoreTodoProvider(store)
    register_todo_tool(tools, todos)
    agent = Agent(
        store=store, client=client, registry=registry, bus=bus, config=config, settings=settings, tools=tools
    )
    compression = CompressionService(
        store=store,
        client=client,
        registry=registry,
        bus=bus,
        config=config,
        settings=settings,
        agent=agent,
        todos=todos,
        is_owner=owner_check(superusers),  # R-TPL-3: the owner check is NoneBot's SUPERUSERS
    )
    compression.attach()
    controls = Controls(store, settings, config)
    return Runtime(
        config, store, registry, client, bus, settings, tools, todos, agent, compression, controls, nicknames
    )


def owner_check(superusers: set[str]) -> Callable[[str], bool]:
    """Whether a peer is an owner, as NoneBot's SUPERUSER decides it: `onebot:12345` (the
    adapter's name first, the current form) or a bare `12345` (the older one)."""
    return lambda peer: peer in superusers or f"onebot:{peer}" in superusers


async def stop() -> None:
    """Close the current runtime (idempotent)."""
    global _current
    rt, _current = _current, None
    if rt is not None:
        await close(rt)


async def close(rt: Runtime) -> None:
    await rt.agent.shutdown()
    await rt.compression.shutdown()
    await rt.client.aclose()
    await rt.store.close()
